"""adjointgen.testing: gradient checks along symmetric (Hermitian) directions, the dot-product
identity and gauge-aware comparisons, each shown to pass on correct code and to fail on wrong code."""
import pytest
import torch

from torch.autograd.gradcheck import GradcheckError as TorchGradcheckError

import adjointgen.testing as agtest
import adjointgen.torch as agt
from adjointgen.generated.torch import eigh as eigh_rules


def random_matrix(*shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_complex:
        real = torch.float64 if dtype == torch.complex128 else torch.float32
        return torch.complex(torch.randn(*shape, dtype=real, generator=g), torch.randn(*shape, dtype=real, generator=g))
    return torch.randn(*shape, dtype=dtype, generator=g)


def symmetric(*shape, seed=0, dtype=torch.float64):
    return agtest.symmetrize(random_matrix(*shape, seed=seed, dtype=dtype))


def make_eigvalsh(variant="right"):
    """Eigenvalues of a symmetric (Hermitian) matrix with a hand-written backward and JVP.

    right: gA = V diag(g) V^H.  triangular: the same symmetric part, all of it in the upper triangle
    (right along symmetric directions).  cookbook: 2 G - diag(G), the "symmetric gradient" of the
    Matrix Cookbook, wrong under torch's convention.  conjugated: G^T, right for real data, wrong in
    the imaginary part of complex data.  detached: right, but computed from saved
    constants, so it cannot be differentiated again.
    """

    class Eigvalsh(torch.autograd.Function):
        @staticmethod
        def forward(A):
            return torch.linalg.eigvalsh(A)

        @staticmethod
        def setup_context(ctx, inputs, output):
            A, = inputs
            ctx.save_for_backward(A)
            ctx.save_for_forward(A)
            with torch.no_grad():
                ctx.V = torch.linalg.eigh(A).eigenvectors

        @staticmethod
        def backward(ctx, g):
            A, = ctx.saved_tensors
            V = ctx.V if variant == "detached" else torch.linalg.eigh(A).eigenvectors
            G = V @ torch.diag_embed(g.to(V.dtype)) @ V.mH
            if variant == "triangular":
                return torch.triu(G) + torch.triu(G, 1)
            if variant == "cookbook":
                return 2 * G - torch.diag_embed(torch.diagonal(G, dim1=-2, dim2=-1))
            if variant == "conjugated":
                return G.conj()
            return G

        @staticmethod
        def jvp(ctx, dA):
            A, = ctx.saved_tensors
            V = torch.linalg.eigh(A).eigenvectors
            return torch.diagonal(V.mH @ dA @ V, dim1=-2, dim2=-1).real

    return Eigvalsh.apply


def make_square(transpose_bug=False):
    """X @ X with a hand-written backward (optionally forgetting the transposes) and JVP."""

    class Square(torch.autograd.Function):
        @staticmethod
        def forward(X):
            return X @ X

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])
            ctx.save_for_forward(inputs[0])

        @staticmethod
        def backward(ctx, g):
            X, = ctx.saved_tensors
            Xt = X if transpose_bug else X.mH
            return g @ Xt + Xt @ g

        @staticmethod
        def jvp(ctx, dX):
            X, = ctx.saved_tensors
            return dX @ X + X @ dX

    return Square.apply


eigenvalues = lambda A: torch.linalg.eigh(A).eigenvalues


# --- gradcheck ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_torch_gradcheck_reports_a_false_mismatch_that_the_symmetric_check_does_not(dtype):
    """pytorch#38948: eigh reads one triangle, so perturbing A[i, j] alone is not a direction of
    its domain."""
    A = symmetric(5, 5, seed=1, dtype=dtype).requires_grad_()
    assert torch.autograd.gradcheck(eigenvalues, (A.detach().clone().requires_grad_(),), raise_exception=False) is False
    assert agtest.gradcheck(eigenvalues, (A,)) is True  # "auto" detects the symmetric input
    assert agtest.gradcheck(eigenvalues, (A,), symmetric=True, check_forward_ad=True)
    assert agtest.gradcheck(eigenvalues, (A,), fast_mode=True, check_forward_ad=True)
    with pytest.raises(agtest.GradcheckError, match="pass symmetric=True"):
        agtest.gradcheck(eigenvalues, (A,), symmetric=False)  # what torch does


def test_gradcheck_passes_decompositions_with_tuple_outputs_and_batches():
    A = symmetric(2, 4, 4, seed=2).requires_grad_()
    W = random_matrix(3, 4, seed=3).requires_grad_()

    def f(A, W):  # a symmetric and a free input; gauge-invariant outputs of two eigh implementations
        w, V = agt.eigh(A)
        w2, V2 = torch.linalg.eigh(A)
        return w, V[..., :, :2] @ V[..., :, :2].mT, (W @ V2[..., :, :1]).pow(2)

    assert agtest.gradcheck(f, (A, W), check_forward_ad=True)
    assert agtest.gradcheck(f, (A, W), symmetric=[True, False])
    assert agtest.gradcheck(f, (A, W), symmetric=lambda x: x.shape[-1] == x.shape[-2])
    with pytest.raises(ValueError, match="input 1 is flagged symmetric but has shape"):
        agtest.gradcheck(f, (A, W), symmetric=True)


def test_gradcheck_complex_hermitian_with_agt():
    H = symmetric(4, 4, seed=4, dtype=torch.complex128).requires_grad_()

    def f(H):
        w, V = agt.eigh(H)
        return w, V[:, :2] @ V[:, :2].mH, V.abs()

    with pytest.raises(ValueError, match="not Hermitian"):  # torch perturbs H[i, j] alone
        torch.autograd.gradcheck(f, (H.detach().clone().requires_grad_(),), raise_exception=False)
    assert agtest.gradcheck(f, (H,), check_forward_ad=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_gradcheck_fails_for_a_wrong_gradient_of_a_symmetric_input(dtype):
    A = symmetric(4, 4, seed=5, dtype=dtype).requires_grad_()
    assert agtest.gradcheck(make_eigvalsh("right"), (A,))
    # a gradient with the right symmetric part is right along every symmetric direction
    assert agtest.gradcheck(make_eigvalsh("triangular"), (A,))
    assert torch.autograd.gradcheck(make_eigvalsh("triangular"), (A.detach().clone().requires_grad_(),),
                                    raise_exception=False) is False
    with pytest.raises(agtest.GradcheckError) as failure:
        agtest.gradcheck(make_eigvalsh("cookbook"), (A,))
    message = str(failure.value)
    assert "reverse-mode Jacobian mismatch for output 0 (y) with respect to input 0" in message
    assert "directions" in message and "largest mismatch" in message and "together" in message
    assert failure.value.input_index == 0 and failure.value.output_index == 0
    assert abs(failure.value.analytical - 2 * failure.value.numerical) < 1e-6  # the off-diagonal is doubled
    assert isinstance(failure.value, TorchGradcheckError)
    assert isinstance(failure.value, RuntimeError)
    assert agtest.gradcheck(make_eigvalsh("cookbook"), (A,), raise_exception=False) is False
    assert agtest.gradcheck(make_eigvalsh("cookbook"), (A,), fast_mode=True, raise_exception=False) is False


def test_gradcheck_perturbs_the_imaginary_part_of_hermitian_inputs():
    A = symmetric(4, 4, seed=29)
    assert agtest.gradcheck(make_eigvalsh("conjugated"), (A.requires_grad_(),))  # real: G^T = G
    H = symmetric(4, 4, seed=29, dtype=torch.complex128).requires_grad_()
    with pytest.raises(agtest.GradcheckError, match=r"the imaginary part of x\[\d, \d\] and minus"):
        agtest.gradcheck(make_eigvalsh("conjugated"), (H,))
    with pytest.raises(agtest.GradcheckError, match="not the adjoint"):
        agtest.dot_product_check(make_eigvalsh("conjugated"), (H.detach(),))


def test_gradcheck_fails_for_a_wrong_gradient_of_a_free_input():
    X = random_matrix(4, 4, seed=6).requires_grad_()
    assert agtest.gradcheck(make_square(), (X,), check_forward_ad=True)
    with pytest.raises(agtest.GradcheckError, match=r"with respect to input 0 \(x\)\.\n.*d y\[\d, \d\] / d \(x\[\d, \d\]\)"):
        agtest.gradcheck(make_square(transpose_bug=True), (X,))
    Z = random_matrix(3, 3, seed=7, dtype=torch.complex128).requires_grad_()
    assert agtest.gradcheck(make_square(), (Z,))
    with pytest.raises(agtest.GradcheckError, match=r"(real|imaginary) part of x\["):
        agtest.gradcheck(make_square(transpose_bug=True), (Z,))
    with pytest.raises(ValueError, match="flagged symmetric but is not symmetric"):
        agtest.gradcheck(make_square(), (X,), symmetric=True)

    class ElementwiseSquare(torch.autograd.Function):  # z^2, backward dropping the imaginary part
        @staticmethod
        def forward(z):
            return z * z

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])

        @staticmethod
        def backward(ctx, g):
            z, = ctx.saved_tensors
            return (g * 2 * z.conj()).real.to(z.dtype)  # only the Im directions of z see the bug

    with pytest.raises(agtest.GradcheckError, match=r"/ d \(the imaginary part of x\["):
        agtest.gradcheck(ElementwiseSquare.apply, (random_matrix(3, seed=8, dtype=torch.complex128).requires_grad_(),))


def test_gradcheck_checks_forward_mode_when_asked():
    class WrongJVP(torch.autograd.Function):
        @staticmethod
        def forward(A):
            return torch.linalg.eigvalsh(A)

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])
            ctx.save_for_forward(inputs[0])

        @staticmethod
        def backward(ctx, g):
            V = torch.linalg.eigh(ctx.saved_tensors[0]).eigenvectors
            return V @ torch.diag_embed(g) @ V.mT

        @staticmethod
        def jvp(ctx, dA):
            V = torch.linalg.eigh(ctx.saved_tensors[0]).eigenvectors
            return torch.diagonal(V.mT @ dA @ V, dim1=-2, dim2=-1) * 1.01

    A = symmetric(4, 4, seed=8).requires_grad_()
    assert agtest.gradcheck(WrongJVP.apply, (A,))
    with pytest.raises(agtest.GradcheckError, match="forward-mode Jacobian mismatch"):
        agtest.gradcheck(WrongJVP.apply, (A,), check_forward_ad=True)


def test_gradcheck_catches_nan_from_a_missing_cotangent():
    """Each output's rows are computed with the other outputs' cotangents absent (None)."""

    class SumAndProduct(torch.autograd.Function):
        @staticmethod
        def forward(A):
            return A.sum(), A.prod()

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.set_materialize_grads(False)
            ctx.save_for_backward(inputs[0])

        @staticmethod
        def backward(ctx, g_sum, g_prod):
            A, = ctx.saved_tensors
            g_sum = torch.zeros((), dtype=A.dtype) if g_sum is None else g_sum
            scale = torch.full((), float("inf"), dtype=A.dtype) if g_prod is None else g_prod  # the bug
            return g_sum * torch.ones_like(A) + scale * 0 * A + (0 if g_prod is None else g_prod) * A.prod() / A

    A = symmetric(3, 3, seed=9).abs().add(1).requires_grad_()
    with pytest.raises(agtest.GradcheckError, match="analytical nan"):
        agtest.gradcheck(SumAndProduct.apply, (A,), check_undefined_grad=False)
    with pytest.raises(agtest.GradcheckError, match="undefined"):  # as torch.autograd.gradcheck checks
        agtest.gradcheck(SumAndProduct.apply, (A,))


def test_gradcheck_expects_an_input_that_requires_grad():
    with pytest.raises(ValueError, match="requires_grad"):
        agtest.gradcheck(eigenvalues, (symmetric(3, 3),))


# --- gradgradcheck ------------------------------------------------------------------------------


def test_gradgradcheck_along_symmetric_directions():
    A = symmetric(4, 4, seed=10).requires_grad_()
    assert torch.autograd.gradgradcheck(eigenvalues, (A.detach().clone().requires_grad_(),), raise_exception=False) is False
    assert agtest.gradgradcheck(eigenvalues, (A,))
    assert agtest.gradgradcheck(make_eigvalsh("right"), (A,))
    assert agtest.gradcheck(make_eigvalsh("detached"), (A,))  # first derivatives right ...
    with pytest.raises(agtest.GradcheckError, match="the gradient w.r.t. input 0 .* with respect to input 0"):
        agtest.gradgradcheck(make_eigvalsh("detached"), (A,))  # ... second derivatives missing
    H = symmetric(3, 3, seed=11, dtype=torch.complex128).requires_grad_()

    def f(H):
        w, V = agt.eigh(H)
        return w, V[:, :1] @ V[:, :1].mH

    assert agtest.gradgradcheck(f, (H,))
    assert agtest.gradgradcheck(f, (H,), fast_mode=True)


def test_gradgradcheck_with_grad_outputs_and_a_free_input():
    X = random_matrix(3, 3, seed=12).requires_grad_()
    v = random_matrix(3, 3, seed=13).requires_grad_()
    square = lambda X: X @ X @ X
    assert agtest.gradgradcheck(square, (X,), (v,))
    assert agtest.gradgradcheck(make_square(transpose_bug=True), (X,), (v,))  # a wrong rule, differentiated right

    class CotangentDetached(torch.autograd.Function):  # the backward is right but not differentiable in g
        @staticmethod
        def forward(X):
            return X @ X

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])

        @staticmethod
        def backward(ctx, g):
            X, = ctx.saved_tensors
            return g.detach() @ X.mT + X.mT @ g.detach()

    assert agtest.gradcheck(CotangentDetached.apply, (X,))
    with pytest.raises(agtest.GradcheckError, match=r"input 0 \(y\) with respect to grad_outputs\[0\]"):
        agtest.gradgradcheck(CotangentDetached.apply, (X,), (v,))


# --- dot-product identity -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_dot_product_check_passes_for_agt_eigh(dtype):
    A = symmetric(6, 6, seed=14, dtype=dtype)

    def f(A):
        w, V = agt.eigh(A)
        return w, V[:, :3] @ V[:, :3].mH

    assert agtest.dot_product_check(f, (A,), rtol=1e-12) <= 1e-12
    assert agtest.dot_product_check(f, (A,), seed=1) <= 1e-12


def test_dot_product_check_catches_a_wrong_vjp():
    X = random_matrix(4, 4, seed=15)
    assert agtest.dot_product_check(make_square(), (X,)) < 1e-13
    with pytest.raises(agtest.GradcheckError, match="not the adjoint"):
        agtest.dot_product_check(make_square(transpose_bug=True), (X,))
    assert agtest.dot_product_check(make_square(transpose_bug=True), (X,), raise_exception=False) > 1e-3
    A = symmetric(4, 4, seed=16)
    assert agtest.dot_product_check(make_eigvalsh("triangular"), (A,)) < 1e-13  # symmetric tangents
    with pytest.raises(agtest.GradcheckError):
        agtest.dot_product_check(make_eigvalsh("triangular"), (A,), symmetric=False)  # its skew part shows
    with pytest.raises(agtest.GradcheckError):
        agtest.dot_product_check(make_eigvalsh("cookbook"), (A,))


def test_dot_product_check_with_given_tangents_and_an_old_style_function():
    class OldSquare(torch.autograd.Function):  # no setup_context: torch.func.jvp refuses it
        @staticmethod
        def forward(ctx, X):
            ctx.save_for_backward(X)
            ctx.save_for_forward(X)
            return X @ X

        @staticmethod
        def backward(ctx, g):
            X, = ctx.saved_tensors
            return g @ X.mT + X.mT @ g

        @staticmethod
        def jvp(ctx, dX):
            X, = ctx.saved_tensors
            return dX @ X + X @ dX

    X, dX, G = random_matrix(3, 3, seed=17), random_matrix(3, 3, seed=18), random_matrix(3, 3, seed=19)
    assert agtest.dot_product_check(OldSquare.apply, (X,), tangents=(dX,), cotangents=(G,)) < 1e-13
    B = symmetric(3, 3, seed=20)
    mixed = lambda X, B: X @ B
    assert agtest.dot_product_check(mixed, (X, B), tangents=(dX, None)) < 1e-13


def test_adjoint_check_of_rule_functions():
    A = symmetric(5, 5, seed=21) * 3
    w, V = torch.linalg.eigh(A)
    jvp = lambda dA: eigh_rules.eigh_jvp(w, V, dA)
    vjp = lambda gw, gV: eigh_rules.eigh_vjp(w, V, gw, gV)
    tangents, cotangents = (symmetric(5, 5, seed=22),), (random_matrix(5, seed=23), random_matrix(5, 5, seed=24))
    assert agtest.adjoint_check(jvp, vjp, tangents, cotangents, rtol=1e-12) <= 1e-12
    wrong_vjp = lambda gw, gV: eigh_rules.eigh_vjp(w, V, gw, gV.mT)
    with pytest.raises(agtest.GradcheckError, match="relative discrepancy"):
        agtest.adjoint_check(jvp, wrong_vjp, tangents, cotangents)


def test_inner_is_the_real_inner_product():
    X, Y = random_matrix(3, 2, seed=25, dtype=torch.complex128), random_matrix(3, 2, seed=26, dtype=torch.complex128)
    assert torch.allclose(agtest.inner(X, Y), torch.trace(X.mH @ Y).real)
    assert float(agtest.inner((X, None), (Y, X))) == float(agtest.inner(X, Y))


def test_central_difference():
    A, dA = symmetric(4, 4, seed=27), symmetric(4, 4, seed=28)
    w, V = torch.linalg.eigh(A)
    dw, dV = eigh_rules.eigh_jvp(w, V, dA)
    fd_w, fd_V = agtest.central_difference(lambda A: (torch.linalg.eigh(A)[0], agtest.align_phases(torch.linalg.eigh(A)[1], V)),
                                           (A,), (dA,), eps=1e-5)
    assert (fd_w - dw).norm() < 1e-8 * dw.norm() and (fd_V - dV).norm() < 1e-7 * dV.norm()
    # without the gauge fixed, the difference is meaningless wherever LAPACK flips a sign
    flipped = lambda B: torch.linalg.eigh(B)[1] * torch.sign((B - A).sum())
    assert (agtest.central_difference(flipped, (A,), (dA,), eps=1e-5) - dV).norm() > 1e3


# --- gauge-aware comparisons --------------------------------------------------------------------


def test_phase_alignment_real_and_complex():
    A = symmetric(5, 5, seed=30)
    _, V = torch.linalg.eigh(A)
    signs = torch.tensor([1.0, -1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    agtest.assert_close_up_to_phase(V * signs, V)
    assert torch.equal(agtest.align_phases(V * signs, V), V)
    other = V.clone()
    other[:, 2] = V[:, 3]
    with pytest.raises(AssertionError, match="sign/phase"):
        agtest.assert_close_up_to_phase(other, V)
    H = symmetric(2, 4, 4, seed=31, dtype=torch.complex128)
    _, Vc = torch.linalg.eigh(H)
    phases = torch.exp(1j * random_matrix(2, 1, 4, seed=32))
    agtest.assert_close_up_to_phase(Vc * phases, Vc)
    with pytest.raises(AssertionError):
        agtest.assert_close_up_to_phase(Vc * phases * torch.exp(1j * torch.linspace(0, 1, 4)[:, None]), Vc)
    with pytest.raises(AssertionError):
        agtest.assert_close_up_to_phase(Vc.conj(), Vc)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_svd_vectors_share_one_phase(dtype):
    A = random_matrix(6, 4, seed=33, dtype=dtype)
    U, S, Vh = torch.linalg.svd(A, full_matrices=False)
    V = Vh.mH
    if dtype.is_complex:
        D, D2 = torch.exp(1j * random_matrix(4, seed=34)), torch.exp(1j * random_matrix(4, seed=35))
    else:
        D, D2 = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=dtype), torch.tensor([-1.0, -1.0, 1.0, 1.0], dtype=dtype)
    agtest.assert_close_up_to_phase((U * D, V * D), (U, V))
    agtest.assert_close_subspaces((U * D, V * D), (U, V), S)
    with pytest.raises(AssertionError, match="sharing one phase"):
        agtest.assert_close_up_to_phase((U * D, V * D2), (U, V))  # each alone would align
    with pytest.raises(AssertionError, match="X0 X1\\^H"):
        agtest.assert_close_subspaces((U * D, V * D2), (U, V), S)
    agtest.assert_close_up_to_phase(U * D2, U)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_subspaces_of_a_degenerate_spectrum(dtype):
    Q, _ = torch.linalg.qr(random_matrix(5, 5, seed=37, dtype=dtype))
    w = torch.tensor([1.0, 2.0, 2.0, 2.0, 3.0], dtype=torch.float64)
    A = agtest.symmetrize((Q * w.to(dtype)) @ Q.mH)
    w1, V1 = torch.linalg.eigh(A)
    R, _ = torch.linalg.qr(random_matrix(3, 3, seed=38, dtype=dtype))  # a rotation inside the cluster
    V2 = V1.clone()
    V2[:, 1:4] = V1[:, 1:4] @ R
    agtest.assert_close_subspaces(V2, V1, w1)
    agtest.assert_close_subspaces(V2, V1)  # the whole span
    agtest.assert_close_subspaces(V2, V1, clusters=[[0], [1, 2, 3], [4]])
    with pytest.raises(AssertionError):
        agtest.assert_close_up_to_phase(V2, V1)  # vector by vector they differ
    with pytest.raises(AssertionError, match=r"columns \[1\]"):
        agtest.assert_close_subspaces(V2, V1, clusters=[[0], [1], [2], [3], [4]])
    V3 = V1.clone()
    V3[:, [0, 1]] = V1[:, [1, 0]]  # mixes the cluster with another eigenvalue's vector
    with pytest.raises(AssertionError, match="different subspaces at columns"):
        agtest.assert_close_subspaces(V3, V1, w1)


def test_subspaces_batched_with_per_batch_clusters():
    w = torch.tensor([[1.0, 1.0, 2.0], [1.0, 2.0, 2.0]], dtype=torch.float64)
    Q, _ = torch.linalg.qr(random_matrix(2, 3, 3, seed=39))
    c, s = 0.6, 0.8
    rot01 = torch.tensor([[c, -s, 0], [s, c, 0], [0, 0, 1]], dtype=torch.float64)
    rot12 = torch.tensor([[1, 0, 0], [0, c, -s], [0, s, c]], dtype=torch.float64)
    V2 = torch.stack([Q[0] @ rot01, Q[1] @ rot12])
    agtest.assert_close_subspaces(V2, Q, w)
    with pytest.raises(AssertionError, match=r"batch element \(1,\)"):
        agtest.assert_close_subspaces(torch.stack([Q[0] @ rot01, Q[1] @ rot01]), Q, w)

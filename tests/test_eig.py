"""agt.eig / agt.eigvals (derivations/eig.py): values exactly torch.linalg.eig's (but a generic
basis at exactly repeated eigenvalues), gradients
against torch's and finite differences, every transform, the phase and cluster gauges, defective
matrices, bad input; the same rules in JAX and NumPy."""
import numpy as np
import pytest
import torch

import adjointgen
import adjointgen.torch as agt
from adjointgen.runtime.checks import DefectiveMatrixError

torch.manual_seed(0)


def randn(*shape, dtype=torch.float64):
    return torch.randn(*shape, dtype=dtype)


def invariant_loss(w, V):
    """A loss invariant to each eigenvector's phase: |w|^2, |V|^4 and the real part of w."""
    return (w.abs() ** 2).sum() + (V.abs() ** 4).sum() + w.real.sum()


def diagonalizable(values, dtype=torch.float64, seed=0):
    """``P diag(values) P^-1`` with a random, well-conditioned ``P``."""
    g = torch.Generator().manual_seed(seed)
    n = len(values)
    P = torch.eye(n, dtype=dtype) + 0.3 * torch.randn(n, n, dtype=dtype, generator=g)
    return P @ torch.diag(torch.tensor(values, dtype=P.dtype)) @ torch.linalg.inv(P)


# ---------------------------------------------------------------- values: torch.linalg.eig's exactly
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64, torch.complex128])
@pytest.mark.parametrize("shape", [(4, 4), (3, 5, 5), (2, 1, 3, 3), (0, 3, 3), (1, 1), (0, 0), (2, 0, 0)])
def test_values_are_torchs(dtype, shape):
    A = torch.randn(*shape, dtype=dtype)
    w, V = agt.eig(A)
    w0, V0 = torch.linalg.eig(A)
    assert w.dtype == w0.dtype and V.dtype == V0.dtype and w.shape == w0.shape and V.shape == V0.shape
    assert torch.equal(w, w0) and torch.equal(V, V0)
    assert torch.equal(agt.eigvals(A), torch.linalg.eigvals(A))


# ---------------------------------------------------------------- first derivatives
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_gradient_matches_torch(dtype):
    A = randn(3, 5, 5, dtype=dtype).requires_grad_()
    g, = torch.autograd.grad(invariant_loss(*agt.eig(A)), A)
    g0, = torch.autograd.grad(invariant_loss(*torch.linalg.eig(A)), A)
    assert g.dtype == A.dtype
    torch.testing.assert_close(g, g0, rtol=1e-10, atol=1e-10)


def test_gradient_float32_matches_float64():
    A = randn(6, 6)
    A64 = A.clone().requires_grad_()
    A32 = A.float().requires_grad_()
    g64, = torch.autograd.grad(invariant_loss(*agt.eig(A64)), A64)
    g32, = torch.autograd.grad(invariant_loss(*agt.eig(A32)), A32)
    assert g32.dtype == torch.float32
    torch.testing.assert_close(g32.double(), g64, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_gradcheck_gradgradcheck_forward_mode(dtype):
    A = randn(2, 4, 4, dtype=dtype).requires_grad_()
    f = lambda A: invariant_loss(*agt.eig(A))  # noqa: E731
    assert torch.autograd.gradcheck(f, (A,))
    assert torch.autograd.gradgradcheck(f, (A,))
    assert torch.autograd.gradcheck(f, (A,), check_forward_ad=True, check_backward_ad=False,
                                    check_undefined_grad=False, check_batched_forward_grad=True)


def test_central_differences_in_a_direction():
    A = randn(5, 5)
    E = randn(5, 5)
    f = lambda A: invariant_loss(*agt.eig(A))  # noqa: E731
    X = A.clone().requires_grad_()
    g, = torch.autograd.grad(f(X), X)
    h = 1e-4
    fd = (-f(A + 2 * h * E) + 8 * f(A + h * E) - 8 * f(A - h * E) + f(A - 2 * h * E)) / (12 * h)
    assert abs(float((g * E).sum()) - float(fd)) < 1e-7 * max(1.0, abs(float(fd)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_torch_func_transforms(dtype):
    A = randn(4, 4, dtype=dtype)
    f = lambda A: invariant_loss(*agt.eig(A))  # noqa: E731
    f0 = lambda A: invariant_loss(*torch.linalg.eig(A))  # noqa: E731
    torch.testing.assert_close(torch.func.grad(f)(A), torch.func.grad(f0)(A))
    B = randn(3, 4, 4, dtype=dtype)
    torch.testing.assert_close(torch.func.vmap(torch.func.grad(f))(B), torch.func.vmap(torch.func.grad(f0))(B))
    if not dtype.is_complex:  # jacfwd/hessian of a real function of real input
        torch.testing.assert_close(torch.func.hessian(f)(A), torch.func.hessian(f0)(A), rtol=1e-8, atol=1e-8)
        torch.testing.assert_close(torch.func.jacfwd(torch.func.grad(f))(A), torch.func.jacrev(torch.func.grad(f))(A),
                                   rtol=1e-8, atol=1e-8)
    if not dtype.is_complex:  # jacrev needs real input
        wre = lambda A: agt.eig(A)[0].abs()  # noqa: E731
        torch.testing.assert_close(torch.func.jacrev(wre)(A), torch.func.jacrev(lambda A: torch.linalg.eig(A)[0].abs())(A))


def test_broadcast_and_empty_backward():
    for shape in ((0, 3, 3), (2, 0, 0)):
        A = randn(*shape).requires_grad_()
        g, = torch.autograd.grad(invariant_loss(*agt.eig(A)), A, allow_unused=True)
        assert g is None or g.shape == A.shape
    A = randn(1, 1).requires_grad_()
    g, = torch.autograd.grad(agt.eig(A)[0].real.sum(), A)
    assert torch.equal(g, torch.ones(1, 1, dtype=A.dtype))


# ---------------------------------------------------------------- the phase gauge
def test_phase_dependent_loss_raises():
    A = randn(4, 4, dtype=torch.complex128).requires_grad_()
    w, V = agt.eig(A)
    # not the largest entry of the column, which LAPACK makes real (there Re v = |v| to first order)
    i = int(V[:, 0].abs().argmin())
    with pytest.raises(adjointgen.PhaseDependentLossError):
        torch.autograd.grad(V[i, 0].real, A)
    with pytest.raises(adjointgen.GaugeDependentLossError):  # the base class users catch
        torch.autograd.grad(agt.eig(A)[1].imag.sum(), A)


def test_phase_dependent_loss_raises_for_real_input_with_complex_eigenvectors():
    A = torch.tensor([[0.0, -2.0, 0.3], [1.0, 0.0, 0.1], [0.2, 0.5, 1.0]], dtype=torch.float64, requires_grad=True)
    w, V = agt.eig(A)
    assert (w.imag.abs() > 0.1).sum() == 2  # a complex pair
    j = int(w.imag.abs().argmax())
    i = int(V[:, j].abs().argmin())
    with pytest.raises(adjointgen.PhaseDependentLossError):
        torch.autograd.grad(V[i, j].real, A)


# ---------------------------------------------------------------- clusters and defective matrices
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_invariant_losses_at_a_cluster_are_exact(dtype):
    A = diagonalizable([1.0, 1.0, 2.0, 3.0], dtype).requires_grad_()
    w, V = agt.eig(A)
    g, = torch.autograd.grad(w.sum().real, A)  # tr(A)
    torch.testing.assert_close(g, torch.eye(4, dtype=dtype), rtol=0, atol=1e-12)
    g, = torch.autograd.grad(agt.eig(A)[0].prod().real, A)  # det(A)
    torch.testing.assert_close(g, torch.autograd.grad(torch.linalg.det(A).real, A)[0], rtol=1e-10, atol=1e-10)

    def projector(A):  # the spectral projector onto the cluster: V_c (V^-1)_c
        w, V = agt.eig(A)
        idx = (w - 1).abs().argsort()[:2]
        return (V[:, idx] @ torch.linalg.inv(V)[idx, :]).real.sum()

    X = A.detach().clone().requires_grad_()
    g, = torch.autograd.grad(projector(X), X)
    E = randn(4, 4, dtype=dtype)
    h = 1e-5
    fd = (projector(A.detach() + h * E) - projector(A.detach() - h * E)) / (2 * h)
    assert abs(float((g.conj() * E).sum().real) - float(fd)) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_basis_dependent_losses_at_a_cluster_raise(dtype):
    A = diagonalizable([1.0, 1.0, 2.0, 3.0], dtype).requires_grad_()
    w, V = agt.eig(A)
    i = int((w - 1).abs().argmin())
    with pytest.raises(adjointgen.DegenerateSubspaceError, match="individual"):
        torch.autograd.grad(agt.eig(A)[0][i].real, A)
    with pytest.raises(adjointgen.DegenerateSubspaceError, match="basis"):
        torch.autograd.grad((agt.eig(A)[1].abs() ** 4)[:, i].sum(), A)
    with pytest.raises(adjointgen.DegenerateSubspaceError, match="individual"):
        torch.autograd.grad(agt.eigvals(A)[i].real, A)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_exactly_degenerate_lapack_basis_does_not_hide_basis_dependence(dtype):
    """The zero matrix and multiples of I: LAPACK's eigenvectors are I, at which the first-order
    residual of |V|^4 or |V[0, 0]| vanishes; the forward's generic basis makes them raise."""
    for A in (torch.zeros(3, 3, dtype=dtype), 2 * torch.eye(3, dtype=dtype)):
        A = A.requires_grad_()
        w, V = agt.eig(A)
        torch.testing.assert_close(torch.linalg.vector_norm(V, dim=-2), torch.ones(3, dtype=torch.float64))
        torch.testing.assert_close(A.detach().to(V.dtype) @ V, V * w)
        g, = torch.autograd.grad(agt.eig(A)[0].sum().real, A)
        torch.testing.assert_close(g, torch.eye(3, dtype=dtype), rtol=0, atol=1e-12)
        for loss in (lambda V: V.abs().pow(4).sum(), lambda V: V[0, 0].abs()):
            with pytest.raises(adjointgen.DegenerateSubspaceError):
                torch.autograd.grad(loss(agt.eig(A)[1]), A)


def test_defective_matrix_raises_in_reverse_and_forward_mode():
    J = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 2.0]], dtype=torch.float64)
    A = J.clone().requires_grad_()
    with pytest.raises(DefectiveMatrixError, match="defective"):
        torch.autograd.grad(agt.eig(A)[0].sum().real, A)
    with pytest.raises(adjointgen.SingularMatrixError):  # its base class
        torch.autograd.grad(agt.eigvals(A).sum().real, A)
    with pytest.raises(DefectiveMatrixError):
        torch.func.jvp(lambda A: agt.eig(A)[0], (J,), (randn(3, 3),))


# ---------------------------------------------------------------- bad input
def test_bad_input():
    with pytest.raises(RuntimeError):
        agt.eig(randn(3, 4))
    with pytest.raises(ValueError, match="NaN"):
        agt.eig(torch.full((3, 3), float("nan"), dtype=torch.float64))
    with pytest.raises(RuntimeError):  # as torch.linalg.eig
        agt.eig(torch.ones(3, 3, dtype=torch.int64))
    with pytest.raises(RuntimeError):
        agt.eigvals(randn(2, 3))


# ---------------------------------------------------------------- NumPy rules and JAX
def test_numpy_rules_match_torch():
    import adjointgen.cupy as agc

    A = randn(5, 5, dtype=torch.complex128).requires_grad_()
    w, V = agt.eig(A)
    gw, gV = randn(5, dtype=torch.complex128), randn(5, 5, dtype=torch.complex128)
    gV = gV - V.detach() * (V.detach().mH @ gV).diagonal().imag.mul(1j).unsqueeze(-2)  # no phase dependence
    g, = torch.autograd.grad((w, V), A, (gw, gV))
    gn = agc.eig_vjp(w.detach().numpy(), V.detach().numpy(), gw.numpy(), gV.numpy())
    np.testing.assert_allclose(gn, g.numpy(), rtol=1e-10, atol=1e-10)


@pytest.mark.slow  # heavy (JAX compiles or a whole-catalogue audit): CI's slow step
def test_jax():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from jax.test_util import check_grads

    import adjointgen.jax as agj

    rng = np.random.default_rng(0)
    for A in (rng.standard_normal((4, 4)), rng.standard_normal((4, 4)) + 1j * rng.standard_normal((4, 4))):
        A = jnp.asarray(A)
        w, V = agj.eig(A)
        w0, V0 = jnp.linalg.eig(A)
        np.testing.assert_allclose(w, w0, rtol=0, atol=0)
        np.testing.assert_allclose(V, V0, rtol=0, atol=0)

        def f(A):
            w, V = agj.eig(A)
            return (jnp.abs(w) ** 2).sum() + (jnp.abs(V) ** 4).sum() + w.real.sum()

        check_grads(f, (A,), order=2, modes=("fwd", "rev"))
        At = torch.tensor(np.asarray(A), requires_grad=True)
        gt, = torch.autograd.grad(invariant_loss(*torch.linalg.eig(At)), At)
        # JAX's gradient of a real function of complex input is the conjugate of torch's
        np.testing.assert_allclose(np.conj(np.asarray(jax.grad(f)(A))), gt.numpy(), rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(jax.jit(jax.grad(f))(A), jax.grad(f)(A), rtol=1e-12, atol=1e-12)
    with pytest.raises(adjointgen.PhaseDependentLossError):
        jax.grad(lambda A: agj.eig(A)[1][1, 0].real)(A)


def test_a_nearly_defective_matrix_raises_with_condition_estimates():
    # a Jordan block under a similarity: rounding splits its eigenvalue by eps^(1/3), and the
    # derivative, which divides by those gaps, has no correct digits (it was 1.9e9 and 16% off)
    g = torch.Generator().manual_seed(0)
    J = torch.tensor([[2.0, 1.0, 0.0], [0.0, 2.0, 1.0], [0.0, 0.0, 2.0]], dtype=torch.float64)
    S = torch.randn(3, 3, dtype=torch.float64, generator=g)
    A = (S @ J @ torch.linalg.inv(S)).requires_grad_()
    W = torch.randn(3, dtype=torch.float64, generator=g)
    w, V = agt.eig(A)
    with pytest.raises(adjointgen.DefectiveMatrixError, match="numerically defective.*condition estimates"):
        torch.autograd.grad((W * (V.abs() ** 2).sum(0)).sum() + (W * w.real).sum(), A)
    # well separated but non-normal: no false error, and the gradient is torch's
    B = torch.tensor([[1.0, 100.0, 0.0], [0.0, 2.0, 100.0], [0.0, 0.0, 3.0]], dtype=torch.float64, requires_grad=True)
    ours, = torch.autograd.grad((agt.eigvals(B).real * W).sum(), B)
    ref, = torch.autograd.grad((torch.linalg.eigvals(B).real * W).sum(), B)
    torch.testing.assert_close(ours, ref)


@pytest.mark.parametrize("A", [torch.zeros(4, 4, dtype=torch.float64),
                               torch.diag(torch.tensor([1.0, 1.0, 2.0, 3.0], dtype=torch.float64))],
                         ids=["zero", "cluster"])
def test_second_derivative_at_a_cluster_of_eigenvalues_raises(A):
    """At a cluster of a general matrix's eigenvalues a function such as sum(Re(w)^2) has no second
    derivative (the cluster splits as the eigenvalues of a non-Hermitian block: at A = 0 along E it
    is sum Re(eig(E))^2, not a quadratic form in E); the first derivative exists and is returned."""
    from adjointgen.runtime.gauge import DegenerateSubspaceError

    E = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    X = A.clone().requires_grad_()
    g, = torch.autograd.grad((agt.eigvals(X).real ** 2).sum(), X, create_graph=True)
    torch.testing.assert_close(g.detach(), 2 * A.mT)  # d/dA sum(w^2) = 2 A^T for these real spectra
    with pytest.raises(DegenerateSubspaceError, match="second derivative at a cluster"):
        torch.autograd.grad((g * E).sum(), X)


# ---------------------------------------------------------------- left eigenvectors
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_left_eigenvectors_are_scipys_up_to_phase(dtype):
    """``eig(A, left=True)``: ``(w, VL, V)`` with ``VL_j^H A = w_j VL_j^H``, unit columns and
    ``VL_j^H V_j`` real and positive; the same lines as SciPy's left eigenvectors; batches and the
    empty batch."""
    import scipy.linalg

    A = randn(2, 5, 5, dtype=dtype)
    w, VL, V = agt.eig(A, left=True)
    w0, V0 = agt.eig(A)
    assert torch.equal(w, w0) and torch.equal(V, V0) and VL.shape == V.shape and VL.dtype == V.dtype
    assert torch.allclose(VL.mH @ A.to(VL.dtype), w[..., :, None] * VL.mH, atol=1e-12, rtol=0)
    assert torch.allclose(torch.linalg.vector_norm(VL, dim=-2), torch.ones(2, 5, dtype=torch.float64), atol=1e-14)
    d = torch.diagonal(VL.mH @ V, dim1=-2, dim2=-1)
    assert (d.real > 0).all() and torch.allclose(d.imag, torch.zeros_like(d.real), atol=1e-14)
    for i in range(2):
        ws, vls = scipy.linalg.eig(A[i].numpy(), left=True, right=False)
        for j in range(5):
            k = int(np.argmin(np.abs(ws - w[i, j].item())))
            assert abs(abs(np.vdot(vls[:, k], VL[i, :, j].numpy())) - 1) < 1e-10
    w, VL, V = agt.eig(torch.zeros(0, 3, 3, dtype=dtype), left=True)
    assert VL.shape == (0, 3, 3)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_left_eigenvectors_gradients(dtype):
    """A phase-invariant loss of VL (with V's too) against gradcheck, gradgradcheck, forward mode and
    central differences; a loss on VL's phase raises PhaseDependentLossError, as one on V's."""
    A = diagonalizable([1.0, -2.0, 3.5, 0.5], dtype=dtype, seed=3).requires_grad_()

    def loss(a):
        w, VL, V = agt.eig(a, left=True)
        P0 = V[..., :, :1] @ VL[..., :, :1].mH / (VL[..., :, :1].mH @ V[..., :, :1])  # spectral projector
        return (VL.abs() ** 4).sum() + P0.real.sum() + (w.abs() ** 2).sum()

    assert torch.autograd.gradcheck(loss, (A,))
    assert torch.autograd.gradgradcheck(loss, (A,))
    assert torch.autograd.gradcheck(loss, (A,), check_forward_ad=True, check_backward_ad=False,
                                    check_undefined_grad=False, check_batched_forward_grad=False)
    g, = torch.autograd.grad(loss(A), A)
    E = randn(4, 4, dtype=dtype)
    h = 1e-6
    fd = (loss(A.detach() + h * E) - loss(A.detach() - h * E)) / (2 * h)
    assert abs((g.conj() * E).real.sum() - fd) < 1e-7 * max(1.0, abs(fd))
    with pytest.raises(adjointgen.PhaseDependentLossError):
        x = agt.eig(A, left=True)[1][0, 0]
        (x.real + x.imag).backward()  # d/dθ of e^{iθ} x: nonzero also where x is real

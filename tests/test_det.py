"""det and logdet: torch's values; gradients against central differences at invertible, singular
(rank n - 1) and rank n - 2 matrices (torch.linalg.det's gradient at an exactly singular real
matrix is 0 where the cofactors are not: ours follows the adjugate); gradcheck/gradgradcheck and
forward mode, real and complex; a second derivative at a singular complex matrix raises; every
torch.func transform; empty and broadcast batches; the NumPy and JAX functions."""
import numpy as np
import pytest
import torch

import adjointgen.torch as agt


def _A(shape, dtype, seed=0):
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def _rank_deficient(n, rank, dtype, seed=0):
    X, Y = _A((n, rank), dtype, seed), _A((rank, n), dtype, seed + 1)
    return X @ Y


def _cofactors(A):
    """The matrix of cofactors C_ij = (-1)^(i+j) det(A without row i and column j) (the gradient of
    det for real A), from its definition."""
    n = A.shape[-1]
    C = torch.empty_like(A)
    for i in range(n):
        for j in range(n):
            minor = torch.cat([torch.cat([A[:i, :j], A[:i, j + 1:]], 1), torch.cat([A[i + 1:, :j], A[i + 1:, j + 1:]], 1)], 0)
            C[i, j] = (-1) ** (i + j) * torch.linalg.det(minor)
    return C


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=str)
def test_values_and_gradients_match_torch_at_invertible_matrices(dtype):
    A = _A((2, 3, 4, 4), dtype).requires_grad_()
    torch.testing.assert_close(agt.det(A), torch.linalg.det(A), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(agt.logdet(A), torch.logdet(A), rtol=1e-12, atol=1e-12, equal_nan=True)
    g = torch.randn_like(agt.det(A))
    ours, = torch.autograd.grad(agt.det(A), A, g)
    ref, = torch.autograd.grad(torch.linalg.det(A), A, g)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(agt.det, (A[0, 0].detach().requires_grad_(),), check_forward_ad=True,
                                    check_batched_grad=True)
    assert torch.autograd.gradgradcheck(agt.det, (A[0, 0].detach().requires_grad_(),))


@pytest.mark.parametrize("n", [2, 3, 5])
def test_the_gradient_at_singular_matrices_is_the_cofactor_matrix(n):
    for rank in (n - 1, max(n - 2, 0)):
        A = _rank_deficient(n, rank, torch.float64, seed=n + rank).requires_grad_()
        g, = torch.autograd.grad(agt.det(A), A)
        torch.testing.assert_close(g, _cofactors(A.detach()), rtol=1e-9, atol=1e-12)
    A = _rank_deficient(n, n - 1, torch.float64, seed=7).requires_grad_()
    assert torch.autograd.gradcheck(agt.det, (A,), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(agt.det, (A,))
    if n > 2:  # where torch's gradient is 0 (its exactly singular branch), the cofactors are not
        B = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]], dtype=torch.float64, requires_grad=True)
        g, = torch.autograd.grad(agt.det(B), B)
        torch.testing.assert_close(g, _cofactors(B.detach()))
        assert g.abs().max() > 1


def test_complex_singular_first_and_second_order():
    for rank in (3, 2, 1, 0):
        A = _rank_deficient(4, rank, torch.complex128, seed=3).requires_grad_()
        assert torch.autograd.gradcheck(agt.det, (A,), check_forward_ad=True)
        assert torch.autograd.gradgradcheck(agt.det, (A,))


def _exact_hessian(A):
    """The Hessian of det at A from SymPy's determinant of a symbolic matrix (independent of torch)."""
    import sympy as sp

    n = A.shape[-1]
    symbols = sp.symbols(f"a0:{n * n}")
    H = sp.hessian(sp.Matrix(n, n, symbols).det(), symbols)
    at = dict(zip(symbols, A.reshape(-1).tolist()))
    return torch.tensor([[float(H[i, j].subs(at)) for j in range(n * n)] for i in range(n * n)], dtype=A.dtype)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_hessians_at_every_rank_are_the_polynomial_s(n):
    # det is a polynomial: its Hessian exists at the zero matrix and every rank (it was NaN below n - 1)
    for rank in range(n + 1):
        A = _rank_deficient(n, rank, torch.float64, seed=10 * n + rank) if rank else torch.zeros(n, n, dtype=torch.float64)
        want = _exact_hessian(A)
        for H in (torch.autograd.functional.hessian(agt.det, A), torch.func.hessian(agt.det)(A),
                  torch.func.jacrev(torch.func.jacrev(agt.det))(A)):
            torch.testing.assert_close(H.reshape(n * n, n * n), want, rtol=1e-9, atol=1e-12)
    if n == 2:  # d^2 det = 2 (a d - b c)'s Hessian: the exchange matrix with signs
        want = torch.tensor([[0, 0, 0, 1], [0, 0, -1, 0], [0, -1, 0, 0], [1, 0, 0, 0]], dtype=torch.float64)
        torch.testing.assert_close(torch.func.hessian(agt.det)(torch.zeros(2, 2, dtype=torch.float64)).reshape(4, 4),
                                   want)


def test_every_torch_func_transform_agrees_with_torch():
    A = _A((4, 4), torch.float64, seed=4)
    f, ref = (lambda a: agt.det(a) ** 2), (lambda a: torch.linalg.det(a) ** 2)
    for transform in (torch.func.grad, torch.func.jacrev, torch.func.jacfwd, torch.func.hessian):
        torch.testing.assert_close(transform(f)(A), transform(ref)(A), rtol=1e-9, atol=1e-10)
    As = _A((3, 4, 4), torch.float64, seed=5)
    As[1] = _rank_deficient(4, 3, torch.float64, seed=6)  # one singular member: the SVD route under vmap
    got = torch.func.vmap(torch.func.grad(agt.det))(As)
    torch.testing.assert_close(got[1], _cofactors(As[1]), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got[0], torch.func.grad(torch.linalg.det)(As[0]), rtol=1e-10, atol=1e-12)


def test_logdet_follows_torch_signs_and_singularities():
    A = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64)  # det -1: NaN, as torch
    assert torch.isnan(agt.logdet(A)) and torch.isnan(torch.logdet(A))
    Z = torch.zeros(2, 2, dtype=torch.float64)
    assert agt.logdet(Z) == torch.logdet(Z) == -float("inf")
    C = _A((3, 3), torch.complex128, seed=8).requires_grad_()
    torch.testing.assert_close(agt.logdet(C), torch.logdet(C))
    g, = torch.autograd.grad(agt.logdet(C).imag, C)
    torch.testing.assert_close(g, torch.autograd.grad(torch.logdet(C).imag, C)[0], rtol=1e-10, atol=1e-12)


def test_float32_empty_batches_and_bad_input():
    A = _A((2, 3, 3), torch.float32)
    torch.testing.assert_close(agt.det(A), torch.linalg.det(A), rtol=1e-5, atol=1e-5)
    for shape in ((0, 3, 3), (2, 0, 4, 4), (0, 0), (2, 0, 0)):
        A0 = torch.randn(*shape, requires_grad=True)
        d = agt.det(A0)
        assert d.shape == torch.linalg.det(A0).shape
        torch.testing.assert_close(d, torch.linalg.det(A0))
        d.sum().backward()
        assert A0.grad.shape == A0.shape
    with pytest.raises(ValueError, match="NaN|Inf"):
        agt.det(torch.full((3, 3), float("inf")))
    with pytest.raises(ValueError):
        agt.det(torch.ones(2, 3))


@pytest.mark.slow  # 13-25 s: the default suite keeps its time; CI's slow step runs it
def test_the_numpy_and_jax_functions():
    import adjointgen.cupy as agc

    A = _rank_deficient(4, 3, torch.float64, seed=9)
    gA = agc.det_vjp(A.numpy(), np.linalg.det(A.numpy()), np.ones(()))
    np.testing.assert_allclose(gA, _cofactors(A).numpy(), rtol=1e-9, atol=1e-12)
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from jax.test_util import check_grads

    import adjointgen.jax as agj

    B = jnp.asarray(_A((4, 4), torch.float64, seed=10).numpy())
    np.testing.assert_allclose(agj.det(B), jnp.linalg.det(B), rtol=1e-12)
    np.testing.assert_allclose(jax.grad(agj.det)(B), jax.grad(jnp.linalg.det)(B), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(jax.grad(agj.det)(jnp.asarray(A.numpy())), _cofactors(A).numpy(), rtol=1e-9, atol=1e-12)
    check_grads(agj.det, (B,), order=2, modes=("fwd", "rev"))
    for n in (2, 3):  # Hessians at the zero matrix and at rank 1 (NaN before)
        for rank in (0, 1):
            A = _rank_deficient(n, rank, torch.float64, seed=n + rank) if rank else torch.zeros(n, n, dtype=torch.float64)
            H = jax.hessian(agj.det)(jnp.asarray(A.numpy()))
            np.testing.assert_allclose(np.asarray(H).reshape(n * n, n * n), _exact_hessian(A).numpy(), atol=1e-10)


def test_the_backward_reuses_the_forwards_lu_factorization():
    """det's forward saves its LU factors (``d.forward(saves={"A": "lu"})``) and a first-order
    backward takes ``adj(A^H) = conj(det A) A^-H`` from them: one LU factorization per forward +
    backward, as torch's; the gradient is torch's, real and complex, batched."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    for dtype in (torch.float64, torch.complex128):
        g = torch.Generator().manual_seed(3)
        A = (torch.randn(2, 5, 5, dtype=dtype, generator=g) + 3 * torch.eye(5, dtype=dtype)).requires_grad_()
        with Count() as count:
            (gA,) = torch.autograd.grad(agt.det(A).real.sum(), A)
        factorizations = [n for n in count.names if n.startswith(("linalg_lu_factor", "_linalg_det", "linalg_svd"))]
        assert len(factorizations) == 1, count.names
        (expected,) = torch.autograd.grad(torch.linalg.det(A).real.sum(), A)
        torch.testing.assert_close(gA, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_the_adjugate_from_saved_factors_is_the_adjugate(dtype):
    """``runtime.linalg.adjugate(A, LU, pivots, adjoint=...)`` against the adjugate of ``A^H``
    computed afresh (the SVD form at a singular ``A``), and with a graph recorded (second order)
    the factors are not used."""
    from adjointgen.runtime import linalg

    g = torch.Generator().manual_seed(4)
    A = torch.randn(3, 4, 4, dtype=dtype, generator=g)
    A[1, :, 0] = A[1, :, 1]  # one singular matrix in the batch: the SVD form for the batch
    LU, pivots, _ = torch.linalg.lu_factor_ex(A)
    with torch.no_grad():
        for M in (A, A[[0, 2]]):
            LU, pivots, _ = torch.linalg.lu_factor_ex(M)
            torch.testing.assert_close(linalg.adjugate(M, LU, pivots, adjoint=True), linalg.adjugate(M.mH),
                                       rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(linalg.adjugate(M, LU, pivots), linalg.adjugate(M), rtol=1e-10, atol=1e-12)
            adj = linalg.adjugate(M, LU, pivots)
            det = torch.linalg.det(M)
            torch.testing.assert_close(M @ adj, det[:, None, None] * torch.eye(4, dtype=dtype).expand_as(M),
                                       rtol=1e-10, atol=1e-10)
    B = A[[0, 2]].clone().requires_grad_()
    assert torch.autograd.gradgradcheck(lambda X: agt.det(X).real, (B,))

"""agt.ldl / agj.ldl (``derivations/ldl.py``, the LDL^H factorization without pivoting): values
against the Cholesky factor (positive definite A) and the reconstruction (indefinite A), gradients
against torch's Cholesky backward (an independent rule) and finite differences, complex data,
batches and empty shapes, float32, torch.func transforms, JAX, the generated NumPy rules, and the
named errors (a zero pivot, non-Hermitian, NaN, wrong shape)."""
import numpy as np
import pytest
import torch

import adjointgen.torch as agt
from adjointgen.runtime.checks import SingularMatrixError


def indefinite(n, seed=0, dtype=torch.float64, batch=()):
    """``L0 diag(d0) L0^H`` with pivots of both signs, ``1 <= |d0| <= 3``."""
    g = torch.Generator().manual_seed(seed)
    L0 = torch.eye(n, dtype=dtype) + (0.5 * torch.randn(*batch, n, n, dtype=dtype, generator=g)).tril(-1)
    d0 = (1 + 2 * torch.rand(n, dtype=torch.float64, generator=g)) * torch.tensor([(-1.0) ** i for i in range(n)])
    A = (L0 * d0.to(dtype)) @ L0.mH
    return (A + A.mH) / 2


def spd(n, seed=0, dtype=torch.float64, batch=()):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(*batch, n, n, dtype=dtype, generator=g)
    return X @ X.mH + n * torch.eye(n, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128, torch.float32, torch.complex64])
def test_values_are_the_scaled_cholesky_factor_and_reconstruct_indefinite_a(dtype):
    tol = 1e-12 if dtype in (torch.float64, torch.complex128) else 2e-5
    A = spd(5, 1, dtype, (2, 3))
    L, d = agt.ldl(A)
    assert L.dtype == dtype and d.dtype == torch.empty((), dtype=dtype).real.dtype and d.shape == (2, 3, 5)
    C = torch.linalg.cholesky(A)
    c = C.diagonal(dim1=-2, dim2=-1).real
    assert torch.allclose(L, C / c[..., None, :].to(dtype), atol=tol, rtol=0)
    assert torch.allclose(d, c ** 2, atol=tol * 10, rtol=tol)
    B = indefinite(6, 2, dtype, (3,))
    L, d = agt.ldl(B)
    assert (d < 0).any() and (d > 0).any()
    assert torch.equal(L.diagonal(dim1=-2, dim2=-1), torch.ones(3, 6, dtype=dtype))
    assert torch.equal(L.triu(1), torch.zeros_like(L))
    assert torch.allclose((L * d.to(dtype)[..., None, :]) @ L.mH, B, atol=tol * 20, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_gradcheck_gradgradcheck_and_forward_mode(dtype):
    def f(X):
        X = (X + X.mH) / 2  # the input is Hermitian: perturb along Hermitian directions
        return agt.ldl(X)

    A = indefinite(4, 3, dtype).requires_grad_()
    assert torch.autograd.gradcheck(f, (A,))
    assert torch.autograd.gradgradcheck(f, (A,))
    assert torch.autograd.gradcheck(f, (A,), check_forward_ad=True, check_backward_ad=False,
                                    check_undefined_grad=False)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_gradient_equals_torchs_cholesky_backward(dtype):
    """For positive definite A, ``L_chol = L diag(sqrt(d))``: a loss of the Cholesky factor made
    from agt.ldl has the gradient torch's own Cholesky backward gives."""
    A = spd(5, 4, dtype, (2,))
    W = torch.randn(2, 5, 5, dtype=dtype, generator=torch.Generator().manual_seed(5))

    def via_ldl(X):
        L, d = agt.ldl(X)
        return (W * L * d.sqrt().to(dtype)[..., None, :]).real.sum()

    def via_torch(X):
        return (W * torch.linalg.cholesky(X)).real.sum()

    g1 = torch.func.grad(via_ldl)(A)
    g2 = torch.func.grad(via_torch)(A)
    # both are the gradient projected onto Hermitian matrices only after symmetrisation
    assert torch.allclose((g1 + g1.mH) / 2, (g2 + g2.mH) / 2, atol=1e-11, rtol=0)
    # and the Hessians along a Hermitian direction agree (second derivatives through the rule)
    E = torch.randn(2, 5, 5, dtype=dtype, generator=torch.Generator().manual_seed(6))
    E = E + E.mH
    h1 = torch.func.jvp(torch.func.grad(via_ldl), (A,), (E,))[1]
    h2 = torch.func.jvp(torch.func.grad(via_torch), (A,), (E,))[1]
    assert torch.allclose((h1 + h1.mH) / 2, (h2 + h2.mH) / 2, atol=1e-9, rtol=0)


def test_torch_func_transforms_agree():
    A = indefinite(3, 7)

    def f(X):
        L, d = agt.ldl((X + X.mT) / 2)
        return torch.cat([L.flatten(), d])

    jr, jf = torch.func.jacrev(f)(A), torch.func.jacfwd(f)(A)
    assert torch.allclose(jr, jf, atol=1e-12)
    # finite differences, an independent reference
    E = torch.randn(3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    h = 1e-6
    fd = (f(A + h * E) - f(A - h * E)) / (2 * h)
    assert torch.allclose((jf * E).sum((-2, -1)), fd, atol=1e-7)
    H = torch.func.hessian(lambda X: f(X).square().sum())(A)
    assert H.shape == (3, 3, 3, 3) and torch.isfinite(H).all()
    batch = indefinite(3, 9, batch=(4,))
    Lv, dv = torch.func.vmap(agt.ldl)(batch)
    Lb, db = agt.ldl(batch)
    assert torch.allclose(Lv, Lb) and torch.allclose(dv, db)


def test_empty_and_broadcast_shapes():
    L, d = agt.ldl(torch.zeros(0, 3, 3, dtype=torch.float64))
    assert L.shape == (0, 3, 3) and d.shape == (0, 3)
    L, d = agt.ldl(torch.zeros(2, 0, 0, dtype=torch.float64))
    assert L.shape == (2, 0, 0) and d.shape == (2, 0)
    A = indefinite(3, 10, batch=(1, 2)).requires_grad_()
    L, d = agt.ldl(A)
    (L.sum() + d.sum()).backward()
    assert A.grad.shape == A.shape and torch.isfinite(A.grad).all()


def test_errors_are_named():
    with pytest.raises(SingularMatrixError, match="pivot 0"):
        agt.ldl(torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64))  # indefinite, needs pivoting
    with pytest.raises(SingularMatrixError, match="pivot 1"):
        agt.ldl(torch.tensor([[1.0, 1.0], [1.0, 1.0]], dtype=torch.float64))  # singular
    with pytest.raises(ValueError, match="symmetric"):
        agt.ldl(torch.tensor([[1.0, 2.0], [0.0, 1.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="NaN"):
        agt.ldl(torch.tensor([[float("nan"), 0.0], [0.0, 1.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="square"):
        agt.ldl(torch.zeros(3, 4, dtype=torch.float64))


def test_jax_matches_torch():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    import adjointgen.jax as agj

    A = indefinite(4, 11)
    W = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(12))

    def loss_t(X):
        L, d = agt.ldl((X + X.mT) / 2)
        return (W * L).sum() + d.square().sum()

    def loss_j(X):
        L, d = agj.ldl((X + X.T) / 2)
        return (jnp.asarray(W.numpy()) * L).sum() + (d ** 2).sum()

    g_t = torch.func.grad(loss_t)(A)
    g_j = jax.jit(jax.grad(loss_j))(jnp.asarray(A.numpy()))
    assert np.abs(np.asarray(g_j) - g_t.numpy()).max() < 1e-11
    Lb, db = jax.vmap(agj.ldl)(jnp.stack([jnp.asarray(A.numpy())] * 2))
    assert np.abs(np.asarray(db[1]) - agt.ldl(A)[1].numpy()).max() < 1e-13


def test_numpy_rules_match_the_torch_rules():
    from adjointgen.generated.cupy import ldl as rules_np
    from adjointgen.generated.torch import ldl as rules_t

    A = indefinite(5, 13)
    L, d = agt.ldl(A)
    g = torch.Generator().manual_seed(14)
    dA = torch.randn(5, 5, dtype=torch.float64, generator=g)
    dA = dA + dA.mT
    gL, gd = torch.randn(5, 5, dtype=torch.float64, generator=g), torch.randn(5, dtype=torch.float64, generator=g)
    for a, b in zip(rules_np.ldl_jvp(L.numpy(), d.numpy(), dA.numpy()), rules_t.ldl_jvp(L, d, dA)):
        assert np.abs(a - b.numpy()).max() < 1e-12
    a = rules_np.ldl_vjp(L.numpy(), d.numpy(), gL.numpy(), gd.numpy())
    b = rules_t.ldl_vjp(L, d, gL, gd)
    assert np.abs(np.asarray(a) - b.numpy()).max() < 1e-12

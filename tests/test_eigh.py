"""Stage 3: the generated eigh rules against finite differences, the dot-product identity,
torch.linalg.eigh's built-in backward, the NumPy backend, batches and vmap."""
import numpy as np
import pytest
import torch

import adjointgen.testing as agtest
import adjointgen.torch as agt
from adjointgen.generated.cupy import eigh as eigh_xp
from adjointgen.generated.torch import eigh as eigh_t
from helpers import gauge_invariant_eigh_loss, rel, sym

torch.manual_seed(0)


def spd_spread(n, batch=(), dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(*batch, n, n, dtype=dtype, generator=g)
    return sym(X) * 3


@pytest.mark.parametrize("n", [1, 2, 5, 12])
def test_jvp_matches_central_differences_along_symmetric_directions(n):
    A = spd_spread(n, seed=n)
    dA = sym(torch.randn(n, n, dtype=torch.float64))  # perturbs A_ij and A_ji together
    w, V = torch.linalg.eigh(A)
    dw, dV = eigh_t.eigh_jvp(w, V, dA)

    def eigh_signs_fixed(B):  # finite differences of eigenvectors need one sign per column
        wB, VB = torch.linalg.eigh(B)
        return wB, agtest.align_phases(VB, V)

    fd_w, fd_V = agtest.central_difference(eigh_signs_fixed, (A,), (dA,), eps=1e-5)
    assert rel(dw, fd_w) < 1e-7
    assert rel(dV, fd_V) < 1e-6


@pytest.mark.parametrize("n", [2, 6, 17])
def test_vjp_is_adjoint_of_jvp(n):
    A = spd_spread(n, seed=100 + n)
    w, V = torch.linalg.eigh(A)
    dA = sym(torch.randn(n, n, dtype=torch.float64))
    gw, gV = torch.randn(n, dtype=torch.float64), torch.randn(n, n, dtype=torch.float64)
    jvp = lambda dA: eigh_t.eigh_jvp(w, V, dA)
    vjp = lambda gw, gV: eigh_t.eigh_vjp(w, V, gw, gV)
    # |<gw, dw> + <gV, dV> - <gA, dA>| <= 1e-12 (|lhs| + |rhs|)
    assert agtest.adjoint_check(jvp, vjp, (dA,), (gw, gV), rtol=1e-12) <= 1e-12
    gA = vjp(gw, gV)
    assert torch.allclose(gA, gA.mT, atol=0, rtol=0) or rel(gA, gA.mT) < 1e-15  # symmetric
    # the same identity through agt.eigh's autograd (torch.func.jvp against torch.autograd.grad)
    invariant = lambda A: (lambda w, V: (w, V[:, : n // 2] @ V[:, : n // 2].mT))(*agt.eigh(A))
    assert agtest.dot_product_check(invariant, (A,), tangents=(dA,), rtol=1e-12) <= 1e-12


@pytest.mark.parametrize("batch, n", [((), 4), ((), 30), ((3,), 8), ((2, 2), 5)])
def test_gradient_matches_torch_builtin(batch, n):
    A = spd_spread(n, batch, seed=7).requires_grad_()
    weights = torch.randn(n, n, dtype=torch.float64)
    g1, = torch.autograd.grad(gauge_invariant_eigh_loss(*agt.eigh(A), weights), A)
    g2, = torch.autograd.grad(gauge_invariant_eigh_loss(*torch.linalg.eigh(A), weights), A)
    assert rel(g1, g2) <= 1e-10


def test_forward_mode_matches_torch_builtin():
    A = spd_spread(7, seed=3)
    dA = sym(torch.randn(7, 7, dtype=torch.float64))
    _, (dw1, dV1) = torch.func.jvp(agt.eigh, (A,), (dA,))
    _, (dw2, dV2) = torch.func.jvp(torch.linalg.eigh, (A,), (dA,))
    assert rel(dw1, dw2) < 1e-12
    assert rel(dV1, agtest.align_phases(dV2, dV1)) < 1e-10 or rel(dV1, dV2) < 1e-10


def test_second_derivatives_match_torch_builtin():
    A = spd_spread(6, seed=4).requires_grad_()

    def f(eig):
        w, V = eig(A)
        return (w.pow(3)).sum() + (V[:, :2] @ V[:, :2].mT).pow(2).sum()

    g1, = torch.autograd.grad(f(agt.eigh), A, create_graph=True)
    g2, = torch.autograd.grad(f(torch.linalg.eigh), A, create_graph=True)
    h1, = torch.autograd.grad(g1.pow(2).sum(), A)
    h2, = torch.autograd.grad(g2.pow(2).sum(), A)
    assert rel(h1, h2) < 1e-9


def test_gradcheck_and_gradgradcheck_along_symmetric_directions():
    # perturbs A[i, j] and A[j, i] together, so no symmetric parametrisation A = sym(X) is needed
    A = sym(torch.randn(5, 5, dtype=torch.float64)).requires_grad_()

    def f(A):
        w, V = agt.eigh(A + torch.diag(torch.arange(5.0, dtype=torch.float64)) * 2)
        return w, V[:, :2] @ V[:, :2].mT

    assert agtest.gradcheck(f, (A,), symmetric=True, check_forward_ad=True)
    assert agtest.gradgradcheck(f, (A,), symmetric=True)


def test_torch_func_grad_and_vmap_agree_with_loop():
    A = spd_spread(6, (4,), seed=9)
    weights = torch.randn(6, 6, dtype=torch.float64)
    loss = lambda a: gauge_invariant_eigh_loss(*agt.eigh(a), weights)
    batched = torch.func.vmap(torch.func.grad(loss))(A)
    looped = torch.stack([torch.func.grad(loss)(a) for a in A])
    assert rel(batched, looped) < 1e-13
    w_b, V_b = torch.func.vmap(agt.eigh)(A)
    w_l = torch.stack([agt.eigh(a)[0] for a in A])
    assert rel(w_b, w_l) < 1e-14


def test_batched_equals_loop():
    A = spd_spread(5, (3,), seed=11).requires_grad_()
    weights = torch.randn(5, 5, dtype=torch.float64)
    g_batch, = torch.autograd.grad(gauge_invariant_eigh_loss(*agt.eigh(A), weights), A)
    g_loop = torch.stack([torch.autograd.grad(gauge_invariant_eigh_loss(*agt.eigh(a), weights), a)[0]
                          for a in A.detach().clone().requires_grad_().unbind(0)])
    assert rel(g_batch, g_loop) < 1e-13


def test_float32():
    A = spd_spread(16, seed=12, dtype=torch.float32).requires_grad_()
    weights = torch.randn(16, 16)
    g1, = torch.autograd.grad(gauge_invariant_eigh_loss(*agt.eigh(A), weights), A)
    g2, = torch.autograd.grad(gauge_invariant_eigh_loss(*torch.linalg.eigh(A), weights), A)
    assert g1.dtype == torch.float32
    assert rel(g1, g2) < 1e-4


@pytest.mark.parametrize("batch", [(), (3,)])
def test_numpy_backend_equals_torch_backend(batch):
    A = spd_spread(9, batch, seed=13)
    w, V = torch.linalg.eigh(A)
    dA = sym(torch.randn(*batch, 9, 9, dtype=torch.float64))
    gw, gV = torch.randn(*batch, 9, dtype=torch.float64), torch.randn(*batch, 9, 9, dtype=torch.float64)
    t_jvp = eigh_t.eigh_jvp(w, V, dA)
    n_jvp = eigh_xp.eigh_jvp(w.numpy(), V.numpy(), dA.numpy())
    for a, b in zip(t_jvp, n_jvp):
        assert isinstance(b, np.ndarray)
        np.testing.assert_allclose(b, a.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(eigh_xp.eigh_vjp(w.numpy(), V.numpy(), gw.numpy(), gV.numpy()),
                               eigh_t.eigh_vjp(w, V, gw, gV).numpy(), rtol=1e-12, atol=1e-12)


def test_absent_cotangent_is_zero():
    A = spd_spread(5, seed=14).requires_grad_()
    g_only_w, = torch.autograd.grad(agt.eigh(A)[0].sum(), A)
    assert torch.allclose(g_only_w, torch.eye(5, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.zeros(3, 4, dtype=torch.float64), "square"),
        (torch.zeros(4, dtype=torch.float64), "shape"),
        (torch.tensor([[1.0, 2.0], [0.0, 1.0]], dtype=torch.float64), "not symmetric"),
        (torch.tensor([[float("nan"), 0.0], [0.0, 1.0]], dtype=torch.float64), "NaN"),
        (torch.tensor([[float("inf"), 0.0], [0.0, 1.0]]), "NaN or Inf"),
        (torch.eye(3, dtype=torch.int64), "float32/float64"),
    ],
)
def test_bad_input_raises(bad, match):
    with pytest.raises(ValueError, match=match):
        agt.eigh(bad)


def test_not_a_tensor_raises():
    with pytest.raises(ValueError, match="torch.Tensor"):
        agt.eigh(np.eye(3))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    A = spd_spread(32, (2,), seed=15)
    weights = torch.randn(32, 32, dtype=torch.float64)
    Ac = A.cuda().requires_grad_()
    gc, = torch.autograd.grad(gauge_invariant_eigh_loss(*agt.eigh(Ac), weights.cuda()), Ac)
    A.requires_grad_()
    g, = torch.autograd.grad(gauge_invariant_eigh_loss(*agt.eigh(A), weights), A)
    assert rel(gc.cpu(), g) < 1e-9

"""Generalized eigh A V = B V diag(w): the derived rules against a dense autograd reference,
finite differences and the dot-product identity; gradients in A, B and both."""
import numpy as np
import pytest
import torch

import adjointgen.testing as agtest
import adjointgen.torch as agt
from adjointgen.generated.cupy import eigh_generalized as rules_xp
from adjointgen.generated.torch import eigh_generalized as rules
from helpers import reference_generalized_eigh, rel, spd, sym


def problem(n, cond, seed=0, batch=()):
    g = torch.Generator().manual_seed(seed)
    A = sym(torch.randn(*batch, n, n, dtype=torch.float64, generator=g)) * 2
    return A, spd(n, cond, seed=seed + 1, batch=batch)


def loss(w, V, weights):
    k = max(1, V.shape[-1] // 3)
    P = V[..., :, :k] @ V[..., :, :k].mT  # sign-invariant
    return (w.pow(2)).sum() + (P * weights).sum() + (V.pow(2) * weights).sum()


@pytest.mark.parametrize("n, cond", [(5, 10.0), (30, 1e2), (40, 1e4)])
def test_gradients_match_dense_reference(n, cond):
    A, B = problem(n, cond, seed=n)
    weights = torch.randn(n, n, dtype=torch.float64)
    A1, B1 = A.clone().requires_grad_(), B.clone().requires_grad_()
    gA, gB = torch.autograd.grad(loss(*agt.eigh(A1, B1), weights), (A1, B1))
    A2, B2 = A.clone().requires_grad_(), B.clone().requires_grad_()
    rA, rB = torch.autograd.grad(loss(*reference_generalized_eigh(A2, B2), weights), (A2, B2))
    assert rel(gA, sym(rA)) <= 1e-8
    assert rel(gB, sym(rB)) <= 1e-8


def test_gradient_in_B_alone_and_A_alone():
    A, B = problem(8, 50.0, seed=3)
    weights = torch.randn(8, 8, dtype=torch.float64)
    B1 = B.clone().requires_grad_()
    gB, = torch.autograd.grad(loss(*agt.eigh(A, B1), weights), B1)
    B2 = B.clone().requires_grad_()
    rB, = torch.autograd.grad(loss(*reference_generalized_eigh(A, B2), weights), B2)
    assert rel(gB, sym(rB)) <= 1e-9
    A1 = A.clone().requires_grad_()
    gA, = torch.autograd.grad(loss(*agt.eigh(A1, B), weights), A1)
    A2 = A.clone().requires_grad_()
    rA, = torch.autograd.grad(loss(*reference_generalized_eigh(A2, B), weights), A2)
    assert rel(gA, sym(rA)) <= 1e-9


def test_jvp_matches_central_differences():
    A, B = problem(6, 20.0, seed=5)
    dA, dB = sym(torch.randn(6, 6, dtype=torch.float64)), sym(torch.randn(6, 6, dtype=torch.float64))
    w, V = agt.eigh(A, B)
    dw, dV = rules.eigh_generalized_jvp(w, V, dA, dB)

    def eigh_signs_fixed(A, B):
        wAB, VAB = agt.eigh(A, B)
        return wAB, agtest.align_phases(VAB, V)

    fd_w, fd_V = agtest.central_difference(eigh_signs_fixed, (A, B), (dA, dB), eps=1e-5)
    assert rel(dw, fd_w) < 1e-7
    assert rel(dV, fd_V) < 1e-6
    _, (dw2, dV2) = torch.func.jvp(agt.eigh, (A, B), (dA, dB))
    assert rel(dw2, dw) < 1e-13 and rel(dV2, dV) < 1e-13


def test_vjp_is_adjoint_of_jvp():
    A, B = problem(7, 100.0, seed=6)
    w, V = agt.eigh(A, B)
    dA, dB = sym(torch.randn(7, 7, dtype=torch.float64)), sym(torch.randn(7, 7, dtype=torch.float64))
    gw, gV = torch.randn(7, dtype=torch.float64), torch.randn(7, 7, dtype=torch.float64)
    jvp = lambda dA, dB: rules.eigh_generalized_jvp(w, V, dA, dB)
    vjp = lambda gw, gV: rules.eigh_generalized_vjp(w, V, gw, gV)
    assert agtest.adjoint_check(jvp, vjp, (dA, dB), (gw, gV), rtol=1e-12) <= 1e-12


def test_gradcheck_in_A_and_B_along_symmetric_directions():
    """Both inputs symmetric (B also positive definite): agt.eigh rejects the non-symmetric
    perturbations of torch.autograd.gradcheck; adjointgen.testing perturbs A and B symmetrically."""
    A, B = problem(4, 5.0, seed=12)
    A, B = A.requires_grad_(), B.requires_grad_()

    def f(A, B):
        w, V = agt.eigh(A, B)
        return w, V[:, :2] @ V[:, :2].mT

    assert agtest.gradcheck(f, (A, B), symmetric=True, check_forward_ad=True)
    assert agtest.gradgradcheck(f, (A, B), symmetric=True)
    with pytest.raises(ValueError, match="not symmetric"):
        torch.autograd.gradcheck(f, (A.detach().clone().requires_grad_(), B.detach().clone().requires_grad_()))


def test_numpy_backend_equals_torch_backend():
    A, B = problem(6, 10.0, seed=8, batch=(2,))
    w, V = agt.eigh(A, B)
    gw, gV = torch.randn(2, 6, dtype=torch.float64), torch.randn(2, 6, 6, dtype=torch.float64)
    t = rules.eigh_generalized_vjp(w, V, gw, gV)
    x = rules_xp.eigh_generalized_vjp(w.numpy(), V.numpy(), gw.numpy(), gV.numpy())
    for a, b in zip(t, x):
        np.testing.assert_allclose(b, a.numpy(), rtol=1e-12, atol=1e-12)


def test_batched_broadcast_B_and_second_derivatives():
    A, _ = problem(5, 10.0, seed=9, batch=(3,))
    B = spd(5, 10.0, seed=10).requires_grad_()
    A = A.requires_grad_()
    weights = torch.randn(5, 5, dtype=torch.float64)
    gA, gB = torch.autograd.grad(loss(*agt.eigh(A, B), weights), (A, B), create_graph=True)
    rA, rB = torch.autograd.grad(loss(*reference_generalized_eigh(A, B.expand(3, 5, 5)), weights), (A, B), create_graph=True)
    assert rel(gA, sym(rA)) < 1e-9 and rel(gB, sym(rB)) < 1e-9
    h1 = torch.autograd.grad(gB.pow(2).sum(), B)[0]
    h2 = torch.autograd.grad(sym(rB).pow(2).sum(), B)[0]
    assert rel(h1, h2) < 1e-7


def test_float32_runs_and_agrees_roughly():
    A, B = problem(10, 10.0, seed=11)
    A32, B32 = A.float().requires_grad_(), B.float().requires_grad_()
    weights = torch.randn(10, 10)
    gA, gB = torch.autograd.grad(loss(*agt.eigh(A32, B32), weights), (A32, B32))
    A64, B64 = A.clone().requires_grad_(), B.clone().requires_grad_()
    rA, rB = torch.autograd.grad(loss(*agt.eigh(A64, B64), weights.double()), (A64, B64))
    assert gA.dtype == torch.float32 and rel(gA.double(), rA) < 1e-3 and rel(gB.double(), rB) < 1e-3


@pytest.mark.parametrize(
    "make_B, match",
    [
        (lambda n: -torch.eye(n, dtype=torch.float64), "not positive definite"),
        (lambda n: torch.eye(n + 1, dtype=torch.float64), "dimension n must agree"),
        (lambda n: torch.triu(torch.ones(n, n, dtype=torch.float64)), "B is not symmetric"),
        (lambda n: torch.full((n, n), float("nan"), dtype=torch.float64), "NaN"),
        (lambda n: torch.eye(n, dtype=torch.float32), "dtype"),
    ],
)
def test_bad_B_raises(make_B, match):
    A, _ = problem(4, 2.0)
    with pytest.raises(ValueError, match=match):
        agt.eigh(A, make_B(4))


def test_complex_hermitian_definite_problem():
    import scipy.linalg

    import adjointgen.testing as agtest
    import adjointgen.torch as agt

    g = torch.Generator().manual_seed(5)
    A = torch.randn(4, 4, dtype=torch.complex128, generator=g)
    A = (A + A.mH) / 2
    B = torch.randn(4, 4, dtype=torch.complex128, generator=g)
    B = B @ B.mH + torch.eye(4)
    w, V = agt.eigh(A, B)
    torch.testing.assert_close(w, torch.from_numpy(scipy.linalg.eigh(A.numpy(), B.numpy(), eigvals_only=True)))
    torch.testing.assert_close(V.mH @ B @ V, torch.eye(4, dtype=torch.complex128))
    Ar, Br = A.clone().requires_grad_(), B.clone().requires_grad_()
    assert agtest.gradcheck(lambda a, b: agt.eigh(a, b)[0], (Ar, Br), check_forward_ad=True)
    assert agtest.gradcheck(lambda a, b: agt.eigh(a, b)[1].abs(), (Ar, Br), check_forward_ad=True)
    assert agtest.gradgradcheck(lambda a, b: agt.eigh(a, b)[1].abs(), (Ar, Br))
    with pytest.raises(ValueError, match="phase"):
        torch.autograd.grad(agt.eigh(Ar, Br)[1].real.sum(), Ar)

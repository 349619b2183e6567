"""pinv: the gradient derived from the Penrose identities against torch.linalg.pinv's backward and
finite differences at constant rank; the public op's forward equals torch's."""
import numpy as np
import pytest
import torch

import adjointgen.torch as agt
from adjointgen.generated.cupy import pinv as rules_xp
from adjointgen.generated.torch import pinv as rules
from helpers import rel


def low_rank(m, n, r, seed=0, batch=()):
    g = torch.Generator().manual_seed(seed)
    L = torch.randn(*batch, m, r, dtype=torch.float64, generator=g)
    R = torch.randn(*batch, n, r, dtype=torch.float64, generator=g)
    return L, R


@pytest.mark.parametrize("m, n, batch", [(6, 4, ()), (4, 6, ()), (5, 5, ()), (7, 3, (2,)), (1, 4, ())])
def test_gradient_matches_torch_builtin_full_rank(m, n, batch):
    g = torch.Generator().manual_seed(m * 10 + n)
    A = torch.randn(*batch, m, n, dtype=torch.float64, generator=g)
    W = torch.randn(*batch, n, m, dtype=torch.float64, generator=g)
    A1 = A.clone().requires_grad_()
    g1, = torch.autograd.grad((agt.pinv(A1) * W).sum() + agt.pinv(A1).pow(2).sum(), A1)
    A2 = A.clone().requires_grad_()
    g2, = torch.autograd.grad((torch.linalg.pinv(A2) * W).sum() + torch.linalg.pinv(A2).pow(2).sum(), A2)
    assert rel(g1, g2) <= 1e-10


def test_gradient_matches_torch_builtin_rank_deficient():
    L, R = low_rank(8, 6, 3, seed=1)
    A = (L @ R.mT).requires_grad_()
    W = torch.randn(6, 8, dtype=torch.float64)
    g1, = torch.autograd.grad((agt.pinv(A) * W).sum(), A)
    A2 = A.detach().clone().requires_grad_()
    g2, = torch.autograd.grad((torch.linalg.pinv(A2) * W).sum(), A2)
    assert rel(g1, g2) <= 1e-10


@pytest.mark.parametrize("m, n, r", [(6, 4, 4), (4, 6, 2), (5, 5, 3)])
def test_jvp_matches_finite_differences_at_constant_rank(m, n, r):
    L, R = low_rank(m, n, r, seed=2)
    dL, dR = low_rank(m, n, r, seed=3)
    A, dA = L @ R.mT, dL @ R.mT + L @ dR.mT  # dA keeps the rank
    P = torch.linalg.pinv(A)
    dP = rules.pinv_jvp(A, P, dA)
    h = 1e-6
    fd = (torch.linalg.pinv((L + h * dL) @ (R + h * dR).mT) - torch.linalg.pinv((L - h * dL) @ (R - h * dR).mT)) / (2 * h)
    assert rel(dP, fd) < 1e-7
    # and the public op's forward mode
    _, dP2 = torch.func.jvp(agt.pinv, (A,), (dA,))
    assert rel(dP2, dP) < 1e-10


def test_vjp_is_adjoint_of_jvp():
    L, R = low_rank(7, 5, 3, seed=4)
    dL, dR = low_rank(7, 5, 3, seed=5)
    A, dA = L @ R.mT, dL @ R.mT + L @ dR.mT
    P = torch.linalg.pinv(A)
    gP = torch.randn(5, 7, dtype=torch.float64)
    lhs = float((rules.pinv_vjp(A, P, gP) * dA).sum())
    rhs = float((gP * rules.pinv_jvp(A, P, dA)).sum())
    assert abs(lhs - rhs) <= 1e-12 * (abs(lhs) + abs(rhs))


def test_second_derivatives_match_torch():
    A = torch.randn(5, 3, dtype=torch.float64).requires_grad_()
    g1, = torch.autograd.grad(agt.pinv(A).pow(3).sum(), A, create_graph=True)
    g2, = torch.autograd.grad(torch.linalg.pinv(A).pow(3).sum(), A, create_graph=True)
    h1, = torch.autograd.grad(g1.pow(2).sum(), A)
    h2, = torch.autograd.grad(g2.pow(2).sum(), A)
    assert rel(h1, h2) < 1e-9


def test_numpy_backend_equals_torch_backend():
    A = torch.randn(2, 6, 4, dtype=torch.float64)
    P = torch.linalg.pinv(A)
    gP = torch.randn(2, 4, 6, dtype=torch.float64)
    np.testing.assert_allclose(rules_xp.pinv_vjp(A.numpy(), P.numpy(), gP.numpy()),
                               rules.pinv_vjp(A, P, gP).numpy(), rtol=1e-12, atol=1e-12)


def test_forward_equals_torch_on_well_conditioned_and_hard_inputs():
    A = torch.randn(40, 30, dtype=torch.float64)
    assert rel(agt.pinv(A), torch.linalg.pinv(A)) < 1e-12
    L, R = low_rank(40, 30, 10, seed=6)
    B = L @ R.mT
    assert rel(agt.pinv(B), torch.linalg.pinv(B)) < 1e-10


def test_hermitian_gives_symmetric_gradient_as_torch():
    X = torch.randn(5, 5, dtype=torch.float64)
    S = X @ X.mT + 5 * torch.eye(5, dtype=torch.float64)
    A = S.clone().requires_grad_()
    g1, = torch.autograd.grad(agt.pinv(A, hermitian=True).sum(), A)
    A2 = S.clone().requires_grad_()
    g2, = torch.autograd.grad(torch.linalg.pinv(A2, hermitian=True).sum(), A2)
    assert rel(agt.pinv(A, hermitian=True), torch.linalg.pinv(S)) < 1e-12
    assert rel(g1, g2) < 1e-10


@pytest.mark.parametrize(
    "A, kwargs, match",
    [
        (torch.tensor([[float("nan"), 1.0], [0.0, 1.0]], dtype=torch.float64), {}, "NaN|finite"),
        (torch.eye(3, dtype=torch.float64), {"rtol": -1.0}, "negative|non-negative"),
        (torch.ones(3, dtype=torch.float64), {}, "shape|dimensions"),
        (torch.eye(3, dtype=torch.int64), {}, "float"),
        (torch.ones(3, 4, dtype=torch.float64), {"hermitian": True}, "square"),
    ],
)
def test_bad_input_raises(A, kwargs, match):
    with pytest.raises(ValueError, match=match):
        agt.pinv(A, **kwargs)

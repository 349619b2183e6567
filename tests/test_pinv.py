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


# --------------------------------------------------------------------------------------------------
# torch.func transforms (no randomness= argument needed) and empty inputs
# --------------------------------------------------------------------------------------------------


def _loss(pinv):
    return lambda M: pinv(M).pow(2).sum()


@pytest.mark.parametrize("shape", [(5, 5), (6, 4), (4, 6)])
def test_every_torch_func_transform_matches_torch(shape, caplog):
    import logging

    g = torch.Generator().manual_seed(sum(shape))
    A = torch.randn(*shape, dtype=torch.float64, generator=g)
    As = torch.randn(3, *shape, dtype=torch.float64, generator=g)
    Ts = torch.randn(3, *shape, dtype=torch.float64, generator=g)
    ours, theirs = agt.pinv, torch.linalg.pinv
    transforms = {
        "grad": lambda p: torch.func.grad(_loss(p))(A),
        "jvp": lambda p: torch.func.jvp(p, (A,), (Ts[0],))[1],
        "vmap": lambda p: torch.func.vmap(p)(As),
        "jacrev": lambda p: torch.func.jacrev(p)(A),
        "jacfwd": lambda p: torch.func.jacfwd(p)(A),
        "hessian": lambda p: torch.func.hessian(_loss(p))(A),
        "vmap(jvp)": lambda p: torch.func.vmap(lambda M, T: torch.func.jvp(p, (M,), (T,))[1])(As, Ts),
        "vmap(jacfwd)": lambda p: torch.func.vmap(torch.func.jacfwd(p))(As),
        "vmap(grad)": lambda p: torch.func.vmap(torch.func.grad(_loss(p)))(As),
        "vmap(vmap)": lambda p: torch.func.vmap(torch.func.vmap(p))(torch.stack([As, 2 * As])),
    }
    for name, transform in transforms.items():
        with caplog.at_level(logging.DEBUG, logger="adjointgen.pinv"):
            caplog.clear()
            value = transform(ours)
        assert rel(value, transform(theirs)) < 1e-10, name
        # the fast path is still taken inside the transform (the matrices are well conditioned)
        methods = {r.getMessage().split(": ")[1] for r in caplog.records if r.name == "adjointgen.pinv"}
        assert methods == {"lu" if shape[0] == shape[1] else "cholesky"}, (name, methods)


def test_hermitian_under_transforms():
    g = torch.Generator().manual_seed(7)
    B = torch.randn(3, 5, 5, dtype=torch.float64, generator=g)
    S = B @ B.mT + 5 * torch.eye(5, dtype=torch.float64)
    ours = lambda M: agt.pinv(M, hermitian=True)  # noqa: E731
    theirs = lambda M: torch.linalg.pinv(0.5 * (M + M.mT), hermitian=True)  # noqa: E731
    assert rel(torch.func.vmap(ours)(S), theirs(S)) < 1e-12
    assert rel(torch.func.jacfwd(ours)(S[0]), torch.func.jacfwd(theirs)(S[0])) < 1e-10
    assert rel(torch.func.hessian(_loss(ours))(S[0]), torch.func.hessian(_loss(theirs))(S[0])) < 1e-10


@pytest.mark.parametrize("shape", [(0, 3, 3), (0, 3, 4), (3, 0), (0, 3), (0, 0), (2, 0, 3), (2, 3, 0)])
def test_empty_inputs_forward_and_backward_as_torch(shape):
    A = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    B = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    P, Q = agt.pinv(A), torch.linalg.pinv(B)
    assert P.shape == Q.shape
    P.sum().backward()
    Q.sum().backward()
    assert A.grad.shape == B.grad.shape == shape
    _, tangent = torch.func.jvp(agt.pinv, (A.detach(),), (torch.ones(shape, dtype=torch.float64),))
    assert tangent.shape == Q.shape


@pytest.mark.parametrize("shape", [(0, 3, 3), (0, 0), (2, 0, 0)])
def test_empty_hermitian_forward_and_backward(shape):
    # through the generated autograd function, which the public wrapper calls after its checks
    A = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    P = rules.PinvFunction.apply(A, (None, None, True))
    assert P.shape == torch.linalg.pinv(A.detach(), hermitian=True).shape
    P.sum().backward()
    assert A.grad.shape == shape
    assert agt.pinv(A.detach(), hermitian=True).shape == P.shape


def test_jvp_of_vmap_and_hessian_see_the_options_as_one_argument():
    A = torch.randn(3, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(11))
    t = torch.randn_like(A)
    _, got = torch.func.jvp(torch.vmap(agt.pinv), (A,), (t,))
    _, want = torch.func.jvp(torch.linalg.pinv, (A,), (t,))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    H = torch.func.hessian(lambda a: agt.pinv(a).square().sum())(A[0])
    H2 = torch.func.hessian(lambda a: torch.linalg.pinv(a).square().sum())(A[0])
    torch.testing.assert_close(H, H2, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("shape", [(6, 4), (4, 6), (2, 5, 5)])
def test_complex_pinv_matches_torch(shape):
    """The derivation runs over the complex field; every forward path (LU, Cholesky of the Gram
    matrix, QR, SVD) takes complex input."""
    g = torch.Generator().manual_seed(3)
    A = torch.randn(*shape, dtype=torch.complex128, generator=g)
    assert rel(agt.pinv(A), torch.linalg.pinv(A)) < 1e-13
    C = torch.randn(torch.linalg.pinv(A).shape, dtype=A.dtype, generator=g)
    g1 = torch.func.grad(lambda a: (agt.pinv(a) * C).real.sum())(A)
    g2 = torch.func.grad(lambda a: (torch.linalg.pinv(a) * C).real.sum())(A)
    assert rel(g1, g2) < 1e-12
    dA = torch.randn(A.shape, dtype=A.dtype, generator=g)
    assert rel(torch.func.jvp(agt.pinv, (A,), (dA,))[1], torch.func.jvp(torch.linalg.pinv, (A,), (dA,))[1]) < 1e-12
    # rank-deficient (the SVD path) and Hermitian input
    L, R = torch.randn(6, 2, dtype=A.dtype, generator=g), torch.randn(4, 2, dtype=A.dtype, generator=g)
    assert rel(agt.pinv(L @ R.mH), torch.linalg.pinv(L @ R.mH)) < 1e-12
    H = torch.randn(5, 5, dtype=A.dtype, generator=g)
    herm = lambda a: 0.5 * (a + a.mH)
    H = herm(H)
    assert rel(agt.pinv(H, hermitian=True), torch.linalg.pinv(H, hermitian=True)) < 1e-13
    C5 = torch.randn(5, 5, dtype=A.dtype, generator=g)
    g1 = torch.func.grad(lambda a: (agt.pinv(herm(a), hermitian=True) * C5).real.sum())(H)
    g2 = torch.func.grad(lambda a: (torch.linalg.pinv(herm(a), hermitian=True) * C5).real.sum())(H)
    assert rel(g1, g2) < 1e-12
    Ar = A.reshape(-1, *shape[-2:])[0].clone().requires_grad_()
    assert torch.autograd.gradcheck(agt.pinv, (Ar,)) and torch.autograd.gradgradcheck(agt.pinv, (Ar,))
    with pytest.raises(ValueError, match="not Hermitian"):
        agt.pinv(torch.tensor([[1, 1j], [1j, 1]], dtype=torch.complex128), hermitian=True)

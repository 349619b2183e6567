"""Thin SVD: the derived rule against torch.linalg.svd's built-in backward, finite differences and
the dot-product identity, for tall, wide, square, vector-like and batched shapes."""
import numpy as np
import pytest
import torch

import adjointgen.testing as agtest
import adjointgen.torch as agt
from adjointgen.generated.cupy import svd as rules_xp
from adjointgen.generated.torch import svd as rules
from helpers import rel


def matrix(m, n, batch=(), seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*batch, m, n, dtype=torch.float64, generator=g)


def loss(U, S, Vh, W1, W2):
    """Gauge-invariant: U and Vh enter through U diag(S) Vh pieces and projectors."""
    k = S.shape[-1]
    Pu = U @ U.mT
    Pv = Vh.mT @ Vh
    part = (U[..., :, :1] @ Vh[..., :1, :])  # sign of pair 0 cancels
    return S.pow(3).sum() + (Pu * W1).sum() + (Pv * W2).sum() + part.pow(2).sum() * 0.3 + (part * (W1[..., :, :1] @ W2[..., :1, :])).sum()


@pytest.mark.parametrize("m, n, batch", [(7, 3, ()), (3, 7, ()), (5, 5, ()), (1, 4, ()), (4, 1, ()), (6, 4, (2,)), (3, 5, (2, 2))])
def test_gradient_matches_torch_builtin(m, n, batch):
    A = matrix(m, n, batch, seed=m * 7 + n)
    W1, W2 = matrix(m, m, seed=1), matrix(n, n, seed=2)
    A1 = A.clone().requires_grad_()
    g1, = torch.autograd.grad(loss(*agt.svd(A1, full_matrices=False), W1, W2), A1)
    A2 = A.clone().requires_grad_()
    g2, = torch.autograd.grad(loss(*torch.linalg.svd(A2, full_matrices=False), W1, W2), A2)
    assert rel(g1, g2) <= 1e-10


@pytest.mark.parametrize("m, n", [(6, 4), (4, 6), (5, 5)])
def test_jvp_matches_finite_differences(m, n):
    A, dA = matrix(m, n, seed=10), matrix(m, n, seed=11)
    U, S, V = rules_forward(A)
    dU, dS, dV = rules.svd_jvp(U, S, V, dA)

    def svd_signs_fixed(B):  # one sign per singular pair, shared by U and V
        UB, SB, VB = rules_forward(B)
        UB, VB = agtest.align_phases((UB, VB), (U, V))
        return UB, SB, VB

    fd_U, fd_S, fd_V = agtest.central_difference(svd_signs_fixed, (A,), (dA,), eps=1e-6)
    assert rel(dS, fd_S) < 1e-7
    assert rel(dU, fd_U) < 1e-6
    assert rel(dV, fd_V) < 1e-6


def rules_forward(A):
    U, S, Vh = torch.linalg.svd(A, full_matrices=False)
    return U, S, Vh.mT


def test_vjp_is_adjoint_of_jvp():
    A, dA = matrix(6, 4, seed=20), matrix(6, 4, seed=21)
    U, S, V = rules_forward(A)
    gU, gS, gV = matrix(6, 4, seed=22), torch.randn(4, dtype=torch.float64), matrix(4, 4, seed=23)
    jvp = lambda dA: rules.svd_jvp(U, S, V, dA)
    vjp = lambda gU, gS, gV: rules.svd_vjp(U, S, V, gU, gS, gV)
    assert agtest.adjoint_check(jvp, vjp, (dA,), (gU, gS, gV), rtol=1e-12) <= 1e-12


def test_only_singular_values_cotangent_and_second_derivatives():
    A = matrix(5, 3, seed=30).requires_grad_()
    g1, = torch.autograd.grad(agt.svd(A, full_matrices=False)[1].pow(2).sum(), A, create_graph=True)
    g2, = torch.autograd.grad(torch.linalg.svdvals(A).pow(2).sum(), A, create_graph=True)
    assert rel(g1, g2) < 1e-12
    h1, = torch.autograd.grad(g1.pow(2).sum(), A)
    h2, = torch.autograd.grad(g2.pow(2).sum(), A)
    assert rel(h1, h2) < 1e-9


def test_forward_mode_and_vmap():
    A, dA = matrix(5, 3, seed=40), matrix(5, 3, seed=41)
    _, (dU, dS, dVh) = torch.func.jvp(agt.svd, (A,), (dA,))
    _, (rU, rS, rVh) = torch.func.jvp(lambda a: torch.linalg.svd(a, full_matrices=False), (A,), (dA,))
    assert rel(dS, rS) < 1e-12
    B = matrix(5, 3, (4,), seed=42)
    S_v = torch.func.vmap(lambda a: agt.svd(a, full_matrices=False)[1])(B)
    assert rel(S_v, torch.linalg.svdvals(B)) < 1e-13


def test_numpy_backend_equals_torch_backend():
    A = matrix(6, 4, (2,), seed=50)
    U, S, V = rules_forward(A)
    gU, gS, gV = matrix(6, 4, (2,), seed=51), torch.randn(2, 4, dtype=torch.float64), matrix(4, 4, (2,), seed=52)
    np.testing.assert_allclose(rules_xp.svd_vjp(U.numpy(), S.numpy(), V.numpy(), gU.numpy(), gS.numpy(), gV.numpy()),
                               rules.svd_vjp(U, S, V, gU, gS, gV).numpy(), rtol=1e-11, atol=1e-11)


def test_float32():
    A = matrix(8, 5, seed=60).float().requires_grad_()
    W1, W2 = matrix(8, 8, seed=1).float(), matrix(5, 5, seed=2).float()
    g1, = torch.autograd.grad(loss(*agt.svd(A, full_matrices=False), W1, W2), A)
    A2 = A.detach().clone().requires_grad_()
    g2, = torch.autograd.grad(loss(*torch.linalg.svd(A2, full_matrices=False), W1, W2), A2)
    assert g1.dtype == torch.float32 and rel(g1, g2) < 1e-4


def test_repeated_singular_values_and_a_basis_dependent_loss_raise():
    """(The degenerate cases in full: tests/test_degeneracy.py.)"""
    from adjointgen import DegenerateSubspaceError

    Q1, Q2 = (torch.linalg.qr(matrix(3, 3, seed=seed))[0] for seed in (3, 4))
    A = (Q1 * torch.tensor([2.0, 2.0, 1.0], dtype=torch.float64)) @ Q2.mT
    A.requires_grad_()
    U, S, Vh = agt.svd(A, full_matrices=False)
    with pytest.raises(DegenerateSubspaceError, match=r"singular values 2, 2 \(indices 0, 1\)"):
        (U ** 4).sum().backward()


@pytest.mark.parametrize("A, match", [
    (torch.full((3, 2), float("nan"), dtype=torch.float64), "NaN"),
    (torch.zeros(3, dtype=torch.float64), "shape"),
    (torch.zeros(3, 3, dtype=torch.int32), "float"),
])
def test_bad_input_raises(A, match):
    with pytest.raises(ValueError, match=match):
        agt.svd(A, full_matrices=False)


@pytest.mark.parametrize("m, n", [(7, 3), (3, 7), (5, 4)])
def test_full_matrices_complement_projector_loss_matches_finite_differences(m, n):
    """A loss through U2 U2^T (or V2 V2^T): PyTorch drops that cotangent, the derived rule keeps it."""
    A = matrix(m, n, seed=70 + m)
    Wm, Wn = matrix(m, m, seed=71), matrix(n, n, seed=72)
    k = min(m, n)

    def f(A):
        U, S, Vh = agt.svd(A, full_matrices=True)
        U2, V2 = U[..., :, k:], Vh[..., k:, :].mT
        return ((U2 @ U2.mT) * Wm).sum() + ((V2 @ V2.mT) * Wn).sum() + S.pow(2).sum() + ((U[:, :k] @ U[:, :k].mT) * Wm).sum()

    A1 = A.clone().requires_grad_()
    g, = torch.autograd.grad(f(A1), A1)
    dA = matrix(m, n, seed=73)
    fd = agtest.central_difference(f, (A,), (dA,), eps=1e-6)
    assert abs(float(agtest.inner(g, dA)) - float(fd)) <= 1e-7 * max(1.0, abs(float(fd)))
    # forward mode agrees with reverse mode
    _, df = torch.func.jvp(f, (A,), (dA,))
    assert abs(float(df) - float(agtest.inner(g, dA))) <= 1e-10 * max(1.0, abs(float(df)))


def decaying(m, n, seed=80):
    g = torch.Generator().manual_seed(seed)
    Q1, _ = torch.linalg.qr(torch.randn(m, n, dtype=torch.float64, generator=g))
    Q2, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64, generator=g))
    return (Q1 * torch.arange(1, n + 1, dtype=torch.float64).rsqrt()) @ Q2.mT  # slowly decaying spectrum


@pytest.mark.parametrize("k", [1, 5, 10])
@pytest.mark.parametrize("wide", [False, True])
def test_svds_gradient_matches_dense_reference(k, wide):
    A = decaying(200, 120)
    A = A.mT.contiguous() if wide else A
    m, n = A.shape
    W1, W2 = matrix(m, m, seed=81), matrix(n, n, seed=82)

    def loss(U, S, Vh):
        return S.pow(3).sum() + ((U @ U.mT) * W1).sum() + ((Vh.mT @ Vh) * W2).sum()

    A1 = A.clone().requires_grad_()
    U, S, Vh = agt.svds(A1, k)
    g, = torch.autograd.grad(loss(U, S, Vh), A1)
    A2 = A.clone().requires_grad_()
    U2, S2, Vh2 = torch.linalg.svd(A2, full_matrices=False)
    r, = torch.autograd.grad(loss(U2[:, :k], S2[:k], Vh2[:k]), A2)
    assert rel(S, S2[:k]) < 1e-12
    assert rel(g, r) <= 1e-8


def test_svds_bad_k():
    with pytest.raises(ValueError, match="k must be"):
        agt.svds(matrix(5, 3), 4)


@pytest.mark.parametrize("m, n, k", [(200, 120, 5), (120, 200, 4), (700, 450, 3)])
def test_svds_forward_mode_matches_dense_reference(m, n, k):
    """Forward mode of the derived truncated rule; n = 450 runs the matrix-free Gram solves."""
    A = decaying(max(m, n), min(m, n), seed=83)
    A = A if m >= n else A.mT.contiguous()
    dA = matrix(m, n, seed=84)
    W1, W2 = matrix(m, m, seed=85), matrix(n, n, seed=86)

    def loss(U, S, Vh):
        return S.pow(3).sum() + ((U @ U.mT) * W1).sum() + ((Vh.mT @ Vh) * W2).sum()

    _, df = torch.func.jvp(lambda a: loss(*agt.svds(a, k)), (A,), (dA,))
    A2 = A.clone().requires_grad_()
    U2, S2, Vh2 = torch.linalg.svd(A2, full_matrices=False)
    r, = torch.autograd.grad(loss(U2[:, :k], S2[:k], Vh2[:k]), A2)
    expected = float((r * dA).sum())
    assert abs(float(df) - expected) <= 1e-8 * abs(expected)
    if n > 400:  # the same matrix-free solves in reverse mode
        A1 = A.clone().requires_grad_()
        g, = torch.autograd.grad(loss(*agt.svds(A1, k)), A1)
        assert rel(g, r) <= 1e-8


def test_svds_second_derivatives_small():
    A = decaying(12, 8, seed=87).requires_grad_()
    f = lambda a: agt.svds(a, 3)[1].pow(3).sum() + agt.svds(a, 3)[0][:, 0].abs().sum()
    assert torch.autograd.gradcheck(f, (A,), atol=1e-6)
    assert torch.autograd.gradgradcheck(f, (A,), atol=1e-5, rtol=1e-4)


def test_svds_numpy_backend_equals_torch_backend():
    from adjointgen.generated.cupy import svds as svds_xp
    from adjointgen.generated.torch import svds as svds_torch

    A = decaying(30, 20, seed=88)
    U, S, Vh = torch.linalg.svd(A, full_matrices=False)
    U, S, V = U[:, :4], S[:4], Vh[:4].mT
    gU, gV, dA = matrix(30, 4, seed=89), matrix(20, 4, seed=90), matrix(30, 20, seed=91)
    gS = torch.randn(4, dtype=torch.float64)
    np.testing.assert_allclose(svds_xp.svds_vjp(A.numpy(), U.numpy(), S.numpy(), V.numpy(), gU.numpy(), gS.numpy(), gV.numpy()),
                               svds_torch.svds_vjp(A, U, S, V, gU, gS, gV).numpy(), rtol=1e-10, atol=1e-10)
    for a, b in zip(svds_xp.svds_jvp(A.numpy(), U.numpy(), S.numpy(), V.numpy(), dA.numpy()),
                    svds_torch.svds_jvp(A, U, S, V, dA)):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("m, n", [(6, 3), (3, 6)])
def test_full_matrices_basis_dependent_loss_raises(dtype, m, n):
    """The extra columns are any orthonormal basis of the complement: a loss through one of them
    (not through their span) has no gradient, and the derived residual skew(U2^H gU2) says so."""
    from adjointgen.runtime import gauge

    A = torch.randn(m, n, dtype=dtype, generator=torch.Generator().manual_seed(92)).requires_grad_()
    U, S, Vh = agt.svd(A, full_matrices=True)
    k = min(m, n)
    extra = U[:, k] if m > n else Vh[k]
    with pytest.raises(gauge.ComplementBasisError, match="extra columns"):
        torch.autograd.grad((extra * torch.arange(1, extra.shape[0] + 1)).abs().sum(), A)
    U, S, Vh = agt.svd(A, full_matrices=True)  # through the span: fine
    P = U[:, k:] @ U[:, k:].mH if m > n else Vh[k:].mH @ Vh[k:]
    g, = torch.autograd.grad(P.diagonal().real.sum() + (P.abs() ** 2 * torch.arange(P.shape[0])).sum(), A)
    assert torch.isfinite(g).all()


@pytest.mark.parametrize("full_matrices", [True, False])
@pytest.mark.parametrize("wide", [False, True])
def test_a_basis_dependent_loss_at_a_cluster_raises_for_every_orientation(full_matrices, wide):
    # singular values (3, 2, 2, 1): Vh[1, 0] depends on the basis of the pair; with the default
    # full_matrices=True it returned a gradient for 7 of 12 orientations (LAPACK's exact zeros)
    import adjointgen

    for seed in range(12):
        g = torch.Generator().manual_seed(seed)
        U, _ = torch.linalg.qr(torch.randn(6, 4, dtype=torch.float64, generator=g))
        V, _ = torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64, generator=g))
        A = (U * torch.tensor([3.0, 2.0, 2.0, 1.0], dtype=torch.float64)) @ V.mT
        A = (A.mT if wide else A).requires_grad_()
        _, _, Vh = agt.svd(A, full_matrices=full_matrices)
        with pytest.raises(adjointgen.GaugeDependentLossError):
            torch.autograd.grad(Vh[1, 0], A)


@pytest.mark.parametrize("wide", [False, True])
def test_full_matrices_at_a_rank_deficient_matrix_refuses_the_split_of_the_complement(wide):
    # the vectors of zero singular values and the extra columns span the complement together: the
    # projector onto the extra columns alone is not a function of A there (a gradient came back)
    import adjointgen

    g = torch.Generator().manual_seed(13)
    A = torch.randn(5, 1, dtype=torch.float64, generator=g) @ torch.randn(1, 3, dtype=torch.float64, generator=g)
    A = (A.mT if wide else A).requires_grad_()
    U, S, Vh = agt.svd(A)
    X = Vh.mH if wide else U
    with pytest.raises(adjointgen.ComplementBasisError, match="rank deficient"):
        torch.autograd.grad((X[:, 3:] @ X[:, 3:].mT)[0, 1], A)
    # the projector onto the complement of the leading singular vector (the zero values' vectors and
    # the extra columns together) is smooth, the gap to the zero values being 3: exact
    U, S, Vh = agt.svd(A)
    X = Vh.mH if wide else U
    g1, = torch.autograd.grad((X[:, 1:] @ X[:, 1:].mT)[0, 1], A)

    def complement(B):  # I - u u^T of the leading vector, by torch's SVD (no derivative taken)
        u = torch.linalg.svd(B.mT if wide else B)[0][:, :1]
        return (torch.eye(5, dtype=torch.float64) - u @ u.mT)[0, 1]

    g2 = torch.zeros_like(g1)
    h = 1e-5
    for index in torch.cartesian_prod(torch.arange(A.shape[0]), torch.arange(A.shape[1])):
        E = torch.zeros_like(g1)
        E[tuple(index)] = h
        g2[tuple(index)] = (complement(A.detach() + E) - complement(A.detach() - E)) / (2 * h)
    torch.testing.assert_close(g1, g2, rtol=1e-7, atol=1e-9)

"""Degenerate spectra: exact gradients where the cotangents determine them, a clear error where not.

Inside a cluster of equal eigenvalues (singular values) the vectors are free up to a rotation, a
gauge the derivations declare; the engine derives the loss's derivative along it (the cluster blocks
of skew(U^T gU), skew(U^T gU + V^T gV) for the SVD).  The backward takes the reciprocal gaps as zero
inside a cluster and raises DegenerateSubspaceError when the residual is not zero, or when the loss
depends on the individual eigenvalues of a cluster.
"""
import numpy as np
import pytest
import torch

import adjointgen.torch as agt
from adjointgen import DegenerateSubspaceError, GaugeDependentLossError, PhaseDependentLossError
from adjointgen.runtime import degeneracy, gauge
from adjointgen.testing import gradcheck, gradgradcheck

D = torch.float64


def rotation(n, seed, dtype=D):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, n, dtype=torch.float64, generator=g)
    if dtype.is_complex:
        X = X + 1j * torch.randn(n, n, dtype=torch.float64, generator=g)
    return torch.linalg.qr(X.to(dtype))[0]


def with_spectrum(values, seed=0, dtype=D):
    Q = rotation(len(values), seed, dtype)
    A = (Q * torch.tensor(values, dtype=torch.float64).to(dtype)) @ Q.mH
    return 0.5 * (A + A.mH)


def laplacian_with_symmetric_pair():
    """A block-diagonal graph Laplacian: two identical paths of 3 nodes (an automorphism swaps them:
    every eigenvalue of a path appears twice) and a triangle."""
    path = torch.tensor([[1, -1, 0], [-1, 2, -1], [0, -1, 1]], dtype=D)
    tri = torch.tensor([[2, -1, -1], [-1, 2, -1], [-1, -1, 2]], dtype=D)
    return torch.block_diag(path, path, tri + 0.37 * torch.eye(3, dtype=D))


# ------------------------------------------------------------------- a missing cotangent is nothing
@pytest.mark.parametrize("make", [
    lambda: torch.eye(3, dtype=D), lambda: torch.zeros(3, 3, dtype=D),
    lambda: torch.diag(torch.tensor([1.0, 1.0, 2.0, 3.0], dtype=D)), laplacian_with_symmetric_pair,
    lambda: torch.eye(4, dtype=torch.float32), lambda: torch.eye(3, dtype=torch.complex128),
])
def test_eigenvalue_losses_at_exact_degeneracy_are_finite_and_exact(make):
    A = make().requires_grad_()
    w, V = agt.eigh(A)
    (w * torch.linspace(1, 1, w.shape[-1], dtype=w.dtype)).sum().backward()  # the sum: gradient I
    assert torch.isfinite(A.grad).all()
    assert torch.allclose(A.grad, torch.eye(A.shape[-1], dtype=A.dtype), atol=1e-5)


def test_other_operations_at_exact_degeneracy_are_finite():
    I = torch.eye(4, dtype=D)
    A, B = I.clone().requires_grad_(), (2 * I).requires_grad_()
    agt.eigh(A, B)[0].sum().backward()
    assert torch.isfinite(A.grad).all() and torch.isfinite(B.grad).all()
    A = torch.diag(torch.tensor([2.0, 2.0, 1.0], dtype=D)).requires_grad_()
    agt.svd(A, full_matrices=False)[1].sum().backward()
    assert torch.allclose(A.grad, torch.eye(3, dtype=D))
    W = torch.tensor([[2.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0]], dtype=D, requires_grad=True)
    U, S, Vh = agt.svd(W, full_matrices=True)
    S.sum().backward()
    assert torch.isfinite(W.grad).all()


def test_numpy_rule_at_exact_degeneracy_is_finite():
    import adjointgen.cupy as agc

    w, V = np.ones(3), np.eye(3)
    gA = agc.eigh_vjp(w, V, np.ones(3), np.zeros((3, 3)))
    assert np.all(np.isfinite(gA)) and np.allclose(gA, np.eye(3))


# ------------------------------------------------------------------- invariant losses: exact
A_DEG = with_spectrum([1.0, 1.0, 2.0, 3.0], seed=1)
G = torch.randn(4, 4, dtype=D, generator=torch.Generator().manual_seed(2))
G = G + G.mT


def projector_loss(a):
    V = agt.eigh(a)[1][:, :2]  # the eigenspace of the repeated eigenvalue
    return (V @ V.mT * G).sum()


@pytest.mark.parametrize("name, f", [
    ("eigenvalue sum", lambda a: agt.eigh(a)[0].sum()),
    ("sum of squares", lambda a: agt.eigh(a)[0].square().sum()),
    ("cluster projector", projector_loss),
    ("projector of the rest", lambda a: (agt.eigh(a)[1][:, 2:] @ agt.eigh(a)[1][:, 2:].mT * G).sum()),
    ("generalized eigenvalue sum", lambda a: agt.eigh(a, torch.eye(4, dtype=D) * 2)[0].sum()),
])
def test_invariant_losses_match_finite_differences(name, f):
    assert gradcheck(f, (A_DEG.clone().requires_grad_(),), symmetric=True)


def test_laplacian_with_an_automorphism():
    L = laplacian_with_symmetric_pair()
    w = torch.linalg.eigvalsh(L)
    assert (w[1:] - w[:-1]).abs().min() < 1e-12  # really degenerate

    # eigenvalues 0, 0, 0.37, 1, 1, 3, 3, 3.37, 3.37: the five smallest are whole clusters
    assert gradcheck(lambda a: agt.eigh(a)[0][:5].sum(), (L.clone().requires_grad_(),), symmetric=True)
    Lr = L.clone().requires_grad_()
    with pytest.raises(DegenerateSubspaceError, match=r"\(indices 3, 4\)"):  # the four smallest cut a pair
        agt.eigh(Lr)[0][:4].sum().backward()


def test_generalized_projector_with_B_dependence():
    B0 = with_spectrum([1.0, 2.0, 3.0, 4.0], seed=3)

    def f(a, b):
        V = agt.eigh(a, b)[1][:, :2]
        return (V @ V.mT @ b * G).sum()  # the B-orthogonal projector onto the cluster

    assert gradcheck(f, (A_DEG.clone().requires_grad_(), B0.clone().requires_grad_()), symmetric=True)


def test_complex_hermitian_cluster_projector():
    A = with_spectrum([1.0, 1.0, 2.0, 3.0], seed=4, dtype=torch.complex128)
    H = with_spectrum([0.5, -1.0, 2.0, 0.1], seed=5, dtype=torch.complex128)

    def f(a):
        V = agt.eigh(a)[1][:, :2]
        return (V @ V.mH @ H).diagonal().sum().real

    assert gradcheck(f, (A.clone().requires_grad_(),), symmetric=True)


def test_svd_invariant_losses():
    Q1, Q2 = rotation(5, 6)[:, :4], rotation(4, 7)
    A = (Q1 * torch.tensor([3.0, 2.0, 2.0, 1.0], dtype=D)) @ Q2.mT
    M = torch.randn(5, 5, dtype=D, generator=torch.Generator().manual_seed(8))

    def cluster_projector(a):
        U = agt.svd(a, full_matrices=False)[0][:, 1:3]
        return (U @ U.mT * M).sum()

    for f in (lambda a: agt.svd(a, full_matrices=False)[1].sum(), cluster_projector):
        assert torch.autograd.gradcheck(f, (A.clone().requires_grad_(),))


@pytest.mark.parametrize("f", [
    lambda a: agt.eigh(0.5 * (a + a.mT))[0].sum(),
    lambda a: agt.svd(a, full_matrices=False)[1].sum(),
])
def test_second_derivatives_at_exact_degeneracy(f):
    assert gradgradcheck(f, (A_DEG.clone().requires_grad_(),), symmetric=False)


# ------------------------------------------------------------------- ill-defined losses: an error
def test_a_basis_dependent_loss_raises_naming_the_cluster():
    A = A_DEG.clone().requires_grad_()
    with pytest.raises(DegenerateSubspaceError, match=r"eigh: .*basis.*eigenvalues -?[\d.e-]+, -?[\d.e-]+ \(indices 0, 1\)"):
        (agt.eigh(A)[1] ** 4).sum().backward()
    A = A_DEG.clone().requires_grad_()
    with pytest.raises(DegenerateSubspaceError, match="eigh"):
        (agt.eigh(A, torch.eye(4, dtype=D))[1] ** 4).sum().backward()
    Q1, Q2 = rotation(4, 9), rotation(4, 10)
    S = (Q1 * torch.tensor([2.0, 2.0, 1.0, 0.5], dtype=D)) @ Q2.mT
    S.requires_grad_()
    with pytest.raises(DegenerateSubspaceError, match="singular values"):
        (agt.svd(S, full_matrices=False)[0] ** 4).sum().backward()
    assert issubclass(DegenerateSubspaceError, GaugeDependentLossError)
    assert issubclass(PhaseDependentLossError, GaugeDependentLossError)


@pytest.mark.parametrize("loss", [
    lambda w, V: w[0],  # one eigenvalue of a degenerate pair: not differentiable
    lambda w, V: w[0] + (V @ torch.diag(w.square()) @ V.mT * G).sum(),  # a sum of terms of different forms
])
def test_a_loss_on_individual_eigenvalues_of_a_cluster_raises(loss):
    A = A_DEG.clone().requires_grad_()
    with pytest.raises(DegenerateSubspaceError, match="individual eigenvalues"):
        loss(*agt.eigh(A)).backward()


def test_the_check_can_be_turned_off_and_the_tolerance_set():
    A = A_DEG.clone().requires_grad_()
    with gauge.disabled():
        (agt.eigh(A)[1] ** 4).sum().backward()
    assert torch.isfinite(A.grad).all()
    # a gap of 1e-6: a cluster with cluster_rtol=1e-4, not with the default
    near = with_spectrum([1.0, 1.0 + 1e-6, 2.0, 3.0], seed=1).requires_grad_()
    (agt.eigh(near)[1] ** 4).sum().backward()  # distinct: an (ill-conditioned) gradient
    with pytest.raises(DegenerateSubspaceError):
        (agt.eigh(near, cluster_rtol=1e-4)[1] ** 4).sum().backward()
    with degeneracy.tolerance(1e-4), pytest.raises(DegenerateSubspaceError):
        (agt.eigh(near)[1] ** 4).sum().backward()
    with pytest.raises(ValueError, match="broadening"):
        agt.eigh(A_DEG, broadening=-1.0)


# ------------------------------------------------------------------- near degeneracy
@pytest.mark.parametrize("gap", [1e-6, 1e-9, 1e-12])
def test_near_degeneracy_error_stays_bounded(gap):
    """The projector onto a near-degenerate pair: the exact gradient is smooth in the gap; the
    error against central differences stays small here, where the rule's 1/gap would amplify
    rounding errors (benchmarks/bench_degeneracy.py reports the curve against torch's)."""
    A = with_spectrum([1.0, 1.0 + gap, 2.0, 3.0], seed=1)
    Ar = A.clone().requires_grad_()
    g, = torch.autograd.grad(projector_loss(Ar), Ar)
    E = torch.randn(4, 4, dtype=D, generator=torch.Generator().manual_seed(11))
    E = E + E.mT
    h = 1e-4  # larger than the gap: the pair stays together under the perturbation
    fd = (projector_loss(A + h * E) - projector_loss(A - h * E)) / (2 * h)
    assert abs(float((g * E).sum()) - float(fd)) <= 1e-6 * max(1.0, abs(float(fd)))


# ------------------------------------------------------------------- broadening
def test_broadening_is_finite_at_degeneracy_and_biased_as_documented():
    A = A_DEG.clone().requires_grad_()
    (agt.eigh(A, broadening=1e-10)[1] ** 4).sum().backward()  # a surrogate: no error, finite
    assert torch.isfinite(A.grad).all()
    # away from degeneracy the bias of each entry is eps / (gap^2 + eps): here gap >= 1
    B = with_spectrum([0.0, 1.0, 2.0, 3.5], seed=12)
    loss = lambda w, V: (V[:, :2] @ V[:, :2].mT * G).sum() + (V ** 4).sum()
    for eps in (1e-4, 1e-2):
        B1, B2 = B.clone().requires_grad_(), B.clone().requires_grad_()
        g_exact, = torch.autograd.grad(loss(*agt.eigh(B1)), B1)
        g_broad, = torch.autograd.grad(loss(*agt.eigh(B2, broadening=eps)), B2)
        bias = float((g_broad - g_exact).norm() / g_exact.norm())
        assert 0 < bias <= 4 * eps  # relative bias at most eps/gap^2 per entry, gaps >= 1


def test_fused_reciprocal_gap_products_equal_the_formed_matrices():
    """``F_times`` divides by the gap matrix when the values are apart, and falls back to ``F * X``
    (masked) when they are not: both give the same numbers, and the check of which one applies is
    exact about clusters, zero singular values and pairs ``s_i = -s_j``."""
    from adjointgen.generated.torch import eigh as geigh
    from adjointgen.generated.torch import svd as gsvd
    from adjointgen.runtime.degeneracy import pairs_apart

    g = torch.Generator().manual_seed(5)
    w = torch.sort(torch.randn(2, 7, dtype=torch.float64, generator=g)).values
    X = torch.randn(2, 7, 7, dtype=torch.float64, generator=g)
    assert pairs_apart(w, "difference")
    for scale in (1, 0.5, -2):
        assert torch.allclose(geigh.eigh_F_times(w, X, scale), geigh.eigh_F(w, scale) * X, rtol=1e-14, atol=0)
    s = w.abs() + 0.1
    assert pairs_apart(s, "sum")
    assert torch.allclose(gsvd.svd_G_times(s, X, 0.5), gsvd.svd_G(s, 0.5) * X, rtol=1e-14, atol=0)
    # values that are not apart take the masked path, with the same result as the formed matrix
    w2 = w.clone()
    w2[0, 3] = w2[0, 2]
    assert not pairs_apart(w2, "difference")
    assert torch.equal(geigh.eigh_F_times(w2, X, 0.5), geigh.eigh_F(w2, 0.5) * X)
    s2 = s.clone()
    s2[1, 0] = 0.0
    assert not pairs_apart(s2, "sum") and pairs_apart(s2, "difference")
    assert torch.equal(gsvd.svd_G_times(s2, X, 0.5), gsvd.svd_G(s2, 0.5) * X)
    assert not pairs_apart(torch.tensor([1.0, -1.0], dtype=torch.float64), "sum")

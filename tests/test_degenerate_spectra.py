"""Degenerate spectra across the catalogue: every solver, LAPACK's special bases, spectral losses
through the outputs, partial solvers' clusters and cuts, the null space of a thin SVD, transforms."""
import sys
from pathlib import Path

import pytest
import torch

import adjointgen
import adjointgen.torch as agt
from adjointgen import ComplementBasisError, DegenerateSubspaceError, GaugeDependentLossError, PhaseDependentLossError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import sweep_degeneracy  # noqa: E402

f64 = torch.float64


def grad(loss, A):
    A = A.clone().requires_grad_()
    (g,) = torch.autograd.grad(loss(A), A)
    return g


def orth(n, seed):
    return torch.linalg.qr(torch.randn(n, n, dtype=f64, generator=torch.Generator().manual_seed(seed)))[0]


@pytest.mark.slow  # the whole sweep (every solver, loss, gap, transform): the slow step's
def test_the_sweep_every_solver_loss_gap_and_transform():
    rows, failures, passed, total = sweep_degeneracy.run(seeds=(0,), modes=("autograd", "func.grad", "vmap(grad)",
                                                                             "jacrev"))
    assert total > 500
    assert not failures, "\n".join(failures[:20])


# ------------------------------------------------------------------ LAPACK's bases
@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("shape,loss", [((6, 4), lambda U, S, Vh: Vh[1, 0]), ((4, 4), lambda U, S, Vh: Vh[1, 0]),
                                        ((4, 6), lambda U, S, Vh: U[0, 1])], ids=["tall", "square", "wide"])
def test_entry_losses_in_a_cluster_raise_whatever_the_basis(seed, shape, loss):
    m, n = shape
    k = min(m, n)
    U, V = orth(m, seed)[:, :k], orth(n, seed + 100)[:, :k]
    A = (U * torch.tensor([3.0, 2.0, 2.0, 1.0], dtype=f64)) @ V.mT
    with pytest.raises(DegenerateSubspaceError):
        grad(lambda a: loss(*agt.svd(a, full_matrices=False)), A)


def test_every_entry_loss_of_a_cluster_raises_for_eigh_at_n40():
    Q = orth(40, 3)
    w = torch.linspace(1, 10, 40, dtype=f64)
    w[10:13] = w[10]
    A = (Q * w) @ Q.mT
    A = (A + A.mT) / 2
    missed = 0
    for i in range(0, 40, 4):
        for j in (10, 11, 12):
            try:
                grad(lambda a: agt.eigh(a)[1][i, j] ** 2, A)
                missed += 1
            except DegenerateSubspaceError:
                pass
    assert missed == 0


def test_lapack_special_bases_the_identity_and_the_zero_matrix():
    with pytest.raises(DegenerateSubspaceError):
        grad(lambda a: agt.eigh(a)[1][0, 0], torch.zeros(3, 3, dtype=f64))
    with pytest.raises(DegenerateSubspaceError):
        grad(lambda a: agt.eigh(a)[1][0, 0] ** 2, torch.eye(4, dtype=f64))


# ------------------------------------------------------------------ losses through the outputs
def test_a_matrix_rebuilt_from_the_outputs_has_its_exact_gradient():
    E01 = torch.zeros(3, 3, dtype=f64)
    E01[0, 1] = E01[1, 0] = 0.5
    g = grad(lambda a: (lambda w, V: (V * w) @ V.mT)(*agt.eigh(a))[0, 1], torch.eye(3, dtype=f64))
    torch.testing.assert_close(g, E01, rtol=0, atol=1e-14)
    U, V = orth(6, 1)[:, :4], orth(4, 2)
    A = (U * torch.tensor([3.0, 2.0, 2.0, 1.0], dtype=f64)) @ V.mT
    g = grad(lambda a: (lambda U, S, Vh: (U * S) @ Vh)(*agt.svd(a, full_matrices=False))[0, 1], A)
    want = torch.zeros(6, 4, dtype=f64)
    want[0, 1] = 1.0
    torch.testing.assert_close(g, want, rtol=0, atol=1e-13)


def test_exp_through_the_eigendecomposition_matches_the_matrix_exponential():
    A = torch.diag(torch.tensor([1.0, 1.0, 2.0], dtype=f64))
    G = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=f64)
    loss = lambda a: ((lambda w, V: (V * w.exp()) @ V.mT)(*agt.eigh(a)) * G).sum()  # noqa: E731
    want = torch.func.grad(lambda a: (torch.linalg.matrix_exp(a) * G).sum())(A)
    torch.testing.assert_close(grad(loss, A), (want + want.mT) / 2, rtol=1e-13, atol=1e-13)
    assert abs(float(grad(loss, A)[0, 1] * 2) - 2 * 2.718281828459045) < 1e-12  # 3.844 in the report's units


def test_losses_that_are_not_spectral_functions_still_raise():
    Q = orth(4, 5)
    A = (Q * torch.tensor([1.0, 1.0, 2.0, 3.0], dtype=f64)) @ Q.mT
    A = (A + A.mT) / 2
    G = torch.randn(4, 4, dtype=f64, generator=torch.Generator().manual_seed(6))
    mixed = lambda w, V: w[0] + ((V * w.square()) @ V.mT * G).sum()  # noqa: E731
    with pytest.raises(DegenerateSubspaceError, match="individual eigenvalues"):
        grad(lambda a: mixed(*agt.eigh(a)), A)


# ------------------------------------------------------------------ partial solvers
def test_eigsh_clusters_in_the_kept_set_and_cuts():
    Q = orth(40, 7)
    w = torch.linspace(1, 10, 40, dtype=f64)
    w[-2] = w[-3]
    A = (Q * w) @ Q.mT
    A = (A + A.mT) / 2
    for k in (3, 5):
        with pytest.raises(DegenerateSubspaceError):
            grad(lambda a: agt.eigsh(a, k)[1][0, 1] ** 2, A)
        with pytest.raises(DegenerateSubspaceError):
            grad(lambda a: agt.eigsh(a, k)[0][1], A)
        want = grad(lambda a: torch.linalg.eigvalsh(a)[-k:].sum(), A)
        torch.testing.assert_close(grad(lambda a: agt.eigsh(a, k)[0].sum(), A), (want + want.mT) / 2, atol=1e-9,
                                   rtol=1e-9)
    Q5 = orth(5, 8)
    A5 = (Q5 * torch.tensor([1.0, 2.0, 2.0, 3.0, 3.0], dtype=f64)) @ Q5.mT
    with pytest.raises(DegenerateSubspaceError):
        grad(lambda a: agt.eigsh(a, 3, largest=False)[1].pow(4).sum(), (A5 + A5.mT) / 2)


def test_svds_clusters_cuts_and_zero_matrices():
    U, V = orth(30, 9)[:, :20], orth(20, 10)
    s = torch.linspace(8, 1, 20, dtype=f64)
    s[0], s[1], s[2] = 10.0, 9.69, 9.69
    M = (U * s) @ V.mT
    with pytest.warns(UserWarning), pytest.raises(DegenerateSubspaceError, match="cuts through"):
        grad(lambda a: agt.svds(a, 2)[0][0, -1] ** 2, M)
    with pytest.raises(DegenerateSubspaceError, match="individual singular values"):
        grad(lambda a: agt.svds(a, 3)[1][-1], M)
    torch.testing.assert_close(grad(lambda a: agt.svds(a, 3)[1].sum(), M), U[:, :3] @ V[:, :3].mT, atol=1e-9, rtol=0)
    with pytest.warns(UserWarning):
        Uz, Sz, Vhz = agt.svds(torch.zeros(10, 5, dtype=f64), 2)
    assert torch.isfinite(Uz).all() and torch.equal(Sz, torch.zeros(2, dtype=f64))
    torch.testing.assert_close(Uz.mT @ Uz, torch.eye(2, dtype=f64), atol=1e-15, rtol=0)


# ------------------------------------------------------------------ the null space of a thin SVD
def test_the_null_space_of_a_rank_deficient_thin_svd():
    X = torch.randn(6, 3, dtype=f64, generator=torch.Generator().manual_seed(11))
    X[:, 2] = X[:, 0] + X[:, 1]
    with pytest.raises(ComplementBasisError, match="zero singular value"):
        grad(lambda a: agt.svd(a, full_matrices=False)[0][0, 2], X)
    with pytest.raises(ComplementBasisError):
        grad(lambda a: agt.svd(a.mT, full_matrices=False)[2][2, 0], X)
    # the reconstruction and the nuclear norm depend on the zero singular value, |t| along a perturbation
    # out of the range: the decomposition's cotangents do not determine their gradient
    with pytest.raises(DegenerateSubspaceError, match="zero singular value"):
        grad(lambda a: (lambda U, S, Vh: (U * S) @ Vh)(*agt.svd(a, full_matrices=False)).sum(), X)
    with pytest.raises(DegenerateSubspaceError, match="zero singular value"):
        grad(lambda a: agt.svd(a, full_matrices=False)[1].sum(), X)
    torch.testing.assert_close(grad(lambda a: agt.svd(a, full_matrices=False)[1].square().sum(), X), 2 * X, atol=1e-12, rtol=0)


# ------------------------------------------------------------------ transforms and errors
def test_vmap_of_grad_checks_and_completes():
    Q = orth(3, 12)
    A = (Q * torch.tensor([1.0, 1.0, 2.0], dtype=f64)) @ Q.mT
    A = torch.stack([(A + A.mT) / 2] * 2)
    for loss in (lambda a: agt.eigh(a)[1][0, 0], lambda a: agt.eigh(a)[0][0]):
        with pytest.raises(DegenerateSubspaceError):
            torch.func.vmap(torch.func.grad(loss))(A)
    G = torch.randn(3, 3, dtype=f64, generator=torch.Generator().manual_seed(13))
    spectral = lambda a: (((lambda w, V: (V * w.exp()) @ V.mT)(*agt.eigh(a))) * G).sum()  # noqa: E731
    g = torch.func.vmap(torch.func.grad(spectral))(A)
    torch.testing.assert_close(g[0], grad(spectral, A[0]), rtol=1e-12, atol=1e-12)


def test_the_gauge_errors_have_one_base_and_name_their_cause():
    for cls in (PhaseDependentLossError, DegenerateSubspaceError, ComplementBasisError):
        assert issubclass(cls, GaugeDependentLossError) and issubclass(cls, ValueError)
    assert adjointgen.ComplementBasisError is ComplementBasisError
    A = torch.randn(6, 3, dtype=f64, generator=torch.Generator().manual_seed(14))
    with pytest.raises(ComplementBasisError, match="extra columns"):
        grad(lambda a: agt.svd(a, full_matrices=True)[0][0, 5], A)


def test_the_generic_basis_keeps_the_decompositions():
    w, V = agt.eigh(torch.eye(4, dtype=f64))
    assert (V.abs() > 1e-3).all()  # no exact zeros: a generic basis of the eigenspace
    torch.testing.assert_close(V.mT @ V, torch.eye(4, dtype=f64), atol=1e-15, rtol=0)
    U, V = orth(6, 15)[:, :4], orth(4, 16)
    A = (U * torch.tensor([3.0, 2.0, 2.0, 1.0], dtype=f64)) @ V.mT
    U2, S2, Vh2 = agt.svd(A, full_matrices=False)
    torch.testing.assert_close((U2 * S2) @ Vh2, A, atol=1e-14, rtol=0)
    # near-degenerate (apart by more than rounding): LAPACK's eigenvectors, unchanged
    B = (V * torch.tensor([1.0, 1.0 + 1e-9, 2.0, 3.0], dtype=f64)) @ V.mT
    B = (B + B.mT) / 2
    torch.testing.assert_close(agt.eigh(B)[1], torch.linalg.eigh(B)[1], rtol=0, atol=0)


# ------------------------------------------------------------------ forward mode and second derivatives
@pytest.mark.slow  # the whole sweep in forward mode and at second order: the slow step's
def test_the_sweep_forward_mode_and_second_derivatives_never_return_a_wrong_value():
    rows, failures, passed, total = sweep_degeneracy.run(seeds=(0,), modes=("jvp", "jacfwd", "hvp", "jvp(grad)"))
    assert total > 600
    assert not failures, "\n".join(failures[:20])
    # not all by raising: reverse over reverse is exact for the sums of a cluster's values
    exact = [r for r in rows if r[3] == "inside" and r[2] in ("sum", "squares") and r[0] == "eigh"
             and int(r[4].split("/")[0]) > int(r[5] or 0)]
    assert len(exact) == 4, rows


def _cluster_problem(seed=1):
    Q = orth(4, seed)
    A = (Q * torch.tensor([1.0, 1.0, 2.0, 3.0], dtype=f64)) @ Q.mT
    G = torch.randn(4, 4, dtype=f64, generator=torch.Generator().manual_seed(seed + 1))
    return (A + A.mT) / 2, G + G.mT


def _richardson(f, A, E, h=1e-3):
    D = lambda s: (f(A + s * E) - f(A - s * E)) / (2 * s)  # noqa: E731
    return (4 * D(h / 2) - D(h)) / 3


def test_forward_mode_through_a_split_cluster_raises_instead_of_a_wrong_tangent():
    A, G = _cluster_problem()
    E = torch.randn(4, 4, dtype=f64, generator=torch.Generator().manual_seed(3))
    E = E + E.mT
    spectral = lambda a: (((lambda w, V: (V * w.exp()) @ V.mT)(*agt.eigh(a))) * G).sum()  # noqa: E731
    # the tangent of V diag(exp w) V^T needs the cluster's block of V^T E V, which (w, V) tangents
    # cannot carry: it was 20.247 where the derivative is 19.953
    for call in (lambda: torch.func.jvp(spectral, (A,), (E,)), lambda: torch.func.jacfwd(spectral)(A),
                 lambda: torch.func.hessian(spectral)(A),
                 lambda: torch.func.jvp(torch.func.grad(spectral), (A,), (E,))):
        with pytest.raises(DegenerateSubspaceError, match="forward-mode derivative"):
            call()
    # reverse mode checks the loss: exact
    want = _richardson(spectral, A, E)
    torch.testing.assert_close((grad(spectral, A) * E).sum(), want, rtol=1e-9, atol=0)
    # the other solvers, and the NumPy rules
    U, V = orth(6, 4)[:, :4], orth(4, 5)
    M = (U * torch.tensor([3.0, 2.0, 2.0, 1.0], dtype=f64)) @ V.mT
    dM = torch.randn(6, 4, dtype=f64, generator=torch.Generator().manual_seed(6))
    with pytest.raises(DegenerateSubspaceError, match="svd: a forward-mode"):
        torch.func.jvp(lambda m: agt.svd(m, full_matrices=False)[1].sum(), (M,), (dM,))
    with pytest.raises(DegenerateSubspaceError, match="eigh_generalized: a forward-mode"):
        torch.func.jvp(lambda a: agt.eigh(a, torch.eye(4, dtype=f64))[0].sum(), (A,), (E,))
    from adjointgen.generated.cupy import eigh as numpy_eigh

    w, Vn = agt.eigh(A)
    with pytest.raises(DegenerateSubspaceError, match=r"values -?[\d.e-]+, -?[\d.e-]+ \(indices 0, 1\)"):
        numpy_eigh.eigh_jvp(w.numpy(), Vn.numpy(), E.numpy())


def test_forward_mode_along_a_direction_that_keeps_a_cluster_whole_is_exact():
    A, G = _cluster_problem()
    P = torch.randn(4, 4, dtype=f64, generator=torch.Generator().manual_seed(7))
    losses = {
        "spectral": lambda w, V: ((V * w.exp()) @ V.mT * G).sum(),
        "projector": lambda w, V: ((V[:, :2] @ V[:, :2].mT) * G).sum(),
        "squares": lambda w, V: w.square().sum(),
    }
    for E in (A @ A, torch.eye(4, dtype=f64)):  # polynomials in A: V^T E V is diagonal, constant on the cluster
        for name, loss in losses.items():
            f = lambda a, loss=loss: loss(*agt.eigh(a))  # noqa: E731
            _, t = torch.func.jvp(f, (A,), (E,))
            torch.testing.assert_close(t, _richardson(f, A, E), rtol=1e-8, atol=1e-9, msg=name)
            _, h = torch.func.jvp(torch.func.grad(f), (A,), (E,))
            along = lambda a, f=f: (grad(f, a) * P).sum()  # noqa: E731
            torch.testing.assert_close((h * P).sum(), _richardson(along, A, E), rtol=1e-7, atol=1e-8, msg=name)


def test_second_derivatives_at_a_cluster_exact_for_symmetric_functions_and_named_otherwise():
    A, G = _cluster_problem()
    E = torch.randn(4, 4, dtype=f64, generator=torch.Generator().manual_seed(8))
    E = E + E.mT
    P = torch.randn(4, 4, dtype=f64, generator=torch.Generator().manual_seed(9))

    def hvp(f):
        a = A.clone().requires_grad_()
        (g,) = torch.autograd.grad(f(a), a, create_graph=True)
        return (torch.autograd.grad((g * E).sum(), a)[0] * P).sum()

    squares = lambda a: agt.eigh(a)[0].square().sum()  # noqa: E731
    along = lambda a: (grad(squares, a) * P).sum()  # noqa: E731
    torch.testing.assert_close(hvp(squares), _richardson(along, A, E), rtol=1e-8, atol=1e-9)
    # the projector onto the cluster: its second derivative goes through the cluster's block
    # (adjointgen.runtime.value_blocks), exact; tests/test_second_order_clusters.py sweeps it
    projector = lambda a: (((lambda V: V[:, :2] @ V[:, :2].mT)(agt.eigh(a)[1])) * G).sum()  # noqa: E731
    along = lambda a: (grad(projector, a) * P).sum()  # noqa: E731
    torch.testing.assert_close(hvp(projector), _richardson(along, A, E), rtol=1e-7, atol=1e-8)
    # a loss of the cluster's individual eigenvalues' second derivative raises
    spectral = lambda a: (lambda w, V: ((V * w.exp()) @ V.mT * G).sum())(*agt.eigh(a))  # noqa: E731
    with pytest.raises(DegenerateSubspaceError, match="(?i)in a second derivative"):
        hvp(spectral)


def test_the_generic_basis_never_mixes_vectors_of_distinct_values():
    """The forward rotates only the vectors of values equal to rounding: a float32 spectrum of 1024
    values 8e-4 apart (relative) keeps its eigenvectors (the tolerance was 16 n eps = 2e-3 and merged
    the whole spectrum: residual 0.3), and a cluster's spread is bounded, not chained from neighbour
    to neighbour."""
    from adjointgen.runtime.degeneracy import rounding_clusters, rounding_rtol

    n = 1024
    Q, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(3)))
    A = ((Q * (1.0 + 4e-3 * torch.arange(n, dtype=torch.float64))) @ Q.mT).to(torch.float32)
    A = (A + A.mT) / 2
    w, V = agt.eigh(A)
    assert float((A @ V - V * w).abs().max()) < 1e-5 * float(w.abs().max())
    t = rounding_rtol(8, torch.float64)
    chain = torch.tensor([0.6 * t * i for i in range(8)], dtype=torch.float64) + 1.0  # neighbours 0.6 t apart
    clusters = rounding_clusters(chain)[0]
    assert len(clusters) > 1 and all(float(chain[c].max() - chain[c].min()) <= t * float(chain.max()) for c in clusters)
    exact = torch.tensor([1.0, 1.0, 1.0, 2.0], dtype=torch.float64)
    assert rounding_clusters(exact) == [[[0, 1, 2]]]
    # a graded spectrum: each value far from the others relative to itself (the tolerance was
    # relative to the largest, and the vectors of 1e-300, 1 and 1e100 were mixed)
    graded = torch.tensor([1e-300, 1.0, 1e100, 1e300], dtype=torch.float64)
    w, V = agt.eigh(torch.diag(graded))
    assert torch.equal(V.abs(), torch.eye(4, dtype=torch.float64))
    assert torch.equal(w, torch.linalg.eigvalsh(torch.diag(graded)))  # (LAPACK's scaling: 1e-300 -> 0)
    U, S, Vh = agt.svd(torch.diag(graded))
    assert torch.equal(U.abs(), torch.eye(4, dtype=torch.float64)[:, [3, 2, 1, 0]])

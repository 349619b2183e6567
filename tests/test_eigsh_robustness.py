"""eigsh / partial_eigh robustness: no silently skipped eigenvalue (inertia certificate, repair,
second opinion), the gap test on the scale of ||A||, a k that splits a degenerate eigenvalue, empty
and broadcast batches, argument types, dtype inference of operators, sparse warnings, and what a
ConvergenceError reports. Every check is against a dense LAPACK reference or an exact value."""
import math
import warnings

import numpy as np
import pytest
import scipy.sparse as sps
import torch

import adjointgen
import adjointgen.torch as agt
from adjointgen.runtime.eigsolvers import partial_eigh
from helpers import rel, sym


def _csr(M):
    M = sps.csr_matrix(M)
    M.sort_indices()
    return torch.sparse_csr_tensor(torch.from_numpy(M.indptr.astype(np.int64)),
                                   torch.from_numpy(M.indices.astype(np.int64)), torch.from_numpy(M.data),
                                   size=M.shape, check_invariants=False)


def tridiagonal_with_isolated_row(n=800, row=5):
    """Diagonal 2 + 0.01 i, off-diagonal -1, row and column ``row`` zeroed with the zeros kept in
    the pattern: eigenvalue 0 (eigenvector e_row) below the rest, which ARPACK's 'SA' misses."""
    d = 2 + 0.01 * np.arange(n)
    M = sps.diags([-np.ones(n - 1), d, -np.ones(n - 1)], [-1, 0, 1]).tocoo()
    data = M.data.copy()
    data[(M.row == row) | (M.col == row)] = 0.0  # explicit zeros, pattern unchanged
    return sps.coo_matrix((data, (M.row, M.col)), shape=M.shape)


def torch_coo(M):
    M = sps.coo_matrix(M)
    indices = torch.from_numpy(np.vstack([M.row, M.col]).astype(np.int64))
    return torch.sparse_coo_tensor(indices, torch.from_numpy(M.data), M.shape, check_invariants=False).coalesce()


def path_laplacian(m):
    L = sps.diags([-np.ones(m - 1), 2 * np.ones(m), -np.ones(m - 1)], [-1, 0, 1]).tolil()
    L[0, 0] = L[m - 1, m - 1] = 1
    return L.tocsr()


# ---------------------------------------------------------------------------------------------------
# 1. no eigenvalue skipped silently
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("largest", [False, True], ids=["smallest", "largest"])
def test_sparse_isolated_eigenvalue_is_not_skipped(largest):
    M = tridiagonal_with_isolated_row()
    M = M if not largest else -M
    reference = np.linalg.eigvalsh(M.toarray())
    expected = reference[:3] if not largest else reference[::-1][:3]
    w, V = agt.eigsh(torch_coo(M), 3, largest=largest)
    np.testing.assert_allclose(w.numpy(), expected, atol=1e-10)
    assert abs(float(w[0])) < 1e-12  # the exact 0 (e_5) is found
    _, _, info = partial_eigh(_csr(M), 3, largest=largest)
    assert info.method == "arpack" and info.certificate == "repaired"


def test_dense_iterative_route_is_repaired_by_the_direct_solver():
    M = tridiagonal_with_isolated_row()
    w, U, info = partial_eigh(torch.from_numpy(M.toarray()), 3, largest=False, method="arpack")
    np.testing.assert_allclose(w.numpy(), np.linalg.eigvalsh(M.toarray())[:3], atol=1e-12)
    assert info.certificate == "repaired" and info.method == "dense"


def test_operator_input_gets_a_second_opinion():
    M = tridiagonal_with_isolated_row()
    dense = torch.from_numpy(M.toarray())
    op = adjointgen.LinearOperator(lambda X, M_: M_ @ X, M.shape, params=(dense,))
    w, U, info = partial_eigh(op, 3, largest=False)
    np.testing.assert_allclose(w.numpy(), np.linalg.eigvalsh(M.toarray())[:3], atol=1e-10)
    assert info.certificate == "repaired"
    # a problem ARPACK gets right is confirmed, not recomputed
    lifted = dense.clone()
    lifted[5, 5] = 1.0  # e_5 now has eigenvalue 1: nothing below the three ARPACK finds
    fine = adjointgen.LinearOperator(lambda X, M_: M_ @ X, M.shape, params=(lifted,))
    w, U, info = partial_eigh(fine, 3, largest=False)
    assert info.certificate == "second-opinion"


def test_an_unreliable_factorization_falls_back_to_a_second_opinion(monkeypatch):
    import adjointgen.runtime.eigsolvers.certify as eigsolvers

    monkeypatch.setattr(eigsolvers, "_sparse_count", lambda *args, **kwargs: (None, None))
    M = tridiagonal_with_isolated_row()
    w, U, info = partial_eigh(_csr(M), 3, largest=False)
    np.testing.assert_allclose(w.numpy(), np.linalg.eigvalsh(M.toarray())[:3], atol=1e-10)
    assert info.certificate == "repaired" and info.aid is None


def test_graph_laplacians_isolated_node_and_repeated_zeros():
    # four components (sizes 300, 400, 299, 1): eigenvalue 0 four times, then a small positive one
    L = sps.block_diag([path_laplacian(300), path_laplacian(400), path_laplacian(299), sps.csr_matrix((1, 1))]).tocsr()
    reference = np.linalg.eigvalsh(L.toarray())
    for k in (4, 5):
        w, U, info = partial_eigh(_csr(L), k, largest=False)
        np.testing.assert_allclose(w.numpy(), reference[:k], atol=1e-10)
        assert info.certificate in ("inertia", "repaired")
        assert np.linalg.norm(L @ U.numpy() - U.numpy() * w.numpy()) < 1e-8
    # k = 2 cuts the cluster of zeros: still the right values, flagged as a split
    with pytest.warns(UserWarning, match="gap"):
        w, U, info = partial_eigh(_csr(L), 2, largest=False)
    np.testing.assert_allclose(w.numpy(), [0.0, 0.0], atol=1e-10)
    assert info.split == (0, 1)


def test_certificate_of_the_direct_route():
    A = sym(torch.randn(30, 30, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    assert partial_eigh(A, 3)[2].certificate == "direct"


# ---------------------------------------------------------------------------------------------------
# 2. the gap test on the scale of ||A||; a k that splits a degenerate eigenvalue
# ---------------------------------------------------------------------------------------------------
def rotated(d, seed=0):
    n = d.shape[0]
    Q, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)))
    return sym((Q * d) @ Q.T)


def test_gap_is_measured_against_the_norm_of_A():
    d = torch.cat([torch.tensor([1e-3, 1e-3 + 1e-10], dtype=torch.float64),
                   torch.linspace(1, 100, 38, dtype=torch.float64)])
    A = rotated(d).requires_grad_()
    with pytest.warns(UserWarning, match="gap"):
        w, V = agt.eigsh(A, 1, largest=False)
    # 1e-10 apart, against ||A|| = 100 and tol = eps^(2/3): they coincide to the solver's resolution
    with pytest.raises(adjointgen.DegenerateSubspaceError, match="cuts through"):
        torch.autograd.grad((V[:5] ** 2).sum(), A, retain_graph=True)
    with pytest.raises(ValueError, match="cuts through"):
        torch.autograd.grad(w.sum(), A)


def test_split_cluster_backward_raises_only_for_the_affected_pairs():
    d = torch.cat([torch.tensor([0.5, 0.7, 1.0, 1.0], dtype=torch.float64),
                   torch.linspace(2, 10, 36, dtype=torch.float64)])
    A = rotated(d, seed=1)
    W = torch.randn(40, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def loss(w, V):  # pairs 0 and 1 only, gauge invariant
        return w[0] ** 2 + 3 * w[1] + ((V[:, :2].mT @ W) ** 2).sum()

    A1 = A.clone().requires_grad_()
    with pytest.warns(UserWarning, match="gap"):
        w, V = agt.eigsh(A1, 3, largest=False)
    g, = torch.autograd.grad(loss(w, V), A1, retain_graph=True)
    A2 = A.clone().requires_grad_()
    wr, Vr = torch.linalg.eigh(A2)
    gr, = torch.autograd.grad(loss(wr, Vr), A2)
    assert rel(g, sym(gr)) < 1e-8
    for bad in (w[2], w.sum(), (V[:, 2] @ W[:, 0]) ** 2):
        with pytest.raises(adjointgen.DegenerateSubspaceError):
            torch.autograd.grad(bad, A1, retain_graph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(adjointgen.DegenerateSubspaceError):
            direction = sym(torch.ones(40, 40, dtype=torch.float64))
            torch.func.jvp(lambda a: agt.eigsh(a, 3, largest=False), (A,), (direction,))
    # keeping the whole cluster is fine
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w4, V4 = agt.eigsh(A, 4, largest=False)
    np.testing.assert_allclose(w4.numpy(), [0.5, 0.7, 1.0, 1.0], atol=1e-12)


# ---------------------------------------------------------------------------------------------------
# 3, 4. empty and broadcast batches
# ---------------------------------------------------------------------------------------------------
def test_empty_batch():
    A = torch.zeros(0, 5, 5, dtype=torch.float64, requires_grad=True)
    w, V = agt.eigsh(A, 2)
    assert w.shape == (0, 2) and V.shape == (0, 5, 2)
    g, = torch.autograd.grad(w.sum() + V.sum(), A)
    assert g.shape == (0, 5, 5)
    B = torch.eye(5, dtype=torch.float64).expand(0, 2, 5, 5)
    w, V = agt.eigsh(torch.eye(5, dtype=torch.float64), 3, B, largest=False)
    assert w.shape == (0, 2, 3) and V.shape == (0, 2, 5, 3)
    with pytest.raises(ValueError, match="k"):
        agt.eigsh(torch.zeros(0, 5, 5, dtype=torch.float64), 6)


def test_batch_shapes_broadcast_like_torch():
    g = torch.Generator().manual_seed(3)
    A = sym(torch.randn(3, 3, dtype=torch.float64, generator=g)).requires_grad_()
    B = torch.stack([torch.eye(3, dtype=torch.float64) * s for s in (1.0, 2.0)])
    w, V = agt.eigsh(A, 2, B)
    assert w.shape == (2, 2) and V.shape == (2, 3, 2)
    for i in range(2):
        wi, _ = agt.eigsh(A.detach(), 2, B[i])
        torch.testing.assert_close(w[i], wi)
    g_A, = torch.autograd.grad(w.sum(), A)
    assert g_A.shape == (3, 3)
    # d(w1 + w2 of A)/dA with B = I and B = 2I: the sum of the two gradients
    wr, Vr = torch.linalg.eigh(A.detach())
    expected = sum(Vr[:, -2:] @ Vr[:, -2:].mT / s for s in (1.0, 2.0))
    torch.testing.assert_close(g_A, expected)
    A2 = sym(torch.randn(2, 3, 3, dtype=torch.float64, generator=g))
    B2 = B.unsqueeze(1)  # (2, 1, 3, 3)
    w, V = agt.eigsh(A2, 2, B2)
    assert w.shape == (2, 2, 2) and V.shape == (2, 2, 3, 2)
    torch.testing.assert_close(w[1, 0], agt.eigsh(A2[0], 2, B[1])[0])
    with pytest.raises(ValueError, match="broadcast"):
        agt.eigsh(sym(torch.randn(3, 4, 4, dtype=torch.float64)), 2, torch.eye(4, dtype=torch.float64).expand(2, 4, 4))


# ---------------------------------------------------------------------------------------------------
# 5. argument types, dtype inference, sparse warnings
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [2.5, True, 2.0, "2", torch.tensor(2.0)])
def test_k_must_be_an_integer(k):
    A = sym(torch.randn(8, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="integer"):
        agt.eigsh(A, k)


@pytest.mark.parametrize("k", [np.int64(2), torch.tensor(2), 2])
def test_integer_scalars_are_accepted(k):
    w, V = agt.eigsh(sym(torch.randn(8, 8, dtype=torch.float64)), k)
    assert w.shape == (2,)


def test_operator_without_params_infers_its_dtype():
    g = torch.Generator().manual_seed(4)
    M = sym(torch.randn(60, 60, dtype=torch.float64, generator=g))
    op = adjointgen.LinearOperator(lambda X: M @ X, (60, 60))
    assert op.dtype == torch.float64 and op.device.type == "cpu"
    w, V = agt.eigsh(op, 3)
    np.testing.assert_allclose(w.numpy(), torch.linalg.eigvalsh(M).flip(0)[:3].numpy(), atol=1e-10)
    broken = adjointgen.LinearOperator(lambda X: torch.zeros(3, 3, dtype=torch.int64) @ X, (3, 3))
    with pytest.raises(ValueError, match="dtype="):
        broken.dtype


@pytest.mark.parametrize("form", ["coo", "coo-uncoalesced", "csr", "scipy"])
def test_sparse_input_emits_no_torch_sparse_warnings(form):
    n = 700
    M = sps.diags([np.full(n - 1, 0.1), np.linspace(1, 2, n), np.full(n - 1, 0.1)], [-1, 0, 1]).tocoo()
    if form == "scipy":
        S = M.tocsr()
    elif form == "csr":
        S = _csr(M).requires_grad_()
    else:
        S = torch_coo(M)
        if form == "coo-uncoalesced":
            indices = torch.cat([S.indices(), S.indices()[:, :1]], 1)
            values = torch.cat([S.values(), torch.zeros(1, dtype=torch.float64)])
            S = torch.sparse_coo_tensor(indices, values, S.shape, check_invariants=False)
            assert not S.is_coalesced()
        S.requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w, V = agt.eigsh(S, 2)
        if form != "scipy":
            g, = torch.autograd.grad(w.sum() + V[:3].sum(), S)
            assert g.layout == S.layout
    np.testing.assert_allclose(w.detach().numpy(), np.linalg.eigvalsh(M.toarray())[::-1][:2], atol=1e-10)


# ---------------------------------------------------------------------------------------------------
# 6. what a ConvergenceError reports
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method, maxiter", [("arpack", 1), ("lobpcg", 3)])
def test_convergence_error_reports_the_residual_reached_and_the_k_asked_for(method, maxiter):
    N = 30
    T = sps.diags([-np.ones(N - 1), 2 * np.ones(N), -np.ones(N - 1)], [-1, 0, 1])
    S = (sps.kron(T, sps.identity(N)) + sps.kron(sps.identity(N), T)).tocsr()
    with pytest.raises(adjointgen.ConvergenceError) as caught:
        partial_eigh(_csr(S), 6, maxiter=maxiter, method=method)
    error = caught.value
    assert math.isfinite(error.residual) and error.tol < error.residual < 1.0
    assert "no residual available" not in str(error)
    assert "6 wanted eigenpairs" in str(error) and "7 " not in str(error)

"""Runtime forward pieces: partial_eigh, the projected shifted solves, operator adapters.

Every result is checked against a dense LAPACK reference (scipy.linalg.eigh of the full problem) or
an exact dense solve; no derivative formula is tested here.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sp
import torch

try:
    import adjointgen.runtime.eigsolvers  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from adjointgen.runtime.eigsolvers import ConvergenceError, partial_eigh, partial_eigh_batched
from adjointgen.runtime.errors import ConvergenceError as ConvergenceErrorFromErrors
from adjointgen.runtime.linear_operator import LinearOperator, as_operator, sparse_lowrank_pattern_grad
from adjointgen.runtime.linsolve import solve_projected_shifted, solve_projected_shifted_dense

DTYPE = torch.float64


# ---------------------------------------------------------------------------------------------------
# problem builders
# ---------------------------------------------------------------------------------------------------
def random_symmetric(n: int, seed: int) -> torch.Tensor:
    """A seeded dense random symmetric matrix."""
    g = torch.Generator().manual_seed(seed)
    G = torch.randn(n, n, generator=g, dtype=DTYPE)
    return (G + G.T) / 2


def random_spd(n: int, cond: float, seed: int) -> torch.Tensor:
    """A seeded SPD matrix with log-spaced eigenvalues from 1 to ``cond``."""
    g = torch.Generator().manual_seed(seed + 1000)
    Q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=DTYPE))
    B = (Q * torch.logspace(0, np.log10(cond), n, dtype=DTYPE)) @ Q.T
    return (B + B.T) / 2


def laplacian_with_potential(N: int, seed: int = 0) -> sp.csr_matrix:
    """2-D 5-point Laplacian on an N x N grid plus a random diagonal potential in [0, 1)."""
    T = sp.diags([-np.ones(N - 1), 2 * np.ones(N), -np.ones(N - 1)], [-1, 0, 1])
    eye = sp.identity(N)
    potential = np.random.default_rng(seed).random(N * N)
    return (sp.kron(T, eye) + sp.kron(eye, T) + sp.diags(potential)).tocsr()


def sparse_mass_matrix(N: int) -> sp.csr_matrix:
    """An SPD sparse B: kron of 1-D P1 mass matrices (condition number about 9)."""
    M = sp.diags([np.ones(N - 1) / 6, 2 * np.ones(N) / 3, np.ones(N - 1) / 6], [-1, 0, 1])
    return sp.kron(M, M).tocsr()


def torch_csr(S: sp.spmatrix) -> torch.Tensor:
    """scipy sparse -> torch CSR."""
    S = sp.csr_matrix(S)
    S.sort_indices()
    return torch.sparse_csr_tensor(
        torch.from_numpy(S.indptr.astype(np.int64)), torch.from_numpy(S.indices.astype(np.int64)),
        torch.from_numpy(S.data), size=S.shape,
    )


def torch_coo(S: sp.spmatrix) -> torch.Tensor:
    """scipy sparse -> coalesced torch COO."""
    C = sp.coo_matrix(S)
    indices = torch.from_numpy(np.vstack([C.row, C.col]).astype(np.int64))
    return torch.sparse_coo_tensor(indices, torch.from_numpy(C.data), size=C.shape).coalesce()


def closure(M: torch.Tensor) -> LinearOperator:
    """``M`` hidden behind a matvec closure."""
    return LinearOperator(lambda X, M: M @ X, M.shape, params=(M,))


_REFERENCE_CACHE: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def full_reference(A, B):
    """The full dense decomposition (LAPACK via scipy), cached per problem."""
    a = A.toarray() if sp.issparse(A) else np.asarray(A)
    b = None if B is None else (B.toarray() if sp.issparse(B) else np.asarray(B))
    key = (a.shape, a.dtype.str, hash(a.tobytes()), None if b is None else hash(b.tobytes()))
    if key not in _REFERENCE_CACHE:
        _REFERENCE_CACHE[key] = scipy.linalg.eigh(a, b)
    return _REFERENCE_CACHE[key]


def reference(A, B, k, largest):
    """The k wanted pairs of the full dense reference, in partial_eigh's order."""
    w, V = full_reference(A, B)
    if largest:
        return w[::-1][:k].copy(), V[:, ::-1][:, :k].copy()
    return w[:k].copy(), V[:, :k].copy()


def assert_matches_reference(w, U, A, B, k, largest, *, rtol=1e-8, vector_tol=1e-6):
    """Eigenvalues, order, B-orthonormality and eigenvectors (up to sign) against the reference."""
    w_ref, V_ref = reference(A, B, k, largest)
    assert w.shape == (k,) and U.shape[1] == k
    order = np.diff(w.numpy())
    assert np.all(order <= 0) if largest else np.all(order >= 0)
    scale = np.abs(w_ref).max()
    np.testing.assert_allclose(w.numpy(), w_ref, rtol=0, atol=rtol * scale)
    b = None if B is None else (B.toarray() if sp.issparse(B) else np.asarray(B))
    BU = U.numpy() if b is None else b @ U.numpy()
    np.testing.assert_allclose(U.numpy().T @ BU, np.eye(k), atol=1e-8)
    # eigenvectors up to sign (the spectra here are simple): |u_i^T B v_i| = 1
    overlaps = np.abs(np.sum(BU * V_ref, axis=0))
    np.testing.assert_allclose(overlaps, np.ones(k), atol=vector_tol)


# ---------------------------------------------------------------------------------------------------
# partial_eigh against the dense reference
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [50, 200, 1000])
@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("generalized", [False, True], ids=["B=I", "B=spd"])
@pytest.mark.parametrize("largest", [True, False], ids=["largest", "smallest"])
def test_partial_eigh_auto_matches_reference(n, k, generalized, largest):
    A = random_symmetric(n, seed=n)
    B = random_spd(n, 1e4, seed=n) if generalized else None
    w, U, info = partial_eigh(A, k, B, largest=largest)
    # dense input: the direct solver up to n = 1000 (block Lanczos, certified by an inertia count,
    # beyond: see test_partial_eigh_iterative_standard)
    assert info.method == "dense" and info.certificate == "direct"
    assert info.residual <= info.tol
    assert_matches_reference(w, U, A, B, k, largest)


@pytest.mark.parametrize(
    "method, n, k",
    [("arpack", 200, 1), ("arpack", 200, 4), ("arpack", 200, 8), ("arpack", 1000, 1), ("arpack", 1000, 8),
     ("lobpcg", 200, 1), ("lobpcg", 200, 4), ("lobpcg", 200, 8), ("krylov", 1000, 1),
     ("krylov", 1000, 8)],
)
@pytest.mark.parametrize("largest", [True, False], ids=["largest", "smallest"])
def test_partial_eigh_iterative_standard(method, n, k, largest):
    A = random_symmetric(n, seed=7 * n + k)
    w, U, info = partial_eigh(A, k, largest=largest, method=method)
    assert info.method == method and info.residual <= info.tol and info.iterations > 0
    assert_matches_reference(w, U, A, None, k, largest)


@pytest.mark.parametrize(
    "method, n, cond, k",
    [("arpack", 200, 1e4, 1), ("arpack", 200, 1e4, 8), ("arpack", 1000, 1e4, 8), ("lobpcg", 200, 10.0, 4)],
)
@pytest.mark.parametrize("largest", [True, False], ids=["largest", "smallest"])
def test_partial_eigh_iterative_generalized(method, n, cond, k, largest):
    A = random_symmetric(n, seed=3 * n + k)
    B = random_spd(n, cond, seed=n + 1)
    w, U, info = partial_eigh(A, k, B, largest=largest, method=method)
    assert info.method == method and info.residual <= info.tol
    assert_matches_reference(w, U, A, B, k, largest)


@pytest.mark.parametrize("largest", [True, False], ids=["largest", "smallest"])
def test_input_forms_agree_sparse_problem(largest):
    S = laplacian_with_potential(30)  # n = 900: sparse forms take ARPACK, dense takes LAPACK
    dense = torch.from_numpy(S.toarray())
    forms = {
        "dense": dense, "coo": torch_coo(S), "csr": torch_csr(S), "operator": closure(dense),
        "scipy": S,
    }
    results = {name: partial_eigh(M, 6, largest=largest) for name, M in forms.items()}
    assert results["dense"][2].method == "dense"
    assert {results[name][2].method for name in ("coo", "csr", "operator", "scipy")} == {"arpack"}
    w_ref, U_ref, _ = results["dense"]
    for name, (w, U, info) in results.items():
        assert info.residual <= info.tol, name
        torch.testing.assert_close(w, w_ref, rtol=0, atol=1e-9)
        # the sign gauge (largest entry positive) makes the vectors comparable directly
        torch.testing.assert_close(U, U_ref, rtol=0, atol=1e-6)
    assert_matches_reference(w_ref, U_ref, S, None, 6, largest)


def test_input_forms_agree_generalized_sparse():
    S, M = laplacian_with_potential(30, seed=1), sparse_mass_matrix(30)
    runs = {
        "csr": partial_eigh(torch_csr(S), 5, torch_csr(M), largest=False),
        "coo": partial_eigh(torch_coo(S), 5, torch_coo(M), largest=False),
        "operator-B": partial_eigh(torch_csr(S), 5, closure(torch.from_numpy(M.toarray())), largest=False),
        "dense": partial_eigh(torch.from_numpy(S.toarray()), 5, torch.from_numpy(M.toarray()), largest=False),
    }
    assert runs["csr"][2].method == "arpack" and runs["operator-B"][2].method == "lobpcg"
    for name, (w, U, info) in runs.items():
        assert info.residual <= info.tol, name
        assert_matches_reference(w, U, S, M, 5, False)


def test_small_operator_input_goes_dense():
    A = random_symmetric(100, seed=5)
    w, U, info = partial_eigh(closure(A), 3)
    assert info.method == "dense"
    assert_matches_reference(w, U, A, None, 3, True)


def test_float32():
    A = random_symmetric(300, seed=9).float()
    w, U, info = partial_eigh(A, 4)
    assert w.dtype == U.dtype == torch.float32 and info.residual <= info.tol
    w_ref, _ = reference(A.double(), None, 4, True)
    np.testing.assert_allclose(w.numpy(), w_ref, rtol=1e-5)
    S = laplacian_with_potential(30).astype(np.float32)
    w, U, info = partial_eigh(torch_csr(S), 4)
    assert info.method == "arpack" and info.residual <= info.tol
    w_ref, _ = reference(S.astype(np.float64), None, 4, True)
    np.testing.assert_allclose(w.numpy(), w_ref, rtol=1e-5)


def test_batched_matches_single():
    A = torch.stack([random_symmetric(40, seed=s) for s in range(6)]).reshape(3, 2, 40, 40)
    B = random_spd(40, 10.0, seed=1)
    w, U, infos = partial_eigh_batched(A, 3, B, largest=False)
    assert w.shape == (3, 2, 3) and U.shape == (3, 2, 40, 3) and len(infos) == 6
    for i in range(3):
        for j in range(2):
            w1, U1, _ = partial_eigh(A[i, j], 3, B, largest=False)
            torch.testing.assert_close(w[i, j], w1)
            torch.testing.assert_close(U[i, j], U1)


def test_operator_matmul_is_differentiable():
    L = torch.randn(6, 2, dtype=DTYPE, requires_grad=True)
    op = LinearOperator(lambda X, L: L @ (L.T @ X) + X, (6, 6), params=(L,))
    X = torch.randn(6, 3, dtype=DTYPE)
    (op @ X).sum().backward()
    assert L.grad is not None and torch.isfinite(L.grad).all()
    assert op.dtype == DTYPE and op.device.type == "cpu" and op.shape == (6, 6)
    scipy_op = op.to_scipy()
    np.testing.assert_allclose(scipy_op @ X.numpy(), (op @ X).detach().numpy())
    assert isinstance(as_operator(torch_coo(sp.identity(4))).to_scipy(), sp.csr_matrix)
    assert isinstance(as_operator(torch.eye(4)).to_scipy(), np.ndarray)


# ---------------------------------------------------------------------------------------------------
# errors and warnings
# ---------------------------------------------------------------------------------------------------
def test_convergence_error_is_shared_and_a_value_error():
    assert ConvergenceError is ConvergenceErrorFromErrors and issubclass(ConvergenceError, ValueError)


@pytest.mark.parametrize("k", [0, -1, 11, 2.5, True])
def test_bad_k(k):
    with pytest.raises(ValueError, match="k"):
        partial_eigh(random_symmetric(10, seed=0), k)


def test_bad_inputs():
    A = random_symmetric(10, seed=0)
    bad = A.clone()
    bad[2, 3] = bad[3, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        partial_eigh(bad, 2)
    S = torch_coo(laplacian_with_potential(4))
    values = S.values().clone()
    values[0] = float("inf")
    with pytest.raises(ValueError, match="NaN or Inf"):
        partial_eigh(torch.sparse_coo_tensor(S.indices(), values, S.shape), 2)
    with pytest.raises(ValueError, match="same shape"):
        partial_eigh(A, 2, random_spd(11, 10.0, seed=0))
    with pytest.raises(ValueError, match="square"):
        partial_eigh(torch.randn(10, 9, dtype=DTYPE), 2)
    with pytest.raises(ValueError, match="not symmetric"):
        partial_eigh(torch.randn(10, 10, dtype=DTYPE), 2)
    with pytest.raises(ValueError, match="same dtype"):
        partial_eigh(A, 2, random_spd(10, 10.0, seed=0).float())
    with pytest.raises(ValueError, match="2-D"):
        partial_eigh(torch.stack([A, A]), 2)
    with pytest.raises(ValueError, match="layout"):
        partial_eigh(A.to_sparse_csc(), 2)
    with pytest.raises(ValueError, match="floating"):
        partial_eigh(torch.eye(5, dtype=torch.int64), 2)
    with pytest.raises(ValueError, match="method"):
        partial_eigh(A, 2, method="magic")


def test_B_not_positive_definite():
    A = random_symmetric(30, seed=0)
    indefinite = torch.diag(torch.linspace(-1, 2, 30, dtype=DTYPE))
    with pytest.raises(ValueError, match="positive definite"):
        partial_eigh(A, 2, indefinite)  # caught by the diagonal check
    Q, _ = torch.linalg.qr(random_symmetric(30, seed=1))
    hidden = (Q * torch.linspace(-1, 2, 30, dtype=DTYPE)) @ Q.T
    hidden = (hidden + hidden.T) / 2  # its diagonal is a weighted mean of the spectrum: positive here
    assert float(torch.diagonal(hidden).min()) > 0
    assert float(torch.linalg.eigvalsh(hidden)[0]) < 0
    with pytest.raises(ValueError, match="positive definite"):
        partial_eigh(A, 2, hidden)  # caught by Cholesky (LAPACK) in the dense route
    # sparse, positive diagonal, indefinite: caught by the symmetric LU pivots of the ARPACK route
    N = 30
    T = sp.diags([0.9 * np.ones(N * N - 1), np.ones(N * N), 0.9 * np.ones(N * N - 1)], [-1, 0, 1]).tocsr()
    with pytest.raises(ValueError, match="positive definite"):
        partial_eigh(torch_csr(laplacian_with_potential(N)), 3, torch_csr(T))
    # operator B, indefinite: caught by the Gram matrices of LOBPCG
    with pytest.raises(ValueError, match="positive definite"):
        partial_eigh(torch_csr(laplacian_with_potential(N)), 3, closure(torch.from_numpy(T.toarray())))


def test_gap_warning_dense_degenerate():
    A = torch.diag(torch.tensor([1.0, 2.0, 3.0, 3.0, 4.0, 5.0], dtype=DTYPE))
    with pytest.warns(UserWarning, match="gap between the last kept eigenvalue"):
        w, U, info = partial_eigh(A, 3, largest=False)
    assert info.gap == pytest.approx(0.0, abs=1e-12)
    with pytest.warns(UserWarning, match="gap"):
        partial_eigh(A, 3, largest=True)  # 5, 4, 3 | 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        partial_eigh(A, 2, largest=False)  # 1, 2 | 3: well separated
        partial_eigh(A, 4, largest=False)  # 1, 2, 3, 3 | 4: the pair is kept whole


@pytest.mark.parametrize("method", ["arpack", "lobpcg"])
def test_gap_warning_iterative_near_degenerate(method):
    n = 900
    diagonal = np.linspace(0.0, 1.0, n)
    diagonal[-3] = diagonal[-4] + 1e-13  # values 3 and 4 from the top nearly coincide
    A = torch_csr(sp.diags(diagonal))
    with pytest.warns(UserWarning, match="gap"):
        w, U, info = partial_eigh(A, 3, method=method, tol=1e-12)
    assert info.gap < 1e-11


def test_eigensolver_convergence_errors():
    S = torch_csr(laplacian_with_potential(30))
    with pytest.raises(ConvergenceError, match="ARPACK") as caught:
        partial_eigh(S, 6, maxiter=1, method="arpack")
    assert caught.value.method == "arpack"
    with pytest.raises(ConvergenceError, match="LOBPCG") as caught:
        partial_eigh(S, 6, maxiter=3, method="lobpcg")
    assert caught.value.residual > caught.value.tol


# ---------------------------------------------------------------------------------------------------
# projected shifted solves
# ---------------------------------------------------------------------------------------------------
def _projected_problem(A, B, k, largest, seed):
    w, U, _ = partial_eigh(A, k, B, largest=largest)
    dense_B = None if B is None else (B if isinstance(B, torch.Tensor) and B.layout == torch.strided else None)
    BU = U if B is None else as_operator(B).matmul(U)
    g = torch.Generator().manual_seed(seed)
    R = torch.randn(U.shape[0], k, generator=g, dtype=DTYPE)
    R = R - BU @ (U.T @ R)  # U^T R = 0
    return w, U, BU, R, dense_B


def _projected_residual(A, B, U, BU, d, X, R):
    opA = as_operator(A)
    BX = X if B is None else as_operator(B).matmul(X)
    Y = opA.matmul(X) - BX * d
    Y = Y - BU @ (U.T @ Y)
    return (torch.linalg.vector_norm(Y - R, dim=0) / torch.linalg.vector_norm(R, dim=0)).max()


@pytest.mark.parametrize("generalized", [False, True], ids=["B=I", "B=spd"])
@pytest.mark.parametrize("largest", [True, False], ids=["largest", "smallest"])
def test_solve_projected_shifted_dense_matrix(generalized, largest):
    n, k, tol = 300, 6, 1e-10
    A = random_symmetric(n, seed=21)
    B = random_spd(n, 1e2, seed=22) if generalized else None
    w, U, BU, R, _ = _projected_problem(A, B, k, largest, seed=3)
    X, info = solve_projected_shifted(A, B, U, BU, w, R, tol=tol, return_info=True)
    assert info.minres_columns == () and set(info.signs) == {-1 if largest else 1}
    assert _projected_residual(A, B, U, BU, w, X, R) <= tol
    assert (BU.T @ X).abs().max() <= 1e-10 * X.abs().max()
    X_exact = solve_projected_shifted_dense(A, B, U, w, R)
    assert torch.linalg.norm(X - X_exact) <= 1e-7 * torch.linalg.norm(X_exact)
    # the bordered solve satisfies the same equations
    assert _projected_residual(A, B, U, BU, w, X_exact, R) <= 1e-10
    assert (BU.T @ X_exact).abs().max() <= 1e-10 * X_exact.abs().max()


@pytest.mark.parametrize("form", ["csr", "coo", "operator"])
def test_solve_projected_shifted_sparse(form):
    S = laplacian_with_potential(20)  # n = 400
    dense = torch.from_numpy(S.toarray())
    A = {"csr": torch_csr(S), "coo": torch_coo(S), "operator": closure(dense)}[form]
    w, U, BU, R, _ = _projected_problem(A, None, 4, True, seed=4)
    X = solve_projected_shifted(A, None, U, BU, w, R, tol=1e-9, preconditioner="jacobi" if form != "operator" else None)
    assert _projected_residual(A, None, U, BU, w, X, R) <= 1e-9
    X_exact = solve_projected_shifted_dense(dense, None, U, w, R)
    assert torch.linalg.norm(X - X_exact) <= 1e-5 * torch.linalg.norm(X_exact)


def test_solve_projected_shifted_generalized_sparse():
    S, M = laplacian_with_potential(20, seed=2), sparse_mass_matrix(20)
    A, B = torch_csr(S), torch_csr(M)
    w, U, BU, R, _ = _projected_problem(A, B, 3, False, seed=5)
    X = solve_projected_shifted(A, B, U, BU, w, R, tol=1e-10)
    X_exact = solve_projected_shifted_dense(torch.from_numpy(S.toarray()), torch.from_numpy(M.toarray()), U, w, R)
    assert torch.linalg.norm(X - X_exact) <= 1e-6 * torch.linalg.norm(X_exact)
    assert (BU.T @ X).abs().max() <= 1e-10 * X.abs().max()


def test_solve_projected_shifted_interior_shifts_use_minres():
    n = 200
    A = random_symmetric(n, seed=31)
    w_all, V_all = torch.linalg.eigh(A)
    U, w = V_all[:, 100:102], w_all[100:102]  # interior pairs: the projected operator is indefinite
    g = torch.Generator().manual_seed(0)
    R = torch.randn(n, 2, generator=g, dtype=DTYPE)
    R = R - U @ (U.T @ R)
    X, info = solve_projected_shifted(A, None, U, U, w, R, tol=1e-10, return_info=True)
    assert info.minres_columns == (0, 1)
    assert _projected_residual(A, None, U, U, w, X, R) <= 1e-10
    X_exact = solve_projected_shifted_dense(A, None, U, w, R)
    assert torch.linalg.norm(X - X_exact) <= 1e-6 * torch.linalg.norm(X_exact)
    X_forced, info = solve_projected_shifted(
        A, None, U, U, w, R, tol=1e-10, definiteness="indefinite", return_info=True
    )
    assert info.minres_columns == (0, 1)
    assert torch.linalg.norm(X_forced - X_exact) <= 1e-6 * torch.linalg.norm(X_exact)


def test_solve_projected_shifted_options_and_errors():
    A = random_symmetric(120, seed=41)
    w, U, BU, R, _ = _projected_problem(A, None, 3, False, seed=6)
    X_exact = solve_projected_shifted_dense(A, None, U, w, R)
    X = solve_projected_shifted(A, None, U, U, w, R, tol=1e-11, X0=X_exact + U)  # X0 gets projected
    assert torch.linalg.norm(X - X_exact) <= 1e-7 * torch.linalg.norm(X_exact)
    R_zero = R.clone()
    R_zero[:, 1] = 0
    X = solve_projected_shifted(A, None, U, U, w, R_zero, tol=1e-11)
    assert X[:, 1].abs().max() == 0
    with pytest.raises(ConvergenceError, match="maxiter") as caught:
        solve_projected_shifted(A, None, U, U, w, R, tol=1e-12, maxiter=3)
    assert caught.value.residual > 1e-12
    with pytest.raises(ConvergenceError, match="MINRES"):
        solve_projected_shifted(A, None, U, U, w, R, tol=1e-12, maxiter=3, definiteness="indefinite")
    with pytest.raises(ValueError, match="R"):
        solve_projected_shifted(A, None, U, U, w, R[:, :2], tol=1e-8)
    with pytest.raises(ValueError, match="definiteness"):
        solve_projected_shifted(A, None, U, U, w, R, tol=1e-8, definiteness="maybe")


def test_solve_projected_shifted_under_autograd():
    A0 = random_symmetric(60, seed=51)
    w, U, BU, R0, _ = _projected_problem(A0, None, 3, False, seed=7)
    C = torch.randn(60, 3, dtype=DTYPE, generator=torch.Generator().manual_seed(1))
    grads = []
    for solve in ("iterative", "bordered"):
        R = R0.clone().requires_grad_()
        if solve == "iterative":
            X = solve_projected_shifted(A0, None, U, U, w, R, tol=1e-13, create_graph=True)
        else:
            X = solve_projected_shifted_dense(A0, None, U, w, R)
        (X * C).sum().backward()
        grads.append(R.grad)
    assert torch.isfinite(grads[0]).all()
    assert torch.linalg.norm(grads[0] - grads[1]) <= 1e-3 * torch.linalg.norm(grads[1])


def test_bordered_solve_batched_and_differentiable():
    A = torch.stack([random_symmetric(30, seed=s) for s in range(2)])
    w, V = torch.linalg.eigh(A)
    U, d = V[..., :3], w[..., :3]
    R = torch.randn(2, 30, 3, dtype=DTYPE)
    R = R - U @ (U.mT @ R)
    A_var = A.clone().requires_grad_()
    X = solve_projected_shifted_dense(A_var, None, U, d, R)
    assert X.shape == (2, 30, 3)
    for b in range(2):
        torch.testing.assert_close(X[b], solve_projected_shifted_dense(A[b], None, U[b], d[b], R[b]))
    X.square().sum().backward()
    assert torch.isfinite(A_var.grad).all()


# ---------------------------------------------------------------------------------------------------
# sparse low-rank pattern gradient
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["coo", "csr", "coo-uncoalesced"])
def test_sparse_lowrank_pattern_grad(layout):
    n, r = 30, 3
    rng = np.random.default_rng(0)
    S = sp.random(n, n, density=0.15, random_state=1, format="csr")
    S = S + S.T + sp.identity(n)
    A = torch_csr(S) if layout == "csr" else torch_coo(S)
    if layout == "coo-uncoalesced":
        indices, values = A.indices(), A.values()
        A = torch.sparse_coo_tensor(indices.flip(1), values.flip(0), A.shape)  # stored unsorted
        assert not A.is_coalesced()
    L = torch.from_numpy(rng.standard_normal((n, r))).requires_grad_()
    R = torch.from_numpy(rng.standard_normal((n, r)))
    G = sparse_lowrank_pattern_grad(A, L, R)
    assert G.layout == A.layout and G.shape == A.shape
    mask = torch.from_numpy((S != 0).toarray())
    expected = (L @ R.T).detach() * mask
    torch.testing.assert_close(G.detach().to_dense(), expected)
    if layout == "csr":
        assert torch.equal(G.crow_indices(), A.crow_indices()) and torch.equal(G.col_indices(), A.col_indices())
    else:
        assert torch.equal(G._indices(), A._indices()) and G.is_coalesced() == A.is_coalesced()
    (G.to_dense() * torch.from_numpy(rng.standard_normal((n, n)))).sum().backward()
    assert L.grad is not None and torch.isfinite(L.grad).all()

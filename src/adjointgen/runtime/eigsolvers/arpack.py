"""The ARPACK route (CPU): SciPy's implicitly restarted Lanczos, generalized problems in mode 2.

Part of :mod:`adjointgen.runtime.eigsolvers` (its docstring describes the routes and certificates)."""
from __future__ import annotations

import collections
import math
from typing import Any
import numpy as np
import torch

from ..errors import ConvergenceError
from ..linear_operator import LinearOperator
from .common import _ARPACK_DEFAULT_MAXITER_FACTOR, _SEED, _hermitian_ritz, _not_positive_definite, _rayleigh_ritz, _relative_residuals

# ---------------------------------------------------------------------------------------------------
# ARPACK route (CPU)
# ---------------------------------------------------------------------------------------------------
class _ProductCounter:
    """Counts operator applications and keeps copies of the last ``keep`` vectors ARPACK multiplied
    (its Lanczos basis), so that a failed run can still report the residual it reached."""

    def __init__(self, keep: int = 0):
        self.count = 0
        self.recent: collections.deque | None = collections.deque(maxlen=keep) if keep else None


def _counting_scipy_operator(op: LinearOperator, counter: _ProductCounter):
    import scipy.sparse.linalg as spla

    inner = spla.aslinearoperator(op.to_scipy())

    def matvec(x):
        counter.count += 1
        if counter.recent is not None:
            counter.recent.append(np.array(x, copy=True).reshape(-1))
        return inner.matvec(x)

    return spla.LinearOperator(inner.shape, matvec=matvec, rmatvec=matvec, dtype=inner.dtype)


def _sparse_lu(M):
    """``splu`` in symmetric mode with diagonal pivots only (``diag_pivot_thresh=0``): for a symmetric
    matrix the pivots are those of ``P M P^T = L D L^T``, so their signs give the inertia (Sylvester)
    as long as no off-diagonal pivot was taken (``perm_r == perm_c``). Raises ``RuntimeError`` for an
    exactly singular matrix."""
    import scipy.sparse.linalg as spla

    return spla.splu(M.tocsc(), permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                     options={"SymmetricMode": True})


def _scipy_inverse(opB: LinearOperator):
    """``x -> B^{-1} x`` for ARPACK's mode 2: Cholesky (dense) or symmetric-mode sparse LU (sparse)."""
    import scipy.linalg
    import scipy.sparse.linalg as spla

    Bs = opB.to_scipy()
    if isinstance(Bs, np.ndarray):
        try:
            factor = scipy.linalg.cho_factor(Bs, lower=True, check_finite=False)
        except np.linalg.LinAlgError as exc:
            raise _not_positive_definite(f"Cholesky failed: {exc}") from None
        solve = lambda x: scipy.linalg.cho_solve(factor, x, check_finite=False)  # noqa: E731
    else:
        try:
            lu = _sparse_lu(Bs)
        except RuntimeError as exc:  # exactly singular
            raise _not_positive_definite(f"sparse LU failed: {exc}") from None
        diagonal_of_u = lu.U.diagonal()
        if np.any(np.real(diagonal_of_u) <= 0):
            # With symmetric pivoting the pivots are those of an LDL^T factorization: a non-positive
            # pivot proves an indefinite B.
            raise _not_positive_definite("a non-positive pivot in its symmetric LU factorization")
        solve = lu.solve
    return spla.LinearOperator(Bs.shape, matvec=solve, rmatvec=solve, dtype=Bs.dtype)


def _reached_residual(opA, opB, X, k, largest, normA, normB) -> float:
    """The largest relative residual of the ``k`` wanted Ritz pairs in ``span(X)`` (``inf`` if none)."""
    try:
        if X is None or X.shape[1] == 0:
            return math.inf
        theta, Y = _rayleigh_ritz(opA, opB, X, k, largest)
        if theta.numel() == 0:
            return math.inf
        return float(_relative_residuals(opA, opB, theta, Y, normA, normB).max())
    except (RuntimeError, ValueError):  # a degenerate basis: nothing to report
        return math.inf


def _solve_arpack(opA, opB, m, k, largest, tol, maxiter, normA, normB, limit):
    """``m`` extreme pairs by ARPACK (``m = k + 1``; messages name the ``k`` the caller asked for).
    Returns ``(w, U, products)``."""
    import scipy.sparse.linalg as spla

    n = opA.shape[0]
    ncv = min(n, max(40, 3 * m, 2 * m + 1))
    counter = _ProductCounter(keep=ncv)
    A_scipy = _counting_scipy_operator(opA, counter)
    B_kwargs: dict[str, Any] = {}
    if opB is not None:
        B_kwargs = {"M": opB.to_scipy(), "Minv": _scipy_inverse(opB)}
    np_dtype = A_scipy.dtype
    v0 = np.random.default_rng(_SEED).uniform(-1.0, 1.0, n).astype(np_dtype)
    if maxiter is None:
        maxiter = _ARPACK_DEFAULT_MAXITER_FACTOR * n
    which = "LA" if largest else "SA"

    def run(arpack_tol: float, start: np.ndarray):
        try:
            return spla.eigsh(
                A_scipy, k=m, which=which, tol=arpack_tol, maxiter=maxiter, ncv=ncv, v0=start, **B_kwargs
            )
        except spla.ArpackNoConvergence as exc:
            # the residual reached: Rayleigh-Ritz on the last Lanczos vectors ARPACK multiplied
            # (plus any pairs it did converge), measured in our norm, over the k wanted pairs
            columns = list(counter.recent or ())
            if exc.eigenvectors is not None and np.size(exc.eigenvectors):
                columns += list(np.asarray(exc.eigenvectors).T)
            X = torch.from_numpy(np.stack(columns, axis=1)).to(opA.device) if columns else None
            residual = _reached_residual(opA, opB, X, k, largest, normA, normB)
            raise ConvergenceError(
                f"partial_eigh: ARPACK did not converge for the {k} wanted eigenpairs of an n = {n} "
                f"problem (maxiter = {maxiter} restarts)", method="arpack", residual=residual, tol=tol,
                iterations=counter.count,
            ) from None
        except spla.ArpackError as exc:
            hint = " (is B positive definite?)" if opB is not None else ""
            raise ConvergenceError(
                f"partial_eigh: ARPACK failed: {exc}{hint}", method="arpack", residual=math.inf, tol=tol,
                iterations=counter.count,
            ) from None

    def pairs(w, V):
        w_t, U_t = torch.from_numpy(w).to(opA.device), torch.from_numpy(V).to(opA.device)
        if U_t.is_complex():  # the Arnoldi driver's vectors: B-orthonormal by Rayleigh-Ritz
            w_t, U_t = _hermitian_ritz(opA, opB, w_t, U_t, largest)
        return w_t, U_t

    w, V = run(tol, v0)
    w_t, U_t = pairs(w, V)
    residual = float(_relative_residuals(opA, opB, w_t, U_t, normA, normB).max())
    if not residual <= limit and math.isfinite(residual):
        # ARPACK's test (Ritz estimate <= tol |theta| in the B^{-1} A, B-norm setting) can be met
        # while the residual in our norm is not: restart once from the current vectors, tighter.
        tighter = max(tol * limit / residual / 10.0, float(np.finfo(np_dtype).eps))
        w, V = run(tighter, V.sum(axis=1).astype(np_dtype))
        w_t, U_t = pairs(w, V)
    return w_t, U_t, counter.count

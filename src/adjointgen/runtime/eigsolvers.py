"""Forward solvers for the partial (k of n) symmetric and generalized eigenproblem.

``A U = B U D``, ``U^T B U = I`` (``B = I`` when not given), ``D`` holding the ``k`` largest or
smallest eigenvalues. This module only computes eigenpairs; it holds no derivative formula (those are
generated from ``derivations/``). What it guarantees to the generated gradient code:

- the returned pairs have a *measured* relative residual (``info.residual``) at most the tolerance,
  or a :class:`ConvergenceError` is raised;
- no eigenvalue is skipped silently (``info.certificate``, below): a Krylov solver can converge to
  the wrong pairs (ARPACK's ``'SA'`` misses the exact 0 of an 800 x 800 tridiagonal matrix with one
  zeroed row and column in each of 10 runs, five random starts times ``ncv`` 40 and 80: it returns
  0.158, 0.239, 0.288 for the three smallest), so an iterative route's result is certified or
  checked, and repaired or refused;
- a :class:`UserWarning` when the gap between the last kept and the first discarded eigenvalue is
  below ``max(sqrt(eps), 10 tol)`` times ``||A|| + |d_k| ||B||`` (the scale of the residuals, not of
  the computed eigenvalues, which may all be tiny next to ``||A||``); ``info.split`` names the kept
  pairs that coincide with the first discarded one to within ``info.resolution`` (``k`` cuts a
  degenerate eigenvalue: the autograd glue refuses to differentiate through those pairs);
- clear ``ValueError`` for bad input.

Routes (``info.method``), chosen by size, structure and device (override with ``method=``):

``"dense"``
    When ``n <= 600``, or ``3 k >= n``, or ``k >= n - 1``, or the input is dense with ``B`` and
    ``n <= 2000``, or dense without ``B`` and ``n <= 1000``. On the CPU: LAPACK through
    :func:`scipy.linalg.eigh` with ``subset_by_index`` (``syevr``, MRRR, for ``B = I``; ``sygvx`` for
    generalized problems) computing only the wanted eigenpairs; for dense input without ``B`` and
    ``400 < n <= 1000`` the whole spectrum by :func:`torch.linalg.eigh`, which makes the backward's
    shifted solves exact GEMMs (:class:`~adjointgen.runtime.linsolve.SpectralAid`). On other devices:
    :func:`torch.linalg.eigh`, generalized problems reduced with a Cholesky factor ``L`` of ``B``:
    ``L^{-1} A L^{-T}``. Sparse or operator input is densified (an ``n x n`` matrix: this route is
    for small ``n`` or large ``k``). Measured on 2 CPU threads, n = 1000, k = 8: ``syevr`` subset
    30 ms, ``torch.linalg.eigh`` (full) 63 ms; n = 600: 9 ms vs 18 ms.
``"krylov"``
    Dense input without ``B`` on the CPU, ``n > 1000`` (and ``4 (k + 25) <= n``): block Lanczos (block
    8, full reorthogonalization) in torch, usually on ``(sigma I - A)^{-1}`` through one Cholesky
    factorization (:func:`_solve_krylov`). Falls back to ``"dense"`` when its basis limit is reached.
    Measured on 2 CPU threads, GOE n = 2000, k = 8: 0.11 s (22 passes of triangular solves after 6
    locating passes), where ``syevr`` subset takes 0.37 s and plain block Lanczos 0.18 s (80
    passes); it also returns 24 extra Ritz pairs, which deflate the backward's solves.
``"arpack"``
    CPU, large sparse / dense input, ``B`` absent or explicit (dense or sparse):
    :func:`scipy.sparse.linalg.eigsh` (implicitly restarted Lanczos) for ``k + 1`` pairs with
    ``which='LA'``/``'SA'``, ``ncv = max(40, 3 (k + 1))``; generalized problems in ARPACK's mode 2
    with ``M = B`` and ``Minv`` from a Cholesky factor (dense ``B``) or a symmetric-mode sparse LU
    (sparse ``B``). If ARPACK's own stopping test is met but the measured residual is not (it
    happens for ill-conditioned ``B``), it is restarted once from the current vectors with a tighter
    tolerance. (Shift-invert below the spectrum for the smallest eigenvalues was measured on the
    300 x 300 grid Laplacian with potential, k = 8: 0.26 s factorization + 3.1 s for 332 solves at the
    Gershgorin bound, vs 5.3 s for ``'SA'``; it is used here only to repair skipped eigenvalues.)
``"lobpcg"``
    Non-CPU devices (torch ops only, so CUDA works without CuPy), and any device when ``B`` is a
    matvec closure: a block LOBPCG written here (B-orthonormalised basis ``[X, W, P]``,
    Rayleigh–Ritz with a Cholesky-factored Gram matrix, soft locking of converged columns, block
    size ``max(k + 1, min(2 (k + 1), n // 3))``). Its stopping test is the measured residual itself.

Certificates (``info.certificate``): ``"direct"`` for the dense route (LAPACK selects the pairs by
index). The iterative routes count: where a factorization is affordable (dense or sparse CPU ``A``,
``B`` absent or explicit; for sparse input when the band ``LDL^T`` flops of a reverse
Cuthill–McKee ordering are at most 20 times the flops of the products the solve spent), Sylvester's
law of inertia at a shift ``sigma`` between the k-th and (k+1)-th computed eigenvalue must give
exactly ``k`` eigenvalues beyond ``sigma`` (``"inertia"``): sparse input by the pivots of a
symmetric-mode sparse ``LDL^T`` (``splu`` with ``diag_pivot_thresh=0``, trusted only with diagonal
pivots and a small backward error), dense input by one Cholesky factorization of ``s (A - sigma B)``
with the k computed pairs deflated (positive definite iff none is missing). When the k-th and
(k+1)-th pair coincide, ``sigma`` goes in front of their cluster instead. A count that is too high
means skipped eigenvalues: dense input is recomputed by the direct solver, sparse input by ARPACK in
shift-invert mode with the same factorization for all eigenvalues beyond ``sigma``, and the count is
checked again (``"repaired"``); a count that cannot be trusted falls back to the check below, one
that is too far off to repair raises :class:`ConvergenceError`. Measured: 0.30 s (+0.04 s for the
fill estimate) on the 300 x 300 grid with k = 8 next to 3.9 s for ARPACK; 0.046 s on the dense n = 2000 route (0.11 s), whose factor then
preconditions the backward (15 CG iterations instead of 186). Without an affordable factorization
(matvec closures, non-CPU tensors, too much fill) an independent block LOBPCG run on the pencil with
the computed pairs deflated must find nothing beyond them (``"second-opinion"``); when it does, the
pairs are recomputed (``"repaired"``), and when it cannot converge a :class:`ConvergenceError` is
raised rather than an unchecked answer returned.

The factorization and the extra pairs are handed on to the backward (``info.aid``, a
:class:`~adjointgen.runtime.linsolve.ShiftedSolveAid`).

Tolerance: ``tol`` bounds the relative residual of every returned pair,
``||A u_i - d_i B u_i|| / ((||A|| + |d_i| ||B||) ||u_i||)`` with ``||A||``, ``||B||`` estimated by a
few power iterations (lower bounds, so the test errs on the strict side). The default is
``eps ** (2/3)`` of the dtype (3.7e-11 for float64, 2.4e-5 for float32): about two thirds of the
digits, which keeps Lanczos/LOBPCG iteration counts moderate; pass a smaller ``tol`` when gaps are
small (eigenvector error is about residual * ||A|| / gap). ``tol`` is clamped below at ``10 eps``.
The dense route is direct; its residual is checked against ``max(tol, eps ** (1/3))``, which only
catches broken input (a non-symmetric closure, an extremely ill-conditioned ``B``).

Complex Hermitian problems (complex64/complex128 ``A``, Hermitian positive definite ``B``; ``^T``
above is then the conjugate transpose) take the same routes with these differences: the eigenvalues
are real (float32/float64), the eigenvectors complex, each normalised so that its largest-magnitude
entry is real and positive; ``"krylov"`` (its banded Ritz solver is real) is replaced by
``"dense"`` (``n <= 2000``) or ``"arpack"``; ARPACK runs its complex (Arnoldi) driver, which scipy
uses for Hermitian input, and its vectors get a Rayleigh–Ritz step so that they are exactly
B-orthonormal also inside clusters; the inertia certificates count the real pivots of the
Hermitian ``LDL^T`` (``L D L^H``) and the Cholesky factor is complex.
"""

from __future__ import annotations

import collections
import math
import operator
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .errors import ConvergenceError
from .linear_operator import LinearOperator, as_operator

__all__ = ["ConvergenceError", "PartialEighInfo", "partial_eigh", "partial_eigh_batched"]

#: Problems this small always take the dense route.
DENSE_MAX_N = 600
#: Dense input with ``B`` up to this size takes the dense route (above: ARPACK).
DENSE_INPUT_MAX_N = 2000
#: Number of power-iteration steps for the norm estimates used in the residual.
_NORM_ESTIMATE_STEPS = 6
#: Default iteration caps (ARPACK: restarts; LOBPCG: block iterations).
_ARPACK_DEFAULT_MAXITER_FACTOR = 10
_LOBPCG_DEFAULT_MAXITER = 5000
#: Seed of the deterministic starting vectors (results do not depend on the global RNG state).
_SEED = 20240917


@dataclass(frozen=True)
class PartialEighInfo:
    """How :func:`partial_eigh` solved the problem.

    Attributes:
        method: ``"dense"``, ``"arpack"`` or ``"lobpcg"`` (see the module docstring).
        residual: the largest measured relative residual of the returned pairs,
            ``max_i ||A u_i - d_i B u_i|| / ((||A|| + |d_i| ||B||) ||u_i||)``.
        iterations: ARPACK: operator applications (one vector each); LOBPCG: block iterations;
            dense: 0.
        tol: the tolerance the residual was held to.
        gap: ``|d_k - d_{k+1}|``, the distance from the last kept eigenvalue to the first discarded
            one (``None`` when ``k == n``).
        certificate: why no eigenvalue was skipped: ``"direct"`` (dense route: LAPACK computes the
            pairs by index), ``"inertia"`` (iterative route, count confirmed by a factorization),
            ``"second-opinion"`` (iterative route without an affordable factorization: an independent
            deflated LOBPCG run found nothing beyond the computed pairs) or ``"repaired"`` (skipped
            eigenvalues were found and the pairs recomputed, then checked again).
        split: indices of the kept pairs whose eigenvalue coincides with the first discarded one to
            within ``resolution``: ``k`` splits a degenerate eigenvalue there, and which of its
            eigenvectors are kept is arbitrary. Empty in the normal case.
        resolution: ``max(tol, 10 eps) (||A|| + |d_k| ||B||)``, the distance below which two computed
            eigenvalues count as equal (``None`` when ``k == n``).
        aid: a :class:`~adjointgen.runtime.linsolve.ShiftedSolveAid` (the certifying factorization,
            and the extra Ritz pairs of the krylov route) that preconditions the backward's projected
            shifted solves for these pairs, or ``None``. It holds a factorization (for dense input an
            ``n x n`` Cholesky factor): drop the info to free it.
    """

    method: str
    residual: float
    iterations: int
    tol: float = float("nan")
    gap: float | None = None
    certificate: str | None = None
    split: tuple[int, ...] = ()
    resolution: float | None = None
    aid: Any = field(default=None, repr=False, compare=False)


# ---------------------------------------------------------------------------------------------------
# input checks
# ---------------------------------------------------------------------------------------------------
def _default_tol(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps ** (2.0 / 3.0)


_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)


def _check_operator(op: LinearOperator, name: str) -> None:
    rows, cols = op.shape
    if rows != cols:
        raise ValueError(f"partial_eigh: {name} must be square, got shape {op.shape}")
    if op.dtype not in _DTYPES:
        raise ValueError(f"partial_eigh: {name} must be float32, float64, complex64 or complex128, got {op.dtype}")
    if op.is_finite() is False:
        raise ValueError(f"partial_eigh: {name} contains NaN or Inf")
    eps = torch.finfo(op.dtype).eps
    if not op.is_symmetric(rtol=math.sqrt(eps)):
        raise ValueError(f"partial_eigh: {name} is not {'Hermitian' if op.dtype.is_complex else 'symmetric'}")


def _check_k(k: Any, n: int) -> int:
    if isinstance(k, bool):
        raise ValueError(f"partial_eigh: k must be an integer, got {k!r}")
    try:
        k = operator.index(k)
    except TypeError:
        raise ValueError(f"partial_eigh: k must be an integer, got {type(k).__name__}") from None
    if not 1 <= k <= n:
        raise ValueError(f"partial_eigh: k must satisfy 1 <= k <= n = {n}, got k = {k}")
    return k


def _prepare_operators(A: Any, B: Any) -> tuple[LinearOperator, LinearOperator | None]:
    opA = as_operator(A)
    _check_operator(opA, "A")
    if B is None:
        return opA, None
    opB = as_operator(B)
    _check_operator(opB, "B")
    if opB.shape != opA.shape:
        raise ValueError(f"partial_eigh: A and B must have the same shape, got {opA.shape} and {opB.shape}")
    if opB.dtype != opA.dtype:
        raise ValueError(f"partial_eigh: A and B must have the same dtype, got {opA.dtype} and {opB.dtype}")
    if opB.device != opA.device:
        raise ValueError(f"partial_eigh: A and B must be on the same device, got {opA.device} and {opB.device}")
    diagonal = opB.diagonal()
    if diagonal is not None and diagonal.is_complex():
        diagonal = diagonal.real  # Hermitian: a real diagonal (the check above bounds its imaginary part)
    if diagonal is not None and diagonal.numel() and not bool((diagonal > 0).all()):
        index = int(torch.nonzero(diagonal <= 0)[0])
        raise ValueError(
            f"partial_eigh: B is not positive definite (diagonal entry B[{index}, {index}] = "
            f"{float(diagonal[index]):.3e} <= 0)"
        )
    return opA, opB


# ---------------------------------------------------------------------------------------------------
# shared numerical helpers
# ---------------------------------------------------------------------------------------------------
def _generator(device: torch.device, seed: int = _SEED) -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def _random_block(n: int, m: int, dtype: torch.dtype, device: torch.device, seed: int = _SEED) -> torch.Tensor:
    return torch.randn(n, m, generator=_generator(device, seed), dtype=dtype, device=device)


def _apply_B(opB: LinearOperator | None, X: torch.Tensor) -> torch.Tensor:
    return X if opB is None else opB.matmul(X)


def _estimate_norm(op: LinearOperator | None, steps: int = _NORM_ESTIMATE_STEPS) -> float:
    """A lower estimate of ``||op||_2`` by a few steps of block power iteration (1.0 for the identity)."""
    if op is None:
        return 1.0
    n = op.shape[1]
    X = _random_block(n, 2, op.dtype, op.device)
    X = X / torch.linalg.vector_norm(X, dim=0)
    estimate = 0.0
    for _ in range(steps):
        Y = op.matmul(X)
        norms = torch.linalg.vector_norm(Y, dim=0)
        estimate = max(estimate, float(norms.max()))
        if estimate == 0.0 or not math.isfinite(estimate):
            break
        X = Y / norms.clamp_min(torch.finfo(op.dtype).tiny)
    return estimate


def _relative_residuals(
    opA: LinearOperator, opB: LinearOperator | None, w: torch.Tensor, U: torch.Tensor, normA: float, normB: float
) -> torch.Tensor:
    """Per-column ``||A u - d B u|| / ((||A|| + |d| ||B||) ||u||)``."""
    R = opA.matmul(U) - _apply_B(opB, U) * w
    scale = (normA + w.abs() * normB) * torch.linalg.vector_norm(U, dim=0)
    tiny = torch.finfo(U.dtype).tiny
    return torch.linalg.vector_norm(R, dim=0) / scale.clamp_min(tiny)


def _fix_signs(U: torch.Tensor) -> torch.Tensor:
    """Make the largest-magnitude entry of every column positive (a deterministic gauge; for
    complex vectors the phase that makes it real and positive)."""
    index = U.abs().argmax(dim=0, keepdim=True)
    pivot = torch.gather(U, 0, index)
    if U.is_complex():
        size = pivot.abs()
        phase = torch.where(size == 0, torch.ones_like(pivot), pivot.conj() / size.clamp_min(torch.finfo(size.dtype).tiny))
        return U * phase
    signs = torch.sign(pivot)
    return U * torch.where(signs == 0, torch.ones_like(signs), signs)


def _order(w: torch.Tensor, U: torch.Tensor, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.argsort(w, descending=largest)
    return w[order], U[:, order]


def _check_b_norms(opB: LinearOperator | None, U: torch.Tensor) -> None:
    if opB is None:
        return
    b_norms = (U.conj() * opB.matmul(U)).sum(0).real
    if not bool((b_norms > 0).all()):
        raise _not_positive_definite(f"found an eigenvector u with u^T B u = {float(b_norms.min()):.3e} <= 0")


# ---------------------------------------------------------------------------------------------------
# dense route
# ---------------------------------------------------------------------------------------------------
def _dense_matrix(op: LinearOperator) -> torch.Tensor:
    M = op.to_dense()
    if op.kind == "operator":  # a product with the identity is symmetric (Hermitian) only up to rounding
        M = (M + M.mH) / 2
    return M


def _wide(X: torch.Tensor) -> torch.Tensor:
    """``X`` in float64 (complex128 for complex ``X``): the precision of the certifying factorizations."""
    return X.to(torch.complex128 if X.is_complex() else torch.float64)


def _hermitian_ritz(opA, opB, w: torch.Tensor, U: torch.Tensor, largest: bool):
    """For complex results of ARPACK's Arnoldi driver: the Rayleigh–Ritz pairs of ``(A, B)`` in
    ``span(U)`` (exactly B-orthonormal, also inside clusters of equal eigenvalues), ordered from the
    wanted end; the input unchanged when the span has lost a direction."""
    theta, Y = _rayleigh_ritz(opA, opB, U, U.shape[1], largest)
    if theta.shape[0] != w.shape[0]:
        return w, U
    return _order(theta.to(w.dtype), Y.to(U.dtype), largest)


def _not_positive_definite(detail: str) -> ValueError:
    return ValueError(f"partial_eigh: B is not positive definite ({detail})")


def _solve_dense(opA, opB, m: int, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``m`` extreme eigenpairs (any order) by a dense direct solver."""
    n = opA.shape[0]
    A = _dense_matrix(opA)
    B = None if opB is None else _dense_matrix(opB)
    subset = [n - m, n - 1] if largest else [0, m - 1]
    if A.device.type == "cpu":
        import scipy.linalg

        a = A.detach().resolve_conj().numpy()
        b = None if B is None else B.detach().resolve_conj().numpy()
        if m == n:
            subset_kw: dict[str, Any] = {"driver": "evd" if b is None else "gvd"}
        else:
            subset_kw = {"subset_by_index": subset, "driver": "evr" if b is None else "gvx"}
        try:
            w, V = scipy.linalg.eigh(a, b, lower=True, check_finite=False, **subset_kw)
        except np.linalg.LinAlgError as exc:
            if b is not None and "positive definite" in str(exc):
                raise _not_positive_definite(f"LAPACK: {exc}") from None
            raise ConvergenceError(
                f"partial_eigh: dense LAPACK solver failed: {exc}", method="dense", residual=math.inf,
                tol=0.0, iterations=0,
            ) from None
        return torch.from_numpy(np.ascontiguousarray(w)), torch.from_numpy(np.ascontiguousarray(V))
    if B is None:
        w, V = torch.linalg.eigh(A)
    else:
        L, info = torch.linalg.cholesky_ex(B)
        if int(info) != 0:
            raise _not_positive_definite(f"Cholesky failed at leading minor {int(info)}")
        C = torch.linalg.solve_triangular(L, A, upper=False)
        C = torch.linalg.solve_triangular(L, C.mH, upper=False)
        w, V = torch.linalg.eigh((C + C.mH) / 2)
        V = torch.linalg.solve_triangular(L.mH, V, upper=True)
    keep = slice(n - m, n) if largest else slice(0, m)
    return w[keep], V[:, keep]


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


def _rayleigh_ritz(opA, opB, X: torch.Tensor, m: int, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``m`` extreme Ritz pairs of ``(A, B)`` in ``span(X)`` (any order); used to report how far a
    failed iterative run got."""
    eps = torch.finfo(X.dtype).eps
    X = X[:, torch.linalg.vector_norm(X, dim=0) > 0]
    BX = _apply_B(opB, X)
    T = _b_orthonormalize_svqb(X, BX, 100 * eps)
    Q = X @ T
    H = Q.mH @ opA.matmul(Q)
    theta, C = torch.linalg.eigh((H + H.mH) / 2)
    keep = slice(max(0, theta.shape[0] - m), None) if largest else slice(0, m)
    return theta[keep], Q @ C[:, keep]


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


# ---------------------------------------------------------------------------------------------------
# block Lanczos route (dense input, torch GEMMs)
# ---------------------------------------------------------------------------------------------------
#: Block size of the block Lanczos route (measured best of 4, 6, 8, 10, 12, 16 on n = 2000, k = 8).
_KRYLOV_BLOCK = 8
#: Dense input without B of at most this size takes the full spectrum (the backward's shifted solves
#: are then exact GEMMs); above it, block Lanczos. Measured on 2 CPU threads, GOE, k = 8, eigsh
#: forward + backward, full spectrum vs block Lanczos: n = 700 0.040 s vs 0.089 s, n = 1000 0.088 s
#: vs 0.081 s, n = 1200 0.140 s vs 0.111 s (torch.linalg.eigh forward + backward: 0.045, 0.10, 0.17 s).
_FULL_SPECTRUM_MAX_N = 1000
#: Extra Ritz pairs returned beyond the m wanted ones (deflation space for the backward solves).
_KRYLOV_EXTRA = 24
#: The Krylov basis grows to at most this fraction of n (then the direct solver takes over).
_KRYLOV_MAX_FRACTION = 0.6
_KRYLOV_MAX_DIM = 1600
#: Block steps of the first, locating block Lanczos run before the spectral transformation.
_KRYLOV_LOCATE_STEPS = 6
#: The spectral transformation is used when it should shorten the Krylov process at least this much
#: in the square of the pass count: (lambda_1 - lambda_n) >= gain * 4 delta.
_KRYLOV_SHIFT_INVERT_GAIN = 4.0


@dataclass
class _KrylovResult:
    w: torch.Tensor  # m wanted + extra Ritz values, ordered from the wanted end
    U: torch.Tensor
    products: int
    converged: bool


def _banded_ritz(band: np.ndarray, dim: int, count: int, largest: bool):
    """Selected eigenpairs of the symmetric block-tridiagonal ``T`` (lower band storage), ordered
    from the wanted end: the eigenvalues by LAPACK's banded solver (``?sbevx`` without vectors:
    ``O(dim^2 b)``; with vectors it would form an orthogonal ``dim x dim`` matrix, ``O(dim^3)``), the
    eigenvectors by two steps of inverse iteration with a banded LU each (``O(dim b^2)``),
    re-orthogonalized within clusters of close eigenvalues."""
    import scipy.linalg

    count = min(count, dim)
    bw = band.shape[0] - 1
    lower = np.ascontiguousarray(band[:, :dim])
    select = (dim - count, dim - 1) if largest else (0, count - 1)
    theta = scipy.linalg.eig_banded(lower, lower=True, eigvals_only=True, select="i", select_range=select,
                                    check_finite=False)
    if largest:
        theta = theta[::-1]
    theta = np.ascontiguousarray(theta)
    full = np.zeros((2 * bw + 1, dim))
    full[bw:] = lower
    for d in range(1, bw + 1):
        full[bw - d, d:] = lower[d, :dim - d]
    scale = max(float(np.abs(lower).sum(axis=0).max()), 1e-300)
    Y = np.empty((dim, count))
    # a different start per vector: inverse iteration for equal eigenvalues (a cluster) must not
    # return one vector several times before the re-orthogonalization
    starts = np.random.default_rng(_SEED + 5).standard_normal((dim, count))
    shifted = full.copy()
    for j in range(count):
        # a tiny offset keeps the LU finite when theta_j is an eigenvalue to the last bit
        offset = 1e3 * np.finfo(np.float64).eps * scale
        for _attempt in range(4):
            shifted[bw] = full[bw] - (theta[j] + offset)
            y = starts[:, j]
            with np.errstate(all="ignore"):
                for _ in range(2):
                    y = scipy.linalg.solve_banded((bw, bw), shifted, y, check_finite=False)
                    y = y / np.linalg.norm(y)
            if np.all(np.isfinite(y)):
                break
            offset *= 1e3
        Y[:, j] = y
    # clusters: orthonormalize the vectors of eigenvalues closer than 1e-7 ||T|| (QR keeps span order)
    j = 0
    while j < count:
        stop = j + 1
        while stop < count and abs(theta[stop] - theta[stop - 1]) <= 1e-7 * scale:
            stop += 1
        if stop - j > 1:
            Y[:, j:stop] = np.linalg.qr(Y[:, j:stop])[0]
        j = stop
    return theta, Y


def _block_lanczos(apply, n, dtype, device, m, extra, top, tol, residual_factor, max_dim, max_steps=None,
                   far_end=False):
    """Block Lanczos on the symmetric operator ``apply`` (block size 8, full reorthogonalization)
    for its ``m`` largest (``top``) or smallest Ritz pairs and ``extra`` more; see
    :func:`_solve_krylov`. ``residual_factor(theta)`` turns the Lanczos estimate ``||B_J y_last||``
    into the relative residual the caller tests against ``tol``. Returns ``(theta, X, products,
    converged)``, ``theta`` ordered from the wanted end."""
    b = _KRYLOV_BLOCK
    eps = torch.finfo(dtype).eps
    max_dim = max(b, min(max_dim // b * b, (n - 1) // b * b))
    want = m + max(0, min(extra, max_dim // 4 - m))
    Q = torch.empty(n, max_dim + b, dtype=dtype, device=device)
    Z0 = _random_block(n, b, dtype, device)
    Q[:, :b] = torch.linalg.qr(Z0)[0]
    band = np.zeros((b + 1, max_dim + b))
    previous_B = None
    products = 0
    next_check = max(3 * want, 10 * b) if max_steps is None else max_steps * b
    history: list[tuple[int, float]] = []
    step = 0
    scale = None
    while True:
        lo, hi = step * b, (step + 1) * b
        Z = apply(Q[:, lo:hi])
        products += b
        if previous_B is not None:
            Z.addmm_(Q[:, lo - b:lo], previous_B.mT, alpha=-1)
        H = Q[:, :hi].mT @ Z
        Z.addmm_(Q[:, :hi], H, alpha=-1)
        diagonal_block = H[lo:hi].double()
        diagonal_block = ((diagonal_block + diagonal_block.mT) / 2).cpu().numpy()
        if scale is None:
            scale = max(float(np.abs(diagonal_block).max()), float(torch.linalg.vector_norm(Z, dim=0).max()), 1e-300)
        Q_next, B_next = torch.linalg.qr(Z)
        dependent = torch.diagonal(B_next).abs() <= 100 * eps * scale
        if bool(dependent.any()):
            # (partial) breakdown: the new block is (nearly) dependent on the basis. The dependent
            # directions continue with fresh random vectors orthogonal to everything so far (their
            # rows of B are zero, so T = Q^T A Q stays exact); the Krylov space so far is invariant
            # in those directions.
            B_next[dependent] = 0
            fresh = _random_block(n, b, dtype, device, seed=_SEED + 11 + step)
            for _ in range(2):
                fresh = fresh - Q[:, :hi] @ (Q[:, :hi].mT @ fresh)
                fresh = fresh - Q_next[:, ~dependent] @ (Q_next[:, ~dependent].mT @ fresh)
            Q_next[:, dependent] = torch.linalg.qr(fresh[:, dependent])[0]
        B_np = B_next.double().cpu().numpy()
        for d in range(b):
            band[d, lo:hi - d] = np.diagonal(diagonal_block, -d)
        for d in range(1, b + 1):  # T[hi + i, lo + j] = B[i, j] (upper triangular) at distance b + i - j
            i = np.arange(0, d)
            band[d, lo + i + b - d] = B_np[i, i + b - d]
        dim = hi
        last = dim + b > max_dim or (max_steps is not None and step + 1 >= max_steps)
        if dim >= next_check or last:
            theta, Y = _banded_ritz(band, dim, m, top)
            residual_norms = np.linalg.norm(B_np @ Y[dim - b:dim, :], axis=0)
            estimates = residual_norms * residual_factor(theta)
            worst = float(estimates[:m].max())
            if far_end:  # a locating run: the Ritz values, and the one at the other end
                import scipy.linalg

                ends = scipy.linalg.eig_banded(np.ascontiguousarray(band[:, :dim]), lower=True, eigvals_only=True,
                                               select="i", select_range=(0, 0) if top else (dim - 1, dim - 1),
                                               check_finite=False)
                return (theta, float(ends[0]), residual_norms), None, products, False
            if worst <= 0.5 * tol or last:
                theta, Y = _banded_ritz(band, dim, want, top)
                Yt = torch.from_numpy(Y).to(dtype=dtype, device=device)
                X = Q[:, :dim] @ Yt
                return theta, X, products, worst <= 0.5 * tol
            history.append((dim, math.log(max(worst, 1e-300))))
            # the estimates fall faster than geometrically (superlinear convergence): a straight-line
            # extrapolation of their logarithm overestimates the dimension still needed, so aim a
            # little short of it, and grow by at most half the basis between checks
            grow = max(b, dim // 2)
            if len(history) >= 2:
                (d0, e0), (d1, e1) = history[-2], history[-1]
                rate = (e1 - e0) / (d1 - d0)
                if rate < 0:
                    needed = (math.log(0.5 * tol) - e1) / rate
                    grow = int(min(max(0.75 * needed, 2 * b), dim // 2))
            next_check = dim + grow
        Q[:, hi:hi + b] = Q_next
        previous_B = B_next
        step += 1


def _solve_krylov(A: torch.Tensor, m: int, extra: int, largest: bool, tol: float, normA: float) -> _KrylovResult:
    """The ``m`` extreme eigenpairs (and ``extra`` more Ritz pairs) of a dense symmetric matrix by
    block Lanczos with full reorthogonalization, on ``(sigma I - A)^{-1}`` where possible.

    Block size ``b = 8``: a product with an n x 8 block costs little more than a matrix-vector
    product (both stream the matrix once), so the block method needs fewer passes over ``A`` than
    single-vector Lanczos. Each new block is orthogonalized by the three-term recurrence, then once
    against the whole basis (classical Gram–Schmidt in two GEMMs), then by a QR. The Ritz pairs come
    from the block-tridiagonal ``T`` by LAPACK's banded eigensolver (eigenvalues) and inverse
    iteration (the few eigenvectors wanted), at checks scheduled by extrapolating the decay of the
    Ritz residual estimates ``||B_J y_last||``.

    Spectral transformation: 6 block steps locate the wanted end (Ritz value ``theta_1``, its residual
    norm ``r_1``, the spread ``delta`` of the m wanted eigenvalues extrapolated from the first 8 Ritz
    values) and the far end of the spectrum. When the wanted eigenvalues span a small part of the
    spectrum (``4 delta <= (lambda_1 - lambda_n) / 4``) a Cholesky factorization of ``s (sigma I - A)``
    with ``sigma = theta_1 + s (r_1 + delta / 2)`` (``s = +1`` largest, ``-1`` smallest; moved further
    out and retried when the factorization shows ``sigma`` inside the spectrum) turns the wanted
    eigenvalues into the largest of ``(s (sigma - A))^{-1}``, better separated: block Lanczos with two
    triangular solves per step then needs a fraction of the passes. Measured n = 2000, GOE, k = 8 (2 CPU threads): 80
    passes over ``A`` (basis 640, 0.18 s) without, 6 + 20 passes and one Cholesky (0.09 s) with.
    Without a successful factorization, or if the transformed run does not converge, plain block
    Lanczos on ``A`` runs. No restarts: the basis grows to ``min(0.6 n, 1600)``; ``converged`` is
    False when that is not enough (the caller then uses the direct solver)."""
    n = A.shape[0]
    dtype, device = A.dtype, A.device
    max_dim = min(int(_KRYLOV_MAX_FRACTION * n), _KRYLOV_MAX_DIM)
    outer = 1.0 if largest else -1.0
    products = 0

    def plain_factor(theta):
        return 1.0 / (normA + np.abs(theta))

    # 1. locate the wanted end (and estimate the far end)
    theta, X, used, _ = _block_lanczos(lambda Y: A @ Y, n, dtype, device, m, 0, largest, tol, plain_factor,
                                       max_dim, max_steps=_KRYLOV_LOCATE_STEPS, far_end=True)
    theta, far, residual_norms = theta
    products += used
    # after a few steps only about a block's worth of Ritz values are near their limit: extrapolate
    # the spread of the m wanted eigenvalues from the first min(m, b) of them
    q = max(2, min(m, _KRYLOV_BLOCK, len(theta)))
    delta = max(abs(float(theta[0]) - float(theta[q - 1])) * m / q, 1e-3 * normA)
    # 2. a shift beyond the wanted end, proven by a Cholesky factorization. The transformation pays
    # when the wanted eigenvalues span a small part of the spectrum: the relative gap after the m-th
    # becomes about g / (4 delta) instead of g / (lambda_1 - lambda_n), so fewer passes by roughly
    # sqrt((lambda_1 - lambda_n) / (4 delta)), each costing two triangular solves instead of a GEMM
    spread = abs(float(theta[0]) - far)
    L = None
    attempts = 3 if 4.0 * delta * _KRYLOV_SHIFT_INVERT_GAIN <= spread else 0
    # theta_1 + ||r_1|| usually bounds the wanted end (an eigenvalue lies within ||r_1|| of theta_1,
    # and the Ritz value approaches the extreme eigenvalue from inside); delta / 2 beyond it
    reach = float(residual_norms[0])
    for _attempt in range(attempts):
        sigma = float(theta[0]) + outer * (reach + 0.5 * delta)
        C = -outer * A
        C.diagonal().add_(outer * sigma)
        L, info = torch.linalg.cholesky_ex(C)
        del C
        if int(info) == 0:
            break
        L = None
        reach, delta = reach + delta, 2.0 * delta
    if L is not None:
        norm_shifted = abs(sigma) + normA

        def inverse(Y):  # two triangular solves: twice as fast as torch.cholesky_solve here
            return torch.linalg.solve_triangular(L.mT, torch.linalg.solve_triangular(L, Y, upper=False), upper=True)

        def inverse_factor(nu):
            nu = np.maximum(np.abs(nu), 1e-300)
            lam = sigma - outer / nu
            return norm_shifted / (nu * (normA + np.abs(lam)))

        nu, X, used, converged = _block_lanczos(inverse, n, dtype, device, m, extra, True, tol, inverse_factor,
                                                max_dim // 2)
        products += used
        if converged:
            lam = sigma - outer / torch.from_numpy(nu)
            return _KrylovResult(lam.to(dtype=dtype, device=device), X, products, True)
    # 3. plain block Lanczos on A
    theta, X, used, converged = _block_lanczos(lambda Y: A @ Y, n, dtype, device, m, extra, largest, tol,
                                               plain_factor, max_dim)
    products += used
    return _KrylovResult(torch.from_numpy(np.ascontiguousarray(theta)).to(dtype=dtype, device=device), X,
                         products, converged)


# ---------------------------------------------------------------------------------------------------
# LOBPCG route (torch, any device)
# ---------------------------------------------------------------------------------------------------
def _b_gram_cholesky(G: torch.Tensor) -> torch.Tensor:
    """Cholesky factor of a Gram matrix ``Z^H B Z``; raises when it proves ``B`` indefinite."""
    G = (G + G.mH) / 2
    L, info = torch.linalg.cholesky_ex(G)
    if int(info) == 0:
        return L
    eigenvalues = torch.linalg.eigvalsh(G)
    if float(eigenvalues[0]) < -math.sqrt(torch.finfo(G.dtype).eps) * float(eigenvalues.abs().max()):
        raise _not_positive_definite(
            f"found a direction with Rayleigh quotient x^T B x / x^T x = {float(eigenvalues[0]):.3e} < 0"
        )
    # numerically rank-deficient basis: regularise minimally (the caller drops tiny directions first)
    shift = torch.finfo(G.dtype).eps * float(eigenvalues.abs().max()) * G.shape[0]
    return torch.linalg.cholesky(G + shift * torch.eye(G.shape[0], dtype=G.dtype, device=G.device))


def _b_orthonormalize_svqb(S, BS, drop_rtol):
    """SVQB: ``T`` with ``(S T)^H B (S T) = I``, dropping directions with tiny B-norm.

    ``T`` may have fewer columns than ``S``. Raises when a column of ``S`` has a negative Rayleigh
    quotient ``s^H B s / s^H s`` (``B`` indefinite).
    """
    G = S.mH @ BS
    G = (G + G.mH) / 2
    quotients = torch.diagonal(G).real / torch.linalg.vector_norm(S, dim=0).square().clamp_min(torch.finfo(G.dtype).tiny)
    largest = float(quotients.abs().max()) if quotients.numel() else 0.0
    if quotients.numel() and float(quotients.min()) < -math.sqrt(drop_rtol) * largest:
        raise _not_positive_definite(
            f"found a direction with Rayleigh quotient x^T B x / x^T x = {float(quotients.min()):.3e} < 0"
        )
    usable = quotients > drop_rtol * largest
    if not bool(usable.any()):
        return S.new_zeros(S.shape[1], 0)
    columns = torch.nonzero(usable).flatten()
    G = G[columns][:, columns]
    d = torch.diagonal(G).real.rsqrt()
    Gs = G * d[:, None] * d[None, :]
    lam, V = torch.linalg.eigh(Gs)
    if float(lam[0]) < -max(drop_rtol, 1e-6) * float(lam[-1]):
        raise _not_positive_definite(
            f"found a direction with scaled Rayleigh quotient {float(lam[0]):.3e} < 0"
        )
    keep = lam > drop_rtol * lam[-1]
    T_usable = (d[:, None] * V[:, keep]) * lam[keep].rsqrt()
    T = S.new_zeros(S.shape[1], T_usable.shape[1])
    return T.index_copy(0, columns, T_usable)


def _solve_lobpcg(opA, opB, m, largest, tol, maxiter, normA, normB, *, k=None, X0=None, seed=_SEED):
    """``m`` extreme pairs by block LOBPCG; returns ``(w, U, iterations, products)``. ``X0``: start
    vectors (completed by random ones to the block size); ``k``: the pairs the caller asked for
    (errors name it and report their residual)."""
    n = opA.shape[0]
    k = m if k is None else k
    dtype, device = opA.dtype, opA.device
    eps = torch.finfo(dtype).eps
    drop_rtol = 100 * eps
    sign = -1.0 if largest else 1.0  # minimise sign * A
    block = max(m, min(2 * m, n // 3))
    if maxiter is None:
        maxiter = _LOBPCG_DEFAULT_MAXITER
    products = 0

    def rayleigh_ritz(Z, AZ, BZ):
        L = _b_gram_cholesky(Z.mH @ BZ)
        H = Z.mH @ AZ
        H = (H + H.mH) / 2
        Hr = torch.linalg.solve_triangular(L, H, upper=False)
        Hr = torch.linalg.solve_triangular(L, Hr.mH, upper=False)
        theta, C = torch.linalg.eigh(sign * (Hr + Hr.mH) / 2)
        C = torch.linalg.solve_triangular(L.mH, C, upper=True)
        return sign * theta, C

    def combine(Y, BY, C):
        """``(Y C, B Y C)`` without a second product when ``B`` is the identity."""
        YC = Y @ C
        return YC, (YC if opB is None else BY @ C)

    X = _random_block(n, block, dtype, device, seed)
    if X0 is not None:
        start = X0.to(dtype=dtype, device=device)[:, :block]
        X = torch.cat([start, X[:, start.shape[1]:]], dim=1)
    BX = _apply_B(opB, X)
    T = _b_orthonormalize_svqb(X, BX, drop_rtol)
    X, BX = combine(X, BX, T)
    AX = opA.matmul(X)
    products += X.shape[1]
    theta, C = rayleigh_ritz(X, AX, BX)
    (X, BX), AX = combine(X, BX, C[:, :block]), AX @ C[:, :block]
    theta = theta[:block]
    P = None
    residual = torch.full((block,), math.inf, dtype=dtype.to_real(), device=device)
    for iteration in range(1, maxiter + 1):
        R = AX - BX * theta
        scale = (normA + theta.abs() * normB) * torch.linalg.vector_norm(X, dim=0)
        residual = torch.linalg.vector_norm(R, dim=0) / scale.clamp_min(torch.finfo(dtype).tiny)
        converged = residual <= tol
        if bool(converged[:m].all()):
            return theta[:m], X[:, :m], iteration - 1, products
        active = ~converged
        active[m:] = True  # guard vectors keep improving the wanted ones
        W = R[:, active]
        S = W if P is None else torch.cat([W, P], dim=1)
        for _ in range(2):  # B-orthogonalise against X (twice is enough)
            S = S - X @ (BX.mH @ S)
        BS = _apply_B(opB, S)
        T = _b_orthonormalize_svqb(S, BS, drop_rtol)
        if T.shape[1] == 0:
            break
        S, BS = combine(S, BS, T)
        AS = opA.matmul(S)
        products += S.shape[1]
        Z, AZ = torch.cat([X, S], 1), torch.cat([AX, AS], 1)
        BZ = Z if opB is None else torch.cat([BX, BS], 1)
        theta_all, C = rayleigh_ritz(Z, AZ, BZ)
        C = C[:, :block]
        (X, BX), AX = combine(Z, BZ, C), AZ @ C
        theta = theta_all[:block]
        C_rest = C[block:]
        P = S @ C_rest
    raise ConvergenceError(
        f"partial_eigh: LOBPCG did not converge for the {k} wanted eigenpairs of an n = {n} problem",
        method="lobpcg", residual=float(residual[:k].max()), tol=tol, iterations=maxiter,
    )


# ---------------------------------------------------------------------------------------------------
# certification: no eigenvalue skipped
# ---------------------------------------------------------------------------------------------------
#: A certifying factorization is used when its estimated flops are at most this multiple of the
#: flops of the products the iterative solve spent (BLAS-3 / sparse-direct kernels run many times
#: faster per flop than matvecs, so this keeps its time a small fraction of the solve's).
_CERTIFY_COST_RATIO = 20.0
#: Dense input is certified by one Cholesky factorization of an n x n matrix up to this size.
_CERTIFY_DENSE_MAX_N = 8000
#: A count above the expected one by more than this (or 2 m) is not repaired, it raises.
_CERTIFY_MAX_EXTRA = 40
_CERTIFY_MAX_ROUNDS = 4


def _explicit(op: LinearOperator | None) -> bool:
    """Whether ``op`` is a matrix we can factor on the CPU (``None`` stands for the identity)."""
    return op is None or (op.kind != "operator" and op.device.type == "cpu")


def _scipy_csr(op: LinearOperator | None, n: int, dtype):
    import scipy.sparse as sp

    if op is None:
        return sp.identity(n, dtype=dtype, format="csr")
    M = op.to_scipy()
    return sp.csr_matrix(M)


def _envelope_flops(pattern) -> float:
    """``sum_i b_i^2`` over the rows of the reverse-Cuthill–McKee ordered pattern (``b_i``: distance
    from the diagonal to the row's first entry): the flops of a band ``LDL^T`` in that order, an
    estimate from above of a minimum-degree factorization's."""
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    pattern = pattern.tocsr()
    order = reverse_cuthill_mckee(pattern, symmetric_mode=True)
    P = pattern[order][:, order].tocsr()
    n = P.shape[0]
    rows = np.repeat(np.arange(n), np.diff(P.indptr))
    first = np.arange(n)
    np.minimum.at(first, rows, P.indices)
    band = (np.arange(n) - first).astype(np.float64)
    return float(np.dot(band, band))


def _certification_kind(opA: LinearOperator, opB: LinearOperator | None, products: int) -> str | None:
    """``"dense"`` (Cholesky test), ``"sparse"`` (inertia of a sparse ``LDL^T``) or ``None`` (no
    affordable factorization: matvec closures, non-CPU tensors, too much fill)."""
    if not (_explicit(opA) and _explicit(opB)):
        return None
    n = opA.shape[0]
    products = max(int(products), 1)
    if opA.kind == "dense" or (opB is not None and opB.kind == "dense"):
        if n > _CERTIFY_DENSE_MAX_N:
            return None
        return "dense" if n ** 3 / 3 <= _CERTIFY_COST_RATIO * 2.0 * n * n * products else None
    As = _scipy_csr(opA, n, None)
    pattern = abs(As)
    if opB is not None:
        pattern = pattern + abs(_scipy_csr(opB, n, None))
    if _envelope_flops(pattern) <= _CERTIFY_COST_RATIO * 2.0 * As.nnz * products:
        return "sparse"
    return None


def _error_bounds(w, residuals, normA, normB, eps):
    """Per pair, a bound (with a safety factor) on the distance from ``w_i`` to the eigenvalue it
    approximates: 10 times the absolute residual, plus rounding."""
    scale = normA + w.abs() * normB
    return 10.0 * residuals * scale + 100.0 * eps * scale


def _certification_shift(theta: np.ndarray, delta: np.ndarray, k: int, outer: float, scale: float, eps: float):
    """``(sigma, expected)``: a shift and the number of eigenvalues beyond it (on the wanted side)
    that the pairs ``theta`` (ordered from the wanted end) claim.

    Between the k-th and (k+1)-th pair when they are clearly apart (expected ``k``); otherwise in
    front of the cluster of pairs that the k-th belongs to (the pairs inside a cluster are
    interchangeable, so only the eigenvalues in front of it must be counted)."""
    if abs(theta[k - 1] - theta[k]) > 2.0 * (delta[k - 1] + delta[k]):
        return 0.5 * (theta[k - 1] + theta[k]), k
    j = k - 1
    while j > 0 and abs(theta[j - 1] - theta[j]) <= 2.0 * (delta[j - 1] + delta[j]):
        j -= 1
    if j > 0:
        return 0.5 * (theta[j - 1] + theta[j]), j
    margin = max(4.0 * delta[0] + abs(theta[0] - theta[k]), math.sqrt(eps) * scale)
    return theta[0] + outer * margin, 0


def _dense_certificate(opA, opB, U, theta, sigma, expected, largest, dist):
    """Whether exactly ``expected`` eigenvalues lie beyond ``sigma``, by one Cholesky factorization
    (float64): the factor ``L`` when they do, else ``None``.

    With ``s = +1`` (smallest) or ``-1`` (largest), ``C = s (A - sigma B) + BU diag(s (sigma - theta) +
    tau) (BU)^T`` (``U``: the ``expected`` pairs beyond ``sigma``) equals ``s (A - sigma B)`` on the
    B-orthogonal complement of ``U`` and ``tau B`` on ``U``. It is positive definite iff no other
    eigenvalue lies beyond ``sigma``. The factor also preconditions the backward's shifted solves
    (:class:`~adjointgen.runtime.linsolve.DenseFactorAid`)."""
    s = -1.0 if largest else 1.0
    A = _wide(_dense_matrix(opA))
    B = None if opB is None else _wide(_dense_matrix(opB))
    C = (s * A).clone()
    if B is None:
        C.diagonal().sub_(s * sigma)
    else:
        C.sub_(B, alpha=s * sigma)
    if expected:
        Ue = _wide(U[:, :expected])
        BU = Ue if B is None else B @ Ue
        c = s * (sigma - theta[:expected].double()) + dist
        C.addmm_(BU * c, BU.mH)
    L, info = torch.linalg.cholesky_ex(C)
    return L if int(info) == 0 else None


def _sparse_count(Ms, largest, scale, dist, generator) -> tuple[int | None, Any]:
    """The number of eigenvalues beyond ``sigma`` from the pivots of a symmetric sparse
    ``LDL^T`` of ``Ms = A - sigma B`` (Sylvester's law of inertia), and the factorization; ``None``
    for the count when the factorization cannot be trusted (off-diagonal pivots, or a backward error
    not small against the distance from ``sigma`` to the spectrum)."""
    try:
        lu = _sparse_lu(Ms)
    except RuntimeError:  # exactly singular: sigma is an eigenvalue
        return None, None
    if not np.array_equal(lu.perm_r, lu.perm_c):
        return None, lu
    pivots = np.real(lu.U.diagonal())  # Hermitian M: the pivots of L D L^H are real
    b = generator.standard_normal(Ms.shape[0])
    x = lu.solve(b)
    backward_error = np.linalg.norm(Ms @ x - b) / (scale * np.linalg.norm(x) + np.linalg.norm(b))
    if not (np.all(np.isfinite(pivots)) and backward_error * scale <= 0.1 * dist):
        return None, lu
    return int((pivots > 0).sum() if largest else (pivots < 0).sum()), lu


def _shift_invert_beyond(opA, opB, lu, sigma, count, largest, tol):
    """All ``count`` eigenpairs beyond ``sigma`` by ARPACK in shift-invert mode with the
    factorization ``lu`` of ``A - sigma B``: they are the ``count`` extreme values of
    ``1/(lambda - sigma)`` on that side (negative for the smallest, positive for the largest), far
    from the rest."""
    import scipy.sparse.linalg as spla

    n = opA.shape[0]
    # in float64 (complex128) whatever the input's precision (the factorization is, see _certify_explicit)
    wide = np.complex128 if opA.dtype.is_complex else np.float64
    OPinv = spla.LinearOperator((n, n), matvec=lu.solve, rmatvec=lu.solve, dtype=wide)
    kwargs: dict[str, Any] = {} if opB is None else {"M": _scipy_csr(opB, n, None).astype(wide)}
    v0 = np.random.default_rng(_SEED + 2).uniform(-1.0, 1.0, n).astype(wide)
    tol = max(tol, 1e-15)
    try:
        w, V = spla.eigsh(
            _scipy_csr(opA, n, None).astype(wide), k=count, sigma=sigma, which="LA" if largest else "SA",
            OPinv=OPinv, ncv=min(n, max(2 * count + 1, count + 20)), tol=0.1 * tol, v0=v0, **kwargs,
        )
    except spla.ArpackError as exc:
        raise ConvergenceError(
            f"partial_eigh: repairing skipped eigenvalues (shift-invert ARPACK at {sigma:.6g}) failed: {exc}",
            method="arpack", residual=math.inf, tol=tol, iterations=0,
        ) from None
    w, V = torch.from_numpy(np.ascontiguousarray(w)), torch.from_numpy(np.ascontiguousarray(V))
    if V.is_complex():  # the Arnoldi driver's vectors: B-orthonormal by Rayleigh-Ritz
        w, V = _hermitian_ritz(opA, opB, w, V.to(opA.dtype), largest)
    return w, V


class _Uncertain(Exception):
    """The certifying factorization could not decide (numerically unreliable): check otherwise."""


def _skipped_error(k, n, count, expected, sigma, side):
    return ConvergenceError(
        f"partial_eigh: the iterative solver skipped eigenvalues: {count} eigenvalues lie {side} "
        f"{sigma:.6g} (by the inertia of a factorization), the solver found {expected}; too many to "
        f"recover here for k = {k}, n = {n} (pass method='dense', or a larger k)",
        method="inertia", residual=math.inf, tol=0.0, iterations=0,
    )


def _certify_explicit(kind, opA, opB, w, U, k, m, largest, tol, normA, normB):
    """Certify (and where needed repair) ``m`` ordered pairs of an explicit CPU problem.

    Returns ``(w, U, certificate, method, factor)``: ``certificate`` is ``"inertia"`` (the count
    beyond the shift matched), or ``"repaired"`` (eigenvalues had been skipped; the pairs were
    recomputed and the count then matched); ``method`` is the route that produced the returned pairs
    (``None``: unchanged); ``factor`` the certifying factorization at a shift between the k-th and
    (k+1)-th pair (``None`` when the shift lay elsewhere), which preconditions the backward."""
    n = opA.shape[0]
    eps = torch.finfo(w.dtype).eps
    outer = 1.0 if largest else -1.0
    side = "above" if largest else "below"
    generator = np.random.default_rng(_SEED + 3)
    certificate = "inertia"
    for _round in range(_CERTIFY_MAX_ROUNDS):
        residuals = _relative_residuals(opA, opB, w, U, normA, normB)
        delta = _error_bounds(w, residuals, normA, normB, eps).cpu().numpy()
        theta = w.cpu().numpy()
        scale_k = normA + abs(float(theta[k - 1])) * normB
        sigma, expected = _certification_shift(theta, delta, k, outer, scale_k, eps)
        dist = float(np.min(np.abs(theta - sigma)))
        scale = normA + abs(sigma) * normB
        if kind == "dense":
            L = _dense_certificate(opA, opB, U, w, sigma, expected, largest, dist)
            if L is not None:
                factor = {"kind": "dense", "L": L, "sign": -outer} if expected == k else None
                return w, U, certificate, ("dense" if certificate == "repaired" else None), factor
            # skipped eigenvalues: the direct solver computes the wanted pairs by index
            w, U = _solve_dense(opA, opB, m, largest)
            w, U = _order(w.to(opA.dtype.to_real()), U.to(opA.dtype), largest)
            return w, U, "repaired", "dense", None
        # factored in float64 (complex128) whatever the input's precision: the count must not suffer
        # from float32
        wide = np.complex128 if opA.dtype.is_complex else np.float64
        As = _scipy_csr(opA, n, None).astype(wide)
        Bs = _scipy_csr(opB, n, np.float64).astype(wide)
        Ms = (As - sigma * Bs).tocsc()
        count, lu = _sparse_count(Ms, largest, scale, dist, generator)
        if count is None:  # not trustworthy at this shift: move it a little and retry once
            sigma2 = sigma + outer * 0.25 * dist
            Ms = (As - sigma2 * Bs).tocsc()
            count, lu = _sparse_count(Ms, largest, scale, 0.5 * dist, generator)
            sigma = sigma2
            if count is None:  # the factorization cannot decide: the caller asks for a second opinion
                raise _Uncertain(f"the symmetric LDL^T of A - sigma B at sigma = {sigma:.6g} is not reliable")
        if count == expected:
            factor = None
            if expected == k:
                factor = {"kind": "sparse", "lu": lu, "sigma": float(sigma), "A": As, "B": Bs, "sign": -outer}
            return w, U, certificate, None, factor
        if count < expected or count > max(2 * m, expected + _CERTIFY_MAX_EXTRA) or count >= n - 1:
            if count < expected:  # fewer than the computed pairs: the count is not trustworthy
                raise _Uncertain(f"the inertia of A - sigma B at sigma = {sigma:.6g} counts {count} eigenvalues "
                                 f"{side} it, fewer than the {expected} computed ones")
            raise _skipped_error(k, n, count, expected, sigma, side)
        # eigenvalues were skipped: all `count` pairs beyond sigma by shift-invert with this
        # factorization, plus the computed pairs on the near side of sigma
        w_new, U_new = _shift_invert_beyond(opA, opB, lu, sigma, count, largest, float(tol))
        w_new, U_new = w_new.to(w.dtype), U_new.to(U.dtype)
        near = (w < sigma) if largest else (w > sigma)
        w = torch.cat([w_new, w[near]])
        U = torch.cat([U_new, U[:, near]], dim=1)
        w, U = _order(w, U, largest)
        w, U = w[:m].contiguous(), U[:, :m].contiguous()
        certificate = "repaired"
    raise ConvergenceError(
        f"partial_eigh: could not certify that no eigenvalue was skipped after {_CERTIFY_MAX_ROUNDS} "
        "repairs (pass method='dense')", method="inertia", residual=math.inf, tol=0.0, iterations=0,
    )


def _second_opinion(opA, opB, w, U, k, m, largest, tol, maxiter, normA, normB):
    """For problems without an affordable factorization: an independent block LOBPCG run (other
    start vectors) on the pencil with the ``m`` computed pairs deflated (moved far to the other end by
    ``A -> A -+ s (BU)(BU)^T``). Its extreme Ritz value is an eigenvalue estimate of the
    not-yet-found spectrum: beyond the m-th computed pair it proves a skipped eigenvalue, and the
    pairs are recomputed (LOBPCG started from the computed and the new vectors) and checked again.

    Returns ``(w, U, certificate)`` with ``certificate`` ``"second-opinion"`` or ``"repaired"``;
    raises :class:`ConvergenceError` when the check cannot converge or the repairs do not settle."""
    n = opA.shape[0]
    dtype, device = U.dtype, w.device
    eps = torch.finfo(dtype).eps
    check_tol = max(float(tol), math.sqrt(eps))
    certificate = "second-opinion"
    m_check = min(2, n - m)
    if m_check < 1 or 3 * (m_check + 1) > n:  # too small to check: solve it directly (tiny n)
        w, U = _solve_dense(opA, opB, m, largest)
        w, U = _order(w.to(dtype=dtype.to_real(), device=device), U.to(dtype=dtype, device=device), largest)
        return w, U, "direct"
    for _round in range(_CERTIFY_MAX_ROUNDS):
        BU = _apply_B(opB, U)
        shift = 2.0 * (normA + float(w.abs().max()) * normB) + float((w[0] - w[-1]).abs())
        signed_shift = -shift if largest else shift

        def deflated(X, _BU=BU, _shift=signed_shift):
            return opA.matmul(X) + _shift * (_BU @ (_BU.mH @ X))

        op = LinearOperator(deflated, opA.shape, dtype=dtype, device=device)
        try:
            mu, Y, _, _ = _solve_lobpcg(op, opB, m_check, largest, check_tol, maxiter, normA + shift, normB,
                                        seed=_SEED + 1 + _round)
        except ConvergenceError as exc:
            raise ConvergenceError(
                "partial_eigh: could not confirm that the iterative solver skipped no eigenvalue (the "
                f"independent LOBPCG check on the deflated operator did not converge: {exc}); pass "
                "method='dense' for small problems or a tighter maxiter", method="lobpcg",
                residual=exc.residual, tol=exc.tol, iterations=exc.iterations,
            ) from None
        residuals = _relative_residuals(opA, opB, w, U, normA, normB)
        delta = _error_bounds(w, residuals, normA, normB, eps)
        extreme = float(mu.max() if largest else mu.min())
        bound = float(w[m - 1] + (delta[m - 1] if largest else -delta[m - 1]))
        skipped = extreme > bound if largest else extreme < bound
        if not skipped:
            return w, U, certificate
        start = torch.cat([Y, U], dim=1)
        w, U, _, _ = _solve_lobpcg(opA, opB, m, largest, float(tol), maxiter, normA, normB, k=k, X0=start,
                                   seed=_SEED + 7 + _round)
        w, U = _order(w, U, largest)
        certificate = "repaired"
    raise ConvergenceError(
        f"partial_eigh: could not confirm that no eigenvalue was skipped after {_CERTIFY_MAX_ROUNDS} "
        "repairs (pass method='dense')", method="lobpcg", residual=math.inf, tol=float(tol), iterations=0,
    )


def _lazy_dense_aid(opA, opB, w, U, k, largest, extra, normA, normB):
    """For the direct route: a :class:`~adjointgen.runtime.linsolve.DenseFactorAid` whose Cholesky
    factor (at a shift between the k-th and (k+1)-th eigenvalue) is computed only if a backward runs,
    with the extra eigenpairs as deflation space; ``None`` when the gap is not clean."""
    from .linsolve import DenseFactorAid

    eps = torch.finfo(w.dtype).eps
    residuals = _relative_residuals(opA, opB, w, U, normA, normB)
    delta = _error_bounds(w, residuals, normA, normB, eps)
    if not float((w[k - 1] - w[k]).abs()) > 2.0 * float(delta[k - 1] + delta[k]):
        return None
    sigma = 0.5 * float(w[k - 1] + w[k])
    dist = 0.5 * float((w[k - 1] - w[k]).abs())
    outer = 1.0 if largest else -1.0
    W = extra[1] if extra is not None and extra[1].shape[1] else None
    return DenseFactorAid(None, -outer, W,
                          factor=lambda: _dense_certificate(opA, opB, U, w, sigma, k, largest, dist))


def _backward_aid(factor, w, U, k, extra):
    """The :class:`~adjointgen.runtime.linsolve.ShiftedSolveAid` for the backward of these pairs."""
    from .linsolve import DenseFactorAid, SparseFactorAid

    if factor is None:
        return None
    if factor["kind"] == "dense":
        W = None
        if extra is not None and extra[1].shape[1]:
            W = extra[1]
        return DenseFactorAid(factor["L"], factor["sign"], W)
    return SparseFactorAid(factor["A"], factor["B"], factor["sign"], float(w[k]), {factor["sigma"]: factor["lu"]})


# ---------------------------------------------------------------------------------------------------
# public entry points
# ---------------------------------------------------------------------------------------------------
def _choose_method(opA: LinearOperator, opB: LinearOperator | None, k: int) -> str:
    n = opA.shape[0]
    if n <= DENSE_MAX_N or 3 * k >= n or k >= n - 1:
        return "dense"
    dense_input = opA.kind == "dense" and (opB is None or opB.kind == "dense")
    if (opA.kind == "dense" and opB is None and opA.device.type == "cpu" and n > _FULL_SPECTRUM_MAX_N
            and 4 * (k + 1 + _KRYLOV_EXTRA) <= n and not opA.dtype.is_complex):
        return "krylov"
    if dense_input and n <= DENSE_INPUT_MAX_N:
        return "dense"
    if opA.device.type == "cpu" and (opB is None or opB.kind != "operator"):
        return "arpack"
    return "lobpcg"


def partial_eigh(
    A: Any,
    k: int,
    B: Any = None,
    *,
    largest: bool = True,
    tol: float | None = None,
    maxiter: int | None = None,
    method: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, PartialEighInfo]:
    """The ``k`` largest (or smallest) eigenpairs of ``A U = B U D``, ``U^T B U = I``.

    Runs without autograd (the gradient comes from the generated rules). A single, unbatched
    problem; see :func:`partial_eigh_batched` for dense batches.

    Args:
        A: symmetric ``(n, n)`` matrix: dense or sparse (COO/CSR) torch tensor, numpy/scipy matrix,
            or :class:`~adjointgen.runtime.linear_operator.LinearOperator` (``symmetric=True``);
            float32/float64, or complex64/complex128 and Hermitian.
        k: number of eigenpairs, ``1 <= k <= n``.
        B: symmetric positive definite ``(n, n)`` matrix in any of the same forms, or ``None`` for
            the standard problem.
        largest: the ``k`` largest eigenvalues (returned descending) or the smallest (ascending).
        tol: bound on the relative residual of each pair (module docstring); default
            ``eps ** (2/3)`` of the dtype.
        maxiter: iteration cap of the iterative routes (ARPACK: restarts, default ``10 n``;
            LOBPCG: block iterations, default 5000). Ignored by the dense and krylov routes.
        method: ``None``/``"auto"`` (by size and device), ``"dense"``, ``"krylov"`` (dense ``A``
            without ``B``; otherwise the route ``"auto"`` would take for such input), ``"arpack"``
            (CPU solver; products of non-CPU operators are copied) or ``"lobpcg"``. ARPACK needs
            ``k <= n - 2`` and falls back to ``"dense"`` otherwise.

    Returns:
        ``(w, U, info)``: eigenvalues ``(k,)`` (real: float32/float64 also for complex input),
        B-orthonormal eigenvectors ``(n, k)`` (largest entry of each column real positive) on A's
        device and dtype, and a :class:`PartialEighInfo`.

    Raises:
        ValueError: non-square, mismatched shapes/dtypes/devices, k out of range (or not an
            integer), NaN/Inf entries, non-symmetric (non-Hermitian) input, ``B`` not positive
            definite.
        ConvergenceError: the measured residual exceeds the tolerance, or the iterative route's
            result can neither be certified nor repaired (a ``ValueError``; it reports the residual
            reached and the ``k`` asked for).

    Warns:
        UserWarning: the gap between the last kept and first discarded eigenvalue is below
            ``max(sqrt(eps), 10 tol) (||A|| + |d_k| ||B||)``: the eigenvectors, and any gradient
            through them, are ill-defined.
    """
    opA, opB = _prepare_operators(A, B)
    n = opA.shape[0]
    k = _check_k(k, n)
    dtype, device = opA.dtype, opA.device
    real_dtype = dtype.to_real()  # of the eigenvalues (complex Hermitian input: real eigenvalues)
    eps = torch.finfo(dtype).eps
    tol = _default_tol(dtype) if tol is None else float(tol)
    if not tol > 0:
        raise ValueError(f"partial_eigh: tol must be positive, got {tol}")
    tol = max(tol, 10 * eps)
    if method in (None, "auto"):
        method = _choose_method(opA, opB, k)
    if method not in ("dense", "krylov", "arpack", "lobpcg"):
        raise ValueError(
            f"partial_eigh: method must be None, 'auto', 'dense', 'krylov', 'arpack' or 'lobpcg', got {method!r}")
    if method == "krylov" and dtype.is_complex:
        method = _choose_method(opA, opB, k)  # block Lanczos's banded Ritz solver is real
    if method == "krylov" and (opA.kind != "dense" or opB is not None or 3 * (k + 1) > n):
        method = "dense" if opA.kind == "dense" or 3 * (k + 1) > n else "arpack"
    if method == "arpack" and k >= n - 1:
        method = "dense"
    if method == "lobpcg" and 3 * (k + 1) > n:
        method = "dense"
    if method == "arpack" and opB is not None and opB.kind == "operator":
        method = "lobpcg"  # ARPACK's mode 2 needs B^{-1}; LOBPCG needs only products with B
    m = min(k + 1, n)  # one extra pair measures the gap to the discarded spectrum

    with torch.no_grad():
        normA, normB = _estimate_norm(opA), _estimate_norm(opB)
        if not (math.isfinite(normA) and math.isfinite(normB)):
            raise ValueError("partial_eigh: A or B produced NaN or Inf in a product")
        iterations = products = 0
        extra = None  # Ritz pairs beyond the m wanted ones (krylov route): a deflation space
        spectral_aid = None
        if method == "krylov":
            result = _solve_krylov(_dense_matrix(opA), m, _KRYLOV_EXTRA, largest, tol, normA)
            products = iterations = result.products
            if result.converged:
                w, U = result.w[:m], result.U[:, :m]
                extra = (result.w[m:], result.U[:, m:])
                limit = tol
            else:  # the basis limit was reached: the direct solver takes over
                method = "dense"
        if method == "dense":
            # extra pairs beyond the m wanted ones deflate the backward's iterative solves (used
            # where those run: n above the bordered direct solve's size)
            from .solvers import DENSE_DIRECT_MAX_N

            p = min(_KRYLOV_EXTRA, n - m) if n > DENSE_DIRECT_MAX_N and m > k else 0
            full = (opB is None and opA.kind == "dense" and DENSE_DIRECT_MAX_N < n <= _FULL_SPECTRUM_MAX_N
                    and m > k)
            if full:
                # the whole spectrum (MKL through torch): the backward's solves become exact GEMMs
                from .linsolve import SpectralAid

                w_all, V_all = torch.linalg.eigh(_dense_matrix(opA))
                kept = torch.arange(n - k, n) if largest else torch.arange(k)
                spectral_aid = SpectralAid(w_all, V_all, kept.to(w_all.device), -1.0 if largest else 1.0)
                w, U = (w_all[n - m:], V_all[:, n - m:]) if largest else (w_all[:m], V_all[:, :m])
                p = 0
            else:
                w, U = _solve_dense(opA, opB, m + p, largest)
            w, U = w.to(device=device, dtype=real_dtype), U.to(device=device, dtype=dtype)
            if p:
                w, U = _order(w, U, largest)
                extra = (w[m:], U[:, m:])
                w, U = w[:m], U[:, :m]
            limit = max(tol, eps ** (1.0 / 3.0))
        elif method == "krylov":
            pass
        elif method == "arpack":
            limit = tol
            w, U, products = _solve_arpack(opA, opB, m, k, largest, tol, maxiter, normA, normB, limit)
            iterations = products
        else:
            limit = tol
            w, U, iterations, products = _solve_lobpcg(opA, opB, m, largest, tol, maxiter, normA, normB, k=k)
        w, U = w.to(device=device, dtype=real_dtype), U.to(device=device, dtype=dtype)
        if not bool(torch.isfinite(w).all() and torch.isfinite(U).all()):
            raise ConvergenceError(
                "partial_eigh: the solver returned NaN or Inf (is B positive definite? does the "
                "matvec return finite values?)", method=method, residual=math.inf, tol=limit,
                iterations=iterations,
            )
        w, U = _order(w, U, largest)
        _check_b_norms(opB, U[:, :k])
        residual = float(_relative_residuals(opA, opB, w[:k], U[:, :k], normA, normB).max())
        if method == "krylov" and not residual <= limit:  # the estimates misled: direct solver
            method, extra = "dense", None
            w, U = _solve_dense(opA, opB, m, largest)
            w, U = _order(w.to(device=device, dtype=real_dtype), U.to(device=device, dtype=dtype), largest)
            limit = max(tol, eps ** (1.0 / 3.0))
            residual = float(_relative_residuals(opA, opB, w[:k], U[:, :k], normA, normB).max())
        if not residual <= limit:
            raise ConvergenceError(
                f"partial_eigh: the {k} computed eigenpairs of an n = {n} problem have relative "
                f"residual {residual:.3e} > {limit:.3e}", method=method, residual=residual, tol=limit,
                iterations=iterations,
            )
        # no eigenvalue skipped: the direct solver computes the pairs by index; an iterative one is
        # certified by an inertia count where a factorization is affordable, else checked by an
        # independent deflated run
        certificate = "direct"
        aid = None
        if method == "dense" and spectral_aid is not None:
            aid = spectral_aid.bind(U[:, :k], w[:k])
        elif method == "dense" and extra is not None and opA.kind == "dense" and (opB is None or opB.kind == "dense"):
            aid = _lazy_dense_aid(opA, opB, w, U, k, largest, extra, normA, normB)
            if aid is not None:
                aid.bind(U[:, :k], w[:k])
        if method != "dense" and m > k:
            kind = _certification_kind(opA, opB, products)
            if kind is not None:
                try:
                    w, U, certificate, route, factor = _certify_explicit(
                        kind, opA, opB, w, U, k, m, largest, tol, normA, normB)
                except _Uncertain:
                    kind = None
                else:
                    if route is not None:
                        method = route
                        limit = max(tol, eps ** (1.0 / 3.0))
                    aid = _backward_aid(factor, w, U, k, extra if certificate != "repaired" else None)
                    if aid is not None:
                        aid.bind(U[:, :k], w[:k])
            if kind is None:
                w, U, certificate = _second_opinion(opA, opB, w, U, k, m, largest, tol, maxiter, normA, normB)
                if certificate == "repaired":
                    method = "lobpcg"
                elif certificate == "direct":
                    method, limit = "dense", max(tol, eps ** (1.0 / 3.0))
            w, U = w.to(device=device, dtype=real_dtype), U.to(device=device, dtype=dtype)
            if certificate in ("repaired", "direct"):
                _check_b_norms(opB, U[:, :k])
                residual = float(_relative_residuals(opA, opB, w[:k], U[:, :k], normA, normB).max())
                if not residual <= limit:
                    raise ConvergenceError(
                        f"partial_eigh: the {k} eigenpairs recomputed after skipped eigenvalues were "
                        f"found have relative residual {residual:.3e} > {limit:.3e}", method=method,
                        residual=residual, tol=limit, iterations=iterations,
                    )
        kept_w, kept_U = w[:k], U[:, :k]
        gap = None
        split: tuple[int, ...] = ()
        resolution = None
        if m > k:
            gap = float((w[k - 1] - w[k]).abs())
            # the scale of eigenvalue errors is that of the residual: ||A|| + |d| ||B||, not the
            # computed eigenvalues (which may all be tiny next to ||A||)
            scale = normA + float(w[k - 1].abs()) * normB
            threshold = max(math.sqrt(eps), 10 * tol) * scale
            resolution = max(tol, 10 * eps) * scale
            if gap <= resolution:
                # the last kept and first discarded eigenvalue coincide to the accuracy of the
                # pairs: which of them is kept is arbitrary (the backward refuses to differentiate)
                split = tuple(i for i in range(k) if float((w[i] - w[k]).abs()) <= resolution)
            if gap <= threshold:
                side = "largest" if largest else "smallest"
                warnings.warn(
                    f"partial_eigh: the gap between the last kept eigenvalue ({float(w[k - 1]):.6g}) "
                    f"and the first discarded one ({float(w[k]):.6g}) is {gap:.3e}, below "
                    f"{threshold:.3e} (relative to the scale ||A|| + |d_k| ||B|| = {scale:.3e}): the {k} "
                    f"{side} eigenvectors and their gradient are ill-defined; change k so it does not "
                    "split a (near-)degenerate eigenvalue",
                    UserWarning,
                    stacklevel=2,
                )
        kept_U = _fix_signs(kept_U)
    info = PartialEighInfo(method=method, residual=residual, iterations=int(iterations), tol=limit, gap=gap,
                           certificate=certificate, split=split, resolution=resolution, aid=aid)
    return kept_w.contiguous(), kept_U.contiguous(), info


def partial_eigh_batched(
    A: torch.Tensor,
    k: int,
    B: torch.Tensor | None = None,
    *,
    largest: bool = True,
    tol: float | None = None,
    maxiter: int | None = None,
    method: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, tuple[PartialEighInfo, ...]]:
    """:func:`partial_eigh` over the leading batch dimensions of dense ``(..., n, n)`` tensors.

    ``B`` (``(..., n, n)`` or ``None``) broadcasts against ``A``'s batch shape. Loops over the batch
    in Python (one :func:`partial_eigh` call each). Warnings and errors name the batch index.

    Returns:
        ``(w, U, infos)`` with ``w`` of shape ``(..., k)``, ``U`` of shape ``(..., n, k)`` and one
        :class:`PartialEighInfo` per problem, in row-major batch order.
    """
    if not isinstance(A, torch.Tensor) or A.layout != torch.strided or A.dim() < 2:
        raise ValueError("partial_eigh_batched: A must be a dense tensor of shape (..., n, n)")
    if B is not None and (not isinstance(B, torch.Tensor) or B.layout != torch.strided or B.dim() < 2):
        raise ValueError("partial_eigh_batched: B must be None or a dense tensor of shape (..., n, n)")
    batch_shape = A.shape[:-2] if B is None else torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    n = A.shape[-1]
    A_flat = A.expand(*batch_shape, *A.shape[-2:]).reshape(-1, *A.shape[-2:])
    B_flat = None if B is None else B.expand(*batch_shape, *B.shape[-2:]).reshape(-1, *B.shape[-2:])
    eigenvalues, eigenvectors, infos = [], [], []
    for index in range(A_flat.shape[0]):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                w, U, info = partial_eigh(
                    A_flat[index], k, None if B_flat is None else B_flat[index], largest=largest, tol=tol,
                    maxiter=maxiter, method=method,
                )
            except ConvergenceError as exc:
                raise ConvergenceError(
                    f"batch index {index}: {exc}", method=exc.method, residual=exc.residual, tol=exc.tol,
                    iterations=exc.iterations,
                ) from None
            except ValueError as exc:
                raise ValueError(f"partial_eigh_batched: batch index {index}: {exc}") from None
        for warning in caught:
            warnings.warn(f"batch index {index}: {warning.message}", warning.category, stacklevel=2)
        eigenvalues.append(w)
        eigenvectors.append(U)
        infos.append(info)
    if not eigenvalues:
        empty_k = _check_k(k, n)
        return (
            A.new_zeros(*batch_shape, empty_k),
            A.new_zeros(*batch_shape, n, empty_k),
            (),
        )
    w = torch.stack(eigenvalues).reshape(*batch_shape, -1)
    U = torch.stack(eigenvectors).reshape(*batch_shape, n, -1)
    return w, U, tuple(infos)

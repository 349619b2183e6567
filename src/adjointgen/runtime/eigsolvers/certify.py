"""Certification that no eigenvalue was skipped: inertia counts, repairs, a second opinion, and the aids the backward reuses.

Part of :mod:`adjointgen.runtime.eigsolvers` (its docstring describes the routes and certificates)."""
from __future__ import annotations

import math
from typing import Any
import numpy as np
import torch

from ..errors import ConvergenceError
from ..linear_operator import LinearOperator
from .common import _SEED, _apply_B, _dense_matrix, _hermitian_ritz, _order, _relative_residuals, _wide
from .dense import _solve_dense
from .arpack import _sparse_lu
from .lobpcg import _solve_lobpcg

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
                factor = {"kind": "sparse", "splu": lu, "sigma": float(sigma), "A": As, "B": Bs, "sign": -outer}
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
    from ..linsolve import DenseFactorAid

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
    from ..linsolve import DenseFactorAid, SparseFactorAid

    if factor is None:
        return None
    if factor["kind"] == "dense":
        W = None
        if extra is not None and extra[1].shape[1]:
            W = extra[1]
        return DenseFactorAid(factor["L"], factor["sign"], W)
    return SparseFactorAid(factor["A"], factor["B"], factor["sign"], float(w[k]), {factor["sigma"]: factor["splu"]})

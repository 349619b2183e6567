"""The block Lanczos route: dense input without B on the CPU, usually shift-inverted through one Cholesky factor.

Part of :mod:`adjointgen.runtime.eigsolvers` (its docstring describes the routes and certificates)."""
from __future__ import annotations

import math
from dataclasses import dataclass
import numpy as np
import torch

from .common import _SEED, _random_block

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
# The route's cost model, in units of one block product ``A @ Y`` (``n x n`` times ``n x 8``, contiguous),
# measured on 2 CPU threads at n = 1200, 2000, 3000 (float64): the direct solver for the wanted pairs
# (LAPACK ``syevr`` subset, 33 pairs) 0.055, 0.049, 0.049 n units (the full ``eigh``: 0.16, 0.14, 0.16 n);
# the two triangular solves of a shift-inverted step 0.75, 1.03, 1.19; a Cholesky factorization 0.0082,
# 0.0078, 0.0088 n; orthogonalizing a block against a basis of J vectors 0.81, 0.50, 0.57 at J = 400.
# The route is priced by counting, not timed: the same matrix takes the same route on every run.
#: the direct solver, per row
_KRYLOV_DENSE_PRODUCTS_PER_ROW = 0.04
#: a shift-inverted step's two triangular solves
_KRYLOV_SOLVE_UNITS = 1.0
#: a Cholesky factorization, per row
_KRYLOV_CHOLESKY_UNITS_PER_ROW = 0.0085
#: the Krylov route gives up (and the direct solver takes over) once it has spent, or its extrapolated
#: convergence predicts it will spend, this many times the direct solver's units: then it costs at most
#: about 2.5 times the direct route, where without the budget a slowly converging spectrum (the top of a
#: sample covariance matrix, the bottom of a graph Laplacian) ran the basis to its limit first
_KRYLOV_BUDGET = 1.0


def _orthogonalization_units(dim: int, n: int) -> float:
    """Units of orthogonalizing a new block against a basis of ``dim`` vectors (two GEMMs and a QR)."""
    return 0.25 + 1.5 * dim / n


class _OverBudget(Exception):
    """The Krylov route would cost more than the direct solver (see ``_KRYLOV_BUDGET``)."""


@dataclass
class _Budget:
    """The Krylov route's budget in block-product units (``limit``) and what it has spent."""
    limit: float
    spent: float = 0.0

    def spend(self, units: float) -> None:
        self.spent += units

    def check(self, units_still_needed: float = 0.0) -> None:
        if self.spent + units_still_needed > self.limit:
            raise _OverBudget


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
                   far_end=False, budget: _Budget | None = None, apply_units: float = 1.0):
    """Block Lanczos on the symmetric operator ``apply`` (block size 8, full reorthogonalization)
    for its ``m`` largest (``top``) or smallest Ritz pairs and ``extra`` more; see
    :func:`_solve_krylov`. ``residual_factor(theta)`` turns the Lanczos estimate ``||B_J y_last||``
    into the relative residual the caller tests against ``tol``. Returns ``(theta, X, products,
    converged)``, ``theta`` ordered from the wanted end. With a ``budget`` (each step costs ``apply_units``
    plus its orthogonalization), raises :class:`_OverBudget` as soon as the units spent, or those the
    extrapolated convergence still needs, exceed it."""
    b = _KRYLOV_BLOCK
    eps = torch.finfo(dtype).eps
    max_dim = max(b, min(max_dim // b * b, (n - 1) // b * b))
    want = m + max(0, min(extra, max_dim // 4 - m))
    # the basis vectors as rows: a block of them and the basis so far are contiguous (a strided n x 8
    # slice made the products with A 2-5 times slower, a strided basis the orthogonalization 2.7 times)
    Qt = torch.empty(max_dim + b, n, dtype=dtype, device=device)
    Z0 = _random_block(n, b, dtype, device)
    Qt[:b] = torch.linalg.qr(Z0)[0].mT
    band = np.zeros((b + 1, max_dim + b))
    previous_B = None
    products = 0
    next_check = max(3 * want, 10 * b) if max_steps is None else max_steps * b
    history: list[tuple[int, float]] = []
    step = 0
    scale = None
    step_units = apply_units
    while True:
        lo, hi = step * b, (step + 1) * b
        step_units = apply_units + _orthogonalization_units(hi, n)
        if budget is not None:
            budget.check()
            budget.spend(step_units)
        Z = apply(Qt[lo:hi].mT.contiguous())
        products += b
        if previous_B is not None:
            Z.addmm_(Qt[lo - b:lo].mT, previous_B.mT, alpha=-1)
        H = Qt[:hi] @ Z
        Z.addmm_(Qt[:hi].mT, H, alpha=-1)
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
                fresh = fresh - Qt[:hi].mT @ (Qt[:hi] @ fresh)
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
                X = Qt[:dim].mT @ Yt
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
                    if budget is not None:  # the same optimistic 3/4 of the straight-line estimate
                        budget.check(0.75 * needed / b * step_units)
            next_check = dim + grow
        Qt[hi:hi + b] = Q_next.mT
        previous_B = B_next
        step += 1


def _solve_krylov(A: torch.Tensor, m: int, extra: int, largest: bool, tol: float, normA: float,
                  budgeted: bool = True) -> _KrylovResult:
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
    False when that is not enough, or (``budgeted``: the route was chosen automatically) when the route
    has spent, or its extrapolated convergence predicts it would spend, 1.5 times the direct solver's
    time, priced from the locating run's fastest product (``_KRYLOV_DENSE_PRODUCTS_PER_ROW``); the
    caller then uses the direct solver."""
    n = A.shape[0]
    dtype, device = A.dtype, A.device
    max_dim = min(int(_KRYLOV_MAX_FRACTION * n), _KRYLOV_MAX_DIM)
    products = 0
    budget = _Budget(_KRYLOV_BUDGET * _KRYLOV_DENSE_PRODUCTS_PER_ROW * n) if budgeted else None

    def plain_factor(theta):
        return 1.0 / (normA + np.abs(theta))

    # 1. locate the wanted end (and estimate the far end)
    try:
        theta, X, used, _ = _block_lanczos(lambda Y: A @ Y, n, dtype, device, m, 0, largest, tol, plain_factor,
                                           max_dim, max_steps=_KRYLOV_LOCATE_STEPS, far_end=True, budget=budget)
        theta, far, residual_norms = theta
        products += used
        return _krylov_after_locating(A, m, extra, largest, tol, normA, theta, far, residual_norms, products,
                                      max_dim, budget)
    except _OverBudget:
        return _KrylovResult(None, None, products, False)


def _krylov_after_locating(A, m, extra, largest, tol, normA, theta, far, residual_norms, products, max_dim,
                           budget):
    """Steps 2 and 3 of :func:`_solve_krylov` (raises :class:`_OverBudget`)."""
    n = A.shape[0]
    dtype, device = A.dtype, A.device
    outer = 1.0 if largest else -1.0

    def plain_factor(theta):
        return 1.0 / (normA + np.abs(theta))
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
        if budget is not None:
            budget.spend(_KRYLOV_CHOLESKY_UNITS_PER_ROW * n)
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
                                                max_dim // 2, budget=budget, apply_units=_KRYLOV_SOLVE_UNITS)
        products += used
        if converged:
            lam = sigma - outer / torch.from_numpy(nu)
            return _KrylovResult(lam.to(dtype=dtype, device=device), X, products, True)
    # 3. plain block Lanczos on A
    theta, X, used, converged = _block_lanczos(lambda Y: A @ Y, n, dtype, device, m, extra, largest, tol,
                                               plain_factor, max_dim, budget=budget)
    products += used
    return _KrylovResult(torch.from_numpy(np.ascontiguousarray(theta)).to(dtype=dtype, device=device), X,
                         products, converged)

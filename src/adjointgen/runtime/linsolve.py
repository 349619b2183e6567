"""Projected, shifted linear solves for the complement part of partial-eigenproblem derivatives.

The JVP and VJP of a partial eigendecomposition ``A U = B U D``, ``U^T B U = I`` (``U`` of shape
``(n, k)``) need, for shifts ``d_i`` and right-hand sides ``r_i`` with ``U^T r_i = 0``, the solution
``x_i`` of

    (I - B U U^T) (A - d_i B) x_i = r_i,      U^T B x_i = 0.                       (*)

Write ``P = I - B U U^T`` (onto ``{y : U^T y = 0}``) and ``Q = P^T = I - U (BU)^T`` (onto
``S = {x : U^T B x = 0}``). Then ``M_i = P (A - d_i B) Q`` is symmetric, singular (``M_i U = 0``), its
range is ``{y : U^T y = 0}`` and on ``S`` it is definite when the ``d_i`` are the *extreme* kept
eigenvalues: positive when they are the smallest, negative when the largest (the quadratic form on
``S`` is ``x^T (A - d_i B) x`` and ``S`` is spanned by the discarded eigenvectors). ``M_i y = r_i`` is
consistent, and ``x_i = Q y`` solves (*).

:func:`solve_projected_shifted` runs preconditioned CG on ``s_i M_i`` (``s_i = +-1``, the sign read
from the first curvature ``p^T (A - d_i B) p``) for all columns at once, one product with the whole
block per iteration, keeping every search direction in ``S`` by applying ``Q``. A column whose
curvature has the wrong sign (the kept pairs were not extreme, or ``d_i`` is interior) is solved by a
batched MINRES written here, which needs only symmetry. :func:`solve_projected_shifted_dense` solves
small dense problems exactly through the bordered system.

Neither function holds a derivative formula: the generated rules decide what ``R`` is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from .errors import ConvergenceError
from .linear_operator import LinearOperator, as_operator

__all__ = ["ProjectedSolveInfo", "solve_projected_shifted", "solve_projected_shifted_dense"]

_DEFINITENESS = ("auto", "positive", "negative", "indefinite")


@dataclass(frozen=True)
class ProjectedSolveInfo:
    """What :func:`solve_projected_shifted` did.

    Attributes:
        iterations: products with the block of search directions (CG and MINRES phases together).
        cg_iterations: per column, CG iterations spent (0 for columns solved by MINRES only).
        minres_columns: indices of the columns solved by MINRES (indefinite or wrong sign).
        signs: per column, the sign ``s_i`` of the definite operator CG ran on (0 for MINRES).
        residuals: per column, the final true relative residual ``||r_i - P K_i x_i|| / ||r_i||``.
    """

    iterations: int
    cg_iterations: tuple[int, ...]
    minres_columns: tuple[int, ...]
    signs: tuple[int, ...]
    residuals: tuple[float, ...]

    @property
    def residual(self) -> float:
        """The largest relative residual over the columns."""
        return max(self.residuals, default=0.0)


class _ProjectedShiftedSystem:
    """The operators of (*): ``Q``, ``P`` and ``P K_i`` with per-column shifts, for a block.

    With ``inplace`` (no autograd graph wanted) the results of products with our own dense/sparse
    wrappers are updated in place, which saves one ``n x m`` allocation per step; products of user
    matvec closures are never modified (they might return a buffer the closure keeps).
    """

    def __init__(self, opA: LinearOperator, opB: LinearOperator | None, U, BU, d, inplace: bool):
        self.opA, self.opB, self.U, self.BU, self.d = opA, opB, U, BU, d
        self.inplace = inplace
        self.products_are_fresh = opA.kind != "operator"
        self.norm_estimate = 1.0
        self.normB_estimate = 1.0

    def project_domain(self, X):
        """``Q X = X - U (BU)^T X``: onto ``{x : U^T B x = 0}``."""
        return torch.addmm(X, self.U, self.BU.mT @ X, alpha=-1)

    def project_range(self, Y, inplace: bool = False):
        """``P Y = Y - BU U^T Y``: onto ``{y : U^T y = 0}``."""
        if inplace:
            return Y.addmm_(self.BU, self.U.mT @ Y, alpha=-1)
        return torch.addmm(Y, self.BU, self.U.mT @ Y, alpha=-1)

    def apply(self, X, d):
        """``P (A - d_i B) x_i`` for ``x_i`` already in ``S``."""
        BX = X if self.opB is None else self.opB.matmul(X)
        AX = self.opA.matmul(X)
        if self.inplace and self.products_are_fresh:
            return self.project_range(AX.addcmul_(BX, d, value=-1), inplace=True)
        return self.project_range(torch.addcmul(AX, BX, d, value=-1))

    def shifted(self, X, d):
        """``(A - d_i B) x_i`` column by column."""
        BX = X if self.opB is None else self.opB.matmul(X)
        return torch.addcmul(self.opA.matmul(X), BX, d, value=-1)


def _column_dots(X, Y):
    """``x_i . y_i`` for every column: through one small GEMM when there are few columns, which is
    several times faster than an elementwise product and a reduction over the long axis."""
    if X.shape[1] <= 32:
        return torch.diagonal(X.mT @ Y)
    return torch.linalg.vecdot(X, Y, dim=0)


def _column_norms(X):
    return torch.sqrt(_column_dots(X, X).clamp_min(0))


def _safe_divide(numerator, denominator, mask):
    """``numerator / denominator`` where ``mask``, else 0 (no NaN from frozen columns)."""
    ok = mask & (denominator != 0)
    return torch.where(ok, numerator / torch.where(ok, denominator, torch.ones_like(denominator)),
                       torch.zeros_like(numerator))


def _jacobi_preconditioner(opA: LinearOperator, opB: LinearOperator | None, d) -> Callable | None:
    diagonal_A = opA.diagonal()
    if diagonal_A is None:
        return None
    diagonal_B = torch.ones_like(diagonal_A) if opB is None else opB.diagonal()
    if diagonal_B is None:
        return None
    shifted = (diagonal_A[:, None] - diagonal_B[:, None] * d[None, :]).abs()
    floor = shifted.max(dim=0, keepdim=True).values * torch.finfo(shifted.dtype).eps ** 0.5
    inverse = 1.0 / torch.maximum(shifted, floor.clamp_min(torch.finfo(shifted.dtype).tiny))
    return lambda Rblock, columns: Rblock * inverse[:, columns]


def _cg(system, R, d, X, signs, preconditioner, tol, maxiter, R_norms):
    """Preconditioned CG on ``M_i y_i = r_i`` for every column with ``s_i != 0``.

    CG's recurrences are unchanged when the system is negated (``alpha`` and ``beta`` are invariant
    under ``M -> -M``, ``r -> -r``, ``p -> -p``), so a negative definite ``M_i`` needs no sign flips in
    the loop: the sign ``s_i`` only enters the definiteness test ``s_i p^T M_i p > 0`` (and the
    preconditioner must approximate ``|M_i|^{-1}``). Search directions are kept in ``S``
    (``p = Q z + beta p``), so the iterate stays in ``S``. Columns stop individually (``alpha = 0``
    once converged). When the recurrence says all are converged the true residual is recomputed
    and CG restarts where it drifted.

    Returns ``(X, products, iterations per column, wrong-sign mask, still-active mask)``.
    """
    k = R.shape[1]
    eps = torch.finfo(R.dtype).eps
    in_cg = signs != 0
    all_columns = torch.arange(k, device=R.device)
    precondition = (lambda Y: Y) if preconditioner is None else (lambda Y: preconditioner(Y, all_columns))
    wrong_sign = torch.zeros(k, dtype=torch.bool, device=R.device)
    iterations = torch.zeros(k, dtype=torch.long, device=R.device)
    # p^T M p must exceed rounding level relative to ||p||^2 (||A|| + |d_i| ||B||)
    curvature_floor = 1e3 * eps * (system.norm_estimate + d.abs() * system.normB_estimate) * signs
    threshold = tol * R_norms
    products = 0

    residual = R - system.apply(X, d)
    active = in_cg & (_column_norms(residual) > threshold)
    for _restart in range(50):
        if not bool(active.any()):
            break
        Z = precondition(residual)
        rho = _column_dots(residual, Z)
        direction = system.project_domain(Z)
        while True:
            if products >= maxiter:
                return X, products, iterations, wrong_sign, active
            M_direction = system.apply(direction, d)
            products += 1
            curvature = _column_dots(direction, M_direction)
            # a definite s_i M_i has s_i p^T M_i p > 0 on S; anything at rounding level or below
            # means the kept pairs are not extreme for this shift: hand the column to MINRES
            bad = active & (curvature * signs <= curvature_floor * signs * _column_dots(direction, direction))
            if bool(bad.any()):
                wrong_sign = wrong_sign | bad
                active = active & ~bad
            alpha = _safe_divide(rho, curvature, active)
            if system.inplace:
                X.addcmul_(direction, alpha)
                residual.addcmul_(M_direction, alpha, value=-1)
            else:
                X = torch.addcmul(X, direction, alpha)
                residual = torch.addcmul(residual, M_direction, alpha, value=-1)
            iterations = iterations + active.long()
            active = active & (_column_norms(residual) > threshold)
            if not bool(active.any()):
                break
            Z = precondition(residual)
            rho_new = _column_dots(residual, Z)
            beta = _safe_divide(rho_new, rho, active)
            rho = rho_new
            # inactive columns get alpha = 0, so their direction need not be kept
            if system.inplace:
                direction.mul_(beta).add_(Z).addmm_(system.U, system.BU.mT @ Z, alpha=-1)
            else:
                direction = torch.addcmul(system.project_domain(Z), direction, beta)
        # the recurrence says converged: check the true residual, restart where it drifted
        residual = R - system.apply(X, d)
        active = in_cg & ~wrong_sign & (_column_norms(residual) > threshold)
    return X, products, iterations, wrong_sign, active


def _minres(system, R, d, X, columns, tol, maxiter, R_norms):
    """Batched unpreconditioned MINRES on ``M_i y = r_i`` for ``columns``; returns (X, products, unconverged)."""
    eps = torch.finfo(R.dtype).eps
    products = 0
    Rc, dc, Xc, normc = R[:, columns], d[columns], X[:, columns], R_norms[columns]
    zeros_k = torch.zeros_like(dc)
    for _restart in range(50):
        r1 = Rc - system.apply(Xc, dc)
        beta1 = _column_norms(r1)
        active = beta1 > tol * normc
        if not bool(active.any()) or products >= maxiter:
            break
        y = r1
        r2 = r1
        oldb = zeros_k
        beta = beta1
        dbar = zeros_k
        epsln = zeros_k
        phibar = beta1
        cs = -torch.ones_like(dc)
        sn = zeros_k
        w = torch.zeros_like(Xc)
        w2 = torch.zeros_like(Xc)
        first = True
        while products < maxiter:
            s = _safe_divide(torch.ones_like(beta), beta, active)
            v = y * s
            y = system.apply(system.project_domain(v), dc)
            products += 1
            if not first:
                y = y - r1 * _safe_divide(beta, oldb, active)
            alfa = _column_dots(v, y)
            y = y - r2 * _safe_divide(alfa, beta, active)
            r1 = r2
            r2 = y
            oldb = beta
            beta = _column_norms(r2)
            oldeps = epsln
            delta = cs * dbar + sn * alfa
            gbar = sn * dbar - cs * alfa
            epsln = sn * beta
            dbar = -cs * beta
            gamma = torch.sqrt(gbar**2 + beta**2).clamp_min(eps)
            cs = torch.where(active, gbar / gamma, cs)
            sn = torch.where(active, beta / gamma, sn)
            phi = torch.where(active, cs * phibar, zeros_k)
            phibar = torch.where(active, sn * phibar, phibar)
            w1 = w2
            w2 = w
            w = torch.where(active, (v - oldeps * w1 - delta * w2) / gamma, w)
            Xc = torch.addcmul(Xc, system.project_domain(w), phi)
            first = False
            done = (phibar <= 0.5 * tol * normc) | (beta <= eps * normc)
            active = active & ~done
            if not bool(active.any()):
                break
    final = _column_norms(Rc - system.apply(Xc, dc))
    unconverged = final > tol * normc
    X = X.index_copy(1, columns, Xc)
    return X, products, unconverged


def solve_projected_shifted(
    A: Any,
    B: Any,
    U: torch.Tensor,
    BU: torch.Tensor | None,
    d: torch.Tensor,
    R: torch.Tensor,
    *,
    tol: float,
    maxiter: int | None = None,
    X0: torch.Tensor | None = None,
    definiteness: str = "auto",
    preconditioner: str | Callable | None = None,
    create_graph: bool = False,
    return_info: bool = False,
):
    """Solve ``(I - B U U^T)(A - d_i B) x_i = r_i`` with ``U^T B x_i = 0`` for every column ``i``.

    Block-iterative (module docstring): CG on the sign-corrected definite operator, MINRES for
    columns found indefinite. One product with ``A`` (and ``B``) per iteration for the whole block.

    Args:
        A: symmetric ``(n, n)`` operator (anything :func:`as_operator` accepts).
        B: symmetric positive definite ``(n, n)`` operator, or ``None`` for the identity.
        U: ``(n, k)`` kept eigenvectors, ``U^T B U = I``.
        BU: ``B @ U`` (precomputed by the caller); ignored when ``B`` is ``None``.
        d: ``(m,)`` shifts, one per right-hand side (usually the ``k`` kept eigenvalues).
        R: ``(n, m)`` right-hand sides with ``U^T R = 0`` (the caller projects them).
        tol: relative residual wanted per column, ``||r_i - P (A - d_i B) x_i|| / ||r_i|| <= tol``.
        maxiter: cap on block products (CG and MINRES together); default ``min(max(10 n, 200), 20000)``.
        X0: ``(n, m)`` initial guess (projected onto ``U^T B x = 0`` first).
        definiteness: ``"auto"`` (per-column sign from the first curvature), ``"positive"`` (the
            ``d_i`` are the smallest eigenvalues), ``"negative"`` (the largest) or ``"indefinite"``
            (MINRES for all columns).
        preconditioner: ``None``, ``"jacobi"`` (``1 / |diag(A) - d_i diag(B)|``, for dense/sparse
            input) or a callable ``(Y, columns) -> Z`` applying an SPD approximation of
            ``|A - d_i B|^{-1}`` to the columns ``columns`` of a block. Used by CG only.
        create_graph: ``False`` (default) runs under ``torch.no_grad()``. ``True`` records every
            iteration for autograd (plain out-of-place torch ops), so a double backward can
            differentiate through the solve; it costs memory of about ``6 n m`` values per iteration
            and a backward pass as long as the forward one. It differentiates the *iterate*, whose
            derivative converges more slowly than the iterate itself (measured: n = 80, tol = 1e-13,
            gradient with respect to ``A`` 1.7e-2 off the exact one, with respect to ``R`` 1e-5).
            For exact second derivatives differentiate the defining equation (one more solve of the
            same kind) or use :func:`solve_projected_shifted_dense` for small problems.
        return_info: also return a :class:`ProjectedSolveInfo`.

    Returns:
        ``X`` of shape ``(n, m)`` (and the info when ``return_info``).

    Raises:
        ValueError: on shape/dtype/device mismatches or an unknown option.
        ConvergenceError: when ``maxiter`` is reached before every column meets ``tol`` (reports the
            largest residual reached).
    """
    opA = as_operator(A)
    opB = None if B is None else as_operator(B)
    n = opA.shape[0]
    if opA.shape != (n, n):
        raise ValueError(f"solve_projected_shifted: A must be square, got {opA.shape}")
    if opB is not None and opB.shape != opA.shape:
        raise ValueError(f"solve_projected_shifted: B has shape {opB.shape}, A has {opA.shape}")
    if U.dim() != 2 or U.shape[0] != n:
        raise ValueError(f"solve_projected_shifted: U must be (n, k) with n = {n}, got {tuple(U.shape)}")
    if opB is None:
        BU = U
    elif BU is None or BU.shape != U.shape:
        raise ValueError(f"solve_projected_shifted: BU must have U's shape {tuple(U.shape)}")
    if d.dim() != 1 or R.dim() != 2 or R.shape != (n, d.shape[0]):
        raise ValueError(
            f"solve_projected_shifted: need d (m,) and R (n, m), got d {tuple(d.shape)} and R {tuple(R.shape)}"
        )
    if X0 is not None and X0.shape != R.shape:
        raise ValueError(f"solve_projected_shifted: X0 must have R's shape {tuple(R.shape)}, got {tuple(X0.shape)}")
    if definiteness not in _DEFINITENESS:
        raise ValueError(f"solve_projected_shifted: definiteness must be one of {_DEFINITENESS}, got {definiteness!r}")
    if not tol > 0:
        raise ValueError(f"solve_projected_shifted: tol must be positive, got {tol}")
    if maxiter is None:
        maxiter = min(max(10 * n, 200), 20000)
    dtype = torch.result_type(R, U)
    if dtype != opA.dtype:
        raise ValueError(f"solve_projected_shifted: A has dtype {opA.dtype}, U and R have {dtype}")

    grad_context = torch.enable_grad() if create_graph else torch.no_grad()
    with grad_context:
        d = d.to(dtype)
        system = _ProjectedShiftedSystem(opA, opB, U, BU, d, inplace=not create_graph)
        if preconditioner == "jacobi":
            preconditioner = _jacobi_preconditioner(opA, opB, d)
        elif preconditioner is not None and not callable(preconditioner):
            raise ValueError(f"solve_projected_shifted: unknown preconditioner {preconditioner!r}")
        m = d.shape[0]
        R_norms = _column_norms(R)
        X = torch.zeros_like(R) if X0 is None else system.project_domain(X0.to(dtype))
        # scale used in the definiteness test: rough norms of A and B from the data at hand
        with torch.no_grad():
            system.norm_estimate = float(_column_norms(opA.matmul(U)).max()) if U.shape[1] else 1.0
            system.normB_estimate = 1.0 if opB is None else float(_column_norms(BU).max())

        zero_rhs = R_norms == 0
        X = torch.where(zero_rhs, torch.zeros_like(X), X)
        products = 0
        signs = torch.zeros(m, dtype=dtype, device=R.device)
        wrong_sign = torch.zeros(m, dtype=torch.bool, device=R.device)
        cg_iterations = torch.zeros(m, dtype=torch.long, device=R.device)
        if definiteness != "indefinite":
            if definiteness == "auto":
                # sign of the first curvature p^T (A - d_i B) p, p = Q T r (T: preconditioner)
                residual = R - system.apply(X, d)
                Z = residual if preconditioner is None else preconditioner(residual, torch.arange(m, device=R.device))
                direction = system.project_domain(Z)
                curvature = _column_dots(direction, system.shifted(direction, d))
                products += 1
                signs = torch.sign(curvature).to(dtype)
            else:
                signs = torch.full((m,), 1.0 if definiteness == "positive" else -1.0, dtype=dtype, device=R.device)
            signs = torch.where(zero_rhs, torch.zeros_like(signs), signs)
            wrong_sign = (signs == 0) & ~zero_rhs
            X, cg_products, cg_iterations, cg_wrong_sign, cg_unconverged = _cg(
                system, R, d, X, signs, preconditioner, tol, maxiter - products, R_norms
            )
            products += cg_products
            wrong_sign = wrong_sign | cg_wrong_sign
            if bool(cg_unconverged.any()):
                final = _column_norms(R - system.apply(X, d)) / R_norms.clamp_min(torch.finfo(dtype).tiny)
                raise ConvergenceError(
                    f"solve_projected_shifted: CG reached maxiter = {maxiter} with "
                    f"{int(cg_unconverged.sum())} of {m} columns above tol",
                    method="cg", residual=float(final[cg_unconverged].max()), tol=tol, iterations=products,
                )
        else:
            wrong_sign = ~zero_rhs
        minres_columns = torch.nonzero(wrong_sign).flatten()
        if minres_columns.numel():
            X, minres_products, unconverged = _minres(
                system, R, d, X, minres_columns, tol, maxiter - products, R_norms
            )
            products += minres_products
            if bool(unconverged.any()):
                final = _column_norms(R - system.apply(X, d)) / R_norms.clamp_min(torch.finfo(dtype).tiny)
                raise ConvergenceError(
                    f"solve_projected_shifted: MINRES reached maxiter = {maxiter} with "
                    f"{int(unconverged.sum())} of {minres_columns.numel()} indefinite columns above tol",
                    method="minres", residual=float(final[minres_columns].max()), tol=tol, iterations=products,
                )
        X = system.project_domain(X)
        if not return_info:
            return X
        residuals = _column_norms(R - system.apply(X, d)) / R_norms.clamp_min(torch.finfo(dtype).tiny)
        info = ProjectedSolveInfo(
            iterations=int(products),
            cg_iterations=tuple(int(i) for i in cg_iterations),
            minres_columns=tuple(int(i) for i in minres_columns),
            signs=tuple(0 if bool(wrong_sign[i]) else int(signs[i]) for i in range(m)),
            residuals=tuple(float(r) for r in residuals),
        )
        return X, info


def solve_projected_shifted_dense(
    A_dense: torch.Tensor,
    B_dense: torch.Tensor | None,
    U: torch.Tensor,
    d: torch.Tensor,
    R: torch.Tensor,
) -> torch.Tensor:
    """Exact solve of (*) for small dense problems through the bordered system, column by column.

    For each shift ``d_i`` solves ``[[A - d_i B, B U], [(B U)^T, 0]] [x_i; l_i] = [r_i; 0]``: the
    second block row is the constraint ``U^T B x_i = 0``, and applying ``P = I - B U U^T`` to the first
    (``P B U = 0``) gives ``P (A - d_i B) x_i = P r_i = r_i``. All ``m`` systems go to one batched
    :func:`torch.linalg.solve` of shape ``(..., m, n + k, n + k)`` (memory ``m (n + k)^2``), so the
    result is differentiable with respect to every input by autograd. The bordered matrix is
    nonsingular when no discarded eigenvalue equals ``d_i``.

    Args:
        A_dense: ``(..., n, n)`` symmetric.
        B_dense: ``(..., n, n)`` symmetric positive definite, or ``None`` for the identity.
        U: ``(..., n, k)`` with ``U^T B U = I``.
        d: ``(..., m)`` shifts.
        R: ``(..., n, m)`` right-hand sides with ``U^T R = 0``.

    Returns:
        ``X`` of shape ``(..., n, m)``.
    """
    if A_dense.dim() < 2 or A_dense.shape[-1] != A_dense.shape[-2]:
        raise ValueError(f"solve_projected_shifted_dense: A must be (..., n, n), got {tuple(A_dense.shape)}")
    n = A_dense.shape[-1]
    if B_dense is not None and B_dense.shape[-2:] != (n, n):
        raise ValueError(f"solve_projected_shifted_dense: B must be (..., {n}, {n}), got {tuple(B_dense.shape)}")
    if U.dim() < 2 or U.shape[-2] != n:
        raise ValueError(f"solve_projected_shifted_dense: U must be (..., {n}, k), got {tuple(U.shape)}")
    if d.dim() < 1 or R.dim() < 2 or R.shape[-2] != n or R.shape[-1] != d.shape[-1]:
        raise ValueError(
            f"solve_projected_shifted_dense: need d (..., m) and R (..., {n}, m), got d {tuple(d.shape)} "
            f"and R {tuple(R.shape)}"
        )
    k = U.shape[-1]
    m = d.shape[-1]
    if B_dense is None:
        BU = U
        B_part = torch.eye(n, dtype=A_dense.dtype, device=A_dense.device)
    else:
        BU = B_dense @ U
        B_part = B_dense
    # (..., m, n, n): one shifted matrix per right-hand side
    shifted = A_dense.unsqueeze(-3) - d[..., :, None, None] * B_part.unsqueeze(-3)
    batch = torch.broadcast_shapes(shifted.shape[:-3], BU.shape[:-2], R.shape[:-2])
    shifted = shifted.expand(*batch, m, n, n)
    border = BU.unsqueeze(-3).expand(*batch, m, n, k)
    top = torch.cat([shifted, border], dim=-1)
    corner = torch.zeros(*batch, m, k, k, dtype=top.dtype, device=top.device)
    bottom = torch.cat([border.mT, corner], dim=-1)
    bordered = torch.cat([top, bottom], dim=-2)
    rhs_top = R.mT.expand(*batch, m, n).unsqueeze(-1)
    rhs = torch.cat([rhs_top, torch.zeros(*batch, m, k, 1, dtype=top.dtype, device=top.device)], dim=-2)
    solution = torch.linalg.solve(bordered, rhs)
    return solution[..., :n, 0].mT

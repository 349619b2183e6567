"""The fast routes: LU (square), Cholesky of the Hermitian matrix, and the Gram matrix (tall and wide), with their bounds.

Part of :mod:`adjointgen.runtime.pinv` (its docstring says what the whole guarantees)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .arguments import _real_dtype
from .bounds import _PowerIteration, _probes, _slack

# --------------------------------------------------------------------------------------------------
# routes
# --------------------------------------------------------------------------------------------------


@dataclass
class _Bounds:
    """Per-matrix bounds on the norms of the two operators of a route.

    ``inverse_up`` bounds the per-level norm of the inverse operator from above (``1/sigma_min`` for
    LU and the Hermitian Cholesky, ``1/sqrt(lambda_min(G))`` of the computed Gram matrix ``G``) and
    ``sigma_max_up`` bounds ``sigma_max`` from above; both hold except with probability
    ``_STAGE_PROBABILITY`` each. ``inverse_floor`` (the raw growth) and ``sigma_max_floor``
    (``max(raw growth, ‖A‖_F / sqrt(min(m, n)))``) are the same norms' deterministic lower bounds.
    """

    inverse_up: torch.Tensor
    sigma_max_up: torch.Tensor
    inverse_floor: torch.Tensor
    sigma_max_floor: torch.Tensor

    def combine(self, other: "_Bounds") -> "_Bounds":
        """The better of two stages' bounds (valid when both stages' bounds hold: the union bound)."""
        return _Bounds(
            torch.minimum(self.inverse_up, other.inverse_up),
            torch.minimum(self.sigma_max_up, other.sigma_max_up),
            torch.maximum(self.inverse_floor, other.inverse_floor),
            torch.maximum(self.sigma_max_floor, other.sigma_max_floor),
        )


@dataclass
class _Route:
    method: str
    kind: str  # key of QUICK_LEVELS
    n: int  # dimension of the probes (Dixon's n), min(m, n)
    factor_ok: torch.Tensor  # (batch,) bool
    inverse: _PowerIteration  # per level: norm 1/sigma_min
    forward: _PowerIteration  # per level: norm sigma_max
    frobenius: torch.Tensor
    cond_cap: float
    finish: Callable[[], torch.Tensor]
    breakdown: str  # why the factorization failed, for the reason string
    quick_forward: bool  # run the forward iteration in the quick stage
    gram_error: Optional[float] = None  # Gram route: relative rounding in forming G
    alternative: Optional[tuple] = None  # (method, cond_cap, finish): QR, sharing the Gram bounds

    def bounds(self) -> _Bounds:
        """Bounds from the levels run so far, each with failure probability ``_STAGE_PROBABILITY``."""
        g_inv = self.inverse.growth()
        floor = self.frobenius / math.sqrt(max(self.n, 1))  # ‖A‖_F <= sqrt(rank) sigma_max
        sigma_max_up = self.frobenius
        if self.forward.levels:
            g_fwd = self.forward.growth()
            power_up = _slack(self.n, self.forward.levels) * g_fwd * (1.0 + (self.gram_error or 0.0))
            sigma_max_up = torch.minimum(sigma_max_up, power_up)
            floor = torch.maximum(floor, g_fwd)
        return _Bounds(_slack(self.n, self.inverse.levels) * g_inv, sigma_max_up, g_inv, floor)


def _identity_column_major(A: torch.Tensor) -> torch.Tensor:
    """Identity matrices shaped like square ``A``, laid out column-major (LAPACK's layout)."""
    X = torch.zeros(A.shape, dtype=A.dtype, device=A.device).mT
    X.diagonal(dim1=-2, dim2=-1).fill_(1)
    return X


def _lu_route(A: torch.Tensor, frobenius: torch.Tensor, stable_cap: float) -> _Route:
    batch, n = A.shape[:-2], A.shape[-1]
    # LAPACK wants column-major factors. A real row-major A is factored as A^T (already column-major:
    # no transposing copy) and every solve with A is a transposed solve with A^T, as torch.linalg.solve
    # does; complex A (whose transposed solve would conjugate) is factored as it is.
    transposed = not A.is_complex() and A.is_contiguous()
    LU, pivots, info = torch.linalg.lu_factor_ex(A.mT if transposed else A)

    def solve(v, adjoint):  # A^-1 v, or A^-H v when adjoint
        return torch.linalg.lu_solve(LU, pivots, v, adjoint=adjoint != transposed)

    inverse_ops = (lambda v: solve(v, True), lambda v: solve(v, False))  # A^-H, A^-1
    forward_ops = (lambda v: A @ v, lambda v: A.mH @ v)

    def finish():
        # what torch.linalg.inv does: the factors applied to the identity, solved in place
        X = _identity_column_major(A)
        return torch.linalg.lu_solve(LU, pivots, X, adjoint=transposed, out=X)

    return _Route(
        method="lu",
        kind="lu",
        n=n,
        factor_ok=info == 0,
        inverse=_PowerIteration(inverse_ops, lambda: _probes(batch, n, A.dtype, A.device, 0), 1),
        forward=_PowerIteration(forward_ops, lambda: _probes(batch, n, A.dtype, A.device, 1), 1),
        frobenius=frobenius,
        cond_cap=stable_cap,
        finish=finish,
        breakdown="LU met an exactly zero pivot",
        quick_forward=False,
    )


def _hermitian_route(A: torch.Tensor, frobenius: torch.Tensor, stable_cap: float) -> _Route:
    # torch reads only the lower triangle (and the real part of the diagonal); so do we. Cholesky reads
    # only the lower triangle too, so a real A is factored as it is; H, the Hermitian matrix of that
    # triangle, is formed only for the forward iteration of the full stage (and for complex A, whose
    # diagonal may carry an imaginary part).
    batch, n = A.shape[:-2], A.shape[-1]
    diagonal = torch.diagonal(A, dim1=-2, dim2=-1).real
    hermitian_matrix = None

    def H():
        nonlocal hermitian_matrix
        if hermitian_matrix is None:
            strict_lower = torch.tril(A, -1)
            hermitian_matrix = strict_lower + strict_lower.mH + torch.diag_embed(diagonal).to(A.dtype)
        return hermitian_matrix

    # A negative definite H is handled as -(-H)^-1; the sign is chosen per matrix on the device.
    sign = torch.where(diagonal[..., :1] < 0, -1.0, 1.0).unsqueeze(-1).to(diagonal.dtype)
    L, info = torch.linalg.cholesky_ex(sign * (H() if A.is_complex() else A))

    def finish():
        return sign * torch.cholesky_inverse(L)

    return _Route(
        method="cholesky",
        kind="hermitian",
        n=n,
        factor_ok=info == 0,
        inverse=_PowerIteration(
            (lambda v: torch.cholesky_solve(v, L),), lambda: _probes(batch, n, A.dtype, A.device, 0), 1
        ),
        forward=_PowerIteration((lambda v: H() @ v,), lambda: _probes(batch, n, A.dtype, A.device, 1), 1),
        frobenius=frobenius,
        cond_cap=stable_cap,
        finish=finish,
        breakdown="the matrix is not numerically definite (Cholesky of ±H failed)",
        quick_forward=False,
    )


def _gram_route(A: torch.Tensor, stable_cap: float, normal_cap: float) -> _Route:
    """Tall or wide ``A``: Cholesky of the Gram matrix of the taller orientation ``T`` (``T = A`` or ``A^H``).

    ``‖A‖_F = sqrt(trace(G))`` comes with ``G`` (no pass over ``A`` of its own); it is not finite when
    an entry of ``A`` is not (``G_jj`` sums the squared moduli of column ``j``), as the input check needs.
    """
    wide = A.shape[-2] < A.shape[-1]
    T = A.mH if wide else A  # tall, m >= n
    m, n = T.shape[-2], T.shape[-1]
    batch = A.shape[:-2]
    eps = torch.finfo(_real_dtype(A.dtype)).eps
    G = T.mH @ T
    frobenius = torch.sqrt(torch.diagonal(G, dim1=-2, dim2=-1).real.sum(-1))
    L, info = torch.linalg.cholesky_ex(G)

    def orient(X_tall: torch.Tensor) -> torch.Tensor:
        return X_tall.mH.resolve_conj() if wide else X_tall

    def finish_cholesky():
        return orient(torch.cholesky_solve(T.mH, L))  # (T^H T)^-1 T^H

    def finish_qr():
        Q, R = torch.linalg.qr(T)
        return orient(torch.linalg.solve_triangular(R, Q.mH, upper=True))  # R^-1 Q^H

    # One application of G^-1 (or G) scales by up to 1/sigma_min^2 (sigma_max^2): two levels.
    return _Route(
        method="cholesky",
        kind="gram",
        n=n,
        factor_ok=info == 0,
        inverse=_PowerIteration(
            (lambda v: torch.cholesky_solve(v, L),), lambda: _probes(batch, n, A.dtype, A.device, 0), 2
        ),
        forward=_PowerIteration((lambda v: G @ v,), lambda: _probes(batch, n, A.dtype, A.device, 1), 2),
        frobenius=frobenius,
        cond_cap=normal_cap,
        finish=finish_cholesky,
        breakdown="the Gram matrix is not numerically positive definite (Cholesky failed)",
        quick_forward=True,
        gram_error=(m + n) * eps,  # relative size of the rounding in forming and factoring G
        alternative=("qr", stable_cap, finish_qr),
    )

"""Shared by every route: the result record, input checks, norms, residuals, signs and order.

Part of :mod:`adjointgen.runtime.eigsolvers` (its docstring describes the routes and certificates)."""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any
import torch

from ..linear_operator import LinearOperator, as_operator

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


def fix_signs(U: torch.Tensor) -> torch.Tensor:
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


_fix_signs = fix_signs


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
# shared by several routes
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

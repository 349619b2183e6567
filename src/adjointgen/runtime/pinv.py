"""Forward pass of the Moore–Penrose pseudo-inverse with a rank-revealing fast path (MATH.md §5).

``pinv_forward(A)`` returns what ``torch.linalg.pinv(A, atol=, rtol=, hermitian=)`` returns, but
computes it with a cheap factorization whenever that provably (with overwhelming probability, see
below) gives the same matrix: when every singular value of ``A`` is clearly above torch's cutoff,
no singular value is discarded, so the pseudo-inverse is the ordinary inverse (square), the
least-squares inverse ``(A^H A)^-1 A^H`` (tall), ``A^H (A A^H)^-1`` (wide), or ``H^-1`` (Hermitian).
Otherwise it calls ``torch.linalg.pinv`` itself, so the slow path is torch's result bit for bit.

This module computes values only. The gradient is generated from the derivation of §5; the public
op wraps this function in an autograd Function and runs it under ``torch.no_grad()``.

Routes (``PinvInfo.method``)
    ``"lu"``        square, not Hermitian: LU with partial pivoting, inverse from the factors.
    ``"cholesky"``  tall/wide: Cholesky of the Gram matrix ``A^H A`` (``A A^H`` for wide), or,
                    with ``hermitian=True``, Cholesky of ``H`` (or of ``-H`` when ``H`` is negative
                    definite) where ``H`` is rebuilt from the lower triangle, as torch does.
    ``"qr"``        tall/wide with a condition number too large for the normal equations but small
                    enough for Householder QR: ``A⁺ = R^-1 Q^H``.
    ``"svd"``       fallback, ``torch.linalg.pinv`` (SVD); ``"eigh"`` the Hermitian fallback.

When the fast path is taken
    The factorization is computed first (it is a fraction of the SVD's cost, which bounds the
    overhead paid on a refused matrix). From its factors we get, per matrix,

    * ``sigma_min_lo`` — a lower bound on the smallest singular value, from power iteration on the
      inverse operator (``(A^H A)^-1`` through the LU or Cholesky factors) with random starts;
    * ``sigma_max_up`` — an upper bound on the largest one: ``min(‖A‖_F, power-iteration bound)``;
    * ``cutoff_up = max(atol, rtol * sigma_max_up)`` — an upper bound on torch's cutoff;
    * ``kappa_up = sigma_max_up / sigma_min_lo`` — an upper bound on the condition number.

    Power iteration from a random start only ever *under*-estimates the norm of an operator
    (``‖M^k x‖^(1/k) <= ‖M‖`` for unit ``x``), so its raw value is an upper bound on ``sigma_min``:
    the unsafe direction. It is turned into a lower bound with Dixon's theorem (SIAM J. Numer.
    Anal. 20, 1983): if ``x`` is uniform on the unit sphere, ``|u1 . x|^2 < δ`` has probability at
    most ``0.8 sqrt(n δ)``, and otherwise ``‖M^k x‖ >= ‖M‖^k |u1 . x|``. With ``L`` "levels" (one
    level = one multiplication by something of norm ``1/sigma_min``), the raw per-level growth
    ``g = ‖v_L‖^(1/L)`` satisfies ``1/sigma_min <= SIGMA_SLACK * g`` except with probability
    ``<= 0.8 sqrt(n) SIGMA_SLACK^-L`` per probe. ``N_PROBES`` independent probes are run and the
    largest growth is kept, so a wrong bound needs every probe to fail:
    probability ``<= (0.8 sqrt(n) SIGMA_SLACK^-L)^N_PROBES``; ``L`` is chosen so that this is at
    most ``FAILURE_PROBABILITY`` (1e-12) for each of the two bounds of each matrix. The same
    argument gives ``sigma_max_up``. The probes come from a private generator with a fixed seed, so
    the decision is reproducible and the caller's random state is untouched.

    The fast path is taken only if, for every matrix of the batch,

    1. the factorization succeeded (no zero pivot / the Gram matrix is numerically definite),
    2. ``sigma_min_lo > CUTOFF_MARGIN * cutoff_up`` (``CUTOFF_MARGIN = 10``): torch's SVD would keep
       every singular value, with room for the rounding errors of both algorithms, and
    3. ``kappa_up`` is below the accuracy cap of the route, so that its error stays close to the
       SVD route's ``~ kappa * eps``: ``eps^-1/2`` for the backward-stable LU, QR and Hermitian
       Cholesky (double 6.7e7, single 2.9e3; ``kappa * eps <= sqrt(eps)``); ``eps^-1/6`` for the
       normal equations (double 406, single 14), whose error ``kappa^2 * eps`` then stays below
       ``eps^(2/3)`` and within a factor ``kappa`` of the SVD's.

    The bounds describe the *computed* factors. For LU and the Hermitian Cholesky the difference
    to ``A`` is the factorization's backward error, ``O(eps ‖A‖)``, which is tiny against
    ``sigma_min`` under the caps and absorbed by the 10x margin. Forming a Gram matrix perturbs its
    eigenvalues by up to ``~(m + n) eps ‖A‖^2`` (a first-order worst-case model), which is *not*
    small against ``sigma_min^2`` in general; that amount is subtracted from the lower bound, and
    the Gram route is refused when the correction exceeds a quarter of the bound
    (``GRAM_CORRECTION_MAX``), i.e. when the Gram matrix cannot resolve ``sigma_min``.

Batches and synchronisation
    The decision is made for the whole batch: if any matrix fails a test, the whole batch goes to
    ``torch.linalg.pinv``. Everything up to the decision runs on the device; the checks of the input
    (finite entries, symmetry, non-negative tolerance tensors) and the decision are brought to the
    host together in *one* transfer per call (a device synchronisation on CUDA), plus one more only
    when the input turns out to be invalid (to name the offending value).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import torch

__all__ = [
    "CUTOFF_MARGIN",
    "FAILURE_PROBABILITY",
    "N_PROBES",
    "PinvInfo",
    "SIGMA_SLACK",
    "pinv_forward",
]

Tolerance = Union[None, float, int, torch.Tensor]

#: A fast path needs ``sigma_min_lo > CUTOFF_MARGIN * cutoff_up``.
CUTOFF_MARGIN = 10.0
#: Factor by which a power-iteration estimate is widened into a bound (see the module docstring).
SIGMA_SLACK = 1.5
#: Independent random probes per power iteration.
N_PROBES = 16
#: Each of the two bounds (sigma_min, sigma_max) of each matrix is wrong with at most this probability.
FAILURE_PROBABILITY = 1e-12
#: The Gram route is refused when the rounding correction exceeds this fraction of the bound.
GRAM_CORRECTION_MAX = 0.25
#: ``hermitian=True`` requires ``‖A - A^H‖_F <= SYMMETRY_FACTOR * n * eps * ‖A‖_F``.
SYMMETRY_FACTOR = 10.0
_PROBE_SEED = 0x5EED_9F1


@dataclass(frozen=True)
class PinvInfo:
    """How ``pinv_forward`` computed its result.

    Attributes:
        method: ``"lu"``, ``"cholesky"``, ``"qr"`` (fast paths), ``"svd"`` or ``"eigh"``
            (``torch.linalg.pinv``).
        reason: one sentence saying why this method was chosen, with the numbers that decided it.
        sigma_min_est: smallest lower bound on ``sigma_min`` over the batch (``None`` when not
            estimated or when the factorization broke down).
        sigma_max_est: largest upper bound on ``sigma_max`` over the batch (``None`` when not estimated).
        cutoff: largest upper bound on torch's cutoff ``max(atol, rtol * sigma_max)`` over the batch.
    """

    method: str
    reason: str
    sigma_min_est: Optional[float]
    sigma_max_est: Optional[float]
    cutoff: Optional[float]


# --------------------------------------------------------------------------------------------------
# argument checks and tolerances
# --------------------------------------------------------------------------------------------------

_SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)


def _real_dtype(dtype: torch.dtype) -> torch.dtype:
    return {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dtype, dtype)


def _check_static(A, atol: Tolerance, rtol: Tolerance, hermitian: bool) -> None:
    """Checks that need no data from the device."""
    if not isinstance(A, torch.Tensor):
        raise TypeError(f"pinv: expected a torch.Tensor, got {type(A).__name__}")
    if A.dim() < 2:
        raise ValueError(f"pinv: expected a tensor with at least 2 dimensions (..., m, n), got shape {tuple(A.shape)}")
    if A.dtype not in _SUPPORTED_DTYPES:
        is_integer = not A.dtype.is_floating_point and not A.is_complex()
        raise ValueError(
            f"pinv: unsupported dtype {A.dtype}; expected float32, float64, complex64 or complex128"
            + (" (convert integer tensors with .double() first)" if is_integer else "")
        )
    if hermitian and A.shape[-1] != A.shape[-2]:
        raise ValueError(f"pinv: hermitian=True needs square matrices, got shape {tuple(A.shape)}")
    for name, tol in (("atol", atol), ("rtol", rtol)):
        if tol is None:
            continue
        if isinstance(tol, bool):
            raise ValueError(f"pinv: {name} must be a real number or tensor, got a bool")
        if isinstance(tol, torch.Tensor):
            if tol.is_complex():
                raise ValueError(f"pinv: {name} must be real, got dtype {tol.dtype}")
            if tol.dtype == torch.bool:
                raise ValueError(f"pinv: {name} must be a real number or tensor, got a bool tensor")
            continue
        if not isinstance(tol, (int, float)):
            raise ValueError(f"pinv: {name} must be a real number or tensor, got {type(tol).__name__}")
        if math.isnan(tol):
            raise ValueError(f"pinv: {name} is NaN")
        if tol < 0:
            raise ValueError(f"pinv: {name} must be non-negative, got {tol}")


def _tolerance_fits_batch(tol: Tolerance, batch_shape: torch.Size) -> bool:
    if not isinstance(tol, torch.Tensor):
        return True
    try:
        return torch.broadcast_shapes(tol.shape, batch_shape) == batch_shape
    except RuntimeError:
        return False


def _resolve_tolerances(A: torch.Tensor, atol: Tolerance, rtol: Tolerance):
    """``(atol, rtol)`` as real tensors on ``A``'s device, with torch's defaults.

    torch: ``atol`` defaults to 0; ``rtol`` defaults to ``eps * max(m, n)``, except that when ``atol``
    is given and ``> 0`` (elementwise for a tensor) the default ``rtol`` is 0.
    """
    real = _real_dtype(A.dtype)
    device = A.device
    m, n = A.shape[-2], A.shape[-1]
    default_rtol = torch.finfo(real).eps * max(m, n)

    def as_tensor(value):
        return torch.as_tensor(value, dtype=real, device=device)

    atol_t = as_tensor(0.0 if atol is None else atol)
    if rtol is not None:
        rtol_t = as_tensor(rtol)
    elif atol is None:
        rtol_t = as_tensor(default_rtol)
    elif isinstance(atol, torch.Tensor):
        rtol_t = torch.where(atol_t > 0, as_tensor(0.0), as_tensor(default_rtol))
    else:
        rtol_t = as_tensor(0.0 if atol > 0 else default_rtol)
    return atol_t, rtol_t


def _needs_data_free_path(A: torch.Tensor) -> bool:
    """True under ``torch.compile`` tracing or inside ``vmap``, where no value can reach the host."""
    if torch.compiler.is_compiling():
        return True
    try:
        from torch._C._functorch import get_unwrapped, is_batchedtensor, is_functorch_wrapped_tensor
    except ImportError:  # pragma: no cover - torch without functorch bindings
        return False
    x = A
    while True:
        if is_batchedtensor(x):
            return True
        if not is_functorch_wrapped_tensor(x):
            return False
        x = get_unwrapped(x)


@contextlib.contextmanager
def _ieee_float32_matmul(device: torch.device):
    """TF32 would ruin the Gram matrix and the estimates; torch.linalg.pinv disables it too."""
    if device.type != "cuda" or torch.get_float32_matmul_precision() == "highest":
        yield
        return
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


# --------------------------------------------------------------------------------------------------
# randomized norm bounds
# --------------------------------------------------------------------------------------------------


def _levels_needed(n: int) -> int:
    """Smallest L with ``(0.8 sqrt(n) SIGMA_SLACK^-L)^N_PROBES <= FAILURE_PROBABILITY``."""
    per_probe = FAILURE_PROBABILITY ** (1.0 / N_PROBES)
    ratio = 0.8 * math.sqrt(max(n, 1)) / per_probe
    return max(2, math.ceil(math.log(ratio) / math.log(SIGMA_SLACK)))


def _probes(batch_shape, n: int, dtype: torch.dtype, device: torch.device, stream: int) -> torch.Tensor:
    """Gaussian probes (uniform directions on the real or complex sphere), private fixed-seed RNG."""
    generator = torch.Generator(device=device)
    generator.manual_seed(_PROBE_SEED + stream)
    return torch.randn((*batch_shape, n, N_PROBES), dtype=dtype, device=device, generator=generator)


def _growth_per_level(
    operators: Sequence[Callable[[torch.Tensor], torch.Tensor]],
    start: torch.Tensor,
    levels_per_application: int,
    n_levels: int,
) -> torch.Tensor:
    """Largest over the probes of ``‖v_L‖^(1/L)``, ``v_L`` = operators applied cyclically to unit probes.

    Each application counts ``levels_per_application`` levels (2 for a Gram-type operator whose norm
    is ``sigma^2``). Vectors are renormalised after every application and the log norms summed, so
    nothing overflows. A breakdown (inf/NaN from a singular factor) yields inf/NaN, which every
    acceptance test below rejects.
    """
    v = start / torch.linalg.vector_norm(start, dim=-2, keepdim=True)
    n_applications = -(-n_levels // levels_per_application)
    log_growth = torch.zeros_like(v[..., :1, :].real)
    tiny = torch.finfo(log_growth.dtype).tiny
    for step in range(n_applications):
        v = operators[step % len(operators)](v)
        norm = torch.linalg.vector_norm(v, dim=-2, keepdim=True)
        log_growth = log_growth + torch.log(norm)
        v = v / norm.clamp_min(tiny)
    levels = n_applications * levels_per_application
    return torch.exp(log_growth.amax(dim=-1).squeeze(-1) / levels)


# --------------------------------------------------------------------------------------------------
# routes
# --------------------------------------------------------------------------------------------------


@dataclass
class _Candidate:
    """A factorization already computed, its bounds, and how to finish it into ``A⁺``."""

    method: str
    factor_ok: torch.Tensor  # (batch,) bool
    sigma_min_lo: torch.Tensor  # (batch,) real
    sigma_max_up: torch.Tensor  # (batch,) real
    cond_cap: float
    finish: Callable[[], torch.Tensor]
    breakdown: str  # what factor_ok == False means, for the reason string
    reliable: Optional[torch.Tensor] = None  # (batch,) bool, Gram route only
    alternative: Optional["_Candidate"] = None  # QR, sharing the Gram bounds


def _lu_candidate(A: torch.Tensor, frobenius: torch.Tensor, levels: int, stable_cap: float) -> _Candidate:
    LU, pivots, info = torch.linalg.lu_factor_ex(A)
    batch, n = A.shape[:-2], A.shape[-1]
    inverse_ops = (
        lambda v: torch.linalg.lu_solve(LU, pivots, v, adjoint=True),  # A^-H
        lambda v: torch.linalg.lu_solve(LU, pivots, v),  # A^-1
    )
    growth_inv = _growth_per_level(inverse_ops, _probes(batch, n, A.dtype, A.device, 0), 1, levels)
    forward_ops = (lambda v: A @ v, lambda v: A.mH @ v)
    growth_fwd = _growth_per_level(forward_ops, _probes(batch, n, A.dtype, A.device, 1), 1, levels)

    def finish():
        identity = torch.eye(n, dtype=A.dtype, device=A.device).expand_as(A)
        return torch.linalg.lu_solve(LU, pivots, identity)

    return _Candidate(
        method="lu",
        factor_ok=info == 0,
        sigma_min_lo=1.0 / (SIGMA_SLACK * growth_inv),
        sigma_max_up=torch.minimum(frobenius, SIGMA_SLACK * growth_fwd),
        cond_cap=stable_cap,
        finish=finish,
        breakdown="LU met an exactly zero pivot",
    )


def _hermitian_candidate(A: torch.Tensor, frobenius: torch.Tensor, levels: int, stable_cap: float) -> _Candidate:
    # torch reads only the lower triangle (and the real part of the diagonal); so do we.
    strict_lower = torch.tril(A, -1)
    diagonal = torch.diagonal(A, dim1=-2, dim2=-1).real
    H = strict_lower + strict_lower.mH + torch.diag_embed(diagonal).to(A.dtype)
    # A negative definite H is handled as -(-H)^-1; the sign is chosen per matrix on the device.
    sign = torch.where(diagonal[..., :1] < 0, -1.0, 1.0).unsqueeze(-1).to(diagonal.dtype)
    L, info = torch.linalg.cholesky_ex(sign * H)
    batch, n = A.shape[:-2], A.shape[-1]
    growth_inv = _growth_per_level(
        (lambda v: torch.cholesky_solve(v, L),), _probes(batch, n, A.dtype, A.device, 0), 1, levels
    )
    growth_fwd = _growth_per_level((lambda v: H @ v,), _probes(batch, n, A.dtype, A.device, 1), 1, levels)

    def finish():
        return sign * torch.cholesky_inverse(L)

    return _Candidate(
        method="cholesky",
        factor_ok=info == 0,
        sigma_min_lo=1.0 / (SIGMA_SLACK * growth_inv),
        sigma_max_up=torch.minimum(frobenius, SIGMA_SLACK * growth_fwd),
        cond_cap=stable_cap,
        finish=finish,
        breakdown="the matrix is not numerically definite (Cholesky of ±H failed)",
    )


def _gram_candidate(
    A: torch.Tensor, frobenius: torch.Tensor, levels: int, stable_cap: float, normal_cap: float
) -> _Candidate:
    """Tall or wide ``A``: Cholesky of the Gram matrix of the taller orientation ``T`` (``T = A`` or ``A^H``)."""
    wide = A.shape[-2] < A.shape[-1]
    T = A.mH if wide else A  # tall, m >= n
    m, n = T.shape[-2], T.shape[-1]
    batch = A.shape[:-2]
    eps = torch.finfo(_real_dtype(A.dtype)).eps
    G = T.mH @ T
    L, info = torch.linalg.cholesky_ex(G)
    # One application of G^-1 (or G) scales by up to 1/sigma_min^2 (sigma_max^2): two levels.
    growth_inv = _growth_per_level(
        (lambda v: torch.cholesky_solve(v, L),), _probes(batch, n, A.dtype, A.device, 0), 2, levels
    )
    growth_fwd = _growth_per_level((lambda v: G @ v,), _probes(batch, n, A.dtype, A.device, 1), 2, levels)
    gram_error = (m + n) * eps  # relative size of the rounding in forming and factoring G
    sigma_max_up = torch.minimum(frobenius, SIGMA_SLACK * growth_fwd * (1.0 + gram_error))
    lambda_min_lo = (1.0 / (SIGMA_SLACK * growth_inv)) ** 2  # lower bound on lambda_min of the computed G
    correction = gram_error * sigma_max_up**2
    reliable = correction <= GRAM_CORRECTION_MAX * lambda_min_lo
    sigma_min_lo = torch.sqrt(torch.clamp(lambda_min_lo - correction, min=0.0))

    def orient(X_tall: torch.Tensor) -> torch.Tensor:
        return X_tall.mH.resolve_conj() if wide else X_tall

    def finish_cholesky():
        return orient(torch.cholesky_solve(T.mH, L))  # (T^H T)^-1 T^H

    def finish_qr():
        Q, R = torch.linalg.qr(T)
        return orient(torch.linalg.solve_triangular(R, Q.mH, upper=True))  # R^-1 Q^H

    breakdown = "the Gram matrix is not numerically positive definite (Cholesky failed)"
    qr = _Candidate("qr", info == 0, sigma_min_lo, sigma_max_up, stable_cap, finish_qr, breakdown, reliable)
    return _Candidate(
        "cholesky", info == 0, sigma_min_lo, sigma_max_up, normal_cap, finish_cholesky, breakdown, reliable, qr
    )


# --------------------------------------------------------------------------------------------------
# the decision
# --------------------------------------------------------------------------------------------------


def _optional_float(value: float) -> Optional[float]:
    return None if math.isnan(value) else value


def _invalid_input_message(A: torch.Tensor, hermitian: bool, n_eps: float) -> str:
    """Second, slow look at an input already known to be bad: name the problem."""
    if torch.isnan(A).any():
        return "pinv: the input contains NaN entries"
    if torch.isinf(A).any():
        return "pinv: the input contains infinite entries"
    return (
        "pinv: hermitian=True but the input is not Hermitian: "
        f"‖A - A^H‖_F / ‖A‖_F exceeds {SYMMETRY_FACTOR:g} * n * eps = {n_eps:.2e}"
        if hermitian
        else "pinv: invalid input"
    )


def pinv_forward(
    A: torch.Tensor,
    *,
    atol: Tolerance = None,
    rtol: Tolerance = None,
    hermitian: bool = False,
    return_info: bool = False,
):
    """Pseudo-inverse of ``A`` (``(..., m, n)`` → ``(..., n, m)``), equal to ``torch.linalg.pinv``.

    Singular values ``<= max(atol, rtol * sigma_max)`` are discarded (eigenvalue moduli when
    ``hermitian=True``), with torch's defaults: ``atol = 0``; ``rtol = eps(dtype) * max(m, n)``,
    except that an ``atol > 0`` given without ``rtol`` sets ``rtol = 0``. ``atol``/``rtol`` may be
    numbers or real tensors broadcastable to the batch shape. With ``hermitian=True`` only the lower
    triangle is used, as in torch, but an input that is not Hermitian to within
    ``SYMMETRY_FACTOR * n * eps`` (relative Frobenius norm) is rejected.

    A cheap factorization (LU, Cholesky, QR) replaces the SVD when randomized bounds on the extreme
    singular values show that no singular value is within ``CUTOFF_MARGIN`` of the cutoff and that
    the condition number is small enough for that factorization to be as accurate as the SVD; see
    the module docstring for the bounds, their failure probability (<= 1e-12 per bound and matrix)
    and the caps. Otherwise the result is ``torch.linalg.pinv``'s, computed by torch. The decision is one
    for the whole batch, taken on the host after a single device→host transfer (one CUDA
    synchronisation per call). Under ``vmap`` or ``torch.compile`` tracing, where no value can reach
    the host, it simply calls ``torch.linalg.pinv`` (without the value checks). Values only: no
    autograd graph is recorded.

    Args:
        A: float32/float64/complex64/complex128 tensor with at least two dimensions, on any device.
        atol, rtol: cutoff tolerances as in ``torch.linalg.pinv``; must be non-negative.
        hermitian: treat ``A`` as Hermitian (fallback: ``torch.linalg.eigh``).
        return_info: also return a :class:`PinvInfo` describing the route taken.

    Returns:
        ``A⁺``, or ``(A⁺, info)`` when ``return_info``. Like ``torch.linalg.inv``, a fast-path result
        may be laid out column-major (not ``is_contiguous()``); call ``.contiguous()`` if that matters.

    Raises:
        ValueError: fewer than 2 dimensions, integer or unsupported dtype, NaN or infinite entries,
            negative or NaN ``atol``/``rtol``, and ``hermitian=True`` with a non-square or
            non-Hermitian input.
    """
    _check_static(A, atol, rtol, hermitian)
    fallback_method = "eigh" if hermitian else "svd"

    def torch_pinv():
        return torch.linalg.pinv(A.detach(), atol=atol, rtol=rtol, hermitian=hermitian)

    def result(X, info):
        return (X, info) if return_info else X

    with torch.no_grad(), _ieee_float32_matmul(A.device):
        A = A.detach()
        m, n = A.shape[-2], A.shape[-1]
        batch = A.shape[:-2]
        real = _real_dtype(A.dtype)
        eps = torch.finfo(real).eps

        if A.numel() == 0:
            return result(torch_pinv(), PinvInfo(fallback_method, "empty input", None, None, None))
        if _needs_data_free_path(A):
            reason = "traced or vmapped: no host decision possible; computed by torch.linalg.pinv"
            return result(torch_pinv(), PinvInfo(fallback_method, reason, None, None, None))

        # ---- input checks that need the data: gathered now, read with the decision --------------
        frobenius = torch.linalg.matrix_norm(A)  # (batch,)
        bad_entries = ~torch.isfinite(frobenius).all()  # NaN/Inf entries (or an overflowing norm)
        symmetry_tol = SYMMETRY_FACTOR * n * eps
        if hermitian:
            asymmetry = torch.linalg.matrix_norm(A - A.mH)
            bad_symmetry = (asymmetry > symmetry_tol * frobenius).any()
        else:
            bad_symmetry = torch.zeros((), dtype=torch.bool, device=A.device)
        bad_tolerance = torch.zeros((), dtype=torch.bool, device=A.device)
        for tol in (atol, rtol):
            if isinstance(tol, torch.Tensor):
                t = tol.to(device=A.device, dtype=real)
                bad_tolerance = bad_tolerance | torch.isnan(t).any() | (t < 0).any()

        if not (_tolerance_fits_batch(atol, batch) and _tolerance_fits_batch(rtol, batch)):
            # Tolerances that broadcast the result beyond the batch shape: leave the semantics to torch.
            flags = torch.stack([bad_entries, bad_symmetry, bad_tolerance]).tolist()
            if flags[0] or flags[1]:
                raise ValueError(_invalid_input_message(A, hermitian, symmetry_tol))
            if flags[2]:
                raise ValueError("pinv: atol/rtol tensors must be non-negative and not NaN")
            reason = "atol/rtol broadcast beyond the batch shape; computed by torch.linalg.pinv"
            return result(torch_pinv(), PinvInfo(fallback_method, reason, None, None, None))

        # ---- factorization and bounds, all on the device ----------------------------------------
        atol_t, rtol_t = _resolve_tolerances(A, atol, rtol)
        levels = _levels_needed(min(m, n))
        stable_cap = eps**-0.5
        normal_cap = eps ** (-1.0 / 6.0)
        if hermitian:
            candidate = _hermitian_candidate(A, frobenius, levels, stable_cap)
        elif m == n:
            candidate = _lu_candidate(A, frobenius, levels, stable_cap)
        else:
            candidate = _gram_candidate(A, frobenius, levels, stable_cap, normal_cap)

        cutoff_up = torch.maximum(atol_t, rtol_t * candidate.sigma_max_up)
        kappa_up = candidate.sigma_max_up / candidate.sigma_min_lo
        # Positive comparisons, so that NaN from a broken-down factor counts as "no".
        factor_ok = candidate.factor_ok & torch.isfinite(kappa_up)
        if candidate.reliable is not None:
            factor_ok = factor_ok & candidate.reliable
        margin_ok = candidate.sigma_min_lo > CUTOFF_MARGIN * cutoff_up
        cond_ok = kappa_up <= candidate.cond_cap
        alt_cond_ok = kappa_up <= candidate.alternative.cond_cap if candidate.alternative else cond_ok
        shape = torch.broadcast_shapes(batch, cutoff_up.shape)

        def all_of(flag):
            return flag.expand(shape).all().to(torch.float64)

        def reduce(values, how):
            return how(values.expand(shape).to(torch.float64).reshape(-1))

        summary = torch.stack(
            [
                bad_entries.to(torch.float64),
                bad_symmetry.to(torch.float64),
                bad_tolerance.to(torch.float64),
                all_of(factor_ok),
                all_of(candidate.factor_ok),
                all_of(margin_ok),
                all_of(cond_ok),
                all_of(alt_cond_ok),
                reduce(candidate.sigma_min_lo, torch.amin),
                reduce(candidate.sigma_max_up, torch.amax),
                reduce(cutoff_up, torch.amax),
                reduce(kappa_up, torch.amax),
            ]
        ).tolist()  # the one device -> host transfer of the call
        (bad_entries_h, bad_symmetry_h, bad_tolerance_h, factor_ok_h, factorized_h, margin_ok_h, cond_ok_h,
         alt_cond_ok_h, sigma_min_h, sigma_max_h, cutoff_h, kappa_h) = summary

        if bad_entries_h or bad_symmetry_h:
            message = _invalid_input_message(A, hermitian, symmetry_tol)
            if message != "pinv: invalid input":
                raise ValueError(message)
            # All entries finite but ‖A‖_F overflowed: the bounds are meaningless, let torch do it.
            reason = "‖A‖_F overflows; computed by torch.linalg.pinv"
            return result(torch_pinv(), PinvInfo(fallback_method, reason, None, None, None))
        if bad_tolerance_h:
            raise ValueError("pinv: atol/rtol tensors must be non-negative and not NaN")

        sigma_min_est = _optional_float(sigma_min_h) if factor_ok_h else None
        sigma_max_est = _optional_float(sigma_max_h)
        cutoff_est = _optional_float(cutoff_h)
        numbers = (
            f"sigma_min >= {sigma_min_h:.3g}, sigma_max <= {sigma_max_h:.3g}, "
            f"cutoff <= {cutoff_h:.3g}, cond <= {kappa_h:.3g}"
        )

        def info(method, reason):
            return PinvInfo(method, reason, sigma_min_est, sigma_max_est, cutoff_est)

        if not factor_ok_h:
            if candidate.reliable is not None and factorized_h:
                why = "the Gram matrix cannot resolve sigma_min (rounding correction too large)"
            else:
                why = candidate.breakdown
            return result(torch_pinv(), info(fallback_method, f"fallback: {why}"))
        if not margin_ok_h:
            why = f"a singular value may lie within {CUTOFF_MARGIN:g}x of the cutoff ({numbers})"
            return result(torch_pinv(), info(fallback_method, f"fallback: {why}"))
        if cond_ok_h:
            why = f"fast path: {numbers}; cond cap for {candidate.method} {candidate.cond_cap:.3g}"
            return result(candidate.finish(), info(candidate.method, why))
        if candidate.alternative is not None and alt_cond_ok_h:
            alt = candidate.alternative
            why = (
                f"fast path: {numbers}; above the normal-equations cap {candidate.cond_cap:.3g}, "
                f"within the {alt.method} cap {alt.cond_cap:.3g}"
            )
            return result(alt.finish(), info(alt.method, why))
        cap = candidate.alternative.cond_cap if candidate.alternative else candidate.cond_cap
        why = f"fallback: condition bound above the accuracy cap {cap:.3g} ({numbers})"
        return result(torch_pinv(), info(fallback_method, why))

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
    ``"lu"``        square, not Hermitian: LU with partial pivoting, inverse from the factors by
                    one solve with the identity in place (the LAPACK calls of ``torch.linalg.inv``).
                    A real row-major ``A`` is factored as ``A^T``, which is column-major already, and
                    solved transposed, so no transposing copy of ``A`` is made.
    ``"cholesky"``  tall/wide: Cholesky of the Gram matrix ``A^H A`` (``A A^H`` for wide), then one
                    ``cholesky_solve`` for ``A^H`` (no explicit inverse of the Gram matrix); ``‖A‖_F``
                    comes from the Gram matrix's trace. With ``hermitian=True``: Cholesky of ``H`` (or
                    of ``-H`` when ``H`` is negative definite), where ``H`` is the Hermitian matrix of
                    the lower triangle, as torch reads it (Cholesky reads only that triangle), and
                    ``cholesky_inverse``.
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
    ``g = ‖v_L‖^(1/L)`` satisfies ``1/sigma_min <= s * g`` except with probability
    ``<= 0.8 sqrt(n) s^-L`` per probe, for any slack ``s >= 1`` fixed in advance. ``N_PROBES``
    independent probes are run and the largest growth is kept, so a wrong bound needs every probe to
    fail: probability ``<= (0.8 sqrt(n) s^-L)^N_PROBES``. The same argument gives ``sigma_max_up``.

    The bounds are computed in two stages, and the failure probability is split between them
    (``FAILURE_PROBABILITY / 2`` each, so that by the union bound each of the two bounds of each
    matrix is wrong with probability at most ``FAILURE_PROBABILITY`` = 1e-12 overall):

    1. *Quick stage*: ``QUICK_LEVELS`` levels (2 for LU and Hermitian Cholesky, where the upper
       bound is ``‖A‖_F`` alone; 4 for the Gram route, whose cap needs a tighter ``sigma_max``),
       with the large slack ``s`` that makes so few levels meet the probability. A well-conditioned
       matrix is accepted here; for LU the stage costs two solves with the factors for 16
       vectors, 10-15% of the factorization at n = 2000 on 2 CPU cores (``bench_pinv.py``). A
       matrix that the *deterministic* side of the same numbers already condemns (``sigma_min <=
       1/g`` and ``sigma_max >= max(g_fwd, ‖A‖_F / sqrt(min(m, n)))`` hold for the computed factors
       whatever the probes) is refused here too, without further iteration: the full stage could
       not accept it (except when its own bound fails), and refusing is always correct.
    2. *Full stage*, only when the quick one is inconclusive: the same probes are iterated on to
       ``L`` levels, the smallest ``L`` for which slack ``SIGMA_SLACK`` (1.5) meets the probability.
       Each bound kept is the better of the two stages' (both hold, except with the summed
       probability).

    The probes come from a private generator with a fixed seed, so the decision is reproducible
    and the caller's random state is untouched; they are drawn outside functorch's view (under
    ``torch._C._DisableFuncTorch``), so that a random operation never happens inside a ``vmap``
    (``jacfwd``, ``hessian``) and no ``randomness=`` argument is needed.

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
    ``torch.linalg.pinv``. Everything up to a decision runs on the device; the checks of the input
    (finite entries, symmetry, non-negative tolerance tensors) and the quick stage's decision are
    brought to the host together in *one* transfer (a device synchronisation on CUDA); a second
    one follows only when the full stage runs, and one more only when the input turns out to be
    invalid (to name the offending value).

Transforms
    ``torch.func.grad``, ``jvp``, ``jacrev``, ``jacfwd`` and ``hessian`` hand the autograd
    Function's forward plain tensors, so the decision is made as without them. Under ``vmap`` the
    forward receives a ``BatchedTensor``, whose values cannot reach the host from inside the
    transform; ``pinv_forward`` then takes the underlying physical tensor (all vmapped dimensions
    moved to the front), decides for that whole stacked batch as for any batch (so the result is
    the fast path's, or ``torch.linalg.pinv``'s when any matrix of the stack is refused) and wraps
    the result back. Where that is not possible — ``atol``/``rtol`` tensors that are themselves
    vmapped, wrappers other than ``vmap``'s between the levels, ``torch.compile`` tracing — it calls
    ``torch.linalg.pinv`` directly (torch's result and semantics, without this module's value checks).
    Empty inputs (a zero batch size, ``m = 0`` or ``n = 0``) are ``torch.linalg.pinv``'s, shapes
    included.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import torch

__all__ = [
    "CUTOFF_MARGIN",
    "FAILURE_PROBABILITY",
    "N_PROBES",
    "PinvInfo",
    "QUICK_LEVELS",
    "SIGMA_SLACK",
    "pinv_forward",
]

_log = logging.getLogger("adjointgen.pinv")

Tolerance = Union[None, float, int, torch.Tensor]

#: A fast path needs ``sigma_min_lo > CUTOFF_MARGIN * cutoff_up``.
CUTOFF_MARGIN = 10.0
#: Largest per-level slack of the full stage (see the module docstring).
SIGMA_SLACK = 1.5
#: Independent random probes per power iteration.
N_PROBES = 16
#: Each of the two bounds (sigma_min, sigma_max) of each matrix is wrong with at most this
#: probability, both stages together (each stage gets half).
FAILURE_PROBABILITY = 1e-12
#: Levels of the quick stage: LU and Hermitian Cholesky (upper bound ‖A‖_F), Gram route.
QUICK_LEVELS = {"lu": 2, "hermitian": 2, "gram": 4}
#: The Gram route is refused when the rounding correction exceeds this fraction of the bound.
GRAM_CORRECTION_MAX = 0.25
#: ``hermitian=True`` requires ``‖A - A^H‖_F <= SYMMETRY_FACTOR * n * eps * ‖A‖_F``.
SYMMETRY_FACTOR = 10.0
_PROBE_SEED = 0x5EED_9F1
_STAGE_PROBABILITY = FAILURE_PROBABILITY / 2


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
        levels: power-iteration levels run for the lower bound on ``sigma_min`` (0 when none ran):
            ``QUICK_LEVELS[...]`` when the quick stage decided, more when the full stage ran.
    """

    method: str
    reason: str
    sigma_min_est: Optional[float]
    sigma_max_est: Optional[float]
    cutoff: Optional[float]
    levels: int = 0


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


# --------------------------------------------------------------------------------------------------
# functorch, torch.compile and TF32
# --------------------------------------------------------------------------------------------------

try:
    from torch._C._functorch import (
        _add_batch_dim,
        get_unwrapped,
        is_batchedtensor,
        is_functorch_wrapped_tensor,
        maybe_get_bdim,
        maybe_get_level,
    )
except ImportError:  # pragma: no cover - torch without functorch bindings
    _add_batch_dim = None


def _is_vmapped(x) -> bool:
    """True for a tensor that is, or wraps, a ``vmap`` BatchedTensor."""
    if _add_batch_dim is None or not isinstance(x, torch.Tensor):
        return False
    while is_functorch_wrapped_tensor(x):
        if is_batchedtensor(x):
            return True
        x = get_unwrapped(x)
    return False


def _unbatch(A: torch.Tensor):
    """``(physical, levels)`` for a vmapped ``A``, or ``None`` when it is not a stack of BatchedTensors.

    ``physical`` is the plain tensor under all the ``vmap`` levels, the batch dimension of the
    innermost level first, then the next outer one, ...; ``levels`` lists those levels innermost
    first, so that ``_rebatch`` rewraps a result computed on ``physical``.
    """
    levels = []
    x = A
    while is_functorch_wrapped_tensor(x):
        if not is_batchedtensor(x):
            return None  # a grad/jvp wrapper between vmap levels: not ours to take apart
        level, bdim = maybe_get_level(x), maybe_get_bdim(x)
        # movedim on the wrapped inner tensor: functorch keeps the inner levels' bookkeeping
        x = get_unwrapped(x).movedim(bdim, 0)
        levels.append(level)
    return x, levels[::-1]


def _rebatch(X: torch.Tensor, levels) -> torch.Tensor:
    for level in levels:
        X = _add_batch_dim(X, 0, level)
    return X


def _outside_functorch():
    """Context in which tensor operations bypass every functorch transform (plain tensors only)."""
    disable = getattr(torch._C, "_DisableFuncTorch", None)
    return disable() if disable is not None else contextlib.nullcontext()


@contextlib.contextmanager
def _ieee_float32_matmul(device: torch.device):
    """TF32 would ruin the Gram matrix and the estimates; torch.linalg.pinv disables it too.

    A no-op on the CPU and whenever the precision is already ``"highest"`` (float64 matmuls never
    use TF32), so it costs nothing on the paths that do not need it.
    """
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


def _per_probe_failure(probability: float) -> float:
    return probability ** (1.0 / N_PROBES)


def _levels_needed(n: int, probability: float = _STAGE_PROBABILITY) -> int:
    """Smallest L with ``(0.8 sqrt(n) SIGMA_SLACK^-L)^N_PROBES <= probability`` (at least 2)."""
    ratio = 0.8 * math.sqrt(max(n, 1)) / _per_probe_failure(probability)
    return max(2, math.ceil(math.log(ratio) / math.log(SIGMA_SLACK)))


def _slack(n: int, levels: int, probability: float = _STAGE_PROBABILITY) -> float:
    """Smallest slack ``s >= 1`` with ``(0.8 sqrt(n) s^-levels)^N_PROBES <= probability``."""
    ratio = 0.8 * math.sqrt(max(n, 1)) / _per_probe_failure(probability)
    return max(1.0, ratio ** (1.0 / levels))


def _probes(batch_shape, n: int, dtype: torch.dtype, device: torch.device, stream: int) -> torch.Tensor:
    """Gaussian probes (uniform directions on the real or complex sphere), private fixed-seed RNG.

    Drawn by NumPy, not by a torch random operation: inside ``jacfwd``/``hessian`` (and gradcheck's
    batched forward-mode check, which uses the older ``torch._vmap_internals``) a ``vmap`` level is
    active even though ``A`` is a plain tensor, and a random operation there would raise in vmap's
    default ``randomness="error"`` mode. The probes do not depend on ``A``, so a plain tensor is right.
    """
    import numpy as np

    rng = np.random.default_rng(_PROBE_SEED + stream)
    real = torch.empty((), dtype=dtype).real.dtype
    shape = (*batch_shape, n, N_PROBES)
    draw = rng.standard_normal(shape)
    if dtype.is_complex:
        draw = draw + 1j * rng.standard_normal(shape)
    with _outside_functorch():
        out = torch.from_numpy(draw)
        return out.to(dtype=dtype if dtype.is_complex else real, device=device)


class _PowerIteration:
    """``N_PROBES`` probes pushed through ``operators`` (applied cyclically), resumable.

    Each application counts ``levels_per_application`` levels (2 for a Gram-type operator whose norm
    is ``sigma^2``). Vectors are renormalised after every application and the log norms summed, so
    nothing overflows. A breakdown (inf/NaN from a singular factor) yields inf/NaN, which every
    acceptance test rejects.
    """

    def __init__(
        self,
        operators: Sequence[Callable[[torch.Tensor], torch.Tensor]],
        start: Callable[[], torch.Tensor],
        levels_per_application: int,
    ):
        self.operators = operators
        self.levels_per_application = levels_per_application
        self.start = start  # drawn on the first application: an iteration that never runs costs nothing
        self.v: Optional[torch.Tensor] = None
        self.log_growth: Optional[torch.Tensor] = None
        self.applications = 0

    @property
    def levels(self) -> int:
        return self.applications * self.levels_per_application

    def run(self, levels: int) -> None:
        """Iterate on until at least ``levels`` levels have been run."""
        if self.levels >= levels:
            return
        if self.v is None:
            start = self.start()
            self.v = start / torch.linalg.vector_norm(start, dim=-2, keepdim=True)
            self.log_growth = torch.zeros_like(self.v[..., :1, :].real)
        tiny = torch.finfo(self.log_growth.dtype).tiny
        while self.levels < levels:
            v = self.operators[self.applications % len(self.operators)](self.v)
            norm = torch.linalg.vector_norm(v, dim=-2, keepdim=True)
            self.log_growth = self.log_growth + torch.log(norm)
            self.v = v / norm.clamp_min(tiny)
            self.applications += 1

    def growth(self) -> torch.Tensor:
        """Largest over the probes of ``‖v_L‖^(1/L)``, shape ``batch``."""
        return torch.exp(self.log_growth.amax(dim=-1).squeeze(-1) / self.levels)


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


def _bad_tolerance(atol: Tolerance, rtol: Tolerance, device, real) -> torch.Tensor:
    bad = torch.zeros((), dtype=torch.bool, device=device)
    for tol in (atol, rtol):
        if isinstance(tol, torch.Tensor):
            t = tol.to(device=device, dtype=real)
            bad = bad | torch.isnan(t).any() | (t < 0).any()
    return bad


class _Verdict:
    """The acceptance tests of one stage, evaluated on the device; ``summary`` goes to the host."""

    FLAGS = (
        "accept", "accept_alt", "factor_ok", "reliable", "margin_ok", "condemned",
        "condemned_breakdown", "condemned_reliable", "condemned_margin",
    )
    NUMBERS = ("sigma_min", "sigma_max", "cutoff", "cond", "sigma_min_hi", "cutoff_floor", "cond_floor")

    def __init__(self, route: _Route, bounds: _Bounds, atol_t, rtol_t, batch):
        self.bounds = bounds
        ge = route.gram_error
        if ge is None:
            sigma_min_lo = 1.0 / bounds.inverse_up
            reliable = torch.ones_like(route.factor_ok)
            reliable_floor = reliable
        else:
            lambda_min_lo = bounds.inverse_up**-2  # lower bound on lambda_min of the computed G
            correction = ge * bounds.sigma_max_up**2
            reliable = correction <= GRAM_CORRECTION_MAX * lambda_min_lo
            reliable_floor = ge * bounds.sigma_max_floor**2 <= GRAM_CORRECTION_MAX * bounds.inverse_floor**-2
            sigma_min_lo = torch.sqrt(torch.clamp(lambda_min_lo - correction, min=0.0))
        sigma_min_hi = 1.0 / bounds.inverse_floor
        cutoff_up = torch.maximum(atol_t, rtol_t * bounds.sigma_max_up)
        cutoff_floor = torch.maximum(atol_t, rtol_t * bounds.sigma_max_floor)
        kappa_up = bounds.sigma_max_up / sigma_min_lo
        kappa_floor = bounds.sigma_max_floor / sigma_min_hi
        alt_cap = route.alternative[1] if route.alternative else route.cond_cap
        # Positive comparisons, so that NaN from a broken-down factor counts as "no".
        factor_ok = route.factor_ok & torch.isfinite(kappa_up)
        margin_ok = sigma_min_lo > CUTOFF_MARGIN * cutoff_up
        base = factor_ok & reliable & margin_ok
        # Deterministic refusals (of the computed factors, whatever the probes): no further levels
        # could turn them into an acceptance, except through a failed bound of the full stage.
        condemned_breakdown = ~route.factor_ok | ~torch.isfinite(kappa_floor)
        condemned_reliable = ~reliable_floor
        condemned_margin = ~(sigma_min_hi > CUTOFF_MARGIN * cutoff_floor)
        condemned_cond = ~(kappa_floor <= alt_cap)
        condemned = condemned_breakdown | condemned_reliable | condemned_margin | condemned_cond
        shape = torch.broadcast_shapes(batch, cutoff_up.shape)

        def all_of(flag):
            return flag.expand(shape).all().to(torch.float64)

        def any_of(flag):
            return flag.expand(shape).any().to(torch.float64)

        def reduce(values, how):
            return how(values.expand(shape).to(torch.float64).reshape(-1))

        self.summary = [
            all_of(base & (kappa_up <= route.cond_cap)),
            all_of(base & (kappa_up <= alt_cap)),
            all_of(factor_ok),
            all_of(reliable),
            all_of(margin_ok),
            any_of(condemned),
            any_of(condemned_breakdown),
            any_of(condemned_reliable),
            any_of(condemned_margin),
            reduce(sigma_min_lo, torch.amin),
            reduce(bounds.sigma_max_up, torch.amax),
            reduce(cutoff_up, torch.amax),
            reduce(kappa_up, torch.amax),
            reduce(sigma_min_hi, torch.amin),
            reduce(cutoff_floor, torch.amax),
            reduce(kappa_floor, torch.amax),
        ]

    @classmethod
    def read(cls, values):
        flags = dict(zip(cls.FLAGS, (bool(v) for v in values)))
        numbers = dict(zip(cls.NUMBERS, values[len(cls.FLAGS):]))
        return flags, numbers


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
    for the whole batch, taken on the host after one device→host transfer (one CUDA
    synchronisation), or two when the quick stage of the bounds is inconclusive. Under ``vmap`` the
    decision is made for the whole stacked batch underneath; where even that is impossible
    (``torch.compile`` tracing, vmapped ``atol``/``rtol``) it simply calls ``torch.linalg.pinv``
    (without the value checks). Empty inputs give ``torch.linalg.pinv``'s result. Values only: no
    autograd graph is recorded. The route and its reason are logged at DEBUG level on the
    ``adjointgen.pinv`` logger.

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
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("pinv %s %s: %s: %s", tuple(A.shape), A.dtype, info.method, info.reason)
        return (X, info) if return_info else X

    from .checks import is_traced

    no_values = A.device.type == "meta" or (is_traced(A) and not _is_vmapped(A))
    if torch.compiler.is_compiling() or no_values or _is_vmapped(atol) or _is_vmapped(rtol):
        reason = "traced, or vmapped tolerances: no host decision possible; computed by torch.linalg.pinv"
        return result(torch_pinv(), PinvInfo(fallback_method, reason, None, None, None))
    if _is_vmapped(A):
        with torch.no_grad():
            unbatched = _unbatch(A.detach())
        logical = A.shape[:-2]
        if unbatched is None or not (_tolerance_fits_batch(atol, logical) and _tolerance_fits_batch(rtol, logical)):
            # another transform's wrapper between vmap levels, or tolerances that broadcast each
            # example's result beyond its batch shape: torch's own batching rule gives the semantics
            reason = "vmapped, not a plain stack of batches: no host decision possible; computed by torch.linalg.pinv"
            return result(torch_pinv(), PinvInfo(fallback_method, reason, None, None, None))
        physical, levels = unbatched
        with torch.no_grad():
            X, info = pinv_forward(physical, atol=atol, rtol=rtol, hermitian=hermitian, return_info=True)
        info = PinvInfo(info.method, f"vmapped: decided for the stacked batch; {info.reason}",
                        info.sigma_min_est, info.sigma_max_est, info.cutoff, info.levels)
        return result(_rebatch(X, levels), info)

    with torch.no_grad(), _ieee_float32_matmul(A.device):
        A = A.detach()
        m, n = A.shape[-2], A.shape[-1]
        batch = A.shape[:-2]
        real = _real_dtype(A.dtype)
        eps = torch.finfo(real).eps

        if A.numel() == 0:
            # nothing to decide; the tolerance tensors are still checked, as for any input
            tensors = any(isinstance(tol, torch.Tensor) for tol in (atol, rtol))
            if tensors and bool(_bad_tolerance(atol, rtol, A.device, real)):
                raise ValueError("pinv: atol/rtol tensors must be non-negative and not NaN")
            return result(torch_pinv(), PinvInfo(fallback_method, "empty input", None, None, None))

        symmetry_tol = SYMMETRY_FACTOR * n * eps

        def raise_if_invalid(bad_entries_h, bad_symmetry_h, bad_tolerance_h):
            """Raise for invalid input; ``True`` when ‖A‖_F overflowed (finite entries): leave it to torch."""
            if bad_entries_h or bad_symmetry_h:
                message = _invalid_input_message(A, hermitian, symmetry_tol)
                if message != "pinv: invalid input":
                    raise ValueError(message)
                return True
            if bad_tolerance_h:
                raise ValueError("pinv: atol/rtol tensors must be non-negative and not NaN")
            return False

        def input_checks(frobenius):
            """NaN/Inf entries (or an overflowing norm), asymmetry, bad tolerances: device flags."""
            bad_entries = ~torch.isfinite(frobenius).all()
            if hermitian:
                asymmetry = torch.linalg.matrix_norm(A - A.mH)
                bad_symmetry = (asymmetry > symmetry_tol * frobenius).any()
            else:
                bad_symmetry = torch.zeros((), dtype=torch.bool, device=A.device)
            bad_tolerance = _bad_tolerance(atol, rtol, A.device, real)
            return [flag.to(torch.float64) for flag in (bad_entries, bad_symmetry, bad_tolerance)]

        if not (_tolerance_fits_batch(atol, batch) and _tolerance_fits_batch(rtol, batch)):
            # Tolerances that broadcast the result beyond the batch shape: leave the semantics to torch.
            if raise_if_invalid(*torch.stack(input_checks(torch.linalg.matrix_norm(A))).tolist()):
                reason = "‖A‖_F overflows; computed by torch.linalg.pinv"
            else:
                reason = "atol/rtol broadcast beyond the batch shape; computed by torch.linalg.pinv"
            return result(torch_pinv(), PinvInfo(fallback_method, reason, None, None, None))

        # ---- factorization and the quick stage of the bounds, all on the device ---------------------
        # (the checks of the data are gathered on the way and read with the quick stage's decision)
        atol_t, rtol_t = _resolve_tolerances(A, atol, rtol)
        stable_cap = eps**-0.5
        normal_cap = eps ** (-1.0 / 6.0)
        if hermitian:
            route = _hermitian_route(A, torch.linalg.matrix_norm(A), stable_cap)
        elif m == n:
            route = _lu_route(A, torch.linalg.matrix_norm(A), stable_cap)
        else:
            route = _gram_route(A, stable_cap, normal_cap)  # ‖A‖_F from the Gram matrix's trace
        checks = input_checks(route.frobenius)

        quick = QUICK_LEVELS[route.kind]
        route.inverse.run(quick)
        if route.quick_forward:
            route.forward.run(quick)
        verdict = _Verdict(route, route.bounds(), atol_t, rtol_t, batch)
        summary = torch.stack(checks + verdict.summary).tolist()  # the one device -> host transfer
        if raise_if_invalid(*summary[:3]):
            # All entries finite but ‖A‖_F overflowed: the bounds are meaningless, let torch do it.
            reason = "‖A‖_F overflows; computed by torch.linalg.pinv"
            return result(torch_pinv(), PinvInfo(fallback_method, reason, None, None, None))
        flags, numbers = _Verdict.read(summary[3:])
        stage = f"quick stage, {route.inverse.levels} levels"

        def info(method, reason):
            sigma_min = _optional_float(numbers["sigma_min"]) if flags["factor_ok"] else None
            return PinvInfo(method, reason, sigma_min, _optional_float(numbers["sigma_max"]),
                            _optional_float(numbers["cutoff"]), route.inverse.levels)

        def estimates():
            return (
                f"sigma_min >= {numbers['sigma_min']:.3g}, sigma_max <= {numbers['sigma_max']:.3g}, "
                f"cutoff <= {numbers['cutoff']:.3g}, cond <= {numbers['cond']:.3g}; {stage}"
            )

        if flags["condemned"]:
            # refused on deterministic grounds: raw estimates no further iteration can lower
            if flags["condemned_breakdown"]:
                why = route.breakdown
            elif flags["condemned_reliable"]:
                why = "the Gram matrix cannot resolve sigma_min (rounding correction too large)"
            elif flags["condemned_margin"]:
                why = (
                    f"a singular value lies within {CUTOFF_MARGIN:g}x of the cutoff "
                    f"(sigma_min <= {numbers['sigma_min_hi']:.3g}, cutoff >= {numbers['cutoff_floor']:.3g}; {stage})"
                )
            else:
                cap = route.alternative[1] if route.alternative else route.cond_cap
                why = (
                    f"condition number above the accuracy cap {cap:.3g} (cond >= {numbers['cond_floor']:.3g}; "
                    f"{stage})"
                )
            return result(torch_pinv(), info(fallback_method, f"fallback: {why}"))

        if not flags["accept"]:
            # ---- inconclusive: the full stage, iterating on from where the quick one stopped --------
            full = _levels_needed(route.n)
            route.inverse.run(full)
            route.forward.run(full)
            verdict = _Verdict(route, route.bounds().combine(verdict.bounds), atol_t, rtol_t, batch)
            flags, numbers = _Verdict.read(torch.stack(verdict.summary).tolist())  # the second transfer
            stage = f"full stage, {route.inverse.levels} levels"

        if flags["accept"]:
            why = f"fast path: {estimates()}; cond cap for {route.method} {route.cond_cap:.3g}"
            return result(route.finish(), info(route.method, why))
        if route.alternative is not None and flags["accept_alt"]:
            method, cap, finish = route.alternative
            why = (
                f"fast path: {estimates()}; above the normal-equations cap {route.cond_cap:.3g}, "
                f"within the {method} cap {cap:.3g}"
            )
            return result(finish(), info(method, why))
        if not flags["factor_ok"]:
            why = route.breakdown
        elif not flags["reliable"]:
            why = "the Gram matrix cannot resolve sigma_min (rounding correction too large)"
        elif not flags["margin_ok"]:
            why = f"a singular value may lie within {CUTOFF_MARGIN:g}x of the cutoff ({estimates()})"
        else:
            cap = route.alternative[1] if route.alternative else route.cond_cap
            why = f"condition bound above the accuracy cap {cap:.3g} ({estimates()})"
        return result(torch_pinv(), info(fallback_method, f"fallback: {why}"))

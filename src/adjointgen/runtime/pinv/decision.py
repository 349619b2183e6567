"""The verdict of the bounds, the refusal reasons, and pinv_forward itself.

Part of :mod:`adjointgen.runtime.pinv` (its docstring says what the whole guarantees)."""
from __future__ import annotations

import logging
import math
from typing import Optional

import torch

from .common import CUTOFF_MARGIN, GRAM_CORRECTION_MAX, PinvInfo, QUICK_LEVELS, SYMMETRY_FACTOR, Tolerance, _log
from .arguments import _check_static, _ieee_float32_matmul, _is_vmapped, _real_dtype, _rebatch, _resolve_tolerances, _tolerance_fits_batch, _unbatch
from .bounds import _levels_needed
from .routes import _Bounds, _Route, _gram_route, _hermitian_route, _lu_route

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


def _refusal(route: "_Route", failed: str, detail: str, certain: bool) -> str:
    """Why the route's result is refused, the first failed test first: ``factor`` (the
    factorization broke down), ``reliable`` (the Gram matrix cannot resolve sigma_min), ``margin``
    (a singular value near the cutoff), ``cond`` (the condition bound above the route's accuracy
    cap).  ``certain``: the raw estimates themselves fail (no further iteration can help), else
    the bounds do; ``detail``: the numbers behind it."""
    if failed == "factor":
        return route.breakdown
    if failed == "reliable":
        return "the Gram matrix cannot resolve sigma_min (rounding correction too large)"
    if failed == "margin":
        return f"a singular value {'lies' if certain else 'may lie'} within {CUTOFF_MARGIN:g}x of the cutoff ({detail})"
    cap = route.alternative[1] if route.alternative else route.cond_cap
    return f"condition {'number' if certain else 'bound'} above the accuracy cap {cap:.3g} ({detail})"


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
        from ..routes import taken

        taken("pinv", info.method)
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("pinv %s %s: %s: %s", tuple(A.shape), A.dtype, info.method, info.reason)
        return (X, info) if return_info else X

    from ..checks import is_traced

    no_values = A.device.type == "meta" or (is_traced(A) and not _is_vmapped(A))
    if torch.compiler.is_compiling() or no_values or _is_vmapped(atol) or _is_vmapped(rtol):
        reason = "traced, or vmapped tolerances: no host decision possible; computed from the SVD (eigh)"
        if torch.compiler.is_compiling() or A.device.type == "meta":  # torch's pinv compiles wrongly for complex A
            return result(_decomposed_pinv(A.detach(), atol, rtol, hermitian), PinvInfo(fallback_method, reason, None,
                                                                                       None, None))
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
            failed = ("factor" if flags["condemned_breakdown"] else "reliable" if flags["condemned_reliable"]
                      else "margin" if flags["condemned_margin"] else "cond")
            detail = (f"sigma_min <= {numbers['sigma_min_hi']:.3g}, cutoff >= {numbers['cutoff_floor']:.3g}; {stage}"
                      if failed == "margin" else f"cond >= {numbers['cond_floor']:.3g}; {stage}")
            return result(torch_pinv(), info(fallback_method, f"fallback: {_refusal(route, failed, detail, True)}"))

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
        failed = ("factor" if not flags["factor_ok"] else "reliable" if not flags["reliable"]
                  else "margin" if not flags["margin_ok"] else "cond")
        return result(torch_pinv(), info(fallback_method, f"fallback: {_refusal(route, failed, estimates(), False)}"))


def _decomposed_pinv(A, atol, rtol, hermitian):
    """``torch.linalg.pinv``'s result from ``torch.linalg.svd`` (``eigh`` when ``hermitian``) and its
    cutoff (``max(atol, rtol * sigma_max)``; ``rtol`` defaults to ``eps * max(m, n)`` where ``atol`` is
    not given, else 0), for a compiler: ``torch.compile`` of ``torch.linalg.pinv`` returns wrong
    values for complex input (torch 2.13, ``aot_eager`` and ``inductor``: off by 0.7 on a 5 x 3
    matrix), while these operations compile right."""
    real = _real_dtype(A.dtype)
    m, n = A.shape[-2], A.shape[-1]
    if rtol is None:
        rtol = torch.finfo(real).eps * max(m, n) if atol is None else 0.0
    atol = 0.0 if atol is None else atol
    if hermitian:
        w, V = torch.linalg.eigh(A)
        size = w.abs()
    else:
        U, size, Vh = torch.linalg.svd(A, full_matrices=False)
    # tolerances broadcast against the batch: a trailing dimension for the values
    atol_t = torch.as_tensor(atol, dtype=real, device=A.device).unsqueeze(-1)
    rtol_t = torch.as_tensor(rtol, dtype=real, device=A.device).unsqueeze(-1)
    cutoff = torch.maximum(atol_t, rtol_t * size.amax(-1, keepdim=True))
    keep = size > cutoff
    values = w if hermitian else size
    inv = torch.where(keep, 1 / torch.where(keep, values, torch.ones_like(values)), torch.zeros_like(values))
    if hermitian:
        return (V * inv.to(A.dtype).unsqueeze(-2)) @ V.mH
    return (Vh.mH * inv.to(A.dtype).unsqueeze(-2)) @ U.mH

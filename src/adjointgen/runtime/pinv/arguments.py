"""Argument checks, tolerances, and the plumbing for torch.func, torch.compile and TF32.

Part of :mod:`adjointgen.runtime.pinv` (its docstring says what the whole guarantees)."""
from __future__ import annotations

import contextlib
import math

import torch

from .common import Tolerance

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

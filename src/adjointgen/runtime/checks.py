"""Argument checks shared by the public functions.  Each raises ``ValueError`` naming the problem.

Value-dependent checks (finiteness, symmetry) need the data on the host; they are skipped while a
``torch.func`` transform (``vmap``) or a compiler traces the call, where such data is not available.
"""
from __future__ import annotations

import torch


def _is_traced(x: torch.Tensor) -> bool:
    try:
        from torch._C._functorch import is_batchedtensor, is_functorch_wrapped_tensor
    except ImportError:  # pragma: no cover - older torch
        return False
    if torch.compiler.is_compiling():
        return True
    return bool(is_batchedtensor(x) or (is_functorch_wrapped_tensor(x) and _wraps_batched(x)))


def _wraps_batched(x) -> bool:
    from torch._C._functorch import get_unwrapped, is_batchedtensor, is_functorch_wrapped_tensor

    while is_functorch_wrapped_tensor(x):
        if is_batchedtensor(x):
            return True
        x = get_unwrapped(x)
    return False


def tensor(x, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def floating(x: torch.Tensor, name: str, *, complex_ok: bool = False) -> None:
    ok = (torch.float32, torch.float64) + ((torch.complex64, torch.complex128) if complex_ok else ())
    if x.dtype not in ok:
        kinds = "float32/float64" + ("/complex64/complex128" if complex_ok else "")
        raise ValueError(f"{name} must be {kinds}, got {x.dtype}")


def matrix(x: torch.Tensor, name: str, *, square: bool = False) -> None:
    if x.dim() < 2:
        raise ValueError(f"{name} must have shape (..., m, n), got {tuple(x.shape)}")
    if square and x.shape[-1] != x.shape[-2]:
        raise ValueError(f"{name} must be square, got shape {tuple(x.shape)}")
    if x.shape[-1] == 0 or x.shape[-2] == 0:
        raise ValueError(f"{name} has an empty dimension: shape {tuple(x.shape)}")


def finite(x: torch.Tensor, name: str) -> None:
    if _is_traced(x):
        return
    with torch.no_grad():
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} contains NaN or Inf")


def symmetric(x: torch.Tensor, name: str, *, rtol: float | None = None) -> None:
    """``‖X - X^T‖_max <= rtol * ‖X‖_max`` (rtol defaults to 100 eps of the dtype)."""
    if _is_traced(x):
        return
    rtol = 100 * torch.finfo(x.dtype).eps if rtol is None else rtol
    with torch.no_grad():
        asym = (x - x.mH).abs().amax()
        scale = x.abs().amax()
        if bool(asym > rtol * scale):
            raise ValueError(
                f"{name} is not {'Hermitian' if x.is_complex() else 'symmetric'}: "
                f"max |{name} - {name}^{'H' if x.is_complex() else 'T'}| = {float(asym):.3e} > "
                f"{rtol:.1e} * max |{name}| = {float(rtol * scale):.3e}"
            )


def symmetric_matrix(x, name: str, *, complex_ok: bool = False) -> torch.Tensor:
    """All checks for a batched real symmetric (or, with ``complex_ok``, Hermitian) input."""
    tensor(x, name)
    floating(x, name, complex_ok=complex_ok)
    matrix(x, name, square=True)
    finite(x, name)
    symmetric(x, name)
    return x

"""Array-module helpers for the generated CuPy/NumPy rules."""
from __future__ import annotations

import functools
from importlib import resources

import numpy

try:  # CuPy is optional: without it every rule runs on NumPy arrays
    import cupy
except Exception:  # pragma: no cover - depends on the machine
    cupy = None


def array_module(*arrays):
    """``cupy`` if any argument is a CuPy array, else ``numpy``."""
    if cupy is not None:
        return cupy.get_array_module(*arrays)
    return numpy


def is_cupy(xp) -> bool:
    return cupy is not None and xp is cupy


def add_diag(xp, X, d):
    """``X + diag(d)`` for batched ``X`` (..., n, n) and ``d`` (..., n)."""
    out = X.copy()
    idx = xp.arange(d.shape[-1])
    out[..., idx, idx] += d
    return out


@functools.lru_cache(maxsize=None)
def _module(op: str):
    source = resources.files("adjointgen.generated").joinpath("cuda", f"{op}.cu").read_text()
    return cupy.RawModule(code=source, options=("--std=c++14",))


def launch_pairwise_kernel(op: str, fn: str, part: str, w, X, threads: int = 256):
    """Run the generated kernel ``<fn>_mul_<part>_<f32|f64>`` of ``generated/cuda/<op>.cu``."""
    if X.dtype not in (numpy.float32, numpy.float64):
        raise TypeError(f"{fn}: CUDA kernels exist for float32 and float64, not {X.dtype}")
    suffix = "f32" if X.dtype == numpy.float32 else "f64"
    kernel = _module(op).get_function(f"{fn}_mul_{part}_{suffix}")
    w = cupy.ascontiguousarray(w, dtype=X.dtype)
    X = cupy.ascontiguousarray(X)
    out = cupy.empty_like(X)
    total = X.size
    blocks = min((total + threads - 1) // threads, 65535)
    if total:
        kernel((blocks,), (threads,), (w, X, out, numpy.int32(X.shape[-1]), numpy.int64(total)))
    return out

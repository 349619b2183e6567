"""Forwards that run on the host: one NumPy function, declared once by a derivation
(``d.forward(host="scipy.linalg:schur")``), adapted to every backend.

The host function takes one NumPy array per input -- a single matrix (2-D) -- and the forward's
options as keywords, and returns one array or a tuple of them (as SciPy's functions do).  The
adapters below give it batches, devices and tracers:

- :func:`torch_forward`: tensors to NumPy and back, on the inputs' device, in their precision (a
  complex result of real inputs stays complex), every batch element one call; opaque to
  ``torch.compile`` (``torch.compiler.disable``: tracing into SciPy takes tens of seconds and
  records nothing useful); meta and fake tensors get empty outputs of the right shapes and dtypes;
- :func:`array_forward`: NumPy arrays directly, CuPy arrays by a host round trip;
- :func:`jax_forward`: concrete arrays directly (a domain error raises as itself), traced ones
  through ``jax.pure_callback`` with a batching rule (``vmap``'s dimension is one more batch
  dimension of the loop).

Where no values exist (an empty batch, meta tensors, JAX tracing) the output shapes and dtypes are
those of one call on identity matrices of the inputs' matrix shapes and dtypes (so the host function
must accept identity matrices).  No formula and no operation name lives here: the derivatives are
the derived rules, which the generated code applies around these forwards.
"""
from __future__ import annotations

import contextlib
import functools
import importlib

import numpy

__all__ = ["array_forward", "call", "jax_forward", "probe", "resolve", "single_threaded_blas", "torch_forward"]


@functools.lru_cache(maxsize=None)
def _blas_pools():
    try:
        import scipy.linalg  # noqa: F401  (its OpenBLAS loaded, so that it is selected too)
        from threadpoolctl import ThreadpoolController

        return ThreadpoolController().select(user_api="blas")
    except Exception:  # pragma: no cover - threadpoolctl missing or failing: the pools as they are
        return None


def single_threaded_blas():
    """A context in which NumPy's and SciPy's BLAS run on one thread, for host computations between
    the CPU operations of torch or XLA.  Their own thread pools wait spinning after each operation,
    and a second OpenBLAS thread makes both pools contend for the cores: on 2 cores an n = 128 NumPy
    product followed by a torch one took 13.6 ms where each takes 0.1-0.3 ms, and a SciPy Schur form
    followed by a torch product 25.6 ms where the Schur form alone takes 9 (threadpoolctl limits
    OpenBLAS for the duration, about 17 us per use)."""
    pools = _blas_pools()
    return pools.limit(limits=1) if pools is not None and pools.lib_controllers else contextlib.nullcontext()


@functools.lru_cache(maxsize=None)
def resolve(name: str):
    """The function ``name`` (``"package.module:function"``)."""
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


def _batch_shape(arrays) -> tuple:
    return numpy.broadcast_shapes(*(a.shape[:-2] for a in arrays)) if arrays else ()


def _as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _precision(kind_of, like) -> numpy.dtype:
    """The dtype of an output whose values came out as ``kind_of``, in the precision of the inputs
    ``like``: real or complex as the host function returned it, single or double as the inputs."""
    single = all(numpy.dtype(a.dtype) in (numpy.float32, numpy.complex64) for a in like) if like else False
    complex_ = numpy.iscomplexobj(kind_of)
    if single:
        return numpy.dtype(numpy.complex64 if complex_ else numpy.float32)
    return numpy.dtype(numpy.complex128 if complex_ else numpy.float64) if kind_of.dtype.kind in "fc" \
        else kind_of.dtype


def probe(fn, arrays, options: dict) -> tuple:
    """``(shapes, dtypes, single)`` of ``fn``'s outputs for one matrix, from a call on identity
    matrices of the inputs' matrix shapes and dtypes (``single``: it returns one array)."""
    eye = [numpy.eye(*a.shape[-2:], dtype=numpy.dtype(a.dtype)) for a in arrays]
    out = fn(*eye, **options)
    single = not isinstance(out, (tuple, list))
    outs = tuple(numpy.asarray(o) for o in _as_tuple(out))
    return tuple(o.shape for o in outs), tuple(_precision(o, arrays) for o in outs), single


def call(fn, arrays, options: dict):
    """``fn`` on every matrix of the (broadcast) batch of the NumPy ``arrays``: the outputs stacked,
    one array or a tuple as ``fn`` returns them, each in the inputs' precision."""
    batch = _batch_shape(arrays)
    arrays = [numpy.broadcast_to(a, batch + a.shape[-2:]) for a in arrays]
    if not int(numpy.prod(batch, dtype=numpy.int64)):
        shapes, dtypes, single = probe(fn, arrays, options)
        outs = tuple(numpy.empty(batch + s, dtype=t) for s, t in zip(shapes, dtypes))
        return outs[0] if single else outs
    outs, single = None, False
    for index in numpy.ndindex(*batch):
        result = fn(*(a[index] for a in arrays), **options)
        parts = tuple(numpy.asarray(o) for o in _as_tuple(result))
        if outs is None:
            single = not isinstance(result, (tuple, list))
            outs = tuple(numpy.empty(batch + p.shape, dtype=_precision(p, arrays)) for p in parts)
        for out, part in zip(outs, parts):
            if numpy.iscomplexobj(part) and not numpy.iscomplexobj(out):
                raise TypeError(f"the host forward {fn.__module__}.{fn.__qualname__} returned complex values for "
                                "one matrix of the batch and real ones for another")
            out[index] = part
    return outs[0] if single else outs


# ---------------------------------------------------------------- torch
def torch_forward(name: str):
    """The host function ``name`` as a torch forward (see the module's docstring)."""
    import torch

    @torch.compiler.disable  # SciPy on the host: a compiler runs it as is
    def forward(*tensors, **options):
        from .checks import host_arrays, is_compiling_or_fake

        fn = resolve(name)
        device = tensors[0].device if tensors else torch.device("cpu")
        if any(t.is_meta or is_compiling_or_fake(t) for t in tensors):
            batch = torch.broadcast_shapes(*(t.shape[:-2] for t in tensors))
            like = [numpy.empty(t.shape[-2:], dtype=_numpy_dtype(t.dtype)) for t in tensors]
            shapes, dtypes, single = probe(fn, like, options)
            outs = tuple(torch.empty(*batch, *s, dtype=_torch_dtype(d), device=device) for s, d in zip(shapes, dtypes))
            return outs[0] if single else outs
        arrays = host_arrays(name, *tensors)
        with single_threaded_blas():
            out = call(fn, arrays, options)
        outs = tuple(torch.from_numpy(numpy.ascontiguousarray(o)).to(device) for o in _as_tuple(out))
        return outs if isinstance(out, tuple) else outs[0]

    forward.__name__ = forward.__qualname__ = name.rpartition(":")[2]
    forward.__doc__ = f"``{name}`` on the host, for torch tensors (:func:`adjointgen.runtime.host.torch_forward`)."
    return forward


def _numpy_dtype(dtype):
    import torch

    return {torch.float32: numpy.float32, torch.float64: numpy.float64, torch.complex64: numpy.complex64,
            torch.complex128: numpy.complex128}.get(dtype, numpy.float64)


def _torch_dtype(dtype):
    import torch

    return {numpy.dtype(numpy.float32): torch.float32, numpy.dtype(numpy.float64): torch.float64,
            numpy.dtype(numpy.complex64): torch.complex64, numpy.dtype(numpy.complex128): torch.complex128}[
        numpy.dtype(dtype)]


# ---------------------------------------------------------------- NumPy and CuPy
def array_forward(name: str):
    """The host function ``name`` as a NumPy/CuPy forward (see the module's docstring)."""

    def forward(*arrays, **options):
        from .xp import array_module, is_cupy

        xp = array_module(*arrays)
        host = [a.get() if is_cupy(xp) else numpy.asarray(a) for a in arrays]
        out = call(resolve(name), host, options)
        outs = tuple(xp.asarray(o) for o in _as_tuple(out))
        return outs if isinstance(out, tuple) else outs[0]

    forward.__name__ = forward.__qualname__ = name.rpartition(":")[2]
    forward.__doc__ = f"``{name}`` on the host, for NumPy and CuPy arrays (:func:`adjointgen.runtime.host.array_forward`)."
    return forward


# ---------------------------------------------------------------- JAX
def jax_forward(name: str):
    """The host function ``name`` as a JAX forward (see the module's docstring)."""

    def forward(*arrays, **options):
        import jax
        import jax.numpy as jnp

        fn = resolve(name)
        if not any(isinstance(a, jax.core.Tracer) for a in arrays):  # concrete: a domain error raises as itself
            host = [numpy.asarray(a) for a in arrays]
            with single_threaded_blas():
                out = call(fn, host, options)
            outs = tuple(jnp.asarray(o) for o in _as_tuple(out))
            return outs if isinstance(out, tuple) else outs[0]
        batch = jnp.broadcast_shapes(*(a.shape[:-2] for a in arrays))
        like = [numpy.empty(a.shape[-2:], dtype=numpy.dtype(a.dtype)) for a in arrays]
        shapes, dtypes, single = probe(fn, like, options)
        structs = tuple(jax.ShapeDtypeStruct(batch + s, d) for s, d in zip(shapes, dtypes))

        def on_host(*xs):
            with single_threaded_blas():
                return _as_tuple(call(fn, [numpy.asarray(x) for x in xs], options))

        outs = jax.pure_callback(on_host, structs, *arrays, vmap_method="broadcast_all")
        return outs[0] if single else tuple(outs)

    forward.__name__ = forward.__qualname__ = name.rpartition(":")[2]
    forward.__doc__ = f"``{name}`` on the host, for JAX arrays (:func:`adjointgen.runtime.host.jax_forward`)."
    return forward

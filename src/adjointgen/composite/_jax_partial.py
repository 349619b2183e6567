"""What ``agj.eigsh`` and ``agj.svds`` share: the forward on the host (directly where the values are
concrete, through ``jax.pure_callback`` under ``jit``), the test of whether ``k`` cuts a cluster, and
what a cut does to the derivative (an error where the values are concrete, NaN where traced)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy

from ..runtime import jax as _rt
from ..runtime.gauge import DegenerateSubspaceError


def on_host(fn, shapes, A, **options):
    """``fn(A, **options)`` (NumPy in, NumPy out): called directly on a concrete ``A``, else through
    ``jax.pure_callback`` with the result ``shapes`` (batched by ``vmap`` as one call)."""
    if _rt.is_concrete(A):
        return tuple(jnp.asarray(x) for x in fn(A, **options))
    return jax.pure_callback(functools.partial(fn, **options), shapes, A, vmap_method="expand_dims")


def cut(values, nxt, rtol):
    """Per batch element, whether ``k`` cuts a cluster: the last kept and the first discarded value
    equal within ``rtol`` (default ``sqrt(eps)``, as the cluster checks) times the largest ``|value|``."""
    rtol = float(numpy.sqrt(numpy.finfo(values.dtype).eps)) if rtol is None else float(rtol)
    if not values.shape[-1]:
        return jnp.zeros(nxt.shape, bool)
    scale = jnp.maximum(jnp.max(jnp.abs(values), axis=-1), jnp.abs(nxt))
    return jnp.abs(values[..., -1] - nxt) <= rtol * scale


def through_cut(op: str, k: int, largest: bool, kind: str, is_cut, tangents):
    """The tangents, where ``k`` cuts no cluster.  A concrete cut raises
    :class:`~adjointgen.runtime.gauge.DegenerateSubspaceError`; a traced one makes the tangents of
    those batch elements NaN (a factor, so that transposition keeps it)."""
    if _rt.concrete_true(jnp.any, is_cut):
        raise DegenerateSubspaceError(
            f"{op}: k = {k} cuts through a degenerate {kind} (the last kept one equals the first discarded one "
            f"within the cluster tolerance), so which vectors of that cluster are the {k} "
            f"{'largest' if largest else 'smallest'} is arbitrary and no derivative exists (JAX's custom_jvp "
            "cannot see which pairs the loss uses): change k so the cluster is kept whole or left out")
    factor = jnp.where(is_cut, jnp.nan, 1.0)
    return tuple(t * factor.reshape(factor.shape + (1,) * (t.ndim - factor.ndim)).astype(t.dtype) for t in tangents)


def check_k(op: str, k, largest_k: int, what: str) -> int:
    """``k`` as an int in ``1 .. largest_k``, or a ``ValueError``."""
    if isinstance(k, bool) or not isinstance(k, (int, numpy.integer)) or not 1 <= int(k) <= largest_k:
        raise ValueError(f"{op}: k must be an integer with 1 <= k <= {what} = {largest_k}, got {k!r}")
    return int(k)

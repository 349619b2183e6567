"""The JAX runtime of the generated JAX modules (``adjointgen.generated.jax.<op>``).

What a generated JAX module needs beyond its rule functions, written once for every operation:

- the array helpers its rules call (the same names and meanings as :mod:`adjointgen.runtime.xp`,
  with ``xp`` being ``jax.numpy``; no in-place update, so everything traces, batches and
  transposes);
- the forward computations on ``jax.numpy`` (:func:`svd`, :func:`pinv`, :func:`eigh_generalized`);
- :func:`inputs`, the argument checks of a public function: dtype and shape always, the values
  (NaN/Inf) only where they are concrete (outside ``jit``; a traced value cannot raise);
- :func:`jvp`, the dispatch of its ``jax.custom_jvp`` rule, which picks the complex or real derived
  JVP and wraps the output tangents in :func:`gauge_checked`, whose transpose is where reverse mode
  checks the loss against the gauge.

**Gauges in JAX.**  JAX's reverse mode transposes the derived JVP, so the cotangents of the outputs
reach only the transposed program, where a Python exception cannot be raised.  The output tangents
pass through an identity whose transpose is custom (``jax.lax.custom_linear_solve``): there the
derived gauge residuals (the rules ``<op>_vjp_checked`` return them) are evaluated on the
cotangents, and a batch element whose loss depends on the gauge (the basis inside a cluster of
equal values, the individual values of a cluster, a complex phase) gets NaN cotangents, so exactly
the gradients that do not exist are NaN and never a finite wrong value.  With
:func:`checks_with_checkify` on, the same condition is a ``jax.experimental.checkify`` check instead.
In forward mode, a concrete tangent that splits a cluster raises
:class:`~adjointgen.runtime.gauge.DegenerateSubspaceError` as on the torch side.

Imports JAX, NumPy and the library-free :mod:`adjointgen.runtime` modules; never torch.
"""
from __future__ import annotations

import contextlib
import math

import jax
import jax.numpy as jnp
import numpy
from jax import lax

from . import gauge
from .rules import Rules
from .xp import assemble, cluster_mask, lu_solve, masked_quotient, matrix_part, negligible, quotient, reciprocal
from .xp import shifted_solve, zero_where_negligible

__all__ = [
    "add_diag", "array_module", "assemble", "broadcast_batch", "check_tangent", "checks_with_checkify", "cluster_mask",
    "eigh_generalized", "gauge_checked", "inputs", "is_concrete", "jvp", "lu_solve", "masked_quotient",
    "matrix_part", "negligible", "pinv", "quotient", "reciprocal", "shifted_solve", "solve_triangular", "svd",
    "symmetrized", "zero_where_negligible", "check_finite_outputs",
]

_CHECKIFY = False


def array_module(*arrays):
    """``jax.numpy``: the module the generated rules compute with."""
    return jnp


def is_concrete(*xs) -> bool:
    """Whether every array is a concrete value (not traced by ``jit``, ``vmap``, ``grad``)."""
    return not any(isinstance(x, jax.core.Tracer) for x in xs if x is not None)


def add_diag(xp, X, d):
    """``X + diag(d)`` for batched ``X`` (..., n, n) and ``d`` (..., n)."""
    n = X.shape[-1]
    idx = jnp.arange(n)
    batch = jnp.broadcast_shapes(X.shape[:-2], d.shape[:-1])
    X = jnp.broadcast_to(X, batch + X.shape[-2:])
    return X.at[..., idx, idx].add(d.astype(X.dtype) if not jnp.iscomplexobj(d) else d)


def solve_triangular(xp, M, B, lower: bool, unit: bool = False):
    """``M^-1 B`` for triangular ``M`` (batched, broadcasting): ``jax.scipy.linalg.solve_triangular``."""
    batch = jnp.broadcast_shapes(M.shape[:-2], B.shape[:-2])
    M = jnp.broadcast_to(M, batch + M.shape[-2:])
    B = jnp.broadcast_to(B, batch + B.shape[-2:])
    return jax.scipy.linalg.solve_triangular(M, B, lower=lower, unit_diagonal=unit)


# ---------------------------------------------------------------- forward computations (jax.numpy)
def svd(A):
    """Thin SVD ``(U, S, Vh)``."""
    return tuple(jnp.linalg.svd(A, full_matrices=False))


def eigh_generalized(A, B):
    """``A V = B V diag(w)``, ``V^H B V = I`` through the Cholesky factor of ``B`` (batched)."""
    L = jnp.linalg.cholesky(B)
    Linv = solve_triangular(jnp, L, jnp.broadcast_to(jnp.eye(L.shape[-1], dtype=L.dtype), L.shape), lower=True)
    LinvH = jnp.conj(jnp.swapaxes(Linv, -1, -2))
    C = Linv @ A @ LinvH
    w, Y = jnp.linalg.eigh(0.5 * (C + jnp.conj(jnp.swapaxes(C, -1, -2))))
    return w, LinvH @ Y


def pinv(A, atol=None, rtol=None, hermitian=False):
    """The pseudo-inverse with ``torch.linalg.pinv``'s cutoff (:func:`adjointgen.runtime.xp.pinv`)."""
    m, n = A.shape[-2:]
    if rtol is None:
        rtol = numpy.finfo(A.dtype).eps * max(m, n) if atol is None or atol == 0 else 0.0
    atol = 0.0 if atol is None else atol
    U, s, Vh = jnp.linalg.svd(A, full_matrices=False)
    cutoff = jnp.maximum(atol, rtol * (s[..., :1] if s.shape[-1] else 0))
    s_inv = jnp.where(s > cutoff, 1 / jnp.where(s > cutoff, s, 1), 0)
    return (jnp.conj(jnp.swapaxes(Vh, -1, -2)) * s_inv[..., None, :]) @ jnp.conj(jnp.swapaxes(U, -1, -2))


# ---------------------------------------------------------------- argument checks
def inputs(op: str, named, *, square, complex_ok: bool):
    """Check a public function's inputs (``(name, array)`` pairs): floating (complex where
    ``complex_ok``), matrices (``square`` per input), one dtype; NaN/Inf where the values are
    concrete.  Returns the arrays as ``jax`` arrays."""
    out = []
    dtype = None
    for (name, x), sq in zip(named, square):
        x = jnp.asarray(x)
        kind = numpy.dtype(x.dtype).kind
        if kind not in ("f", "c") or (kind == "c" and not complex_ok):
            raise TypeError(f"{op}: {name} must be a floating{' or complex' if complex_ok else ''} array, "
                            f"got dtype {x.dtype}")
        if x.ndim < 2:
            raise ValueError(f"{op}: {name} must be a (..., m, n) matrix, got shape {tuple(x.shape)}")
        if sq and x.shape[-1] != x.shape[-2]:
            raise ValueError(f"{op}: {name} must be square, got shape {tuple(x.shape)}")
        if dtype is not None and x.dtype != dtype:
            raise TypeError(f"{op}: the inputs must have one dtype, got {dtype} and {x.dtype} ({name})")
        dtype = x.dtype
        if is_concrete(x) and x.size and not bool(jnp.isfinite(x).all()):
            raise ValueError(f"{op}: {name} has NaN or Inf entries")
        out.append(x)
    return out


def broadcast_batch(*xs):
    """The arrays with their batch dimensions (all but the last two) broadcast to one shape."""
    batch = jnp.broadcast_shapes(*(x.shape[:-2] for x in xs))
    return tuple(jnp.broadcast_to(x, batch + x.shape[-2:]) for x in xs)


def symmetrized(x):
    """``(x + x^H) / 2``: the Hermitian part, as ``jax.numpy.linalg.eigh(symmetrize_input=True)``
    takes it (the derivative of a function of a symmetric matrix along any direction)."""
    return 0.5 * (x + jnp.conj(jnp.swapaxes(x, -1, -2)))


def check_finite_outputs(op: str, what: str, *xs) -> None:
    """Raise ``ValueError`` where a concrete forward output has NaN (a Cholesky factor of a matrix
    that is not positive definite, as ``jax.numpy.linalg.cholesky`` returns it)."""
    if is_concrete(*xs) and any(x.size and not bool(jnp.isfinite(x).all()) for x in xs):
        raise ValueError(f"{op}: {what}")


# ---------------------------------------------------------------- forward mode at clusters
def check_tangent(xp, op, X, denominator, d, rtol=None):
    """Raise :class:`~adjointgen.runtime.gauge.DegenerateSubspaceError` when a concrete projected
    tangent ``X`` splits a cluster of equal ``d`` (see
    :func:`adjointgen.runtime.degeneracy.check_tangent` for why); traced tangents (``grad``,
    ``jit``) are left to the reverse-mode check of :func:`gauge_checked`."""
    if not gauge.enabled() or not is_concrete(X, d) or d.shape[-1] < 2 or X.size == 0:
        return
    X, d, denominator = numpy.asarray(X), numpy.asarray(d), numpy.asarray(denominator)
    from .xp import check_tangent as host_check

    host_check(numpy, op, X, denominator, d, rtol)


# ---------------------------------------------------------------- dispatch and the reverse-mode gauge check
@contextlib.contextmanager
def checks_with_checkify(flag: bool = True):
    """Within this block, functions traced make a gauge violation a ``checkify`` check (run them
    under ``jax.experimental.checkify.checkify``) instead of NaN cotangents."""
    global _CHECKIFY
    old, _CHECKIFY = _CHECKIFY, flag
    try:
        yield
    finally:
        _CHECKIFY = old


def _complex(rules: Rules, env: dict) -> bool:
    return rules.vjp_complex is not None and jnp.iscomplexobj(env[rules.data])


def jvp(rules: Rules, env: dict, cotangent_names: tuple[str, ...]) -> tuple:
    """The output tangents of the derived JVP (complex or real rules), passed through
    :func:`gauge_checked` where the operation has gauge residuals.  ``cotangent_names``: the names
    the checked VJP gives the outputs' cotangents (``gw``, ``gV``), in the order of the tangents."""
    complex_ = _complex(rules, env)
    tangents = (rules.jvp_complex if complex_ else rules.jvp)(env)
    checked = rules.vjp_complex_checked if complex_ else rules.vjp_checked
    if checked is None or not gauge.enabled() or (rules.broadening and env.get("broadening") is not None):
        return tangents
    residuals = rules.residuals_complex if complex_ else rules.residuals
    return gauge_checked(rules, env, checked, residuals, tangents, cotangent_names)


def gauge_checked(rules, env, checked, residuals, tangents, cotangent_names):
    """``tangents`` unchanged; in reverse mode, the cotangents that reach them are checked against
    the derived gauge residuals of ``checked`` (NaN where the loss depends on the gauge, or a
    checkify check).

    The tangents travel as one flat vector through ``jax.lax.custom_linear_solve`` with the identity
    as its matrix: its transpose is the check.  One vector, and the rules' values held constant
    (``stop_gradient``: the check's verdict is piecewise constant), because that primitive's own
    JVP cannot take a symbolic zero tangent for part of its operands (a loss that uses ``w`` but not
    ``V``, differentiated twice)."""
    tangents = tuple(tangents)
    dtype = jnp.result_type(*tangents)
    layout = [(t.shape, t.dtype, t.size) for t in tangents]
    flat = jnp.concatenate([t.astype(dtype).reshape(-1) for t in tangents])
    held = {k: (lax.stop_gradient(v) if isinstance(v, jax.Array) else v) for k, v in env.items()}

    def unpack(x):
        out, start = [], 0
        for shape, dt, size in layout:
            piece = x[start:start + size].reshape(shape)
            out.append(piece if jnp.iscomplexobj(jnp.zeros((), dt)) else jnp.real(piece).astype(dt))
            start += size
        return out

    def pack(xs):
        return jnp.concatenate([x.astype(dtype).reshape(-1) for x in xs])

    def identity(x):
        return x

    def forward(_, b):
        return b

    def transpose(_, g):
        # JAX's cotangents are the conjugates of the rules' (Re tr(G^H dX))
        cotangents = tuple(jnp.conj(c) for c in unpack(g))
        bad = _violations(rules, held, checked, residuals, cotangents, cotangent_names)
        if bad is None:
            return g
        if _CHECKIFY:
            from jax.experimental import checkify

            checkify.check(~jnp.any(bad), f"{rules.op}: the loss depends on the gauge (the basis inside a cluster of "
                           "equal values, their individual values, or a complex phase), so its gradient does not exist")
            return g
        return pack([jnp.where(bad.reshape(bad.shape + (1,) * (c.ndim - bad.ndim)), jnp.nan, c) for c in unpack(g)])

    return tuple(unpack(lax.custom_linear_solve(identity, flat, forward, transpose)))


def _violations(rules, env, checked, residuals, cotangents, names):
    """Per batch element, whether the derived gauge residuals of ``checked`` exceed ``sqrt(eps)``
    relative to the cotangents (the criteria of :func:`adjointgen.runtime.degeneracy.check` and
    :func:`adjointgen.runtime.gauge.check`); ``None`` when there is nothing to check."""
    env = dict(env, **dict(zip(names, cotangents)))
    values = dict(zip((*rules.outputs, *(r.output for r in residuals)), checked(env)))
    bad = None
    for r in residuals:
        cot = [env[c] for c in r.cotangents]
        residual = values[r.output]
        real = jnp.finfo(residual.dtype).dtype
        eps, tiny = float(jnp.finfo(real).eps), float(jnp.finfo(real).tiny)
        norms = sum(jnp.sqrt(jnp.sum(jnp.abs(g) ** 2, axis=-2)) for g in cot)
        if r.vector is None:  # a phase residual, one per column
            flag = jnp.any(jnp.abs(residual) > math.sqrt(eps) * norms + tiny, axis=-1)
        else:
            clusters = cluster_mask(jnp, env[r.vector], env.get("cluster_rtol"))
            scale = norms[..., :, None] + norms[..., None, :]
            flag = jnp.any(clusters & (jnp.abs(residual) > math.sqrt(eps) * scale + tiny), axis=(-2, -1))
            if r.split is not None:
                g = jnp.real(env[r.split])
                level = jnp.max(jnp.abs(g), axis=-1, keepdims=True)[..., None] if g.shape[-1] else 0
                spread = jnp.abs(g[..., :, None] - g[..., None, :])
                flag = flag | jnp.any(clusters & (spread > math.sqrt(eps) * level + tiny), axis=(-2, -1))
        bad = flag if bad is None else bad | flag
    return bad

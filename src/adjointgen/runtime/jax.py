"""The JAX runtime of the generated JAX modules (``adjointgen.generated.jax.<op>``).

What a generated JAX module needs beyond its rule functions, written once for every operation:

- the array helpers its rules call (the same names and meanings as :mod:`adjointgen.runtime.xp`,
  with ``xp`` being ``jax.numpy``; no in-place update, so everything traces, batches and
  transposes) and the forward computations on ``jax.numpy`` (:func:`svd`, :func:`pinv`,
  :func:`eigh_generalized`): written in :mod:`adjointgen.runtime.jax_linalg`, re-exported here;
- :func:`inputs`, the argument checks of a public function: dtype and shape always, the values
  (NaN/Inf) only where they are concrete (outside ``jit``; a traced value cannot raise);
- :func:`jvp`, the dispatch of its ``jax.custom_jvp`` rule, which picks the complex or real derived
  JVP and wraps the output tangents in :func:`gauge_checked`, whose transpose is where reverse mode
  checks the loss against the gauge.

**Gauges in JAX.**  JAX's reverse mode transposes the derived JVP, so the cotangents of the outputs
reach only the transposed program.  The output tangents pass through an identity primitive
(``adjointgen_gauge_hook``) whose transpose is a check primitive (``adjointgen_gauge_check``): there
the derived gauge residuals (the rules ``<op>_vjp_checked`` return them) are evaluated on the
cotangents.  Where the values are concrete (outside ``jit``) a loss that depends on the gauge (the
basis inside a cluster of equal values, the individual values of a cluster, a complex phase)
raises :class:`~adjointgen.runtime.gauge.DegenerateSubspaceError` or
:class:`~adjointgen.runtime.gauge.PhaseDependentLossError`, as the torch side does; under ``jit`` the
batch elements concerned get NaN cotangents, so exactly the gradients that do not exist are NaN and
never a finite wrong value (:func:`errors_in_jit` adds a host callback that raises, at the price of
a host round trip).  ``jax.experimental.checkify`` cannot see into these primitives, so the check is
not a checkify check.  In forward mode, the projected tangent at a masked quotient passes a third
primitive (``adjointgen_tangent_check``): a tangent that splits a cluster raises where concrete and
is NaN where traced (``jacfwd``, ``jit``), and reverse mode transposes it as the identity.

Imports JAX, NumPy and the library-free :mod:`adjointgen.runtime` modules; never torch.
"""
from __future__ import annotations

import contextlib
import functools
import math

import jax
import jax.numpy as jnp
import numpy
from jax import lax

from . import gauge
from .jax_linalg import (  # noqa: F401 (the array helpers and forwards, re-exported for the generated modules)
    add_diag, adjoint, adjugate, array_module, cholesky, concrete_true, det, eig, eigh, eigh_generalized,
    expm_frechet, expm_frechet_solve, generic_basis, inv, is_concrete, library, library_semantics, logm_general,
    lstsq, lu, lu_solve, matrix_exp, pinv, qr, slogdet, solve, solve_lower, solve_triangular,
    solve_triangular_right, sqrtm_general, svd, sylvester,
)
from .rules import Rules
from .xp import (  # noqa: F401 (the NumPy runtime's helpers that are JAX's too)
    assemble, cluster_mask, masked_quotient, matrix_part, negligible, quotient, reciprocal, rounding_rtol, shifted_solve,
    triangular_sylvester_solve, zero_where_negligible,
)

__all__ = [
    "add_diag", "adjoint", "array_module", "assemble", "broadcast_batch", "check_tangent", "errors_in_jit", "cluster_mask",
    "eigh_generalized", "gauge_checked", "inputs", "is_concrete", "jvp", "library", "library_semantics", "lu_solve", "masked_quotient",
    "matrix_part", "negligible", "pinv", "quotient", "reciprocal", "shifted_solve", "solve_triangular", "svd",
    "symmetrized", "sqrtm_general", "sylvester", "triangular_sylvester_solve", "zero_where_negligible",
    "check_finite_outputs",
]

_RAISE_IN_JIT = False


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
        if x.size and concrete_true(lambda x: ~jnp.isfinite(x).all(), x):
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
    if concrete_true(lambda *xs: any(x.size and not bool(jnp.isfinite(x).all()) for x in xs), *xs):
        raise ValueError(f"{op}: {what}")


# ---------------------------------------------------------------- forward mode at clusters
def check_tangent(xp, op, X, denominator, d, rtol=None):
    """``X``, the projected tangent of a JVP at the operand of a masked pairwise quotient
    (``V^H dA V``), checked not to split a cluster of equal ``d`` (see
    :func:`adjointgen.runtime.degeneracy.check_tangent` for why): a concrete ``X`` that splits one
    raises :class:`~adjointgen.runtime.gauge.DegenerateSubspaceError`; a traced one (``jit``,
    ``jacfwd``) gets NaN in the batch elements that split one.  A primitive, so that reverse mode
    transposes it as the identity (the reverse-mode check is :func:`gauge_checked`'s)."""
    if not gauge.enabled() or d.shape[-1] < 2 or X.size == 0:
        return X
    return _tangent_p.bind(X, denominator, d, op=op, rtol=rtol)


# ---------------------------------------------------------------- dispatch and the reverse-mode gauge check
@contextlib.contextmanager
def errors_in_jit(flag: bool = True):
    """Within this block, functions traced under ``jit`` raise on a gauge violation in reverse mode
    too (a host callback, which JAX reports as ``JaxRuntimeError`` carrying the message), instead
    of only NaN cotangents.  Outside ``jit`` they always raise."""
    global _RAISE_IN_JIT
    old, _RAISE_IN_JIT = _RAISE_IN_JIT, flag
    try:
        yield
    finally:
        _RAISE_IN_JIT = old


def _complex(rules: Rules, env: dict) -> bool:
    """The complex rules: for complex data, and for complex outputs of real data (the complex Schur
    form of a real matrix; the transposition takes the real part of a real input's cotangent)."""
    return rules.vjp_complex is not None and (jnp.iscomplexobj(env[rules.data]) or any(
        (isinstance(v, jax.Array) or hasattr(v, "aval")) and jnp.iscomplexobj(v) for v in env.values()))


_TRANSPOSE = "derived"


@contextlib.contextmanager
def transposition(mode: str):
    """Within this block (while tracing), reverse mode of the generated functions runs the derived
    VJP (``"derived"``, the default) or JAX's transposition of the derived JVP's operations
    (``"jax"``): for comparing the two (``benchmarks/bench_jax_rules.py``)."""
    global _TRANSPOSE
    if mode not in ("derived", "jax"):
        raise ValueError(f"transposition: mode must be 'derived' or 'jax', not {mode!r}")
    old, _TRANSPOSE = _TRANSPOSE, mode
    try:
        yield
    finally:
        _TRANSPOSE = old


@library
def jvp(rules: Rules, env: dict, cotangent_names: tuple[str, ...], *, transpose: str | None = None) -> tuple:
    """The output tangents of the derived JVP (complex or real rules), passed through
    :func:`gauge_checked` where the operation has gauge residuals.  ``cotangent_names``: the names
    the checked VJP gives the outputs' cotangents (``gw``, ``gV``), in the order of the tangents.

    ``transpose="derived"`` (the default, see :func:`transposition`): reverse mode runs the derived
    VJP (:func:`linear_rule`: the JVP as a linear primitive whose transpose is the VJP), forward mode
    the derived JVP; ``"jax"``: JAX transposes the JVP's operations itself."""
    singular = _singular_factors(rules, env)
    rules = rules.for_shapes(env)
    complex_ = _complex(rules, env)
    call = rules.jvp_complex if complex_ else rules.jvp
    back = rules.vjp_complex if complex_ else rules.vjp
    if (transpose or _TRANSPOSE) == "derived" and not rules.complex_only:
        tangents = linear_rule(rules.op, call, back, env, tuple("d" + name[1:] for name in rules.outputs),
                               cotangent_names)
    else:
        tangents = call(env)
    if singular is not None:  # traced: NaN in both modes (a factor NaN or 1, linear in the tangents)
        tangents = tuple(t * jnp.where(singular.reshape(singular.shape + (1,) * (t.ndim - singular.ndim)),
                                       jnp.nan, 1).astype(t.dtype) for t in tangents)
    checked = rules.vjp_complex_checked if complex_ else rules.vjp_checked
    if checked is None or not gauge.enabled() or (rules.broadening and env.get("broadening") is not None):
        return tangents
    residuals = rules.residuals_complex if complex_ else rules.residuals
    return gauge_checked(rules, env, checked, residuals, tangents, cotangent_names)


def _singular_factors(rules: Rules, env: dict):
    """The triangular factors the rules invert (``rules.invertible``: QR's ``R``, Cholesky's ``L``),
    checked as :func:`adjointgen.runtime.checks.invertible_factor` does: a pivot at most
    ``(k eps)^(1/degree)`` times the norm of its line (an upper factor's column, a lower one's row)
    has no correct digits, nor has a derivative that divides by it.  Concrete values raise
    ``SingularMatrixError``; traced ones give the batch elements' flags (``None``: nothing to flag)."""
    flags = None
    for name, degree, *side in rules.invertible:  # (side: declared since 2026-12; older modules have none)
        T = env.get(name)
        if T is None or not T.size:
            continue
        T = lax.stop_gradient(T)
        k = min(T.shape[-2:])
        # on T / max|T| (the test is homogeneous): the squares of entries near 1e300 would overflow
        top = jnp.maximum(jnp.max(jnp.abs(T), axis=(-2, -1)), jnp.finfo(jnp.abs(T).dtype).tiny)[..., None]
        Y = T / top[..., None]
        pivots = jnp.abs(jnp.diagonal(Y, axis1=-2, axis2=-1))[..., :k]
        columns = jnp.sqrt(jnp.sum(jnp.abs(Y) ** 2, axis=-2))[..., :k]
        rows = jnp.sqrt(jnp.sum(jnp.abs(Y) ** 2, axis=-1))[..., :k]
        if side:
            size = columns if side[0] == "upper" else rows
        else:
            size = jnp.where(jnp.all(jnp.tril(T, -1) == 0, axis=(-2, -1))[..., None], columns, rows)
        eps = float(jnp.finfo(pivots.dtype).eps)
        noise = pivots <= (k * eps) ** (1.0 / degree) * size
        if is_concrete(noise):
            if bool(jnp.any(noise)):
                bad = numpy.argwhere(numpy.asarray(noise))[0]
                factor = float(top[tuple(bad[:-1])][0])
                pivot, scale = float(pivots[tuple(bad)]) * factor, float(size[tuple(bad)]) * factor
                where = f" (batch index {tuple(int(b) for b in bad[:-1])})" if len(bad) > 1 else ""
                try:
                    from .checks import SingularMatrixError
                except ImportError:  # no torch
                    SingularMatrixError = ValueError
                raise SingularMatrixError(gauge.singular_factor_message(rules.op, name, int(bad[-1]), pivot, where, k,
                                                                        degree, scale))
            continue
        found = jnp.any(noise, axis=-1)
        flags = found if flags is None else flags | found
    return flags


class _Linear:
    """The static part of one :func:`linear_rule` (hashed by identity): the rules and the names of
    the operands."""

    def __init__(self, op, call, back, tangent_names, cotangent_names, names, static):
        self.op, self.call, self.back = op, call, back
        self.tangent_names, self.cotangent_names, self.names, self.static = tangent_names, cotangent_names, names, static

    def env(self, args) -> dict:
        k = len(self.tangent_names)
        return dict(self.static, **dict(zip(self.tangent_names, args[:k])), **dict(zip(self.names, args[k:])))

    @library
    def forward(self, *args):
        return list(self.call(self.env(args)))


def linear_rule(op, call, back, env, tangent_names, cotangent_names):
    """The output tangents ``call(env)`` (the derived JVP), through one primitive that is linear in
    the input tangents ``tangent_names`` and whose transpose is ``back`` (the derived VJP), so that
    reverse mode runs the derived VJP instead of JAX's transposition of the JVP's operations (one
    rule, audited, for each direction, as on the torch side).  Its own derivative (second order)
    differentiates the JVP's ``jax.numpy`` operations."""
    needed = {*call.args, *call.keywords, *back.args, *back.keywords} - set(tangent_names) - set(cotangent_names)
    names = tuple(k for k in sorted(needed) if isinstance(env.get(k), jax.Array) or hasattr(env.get(k), "aval"))
    static = tuple((k, env.get(k)) for k in sorted(needed) if k not in names)
    plan = _Linear(op, call, back, tuple(tangent_names), tuple(cotangent_names), names, static)
    return tuple(_linear_p.bind(*(env[k] for k in tangent_names), *(env[k] for k in names), plan=plan))


def gauge_checked(rules, env, checked, residuals, tangents, cotangent_names):
    """``tangents`` unchanged; in reverse mode, the cotangents that reach them are checked against
    the derived gauge residuals of ``checked``: an error raised where the values are concrete
    (outside ``jit``; within :func:`errors_in_jit` also under it), and NaN for the batch elements
    whose loss depends on the gauge where they are traced.

    Two primitives carry it: ``adjointgen_gauge_hook`` is the identity on the tangents, and its
    transpose is ``adjointgen_gauge_check`` on the cotangents.  The check's own derivative passes
    the tangents of the cotangents through (NaN where its verdict is), since the verdict is
    piecewise constant; so second derivatives (``hessian``, ``check_grads(order=2)``) work and check
    the first-order cotangent only."""
    # what the checked VJP and the residuals' checks read, but the cotangents they are given
    needed = {*checked.args, *checked.keywords, *(r.vector for r in residuals if r.vector)} - set(cotangent_names)
    names = tuple(k for k in sorted(needed) if isinstance(env.get(k), jax.Array))
    static = tuple((k, env.get(k)) for k in sorted(needed) if not isinstance(env.get(k), jax.Array))
    check = _Check(rules, checked, residuals, tuple(cotangent_names), names, static)
    held = [lax.stop_gradient(env[k]) for k in names]  # the verdict is piecewise constant
    return tuple(_hook_p.bind(*tangents, *held, check=check, count=len(tangents)))


class _Check:
    """The static part of one check (hashed by identity): the rules and the names of the held
    values passed to the primitives as operands."""

    def __init__(self, rules, checked, residuals, cotangent_names, names, static):
        self.rules, self.checked, self.residuals = rules, checked, residuals
        self.cotangent_names, self.names, self.static = cotangent_names, names, static

    def env(self, held) -> dict:
        return dict(self.static, **dict(zip(self.names, held)))

    def bad(self, cotangents, held):
        """Per batch element, whether the loss depends on the gauge (JAX's cotangents are the
        conjugates of the rules', ``Re tr(G^H dX)``); ``None``: nothing to check."""
        return _violations(self.rules, self.env(held), self.checked, self.residuals,
                           tuple(jnp.conj(c) for c in cotangents), self.cotangent_names)

    def clustered(self, held):
        """Whether a residual can be nonzero at all: ``None`` where some residual is not confined to
        clusters (a phase, a complement's basis: always checked), else whether any batch element
        has two values in a cluster.  The cluster residuals vanish elsewhere, so the check (a
        product of the size of the VJP's) runs only where one exists, as on the torch side."""
        if any(r.vector is None for r in self.residuals):
            return None
        env = self.env(held)
        return functools.reduce(jnp.logical_or, (jnp.any(cluster_mask(jnp, env[r.vector], env.get("cluster_rtol")))
                                                 for r in self.residuals))


def _poison(bad, values):
    return [jnp.where(bad.reshape(bad.shape + (1,) * (v.ndim - bad.ndim)), jnp.nan, v) for v in values]


def _make_primitives():
    from jax.extend.core import Primitive
    from jax.interpreters import ad, batching, mlir

    hook_p = Primitive("adjointgen_gauge_hook")
    check_p = Primitive("adjointgen_gauge_check")
    hook_p.multiple_results = check_p.multiple_results = True

    def shapes(*args, check, count):
        return [jax.core.ShapedArray(x.shape, x.dtype) for x in args[:count]]

    @library
    def traced_check(*args, check, count):
        cotangents, held = list(args[:count]), args[count:]

        def verdict(operands):
            cotangents, held = operands
            bad, *kinds = check.bad(cotangents, held)
            if _RAISE_IN_JIT:
                jax.debug.callback(functools.partial(_raise, check.rules.op, phases=_phase_residual(check.residuals)),
                                   *kinds)
            return bad

        if jax.eval_shape(lambda ops: check.bad(*ops), (cotangents, held)) is None:
            return cotangents
        clustered = check.clustered(held)
        if clustered is None:
            bad = verdict((cotangents, held))
        else:
            # the branches return the verdict per batch element only (not the cotangents: a
            # conditional that returns them copies them, 5 % of jit(grad(svd)) at n = 512)
            shape = jax.eval_shape(verdict, (cotangents, held))
            bad = lax.cond(clustered, verdict, lambda operands: jnp.zeros(shape.shape, bool), (cotangents, held))
        return _poison(bad, cotangents)

    @library
    def eager_check(*args, check, count):
        cotangents, held = list(args[:count]), args[count:]
        clustered = check.clustered(held)
        if clustered is not None and not bool(clustered):
            return cotangents
        found = check.bad(cotangents, held)
        if found is not None:
            _raise(check.rules.op, *found[1:], phases=_phase_residual(check.residuals))
        return cotangents

    def batched(p):
        def rule(args, dims, **params):
            size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
            args = [batching.bdim_at_front(x, d, size) for x, d in zip(args, dims)]
            return p.bind(*args, **params), [0] * params["count"]
        return rule

    hook_p.def_impl(lambda *args, check, count: list(args[:count]))
    hook_p.def_abstract_eval(shapes)
    mlir.register_lowering(hook_p, mlir.lower_fun(lambda *args, check, count: list(args[:count]), multiple_results=True))
    batching.primitive_batchers[hook_p] = batched(hook_p)

    def hook_jvp(primals, tangents, *, check, count):
        # the hook is linear, and an outer derivative's cotangents are not a loss's: plain identity
        out = hook_p.bind(*primals, check=check, count=count)
        return out, [ad.instantiate_zeros(t) for t in tangents[:count]]

    @library
    def hook_transpose(cts, *args, check, count):
        held = args[count:]
        cts = [ad.instantiate_zeros(c) if type(c) is ad.Zero else c for c in cts]
        cts = [jnp.zeros(a.aval.shape, a.aval.dtype) if type(c) is ad.Zero else c for c, a in zip(cts, args)]
        return [*check_p.bind(*cts, *held, check=check, count=count), *([None] * len(held))]

    ad.primitive_jvps[hook_p] = hook_jvp
    ad.primitive_transposes[hook_p] = hook_transpose

    check_p.def_impl(eager_check)
    check_p.def_abstract_eval(shapes)
    mlir.register_lowering(check_p, mlir.lower_fun(traced_check, multiple_results=True))
    batching.primitive_batchers[check_p] = batched(check_p)

    @library
    def check_jvp(primals, tangents, *, check, count):
        out = check_p.bind(*primals, check=check, count=count)
        found = check.bad(list(primals[:count]), primals[count:])
        dts = [ad.instantiate_zeros(t) for t in tangents[:count]]
        return out, (dts if found is None else _poison(found[0], dts))

    ad.primitive_jvps[check_p] = check_jvp

    tangent_p = Primitive("adjointgen_tangent_check")

    @library
    def tangent_impl(X, denominator, d, *, op, rtol):
        from .xp import check_tangent as host_check

        host_check(numpy, op, numpy.asarray(X), numpy.asarray(denominator), numpy.asarray(d), rtol)
        return X

    @library
    def tangent_traced(X, denominator, d, *, op, rtol):
        off = negligible(jnp, denominator, d, rtol) & ~jnp.eye(X.shape[-1], dtype=bool)
        from .xp import split_pairs

        bad = jnp.any(split_pairs(jnp, X, off), axis=(-2, -1))
        return jnp.where(bad[..., None, None], jnp.nan, X)

    def tangent_batched(args, dims, **params):
        size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
        args = [batching.bdim_at_front(x, d, size) for x, d in zip(args, dims)]
        return tangent_p.bind(*args, **params), 0

    def tangent_jvp(primals, tangents, *, op, rtol):
        return tangent_p.bind(*primals, op=op, rtol=rtol), ad.instantiate_zeros(tangents[0])

    def tangent_transpose(ct, X, denominator, d, *, op, rtol):
        return [ct, None, None]

    tangent_p.def_impl(tangent_impl)
    tangent_p.def_abstract_eval(lambda X, denominator, d, **_: jax.core.ShapedArray(X.shape, X.dtype))
    mlir.register_lowering(tangent_p, mlir.lower_fun(tangent_traced, multiple_results=False))
    batching.primitive_batchers[tangent_p] = tangent_batched
    ad.primitive_jvps[tangent_p] = tangent_jvp
    ad.primitive_transposes[tangent_p] = tangent_transpose

    linear_p = Primitive("adjointgen_linear_rule")
    linear_p.multiple_results = True

    @library
    def linear_abstract(*args, plan):
        avals = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in args]
        return [jax.core.ShapedArray(o.shape, o.dtype) for o in jax.eval_shape(plan.forward, *avals)]

    def linear_batched(args, dims, *, plan):
        size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
        args = [batching.bdim_at_front(x, d, size) for x, d in zip(args, dims)]
        out = linear_p.bind(*args, plan=plan)
        return out, [0] * len(out)

    @library
    def linear_jvp(primals, tangents, *, plan):
        # the JVP is linear in the input tangents, not in the primal values it reads: its
        # derivative is that of its jax.numpy operations
        tangents = [ad.instantiate_zeros(t) for t in tangents]
        out, dout = jax.jvp(plan.forward, tuple(primals), tuple(tangents))
        return out, dout

    @library
    def linear_transpose(cts, *args, plan):
        k = len(plan.tangent_names)
        held = args[k:]
        avals = linear_abstract(*[a.aval if ad.is_undefined_primal(a) else a for a in args], plan=plan)
        cts = [jnp.zeros(a.shape, a.dtype) if type(c) is ad.Zero else c for c, a in zip(cts, avals)]
        env = dict(plan.static, **dict(zip(plan.names, held)))
        # JAX's cotangents are the conjugates of the rules' (Re tr(G^H dX)), and so are its results
        env.update(zip(plan.cotangent_names, (jnp.conj(c) for c in cts)))
        grads = plan.back(env)
        out = []
        for g, a in zip(grads, args[:k]):
            aval = a.aval if ad.is_undefined_primal(a) else a
            g = jnp.conj(g)
            g = g.real if not jnp.iscomplexobj(jnp.zeros((), aval.dtype)) and jnp.iscomplexobj(g) else g
            out.append(jnp.broadcast_to(g, aval.shape).astype(aval.dtype) if g.shape != aval.shape else g.astype(aval.dtype))
        return out + [None] * len(held)

    linear_p.def_impl(lambda *args, plan: plan.forward(*args))
    linear_p.def_abstract_eval(linear_abstract)
    mlir.register_lowering(linear_p, mlir.lower_fun(lambda *args, plan: plan.forward(*args), multiple_results=True))
    batching.primitive_batchers[linear_p] = linear_batched
    ad.primitive_jvps[linear_p] = linear_jvp
    ad.primitive_transposes[linear_p] = linear_transpose
    return hook_p, check_p, tangent_p, linear_p


def _violations(rules, env, checked, residuals, cotangents, names):
    """Per batch element, whether the derived gauge residuals of ``checked`` exceed ``sqrt(eps)``
    relative to the cotangents (the criteria of :func:`adjointgen.runtime.degeneracy.check` and
    :func:`adjointgen.runtime.gauge.check`); ``None`` when there is nothing to check."""
    env = dict(env, **dict(zip(names, cotangents)))
    values = dict(zip((*rules.outputs, *(r.output for r in residuals)), checked(env)))
    bad, phase, cluster, basis = None, False, False, False
    # the size of the loss's derivative through the values (max|g_w| max|w|): cotangents of the
    # vectors below sqrt(eps) of it are rounding (a second derivative of a loss of the values alone)
    floor = next((jnp.max(jnp.abs(env[r.split]), axis=-1, keepdims=True) * jnp.max(jnp.abs(env[r.vector]), axis=-1, keepdims=True)
                  for r in residuals if r.vector is not None and r.split is not None and env[r.vector].shape[-1]), 0.0)
    for r in residuals:
        cot = [env[c] for c in r.cotangents]
        residual = values[r.output]
        real = jnp.finfo(residual.dtype).dtype
        eps, tiny = float(jnp.finfo(real).eps), float(jnp.finfo(real).tiny)
        norms = sum(jnp.sqrt(jnp.sum(jnp.abs(g) ** 2, axis=-2)) for g in cot)
        if r.vector is None and r.what == "basis":  # a change of basis of a complement: k x k
            flag = jnp.any(jnp.abs(residual) > math.sqrt(eps) * (norms[..., :, None] + norms[..., None, :]) + tiny,
                           axis=(-2, -1))
            basis = basis | jnp.any(flag)
        elif r.vector is None:  # a phase residual, one per column
            flag = jnp.any(jnp.abs(residual) > math.sqrt(eps) * (norms + floor) + tiny, axis=-1)
            phase = phase | jnp.any(flag)
        else:
            clusters = cluster_mask(jnp, env[r.vector], env.get("cluster_rtol"))
            scale = norms[..., :, None] + norms[..., None, :]
            d = env[r.vector]
            if r.split is not None and d.shape[-1] and not jnp.iscomplexobj(d):
                # the dropped quotient residual / (d_j - d_i) against the gradient's size, as
                # adjointgen.runtime.degeneracy.check: ((A - λ)^2 at a cluster at λ, A^2 at a zero one)
                size = jnp.maximum(jnp.max(jnp.abs(d), axis=-1, keepdims=True), tiny)
                gradient = jnp.max(jnp.abs(env[r.split]), axis=-1, keepdims=True) + jnp.max(norms, axis=-1, keepdims=True) / size
                scale = scale + jnp.abs(d[..., :, None] - d[..., None, :]) * gradient[..., None]
            flag = jnp.any(clusters & (jnp.abs(residual) > math.sqrt(eps) * scale + tiny), axis=(-2, -1))
            if r.split is not None:
                g = env[r.split]  # complex values (eig): their complex differences
                level = jnp.max(jnp.abs(g), axis=-1, keepdims=True)[..., None] if g.shape[-1] else 0
                spread = jnp.abs(g[..., :, None] - g[..., None, :])
                flag = flag | jnp.any(clusters & (spread > math.sqrt(eps) * level + tiny), axis=(-2, -1))
            cluster = cluster | jnp.any(flag)
        bad = flag if bad is None else bad | flag
    return None if bad is None else (bad, phase, cluster, basis)


def _phase_residual(residuals):
    """The phase residual among ``residuals`` (its wording: the rotated outputs, invariant forms)."""
    return next((r for r in residuals if r.vector is None and r.what != "basis"), None)


def _raise(op, phase, cluster, basis=False, phases=None):
    """The host side of the reverse-mode check: the torch side's error classes and advice
    (``phases``: the phase residual, whose declaration words the phase error)."""
    if bool(basis):
        raise gauge.ComplementBasisError(
            f"{op}: the loss depends on the basis chosen for the complement (the columns full_matrices=True "
            "or mode='complete' adds), which is defined only through its span: use a loss of its projector "
            "U2 U2^H, or the reduced factors. Disable this check with adjointgen.runtime.gauge.set_enabled(False)")
    if bool(cluster):
        raise gauge.DegenerateSubspaceError(
            f"{op}: the loss depends on the basis chosen inside a cluster of equal values, or on the individual "
            "values of a cluster, so its gradient does not exist: use a loss that depends on a cluster only "
            "through its span (the projector onto it) and symmetric functions of its values; set the tolerance "
            "with cluster_rtol=, use broadening= for a biased finite surrogate, or disable the check with "
            "adjointgen.runtime.gauge.set_enabled(False). In a second derivative (jax.hessian, "
            "jacrev(jacrev(f)), check_grads(order=2)) at a cluster this check sees the outer derivative's "
            "cotangents, which no invariant loss makes zero: second derivatives at an exact cluster are not "
            "available in JAX (torch's reverse over reverse has them)")
    if bool(phase):
        raise gauge.PhaseDependentLossError(gauge.phase_message(
            op, phases.phases if phases is not None else (), phases.invariant if phases is not None else ""))


_hook_p, _check_p, _tangent_p, _linear_p = _make_primitives()

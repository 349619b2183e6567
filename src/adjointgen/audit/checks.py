"""The numeric checks of the audit: what each recorded step's :class:`~adjointgen.calculus.records.Check`
means on an instance.

A step of a derivation records *what* is to be checked (a :class:`Check`: its kind and the
expressions involved); this module owns *how*: :func:`numeric` evaluates it on one audit context
(an instance's values) against the frozen spec, and returns ``(value, scale)``, the residual being
``value / scale``.  The kinds:

- ``equation``: ``‖lhs - rhs‖`` against the sizes of the terms (``|c| Π‖factor‖``);
- ``forward``: the declared forwards' outputs (NumPy's, and torch's where torch is installed)
  satisfy every identity on primal values;
- ``dot_product``: ``<g_in, d_in> = Σ <g_out, d_out>`` (the VJP is the JVP's adjoint);
- ``adjoint``: a projection is self-adjoint, ``<G, P(X)> = <P(G), X>``, on random matrices;
- ``gauge``: ``<R, Θ> = Σ <g_out, d_out(Θ)>`` for the gauge residual ``R``;
- ``second_order``: the second-order rule against a central difference of the derived VJP;
- ``value_block``: the block whose diagonal is a diagonal output's tangent, and its transposition;
- ``directions``: the JVP along an unstructured tangent of a symmetric input against central
  differences of the sampler's general forward (``Derivation.general_directions``).

``real_only`` checks report zero on complex instances (a complex rule's real specialisation), and
``square`` checks on the instances where the outputs they name are not square (a rule specialised to
square shapes).
"""
from __future__ import annotations

import numpy as np
import sympy as sp
from sympy.matrices.expressions import MatrixSymbol

from ..calculus import algebra
from ..calculus.algebra import DerivationError
from ..calculus.records import Check
from ..calculus.evaluate import concrete_expr, evaluate
from ..calculus.nodes import DI, DJ, PairwiseDef, Structure

__all__ = ["forward_failures", "forward_outputs", "forward_values", "identity_residual", "identity_residuals", "numeric",
           "second_divided"]


def numeric(check: Check, spec, ctx) -> tuple[float, float]:
    """``(value, scale)`` of ``check`` on the audit context ``ctx`` (see the module docstring)."""
    if check.real_only and _is_complex_env(ctx.env):
        return 0.0, 1.0
    if check.square and any(np.shape(ctx.env[name])[0] != np.shape(ctx.env[name])[1] for name in check.square):
        return 0.0, 1.0
    return _KINDS[check.kind](spec, ctx, *check.args)


def _frob(x) -> float:
    return float(np.linalg.norm(x))


#: (srepr, complex) -> the expansion of an expression into monomials, shared by every instance
_EXPANDED: dict = {}


def _expanded(e, complex_: bool):
    key = (sp.srepr(e), complex_)
    if key not in _EXPANDED:
        # scale from the terms as written, before structure cancels any
        _EXPANDED[key] = algebra.expand(e, Structure(complex=complex_))
    return _EXPANDED[key]


def _equation(spec, ctx, eq):
    complex_ = ctx.structure.complex
    res = evaluate(eq.residual_expr, ctx.env, ctx.dims)
    terms = _expanded(eq.lhs, complex_) + _expanded(eq.rhs, complex_)
    # each term's size bound |c| Π‖factor‖ (sub-multiplicative): a residual is measured against the
    # size of what was multiplied, also when a product itself is ~0 (U^T dU, k = 1)
    definitions = getattr(ctx, "definitions", {})

    def factor_size(f):
        inner = None
        if isinstance(f, MatrixSymbol) and f.name in definitions:  # the size of what it names
            inner = definitions[f.name]
        elif isinstance(f, algebra.LINEAR_NODES):  # ‖diag(X)‖, ‖sym(X)‖ <= ‖X‖
            inner = f.arg
        if inner is not None:
            return sum(abs(float(c2)) * np.prod([factor_size(g) for g in fs2]) for c2, fs2 in _expanded(inner, complex_))
        return _frob(evaluate(f, ctx.env, ctx.dims))

    scale = sum(abs(float(c)) * np.prod([factor_size(f) for f in fs]) for c, fs in terms)
    return _frob(res), max(scale, np.finfo(float).tiny)


def forward_outputs(spec, out, xp) -> dict:
    """The spec's output symbols from what a forward returned (API order, diagonal outputs as
    vectors, outputs with a form in that form), as matrices keyed by symbol name."""
    values = out if isinstance(out, tuple) else (tuple(out) if isinstance(out, list) else (out,))
    order = spec.api_output_order or [spec.api_names[o.name] for o in spec.outputs]
    by_api = {spec.api_names[o.name]: o for o in spec.outputs}
    if len(values) != len(order):
        raise DerivationError(f"the forward returned {len(values)} value(s); the derivation has the outputs "
                              f"{', '.join(order)} (in this order)")
    result = {}
    for api, value in zip(order, values):
        sym = by_api[api]
        if sym.name in spec.public_forms and spec.public_forms[sym.name][1] == "adjoint":
            value = xp.conj(xp.swapaxes(value, -1, -2)) if hasattr(xp, "swapaxes") else value.mH
        if sym.name in spec.structure.diagonal:
            value = xp.diag(value) if value.ndim == 1 else value
        if sym.shape == (1, 1):  # a scalar output
            value = xp.reshape(xp.asarray(value), (1, 1)) if hasattr(xp, "reshape") else value.reshape(1, 1)
        result[sym.name] = value
    return result


class _Env:
    """An audit context with other values."""

    def __init__(self, ctx, env):
        self.__dict__.update(ctx.__dict__)
        self.env = env


def identity_residuals(spec, ctx, values: dict) -> list[tuple[str, float]]:
    """``(label, relative residual)`` of each of the spec's identities on primal values only (inputs
    and outputs), with the outputs replaced by ``values`` (NumPy arrays by symbol name)."""
    primal = {s.name for s in (*spec.inputs, *spec.outputs)}
    env = dict(ctx.env)
    env.update(values)
    other = _Env(ctx, env)
    out = []
    for step in spec.steps:
        if step.kind != "identity" or step.equation is None:
            continue
        eq = step.equation
        if not algebra.free_names(eq.lhs - eq.rhs) <= primal:
            continue
        valid, scale = numeric(step.check, spec, ctx)
        if not valid <= 1e-7 * scale:
            continue  # the identity itself fails on the audit's instance: its own step reports it
        value, scale = numeric(step.check, spec, other)
        out.append((step.label, value / scale))
    return out


def identity_residual(spec, ctx, values: dict) -> float:
    """The largest relative residual of the spec's identities on primal values only (inputs and
    outputs), with the outputs replaced by ``values`` (NumPy arrays by symbol name)."""
    return max([r for _, r in identity_residuals(spec, ctx, values)] or [0.0])


def forward_values(spec, ctx) -> dict:
    """``{"numpy" | "torch": outputs by symbol name}``: what each declared forward computes on the
    instance (the torch forward on CPU float64/complex128 tensors, where torch is installed)."""
    forward = spec.forward_spec
    out = {}
    args = [ctx.env[s.name] for s in spec.inputs]
    if forward.numpy is not None:
        out["numpy"] = forward_outputs(spec, forward.numpy.resolve(np)(*args, **dict(forward.options)), np)
    if forward.torch is not None:
        try:
            import torch
        except ImportError:  # the torch forward is checked where torch is (and when code is generated)
            return out
        values = forward.torch.resolve()(*[torch.from_numpy(np.array(a)) for a in args], **dict(forward.options))
        values = values if isinstance(values, (tuple, list)) else (values,)
        order = spec.api_output_order or [spec.api_names[o.name] for o in spec.outputs]
        values = tuple(np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v) for v in values[:len(order)])
        out["torch"] = forward_outputs(spec, values if len(values) > 1 else values[0], np)
    return out


def forward_failures(spec, contexts, tolerance: float) -> list[str]:
    """What the declared forwards get wrong on the instances: ``"the numpy forward ops:polar: its
    outputs do not satisfy the identity 'A = U P' (relative residual 3.3e-01)"`` (the worst
    instance's residual)."""
    worst: dict = {}
    for ctx in contexts:
        for which, values in forward_values(spec, ctx).items():
            for label, residual in identity_residuals(spec, ctx, values):
                if not residual <= tolerance:
                    key = (which, label)
                    worst[key] = max(worst.get(key, 0.0), residual) if np.isfinite(residual) else float("inf")
    return [f"the {which} forward {_forward_name(spec, which)}: its outputs do not satisfy the identity '{label}' "
            f"(relative residual {residual:.1e})" for (which, label), residual in worst.items()]


def _forward_name(spec, which) -> str:
    ref = getattr(spec.forward_spec, which)
    return ref.name if ref is not None else ""


def _forward(spec, ctx):
    worst = 0.0
    for values in forward_values(spec, ctx).values():
        worst = max(worst, identity_residual(spec, ctx, values))
    return worst, 1.0


def _extension(spec, ctx):
    """The declared extension with its default options, composed with the NumPy forward, against
    the forward itself."""
    forward, ext = spec.forward_spec, spec.extension
    args = [np.asarray(ctx.env[s.name]) for s in spec.inputs]
    derived = forward.numpy.resolve(np)

    def call(*xs):
        return derived(*xs, **dict(forward.options))

    got = ext.function.resolve()(call, *args, **dict(ext.options))
    want = call(*args)
    got, want = (tuple(x) if isinstance(x, (tuple, list)) else (x,) for x in (got, want))
    if len(got) != len(want):
        return float("inf"), 1.0
    worst = max((float(np.max(np.abs(np.asarray(g) - np.asarray(w)), initial=0.0)) for g, w in zip(got, want)),
                default=0.0)
    scale = max((float(np.max(np.abs(np.asarray(w)), initial=0.0)) for w in want), default=0.0)
    return worst, max(scale, np.finfo(float).tiny)


def unstructured_tangent(ctx, name):
    """A random tangent of the input ``name`` without its declared structure (not symmetric), the
    same for every run: seeded by the input's name and the instance's tangent."""
    import zlib

    like = np.asarray(ctx.env["d" + name])
    seed = zlib.crc32(name.encode()) ^ zlib.crc32(np.ascontiguousarray(like).tobytes())
    rng = np.random.default_rng(seed)
    E = rng.standard_normal(like.shape)
    if np.iscomplexobj(like):
        E = E + 1j * rng.standard_normal(like.shape)
    return E


def _dot_product(spec, ctx, name, gexpr, tangent=None):
    env = dict(ctx.env)
    env.update(ctx.cotangents)
    if tangent == "unstructured":
        env["d" + name] = unstructured_tangent(ctx, name)
    g_in = evaluate(gexpr, env, ctx.dims)
    lhs = float(np.real(np.vdot(g_in, env["d" + name])))  # <X, Y> = Re tr(X^H Y)
    rhs = 0.0
    parts = [abs(lhs)]
    only = dict(ctx.env)  # the JVP along this input's tangent alone
    only["d" + name] = env["d" + name]
    for other in spec.inputs:
        if other.name != name:
            only["d" + other.name] = np.zeros_like(ctx.env["d" + other.name])
    for out in spec.rule_outputs:
        t = spec.tangents[out.name].name
        dval = evaluate(spec.jvp.raw[t], only, ctx.dims)
        v = float(np.real(np.vdot(ctx.cotangents["g" + out.name], dval)))
        rhs += v
        parts.append(abs(v))
    return abs(lhs - rhs), max(sum(parts), np.finfo(float).tiny)


def _adjoint(spec, ctx, node, complex_):
    rng = np.random.default_rng(len(ctx.env))
    n = 5
    G, X = rng.standard_normal((2, n, n))
    if complex_:
        G, X = G + 1j * rng.standard_normal((n, n)), X + 1j * rng.standard_normal((n, n))
    g, x = MatrixSymbol("G", n, n), MatrixSymbol("X", n, n)
    env = {"G": G, "X": X}
    lhs = float(np.real(np.vdot(G, evaluate(node(x), env, {}))))
    rhs = float(np.real(np.vdot(evaluate(node(g), env, {}), X)))
    return abs(lhs - rhs), abs(lhs) + abs(rhs)


def _gauge(spec, ctx, gauge, rexpr):
    env = dict(ctx.env)
    env.update(ctx.cotangents)
    env["__cluster_pattern__"] = True  # the residual's transposition, with some pairs in clusters
    T = env[gauge.parameter.name]
    lhs = float(np.real(np.vdot(evaluate(rexpr, env, ctx.dims), T)))
    parts = [abs(lhs)]
    rhs = 0.0
    for out_name, direction in gauge.directions.items():
        v = float(np.real(np.vdot(env["g" + out_name], evaluate(direction, env, ctx.dims))))
        rhs += v
        parts.append(abs(v))
    return abs(lhs - rhs), max(sum(parts), np.finfo(float).tiny)


def second_divided(env, pdef: PairwiseDef):
    """``f[a, b, c]`` of an instance's concrete ``f`` (the divided difference whose first is ``pdef``),
    with the confluent cases from ``f'`` and ``f''``."""
    x = sp.Symbol("x", real=True)
    fprime = concrete_expr(pdef.diagonal_value, env).xreplace({DI: x})
    f1 = sp.lambdify(x, fprime, "numpy")
    f2 = sp.lambdify(x, sp.diff(fprime, x), "numpy")
    first = sp.lambdify((DI, DJ), concrete_expr(pdef.expr, env), "numpy")

    def L(p, q):
        return f1(p) if p == q else first(p, q)

    def second(p, q, r):
        p, q, r = sorted((p, q, r))
        if p == r:
            return f2(p) / 2
        return (L(r, q) - L(q, p)) / (r - p)

    return second


def _second_order(spec, ctx):
    """``U S U^T``, ``S_ij = Σ_k T(d_i, d_k, d_j) (G_ik H_kj + H_ik G_kj)``, against the central
    difference of the derived VJP along the instance's tangents ``(dU, dD)``."""
    so = spec.second
    env = ctx.env
    second = second_divided(env, spec.pairwise[so.L])
    gX = spec.cotangents[so.output]
    d = np.diagonal(env[so.values]).real
    Uv = env[so.vectors]
    G = ctx.cotangents[gX.name]
    G = (G + G.conj().T) / 2
    H = env[spec.tangents[so.input].name]
    Gt, Ht = Uv.conj().T @ G @ Uv, Uv.conj().T @ H @ Uv
    n = len(d)
    S = np.zeros((n, n), dtype=np.result_type(Gt, Ht))
    for i in range(n):
        for j in range(n):
            S[i, j] = sum(second(d[i], d[k], d[j]) * (Gt[i, k] * Ht[k, j] + Ht[i, k] * Gt[k, j]) for k in range(n))
    formula = Uv @ S @ Uv.conj().T
    step = 1e-5
    dU, dD = env[spec.tangents[so.vectors].name], env[spec.tangents[so.values].name]
    got = spec.vjp.rewritten["g" + so.input]

    def vjp_at(sign):
        e = dict(env)
        e[so.vectors], e[so.values], e[gX.name] = Uv + sign * step * dU, env[so.values] + sign * step * dD, G
        return evaluate(got, e, ctx.dims)

    fd = (vjp_at(1) - vjp_at(-1)) / (2 * step)
    return float(np.linalg.norm(formula - fd)), max(float(np.linalg.norm(fd)), 1e-300)


def _directions(spec, ctx, name):
    """The JVP along an unstructured tangent of the symmetric input ``name`` against Richardson
    central differences of the sampler's general forward (``"general"``)."""
    from .runner import fd_tangents

    general = ctx.env.get("general")
    if not callable(general):
        raise DerivationError("general_directions: the sampler must return 'general', a NumPy forward of the general "
                              "function (inputs by name -> outputs by name)")
    E = unstructured_tangent(ctx, name)
    inputs = {s.name: ctx.env[s.name] for s in spec.inputs}
    _, fd = fd_tangents(general, inputs, {name: E})
    only = dict(ctx.env)
    for other in spec.inputs:
        only["d" + other.name] = E if other.name == name else np.zeros_like(ctx.env["d" + other.name])
    worst, scale = 0.0, np.finfo(float).tiny
    for out in spec.rule_outputs:
        if out.name not in fd:
            continue
        t = spec.tangents[out.name].name
        got = evaluate(spec.jvp.raw[t], only, ctx.dims)
        worst = max(worst, _frob(got - fd[out.name]))
        scale = max(scale, _frob(fd[out.name]))
    return worst, scale


def _value_block(spec, ctx, block, vjp, cotangent, dD):
    """``diag(X)`` against the values' JVP, and ``<M, X(d_in)> = Σ <g_in(M), d_in>`` for a random
    block cotangent ``M`` (the transposition of the block map)."""
    import zlib

    from ..calculus.nodes import DiagPart

    got = evaluate(DiagPart(block), ctx.env, ctx.dims)
    want = evaluate(dD, ctx.env, ctx.dims)
    first = _frob(got - want) / max(_frob(want), _frob(got), np.finfo(float).tiny)
    X = evaluate(block, ctx.env, ctx.dims)
    rng = np.random.default_rng(zlib.crc32(cotangent.encode()))
    M = rng.standard_normal(np.shape(X))
    if np.iscomplexobj(X) or _is_complex_env(ctx.env):
        M = M + 1j * rng.standard_normal(np.shape(X))
    env = dict(ctx.env)
    env[cotangent] = M
    lhs = float(np.real(np.vdot(M, X)))
    rhs, parts = 0.0, [abs(lhs)]
    for s in spec.inputs:
        g = evaluate(vjp["g" + s.name], env, ctx.dims)
        v = float(np.real(np.vdot(g, ctx.env["d" + s.name])))
        rhs += v
        parts.append(abs(v))
    second = abs(lhs - rhs) / max(sum(parts), np.finfo(float).tiny)
    return max(first, second), 1.0


def _is_complex_env(env) -> bool:
    return any(isinstance(v, np.ndarray) and np.iscomplexobj(v) for v in env.values())


_KINDS = {
    "equation": _equation,
    "forward": _forward,
    "extension": _extension,
    "dot_product": _dot_product,
    "adjoint": _adjoint,
    "gauge": _gauge,
    "second_order": _second_order,
    "value_block": _value_block,
    "directions": _directions,
}

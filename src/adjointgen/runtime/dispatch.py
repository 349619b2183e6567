"""The generated autograd functions' dispatch (torch), written once.

A generated operation describes its rules as data, a :class:`Rules` value next to the rule
functions. The rules are the VJP and JVP for real data and for complex data, the checked VJP
(the VJP together with its gauge residuals), and what each residual is. :func:`vjp` and
:func:`jvp` then decide, for every operation alike:

- complex or real rules, by the dtype of the operation's first input; the rules specialised to the
  shapes where they exist (square factors: :meth:`Rules.for_shapes`);
- checked or not: a complex VJP is checked whenever the checks are on (the phases are always a
  gauge); a real one only where its values have a cluster, and not under a broadening;
- at a cluster, a loss through ``V f(D) V^H`` is completed first
  (:func:`adjointgen.runtime.completion.complete`);
- the check each residual goes to: :func:`adjointgen.runtime.degeneracy.check` for a residual
  supported on clusters, :func:`adjointgen.runtime.gauge.check` for any other (the phases).

The generated autograd function passes its saved tensors, its cotangents (or tangents) and its
options by name (``env``); the templates hold the layout only.
"""
from __future__ import annotations

from typing import Callable

import torch

from . import checks, completion, degeneracy, gauge, value_blocks
from .function import nested_forward as _nested_forward
from .rules import Call, Residual, Rules, ValueBlock, Variant
from .verdict import deferred

__all__ = ["Call", "Residual", "Rules", "ValueBlock", "Variant", "for_data", "jvp", "vjp"]


def for_data(data, real: Callable, complex_: Callable | None = None) -> Callable:
    """The rule for ``data``: ``complex_`` for complex data (where there is one), else ``real``."""
    return complex_ if complex_ is not None and data.is_complex() else real


def _is_complex(rules: Rules, env: dict) -> bool:
    """The complex rules: for complex data, and for complex outputs of real data (the complex Schur
    form of a real matrix), whose real input's cotangent is then the real part (:func:`_real_inputs`)."""
    return rules.vjp_complex is not None and (env[rules.data].is_complex() or any(
        isinstance(v, torch.Tensor) and v.is_complex() for v in env.values()))


def _real_inputs(rules: Rules, env: dict, cotangents: tuple) -> tuple:
    """The cotangents of real inputs from complex rules: their real parts."""
    return tuple(g.real if g is not None and g.is_complex() and isinstance(env.get(name[1:]), torch.Tensor)
                 and not env[name[1:]].is_complex() else g for name, g in zip(rules.outputs, cotangents))


def _as_complex(env: dict, *calls) -> dict:
    """The real floating tensors of ``env`` that ``calls`` read, in the complex dtype of their precision."""
    import torch

    read = {name for call in calls if call is not None for name in (*call.args, *call.keywords)}
    return {k: v.to(torch.promote_types(v.dtype, torch.complex64))
            if k in read and isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in env.items()}


def _unclustered(rules: Rules, env: dict) -> bool:
    """No values of a cluster residual form a cluster (so those residuals are zero), and no
    broadening (under which they are not checked either way)."""
    return all(not degeneracy.maybe_clusters(env[r.vector], env.get("cluster_rtol"))
               for r in rules.residuals if r.vector is not None)


def _independent(rules: Rules, env: dict) -> None:
    """Vectors that are not orthonormal (``complex_only`` rules invert them): independent inside
    the clusters of their values, else the matrix is defective."""
    for r in rules.residuals:
        if r.vector is not None:
            for name in r.cotangents:
                degeneracy.check_independent(rules.op, env[name[1:]], env[r.vector], env.get("cluster_rtol"))
                degeneracy.check_resolved(rules.op, env[name[1:]], env[r.vector], env.get(rules.data),
                                          env.get("cluster_rtol"))


def _invertible(rules: Rules, env: dict) -> None:
    for name, degree, *side in rules.invertible:  # (side: declared since 2026-12; older modules have none)
        checks.invertible_factor(rules.op, name, env[name], degree, *side)


def jvp(rules: Rules, env: dict) -> tuple:
    """The output tangents: the complex or the real JVP rule (of the variant for the shapes)."""
    _invertible(rules, env)
    rules = rules.for_shapes(env)
    if rules.complex_only:
        _independent(rules, env)
        return rules.jvp(_as_complex(env, rules.jvp))
    if _is_complex(rules, env):  # complex outputs of real data: the real tangents too, in the complex dtype
        return rules.jvp_complex(env if env[rules.data].is_complex() else _as_complex(env, rules.jvp_complex))
    return rules.jvp(env)


def vjp(rules: Rules, env: dict) -> tuple:
    """The input cotangents (``rules.outputs``), checked where the gauge leaves freedom; without a
    lazy conjugate or negative bit (a rule's ``X.mH`` is a view with the conjugate bit, and
    ``torch.complex``'s backward under ``vmap`` then reads it as a negative view, which has no
    batching rule: ``jacrev(jacrev(f))`` of a complex ``det`` failed)."""
    if rules.plain and not torch.is_grad_enabled() and not _is_complex(rules, env):
        _invertible(rules, env)  # (a first derivative of real data through rules without a gauge: nothing to decide)
        return rules.vjp(env)
    if torch.is_grad_enabled():  # a second derivative is being built: its cotangents of the inputs resolved too
        env = dict(env)
        for name in rules.outputs:
            x = env.get(name[1:])
            if isinstance(x, torch.Tensor) and x.is_complex() and x.requires_grad:
                env[name[1:]] = _ResolvedGradient.apply(x)
    return tuple(g.resolve_conj().resolve_neg() if g is not None and g.is_complex() else g for g in _vjp(rules, env))


class _ResolvedGradient(torch.autograd.Function):
    """The identity, whose gradient has no lazy conjugate or negative bit: a rule that reads an input
    only as ``A^H`` (``det``: ``adj(A^H)``) otherwise hands torch's ``ComplexBackward`` a conjugate
    view in a second derivative, which ``vmap`` cannot batch (``jacrev(jacrev(f))`` of a complex
    ``det`` raised "Batching rule not implemented for aten::_neg_view")."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return x.view_as(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        return g.resolve_conj().resolve_neg()

    @staticmethod
    @_nested_forward
    def jvp(ctx, dx):
        return dx.view_as(dx)  # (a view, as the forward's output is)


def _vjp(rules: Rules, env: dict) -> tuple:
    _invertible(rules, env)
    rules = rules.for_shapes(env)
    if rules.complex_only:  # complex rules; the phases are always a gauge; a real input's cotangent is real
        _independent(rules, env)
        cenv = _as_complex(env, rules.vjp, rules.vjp_checked, *(r.call for r in rules.residuals))
        if rules.vjp_checked is None or not gauge.enabled():
            out = rules.vjp(cenv)
        elif _unclustered(rules, env) and all(r.call is not None for r in rules.residuals if r.vector is None):
            out = rules.vjp(cenv)  # the residuals on clusters vanish: check the others alone
            floor = _floor(rules.residuals, cenv)
            for r in rules.residuals:
                if r.vector is None:
                    gauge.check(rules.op, r.call(cenv)[0], *(cenv[c] for c in r.cotangents), floor=floor, phases=r.phases,
                                invariant=r.invariant)
        else:
            out = _checked(rules, cenv, rules.vjp_checked, rules.residuals)
        return tuple(g.real if not env.get(name[1:], g).is_complex() else g for name, g in zip(rules.outputs, out))
    if _is_complex(rules, env):
        if rules.vjp_complex_checked is not None and gauge.enabled():
            return _real_inputs(rules, env, _checked(rules, env, rules.vjp_complex_checked, rules.residuals_complex))
        return _real_inputs(rules, env, rules.vjp_complex(env))
    unbroadened = not rules.broadening or env["broadening"] is None
    vectors = dict.fromkeys(r.vector for r in rules.residuals if r.vector is not None)
    if rules.vjp_checked is not None and gauge.enabled() and unbroadened and (
            not vectors or any(degeneracy.maybe_clusters(env[v], env.get("cluster_rtol")) for v in vectors)):
        return _checked(rules, env, rules.vjp_checked, rules.residuals)
    return rules.vjp(env)


def _floor(residuals: tuple[Residual, ...], env: dict):
    """``sqrt``-free size of the loss's derivative through the values, ``max|g_w| max|w|`` per batch
    element ``(..., 1)`` (the units of a phase residual: the vectors are unit-free): cotangents of
    the vectors below ``sqrt(eps)`` of it are rounding (``None`` without a residual on values)."""
    import torch

    for r in residuals:
        if r.vector is not None and r.split is not None:
            with torch.no_grad():
                w, gw = env[r.vector], env[r.split]
                if w.shape[-1] == 0:
                    return None
                floor = gw.abs().amax(-1, keepdim=True) * w.abs().amax(-1, keepdim=True)
                from .checks import physical

                if deferred(floor):  # no probe read: a plain tensor (a compiler's is not deferred)
                    return floor
                plain = physical(floor)
                try:  # values to read (not the batched tensors of gradcheck's legacy vmap, nor a compiler's)
                    bool(plain[0].isfinite().all())
                except (RuntimeError, TypeError):
                    return None
                return floor
    return None


def _second_order(rules: Rules, env: dict, residuals: tuple[Residual, ...], rtol):
    """:func:`value_blocks.second_order` around a rule call: the value cotangent (the split of the
    residual on values) and every cotangent the residuals read, replaced in ``env``."""
    block = rules.block
    r = next((r for r in residuals if block is not None and r.vector == block.values and r.split is not None), None)
    if r is None:
        return None
    others = tuple(dict.fromkeys(c for q in residuals for c in q.cotangents if c != r.split))
    return (value_blocks.second_order(rules.op, block, env, env[r.split], tuple(env[c] for c in others), rtol),
            r.split, others)


def _checked(rules: Rules, env: dict, call: Call, residuals: tuple[Residual, ...]) -> tuple:
    env = dict(env)
    rtol = env.get("cluster_rtol")
    broadening = env.get("broadening") if rules.broadening else None
    for r in residuals:
        if r.completes and degeneracy.completing(env[r.vector]):
            gs = ["g" + name for name in r.completes]
            out = completion.complete(rules.op, env[r.vector], tuple(env[n] for n in r.completes), env[r.split],
                                      tuple(env[g] for g in gs), rtol, broadening, what=r.what)
            env.update(zip((*r.completes, r.split, *gs), out))
    second = _second_order(rules, env, residuals, rtol) if broadening is None else None
    if second is None:
        values = dict(zip((*rules.outputs, *(r.output for r in residuals)), call(env)))
    else:  # a second derivative at a cluster moves the values as a block (runtime.value_blocks)
        context, split, others = second
        with context as prepared:
            env[split] = prepared.values_cotangent
            env.update(zip(others, prepared.cotangents))
            values = dict(zip((*rules.outputs, *(r.output for r in residuals)), call(env)))
        inputs = rules.block.inputs
        values.update(zip(("g" + name for name in inputs), prepared.add(tuple(values["g" + name] for name in inputs))))
    floor = _floor(residuals, env)
    for r in residuals:
        cotangents = tuple(env[c] for c in r.cotangents)
        if r.vector is None:
            gauge.check(rules.op, values[r.output], *cotangents, floor=floor, phases=r.phases, invariant=r.invariant)
        elif broadening is None:
            completed = r.completes and degeneracy.completing(env[r.vector])
            split = None if completed or r.split is None else env[r.split]
            degeneracy.check(rules.op, values[r.output], degeneracy.cluster_mask(env[r.vector], rtol), split,
                             *cotangents, what=r.what, values=env[r.vector],
                             gd=None if r.split is None else env[r.split])
    return tuple(values[name] for name in rules.outputs)

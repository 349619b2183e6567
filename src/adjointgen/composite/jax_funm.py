"""``agj.funm(A, f)``: ``f(A) = V f(w) V^H`` of a Hermitian ``A`` for any real scalar ``f`` given as
a SymPy expression, in JAX, differentiated by the rule derived in ``derivations/funm.py``
(``dX = V (L ∘ (V^H dA V)) V^H`` with ``L_ij = f[w_i, w_j]``).

``f`` is compiled once into a program over primitives (:mod:`adjointgen.codegen.scalar`, as for
``agt.funm``), and its divided differences are evaluated by the same composed stable forms
(:mod:`adjointgen.runtime.divided`, on ``jax.numpy``): no cancellation at close eigenvalues, the
derivative ``f'`` on the diagonal and inside clusters, so the gradient is exact at repeated
eigenvalues.  ``L`` is itself a ``custom_jvp`` of ``w`` whose tangent takes the second divided
differences ``f[w_i, w_i, w_j]``, ``f[w_i, w_j, w_j]``: second derivatives are exact too (a third
derivative is NaN, never a silent value).  Under ``jit`` the evaluator takes, where it would read
values, the branch that is right for every element.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ..generated.jax import funm as _g
from ..runtime import jax as _rt
from ..runtime.divided import evaluate as _divided


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _second(w, program):
    """``(f[w_i, w_i, w_j], f[w_i, w_j, w_j])``: the tangent of ``L`` takes them; their own
    derivative (a third derivative of ``f(A)``) is NaN."""
    a, b = w[..., :, None], w[..., None, :]
    return (_divided.second(program, a, a, b, warn=False), _divided.second(program, a, b, b, warn=False))


@_second.defjvp
def _second_jvp(program, primals, tangents):
    out = _second(primals[0], program)
    return out, tuple(jnp.full_like(x, jnp.nan) for x in out)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _daleckii_krein(w, program):
    """``L_ij = f[w_i, w_j]`` (``f'(w_i)`` where ``w_i = w_j``)."""
    return _divided.first(program, w[..., :, None], w[..., None, :], warn=False)


@_daleckii_krein.defjvp
def _daleckii_krein_jvp(program, primals, tangents):
    w, = primals
    dw, = tangents
    L = _daleckii_krein(w, program)
    Fa, Fb = _second(w, program)
    return L, Fa * dw[..., :, None] + Fb * dw[..., None, :]


def _assemble(V, fw):
    return jnp.matmul(V * fw[..., None, :].astype(V.dtype), jnp.conj(jnp.swapaxes(V, -1, -2)))


def _decomposition(A, program, condition, order):
    """``(w, V)`` of Hermitian ``A`` (the generated ``eigh``: a generic basis of exact clusters,
    differentiable), with ``f`` checked at the eigenvalues where they are concrete."""
    from ..generated.jax import eigh as _eigh

    w, V = _eigh.eigh(A)
    if _rt.is_concrete(w) and w.size:
        cond, text = condition
        if cond is not None and not bool(jnp.all(_divided.values(cond, w))):
            raise ValueError(f"funm: A has an eigenvalue outside the stated domain {text} of {program.text}")
        _divided.check_domain(program, w, order=order, name="funm")
    return w, V


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _funm(A, program, condition):
    w, V = _decomposition(A, program, condition, 0)
    return _assemble(V, _divided.values(program, w))


@_funm.defjvp
def _funm_jvp(program, condition, primals, tangents):
    A, = primals
    dA, = tangents
    w, V = _decomposition(A, program, condition, 1)
    X = _assemble(V, _divided.values(program, w))
    L = _daleckii_krein(w, program).astype(V.dtype)
    rule = _g.funm_jvp_complex if jnp.iscomplexobj(V) else _g.funm_jvp
    return X, rule(V, 0.5 * (dA + jnp.conj(jnp.swapaxes(dA, -1, -2))), L)


def funm(A, program, condition=(None, None)):
    """``f(A)`` for the compiled ``program`` of ``f`` (:func:`adjointgen.jax.funm` compiles it) and
    an optional compiled domain ``condition`` ``(program, text)``."""
    A, = _rt.inputs("funm", (("A", A),), square=(True,), complex_ok=True)
    return _funm(_rt.symmetrized(A), program, condition)

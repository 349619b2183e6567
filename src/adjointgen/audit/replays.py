"""The symbolic audit: what each recorded step's :class:`~adjointgen.calculus.derivation.Replay`
means on explicit small matrices.

A step of a derivation records *what* its symbolic replay checks (a :class:`Replay`: its kind and
the expressions involved); this module owns *how*: :func:`residual` evaluates it on explicit SymPy
matrices whose entries are symbols that carry the declared structure (built by the runner), and
returns a matrix that is identically zero exactly when the step holds for every such matrix.  The
kinds:

- ``equal (expected, new)``: ``expected - new``.  Most steps: the new equation's residual is an
  expression of the old residuals (``M R``, ``R^T``, ``diag(R)``, ``-F ∘ R``, ``R/c``, sums), or two
  expressions (a rule as derived and as rewritten) have the same value;
- ``define (symbol, definition, old, new)``: the old and new residuals agree with the introduced
  symbol set to its definition (the step uses nothing else);
- ``insert (target, value, old, new)``: the old residual with ``target`` (a symbol or its
  diagonal) replaced by ``value`` equals the new residual;
- ``differentiate (old, new, tangents)``: the derivative of the old residual along
  ``X + ε dX`` (``tangents``: pairs ``(X, dX)``) equals the new residual;
- ``real (a, b)``: ``a - b`` on the real parts of the entries (a complex rule's real
  specialisation);
- ``degenerate (lhs, rhs, D, Ω)``: ``lhs - rhs`` with ``D`` an explicit diagonal whose first two
  entries are equal and ``Ω`` a rotation of that pair (the audit's instances are not degenerate);
- ``divided (T, f', h)``: the second divided difference ``T(a, b, c)`` is symmetric in its
  arguments and ``T(a, a + h, a + 2h) -> f''(a)/2`` as ``h -> 0``;
- ``dot_product (input, g_in)``: ``Re <g_in, d_in> - Σ Re <g_out, d_out>``, one output's cotangent at
  a time (the transposition needs no property of the primal values beyond the declared structure);
- ``adjoint (node, complex)``: ``Re <G, P(X)> - Re <P(G), X>`` for a projection node on free
  matrices;
- ``gauge (gauge, R)``: ``Re <R, Θ> - Σ Re <g_out, d_out(Θ)>``, with ``Θ`` on a cluster pattern when the
  gauge's parameter lives on clusters.
"""
from __future__ import annotations

import sympy as sp
from sympy.matrices.expressions import MatrixSymbol

from ..calculus.derivation import Replay
from ..calculus.evaluate import SYMPY, real_derivatives, evaluate
from ..calculus.nodes import DiagPart

__all__ = ["residual"]


def residual(replay: Replay, spec, env: dict) -> sp.MatrixBase:
    """The explicit residual of ``replay`` on ``env`` (explicit matrices by symbol name)."""
    return _KINDS[replay.kind](spec, dict(env), *replay.args)


def _explicit(expr, env):
    return evaluate(expr, env, env.get("__dims__", {}), arith=SYMPY)


def _real_part(x):
    """``Re x = (x + conj x)/2``; ``conj`` distributes over the expression, so with complex entry
    symbols the result is a polynomial in the entries and their conjugates."""
    return (x + sp.conjugate(x)) / 2


def _equal(spec, env, expected, new):
    return _explicit(expected, env) - _explicit(new, env)


def _define(spec, env, name, definition, old, new):
    env[name] = _explicit(definition, env)
    return _explicit(old, env) - _explicit(new, env)


def _insert(spec, env, target, value, old, new):
    inserted = dict(env)
    v = _explicit(value, env)
    if isinstance(target, DiagPart):  # diag(X) := value: replace the diagonal of X
        X = env[target.arg.name]
        inserted[target.arg.name] = X - sp.diag(*[X[i, i] for i in range(X.rows)]) + v
    else:
        inserted[target.name] = v
    return _explicit(old, inserted) - _explicit(new, env)


def _differentiate(spec, env, old, new, tangents):
    eps = sp.Symbol("epsilon", real=True)
    moved = dict(env)
    for name, tangent in tangents:
        if name in env and tangent in env:
            moved[name] = env[name] + eps * env[tangent]
    lin = _explicit(old, moved).diff(eps).subs(eps, 0)
    if lin.has(sp.Subs, sp.Derivative):
        lin = lin.applyfunc(lambda e: real_derivatives(e.doit()))
    return lin - _explicit(new, env)


def _real(spec, env, a, b):
    real = {k: (v.applyfunc(sp.re) if isinstance(v, sp.MatrixBase) else v) for k, v in env.items()}
    return _explicit(a, real) - _explicit(b, real)


def _degenerate(spec, env, lhs, rhs, D, parameter):
    n = env[parameter].rows  # the explicit size of this derivation's symbolic checks
    d0, w = sp.Symbol("d0", real=True), sp.Symbol("omega", real=True)
    env[D] = sp.diag(d0, d0, *[sp.Symbol(f"d{i}", real=True) for i in range(2, n)])
    env[parameter] = sp.Matrix(n, n, lambda i, j: w if (i, j) == (0, 1) else (-w if (i, j) == (1, 0) else 0))
    return _explicit(lhs, env) - _explicit(rhs, env)


def _divided(spec, env, T, fprime, h):
    a, b, c = T.variables
    body = T.expr
    swaps = [body - body.xreplace({a: b, b: a}), body - body.xreplace({b: c, c: b})]
    near = sp.series(body.xreplace({b: a + h, c: a + 2 * h}), h, 0, 1).removeO().doit()
    limit = real_derivatives(near) - real_derivatives(fprime.diff(a).doit() / 2)
    return sp.Matrix([sp.simplify(x) for x in swaps + [limit]])


def _dot_product(spec, env, name, gexpr):
    only = dict(env)  # the JVP along this input's tangent alone
    for other in spec.inputs:
        if other.name != name:
            only["d" + other.name] = sp.zeros(*env["d" + other.name].shape)
    residuals = []
    for out in spec.rule_outputs:  # linear in the cotangents: one output's at a time
        one = dict(env)
        for o in spec.rule_outputs:
            if o.name != out.name:
                one["g" + o.name] = sp.zeros(*env["g" + o.name].shape)
        lhs = (_explicit(gexpr, one).H * env["d" + name]).trace()
        rhs = (env["g" + out.name].H * _explicit(spec.jvp.raw[spec.tangents[out.name].name], only)).trace()
        residuals.append(_real_part(lhs - rhs))
    return sp.Matrix([residuals])


def _adjoint(spec, env, node, complex_):
    n = 3
    kind = {"complex": True} if complex_ else {"real": True}
    G = sp.Matrix(n, n, lambda i, j: sp.Symbol(f"g{i}{j}", **kind))
    X = sp.Matrix(n, n, lambda i, j: sp.Symbol(f"x{i}{j}", **kind))
    g, x = MatrixSymbol("G", n, n), MatrixSymbol("X", n, n)
    lhs = (G.H * _explicit(node(x), {"X": X})).trace()
    rhs = (_explicit(node(g), {"G": G}).H * X).trace()
    return sp.Matrix([[_real_part(lhs - rhs)]])


def _gauge(spec, env, gauge, rexpr):
    T = env[gauge.parameter.name]
    if gauge.parameter.name in spec.structure.clustered:  # supported on a cluster pattern
        env["__cluster_pattern__"] = True
        mask = sp.Matrix(T.rows, T.cols, lambda i, j: 1 if (i, j) in ((0, 1), (1, 0)) else 0)
        T = T.multiply_elementwise(mask)
        env[gauge.parameter.name] = T
    lhs = (_explicit(rexpr, env).H * T).trace()
    rhs = sum(((env["g" + o].H * _explicit(e, env)).trace() for o, e in gauge.directions.items()), 0)
    return sp.Matrix([[_real_part(lhs - rhs)]])


_KINDS = {
    "equal": _equal,
    "define": _define,
    "insert": _insert,
    "differentiate": _differentiate,
    "real": _real,
    "degenerate": _degenerate,
    "divided": _divided,
    "dot_product": _dot_product,
    "adjoint": _adjoint,
    "gauge": _gauge,
}

"""The symbolic audit: what each recorded step's :class:`~adjointgen.calculus.records.Replay`
means on explicit small matrices.

A step of a derivation records *what* its replay checks (a :class:`Replay`: its kind and the
expressions involved); this module owns *how*: :func:`residual` evaluates it on explicit matrices
whose entries carry the declared structure (built by the runner), and returns a matrix that is
identically zero exactly when the step holds for every such matrix.  The entries are either
random rationals (:mod:`adjointgen.audit.exact`: the default, exact and fast) or SymPy symbols (the
fallback for values without a rational form, such as ``log|det A|``).  The kinds:

- ``equal (expected, new)``: ``expected - new``.  Most steps: the new equation's residual is an
  expression of the old residuals (``M R``, ``R^T``, ``diag(R)``, ``-F ∘ R``, ``R/c``, a solve
  ``Syl[A, B](R/c)``, sums), or two expressions (a rule as derived and as rewritten) have the same
  value;
- ``define (symbol, definition, old, new)``: the old and new residuals agree with the introduced
  symbol set to its definition (the step uses nothing else);
- ``substitute (template, names, before, after, old, new, given)``: a substitution of products by
  an equation's other side (``given``: its label): ``template`` is the old residual with each
  occurrence of the pattern replaced by a fresh symbol (``names``); with those symbols set to the
  patterns (``before``) it is the old residual, set to the replacements (``after``) the new one.  So
  the new residual equals the old one wherever the equation holds;
- ``unstructured (names, expected, new)``: ``expected - new`` with the named symbols free of the
  structure the derivation declares for them later (a step that declares it);
- ``constrained (name, U, B, expected, new)``: ``expected - new`` with the symbol ``name`` set to a
  free matrix projected onto ``U^T B W = 0`` (a projected shifted solve recovers such a ``W``);
- ``insert (target, value, old, new)``: the old residual with ``target`` (a symbol or its
  diagonal) replaced by ``value`` equals the new residual;
- ``differentiate (old, new, tangents)``: the derivative of the old residual along
  ``X + ε dX`` (``tangents``: pairs ``(X, dX)``) equals the new residual;
- ``real (a, b)``: ``a - b`` on the real parts of the entries (a complex rule's real
  specialisation);
- ``degenerate (lhs, rhs, D, Ω)``: ``lhs - rhs`` with ``D`` an explicit diagonal whose first two
  entries are equal and ``Ω`` a rotation of that pair (the audit's instances are not degenerate);
- ``invariant (identity, new, parameter, D, directions)``: the identity differentiated along a gauge
  (``new``) is ``Σ c_k M_k`` with ``M_k`` among ``R Θ, Θ^T R, Θ R, R Θ^T`` (``R`` the identity's
  residual, ``Θ`` the gauge's parameter -- on the cluster pattern, with ``D`` degenerate there, for a
  parameter inside clusters -- or the multiplier ``M`` of a direction ``X -> X M``): zero wherever
  the identity holds.  The constant coefficients are fitted at one random point and checked at an
  independent second one;
- ``divided (T, f', h)``: the second divided difference ``T(a, b, c)`` is symmetric in its
  arguments and ``T(a, a + h, a + 2h) -> f''(a)/2`` as ``h -> 0``;
- ``dot_product (input, g_in)``: ``Re <g_in, d_in> - Σ Re <g_out, d_out>``, one output's cotangent at
  a time (the transposition needs no property of the primal values beyond the declared structure);
- ``adjoint (node, complex)``: ``Re <G, P(X)> - Re <P(G), X>`` for a projection node on free
  matrices;
- ``gauge (gauge, R)``: ``Re <R, Θ> - Σ Re <g_out, d_out(Θ)>``, with ``Θ`` on a cluster pattern when the
  gauge's parameter lives on clusters;
- ``premise (what)``: nothing to replay: a defining identity, a definition, the declared forward or
  a gauge choice -- what the derivation assumes, checked numerically on the instances.
"""
from __future__ import annotations

import sympy as sp
from sympy.matrices.expressions import MatrixSymbol

from ..calculus.records import Replay
from ..calculus.evaluate import SYMPY, evaluate, real_derivatives
from ..calculus.nodes import DiagPart

__all__ = ["residual", "PREMISE"]

#: the replay kind of a step that rests on nothing earlier (an identity, a definition, ...)
PREMISE = "premise"


def residual(replay: Replay, spec, env: dict):
    """The explicit residual of ``replay`` on ``env`` (explicit matrices by symbol name; the
    arithmetic is ``env["__arith__"]``, SymPy's by default)."""
    return _KINDS[replay.kind](spec, dict(env), *replay.args)


def _arith(env):
    return env.get("__arith__", SYMPY)


def _exact(env) -> bool:
    return "__rng__" in env


def _explicit(expr, env):
    return evaluate(expr, env, env.get("__dims__", {}), arith=_arith(env))


# ---- the few matrix operations the replays need, in either arithmetic
def _H(m, env):
    return _arith(env).T(m)


def _trace(m, env):
    return _arith(env).trace(m)[0, 0]


def _zeros(shape, env):
    return _arith(env).zeros(*shape)


def _row(values, env):
    if _exact(env):
        from .exact import matrix

        return matrix(1, len(values), lambda i, j: values[j])
    return sp.Matrix([values])


def _real_part(x):
    """``Re x = (x + conj x)/2``; ``conj`` distributes over the expression, so with complex entry
    symbols the result is a polynomial in the entries and their conjugates."""
    return (x + sp.conjugate(x)) / 2 if isinstance(x, sp.Basic) else (x + x.conjugate()) / 2


def _new_real(name, env):
    if _exact(env):
        from .exact import _random_entry

        return _random_entry(env["__rng__"], False)
    return sp.Symbol(name, real=True)


def _new_matrix(name, n, complex_, env, cols=None):
    cols = n if cols is None else cols
    if _exact(env):
        from .exact import _random_entry, matrix

        return matrix(n, cols, lambda i, j: _random_entry(env["__rng__"], complex_ and env.get("__complex__", True)))
    kind = {"complex": True} if complex_ else {"real": True}
    return sp.Matrix(n, cols, lambda i, j: sp.Symbol(f"{name}{i}{j}", **kind))


def _shape(m):
    return tuple(m.shape)


def _mm(a, b, env):
    return a @ b if _exact(env) else a * b


# ---- the kinds
def _equal(spec, env, expected, new):
    return _explicit(expected, env) - _explicit(new, env)


def _define(spec, env, name, definition, old, new):
    env[name] = _explicit(definition, env)
    return _explicit(old, env) - _explicit(new, env)


def _substitute(spec, env, template, names, before, after, old, new, given=""):
    """Both ``template[names := before] - old`` and ``template[names := after] - new``, stacked."""
    first, second = dict(env), dict(env)
    for name, b, a in zip(names, before, after):
        first[name] = _explicit(b, env)
        second[name] = _explicit(a, env)
    r1 = _explicit(template, first) - _explicit(old, env)
    r2 = _explicit(template, second) - _explicit(new, env)
    return _stack(r1, r2, env)


def _stack(a, b, env):
    if _exact(env):
        import numpy as np

        return np.concatenate([a.reshape(-1), b.reshape(-1)]).reshape(1, -1)
    return sp.Matrix([list(a) + list(b)])


def _unstructured(spec, env, names, expected, new):
    for name in names:
        if name in env:
            r, c = _shape(env[name])
            env[name] = _new_matrix("free_" + name, r, spec.structure.complex, env, c)
    return _explicit(expected, env) - _explicit(new, env)


def _constrained(spec, env, name, U, B, expected, new):
    u = _explicit(U, env)
    bu = u if B is None else _mm(_explicit(B, env), u, env)
    z = env[name]
    gram_inv = _arith(env).inv(_mm(_H(u, env), bu, env))
    env[name] = z - _mm(_mm(u, gram_inv, env), _mm(_H(bu, env), z, env), env)
    return _explicit(expected, env) - _explicit(new, env)


def _insert(spec, env, target, value, old, new):
    inserted = dict(env)
    v = _explicit(value, env)
    if isinstance(target, DiagPart):  # diag(X) := value: replace the diagonal of X
        X = env[target.arg.name]
        inserted[target.arg.name] = X - _arith(env).diag(X) + v
    else:
        inserted[target.name] = v
    return _explicit(old, inserted) - _explicit(new, env)


def _differentiate(spec, env, old, new, tangents):
    if _exact(env):
        import numpy as np

        from .exact import Du

        moved = dict(env)
        for name, tangent in tangents:
            if name in env and tangent in env:
                x, dx = env[name], env[tangent]
                out = np.empty(x.shape, dtype=object)
                for idx in np.ndindex(x.shape):
                    out[idx] = Du(x[idx], dx[idx])
                moved[name] = out
        value = _explicit(old, moved)
        lin = np.vectorize(lambda e: Du.of(e).b, otypes=[object])(value)
        return lin - _explicit(new, env)
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
    if _exact(env):
        import numpy as np

        from .exact import Ex, GQ

        def re(x):
            return Ex(x.v.re, x.n, x.q) if type(x.v) is GQ else x

        real = {k: (np.vectorize(lambda e: re(Ex.of(e)), otypes=[object])(v) if isinstance(v, np.ndarray) else v)
                for k, v in env.items()}
        real["__complex__"] = False
        return _explicit(a, real) - _explicit(b, real)
    real = {k: (v.applyfunc(sp.re) if isinstance(v, sp.MatrixBase) else v) for k, v in env.items()}
    return _explicit(a, real) - _explicit(b, real)


def _degenerate(spec, env, lhs, rhs, D, parameter):
    n = env[parameter].shape[0]  # the explicit size of this derivation's checks
    d0, w = _new_real("d0", env), _new_real("omega", env)
    others = [_new_real(f"d{i}", env) for i in range(2, n)]
    if _exact(env):
        from .exact import Ex, matrix

        zero = Ex.of(0)
        env[D] = matrix(n, n, lambda i, j: ([d0, d0, *others][i] if i == j else zero))
        env[parameter] = matrix(n, n, lambda i, j: w if (i, j) == (0, 1) else (-w if (i, j) == (1, 0) else zero))
    else:
        env[D] = sp.diag(d0, d0, *others)
        env[parameter] = sp.Matrix(n, n, lambda i, j: w if (i, j) == (0, 1) else (-w if (i, j) == (1, 0) else 0))
    return _explicit(lhs, env) - _explicit(rhs, env)


def _invariant(spec, env, identity, new, parameter, D, directions=()):
    """``new - Σ c_k M_k`` at a second point, the ``c_k`` fitted at the first (exact only)."""
    if not _exact(env):
        from ..calculus.evaluate import NotExplicit

        raise NotExplicit("the gauge invariance is checked in exact arithmetic")
    from .exact import fit_invariance

    return fit_invariance(spec, env, identity, new, parameter, D, directions, _explicit)


def _divided(spec, env, T, fprime, h):
    if _exact(env):
        from .exact import NotExact

        raise NotExact("a limit of divided differences is checked symbolically")
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
            only["d" + other.name] = _zeros(_shape(env["d" + other.name]), env)
    residuals = []
    for out in spec.rule_outputs:  # linear in the cotangents: one output's at a time
        one = dict(env)
        for o in spec.rule_outputs:
            if o.name != out.name:
                one["g" + o.name] = _zeros(_shape(env["g" + o.name]), env)
        lhs = _trace(_mm(_H(_explicit(gexpr, one), env), env["d" + name], env), env)
        rhs = _trace(_mm(_H(env["g" + out.name], env), _explicit(spec.jvp.raw[spec.tangents[out.name].name], only), env),
                     env)
        residuals.append(_real_part(lhs - rhs))
    return _row(residuals, env)


def _adjoint(spec, env, node, complex_):
    n = 3
    G = _new_matrix("g", n, complex_, env)
    X = _new_matrix("x", n, complex_, env)
    g, x = MatrixSymbol("G", n, n), MatrixSymbol("X", n, n)
    e1, e2 = dict(env), dict(env)
    e1["X"], e2["G"] = X, G
    lhs = _trace(_mm(_H(G, env), _explicit(node(x), e1), env), env)
    rhs = _trace(_mm(_H(_explicit(node(g), e2), env), X, env), env)
    return _row([_real_part(lhs - rhs)], env)


def _gauge(spec, env, gauge, rexpr):
    T = env[gauge.parameter.name]
    if gauge.parameter.name in spec.structure.clustered:  # supported on a cluster pattern
        env["__cluster_pattern__"] = True
        if _exact(env):
            from .exact import Ex, matrix

            mask = matrix(*T.shape, lambda i, j: Ex.of(1 if (i, j) in ((0, 1), (1, 0)) else 0))
            T = T * mask
        else:
            mask = sp.Matrix(T.rows, T.cols, lambda i, j: 1 if (i, j) in ((0, 1), (1, 0)) else 0)
            T = T.multiply_elementwise(mask)
        env[gauge.parameter.name] = T
    lhs = _trace(_mm(_H(_explicit(rexpr, env), env), T, env), env)
    rhs = 0
    for o, e in gauge.directions.items():
        rhs = rhs + _trace(_mm(_H(env["g" + o], env), _explicit(e, env), env), env)
    return _row([_real_part(lhs - rhs)], env)


def _premise(spec, env, what):
    raise TypeError("a premise has no replay")


_KINDS = {
    "equal": _equal,
    "define": _define,
    "substitute": _substitute,
    "unstructured": _unstructured,
    "constrained": _constrained,
    "insert": _insert,
    "differentiate": _differentiate,
    "real": _real,
    "degenerate": _degenerate,
    "invariant": _invariant,
    "divided": _divided,
    "dot_product": _dot_product,
    "adjoint": _adjoint,
    "gauge": _gauge,
    PREMISE: _premise,
}

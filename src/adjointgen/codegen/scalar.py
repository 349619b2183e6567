"""Compile a SymPy scalar function into a :class:`~adjointgen.runtime.divided.ScalarProgram`.

A matrix function ``f(A) = V f(w) V^H`` needs ``f``, its divided differences ``f[a, b]`` and
``f[a, b, c]``, and where ``f`` and its derivatives exist.  None of them needs ``f`` expanded: the
runtime composes the primitives' own stable divided differences by the chain and Leibniz rules
(:mod:`adjointgen.runtime.divided`).  What SymPy does here:

* **parse and check** ``f``: one real variable, named options, real-valued, only primitives the
  runtime implements; anything else is a :class:`ValueError` naming the problem;
* **rewrite** the forms that overflow or cancel as written into primitives that do not:
  ``log(1 + e^u)`` is ``softplus(u)``, ``1/(1 + e^-u)`` is ``sigmoid(u)``, ``sin(u)/u`` is
  ``sinc(u)`` (removable at 0), ``u log u`` is ``xlogx(u)`` (0 at 0), ``Max``/``Min`` through ``Abs``, ``sec``, ``cot``, ... as
  reciprocals, ``b^e`` with a variable exponent as ``exp(e log b)``;
* **derive** each primitive's derivatives ``g', g'', ...`` (programs in their own variable), which
  the series of the divided differences near equal arguments use.  Where SymPy's derivative of an
  entire primitive divides by its argument (``sinc``, Bessel functions), it is replaced near 0 by the
  derivative of the primitive's Taylor polynomial.

Programs are plain data: :func:`compile_cached` keeps them on disk (``$ADJOINTGEN_CACHE`` or the
user cache folder), keyed by the expression, so a function compiles once per machine.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from pathlib import Path

import sympy as sp
from sympy.codegen.cfunctions import expm1 as sp_expm1
from sympy.codegen.cfunctions import log1p as sp_log1p

from ..runtime.divided.primitives import FIRST_TERMS, MAX_ORDER, SECOND_TERMS
from ..runtime.divided.program import Op, ScalarProgram

__all__ = ["FORMAT", "compile_cached", "compile_condition", "compile_function", "sigmoid", "softplus", "supported",
           "xlogx"]

#: bumped when programs or their derivation change (invalidates the disk cache)
FORMAT = 3


class softplus(sp.Function):  # noqa: N801 - a SymPy function, named as printed
    """``log(1 + e^u)`` (overflow-free)."""

    def fdiff(self, argindex=1):
        return sigmoid(self.args[0])

    def _eval_rewrite_as_log(self, u, **kwargs):
        return sp.log(1 + sp.exp(u))


class sigmoid(sp.Function):  # noqa: N801
    """``1/(1 + e^-u)``."""

    def fdiff(self, argindex=1):
        u = self.args[0]
        return sigmoid(u) * sigmoid(-u)

    def _eval_rewrite_as_exp(self, u, **kwargs):
        return 1 / (1 + sp.exp(-u))


class xlogx(sp.Function):  # noqa: N801
    """``u log u`` (0 at 0: the entropy of an eigenvalue)."""

    def fdiff(self, argindex=1):
        return sp.log(self.args[0]) + 1

    def _eval_rewrite_as_log(self, u, **kwargs):
        return u * sp.log(u)


#: SymPy function classes -> unary primitives of the runtime
_UNARY = {
    sp.exp: "exp", sp.log: "log", sp.sin: "sin", sp.cos: "cos", sp.tan: "tan", sp.sinh: "sinh", sp.cosh: "cosh",
    sp.tanh: "tanh", sp.atan: "atan", sp.asin: "asin", sp.acos: "acos", sp.asinh: "asinh", sp.acosh: "acosh",
    sp.atanh: "atanh", sp.erf: "erf", sp.erfc: "erfc", sp.gamma: "gamma", sp.loggamma: "loggamma", sp.sinc: "sinc",
    sp.Abs: "abs", sp.sign: "sign", sp.floor: "floor", sp.ceiling: "ceiling", softplus: "softplus",
    sigmoid: "sigmoid", sp_log1p: "log1p", sp_expm1: "expm1", xlogx: "xlogx",
}
_RECIPROCALS = {sp.sec: sp.cos, sp.csc: sp.sin, sp.cot: sp.tan, sp.sech: sp.cosh, sp.csch: sp.sinh, sp.coth: sp.tanh}
_RELATIONS = {sp.StrictLessThan: "lt", sp.LessThan: "le", sp.StrictGreaterThan: "gt", sp.GreaterThan: "ge",
              sp.Equality: "eq", sp.Unequality: "ne"}
#: primitives whose divided differences are piecewise rules (no derivative programs)
_STEPS = {"abs", "sign", "heaviside", "floor", "ceiling"}
#: primitives whose first divided difference is an identity (derivatives only for the second)
_IDENTITIES = {"exp", "log", "log1p", "expm1", "sin", "cos", "tan", "sinh", "cosh", "tanh", "sigmoid", "softplus",
               "atan", "atanh", "asinh", "xlogx"}


def supported() -> list[str]:
    """The SymPy functions ``f`` may use (besides ``+``, ``*``, powers and ``Piecewise``)."""
    names = sorted({c.__name__ for c in _UNARY} | {c.__name__ for c in _RECIPROCALS}
                   | {"Max", "Min", "Heaviside", "polygamma", "besselj(0, x)", "besselj(1, x)"})
    return names


def _fail(text: str, why: str):
    raise ValueError(f"funm: f = {text}: {why}")


# ====================================================================================== rewriting
def _rewrite(e):
    """The forms the runtime evaluates without overflow or cancellation (bottom-up)."""
    if not e.args or isinstance(e, (sp.Symbol, sp.Number)):
        return e
    if isinstance(e, sp.Piecewise):
        return sp.Piecewise(*[(_rewrite(ex), _rewrite_bool(c)) for ex, c in e.args], evaluate=False)
    args = [_rewrite(a) for a in e.args]
    func = e.func
    if func in _RECIPROCALS:
        return 1 / _RECIPROCALS[func](args[0])
    if func in (sp.Max, sp.Min):
        out = args[0]
        for b in args[1:]:
            out = (out + b + (1 if func is sp.Max else -1) * sp.Abs(out - b)) / 2
        return out
    if func is sp.log and isinstance(args[0], sp.Add):
        u = _one_plus_exp(args[0])
        if u is not None:
            return softplus(u)
    if func is sp.Pow:
        base, expo = args
        if expo == -1 and isinstance(base, sp.Add):
            u = _one_plus_exp(base)
            if u is not None:
                return sigmoid(-u)
        return base ** expo
    if func is sp.Mul:
        return _rewrite_mul(args)
    try:
        return func(*args)
    except Exception:  # pragma: no cover - SymPy rejects the rebuilt node
        return e


def _rewrite_bool(c):
    if c in (sp.true, sp.false) or not getattr(c, "args", ()):
        return c
    if isinstance(c, sp.core.relational.Relational):
        return c.func(_rewrite(c.lhs), _rewrite(c.rhs))
    return c.func(*[_rewrite_bool(a) for a in c.args])


def _one_plus_exp(s: sp.Add):
    """``u`` where ``s = 1 + exp(u)``, else ``None``."""
    if len(s.args) == 2 and sp.S.One in s.args:
        other = s.args[0] if s.args[1] == 1 else s.args[1]
        if isinstance(other, sp.exp):
            return other.args[0]
    return None


def _rewrite_mul(args):
    """``sin(u)/u`` -> ``sinc(u)``; ``e^u/(1 + e^u)`` -> ``sigmoid(u)``; ``u log u`` -> ``xlogx(u)``."""
    factors = list(args)
    changed = True
    while changed:
        changed = False
        for i, f in enumerate(factors):
            if isinstance(f, sp.log) and f.args[0] in factors:
                j = factors.index(f.args[0])
                factors = [h for k, h in enumerate(factors) if k not in (i, j)] + [xlogx(f.args[0])]
                changed = True
                break
            if isinstance(f, sp.sin):
                u = f.args[0]
                for j, g in enumerate(factors):
                    if j != i and g == 1 / u:
                        factors = [h for k, h in enumerate(factors) if k not in (i, j)] + [sp.sinc(u)]
                        changed = True
                        break
            if isinstance(f, sigmoid) and not changed:
                # e^u sigmoid(-u) = sigmoid(u)
                u = -f.args[0]
                for j, g in enumerate(factors):
                    if j != i and isinstance(g, sp.exp) and sp.simplify(g.args[0] - u) == 0:
                        factors = [h for k, h in enumerate(factors) if k not in (i, j)] + [sigmoid(u)]
                        changed = True
                        break
            if changed:
                break
    return sp.Mul(*factors)


# ====================================================================================== compiling
class _Builder:
    def __init__(self, text, x, options, *, texts=True):
        self.text, self.x = text, x
        self.options = {sym: i for i, sym in enumerate(options)}
        self.ops: list[Op] = []
        self.texts: list[str] = []
        self.memo: dict = {}
        self.keep_texts = texts

    def emit(self, kind, args=(), param=None, expr=None) -> int:
        key = (kind, tuple(args), param)
        if key in self.memo:
            return self.memo[key]
        self.ops.append(Op(kind, tuple(args), param))
        self.texts.append(sp.sstr(expr) if (self.keep_texts and expr is not None) else kind)
        self.memo[key] = len(self.ops) - 1
        return self.memo[key]

    def depends(self, e) -> bool:
        return bool(e.free_symbols & ({self.x} | set(self.options)))

    def const(self, e) -> int:
        v = sp.N(e, 30)
        if v.has(sp.I) and sp.im(v) != 0:
            _fail(self.text, f"the constant {e} is not real")
        try:
            value = float(sp.re(v))
        except TypeError:
            _fail(self.text, f"the constant {e} is not a number")
        if not math.isfinite(value):
            _fail(self.text, f"the constant {e} is not finite")
        return self.emit("const", (), value, e)

    def build(self, e) -> int:
        if not self.depends(e):
            return self.const(e)
        if e == self.x:
            return self.emit("x", (), None, e)
        if e in self.options:
            return self.emit("option", (), self.options[e], e)
        if isinstance(e, sp.Add):
            return self.emit("add", sorted(self.build(a) for a in e.args), None, e)
        if isinstance(e, sp.Mul):
            coeff, rest = e.as_coeff_mul()
            args = [self.build(a) for a in rest]
            if coeff != 1:
                args.append(self.const(coeff))
            return args[0] if len(args) == 1 else self.emit("mul", sorted(args), None, e)
        if isinstance(e, sp.Pow):
            base, expo = e.args
            b = self.build(base)
            if not self.depends(expo):
                c = float(sp.N(expo, 30))
                if c == 0:
                    return self.const(sp.S.One)
                if c == 1:
                    return b
                return self.emit("pow", (b,), c, e)
            if expo.free_symbols & {self.x}:
                return self.build(sp.exp(expo * sp.log(base)))
            return self.emit("pow", (b, self.build(expo)), None, e)
        if isinstance(e, sp.Piecewise):
            args = []
            pieces = list(e.args)
            otherwise = None
            for ex, cond in pieces:
                if cond == sp.true:
                    otherwise = self.build(ex)
                    break
                if cond == sp.false:
                    continue
                args += [self.build_bool(cond), self.build(ex)]
            if otherwise is None:
                otherwise = self.emit("const", (), math.nan, sp.nan)
            return self.emit("piecewise", args + [otherwise], None, e)
        if isinstance(e, sp.Heaviside):
            h0 = e.args[1] if len(e.args) > 1 else sp.Rational(1, 2)
            return self.emit("heaviside", (self.build(e.args[0]),), float(h0), e)
        if isinstance(e, sp.polygamma):
            n, u = e.args
            if not (n.is_Integer and n >= 0):
                _fail(self.text, f"polygamma needs a constant non-negative integer order, not {n}")
            return self.emit("polygamma", (self.build(u),), int(n), e)
        if isinstance(e, sp.besselj):
            nu, u = e.args
            if nu not in (0, 1):
                _fail(self.text, f"besselj({nu}, ...) is not available (besselj(0, u) and besselj(1, u) are)")
            return self.emit(f"besselj{int(nu)}", (self.build(u),), None, e)
        kind = _UNARY.get(e.func)
        if kind is not None:
            if len(e.args) != 1:
                _fail(self.text, f"{e.func.__name__} with {len(e.args)} arguments is not supported")
            return self.emit(kind, (self.build(e.args[0]),), None, e)
        if isinstance(e, (sp.Derivative, sp.Integral)):
            _fail(self.text, f"{type(e).__name__.lower()}s are not supported; give f in closed form")
        name = getattr(e.func, "__name__", type(e).__name__)
        _fail(self.text, f"{name} cannot be evaluated elementwise by adjointgen (supported: "
                         f"{', '.join(supported())}, +, *, powers, Piecewise)")

    def build_bool(self, c) -> int:
        if isinstance(c, sp.core.relational.Relational):
            kind = _RELATIONS.get(type(c))
            if kind is None:
                _fail(self.text, f"the condition {c} is not supported")
            return self.emit(kind, (self.build(c.lhs), self.build(c.rhs)), None, c)
        if isinstance(c, (sp.And, sp.Or)):
            return self.emit("and" if isinstance(c, sp.And) else "or", sorted(self.build_bool(a) for a in c.args), None, c)
        if isinstance(c, sp.Not):
            return self.emit("not", (self.build_bool(c.args[0]),), None, c)
        _fail(self.text, f"the condition {c} is not supported")


def compile_function(f, variable=None, options=(), *, text: str | None = None, derivatives: bool = True,
                     texts: bool = True) -> ScalarProgram:
    """The :class:`ScalarProgram` of ``f``, an expression in ``variable`` (its only free symbol if
    not given) and the option symbols ``options`` (run-time numbers, such as ``p`` of ``x**p``).

    Raises:
        ValueError: ``f`` is not a scalar real expression in one variable (and the options), is
            complex-valued, or uses a function the runtime does not evaluate; the message names it.
    """
    try:
        expr = sp.sympify(f)
    except (sp.SympifyError, TypeError, SyntaxError):
        raise ValueError(f"funm: f must be a SymPy expression in one symbol, not {f!r}") from None
    if not isinstance(expr, sp.Expr) or isinstance(expr, (sp.MatrixBase, sp.MatrixExpr)):
        raise ValueError(f"funm: f must be a scalar SymPy expression, not a {type(expr).__name__} ({f!r})")
    text = text or sp.sstr(expr)
    options = tuple(options)
    free = expr.free_symbols - set(options)
    if variable is None:
        if len(free) > 1:
            _fail(text, f"f must depend on one variable, but has the symbols {', '.join(sorted(map(str, free)))}")
        variable = next(iter(free)) if free else sp.Symbol("x", real=True)
    elif free - {variable}:
        _fail(text, f"f has the free symbols {', '.join(sorted(map(str, free - {variable})))} besides {variable}")
    x = sp.Symbol("x", real=True)
    opt_syms = tuple(sp.Symbol(str(o), real=True) for o in options)
    expr = expr.xreplace({variable: x, **dict(zip(options, opt_syms))})
    if expr.has(sp.zoo, sp.oo, -sp.oo, sp.nan):
        _fail(text, "f contains an infinite or undefined constant")
    if expr.has(sp.I):
        real_form = sp.simplify(expr.rewrite(sp.cos))
        if real_form.has(sp.I):
            _fail(text, "f is complex-valued; a function of a Hermitian matrix needs a real f (the eigenvalues are real)")
        expr = real_form
    expr = _rewrite(expr)
    builder = _Builder(text, x, opt_syms, texts=texts)
    builder.build(expr)
    ops = tuple(builder.ops)
    kinds = sorted({_derivative_key(op) for op in ops if _needs_derivatives(op)})
    derivs = tuple((k, derivative_programs(k)) for k in kinds) if derivatives else ()
    return ScalarProgram(text=text, ops=ops, options=tuple(str(o) for o in options), derivatives=derivs,
                         texts=tuple(builder.texts) if texts else ())


def compile_condition(domain, program: ScalarProgram):
    """A user's statement of where ``f`` applies -- a SymPy set (``Interval(0, oo)``) or a condition
    in ``f``'s symbol -- as a program whose value is a boolean; and its text."""
    x = sp.Symbol("x", real=True)
    cond = domain
    if isinstance(domain, sp.Set):
        cond = domain.as_relational(x)
    elif isinstance(domain, sp.Basic):
        free = domain.free_symbols
        if len(free) > 1:
            raise ValueError(f"funm: domain {domain} must be a set or a condition in one symbol")
        if free:
            cond = domain.xreplace({next(iter(free)): x})
    else:
        raise ValueError(f"funm: domain must be a SymPy set or condition, not {domain!r}")
    text = sp.sstr(domain)
    builder = _Builder(text, x, ())
    if cond == sp.true:
        builder.emit("eq", (builder.build(x), builder.build(x)), None, cond)
    else:
        builder.build_bool(cond)
    return ScalarProgram(text=text, ops=tuple(builder.ops), texts=tuple(builder.texts)), text


def _needs_derivatives(op) -> bool:
    return op.kind == "pow" or (op.kind not in _STEPS and op.kind in set(_UNARY.values()) | {"polygamma", "besselj0",
                                                                                             "besselj1"})


def _derivative_key(op) -> str:
    return f"polygamma:{op.param}" if op.kind == "polygamma" else op.kind


# ====================================================================================== derivatives
_Y = sp.Symbol("y", real=True)
_C = sp.Symbol("c", real=True)


def _primitive(key: str):
    """``g(y)`` of a derivative key, and its option symbols."""
    if key == "pow":
        return _Y ** _C, (_C,)
    if key.startswith("polygamma:"):
        return sp.polygamma(int(key.split(":")[1]), _Y), ()
    if key in ("besselj0", "besselj1"):
        return sp.besselj(int(key[-1]), _Y), ()
    inverse = {v: k for k, v in _UNARY.items()}
    return inverse[key](_Y), ()


#: entire primitives whose SymPy derivatives divide by the argument: near 0, the Taylor polynomial
_ENTIRE_NEAR_ZERO = {"sinc", "besselj0", "besselj1"}
#: degree of that Taylor polynomial (|y| < 1: truncation below 1/40!)
_NEAR_ZERO_DEGREE = 40


class _T(sp.Function):
    """``tanh`` for differentiation: ``T' = S^2``, ``S = sech``: derivatives as polynomials in ``T``
    and ``S^2`` (SymPy's ``1 - tanh^2`` loses every digit at large arguments)."""

    def fdiff(self, argindex=1):
        return _S(self.args[0]) ** 2


class _S(sp.Function):
    def fdiff(self, argindex=1):
        return -_T(self.args[0]) * _S(self.args[0])


def _seed(key: str):
    """The expression differentiated for a primitive's derivatives, and how to turn it back."""
    back = {_T: sp.tanh, _S: lambda u: 1 / sp.cosh(u)}
    if key == "tanh":
        return _T(_Y), back
    if key == "sigmoid":  # (1 + tanh(y/2))/2
        return (1 + _T(_Y / 2)) / 2, back
    if key == "softplus":  # softplus' = sigmoid: y/2 + integral of tanh(y/2)/2; only derivatives are used
        return None, back
    return None, None


def _lower_bessel(e):
    """``besselj(n, y)`` for ``n >= 2`` by the recurrence ``J_n = 2(n-1)/y J_{n-1} - J_{n-2}``."""
    def repl(nu, u):
        if nu.is_Integer and nu >= 2:
            return 2 * (nu - 1) / u * repl(nu - 1, u) - repl(nu - 2, u)
        return sp.besselj(nu, u)

    return e.replace(sp.besselj, repl)


@functools.lru_cache(maxsize=None)
def derivative_programs(key: str) -> tuple:
    """Programs of ``g', ..., g^(K)`` of the primitive ``key``, in ``y`` (option 0: its parameter);
    ``K`` is what the series of the runtime use (more for primitives without an identity)."""
    cached = _cache_get(f"derivatives:{key}")
    if cached is not None:
        return tuple(ScalarProgram.from_data(p) for p in cached)
    g, opts = _primitive(key)
    kind = key.split(":")[0]
    order = SECOND_TERMS + 1 if kind in _IDENTITIES or kind == "pow" else MAX_ORDER
    near = None
    if kind in _ENTIRE_NEAR_ZERO:
        near = sp.series(g, _Y, 0, _NEAR_ZERO_DEGREE + 1).removeO()
    out = []
    d = g
    seed, back = _seed(key)
    if seed is not None:
        d = seed
    for k in range(1, order + 1):
        if key == "softplus" and k == 1:
            d = (1 + _T(_Y / 2)) / 2
        else:
            d = sp.diff(d, _Y)
        if kind == "pow":
            d = sp.powsimp(d)
        if kind.startswith("besselj"):
            d = sp.expand(_lower_bessel(d))
        expr = d if back is None else d.replace(_T, back[_T]).replace(_S, back[_S])
        if near is not None:
            near = sp.diff(near, _Y)
            expr = sp.Piecewise((near, sp.Abs(_Y) < 1), (d, True))
        out.append(compile_function(expr, _Y, opts, derivatives=False, text=f"{key}^({k})", texts=False))
    _cache_put(f"derivatives:{key}", [p.to_data() for p in out])
    return tuple(out)


# ====================================================================================== the disk cache
def cache_dir() -> Path | None:
    """Where compiled programs are kept: ``$ADJOINTGEN_CACHE``, else the user cache folder
    (``$XDG_CACHE_HOME/adjointgen`` or ``~/.cache/adjointgen``); ``None`` if ``ADJOINTGEN_CACHE`` is
    empty (no disk cache)."""
    env = os.environ.get("ADJOINTGEN_CACHE")
    if env is not None:
        return Path(env) if env else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "adjointgen"


def _cache_path(key: str) -> Path | None:
    root = cache_dir()
    if root is None:
        return None
    digest = hashlib.sha256(f"{FORMAT}|{sp.__version__}|{key}".encode()).hexdigest()[:32]
    return root / "scalar" / f"{digest}.json"


def _cache_get(key: str):
    path = _cache_path(key)
    if path is None or not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        return record["value"] if record.get("key") == key else None
    except (OSError, ValueError, KeyError):
        return None


def _cache_put(key: str, value) -> None:
    path = _cache_path(key)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, "value": value}))
        os.replace(tmp, path)
    except OSError:  # a read-only home: compile again next time
        pass


_MEMORY: dict = {}


def compile_cached(f, variable=None, options=()) -> ScalarProgram:
    """:func:`compile_function`, remembered in memory and on disk (keyed by the expression)."""
    try:
        expr = sp.sympify(f)
    except (sp.SympifyError, TypeError, SyntaxError):
        raise ValueError(f"funm: f must be a SymPy expression in one symbol, not {f!r}") from None
    key = f"program:{sp.srepr(expr)}|{sp.srepr(variable) if variable is not None else ''}|" \
          f"{','.join(sp.srepr(o) for o in options)}"
    if key in _MEMORY:
        return _MEMORY[key]
    cached = _cache_get(key)
    if cached is not None:
        program = ScalarProgram.from_data(cached)
    else:
        program = compile_function(expr, variable, options)
        _cache_put(key, program.to_data())
    _MEMORY[key] = program
    return program

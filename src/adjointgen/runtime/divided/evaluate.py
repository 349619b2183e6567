"""Evaluate a :class:`~adjointgen.runtime.divided.program.ScalarProgram`: ``f``, ``f[a, b]``,
``f[a, b, c]`` and the domain checks, elementwise on torch tensors, NumPy or CuPy arrays.

Divided differences of a composite ``f`` come from those of its primitives by exact rules, so no
symbolic expansion of ``f`` is ever needed and each primitive keeps its own stable form:

* sums: ``(u + v)[a, b] = u[a, b] + v[a, b]``;
* products (Leibniz): ``(uv)[a, b] = u[a, b] (v_a + v_b)/2 + (u_a + u_b)/2 v[a, b]`` and
  ``(uv)[a, b, c] = u_a v[a, b, c] + u[a, b] v[b, c] + u[a, b, c] v_c``;
* composition (chain rule): ``(g∘u)[a, b] = g[u_a, u_b] u[a, b]`` and
  ``(g∘u)[a, b, c] = g[u_a, u_b, u_c] u[a, b] u[b, c] + g[u_a, u_c] u[a, b, c]``;
* piecewise functions: a piece's own divided difference where every argument selects it, the
  quotient of values across pieces.

The rounding error of each result is then a sum of the primitives' (a few ulps each), and only
cancellation inherent in ``f`` as written (a sum of large terms with a small result) remains.
"""
from __future__ import annotations

import functools
import math
import warnings

from . import primitives as P
from .arrays import for_array
from .program import BOOLEAN, UNARY, ScalarProgram

__all__ = ["AccuracyWarning", "check_domain", "first", "second", "values"]


class AccuracyWarning(UserWarning):
    """A divided difference could not be evaluated to full accuracy (``f`` is not analytic near the
    eigenvalues, or is evaluated where it is ill-conditioned); the message names ``f``, the
    primitive and the arguments."""


#: warn when a primitive's estimated relative error exceeds this power of the dtype's eps
WARN_EXPONENT = 0.5


def _is_zero(v) -> bool:
    return isinstance(v, float) and v == 0.0


def _is_one(v) -> bool:
    return isinstance(v, float) and v == 1.0


def _add(a, b):
    if _is_zero(a):
        return b
    if _is_zero(b):
        return a
    return a + b


def _mul(a, b):
    if _is_zero(a) or _is_zero(b):
        return 0.0
    if _is_one(a):
        return b
    if _is_one(b):
        return a
    return a * b


def _half_sum(a, b):
    """``(a + b)/2`` without overflow."""
    if isinstance(a, float) and isinstance(b, float):
        return 0.5 * (a + b)
    return 0.5 * a + 0.5 * b


class _Eval:
    """One evaluation of a program: its array module, option values and error records."""

    def __init__(self, program: ScalarProgram, ref, opts):
        self.program, self.X, self.ref = program, for_array(ref), ref
        if len(opts) != len(program.options):
            raise TypeError(f"{program.text}: expected the options {program.options}, got {len(opts)} value(s)")
        self.opts = tuple(float(o) for o in opts)
        self.worst = None  # (error, kind, points) of the least accurate primitive evaluation

    # ------------------------------------------------------------------ parameters and derivatives
    def param(self, op):
        p = op.param
        if isinstance(p, str) and p.startswith("option:"):
            return self.opts[int(p.split(":", 1)[1])]
        return p

    def exponent(self, op, vals) -> float:
        """The constant exponent of a ``pow`` op (a number, or an op of the options alone)."""
        if len(op.args) == 2:
            c = vals[op.args[1]]
            if not isinstance(c, float):
                raise TypeError(f"{self.program.text}: the exponent of a power must not depend on x")
            return c
        return float(self.param(op))

    def derivatives(self, op, param=None) -> P.Derivatives:
        kind = op.kind
        key = f"polygamma:{op.param}" if kind == "polygamma" else kind
        return P.Derivatives(self._value_of, self.program.derivative_programs(key),
                             self.param(op) if param is None else param, record=self._record, kind=kind)

    def _value_of(self, program: ScalarProgram, m, opts):
        sub = _Eval(program, m, opts)
        out = sub.values(m)[-1]
        return sub.X.like(out, m) if isinstance(out, float) else out

    def _record(self, kind, error, points):
        X = self.X
        if not X.concrete(error):
            return  # values being traced: no estimate to read
        threshold = X.eps(points[0]) ** WARN_EXPONENT
        worst = X.where(X.isnan(error), 0.0, error)
        peak = float(worst.max()) if getattr(worst, "ndim", 0) else float(worst)
        if peak > threshold and (self.worst is None or peak > self.worst[0]):
            self.worst = (peak, kind, points, worst)

    def warn(self, roots):
        """An :class:`AccuracyWarning` naming ``f``, the primitive and the eigenvalues of the worst
        recorded evaluation."""
        if self.worst is None:
            return
        peak, kind, _, error = self.worst
        X = self.X
        flat = error.reshape(-1)
        index = int(flat.argmax())
        shape = error.shape
        coords = []
        for r in roots:
            full = X.like(0.0, error) + r
            coords.append(float(full.reshape(-1)[index]))
        del shape
        args = ", ".join(f"{v:.17g}" for v in coords)
        warnings.warn(f"{self.program.text}: its divided difference at the eigenvalues ({args}) is accurate only to "
                      f"about {peak:.1e} (relative; the primitive {kind} is evaluated where neither its series nor "
                      "its quotient keeps every digit)", AccuracyWarning, stacklevel=4)

    # ------------------------------------------------------------------ values
    def values(self, x):
        X, ops = self.X, self.program.ops
        out = []
        with X.errstate():
            for op in ops:
                k, a = op.kind, op.args
                if k == "x":
                    v = x
                elif k == "const":
                    v = float(op.param)
                elif k == "option":
                    v = self.opts[int(op.param)]
                elif k == "add":
                    v = out[a[0]]
                    for j in a[1:]:
                        v = v + out[j]
                elif k == "mul":
                    v = out[a[0]]
                    for j in a[1:]:
                        v = v * out[j]
                elif k == "pow":
                    v = P.pow_value(X, self._array(out[a[0]]), self.exponent(op, out))
                elif k in UNARY:
                    v = P.value(X, k, self._array(out[a[0]]), self.param(op))
                elif k in BOOLEAN:
                    v = self._boolean(k, [out[j] for j in a])
                elif k == "piecewise":
                    v = self._select([out[j] for j in a])
                else:  # pragma: no cover - the program validates its kinds
                    raise ValueError(f"unknown primitive {k!r}")
                out.append(v)
        return out

    def _array(self, v):
        return self.X.like(v, self.ref) if isinstance(v, float) else v

    def _boolean(self, k, args):
        X = self.X
        if k == "not":
            return X.logical_not(args[0])
        if k == "and":
            v = args[0]
            for b in args[1:]:
                v = X.logical_and(v, b)
            return v
        if k == "or":
            v = args[0]
            for b in args[1:]:
                v = X.logical_or(v, b)
            return v
        a, b = self._array(args[0]), args[1]
        return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b, "ne": a != b}[k]

    def _select(self, args):
        *pairs, otherwise = args
        v = otherwise
        for i in range(len(pairs) - 2, -1, -2):
            v = self.X.where(pairs[i], pairs[i + 1], v)
        return v

    def piece_index(self, op, vals):
        """The index of the piece each point selects (``len`` of the pieces: otherwise)."""
        X = self.X
        conds = op.args[0:-1:2]
        idx = len(conds)
        for i in range(len(conds) - 1, -1, -1):
            idx = X.where(vals[conds[i]], float(i), idx if not isinstance(idx, int) else float(idx))
        return idx


# ====================================================================================== public entry points
def values(program: ScalarProgram, x, opts=()):
    """``f(x)`` elementwise (an array of ``x``'s shape, also for a constant ``f``)."""
    ev = _Eval(program, x, opts)
    out = ev.values(x)[-1]
    return ev.X.like(out, x) if isinstance(out, float) else out


def first(program: ScalarProgram, a, b, opts=(), *, warn: bool = True):
    """``f[a, b] = (f(a) - f(b)) / (a - b)``, ``f'(a)`` where ``a = b``, elementwise (broadcasting)."""
    ev = _Eval(program, a, opts)
    X = ev.X
    va, vb = ev.values(a), ev.values(b)
    dd = []
    with X.errstate():
        for op in program.ops:
            k, args = op.kind, op.args
            if k == "x":
                d = 1.0
            elif k in ("const", "option") or k in BOOLEAN:
                d = 0.0
            elif k == "add":
                d = 0.0
                for j in args:
                    d = _add(d, dd[j])
            elif k == "mul":
                j0 = args[0]
                ua, ub, d = va[j0], vb[j0], dd[j0]
                for j in args[1:]:
                    d = _add(_mul(d, _half_sum(va[j], vb[j])), _mul(_half_sum(ua, ub), dd[j]))
                    ua, ub = ua * va[j], ub * vb[j]
            elif k == "pow":
                u = args[0]
                c = ev.exponent(op, va)
                d = _mul(P.pow_first(X, ev._array(va[u]), ev._array(vb[u]), c), dd[u])
            elif k in UNARY:
                u = args[0]
                d = _mul(P.first(X, k, ev._array(va[u]), ev._array(vb[u]), ev.param(op), ev.derivatives(op)), dd[u])
            elif k == "piecewise":
                d = _piecewise_first(ev, op, len(dd), va, vb, dd, a, b)
            dd.append(d)
    if warn:
        ev.warn((a, b))
    return _shaped(X, dd[-1], a, b)


def _shaped(X, out, *points):
    """``out`` as an array of the points' broadcast shape (a number for a constant ``f``)."""
    import numpy as np

    shape = tuple(np.broadcast_shapes(*(tuple(t.shape) for t in points)))
    if not isinstance(out, float) and tuple(out.shape) == shape:
        return out
    ref = points[0]
    for t in points[1:]:
        ref = ref + t
    return X.like(out, ref) if isinstance(out, float) else X.like(0.0, ref) + out


def _piecewise_first(ev, op, i, va, vb, dd, a, b):
    X = ev.X
    ia, ib = ev.piece_index(op, va), ev.piece_index(op, vb)
    exprs = list(op.args[1:-1:2]) + [op.args[-1]]
    same = X.like(0.0, a - b)
    for k in range(len(exprs) - 1, -1, -1):
        same = X.where(ia == float(k), X.like(0.0, a - b) + dd[exprs[k]], same)
    vi_a, vi_b = ev._select([va[j] for j in op.args]), ev._select([vb[j] for j in op.args])
    cross = (vi_a - vi_b) / P._safe(X, a - b)
    return X.where(ia == ib, same, cross)


def second(program: ScalarProgram, a, b, c, opts=(), *, warn: bool = True):
    """``f[a, b, c]``, the second divided difference (``f''/2`` at equal arguments), elementwise."""
    ev = _Eval(program, a, opts)
    X = ev.X
    pts = (a, b, c)
    vals = [ev.values(t) for t in pts]
    pairs = ((0, 1), (1, 2), (0, 2))
    D1 = []  # per op: (d_ab, d_bc, d_ac)
    D2 = []
    with X.errstate():
        for i, op in enumerate(program.ops):
            k, args = op.kind, op.args
            if k == "x":
                d1, d2 = (1.0, 1.0, 1.0), 0.0
            elif k in ("const", "option") or k in BOOLEAN:
                d1, d2 = (0.0, 0.0, 0.0), 0.0
            elif k == "add":
                d1, d2 = [0.0, 0.0, 0.0], 0.0
                for j in args:
                    d1 = [_add(s, t) for s, t in zip(d1, D1[j])]
                    d2 = _add(d2, D2[j])
                d1 = tuple(d1)
            elif k == "mul":
                j0 = args[0]
                u = [vals[t][j0] for t in range(3)]
                u1, u2 = D1[j0], D2[j0]
                for j in args[1:]:
                    v = [vals[t][j] for t in range(3)]
                    v1, v2 = D1[j], D2[j]
                    d1 = tuple(_add(_mul(u1[n], _half_sum(v[p], v[q])), _mul(_half_sum(u[p], u[q]), v1[n]))
                               for n, (p, q) in enumerate(pairs))
                    d2 = _add(_add(_mul(u[0], v2), _mul(u1[0], v1[1])), _mul(u2, v[2]))
                    u = [u[t] * v[t] for t in range(3)]
                    u1, u2 = d1, d2
                d1, d2 = u1, u2
            elif k == "pow" or k in UNARY:
                j = args[0]
                ua, ub, uc = (ev._array(vals[t][j]) for t in range(3))
                if k == "pow":
                    cexp = ev.exponent(op, vals[0])
                    D = ev.derivatives(op, cexp)
                    g1 = lambda p, q: P.pow_first(X, p, q, cexp)  # noqa: E731
                    g2 = lambda p, q, r: P.pow_second(X, p, q, r, cexp, D)  # noqa: E731
                else:
                    D = ev.derivatives(op)
                    prm = ev.param(op)
                    g1 = lambda p, q, k=k, prm=prm, D=D: P.first(X, k, p, q, prm, D)  # noqa: E731
                    g2 = lambda p, q, r, k=k, prm=prm, D=D: P.second(X, k, p, q, r, prm, D)  # noqa: E731
                u1, u2 = D1[j], D2[j]
                g_ab, g_bc, g_ac = g1(ua, ub), g1(ub, uc), g1(ua, uc)
                d1 = (_mul(g_ab, u1[0]), _mul(g_bc, u1[1]), _mul(g_ac, u1[2]))
                d2 = _mul(g_ac, u2)
                if not (_is_zero(u1[0]) or _is_zero(u1[1])):
                    d2 = _add(d2, _mul(_mul(g2(ua, ub, uc), u1[0]), u1[1]))
            elif k == "piecewise":
                d1, d2 = _piecewise_second(ev, op, vals, D1, D2, pts)
            D1.append(d1)
            D2.append(d2)
    if warn:
        ev.warn(pts)
    return _shaped(X, D2[-1], a, b, c)


def _piecewise_second(ev, op, vals, D1, D2, pts):
    X = ev.X
    a, b, c = pts
    idx = [ev.piece_index(op, vals[t]) for t in range(3)]
    exprs = list(op.args[1:-1:2]) + [op.args[-1]]
    zero = X.like(0.0, a + b + c)
    own = [ev._select([vals[t][j] for j in op.args]) for t in range(3)]

    def pick(values_of):
        out = zero
        for k in range(len(exprs) - 1, -1, -1):
            out = X.where(idx[0] == float(k), zero + values_of(exprs[k]), out)
        return out

    d1 = []
    for n, (p, q) in enumerate(((0, 1), (1, 2), (0, 2))):
        same = X.where(idx[p] == idx[q], 1.0, 0.0) > 0
        inner = zero
        for k in range(len(exprs) - 1, -1, -1):
            inner = X.where(idx[p] == float(k), zero + D1[exprs[k]][n], inner)
        cross = (own[p] - own[q]) / P._safe(X, pts[p] - pts[q])
        d1.append(X.where(same, inner, cross))
    all_same = (idx[0] == idx[1]) & (idx[1] == idx[2])
    inner2 = pick(lambda j: D2[j])
    # across pieces: from the pair differences with the widest separation as the denominator
    dpr, dpq, dqr = a - c, a - b, b - c
    by_pr = (d1[0] - d1[1]) / P._safe(X, dpr)
    by_qr = (d1[0] - d1[2]) / P._safe(X, dqr)
    by_pq = (d1[2] - d1[1]) / P._safe(X, dpq)
    apr, apq, aqr = X.abs(dpr), X.abs(dpq), X.abs(dqr)
    cross2 = X.where((apr >= apq) & (apr >= aqr), by_pr, X.where(aqr >= apq, by_qr, by_pq))
    return tuple(d1), X.where(all_same, inner2, cross2)


# ====================================================================================== domains
@functools.lru_cache(maxsize=256)
def _affine(program: ScalarProgram):
    """Per op, ``(alpha, beta)`` where the op is ``alpha x + beta`` with constants, else ``None``."""
    out = []
    for op in program.ops:
        k = op.kind
        if k == "x":
            out.append((1.0, 0.0))
        elif k == "const":
            out.append((0.0, float(op.param)))
        elif k == "add" and all(out[j] is not None for j in op.args):
            out.append((sum(out[j][0] for j in op.args), sum(out[j][1] for j in op.args)))
        elif k == "mul" and all(out[j] is not None for j in op.args) and \
                sum(1 for j in op.args if out[j][0] != 0) <= 1:
            alpha, beta = 1.0, 1.0
            lin = [out[j] for j in op.args if out[j][0] != 0]
            const = math.prod(out[j][1] for j in op.args if out[j][0] == 0)
            alpha, beta = (lin[0][0] * const, lin[0][1] * const) if lin else (0.0, const)
            out.append((alpha, beta))
        else:
            out.append(None)
    return out


def _active(program: ScalarProgram, ev, vals, X, ref):
    """Per op, where its value is used at the points (a piece of a piecewise function only where it
    is selected): boolean arrays, or ``True``."""
    n = len(program.ops)
    active = [False] * n
    active[-1] = True
    for i in range(n - 1, -1, -1):
        op = program.ops[i]
        if active[i] is False:
            continue
        if op.kind == "piecewise":
            idx = ev.piece_index(op, vals)
            conds = op.args[0:-1:2]
            exprs = list(op.args[1:-1:2]) + [op.args[-1]]
            for j in conds:
                active[j] = _or(X, active[j], active[i])
            for k, j in enumerate(exprs):
                active[j] = _or(X, active[j], _and(X, active[i], idx == float(k)))
        else:
            for j in op.args:
                active[j] = _or(X, active[j], active[i])
    return active


def _or(X, a, b):
    if a is True or b is True:
        return True
    if a is False:
        return b
    if b is False:
        return a
    return X.logical_or(a, b)


def _and(X, a, b):
    if a is True:
        return b
    if b is True:
        return a
    if a is False or b is False:
        return False
    return X.logical_and(a, b)


def _all_inside(program, ev, w, order, tol) -> bool:
    """The common case in one reduction: every restricted primitive's argument is inside its
    domain, clear of the ends where only rounding decides (and ``f`` is not NaN); ``False`` sends the
    caller to the detailed check (which snaps, finds the offending eigenvalue and explains)."""
    X = ev.X
    if "piecewise" in program.kinds:
        return False  # pieces are checked only where selected
    vals = ev.values(w)
    bad = False
    for op in program.ops:
        if op.kind != "pow" and op.kind not in UNARY:
            continue
        u = ev._array(vals[op.args[0]])
        if op.kind == "pow":
            c = ev.exponent(op, vals)
            allowed, _, closed = P.pow_domain(X, u, c, order)
            ends0 = P.pow_domain(X, u, c, 0)[2] if order > 0 else ()
        else:
            allowed, _, closed = P.domain(X, op.kind, u, ev.param(op), order)
            ends0 = P.domain(X, op.kind, u, ev.param(op), 0)[2] if order > 0 else ()
        if allowed is not None:
            bad = _or(X, bad, ~allowed)
        for end in ends0:
            if end not in closed:  # the value exists there, the derivative does not: a margin
                if tol is None:
                    return False
                bad = _or(X, bad, X.abs(u - end) <= 1e8 * tol)  # generous: the detailed check decides
    if order == 0:
        f = vals[-1]
        if not isinstance(f, float):
            bad = _or(X, bad, X.isnan(f))
    return bad is False or not X.any(bad)


def check_domain(program: ScalarProgram, w, opts=(), *, order: int = 0, name: str = "funm", tol=None,
                 exact=None, advice: str = ""):
    """Check that ``f`` (``order = 0``) or its derivatives up to ``order`` exist at every value of ``w``
    (eigenvalues ``(..., n)``); return ``w``, with values a rounding error ``tol`` outside a closed end
    of a domain moved onto it (``order = 0``).  Raises :class:`ValueError` naming the primitive, its
    argument and the eigenvalue.

    For ``order >= 1`` an argument within rounding (``tol``) of a boundary where the value exists but
    the derivative does not (``sqrt`` at 0) is refused too, since only rounding decides how large
    the derivative is, unless ``exact()`` says the eigenvalues are exact (a diagonal matrix)."""
    ev = _Eval(program, w, opts)
    X = ev.X
    if getattr(w, "numel", None) is not None and w.numel() == 0 or getattr(w, "size", 1) == 0:
        return w
    if _all_inside(program, ev, w, order, tol):
        return w
    affine = _affine(program)
    for _attempt in range(2):
        vals = ev.values(w)
        active = _active(program, ev, vals, X, w)
        snapped = None
        for i, op in enumerate(program.ops):
            if op.kind != "pow" and op.kind not in UNARY or active[i] is False:
                continue
            u = ev._array(vals[op.args[0]])
            if op.kind == "pow":
                allowed, desc, closed = P.pow_domain(X, u, ev.exponent(op, vals), order)
            else:
                allowed, desc, closed = P.domain(X, op.kind, u, ev.param(op), order)
            bad = None if allowed is None else ~allowed
            aff = affine[op.args[0]]
            if order > 0 and aff is not None and aff[0] != 0 and tol is not None:
                _, _, closed0 = (P.pow_domain(X, u, ev.exponent(op, vals), 0) if op.kind == "pow"
                                 else P.domain(X, op.kind, u, ev.param(op), 0))
                for end in closed0:
                    if end in closed:
                        continue  # the derivatives exist at this end too
                    if allowed is not None and X.any(_and(X, active[i], X.abs(u - end) <= abs(aff[0]) * tol)):
                        if exact is None or not exact():
                            near = X.abs(u - end) <= abs(aff[0]) * tol
                            bad = near if bad is None else X.logical_or(bad, near)
            if bad is None:
                continue
            bad = _and(X, active[i], bad)
            if bad is False or not X.any(bad):
                continue
            if order == 0 and closed and aff is not None and aff[0] != 0 and tol is not None and snapped is None:
                fix = w
                for end in closed:
                    target = (end - aff[1]) / aff[0]
                    near = bad & (X.abs(w - target) <= tol)
                    fix = X.where(near, target, fix)
                if not X.any(bad & (fix == w)):
                    snapped = fix
                    continue
            raise ValueError(_domain_message(program, i, op, w, u, bad, desc, order, name, advice))
        if snapped is None:
            break
        w = snapped
    if order == 0:
        f = ev.values(w)[-1]
        if not isinstance(f, float) and X.any(X.isnan(f)):
            bad = X.isnan(f)
            raise ValueError(f"{name}: {program.text} is not defined (NaN) at the eigenvalue {_locate(w, bad)} of A")
    return w


def _numpy(v):
    import numpy as np

    if hasattr(v, "detach"):
        return v.detach().cpu().numpy()
    if hasattr(v, "get"):  # CuPy
        return v.get()
    return np.asarray(v)


def _locate(w, bad) -> str:
    """``"<value> (index i of batch element (...))"`` of the first ``bad`` eigenvalue."""
    import numpy as np

    wn = _numpy(w)
    mask = np.broadcast_to(_numpy(bad), wn.shape)
    index = tuple(int(i) for i in np.argwhere(mask)[0])
    where = f" (index {index[-1]}" + (f" of batch element {index[:-1]}" if len(index) > 1 else "") + ")"
    return f"{float(wn[index]):.6g}{where}"


def _domain_message(program, i, op, w, u, bad, desc, order, name, advice="") -> str:
    import numpy as np

    texts = program.texts
    arg_text = texts[op.args[0]] if len(texts) > op.args[0] else "its argument"
    op_text = texts[i] if len(texts) > i else op.kind
    wn = _numpy(w)
    mask = np.broadcast_to(_numpy(bad), wn.shape)
    un = np.broadcast_to(_numpy(u), wn.shape)
    index = tuple(int(j) for j in np.argwhere(mask)[0])
    at = _locate(w, bad)
    what = "not defined" if order == 0 else ("not differentiable" if order == 1 else f"not {order} times differentiable")
    here = "" if arg_text == "x" else f"; here {arg_text} = {float(un[index]):.6g}"
    within = " (to rounding)" if order > 0 and (desc.startswith(">") or desc.startswith("!=")) else ""
    where = op_text if op_text == program.text else f"{op_text} in f = {program.text}"
    if not advice and arg_text == "x" and desc in _DEFINITE:  # a condition on the eigenvalues: on A
        advice = f"; {name} needs a {_DEFINITE[desc]} A"
    return (f"{name}: A has the eigenvalue {at}, where {where} is {what}{within} (it needs {arg_text} {desc}{here})"
            f"{advice}")


#: a condition on every eigenvalue of a Hermitian A, as a property of A
_DEFINITE = {"> 0": "positive definite", ">= 0": "positive semidefinite", "< 0": "negative definite",
             "<= 0": "negative semidefinite"}

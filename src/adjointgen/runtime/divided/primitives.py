"""Primitives of scalar programs: values, first and second divided differences, domains.

Each unary primitive ``g`` evaluates ``g(u)``, ``g[p, q] = (g(p) - g(q)) / (p - q)`` (``g'(p)`` at
``p = q``) and ``g[p, q, r]`` (``g''/2`` at equal arguments) elementwise, without the cancellation
of the quotients as written.  Three kinds of evaluation:

* **identities** that turn a difference into a product of well-conditioned factors, e.g.
  ``sin p - sin q = 2 cos((p+q)/2) sin((p-q)/2)``, ``exp[p, q] = e^max (1 - e^-|p-q|)/|p-q|``,
  ``log[p, q] = log1p((p - q)/q)/(p - q)``, ``tanh p - tanh q = (1 - tanh p tanh q) tanh(p - q)``;
  they hold for every gap, and the overflow-prone ones fall back to the logarithm of the product
  where a factor over- or underflows but the result does not;
* **the quotient or the midpoint series**, chosen per element by an estimate of each one's error:
  the quotient loses ``eps (|g(p)| + |g(q)|) / |g(p) - g(q)|``, the truncated series
  ``Σ_k g^(2k+1)(m) h^(2k) / (2k+1)!`` its last terms.  The series' derivatives come from the
  program (derived by SymPy).  Second divided differences of every primitive go this way, with
  ``(g[mid, hi] - g[lo, mid]) / (hi - lo)`` as the quotient and the series about the mean of the
  three arguments; homogeneous primitives (``u^c``, ``log``) evaluate the series at arguments
  scaled by a power of two, ``exp`` at arguments shifted by their maximum;
* **piecewise** primitives (``abs``, ``sign``, ``heaviside``, ``floor``): zero on one piece, the
  quotient across pieces.

Domains: :func:`domain` gives, per primitive, where its value (order 0) or its derivatives up to an
order exist, for the checks of :mod:`adjointgen.runtime.divided.evaluate`.
"""
from __future__ import annotations

import math

__all__ = ["FIRST_TERMS", "SECOND_TERMS", "Derivatives", "domain", "first", "second", "value"]

#: terms of the midpoint series of f[p, q] (odd derivatives f', f''', ..., f^(2K-1))
FIRST_TERMS = 6
#: terms of the series of f[p, q, r] about the mean (derivatives f'', ..., f^(K+1))
SECOND_TERMS = 8
#: the highest derivative a primitive's program must provide for the series
MAX_ORDER = max(2 * FIRST_TERMS - 1, SECOND_TERMS + 1)


class Derivatives:
    """``D(order, m)``: the derivative of order ``order`` of one primitive (with its parameter) at
    ``m``, from the program's derivative programs; ``None`` past the last one.  ``record(kind,
    error, p, q)`` collects the error estimate of a series/quotient choice (for warnings)."""

    def __init__(self, evaluate, programs, param, record=None, kind=""):
        self._evaluate, self._programs, self._param = evaluate, programs, param
        self._record, self.kind = record, kind
        self._cache = {}

    def __call__(self, order: int, m):
        if order > len(self._programs):
            return None
        key = (order, id(m))
        if key not in self._cache:
            program = self._programs[order - 1]
            self._cache[key] = (m, self._evaluate(program, m, (self._param,) if program.options else ()))
        return self._cache[key][1]

    def record(self, error, *points):
        if self._record is not None:
            self._record(self.kind, error, points)


# ====================================================================================== helpers
def _safe(X, d):
    """``d`` with its zeros replaced by 1 (a denominator where the quotient is not selected)."""
    return X.where(d == 0, 1, d)


def _sorted3(X, p, q, r):
    lo = X.minimum(X.minimum(p, q), r)
    hi = X.maximum(X.maximum(p, q), r)
    mid = X.maximum(X.minimum(p, q), X.minimum(X.maximum(p, q), r))
    return lo, mid, hi


def _quotient_error(X, gp, gq, d, eps):
    """Absolute error of ``(gp - gq)/d`` formed from rounded values (``inf`` where ``d = 0``)."""
    with X.errstate():
        err = 2 * eps * (X.abs(gp) + X.abs(gq)) / X.abs(d)
    return X.where(X.isnan(err) | (d == 0), math.inf, err)


class _Series:
    """A running sum of series terms, per element: terms stop being added where one is not finite
    (a high derivative overflows where the series is accurate long before), and the last four added
    terms estimate the rest."""

    def __init__(self, X):
        self.X, self.S, self.total, self.count = X, 0.0, 0.0, 0
        self.alive = True
        self.last = [0.0, 0.0, 0.0, 0.0]  # newest first

    def add(self, t):
        X = self.X
        ok = X.isfinite(t) if self.alive is True else self.alive & X.isfinite(t)
        self.alive = ok
        t = X.where(ok, t, 0.0)
        self.S, self.total = self.S + t, self.total + X.abs(t)
        l1, l2, l3, _ = self.last
        self.last = [X.where(ok, t, l1), X.where(ok, l1, l2), X.where(ok, l2, l3), X.where(ok, l3, self.last[3])]
        self.count = self.count + X.where(ok, 1.0, 0.0)

    def error(self, eps):
        """Absolute error: the terms shrink by about ``r`` per term (estimated over two steps: terms
        may vanish in turn), so the rest is about ``(|t_n| + |t_n-1|) r^2 / (1 - r)``; plus the
        rounding of the sum.  Infinite with fewer than two terms, or where they do not shrink."""
        X = self.X
        t1, t2, t3, t4 = (X.abs(t) for t in self.last)
        with X.errstate():
            r2 = X.where(self.count >= 4, (t1 + t2) / (t3 + t4), (t1 / t2) ** 2)  # fewer terms: one step
            rest = 10.0 * (t1 + t2) * r2 / X.maximum(1.0 - X.sqrt(r2), 0.0)
            err = rest + 4 * eps * self.total
        exact = ((t1 + t2 + t3 + t4) == 0) & (self.total > 0)  # a polynomial: the series ended
        err = X.where(exact, 4 * eps * self.total, err)
        bad = X.isnan(err) | ~((r2 < 1) | exact) | (self.total == 0) | (self.count < 2)
        return X.where(bad, math.inf, err)


def _relative(X, err, value):
    """``err / |value|`` for warnings (0 where the value is exactly 0: nothing to compare)."""
    with X.errstate():
        rel = err / X.abs(value)
    return X.where(value == 0, 0.0, rel)


def _sinc(X, z):
    """``sin(z)/z`` (1 at 0): accurate for every ``z``, no cancellation."""
    return X.where(z == 0, 1.0, X.sin(z) / _safe(X, z))


def _sinhc(X, z):
    return X.where(z == 0, 1.0, X.sinh(z) / _safe(X, z))


def _ratio(X, f, z):
    """``f(z)/z`` with its limit 1 at 0 (``f`` = atan, atanh, asinh, log1p, expm1 ...)."""
    return X.where(z == 0, 1.0, f(z) / _safe(X, z))


def _phi1(X, d):
    """``(1 - e^-d)/d`` for ``d >= 0`` (1 at 0)."""
    with X.errstate():
        return X.where(d == 0, 1.0, X.expm1(-d) / -d)


def _times_exp(X, e_arg, factor):
    """``exp(e_arg) * factor`` for ``0 < factor <= 1``, through ``exp(e_arg + log factor)`` where
    ``exp(e_arg)`` overflows but the product need not (where it underflows, so does the product).
    The second form is evaluated only when some ``e_arg`` is past the overflow threshold."""
    direct = X.exp(e_arg) * factor
    if float(X.max(e_arg)) <= X.log_max(e_arg):
        return direct
    with X.errstate():
        logform = X.exp(e_arg + X.log(factor))
    return X.where(X.isfinite(direct), direct, logform)


def _logabs_expm1(X, z):
    """``log|e^z - 1|`` without overflow (``z`` of either sign, ``-inf`` at 0)."""
    with X.errstate():
        pos = z + X.log1p(-X.exp(-X.abs(z)))
        neg = X.log(-X.expm1(X.minimum(z, 0.0)))
    return X.where(z > 0, pos, neg)


# ====================================================================================== values
def value(X, kind, u, param=None):
    """``g(u)`` of the unary primitive ``kind``."""
    with X.errstate():
        if kind == "gamma":
            k = X.ceil(-u)
            sign = X.where(u > 0, 1.0, 1.0 - 2.0 * (k - 2.0 * X.floor(k / 2.0)))
            return sign * X.exp(X.lgamma(u))
        if kind == "loggamma":
            return X.lgamma(u)
        if kind == "polygamma":
            return X.polygamma(param, u)
        if kind == "besselj0":
            return X.j0(u)
        if kind == "besselj1":
            return X.j1(u)
        if kind == "sinc":
            return _sinc(X, u)
        if kind == "heaviside":
            return X.where(u > 0, 1.0, X.where(u < 0, 0.0, 0.5 if param is None else float(param)))
        if kind == "ceiling":
            return X.ceil(u)
        if kind == "softplus":  # log(1 + e^u) = max(u, 0) + log1p(e^-|u|)
            return X.maximum(u, 0.0) + X.log1p(X.exp(-X.abs(u)))
        if kind == "xlogx":
            return X.where(u == 0, 0.0, u * X.log(X.where(u == 0, 1.0, u)))
        if kind == "sigmoid":  # 1/(1 + e^-u), no overflow
            return X.where(u >= 0, 1.0 / (1.0 + X.exp(-u)), X.exp(u) / (1.0 + X.exp(u)))
        return getattr(X, kind)(u)


def pow_value(X, u, c):
    """``u**c`` for a real constant ``c`` (integer ``c``: any sign of ``u``)."""
    with X.errstate():
        if c == 0.5:
            return X.sqrt(u)
        return u ** c


# ====================================================================================== first divided differences
def first(X, kind, p, q, param, D: Derivatives):
    """``g[p, q]`` of the unary primitive ``kind`` (elementwise, broadcasting)."""
    with X.errstate():
        fn = _FIRST.get(kind)
        if fn is not None:
            return fn(X, p, q, param)
        if kind in _STEPS:
            return _step_first(X, kind, p, q, param)
        if kind in ("erf", "erfc"):
            return _erf_first(X, kind, p, q, D)
        return first_generic(X, lambda u: value(X, kind, u, param), p, q, D)


class _Masked:
    """``D`` whose error records count only where ``mask`` holds (a branch that ``where`` may drop)."""

    def __init__(self, D, mask):
        self.D, self.mask = D, mask

    def __call__(self, order, m):
        return self.D(order, m)

    def record(self, error, *points):
        self.D.record(error * self.mask, *points)


class _Scaled:
    """``sign * D``: the derivatives of ``sign * g`` (``erfc = 1 - erf``: ``erfc' = -erf'``)."""

    def __init__(self, D, sign):
        self.D, self.sign = D, sign

    def __call__(self, order, m):
        v = self.D(order, m)
        return None if v is None else self.sign * v

    def record(self, error, *points):
        self.D.record(error, *points)


def _tails(X, p, q, r=None):
    """Where every argument is past 1/2 on the positive side, and on the negative side."""
    pts = (p, q) if r is None else (p, q, r)
    pos = neg = True
    for t in pts:
        pos = pos & (t > 0.5)
        neg = neg & (t < -0.5)
    return pos, neg


def _erf_first(X, kind, p, q, D):
    """``erf`` and ``erfc`` near their asymptotes through ``G = erfc`` on positive arguments (tiny
    values, no cancellation): ``erf[p, q] = -G[|p|, |q|]``; ``erfc[p, q] = G[p, q]`` (p, q > 0),
    ``G[-p, -q]`` (p, q < 0)."""
    G_D = D if kind == "erfc" else _Scaled(D, -1.0)
    G = lambda u: X.erfc(u)  # noqa: E731
    pos, neg = _tails(X, p, q)
    tail = pos | neg
    own = first_generic(X, lambda u: value(X, kind, u), p, q, _Masked(D, X.where(tail, 0.0, 1.0)))
    if not X.any(tail):
        return own
    G_pos = first_generic(X, G, X.abs(p), X.abs(q), _Masked(G_D, X.where(tail, 1.0, 0.0)))
    if kind == "erf":
        return X.where(pos | neg, -G_pos, own)
    return X.where(pos | neg, G_pos, own)


def first_generic(X, g, p, q, D: Derivatives):
    """The quotient or the midpoint series, whichever has the smaller estimated error."""
    eps = X.eps(p)
    gp, gq = g(p), g(q)
    d = p - q
    Q = (gp - gq) / _safe(X, d)
    E_Q = _quotient_error(X, gp, gq, d, eps)
    m, h = 0.5 * (p + q), 0.5 * d
    h2 = h * h
    series = _Series(X)
    power = 1.0
    for k in range(FIRST_TERMS):
        g_k = D(2 * k + 1, m)
        if g_k is None:
            break
        series.add(g_k * power / math.factorial(2 * k + 1))
        power = power * h2
    if D(1, m) is None:  # no derivative program: the quotient
        D.record(_relative(X, E_Q, Q), p, q)
        return Q
    S, E_S = series.S, series.error(eps)
    E_S = X.where(d == 0, 0.0, E_S)
    use_series = E_S < E_Q
    out = X.where(d == 0, D(1, m), X.where(use_series, S, Q))  # g' itself at equal arguments
    D.record(_relative(X, X.minimum(E_S, E_Q), out), p, q)
    return out


def _exp_first(X, p, q, _):
    hi = X.maximum(p, q)
    return _times_exp(X, hi, _phi1(X, X.abs(p - q)))


def _log_first(X, p, q, _):
    lo, hi = X.minimum(p, q), X.maximum(p, q)
    d = lo - hi
    close = lo >= 0.5 * hi  # then d is exact and log1p(d/hi) keeps every digit
    near = X.log1p(d / hi) / _safe(X, d)
    far = _log_ratio(X, lo, hi) / _safe(X, d)
    return X.where(d == 0, 1.0 / hi, X.where(close, near, far))


def _log_ratio(X, lo, hi):
    """``log(lo/hi)`` for ``0 <= lo <= hi``, also where ``lo/hi`` underflows."""
    t = lo / X.where(hi == 0, 1.0, hi)
    normal = t >= X.tiny(t) * 4
    return X.where(normal, X.log(t), X.log(lo) - X.log(hi))


def _log1p_first(X, p, q, _):
    """``log1p[p, q] = log[1 + p, 1 + q]``, with the difference ``p - q`` taken exactly."""
    lo, hi = X.minimum(p, q), X.maximum(p, q)
    d = lo - hi
    A, B = 1.0 + lo, 1.0 + hi
    close = A > 0.5 * B
    near = X.log1p(d / B) / _safe(X, d)
    far = (X.log1p(lo) - X.log1p(hi)) / _safe(X, d)
    return X.where(d == 0, 1.0 / B, X.where(close, near, far))


def _expm1_first(X, p, q, _):
    return _exp_first(X, p, q, None)


def _sin_first(X, p, q, _):
    return X.cos(0.5 * (p + q)) * _sinc(X, 0.5 * (p - q))


def _cos_first(X, p, q, _):
    return -X.sin(0.5 * (p + q)) * _sinc(X, 0.5 * (p - q))


def _tan_first(X, p, q, _):
    # tan p - tan q = sin(p - q) / (cos p cos q)
    return _sinc(X, p - q) / (X.cos(p) * X.cos(q))


def _sinh_first(X, p, q, _):
    # (exp[p, q] + exp[-p, -q]) / 2: two positive terms, overflow-safe
    return 0.5 * (_exp_first(X, p, q, None) + _exp_first(X, -p, -q, None))


def _cosh_first(X, p, q, param):
    big = X.maximum(X.abs(p), X.abs(q)) > 0.5 * X.log_max(p)
    with X.errstate():
        near = X.sinh(0.5 * (p + q)) * _sinhc(X, 0.5 * (p - q))
    far = 0.5 * (_exp_first(X, p, q, None) - _exp_first(X, -p, -q, None))  # one term dominates
    return X.where(big, far, near)


def _tanh_first(X, p, q, _):
    # same signs: tanh[|p|, |q|] = 2 e^-2lo (1 - e^-2d) / (d (1 + e^-2hi)(1 + e^-2lo)), d = hi - lo;
    # opposite signs: the quotient (no cancellation)
    ap, aq = X.abs(p), X.abs(q)
    lo, hi = X.minimum(ap, aq), X.maximum(ap, aq)
    d = hi - lo
    e_lo, e_hi = X.exp(-2.0 * lo), X.exp(-2.0 * hi)
    same = 2.0 * e_lo * (2.0 * _phi1(X, 2.0 * d)) / ((1.0 + e_hi) * (1.0 + e_lo))
    cross = (X.tanh(p) - X.tanh(q)) / _safe(X, p - q)
    return X.where((p >= 0) == (q >= 0), same, cross)


def _sigmoid_first(X, p, q, _):
    return 0.25 * _tanh_first(X, 0.5 * p, 0.5 * q, None)


def _softplus_first(X, p, q, _):
    # softplus p - softplus q = log1p(z), z = (e^p - e^q)/(1 + e^q) = exp[p, q] (p - q)/(1 + e^q)
    lo, hi = X.minimum(p, q), X.maximum(p, q)
    moderate = hi <= 30.0
    with X.errstate():
        e_pq = _exp_first(X, X.minimum(p, 30.0), X.minimum(q, 30.0), None)
        d = p - q
        z = e_pq * d / (1.0 + X.exp(X.minimum(q, 30.0)))
        small = _ratio(X, X.log1p, z) * e_pq / (1.0 + X.exp(X.minimum(q, 30.0)))
    # both positive and large: softplus(x) = x + softplus(-x)
    positive = 1.0 - _softplus_first_small(X, -p, -q)
    cross = (value(X, "softplus", p) - value(X, "softplus", q)) / _safe(X, d)
    return X.where(moderate, small, X.where(lo >= 0, positive, cross))


def _softplus_first_small(X, p, q):
    """``softplus[p, q]`` for ``p, q <= 0`` (the log1p form)."""
    with X.errstate():
        e_pq = _exp_first(X, p, q, None)
        z = e_pq * (p - q) / (1.0 + X.exp(q))
        return _ratio(X, X.log1p, z) * e_pq / (1.0 + X.exp(q))


def _atan_first(X, p, q, _):
    # atan p - atan q = atan((p - q)/(1 + p q)) where 1 + p q > 0
    s = 1.0 + p * q
    with X.errstate():
        z = (p - q) / _safe(X, s)
        near = _ratio(X, X.atan, z) / _safe(X, s)
    cross = (X.atan(p) - X.atan(q)) / _safe(X, p - q)
    return X.where(s > 0, near, cross)


def _atanh_first(X, p, q, _):
    s = 1.0 - p * q  # > 0 inside the domain
    z = (p - q) / _safe(X, s)
    return _ratio(X, X.atanh, z) / _safe(X, s)


def _asinh_first(X, p, q, _):
    # same signs: asinh p - asinh q = asinh(z), z = (p - q)(p + q)/(p sqrt(1+q^2) + q sqrt(1+p^2))
    ap, aq = X.abs(p), X.abs(q)
    big = X.minimum(ap, aq) > 1e8  # asinh x = log(2x) to rounding: log[p, q]
    with X.errstate():
        den = ap * X.hypot(1.0, aq) + aq * X.hypot(1.0, ap)
        z = (ap - aq) * (ap + aq) / _safe(X, den)
        same = X.where(ap == aq, 1.0 / X.hypot(1.0, ap), _ratio(X, X.asinh, z) * (ap + aq) / _safe(X, den))
    same = X.where(big, _log_first(X, ap, aq, None), same)
    cross = (X.asinh(p) - X.asinh(q)) / _safe(X, p - q)
    return X.where((p >= 0) == (q >= 0), same, cross)


def _xlogx_first(X, p, q, _):
    # Leibniz: (log p + log q)/2 + (p + q)/2 log[p, q]; log(hi) where lo = 0
    lo, hi = X.minimum(p, q), X.maximum(p, q)
    pos = lo > 0
    lo_s, hi_s = X.where(pos, lo, 1.0), X.where(pos, hi, 1.0)
    both = 0.5 * (X.log(lo_s) + X.log(hi_s)) + (0.5 * lo_s + 0.5 * hi_s) * _log_first(X, lo_s, hi_s, None)
    return X.where(pos, both, X.where(hi > 0, X.log(X.where(hi > 0, hi, 1.0)), -math.inf))


def _abs_first(X, p, q, _):
    cross = (X.abs(p) - X.abs(q)) / _safe(X, p - q)
    return X.where((p >= 0) & (q >= 0), 1.0, X.where((p <= 0) & (q <= 0), -1.0, cross))


_STEPS = {"sign", "heaviside", "floor", "ceiling"}


def _step_first(X, kind, p, q, param):
    """Piecewise constant: 0 on one step, the quotient across."""
    gp, gq = value(X, kind, p, param), value(X, kind, q, param)
    return X.where(gp == gq, 0.0, (gp - gq) / _safe(X, p - q))


_FIRST = {"exp": _exp_first, "log": _log_first, "log1p": _log1p_first, "expm1": _expm1_first, "sin": _sin_first,
          "cos": _cos_first, "tan": _tan_first, "sinh": _sinh_first, "cosh": _cosh_first, "tanh": _tanh_first,
          "sigmoid": _sigmoid_first, "softplus": _softplus_first, "atan": _atan_first, "atanh": _atanh_first,
          "asinh": _asinh_first, "abs": _abs_first, "xlogx": _xlogx_first}


# ---------------------------------------------------------------------------------------- powers
def pow_first(X, p, q, c: float):
    """``(u^c)[p, q]`` for a real constant ``c``; integer ``c`` takes arguments of either sign."""
    with X.errstate():
        if c == 0:
            return X.like(0.0, p - q)
        if c == 1:
            return X.like(1.0, p - q)
        if c == 0.5:
            return 1.0 / (X.sqrt(p) + X.sqrt(q))
        if c == 2:
            return p + q
        if c == -1:
            return -(1.0 / p) * (1.0 / q)
        ap, aq = X.abs(p), X.abs(q)
        core = _pow_core(X, X.minimum(ap, aq), X.maximum(ap, aq), c)
        if c != round(c):
            return core  # the domain is u >= 0
        odd = int(round(c)) % 2 == 1
        both_neg = (p <= 0) & (q <= 0)
        both_pos = (p >= 0) & (q >= 0)
        neg = core if odd else -core  # (-1)^(c+1) core
        if odd:
            cross = (pow_value(X, p, c) - pow_value(X, q, c)) / _safe(X, p - q)
        else:
            cross = core * (-(p + q)) / _safe(X, p - q)
        return X.where(both_pos, core, X.where(both_neg, neg, cross))


def _pow_core(X, lo, hi, c: float):
    """``(y^c)[lo, hi]`` for ``0 <= lo <= hi``: ``hi^(c-1) rho(t)``, ``t = lo/hi``,
    ``rho(t) = (t^c - 1)/(t - 1)``, and its logarithm where a factor over- or underflows."""
    zero = hi == 0
    hi_s = X.where(zero, 1.0, hi)
    log_t = _log_ratio(X, lo, hi_s)  # t itself may underflow
    t = lo / hi_s
    close = t > 0.5
    r = (lo - hi) / hi_s  # exact when close
    rho_close = X.where(r == 0, c, X.expm1(c * X.log1p(r)) / _safe(X, r))
    rho_far = X.expm1(c * log_t) / (t - 1.0)
    rho = X.where(close, rho_close, rho_far)
    direct = hi_s ** (c - 1.0) * rho
    log_rho = X.where(close, X.log(X.abs(rho)), _logabs_expm1(X, c * log_t) - X.log1p(-t))
    logform = math.copysign(1.0, c) * X.exp((c - 1.0) * X.log(hi_s) + log_rho)
    ok = X.isfinite(direct) & (direct != 0)
    out = X.where(ok, direct, logform)
    at_zero = 0.0 if c > 1 else math.inf  # both arguments 0: c 0^(c-1)
    return X.where(zero, at_zero, out)


def pow_second(X, p, q, r, c: float, D: Derivatives):
    """``(u^c)[p, q, r]``."""
    with X.errstate():
        if c in (0, 1):
            return X.like(0.0, p + q + r)
        if c == 2:
            return X.like(1.0, p + q + r)
        if c == 3:
            return p + q + r
        if c == 0.5:
            sp_, sq, sr = X.sqrt(p), X.sqrt(q), X.sqrt(r)
            return -1.0 / ((sp_ + sq) * (sq + sr) * (sr + sp_))
        if c == -1:
            lo, mid, hi = _sorted3(X, p, q, r)
            return 1.0 / ((lo * hi) * mid)
        integer = c == round(c)
        first_fn = lambda a, b: pow_first(X, a, b, c)  # noqa: E731
        if not integer:
            return second_generic(X, first_fn, p, q, r, D, degree=c)
        odd = int(round(c)) % 2 == 1
        pos = (p >= 0) & (q >= 0) & (r >= 0)
        neg = (p <= 0) & (q <= 0) & (r <= 0)
        D_same = _Masked(D, X.where(pos | neg, 1.0, 0.0))
        same = second_generic(X, lambda a, b: pow_first(X, a, b, c), X.abs(p), X.abs(q), X.abs(r), D_same, degree=c)
        mixed = _second_from_pairs(X, first_fn, p, q, r)
        return X.where(pos, same, X.where(neg, -same if odd else same, mixed))


# ====================================================================================== second divided differences
def second(X, kind, p, q, r, param, D: Derivatives):
    """``g[p, q, r]`` of the unary primitive ``kind``."""
    with X.errstate():
        first_fn = lambda a, b: first(X, kind, a, b, param, D)  # noqa: E731
        if kind in _STEPS or kind == "abs":
            return _piecewise_linear_second(X, first_fn, kind, p, q, r, param)
        if kind in ("exp", "expm1"):
            s = X.maximum(X.maximum(p, q), r)
            inner = second_generic(X, lambda a, b: _exp_first(X, a, b, None), p - s, q - s, r - s, D)
            return _times_exp(X, s, inner)
        if kind == "log":
            return second_generic(X, first_fn, p, q, r, D, degree=0.0)
        if kind in ("erf", "erfc"):
            return _erf_second(X, kind, p, q, r, D)
        if kind in ("softplus", "sigmoid"):
            # softplus(x) = x + softplus(-x), sigmoid(x) = 1 - sigmoid(-x): the tiny side for x >= 0
            pos = (p >= 0) & (q >= 0) & (r >= 0)
            own = second_generic(X, first_fn, p, q, r, _Masked(D, X.where(pos, 0.0, 1.0)))
            if not X.any(pos):
                return own
            mirrored = second_generic(X, first_fn, -p, -q, -r, _Masked(D, X.where(pos, 1.0, 0.0)))
            return X.where(pos, mirrored if kind == "softplus" else -mirrored, own)
        if kind == "xlogx":  # u log u: homogeneous of degree 1 up to a linear term
            return second_generic(X, first_fn, p, q, r, D, degree=1.0)
        return second_generic(X, first_fn, p, q, r, D)


def _erf_second(X, kind, p, q, r, D):
    pos, neg = _tails(X, p, q, r)
    tail = pos | neg
    own_D = _Masked(D, X.where(tail, 0.0, 1.0))
    own = second_generic(X, lambda a, b: first(X, kind, a, b, None, own_D), p, q, r, own_D)
    if not X.any(tail):
        return own
    G_D = _Masked(D if kind == "erfc" else _Scaled(D, -1.0), X.where(tail, 1.0, 0.0))
    G1 = lambda a, b: first_generic(X, X.erfc, a, b, G_D)  # noqa: E731
    G_pos = second_generic(X, G1, X.abs(p), X.abs(q), X.abs(r), G_D)
    # erf = 1 - G (x > 0), G(-x) - 1 (x < 0); erfc = G (x > 0), 2 - G(-x) (x < 0)
    sign_pos, sign_neg = (-1.0, 1.0) if kind == "erf" else (1.0, -1.0)
    return X.where(pos, sign_pos * G_pos, X.where(neg, sign_neg * G_pos, own))


def _second_from_pairs(X, first_fn, p, q, r):
    """``(g[p, q] - g[q, r]) / (p - r)`` with the pair of the widest separation as the denominator."""
    dpr, dpq, dqr = p - r, p - q, q - r
    a_pr, a_pq, a_qr = X.abs(dpr), X.abs(dpq), X.abs(dqr)
    g_pq, g_qr, g_pr = first_fn(p, q), first_fn(q, r), first_fn(p, r)
    by_pr = (g_pq - g_qr) / _safe(X, dpr)
    by_qr = (g_pq - g_pr) / _safe(X, dqr)  # g[p,q,r] = (g[q,p] - g[p,r])/(q - r)
    by_pq = (g_pr - g_qr) / _safe(X, dpq)  # = (g[p,r] - g[r,q])/(p - q)
    best = X.where((a_pr >= a_pq) & (a_pr >= a_qr), by_pr, X.where(a_qr >= a_pq, by_qr, by_pq))
    return X.where((a_pr == 0) & (a_pq == 0), 0.0, best)


def _piecewise_linear_second(X, first_fn, kind, p, q, r, param):
    same_piece = _same_piece(X, kind, p, q, param) & _same_piece(X, kind, q, r, param)
    return X.where(same_piece, 0.0, _second_from_pairs(X, first_fn, p, q, r))


def _same_piece(X, kind, p, q, param):
    if kind == "abs":
        return ((p >= 0) & (q >= 0)) | ((p <= 0) & (q <= 0))
    return value(X, kind, p, param) == value(X, kind, q, param)


def second_generic(X, first_fn, p, q, r, D: Derivatives, degree: float | None = None):
    """``(g[mid, hi] - g[lo, mid]) / (hi - lo)`` or the series about the mean, by estimated error.

    With ``degree``, ``g`` is homogeneous of that degree up to an added constant or logarithm
    (``u^c``: ``c``; ``log``: 0): the series is evaluated at the arguments divided by a power of two
    near their mean and scaled back by ``s^(degree - 2)`` (no overflow of the derivatives at
    extreme magnitudes)."""
    eps = X.eps(p)
    lo, mid, hi = _sorted3(X, p, q, r)
    A, B = first_fn(lo, mid), first_fn(mid, hi)
    spread = hi - lo
    F = (B - A) / _safe(X, spread)
    # the rounding of A and B, and of their arguments inside them (|m| |dA/dm| ~ |m| |F|)
    m = (lo + mid + hi) / 3.0
    with X.errstate():
        E_F = 4.0 * _quotient_error(X, A, B, spread, eps) + 16.0 * eps * X.abs(m) * X.abs(F) / X.abs(spread)
    E_F = X.where(X.isnan(E_F) | (spread == 0), math.inf, E_F)
    if degree is not None:
        e = X.exponent(m)  # m = f 2^e, f in [0.5, 1): scale by 2^-e, exactly
        m_s, y = X.ldexp(m, -e), [X.ldexp(v - m, -e) for v in (lo, mid, hi)]
    else:
        m_s, y = m, [lo - m, mid - m, hi - m]
    m_err = 0.0
    series = _Series(X)
    H = [1.0, 1.0, 1.0]  # complete homogeneous polynomials h_k of (y0), (y0, y1), (y0, y1, y2)
    for k in range(SECOND_TERMS):
        if k > 0:
            H[0] = H[0] * y[0]
            H[1] = H[0] + y[1] * H[1]
            H[2] = H[1] + y[2] * H[2]
        g_k = D(k + 2, m_s)
        if g_k is None:
            break
        if k == 1:  # the rounding of the mean: 4 eps |m| |f^(3)(m)| / 3!
            m_err = X.where(X.isfinite(g_k), 4.0 * eps * X.abs(m_s) * X.abs(g_k) / 6.0, 0.0)
        series.add(g_k * H[2] / math.factorial(k + 2))
    if D(2, m_s) is None:
        return F
    S, E_S = series.S, series.error(eps) + m_err
    E_S = X.where(spread == 0, 0.0, E_S)
    if degree is not None:
        expo = (degree - 2.0) * e.to(m.dtype) if hasattr(e, "to") else (degree - 2.0) * e
        scale = X.exp2(expo)
        with X.errstate():
            direct = S * scale
            logform = X.sign(S) * X.exp2(expo + X.log2(X.abs(S)))
        S = X.where(X.isfinite(direct) & ((direct != 0) | (S == 0)), direct, logform)
        E_S = E_S * scale
    out = X.where(E_S < E_F, S, F)
    if degree is None:  # g''/2 itself at equal arguments
        out = X.where(spread == 0, 0.5 * D(2, m_s), out)
    D.record(_relative(X, X.minimum(E_S, E_F), out), p, q, r)
    return out


# ====================================================================================== domains
def domain(X, kind, u, param, order: int):
    """``(allowed, description, closed_ends)``: where ``g`` (order 0) or its derivatives up to
    ``order`` exist, a text for messages, and the boundary points that belong to that domain (for
    snapping rounding errors onto them; an end of the values' domain that is not one of the
    derivatives' is where only rounding decides the derivative)."""
    if kind in ("log", "loggamma"):
        return u > 0, "> 0", ()
    if kind == "xlogx":
        return (u >= 0, ">= 0", (0.0,)) if order == 0 else (u > 0, "> 0", ())
    if kind == "log1p":
        return u > -1, "> -1", ()
    if kind in ("asin", "acos"):
        if order == 0:
            return X.abs(u) <= 1, "in [-1, 1]", (-1.0, 1.0)
        return X.abs(u) < 1, "in (-1, 1)", ()
    if kind == "atanh":
        return X.abs(u) < 1, "in (-1, 1)", ()
    if kind == "acosh":
        return (u >= 1, ">= 1", (1.0,)) if order == 0 else (u > 1, "> 1", ())
    if kind in ("gamma", "polygamma"):
        return (u > 0) | (u != X.floor(u)), "not 0 or a negative integer", ()
    if kind in ("abs", "sign", "heaviside") and order > 0:
        return u != 0, "!= 0 (not differentiable at 0)", ()
    if kind in ("floor", "ceiling") and order > 0:
        return u != X.floor(u), "not an integer (not differentiable there)", ()
    return None, "", ()


def pow_domain(X, u, c: float, order: int):
    if c == round(c):
        if c < 0:
            return u != 0, "!= 0", ()
        return None, "", ()
    if order == 0:
        return (u >= 0, ">= 0", (0.0,)) if c > 0 else (u > 0, "> 0", ())
    if c > order:  # the derivatives up to this order are finite (zero) at 0
        return u >= 0, ">= 0", (0.0,)
    return u > 0, "> 0", ()

"""Divided differences of a scalar function, in forms that do not cancel.

The Daleckii–Krein matrix of ``X = f(A)`` has the entries ``L_ij = (f(a) - f(b)) / (a - b)``
(``a = d_i``, ``b = d_j``) and ``L_ii = f'(d_i)``.  Evaluated as written, the quotient loses all its
digits when ``a`` and ``b`` are close.  :func:`stable_divided_difference` derives, with SymPy, a form
that keeps its accuracy for every gap, down to exactly equal values:

* **exact** -- for rational ``f`` the quotient cancels to a polynomial or rational function of
  ``a, b`` (``x^3``: ``a^2 + ab + b^2``; ``1/x``: ``-1/(ab)``), exact everywhere;
* **identities** that turn the difference into a product (``c exp(k x)``:
  ``c k exp(k m) sinh(k h)/(k h)`` with ``m = (a+b)/2``, ``h = (a-b)/2``; ``log x``:
  ``log1p(r)/(a - b)`` with ``r = (a - b)/b``; ``sqrt x``: ``1/(sqrt a + sqrt b)``; ``x^p``:
  ``b^(p-1) expm1(p log1p(r))/r``), whose only singular point is the removable one, ``a = b``;
* otherwise the **midpoint Taylor series** ``Σ_k f^(2k+1)(m) h^(2k) / (2k+1)!`` (terms from SymPy)
  where ``|h|`` is small, and the quotient elsewhere.

Each form comes with the value at the removable point (``f'(m)``) and the quantity whose vanishing
selects it; generated code evaluates the general form with that quantity replaced by 1 where it
vanishes (so no ``0/0`` is formed, also in derivatives of the form) and selects the limit there.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy as sp
from sympy.codegen.cfunctions import expm1, log1p

__all__ = ["A", "B", "C", "M", "S", "Y0", "Y1", "Y2", "StableDividedDifference", "StableSecondDifference", "domain",
           "regular_at_zero", "stable_divided_difference", "stable_second_divided_difference"]

#: the two arguments and the "small" quantity of the forms
A, B, S = sp.symbols("a b s", real=True)
#: terms of the midpoint series (odd derivatives f', f''', ..., f^(2K+1))
SERIES_TERMS = 6
#: the series is used for |h| <= SERIES_RADIUS * (1 + |m|); its truncation error there is far below
#: float64 rounding for functions analytic in a disc of radius ~ (1 + |m|) around m
SERIES_RADIUS = 0.05


@dataclass(frozen=True)
class StableDividedDifference:
    """How to evaluate ``f[a, b]``.

    Attributes:
        kind: ``exact``, ``identity`` or ``series``.
        general: the expression used away from the removable point, in ``a``, ``b`` and ``s``
            (the small quantity, replaced by a safe value where it vanishes); for ``exact`` the
            expression everywhere.
        small: the small quantity in ``a``, ``b`` (``None`` for ``exact``).
        limit: the value where ``small`` vanishes (``f'`` at ``a``), in ``a``, ``b``.
        near: for ``series``, the series in ``a``, ``b`` used where ``|small| <= radius``.
        radius: for ``series``, the switch, an expression in ``a``, ``b``.
    """

    kind: str
    general: sp.Expr
    small: sp.Expr | None = None
    limit: sp.Expr | None = None
    near: sp.Expr | None = None
    radius: sp.Expr | None = None


def derivatives(f: sp.Expr, x: sp.Symbol, count: int) -> list[sp.Expr]:
    """``[f, f', ..., f^(count)]``, each rational one cancelled (the derivatives of ``atan`` swell
    without it: ``f^(11)`` takes minutes as SymPy first writes it)."""
    out = [sp.sympify(f)]
    for _ in range(count):
        g = sp.diff(out[-1], x)
        out.append(sp.cancel(g) if g.is_rational_function(x) else g)
    return out


def stable_divided_difference(f: sp.Expr, x: sp.Symbol) -> StableDividedDifference:
    """The stable form of ``(f(a) - f(b)) / (a - b)`` for ``f`` an expression in ``x``."""
    f = sp.sympify(f)
    fa, fb = f.xreplace({x: A}), f.xreplace({x: B})
    quotient = sp.cancel((fa - fb) / (A - B))
    num, den = sp.fraction(sp.together(quotient))
    if num.is_polynomial(A, B) and den.is_polynomial(A, B) and sp.simplify(den.xreplace({B: A})) != 0:
        return StableDividedDifference("exact", quotient)  # the factor a - b cancelled: no cancellation left
    df = sp.diff(f, x)
    limit = df.xreplace({x: A})
    m, h = (A + B) / 2, (A - B) / 2
    c, k, e = sp.Wild("c", exclude=[x]), sp.Wild("k", exclude=[x]), sp.Wild("e", exclude=[x])
    match = f.match(c * sp.exp(k * x) + e)
    if match and match[c] != 0 and match[k] != 0:
        ck = match[c] * match[k]
        z = match[k] * S
        return StableDividedDifference("identity", ck * sp.exp(match[k] * m) * sp.sinh(z) / z, small=h, limit=limit)
    match = f.match(c * sp.log(x) + e)
    if match and match[c] != 0:
        # log a - log b = log1p((a - b)/b); s = a - b
        return StableDividedDifference("identity", match[c] * log1p(S / B) / S, small=A - B, limit=limit)
    match = f.match(c * sp.sqrt(x) + e)
    if match and match[c] != 0:
        return StableDividedDifference("exact", match[c] / (sp.sqrt(A) + sp.sqrt(B)))
    p = sp.Wild("p", exclude=[x])
    match = f.match(c * x ** p + e)
    if match and match[c] != 0 and match[p] not in (0, 1):
        # a^p - b^p = b^p expm1(p log1p(r)), a - b = b r, r = (a - b)/b
        pp = match[p]
        return StableDividedDifference("identity", match[c] * B ** (pp - 1) * expm1(pp * log1p(S / B)) / (S / B),
                                       small=A - B, limit=limit)
    # the midpoint series: f[m + h, m - h] = sum_k f^(2k+1)(m) h^(2k) / (2k+1)!
    ders = derivatives(f, x, 2 * SERIES_TERMS)
    terms = [ders[2 * j + 1].xreplace({x: m}) * h ** (2 * j) / sp.factorial(2 * j + 1) for j in range(SERIES_TERMS)]
    return StableDividedDifference("series", (fa - fb) / S, small=A - B, limit=limit, near=sp.Add(*terms),
                                   radius=SERIES_RADIUS * (1 + sp.Abs(m)))


def domain(f: sp.Expr, x: sp.Symbol, options=()) -> tuple[sp.Set, sp.Set]:
    """(where ``f`` is defined and continuous, where ``f'`` is) on the reals, by SymPy; option
    symbols (``p`` of ``x^p``) are taken as a generic non-integer value."""
    from sympy.calculus.util import continuous_domain

    generic = {sym: sp.Rational(1, 3) for _, sym in options}
    g = sp.sympify(f).xreplace(generic)
    y = sp.Symbol("y", real=True)
    g = g.xreplace({x: y})
    where = continuous_domain(g, y, sp.S.Reals)
    return where, sp.Intersection(where, continuous_domain(sp.diff(g, y), y, sp.S.Reals))


# ------------------------------------------------------------------ second divided differences
#: the three arguments of f[a, b, c], their mean and deviations (names in generated code)
C = sp.Symbol("c", real=True)
M, Y0, Y1, Y2 = sp.symbols("m y0 y1 y2", real=True)
#: terms of the series of f[a, b, c] about the mean (f'', ..., f^(2 + SECOND_TERMS - 1))
SECOND_TERMS = 5
#: the series is used for a spread max - min <= SECOND_RADIUS * (|m| + 1) (|m| alone where f is
#: singular at 0: log, sqrt, non-integer powers); the quotient elsewhere loses about
#: eps |f[a, b]| / (spread |f[a, b, c]|), ~ 1e-13 relative at the switch
SECOND_RADIUS = 1e-3


@dataclass(frozen=True)
class StableSecondDifference:
    """How to evaluate ``f[a, b, c]`` (second divided difference, symmetric in its arguments).

    ``exact``: ``expr`` in ``a, b, c``, exact everywhere.  ``split``: with ``lo <= mid <= hi`` the
    sorted arguments, ``(f[hi, mid] - f[mid, lo]) / (hi - lo)`` (first divided differences in their
    stable form) where ``hi - lo > radius``, else ``near``, the series about the mean ``m`` in the
    deviations ``y0, y1, y2``: ``Σ_k f^(k+2)(m) h_k(y) / (k+2)!`` (``h_k`` the complete
    homogeneous symmetric polynomials); ``radius`` is an expression in ``m``."""

    kind: str
    expr: sp.Expr | None = None
    near: sp.Expr | None = None
    radius: sp.Expr | None = None


def _complete_homogeneous(k: int, ys) -> sp.Expr:
    from itertools import combinations_with_replacement

    return sp.Add(*[sp.Mul(*c) for c in combinations_with_replacement(ys, k)]) if k else sp.Integer(1)


def regular_at_zero(f: sp.Expr, x: sp.Symbol, order: int = SECOND_TERMS + 2) -> bool:
    """``f`` and its first ``order`` derivatives are finite at 0 (SymPy decides; unknown: no)."""
    for g in derivatives(f, x, order):
        v = sp.simplify(g.xreplace({x: 0}))
        if v.has(sp.zoo, sp.oo, -sp.oo, sp.nan) or not v.is_finite:
            return False
    return True


def stable_second_divided_difference(f: sp.Expr, x: sp.Symbol) -> StableSecondDifference:
    """The stable form of ``f[a, b, c]`` for ``f`` an expression in ``x``."""
    f = sp.sympify(f)
    first = sp.cancel((f.xreplace({x: A}) - f.xreplace({x: B})) / (A - B))
    second = sp.cancel((first - first.xreplace({A: B, B: C})) / (A - C))
    num, den = sp.fraction(sp.together(second))
    if (num.is_polynomial(A, B, C) and den.is_polynomial(A, B, C)
            and sp.simplify(den.xreplace({B: A, C: A})) != 0):
        return StableSecondDifference("exact", expr=second)
    c, e = sp.Wild("c", exclude=[x]), sp.Wild("e", exclude=[x])
    match = f.match(c * sp.sqrt(x) + e)
    if match and match[c] != 0:
        # f[a, b] = c / (√a + √b): f[a, b, c] = -c / ((√a + √b)(√b + √c)(√c + √a))
        ra, rb, rc = sp.sqrt(A), sp.sqrt(B), sp.sqrt(C)
        return StableSecondDifference("exact", expr=-match[c] / ((ra + rb) * (rb + rc) * (rc + ra)))
    ders = derivatives(f, x, SECOND_TERMS + 1)
    terms = [ders[k + 2].xreplace({x: M}) / sp.factorial(k + 2) * _complete_homogeneous(k, (Y0, Y1, Y2))
             for k in range(SECOND_TERMS)]
    scale = sp.Abs(M) + (1 if regular_at_zero(f, x) else 0)
    return StableSecondDifference("split", near=sp.Add(*terms), radius=SECOND_RADIUS * scale)

"""High-precision reference divided differences, to check ``f[a, b]`` and ``f[a, b, c]`` of any
SymPy scalar function (``adjointgen.runtime.divided`` against mpmath).

* :func:`reference` -- ``f[x_0, ..., x_k]`` at points given as floats, in ``dps`` decimal digits
  (confluent points from SymPy's derivatives of ``f``);
* :func:`condition` -- the relative condition number of that divided difference in its arguments,
  ``Σ_i |x_i ∂_i F| / |F|`` with ``∂_i F = f[x_0, ..., x_i, x_i, ..., x_k]``: no method working in
  floating point can be more accurate than ``eps`` times it (``cos[p, q]`` at ``p, q ~ 1e5`` loses
  ``1e5`` ulps to the rounding of ``p`` and ``q`` alone);
* :func:`relative_error` -- of a float result against :func:`reference`, and :func:`allowed_error`,
  the error a result may have: ``max(rtol, ulps * eps * condition)``.

Needs mpmath (a SymPy dependency).
"""
from __future__ import annotations

import functools
import math

import mpmath as mp
import sympy as sp

__all__ = ["allowed_error", "condition", "reference", "relative_error"]

#: decimal digits of the references (points 1 ulp apart at 1e300 need ~330 for a third difference)
DPS = 340
_X = sp.Symbol("x", real=True)


def _mp_modules():
    def heaviside(u, h0=0.5):
        return mp.mpf(1) if u > 0 else (mp.mpf(0) if u < 0 else mp.mpf(h0))

    return [{"Heaviside": heaviside, "sinc": lambda u: mp.sin(u) / u if u != 0 else mp.mpf(1), "sign": mp.sign,
             "loggamma": mp.loggamma, "besselj": mp.besselj, "Max": max, "Min": min, "Abs": abs, "floor": mp.floor,
             "ceiling": mp.ceil, "log1p": mp.log1p, "expm1": mp.expm1,
             "DiracDelta": lambda u, k=0: mp.mpf(0) if u != 0 else mp.inf}, "mpmath"]


class _Function:
    """``f`` and its first derivatives, evaluated in mpmath; complex values raise ``ValueError``."""

    def __init__(self, f):
        expr = sp.sympify(f)
        free = sorted(expr.free_symbols, key=str)
        if len(free) > 1:
            raise ValueError(f"f = {expr} must be in one symbol")
        if free:
            expr = expr.xreplace({free[0]: _X})
        self.expr = expr
        self._derivs = [expr]

    @functools.lru_cache(maxsize=None)
    def _lambda(self, k: int):
        while len(self._derivs) <= k:
            self._derivs.append(sp.diff(self._derivs[-1], _X))
        return sp.lambdify(_X, self._derivs[k], _mp_modules())

    def __call__(self, t, k: int = 0):
        v = self._lambda(k)(mp.mpf(t))
        if isinstance(v, mp.mpc):
            if abs(v.imag) > mp.mpf(10) ** (-DPS // 2) * max(1, abs(v.real)):
                raise ValueError(f"f = {self.expr} is complex at {t}")
            v = v.real
        return mp.mpf(v)


def _dd(F: _Function, pts):
    pts = sorted(pts)
    if len(pts) == 1:
        return F(pts[0])
    if pts[0] == pts[-1]:
        k = len(pts) - 1
        return F(pts[0], k) / mp.factorial(k)
    return (_dd(F, pts[1:]) - _dd(F, pts[:-1])) / (pts[-1] - pts[0])


def reference(f, points, dps: int = DPS):
    """``f[x_0, ..., x_k]`` (an ``mpmath.mpf``) at the float points ``points``, exactly rounded to
    ``dps`` digits for ``f`` analytic there."""
    F = f if isinstance(f, _Function) else _Function(f)
    with mp.workdps(dps):
        return _dd(F, [mp.mpf(float(p)) for p in points])


def condition(f, points, dps: int = DPS):
    """``Σ_i |x_i f[.., x_i, x_i, ..]| / |f[x_0, ..., x_k]|`` (``inf`` where the difference is 0)."""
    F = f if isinstance(f, _Function) else _Function(f)
    with mp.workdps(dps):
        pts = [mp.mpf(float(p)) for p in points]
        base = _dd(F, pts)
        if base == 0:
            return math.inf
        total = sum(abs(p * _dd(F, pts + [p])) for p in pts)
        return float(total / abs(base))


def relative_error(got: float, want) -> float:
    """``|got - want| / |want|`` in floating point (``inf`` for a non-finite ``got``)."""
    if not math.isfinite(got):
        return math.inf
    if want == 0:
        return 0.0 if got == 0 else math.inf
    return float(abs(mp.mpf(got) - want) / abs(want))


def allowed_error(f, points, *, rtol: float = 1e-12, ulps: float = 64.0, eps: float = 2.0 ** -52) -> float:
    """``max(rtol, ulps * eps * condition(f, points))``."""
    return max(rtol, ulps * eps * condition(f, points))

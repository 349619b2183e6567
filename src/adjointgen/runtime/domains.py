"""Domains of scalar functions applied to spectra (``logm``, ``sqrtm``): checks that name the
offending eigenvalue, shared by the torch and the NumPy/CuPy matrix functions.

Intervals are ``((lo, hi, lo_open, hi_open), ...)``.  An eigenvalue a rounding error outside a
closed end (``-1e-17`` for ``sqrt`` of a singular positive semidefinite matrix: within
``8 n eps max|w|``) is moved onto it; any other outside value raises :class:`ValueError`.
"""
from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["REALS", "check_domain", "check_smooth", "describe", "intervals_for"]

REALS = ((-math.inf, math.inf, True, True),)


def describe(intervals) -> str:
    def one(lo, hi, lo_open, hi_open):
        return f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}".replace("inf", "oo")

    return " ∪ ".join(one(*i) for i in intervals) or "∅"


_ADVICE = {"logm": " (logm needs a positive definite A)", "sqrtm": " (sqrtm needs a positive semidefinite A)"}


def _first_outside(w, inside) -> str:
    index = tuple(int(i) for i in np.argwhere(~inside)[0])
    where = f" (index {index[-1]}" + (f" of batch element {index[:-1]}" if len(index) > 1 else "") + ")"
    return f"{float(w[index]):.6g}{where}"


def check_domain(name: str, expr: str, w: np.ndarray, intervals) -> np.ndarray | None:
    """``None`` if every eigenvalue is inside; the snapped eigenvalues if some lay a rounding
    error outside a closed end; raises :class:`ValueError` otherwise."""
    if w.size == 0 or intervals == REALS:
        return None
    if not np.isfinite(w).all():
        raise ValueError(f"{name}: the eigenvalues of A are not finite")
    tol = 8 * w.shape[-1] * np.finfo(w.dtype).eps * np.abs(w).max(axis=-1, keepdims=True)
    inside = np.zeros(w.shape, dtype=bool)
    snapped = w.copy()
    for lo, hi, lo_open, hi_open in intervals:
        part = ((w > lo) if lo_open else (w >= lo - tol)) & ((w < hi) if hi_open else (w <= hi + tol))
        inside |= part
        if not lo_open and math.isfinite(lo):
            snapped = np.where(part & (w < lo), lo, snapped)
        if not hi_open and math.isfinite(hi):
            snapped = np.where(part & (w > hi), hi, snapped)
    if not inside.all():
        raise ValueError(f"{name}: A has the eigenvalue {_first_outside(w, inside)}, outside the domain "
                         f"{describe(intervals)} of {expr}{_ADVICE.get(name, '')}")
    return None if np.array_equal(snapped, w) else snapped.astype(w.dtype)


def check_smooth(name: str, expr: str, w: np.ndarray, intervals) -> None:
    """A :class:`ValueError` if ``f'`` is not finite at an eigenvalue (``sqrt`` at 0), or at one
    within rounding (``8 n eps max|w|``) of such a point: a zero eigenvalue of a singular matrix
    comes out as ``±1e-17``, where ``f'`` is finite but only rounding decides its size."""
    if w.size == 0 or intervals == REALS:
        return
    tol = 8 * w.shape[-1] * np.finfo(w.dtype).eps * np.abs(w).max(axis=-1, keepdims=True)
    inside = np.zeros(w.shape, dtype=bool)
    for lo, hi, lo_open, hi_open in intervals:
        inside |= ((w > lo + tol) if lo_open else (w >= lo)) & ((w < hi - tol) if hi_open else (w <= hi))
    if not inside.all():
        raise ValueError(f"{name}: the derivative of {expr} is not finite at the eigenvalue {_first_outside(w, inside)} "
                         f"of A (to rounding), so {name}(A) has no derivative there (the derivative is finite on "
                         f"{describe(intervals)})")


def parse(sympy_expr, opts=()):
    """``(expression text, variable name, option names)`` -> (expression with the option values
    substituted, variable symbol)."""
    import sympy as sp

    text, var, names = sympy_expr
    symbols = {n: sp.Symbol(n, real=True) for n in (var, *names)}
    expr = sp.sympify(text, locals=symbols)
    expr = expr.xreplace({symbols[n]: sp.nsimplify(o) for n, o in zip(names, opts)})
    return expr, symbols[var]


@functools.lru_cache(maxsize=256)
def intervals_for(sympy_expr, opts=()):
    """(domain of ``f``, domain of ``f'``) of ``sympy_expr`` at these option values (SymPy)."""
    from ..codegen.divided import domain
    from ..codegen.lower import _intervals

    where, smooth = domain(*parse(sympy_expr, tuple(opts)))
    return _intervals(where), _intervals(smooth)

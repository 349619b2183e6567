"""Evaluate matrix expressions on concrete values: NumPy arrays (numeric audit) or explicit SymPy
matrices of a small size (symbolic audit).  One interpreter, two arithmetic back ends."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import sympy as sp
from sympy.matrices.expressions import (
    HadamardProduct,
    Identity,
    Inverse,
    MatAdd,
    MatMul,
    MatrixSymbol,
    Transpose,
    ZeroMatrix,
)

from .nodes import DI, DJ, DiagPart, PairwiseMatrix, Skew, Sym


class _Numpy:
    @staticmethod
    def eye(n):
        return np.eye(n)

    @staticmethod
    def zeros(r, c):
        return np.zeros((r, c))

    @staticmethod
    def matmul(a, b):
        return a @ b

    @staticmethod
    def T(a):
        return a.T

    @staticmethod
    def inv(a):
        return np.linalg.inv(a)

    @staticmethod
    def had(a, b):
        return a * b

    @staticmethod
    def diag(a):
        return np.diag(np.diag(a))

    @staticmethod
    def diagonal(a):
        return np.diag(a).copy()

    @staticmethod
    def pairwise(definition, d):
        f = _lambdified(definition.expr)
        di, dj = d[:, None], d[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.asarray(f(di, dj), dtype=float) * np.ones((d.size, d.size))
        np.fill_diagonal(out, float(definition.diagonal_value))
        return out


class _Sympy:
    @staticmethod
    def eye(n):
        return sp.eye(n)

    @staticmethod
    def zeros(r, c):
        return sp.zeros(r, c)

    @staticmethod
    def matmul(a, b):
        return a * b

    @staticmethod
    def T(a):
        return a.T

    @staticmethod
    def inv(a):
        return a.inv()

    @staticmethod
    def had(a, b):
        return a.multiply_elementwise(b)

    @staticmethod
    def diag(a):
        return sp.diag(*[a[i, i] for i in range(a.rows)])

    @staticmethod
    def diagonal(a):
        return [a[i, i] for i in range(a.rows)]

    @staticmethod
    def pairwise(definition, d):
        n = len(d)
        return sp.Matrix(
            n,
            n,
            lambda i, j: definition.diagonal_value
            if i == j
            else definition.expr.xreplace({DI: d[i], DJ: d[j]}),
        )


@lru_cache(maxsize=None)
def _lambdified(expr):
    return sp.lambdify((DI, DJ), expr, "numpy")


def evaluate(expr, env: dict, dims: dict, arith=_Numpy):
    """Value of ``expr`` with matrix symbols taken from ``env`` (by name) and dimension symbols
    from ``dims``.  Pairwise matrices take the diagonal of their ``diagonal_of`` matrix."""

    def size(x):
        return int(sp.sympify(x).xreplace(dims))

    def ev(e):
        if isinstance(e, PairwiseMatrix):
            d = e.definition
            return arith.pairwise(d, arith.diagonal(env[d.diagonal_of]))
        if isinstance(e, MatrixSymbol):
            if e.name not in env:
                raise KeyError(f"no value for symbol {e.name}")
            return env[e.name]
        if isinstance(e, Identity):
            return arith.eye(size(e.shape[0]))
        if isinstance(e, ZeroMatrix):
            return arith.zeros(size(e.shape[0]), size(e.shape[1]))
        if isinstance(e, MatAdd):
            vals = [ev(a) for a in e.args]
            out = vals[0]
            for v in vals[1:]:
                out = out + v
            return out
        if isinstance(e, MatMul):
            c, mats = e.as_coeff_matrices()
            out = ev(mats[0])
            for m in mats[1:]:
                out = arith.matmul(out, ev(m))
            return out * (float(c) if arith is _Numpy else c)
        if isinstance(e, Transpose):
            return arith.T(ev(e.arg))
        if isinstance(e, Inverse) or (isinstance(e, sp.MatPow) and e.args[1] == -1):
            return arith.inv(ev(e.args[0]))
        if isinstance(e, HadamardProduct):
            vals = [ev(a) for a in e.args]
            out = vals[0]
            for v in vals[1:]:
                out = arith.had(out, v)
            return out
        if isinstance(e, DiagPart):
            return arith.diag(ev(e.arg))
        if isinstance(e, Sym):
            x = ev(e.arg)
            return (x + arith.T(x)) / 2
        if isinstance(e, Skew):
            x = ev(e.arg)
            return (x - arith.T(x)) / 2
        raise TypeError(f"cannot evaluate {type(e).__name__}")

    return ev(expr)


NUMPY = _Numpy
SYMPY = _Sympy

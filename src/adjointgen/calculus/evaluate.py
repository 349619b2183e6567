"""Evaluate matrix expressions on concrete values: NumPy arrays (numeric audit) or explicit SymPy
matrices of a small size (symbolic audit).  One interpreter, two arithmetic back ends.

``Transpose`` evaluates to the conjugate transpose, which is the transpose of real values: one
interpreter serves real and complex derivations."""
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

from .nodes import DI, DJ, EngineNode, PairwiseMatrix


class SingularSylvester(ValueError):
    """A Sylvester equation ``A X + X B = C`` whose coefficients share an eigenvalue with opposite
    signs (``λ + μ = 0``): no unique solution."""


def _show(z) -> str:
    z = complex(z)
    return f"{z.real:+.6g}" if abs(z.imag) <= 1e-12 * max(abs(z.real), 1) else f"{z.real:+.6g}{z.imag:+.6g}i"


class NotExplicit(Exception):
    """The expression holds an implicit node (a solve) that has no explicit symbolic value."""


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
        return a.conj().T  # ``^T`` is the adjoint: the transpose of real data

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
    def diag_function(fn, d):
        return np.diag(np.asarray(sp.lambdify(fn.variables, fn.expr, "numpy")(d), dtype=float) * np.ones(d.size))

    @staticmethod
    def trace(a):
        return np.trace(a).reshape(1, 1)

    @staticmethod
    def logabsdet(a):
        return np.array([[np.linalg.slogdet(a)[1]]])

    @staticmethod
    def det(a):
        return np.array([[np.linalg.det(a)]])

    @staticmethod
    def adjugate(a):
        return np.linalg.det(a) * np.linalg.inv(a)  # the audit's instances are invertible

    @staticmethod
    def expm(a):
        import scipy.linalg

        return scipy.linalg.expm(a)

    @staticmethod
    def expm_frechet(a, e):
        import scipy.linalg

        return scipy.linalg.expm_frechet(a, e, compute_expm=False)

    @staticmethod
    def expm_frechet_solve(x, c):
        """``Y`` with ``L_exp[x](Y) = c``: the dense ``n^2 × n^2`` system of the operator (small
        audit instances), independent of the runtime's block-logarithm solver."""
        import scipy.linalg

        n = x.shape[0]
        columns = []
        for k in range(n * n):
            e = np.zeros(n * n, dtype=complex)
            e[k] = 1
            columns.append(scipy.linalg.expm_frechet(x, e.reshape(n, n), compute_expm=False).reshape(-1))
        y = np.linalg.solve(np.stack(columns, 1), c.reshape(-1).astype(complex)).reshape(n, n)
        return y.real if np.isrealobj(x) and np.isrealobj(c) else y

    @staticmethod
    def signdet(a):
        return np.array([[np.linalg.slogdet(a)[0]]])

    @staticmethod
    def scalar(g, n):
        return g[0, 0] * np.eye(n)

    @staticmethod
    def lower_half(a):
        return np.tril(a, -1) + 0.5 * np.diag(np.diag(a))

    @staticmethod
    def strictly_lower(a):
        return np.tril(a, -1)

    @staticmethod
    def shifted_solve(X, A, B, U, d):
        """Column i: the bordered system [[A - d_i B, B U], [(B U)^T, 0]] [w; l] = [x_i; 0]."""
        n, k = U.shape
        BU = B @ U
        out = np.empty_like(X)
        for i in range(X.shape[1]):
            M = np.block([[A - d[i] * B, BU], [BU.conj().T, np.zeros((k, k))]])
            rhs = np.concatenate([X[:, i], np.zeros(k)])
            out[:, i] = np.linalg.solve(M, rhs)[:n]
        return out

    @staticmethod
    def triangular_sylvester_solve(T, C, upper):
        """The strictly lower ``X`` with ``tril₋(X T - T X) = tril₋(C)``: the map on the strictly lower
        entries as a dense matrix (column by column of the identity), solved densely -- independent
        of the triangular recursions the generated code runs."""
        n = T.shape[0]
        rows, cols = np.tril_indices(n, -1)
        complex_ = np.iscomplexobj(T) or np.iscomplexobj(C)
        M = np.empty((rows.size, rows.size), dtype=complex if complex_ else float)
        for k in range(rows.size):
            E = np.zeros((n, n), dtype=M.dtype)
            E[rows[k], cols[k]] = 1
            M[:, k] = (E @ T - T @ E)[rows, cols]
        X = np.zeros((n, n), dtype=M.dtype)
        if rows.size:
            X[rows, cols] = np.linalg.solve(M, np.asarray(C, dtype=M.dtype)[rows, cols])
        return X

    @staticmethod
    def sylvester_solve(A, B, C):
        """``X`` with ``A X + X B = C`` (Bartels-Stewart, SciPy); :class:`SingularSylvester` where an
        eigenvalue of ``A`` is (to rounding) the negative of one of ``B``: no unique solution."""
        import scipy.linalg

        lam, mu = np.linalg.eigvals(A), np.linalg.eigvals(B)
        gaps = np.abs(lam[:, None] + mu[None, :])
        scale = max(float(np.abs(lam).max(initial=0)), float(np.abs(mu).max(initial=0)), 1e-300)
        i, j = np.unravel_index(np.argmin(gaps), gaps.shape) if gaps.size else (0, 0)
        if gaps.size and gaps[i, j] <= 1e-10 * scale:
            raise SingularSylvester(
                f"singular: the eigenvalue {_show(lam[i])} of the first coefficient and {_show(mu[j])} of the second "
                "add up to 0, so A X + X B = C has no unique solution (a Sylvester solve needs no eigenvalue of A "
                "to be the negative of one of B)")
        return scipy.linalg.solve_sylvester(A, B, C)

    @staticmethod
    def clusters(d, pattern=False):
        """The cluster indicator: equal entries (relative 1e-9), or with ``pattern`` the fixed pair
        (0, 1) (checks of an identity that is linear in the indicator, on non-degenerate instances)."""
        n = d.size
        if pattern:
            K = np.zeros((n, n))
            if n > 1:
                K[0, 1] = K[1, 0] = 1
            return K
        scale = max(float(np.abs(d).max()) if n else 0.0, 1.0)
        K = (np.abs(d[:, None] - d[None, :]) <= 1e-9 * scale).astype(float)
        np.fill_diagonal(K, 0)
        return K

    @staticmethod
    def pairwise(definition, d, free=False, pattern=False, functions=None):
        if definition.is_indicator:
            return _Numpy.clusters(d, pattern)
        if functions:
            from dataclasses import replace

            env = {"__functions__": functions}
            definition = replace(definition, expr=concrete_expr(definition.expr, env),
                                 diagonal_value=concrete_expr(sp.sympify(definition.diagonal_value), env))
        f = _lambdified(definition.expr)
        if definition.conjugate_of is not None:
            d = np.conj(d)  # conj(F)_ij = expr(conj d_i, conj d_j): real coefficients
        di, dj = d[:, None], d[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.asarray(f(di, dj), dtype=complex if np.iscomplexobj(d) else float) * np.ones((d.size, d.size))
            diag = sp.sympify(definition.diagonal_value)
            np.fill_diagonal(out, _lambdified(diag)(d, d) * np.ones(d.size) if diag.free_symbols else float(diag))
        if definition.zero_on is not None:
            out[_Numpy.clusters(d, pattern) > 0] = 0
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
        return a.H  # entries are real symbols, or complex ones (conj(z) an atom) in complex derivations

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
    def diag_function(fn, d):
        return sp.diag(*[real_derivatives(fn(x).doit()) for x in d])

    @staticmethod
    def trace(a):
        return sp.Matrix([[a.trace()]])

    @staticmethod
    def det(a):
        return sp.Matrix([[a.det()]])

    @staticmethod
    def adjugate(a):
        return a.adjugate()

    @staticmethod
    def expm(a):
        raise NotExplicit("the matrix exponential of a general matrix has no explicit symbolic form here")

    @staticmethod
    def expm_frechet(a, e):
        raise NotExplicit("the Fréchet derivative of exp has no explicit symbolic form here")

    @staticmethod
    def expm_frechet_solve(x, c):
        raise NotExplicit("the inverse Fréchet map of exp has no explicit symbolic form")

    @staticmethod
    def logabsdet(a):
        # (log det A + log conj(det A)) / 2: the derivative of log|det A| wherever det A != 0, with
        # no Abs to simplify (log(det A) itself for real entries)
        det = a.det()
        if all(x.is_real for x in det.free_symbols):
            return sp.Matrix([[sp.log(det)]])
        return sp.Matrix([[(sp.log(det) + sp.log(sp.conjugate(det))) / 2]])

    @staticmethod
    def signdet(a):
        det = a.det()
        if all(x.is_real for x in det.free_symbols):
            raise NotExplicit("the sign of a real determinant is piecewise constant")
        return sp.Matrix([[sp.sqrt(det / sp.conjugate(det))]])

    @staticmethod
    def scalar(g, n):
        return g[0, 0] * sp.eye(n)

    @staticmethod
    def lower_half(a):
        return sp.Matrix(a.rows, a.cols, lambda i, j: a[i, j] if i > j else (a[i, j] / 2 if i == j else 0))

    @staticmethod
    def strictly_lower(a):
        return sp.Matrix(a.rows, a.cols, lambda i, j: a[i, j] if i > j else 0)

    @staticmethod
    def shifted_solve(X, A, B, U, d):
        raise NotExplicit("the projected shifted solve has no explicit symbolic form")

    @staticmethod
    def sylvester_solve(A, B, C):
        raise NotExplicit("the Sylvester solve has no explicit symbolic form")

    @staticmethod
    def triangular_sylvester_solve(T, C, upper):
        """The strictly lower ``X`` with ``tril₋(X T - T X) = tril₋(C)`` on explicit matrices: the
        entries solved one by one (upper ``T``: from the corner inwards, column by column; lower:
        from the diagonal outwards), each a division by ``T_jj - T_ii``; the entries not yet solved
        meet only the zeros of the triangular ``T``."""
        n = T.rows
        X = sp.zeros(n, n)
        order = [(i, j) for j in range(n) for i in range(n - 1, j, -1)] if upper else \
            [(i, j) for i in range(n) for j in range(i - 1, -1, -1)]
        for i, j in order:
            rest = sum((X[i, k] * T[k, j] for k in range(n) if k != i and k != j), sp.Integer(0)) - \
                sum((T[i, k] * X[k, j] for k in range(n) if k != i and k != j), sp.Integer(0))
            X[i, j] = sp.cancel((C[i, j] - rest) / (T[j, j] - T[i, i]))
        return X

    @staticmethod
    def pairwise(definition, d, free=False, pattern=False, functions=None):
        n = len(d)
        if definition.is_indicator:
            return sp.Matrix(n, n, lambda i, j: 0 if i == j else (
                (1 if {i, j} == {0, 1} else 0) if pattern else definition.expr.xreplace({DI: d[i], DJ: d[j]})))
        if free:
            # entries as free symbols carrying only the (anti)symmetry of the formula: enough for
            # steps that use nothing else about F, and polynomial, so cheap to simplify
            sign = -1 if definition.is_antisymmetric else (1 if definition.is_symmetric else None)
            # complex values: complex entries; conj(F) has the conjugates of F's
            base = definition.conjugate_of or definition.name
            real = not definition.complex_values
            conj = sp.conjugate if definition.conjugate_of is not None else (lambda z: z)

            def entry(i, j):
                if i == j:
                    diag = sp.sympify(definition.diagonal_value)
                    return conj(sp.Symbol(f"{base}_{i}{i}", real=real)) if diag.free_symbols else diag
                if sign is None or i < j:
                    return conj(sp.Symbol(f"{base}_{i}{j}", real=real))
                return sign * conj(sp.Symbol(f"{base}_{j}{i}", real=real))

            return sp.Matrix(n, n, entry)
        if definition.conjugate_of is not None:
            d = [sp.conjugate(x) for x in d]
        return sp.Matrix(
            n,
            n,
            lambda i, j: real_derivatives(sp.sympify(definition.diagonal_value).xreplace({DI: d[i]}).doit())
            if i == j
            else real_derivatives(definition.expr.xreplace({DI: d[i], DJ: d[j]})),
        )


@lru_cache(maxsize=None)
def _lambdified(expr):
    return sp.lambdify((DI, DJ), expr, "numpy")


def real_derivatives(expr):
    """Derivatives of an undefined real function, ``Derivative(f(x), x)``, as the undefined real
    functions ``f_1(x)`` (``f_2`` ...): SymPy does not infer that the derivative of a real function is
    real, which a symbolic check with conjugates needs."""
    def swap(e):
        (var, order), = e.variable_count
        return sp.Function(f"{e.expr.func.__name__}_{order}", real=True)(*e.expr.args)

    return expr.replace(lambda e: isinstance(e, sp.Derivative) and isinstance(e.expr, sp.core.function.AppliedUndef)
                        and len(e.variable_count) == 1, swap)


def _concrete(fn: sp.Lambda, env) -> sp.Lambda:
    """``fn`` with the derivation's undefined scalar functions replaced by the instance's concrete
    ones (``env["__functions__"]``: name -> Lambda); unchanged in a symbolic check."""
    functions = env.get("__functions__") or {}
    if not functions:
        return fn
    (x,), body = fn.variables, fn.expr
    replaced = body.replace(lambda e: isinstance(e, sp.core.function.AppliedUndef) and e.func.__name__ in functions,
                            lambda e: functions[e.func.__name__](*e.args))
    return sp.Lambda(x, replaced.doit())


def concrete_expr(expr, env):
    """A scalar expression with the instance's concrete functions substituted (and derivatives done)."""
    functions = env.get("__functions__") or {}
    if not functions:
        return expr
    return expr.replace(lambda e: isinstance(e, sp.core.function.AppliedUndef) and e.func.__name__ in functions,
                        lambda e: functions[e.func.__name__](*e.args)).doit()


def evaluate(expr, env: dict, dims: dict, arith=_Numpy):
    """Value of ``expr`` with matrix symbols taken from ``env`` (by name) and dimension symbols
    from ``dims``.  Pairwise matrices take the diagonal of their ``diagonal_of`` matrix."""

    def size(x):
        return int(sp.sympify(x).xreplace(dims))

    def ev(e):
        if isinstance(e, PairwiseMatrix):
            d = e.definition
            return arith.pairwise(d, arith.diagonal(env[d.diagonal_of]), free=env.get("__pairwise_free__", False),
                                  pattern=env.get("__cluster_pattern__", False), functions=env.get("__functions__"))
        if isinstance(e, EngineNode):  # the engine's own nodes carry their rule (calculus/nodes/)
            return e.evaluate_rule(ev, arith, size, env)
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
        if isinstance(e, sp.MatPow) and e.args[1].is_Integer and e.args[1] > 0:
            base = ev(e.args[0])
            out = base
            for _ in range(int(e.args[1]) - 1):
                out = arith.matmul(out, base)
            return out
        if isinstance(e, HadamardProduct):
            vals = [ev(a) for a in e.args]
            out = vals[0]
            for v in vals[1:]:
                out = arith.had(out, v)
            return out
        raise TypeError(f"cannot evaluate {type(e).__name__}")

    return ev(expr)


NUMPY = _Numpy
SYMPY = _Sympy

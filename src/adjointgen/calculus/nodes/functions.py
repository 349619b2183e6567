"""Matrix functions: ``DiagFunction`` (a scalar function on a diagonal), the matrix exponential
and its Fréchet derivative, and the solve of that derivative."""
from __future__ import annotations

import sympy as sp
from sympy import Basic
from sympy.matrices.expressions import MatMul, MatrixExpr, Transpose, ZeroMatrix

from .base import EngineNode, _UnaryMatrixNode
from .solves import OperatorSolve


class DiagFunction(EngineNode, MatrixExpr):
    """``f(D)``: a scalar function applied to the entries of a diagonal matrix ``D``.

    Arguments: ``(D, Lambda(x, f(x)))``; ``f`` may be an undefined SymPy function (a derivation
    generic in ``f``, such as ``X = U f(D) U^T``) or a concrete expression.  It is diagonal and real
    (``f`` real on real arguments), commutes with other diagonal factors, and its differential is
    ``f'(D) dD`` with ``f'`` from SymPy."""

    def __new__(cls, D, fn):
        if not isinstance(fn, sp.Lambda):
            raise TypeError("DiagFunction needs a sympy.Lambda")
        return Basic.__new__(cls, sp.sympify(D), fn)

    @property
    def arg(self):
        return self.args[0]

    @property
    def function(self) -> sp.Lambda:
        return self.args[1]

    @property
    def shape(self):
        return self.arg.shape

    @property
    def label(self) -> str:
        (x,), body = self.function.variables, self.function.expr
        return sp.sstr(body.xreplace({x: sp.Symbol("·")})) if not isinstance(body, sp.core.function.AppliedUndef) else body.func.__name__

    def derivative(self) -> "DiagFunction":
        (x,), body = self.function.variables, self.function.expr
        return DiagFunction(self.arg, sp.Lambda(x, sp.diff(body, x)))

    def differential_rule(self, d):
        """``d f(D) = f'(D) dD`` (diagonal: they commute)."""
        dD = d(self.arg)
        return ZeroMatrix(*self.shape) if isinstance(dD, ZeroMatrix) else MatMul(self.derivative(), dD)

    def evaluate_rule(self, ev, arith, size, env):
        from ..evaluate import _concrete

        return arith.diag_function(_concrete(self.function, env), arith.diagonal(ev(self.arg)))

    def _eval_transpose(self):
        return self

    def expand_rule(self, alg, structure):
        return [(sp.Integer(1), (DiagFunction(alg.normalize(self.arg, structure), self.function),))]

    def transpose_rule(self, alg, structure):
        return [(sp.Integer(1), (self,))]

    def _sympystr(self, printer):
        (x,), body = self.function.variables, self.function.expr
        return f"[{printer._print(body)} at {x} = {printer._print(self.arg)}]"




class MatrixExp(_UnaryMatrixNode):
    """``exp(A)`` of a general square matrix (not linear).  Its differential, the engine's rule for
    this node, is the Fréchet derivative ``d exp(A) = L_exp[A](dA)`` (:class:`ExpFrechet`);
    ``exp(A)^H = exp(A^H)``."""

    _label = "exp"

    def _eval_transpose(self):
        return MatrixExp(Transpose(self.arg))

    def differential_rule(self, d):
        """``d exp(A) = L_exp[A](dA)``."""
        dm = d(self.arg)
        return ZeroMatrix(*self.shape) if isinstance(dm, ZeroMatrix) else ExpFrechet(dm, self.arg)

    def expand_rule(self, alg, structure):
        return [(sp.Integer(1), (MatrixExp(alg.normalize(self.arg, structure)),))]

    def transpose_rule(self, alg, structure):
        """``exp(A)^H = exp(A^H)``."""
        return [(sp.Integer(1), (MatrixExp(alg.normalize(Transpose(self.arg), structure)),))]

    def adjoint_rule(self, g):
        return None  # not linear

    def evaluate_rule(self, ev, arith, size, env):
        return arith.expm(ev(self.arg))

    def lower_rule(self, b):
        return b.emit("matrix_exp", [b.lower(self.arg)], "matrix")


class ExpFrechet(OperatorSolve):
    """``L_exp[A](E)``: the Fréchet derivative of the matrix exponential at ``A`` in the direction
    ``E``, ``exp([[A, E], [0, A]]) = [[exp(A), L_exp[A](E)], [0, exp(A)]]`` (Najfeld and Havel;
    Al-Mohy and Higham).  Arguments ``(E, A)``.  A linear operator on ``E`` (the algebra treats it
    as it treats the operator solves), with the adjoint ``<G, L_exp[A](E)> = <L_exp[A^T](G), E>``,
    the transpose ``L_exp[A](E)^T = L_exp[A^T](E^T)`` and the inverse :class:`ExpFrechetSolve`
    (:meth:`Derivation.invert_operator`).  Generated code takes the corner of the exponential of
    the ``2n × 2n`` block matrix, differentiable to any order."""

    def expand_rule(self, alg, structure):
        """Distributes over sums and scalars; ``A`` in normal form."""
        A = alg.normalize(self.operator[0], structure)
        return alg.collect([(c, (ExpFrechet(alg.monomial(sp.Integer(1), fs), A),))
                            for c, fs in alg.expand(self.arg, structure)])

    def adjoint_rule(self, g):
        """``<G, L_exp[A](E)> = <L_exp[A^T](G), E>``."""
        return self.arg, ExpFrechet(g, Transpose(self.operator[0]))

    def transpose_rule(self, alg, structure):
        """``L_exp[A](E)^T = L_exp[A^T](E^T)``."""
        return [(sp.Integer(1), (ExpFrechet(alg.normalize(Transpose(self.arg), structure),
                                            alg.normalize(Transpose(self.operator[0]), structure)),))]

    def inverse_operator(self, C):
        """``L_exp[A]^-1(C)``."""
        return ExpFrechetSolve(C, self.operator[0])

    def evaluate_rule(self, ev, arith, size, env):
        return arith.expm_frechet(ev(self.operator[0]), ev(self.arg))

    def lower_rule(self, b):
        return b.emit("expm_frechet", [b.lower(self.operator[0]), b.lower(self.arg)], "matrix")

    def _sympystr(self, printer):
        return f"L_exp[{printer._print(self.operator[0])}]({printer._print(self.arg)})"


class ExpFrechetSolve(OperatorSolve):
    """``L_exp[X]^-1(C)``: the ``Y`` with ``L_exp[X](Y) = C`` -- the Fréchet derivative of the
    principal logarithm at ``exp(X)`` when ``X`` is a principal logarithm (no two eigenvalues of
    ``X`` differ by a nonzero multiple of ``2 pi i``).  Arguments ``(C, X)``.  Linear in ``C``:
    adjoint ``<G, L^-1(C)> = <L_exp[X^T]^-1(G), C>``, transpose ``L_exp[X^T]^-1(C^T)``, inverse
    :class:`ExpFrechet`.  Generated code calls a runtime solver (the corner of the principal
    logarithm of ``[[exp(X), C], [0, exp(X)]]``, SciPy on the host) whose own derivatives are
    solves of this kind again, so every order is exact."""

    def expand_rule(self, alg, structure):
        X = alg.normalize(self.operator[0], structure)
        return alg.collect([(c, (ExpFrechetSolve(alg.monomial(sp.Integer(1), fs), X),))
                            for c, fs in alg.expand(self.arg, structure)])

    def adjoint_rule(self, g):
        """``<G, L_exp[X]^-1(C)> = <L_exp[X^T]^-1(G), C>``."""
        return self.arg, ExpFrechetSolve(g, Transpose(self.operator[0]))

    def transpose_rule(self, alg, structure):
        return [(sp.Integer(1), (ExpFrechetSolve(alg.normalize(Transpose(self.arg), structure),
                                                 alg.normalize(Transpose(self.operator[0]), structure)),))]

    def inverse_operator(self, E):
        return ExpFrechet(E, self.operator[0])

    def evaluate_rule(self, ev, arith, size, env):
        return arith.expm_frechet_solve(ev(self.operator[0]), ev(self.arg))

    def lower_rule(self, b):
        return b.emit("expm_frechet_solve", [b.lower(self.operator[0]), b.lower(self.arg)], "matrix")

    def _sympystr(self, printer):
        return f"L_exp[{printer._print(self.operator[0])}]^-1({printer._print(self.arg)})"

"""Linear operators solved for their argument: Sylvester (``A X - X B = C``), its triangular
form, and the shifted solve of the partial eigensolvers."""
from __future__ import annotations

import sympy as sp
from sympy import Basic
from sympy.matrices.expressions import Identity, MatrixExpr, Transpose

from .base import EngineNode


class OperatorSolve(EngineNode, MatrixExpr):
    """``L^-1(X)`` for a linear operator ``L`` on matrices that has no explicit inverse: the solution
    of an operator equation, linear in its argument ``X``.  Arguments: ``(X, *operator)``.  Subclasses
    say what ``L`` is; the algebra treats them alike (distributed over sums and scalars, solves with
    the same operator merged into one)."""

    def __new__(cls, X, *operator):
        return Basic.__new__(cls, *(sp.sympify(a) for a in (X, *operator)))

    @property
    def arg(self):
        return self.args[0]

    @property
    def operator(self):
        return self.args[1:]

    @property
    def shape(self):
        return self.arg.shape

    def with_arg(self, X):
        return type(self)(X, *self.operator)

    def expand_rule(self, alg, structure):
        """Distributes over sums and scalars."""
        out = [(c, (self.with_arg(alg.monomial(sp.Integer(1), fs)),)) for c, fs in alg.expand(self.arg, structure)]
        return alg.collect(out)


class SylvesterSolve(OperatorSolve):
    """``Syl[A, B](C)``: the solution ``X`` of the Sylvester equation ``A X + X B = C`` (one solution
    when no eigenvalue of ``A`` is the negative of one of ``B``).  Arguments ``(C, A, B, hermitian)``,
    ``hermitian`` (a SymPy boolean) saying that ``A`` and ``B`` are symmetric (Hermitian) in the
    derivation.  Linear in ``C``, with the adjoint ``<G, Syl[A, B](C)> = <Syl[A^T, B^T](G), C>`` and
    the transpose ``Syl[A, B](C)^T = Syl[B^T, A^T](C^T)`` (``^T``: conjugate transpose in a complex
    derivation).  Generated code calls a runtime solver: for Hermitian ``A``, ``B`` in their
    eigenbases (``X = V_A ((V_A^H C V_B) / (a_i + b_j)) V_B^H``), otherwise Bartels-Stewart through
    the Schur forms; its derivatives are Sylvester solves again, so every order is exact and no
    eigenvalue gap enters."""

    def __new__(cls, C, A, B, hermitian=True):
        return Basic.__new__(cls, sp.sympify(C), sp.sympify(A), sp.sympify(B), sp.true if hermitian else sp.false)

    @property
    def hermitian(self) -> bool:
        return bool(self.args[3])

    def expand_rule(self, alg, structure):
        """Distributes over sums and scalars; ``A`` and ``B`` in normal form (``P^T`` of a symmetric
        ``P`` is ``P``), so that solves with one operator merge."""
        A, B = (alg.normalize(M, structure) for M in self.operator[:2])
        out = [(c, (SylvesterSolve(alg.monomial(sp.Integer(1), fs), A, B, self.hermitian),))
               for c, fs in alg.expand(self.arg, structure)]
        return alg.collect(out)

    def adjoint_rule(self, g):
        """``<G, Syl[A, B](C)> = <Syl[A^T, B^T](G), C>``."""
        A, B = self.operator[:2]
        return self.arg, SylvesterSolve(g, Transpose(A), Transpose(B), self.hermitian)

    def transpose_rule(self, alg, structure):
        """``Syl[A, B](C)^T = Syl[B^T, A^T](C^T)``: transposing ``A X + X B = C``."""
        A, B = self.operator[:2]
        return [(sp.Integer(1), (SylvesterSolve(alg.normalize(Transpose(self.arg), structure),
                                                alg.normalize(Transpose(B), structure),
                                                alg.normalize(Transpose(A), structure), self.hermitian),))]

    def evaluate_rule(self, ev, arith, size, env):
        A, B = self.operator[:2]
        try:
            return arith.sylvester_solve(ev(A), ev(B), ev(self.arg))
        except ValueError as exc:  # name the equation: the coefficients as the derivation wrote them
            if type(exc).__name__ != "SingularSylvester":
                raise
            raise type(exc)(f"Syl[{A}, {B}]: the Sylvester equation {A} X + X {B} = C is "
                            + str(exc).replace("the first coefficient", str(A)).replace("the second", str(B))
                            .replace("A X + X B = C has", "it has")) from None

    def lower_rule(self, b):
        A, B = self.operator[:2]
        return b.emit("sylvester_solve", [b.lower(A), b.lower(B), b.lower(self.arg)], "matrix",
                      (("hermitian", str(self.hermitian)),))

    def _sympystr(self, printer):
        A, B = self.operator[:2]
        return f"Syl[{printer._print(A)}, {printer._print(B)}]({printer._print(self.arg)})"


class TriangularSylvesterSolve(OperatorSolve):
    """``Syl₋[T](C)``: the strictly lower ``X`` with ``tril₋(X T - T X) = tril₋(C)``, for a triangular
    ``T`` (``upper``: upper triangular, else lower) with distinct diagonal entries.  Arguments
    ``(C, T, upper)``.

    The Schur decomposition ``A = Z T Z^H`` needs it: with the anti-Hermitian ``dC = Z^H dZ``, the
    strictly lower part of ``Z^H dA Z = dC T - T dC + dT`` does not see ``dT`` (upper) nor the upper
    part of ``dC``, and reads ``tril₋(L T - T L)`` with ``L = tril₋(dC)``: a triangular system
    (column by column, ``(T_jj I - T_22) l_j = c_j - L_21 t_j``, for upper ``T``).  Linear in ``C``;
    the map ``X -> tril₋(X T - T X)`` on strictly lower matrices has the adjoint
    ``Y -> tril₋(Y T^H - T^H Y)``, so ``<G, Syl₋[T](C)> = <Syl₋[T^H](G), C>``, a system of the
    same kind with the lower triangular ``T^H`` (row by row).  Generated code calls a runtime
    solver made of triangular solves, differentiable to every order; it raises where two
    diagonal entries of ``T`` (eigenvalues) are equal."""

    def __new__(cls, C, T, upper=True):
        return Basic.__new__(cls, sp.sympify(C), sp.sympify(T), sp.true if upper else sp.false)

    @property
    def upper(self) -> bool:
        return bool(self.args[2])

    def expand_rule(self, alg, structure):
        """Distributes over sums and scalars; ``T`` in normal form, so that solves with one ``T``
        merge."""
        T = alg.normalize(self.operator[0], structure)
        return alg.collect([(c, (TriangularSylvesterSolve(alg.monomial(sp.Integer(1), fs), T, self.upper),))
                            for c, fs in alg.expand(self.arg, structure)])

    def adjoint_rule(self, g):
        """``<G, Syl₋[T](C)> = <Syl₋[T^H](G), C>`` (``T^H`` is triangular on the other side)."""
        return self.arg, TriangularSylvesterSolve(g, Transpose(self.operator[0]), not self.upper)

    def evaluate_rule(self, ev, arith, size, env):
        return arith.triangular_sylvester_solve(ev(self.operator[0]), ev(self.arg), self.upper)

    def lower_rule(self, b):
        return b.emit("triangular_sylvester_solve", [b.lower(self.operator[0]), b.lower(self.arg)], "matrix",
                      (("upper", str(self.upper)),))

    def _sympystr(self, printer):
        return f"Syl₋[{printer._print(self.operator[0])}]({printer._print(self.arg)})"


class ShiftedSolve(OperatorSolve):
    """``S(X)``: column by column, the solution ``w_i`` of the projected shifted system

        ``P (A - d_i B) w_i = P x_i``,  ``U^T B w_i = 0``,  ``P = I - B U U^T``,

    where ``d_i`` are the diagonal entries of ``D``.  Arguments: ``(X, A, B, U, D)``; ``B`` is an
    ``Identity`` for the standard problem.  ``S`` is linear in ``X`` and self-adjoint under
    ``<X, Y> = tr(X^T Y)`` (``S_i = P^T K_i^+ P`` with ``K_i = P (A - d_i B) P^T`` symmetric), so the
    transposition rule is ``<G, S(X)> = <S(G), X>``; ``S(B U Y) = 0`` since ``P B U = 0``.
    Generated code calls a runtime solver (block CG/MINRES, or a bordered dense solve).
    """

    def __new__(cls, X, A, B, U, D):
        return Basic.__new__(cls, *(sp.sympify(a) for a in (X, A, B, U, D)))

    def expand_rule(self, alg, structure):
        """``S`` distributes over sums and scalars; ``S(B U Y) = 0`` because ``S`` projects its
        argument with ``P = I - B U U^T`` and ``P B U = 0``."""
        _, B, U, _ = self.operator
        annihilated = (U,) if isinstance(B, Identity) else (B, U)
        out = []
        for c, fs in alg.expand(self.arg, structure):
            if fs[: len(annihilated)] == annihilated:
                continue
            out.append((c, (self.with_arg(alg.monomial(sp.Integer(1), fs)),)))
        return alg.collect(out)

    def adjoint_rule(self, g):
        """Self-adjoint: ``<G, S(X)> = <S(G), X>``."""
        return self.arg, self.with_arg(g)

    def evaluate_rule(self, ev, arith, size, env):
        A, B, U, D = self.operator
        return arith.shifted_solve(ev(self.arg), ev(A), ev(B), ev(U), arith.diagonal(ev(D)))

    def lower_rule(self, b):
        A, B, U, D = self.operator
        b_ = "None" if isinstance(B, Identity) else b.lower(B)
        return b.emit("shifted_solve", [b.lower(A), b_, b.lower(U), b.lower(D), b.lower(self.arg)], "matrix")

    def _sympystr(self, printer):
        A, B, U, D = self.operator
        shift = "d_i" if isinstance(B, sp.Identity) else f"d_i {printer._print(B)}"
        return f"S[{printer._print(A)} - {shift}; {printer._print(U)}]({printer._print(self.arg)})"

"""Matrix-expression nodes the derivations need beyond SymPy's own.

SymPy 1.14 has ``MatrixSymbol``, ``MatMul``, ``MatAdd``, ``Transpose``, ``Inverse`` and
``HadamardProduct``.  Matrix-decomposition calculus also needs:

* ``DiagPart(X)``  -- ``I ∘ X``, the diagonal part of a square matrix;
* ``Sym(X)``, ``Skew(X)`` -- ``(X ± X^T)/2``, kept as nodes so that rewrite rules can move them;
* ``PairwiseMatrix`` -- a matrix whose entries are a scalar function of two entries of a diagonal
  matrix, ``F_ij = f(d_i, d_j)`` (eigengaps, reciprocal gaps, divided differences).  Its scalar
  formula is a SymPy expression produced by a derivation step, never typed in;
* ``Trace``, ``ScalarIdentity``, ``LogAbsDet`` -- scalar outputs (``1×1`` symbols): the trace as a
  ``1×1`` matrix, its adjoint ``g I`` (a ``1×1`` value times the identity), and ``log|det A|``;
* ``Structure`` -- what a derivation declares about a symbol (symmetric, diagonal, skew,
  orthonormal columns); rewrite rules consult it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp
from sympy import Basic
from sympy.matrices.expressions import Identity, Inverse, MatMul, MatrixExpr, MatrixSymbol, Transpose, ZeroMatrix

__all__ = [
    "DiagFunction",
    "LogAbsDet",
    "SameCluster",
    "ScalarIdentity",
    "SignDet",
    "Trace",
    "OperatorSolve",
    "ShiftedSolve",
    "SylvesterSolve",
    "TriangularSylvesterSolve",
    "DiagPart",
    "LowerHalf",
    "StrictlyLower",
    "Sym",
    "Skew",
    "PairwiseMatrix",
    "PairwiseDef",
    "Structure",
    "DI",
    "DJ",
    "EngineNode",
    "Adjugate",
    "Det",
    "ExpFrechet",
    "ExpFrechetSolve",
    "MatrixExp",
]

#: the two scalar arguments of every pairwise formula ``f(d_i, d_j)``
DI, DJ = sp.symbols("d_i d_j", real=True)


class EngineNode:
    """A node of the engine's own (SymPy's nodes, ``MatMul``, ``Transpose``, ..., are the core's):
    its rules live with its class, one section per node.

    - ``differential_rule(d)``: the node's differential, ``d`` giving a subexpression's;
    - ``evaluate_rule(ev, arith, size, env)``: its value, ``ev`` evaluating a subexpression with
      the arithmetic ``arith`` (NumPy or explicit SymPy matrices), ``size`` a dimension's value;
    - ``lower_rule(b)``: the value-DAG node it becomes (:class:`adjointgen.codegen.lower` builder
      ``b``: ``b.lower(sub)``, ``b.emit(op, args, kind)``, ``b.kind(name)``, ``b.fail(message)``);
    - ``_eval_transpose``: its transpose, SymPy's hook.

    - ``expand_rule(alg, structure)``: its normal form, a term list (:mod:`adjointgen.calculus.algebra`;
      ``alg`` is :data:`~adjointgen.calculus.algebra.ALGEBRA`: ``expand``, ``normalize``,
      ``collect``, ``monomial`` and ``linear_node``, the normal form the projections share);
    - ``transpose_rule(alg, structure)``: its (conjugate) transpose as a term list (default: the
      unexpanded ``X^T``);
    - ``adjoint_rule(g)``: for a node linear in its argument ``X``, ``(X, G')`` with
      ``<g, node(X)> = <G', X>`` -- the transposition the VJP takes (default ``None``: not linear).

    A node without a rule raises where it is used (``no differential rule for ...``)."""

    def transpose_rule(self, alg, structure):
        return [(sp.Integer(1), (Transpose(self),))]

    def adjoint_rule(self, g):
        return None


class _UnaryMatrixNode(EngineNode, MatrixExpr):
    """A matrix-valued function of one square matrix with the argument's shape."""

    def __new__(cls, arg):
        arg = sp.sympify(arg)
        return Basic.__new__(cls, arg)

    @property
    def arg(self):
        return self.args[0]

    @property
    def shape(self):
        return self.arg.shape

    def doit(self, **hints):
        arg = self.arg.doit(**hints) if hints.get("deep", True) else self.arg
        return type(self)(arg)

    def _sympystr(self, printer):
        return f"{self._label}({printer._print(self.arg)})"

    def _latex(self, printer):
        return rf"\operatorname{{{self._label}}}\left({printer._print(self.arg)}\right)"

    # ---- the node's rules (each node class below is one section: its rules live with it)
    def differential_rule(self, d):
        """A linear projection: ``d P(X) = P(dX)`` (``d``: the differential of a subexpression)."""
        return type(self)(d(self.arg))

    def expand_rule(self, alg, structure):
        """The projections' shared normal form (distributed over sums, structure applied)."""
        return alg.linear_node(type(self), alg.expand(self.arg, structure), self.shape, structure)

    def adjoint_rule(self, g):
        """``<G, P(X)> = <P(G), X>``."""
        return self.arg, type(self)(g)


class DiagPart(_UnaryMatrixNode):
    """``I ∘ X``: the diagonal part of ``X`` (off-diagonal entries zeroed)."""

    _label = "diag"

    def _eval_transpose(self):
        # ``diag(X)^T = diag(X^T)``: equal to ``diag(X)`` for real X; with ``^T`` read as the
        # conjugate transpose (complex derivations) it conjugates the diagonal
        return DiagPart(self.arg.T)

    def transpose_rule(self, alg, structure):
        """``diag(X)^H = diag(X^H)`` (complex data); itself for real data."""
        if structure.complex:
            return alg.linear_node(DiagPart, alg.expand(Transpose(self.arg), structure), self.shape, structure)
        return [(sp.Integer(1), (self,))]

    def evaluate_rule(self, ev, arith, size, env):
        return arith.diag(ev(self.arg))

    def lower_rule(self, b):
        if self.shape == (1, 1):  # of a 1×1 value: the value itself
            return b.lower(self.arg)
        if isinstance(self.arg, (Sym, Skew)):
            inner = b.lower(self.arg.arg)
            if b.kind(inner) == "diag":
                b.fail(f"diag(sym/skew) of a diagonal should have been simplified: {self}")
            return b.emit("diag_sym" if isinstance(self.arg, Sym) else "diag_skew", [inner], "diag")
        inner = b.lower(self.arg)
        return inner if b.kind(inner) == "diag" else b.emit("diagonal", [inner], "diag")


class Sym(_UnaryMatrixNode):
    """``sym(X) = (X + X^T)/2``."""

    _label = "sym"

    def _eval_transpose(self):
        return self

    def transpose_rule(self, alg, structure):
        return [(sp.Integer(1), (self,))]

    def evaluate_rule(self, ev, arith, size, env):
        x = ev(self.arg)
        return (x + arith.T(x)) / 2

    def lower_rule(self, b):
        inner = b.lower(self.arg)
        if self.shape == (1, 1):  # of a 1×1 value: its real part
            return b.emit("real_part", [inner], "scalar")
        return inner if b.kind(inner) == "diag" else b.emit("sym", [inner], "matrix")


class Skew(_UnaryMatrixNode):
    """``skew(X) = (X - X^T)/2``."""

    _label = "skew"

    def _eval_transpose(self):
        return -self

    def transpose_rule(self, alg, structure):
        return [(sp.Integer(-1), (self,))]

    def evaluate_rule(self, ev, arith, size, env):
        x = ev(self.arg)
        return (x - arith.T(x)) / 2

    def lower_rule(self, b):
        inner = b.lower(self.arg)
        if self.shape == (1, 1):  # of a 1×1 value: i times its imaginary part
            return b.emit("imaginary_part", [inner], "scalar")
        return b.emit("skew", [inner], "matrix")


class LowerHalf(_UnaryMatrixNode):
    """``Φ(X)``: the lower triangle of ``X`` with its diagonal halved.

    For a lower-triangular ``X``, ``Φ(X + X^T) = X`` (real): the projection that solves the
    differentiated Cholesky identity ``L^-1 dA L^-T = dC + dC^T`` for the lower-triangular ``dC``.
    Self-adjoint under ``<X, Y> = Re tr(X^H Y)``; the engine verifies it on explicit matrices
    wherever a rule is transposed through it."""

    _label = "Φ"

    def evaluate_rule(self, ev, arith, size, env):
        return arith.lower_half(ev(self.arg))

    def lower_rule(self, b):
        return b.emit("lower_half", [b.lower(self.arg)], "matrix")


class StrictlyLower(_UnaryMatrixNode):
    """``tril₋(X)``: the strictly lower triangle of ``X`` (diagonal and upper part zeroed).

    A real skew-symmetric ``X`` is ``tril₋(X) - tril₋(X)^T``; the projection that separates the
    skew ``Q^T dQ`` from the upper-triangular ``dR R^-1`` in the QR derivation.  Self-adjoint under
    ``<X, Y> = Re tr(X^H Y)`` (verified on explicit matrices where a rule is transposed)."""

    _label = "tril₋"

    def evaluate_rule(self, ev, arith, size, env):
        return arith.strictly_lower(ev(self.arg))

    def lower_rule(self, b):
        return b.emit("strictly_lower", [b.lower(self.arg)], "matrix")


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
        from .evaluate import _concrete

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


class _ScalarNode(EngineNode, MatrixExpr):
    """A ``1×1`` matrix: a scalar output of a derivation (``log|det A|``, a trace)."""

    def __new__(cls, arg):
        return Basic.__new__(cls, sp.sympify(arg))

    @property
    def arg(self):
        return self.args[0]

    @property
    def shape(self):
        return (sp.Integer(1), sp.Integer(1))

    def _eval_transpose(self):
        return self  # real: a 1×1 matrix is its own transpose (complex scalar outputs are not supported)

    def _sympystr(self, printer):
        return f"{self._label}({printer._print(self.arg)})"

    def _latex(self, printer):
        return rf"\operatorname{{{self._label}}}\left({printer._print(self.arg)}\right)"


class Trace(_ScalarNode):
    """``tr(X)`` of a square matrix, as a ``1×1`` matrix.  Linear; its adjoint maps a ``1×1``
    cotangent ``g`` to ``g I`` (:class:`ScalarIdentity`): ``<g, tr(X)> = <g I, X>``.  Its
    conjugate is ``tr(X^H)`` (the normal form moves the transpose inside)."""

    _label = "tr"

    def _eval_transpose(self):
        return None  # tr(X)^H = tr(X^H): not itself for complex data; the normal form moves it inside

    def differential_rule(self, d):
        dm = d(self.arg)
        return ZeroMatrix(*self.shape) if isinstance(dm, ZeroMatrix) else Trace(dm)

    def evaluate_rule(self, ev, arith, size, env):
        return arith.trace(ev(self.arg))

    def expand_rule(self, alg, structure):
        """Linear: distributes over sums, pulls out coefficients."""
        return alg.collect((c, (Trace(alg.monomial(sp.Integer(1), fs)),)) for c, fs in alg.expand(self.arg, structure))

    def transpose_rule(self, alg, structure):
        """``tr(X)^H = tr(X^H)`` (the same for real data)."""
        if not structure.complex:
            return [(sp.Integer(1), (self,))]
        return alg.expand(Trace(Transpose(self.arg)), structure)

    def adjoint_rule(self, g):
        """``<g, tr(X)> = <g I, X>``."""
        return self.arg, ScalarIdentity(g, self.arg.shape[0])

    def lower_rule(self, b):
        inner = b.lower(self.arg)
        return b.emit("trace" if b.kind(inner) == "matrix" else "sum", [inner], "scalar")


class LogAbsDet(_ScalarNode):
    """``log|det A|`` of a square matrix, as a ``1×1`` matrix.  Its differential is Jacobi's
    formula, ``d log|det A| = sym(tr(A^-1 dA))`` (the real part; ``tr(A^-1 dA)`` for real ``A``),
    the engine's differentiation rule for this node; every use is checked against finite
    differences like any other step."""

    _label = "log|det|"

    def differential_rule(self, d):
        """Jacobi's formula: ``d log|det A| = Re tr(A^-1 dA)``."""
        dm = d(self.arg)
        return ZeroMatrix(*self.shape) if isinstance(dm, ZeroMatrix) else Sym(Trace(MatMul(Inverse(self.arg), dm)))

    def evaluate_rule(self, ev, arith, size, env):
        return arith.logabsdet(ev(self.arg))

    def expand_rule(self, alg, structure):
        return [(sp.Integer(1), (LogAbsDet(alg.normalize(self.arg, structure)),))]

    def transpose_rule(self, alg, structure):
        return [(sp.Integer(1), (self,))]


class SignDet(_ScalarNode):
    """``det A / |det A|`` (``±1`` for real ``A``, a unit phase for complex ``A``), as a ``1×1``
    matrix.  Its differential, the engine's rule for this node, is ``skew(tr(A^-1 dA)) sgn(A)``
    (``i Im tr(A^-1 dA)`` times the phase; zero for real ``A``)."""

    _label = "sgn det"

    def _eval_transpose(self):
        return None  # the conjugate of a phase: not itself in a complex derivation

    def differential_rule(self, d):
        """``d (det A / |det A|) = i Im tr(A^-1 dA) (det A / |det A|)``."""
        dm = d(self.arg)
        return ZeroMatrix(*self.shape) if isinstance(dm, ZeroMatrix) else MatMul(Skew(Trace(MatMul(Inverse(self.arg), dm))), self)

    def evaluate_rule(self, ev, arith, size, env):
        return arith.signdet(ev(self.arg))

    def expand_rule(self, alg, structure):
        return [(sp.Integer(1), (SignDet(alg.normalize(self.arg, structure)),))]

    def transpose_rule(self, alg, structure):
        """``conj(det A)/|det A| = sgn det(A^H)``."""
        if not structure.complex:
            return [(sp.Integer(1), (self,))]
        return [(sp.Integer(1), (SignDet(alg.normalize(Transpose(self.arg), structure)),))]


class Adjugate(_UnaryMatrixNode):
    """``adj(A)``: the transposed matrix of cofactors, ``A adj(A) = adj(A) A = det(A) I``; defined
    and continuous at singular ``A`` too (``det(A) A^-1`` where ``A`` is invertible).  Not linear;
    ``adj(A)^H = adj(A^H)``.  Generated code computes it with a runtime routine that stays finite
    and differentiable where ``A`` is singular (:func:`adjointgen.runtime.linalg.adjugate`)."""

    _label = "adj"

    def _eval_transpose(self):
        return Adjugate(Transpose(self.arg))

    def differential_rule(self, d):
        raise NotImplementedError("no differential rule for adj(A): differentiate det(A) (Jacobi's formula) instead")

    def expand_rule(self, alg, structure):
        return [(sp.Integer(1), (Adjugate(alg.normalize(self.arg, structure)),))]

    def transpose_rule(self, alg, structure):
        """``adj(A)^H = adj(A^H)``."""
        return [(sp.Integer(1), (Adjugate(alg.normalize(Transpose(self.arg), structure)),))]

    def adjoint_rule(self, g):
        return None  # not linear

    def evaluate_rule(self, ev, arith, size, env):
        return arith.adjugate(ev(self.arg))

    def lower_rule(self, b):
        return b.emit("adjugate", [b.lower(self.arg)], "matrix")


class Det(_ScalarNode):
    """``det A`` of a square matrix, as a ``1×1`` matrix (complex for complex ``A``).  Its
    differential is Jacobi's formula with the adjugate, ``d det A = tr(adj(A) dA)``, which holds at
    singular ``A`` too (where ``det(A) tr(A^-1 dA)`` does not exist)."""

    _label = "det"

    def _eval_transpose(self):
        return None  # conj(det A) = det(A^H): not itself in a complex derivation

    def differential_rule(self, d):
        """Jacobi's formula: ``d det A = tr(adj(A) dA)``."""
        dm = d(self.arg)
        return ZeroMatrix(*self.shape) if isinstance(dm, ZeroMatrix) else Trace(MatMul(Adjugate(self.arg), dm))

    def evaluate_rule(self, ev, arith, size, env):
        return arith.det(ev(self.arg))

    def expand_rule(self, alg, structure):
        return [(sp.Integer(1), (Det(alg.normalize(self.arg, structure)),))]

    def transpose_rule(self, alg, structure):
        """``conj(det A) = det(A^H)``."""
        if not structure.complex:
            return [(sp.Integer(1), (self,))]
        return [(sp.Integer(1), (Det(alg.normalize(Transpose(self.arg), structure)),))]


class ScalarIdentity(EngineNode, MatrixExpr):
    """``g I``: a ``1×1`` matrix ``g`` times the ``n×n`` identity.  Arguments ``(g, n)``.  Diagonal,
    symmetric, commutes with every factor; generated code multiplies by the scalar (no identity
    matrix is formed).  The adjoint of :class:`Trace`: ``<G, g I> = <tr(G), g>``."""

    def __new__(cls, g, n):
        return Basic.__new__(cls, sp.sympify(g), sp.sympify(n))

    @property
    def arg(self):
        return self.args[0]

    @property
    def shape(self):
        return (self.args[1], self.args[1])

    def _eval_transpose(self):
        return self

    def _sympystr(self, printer):
        return f"{printer._print(self.arg)} I"

    def differential_rule(self, d):
        dg = d(self.arg)
        return ZeroMatrix(*self.shape) if isinstance(dg, ZeroMatrix) else ScalarIdentity(dg, self.shape[0])

    def expand_rule(self, alg, structure):
        """``(c g) I = c (g I)``."""
        n = self.shape[0]
        return alg.collect((c, (ScalarIdentity(alg.monomial(sp.Integer(1), fs), n),))
                           for c, fs in alg.expand(self.arg, structure))

    def transpose_rule(self, alg, structure):
        """``(g I)^H = g^H I``."""
        if not structure.complex:
            return [(sp.Integer(1), (self,))]
        return [(c, (ScalarIdentity(alg.monomial(sp.Integer(1), fs), self.shape[0]),))
                for c, fs in alg.expand(Transpose(self.arg), structure)]

    def adjoint_rule(self, g):
        """``<G, h I> = <tr(G), h>``."""
        return self.arg, Trace(g)

    def evaluate_rule(self, ev, arith, size, env):
        return arith.scalar(ev(self.arg), size(self.shape[0]))

    def lower_rule(self, b):
        b.fail(f"a multiple of the identity alone has no shape to take: {self}")


class SameCluster(sp.Function):
    """``SameCluster(d_i, d_j)``: 1 when the two eigenvalues (singular values) belong to one cluster
    of equal values, else 0 -- the entries of the cluster indicator ``K`` (zero on the diagonal).

    Generated code evaluates it with a relative tolerance (:mod:`adjointgen.runtime.degeneracy`);
    the engine uses only that it is symmetric and vanishes unless ``d_i = d_j``."""

    is_real = True
    nargs = 2

    @classmethod
    def eval(cls, a, b):
        if a == b:
            return sp.Integer(1)
        if sp.default_sort_key(a) > sp.default_sort_key(b):  # symmetric: one canonical order
            return cls(b, a)
        return None


@dataclass(frozen=True)
class PairwiseDef:
    """Entry formula of a pairwise matrix ``F_ij = expr(d_i, d_j)`` for ``i != j``.

    Attributes:
        name: the matrix's name in formulas and generated code (``F``, ``E``).
        diagonal_of: name of the diagonal matrix whose entries are ``d`` (``D``, ``S``).
        expr: SymPy scalar expression in :data:`DI`, :data:`DJ`, produced by a derivation step.
        diagonal_value: value of ``F_ii`` (a SymPy number).
        origin: the derivation step that produced the formula (for reports and errors).
        meaning: one line saying what the entries are (``reciprocal eigengaps``).
    """

    name: str
    diagonal_of: str
    expr: sp.Expr
    diagonal_value: sp.Expr
    origin: str
    meaning: str
    #: the cluster indicator on whose pairs this matrix is zero (a reciprocal gap inside a cluster
    #: of equal values, where the equation it solves leaves the unknown free: a gauge)
    zero_on: str | None = None
    #: ``d`` is complex (the eigenvalues of a general matrix): ``F^H`` is ``conj(F)^T``, not ``±F``
    complex_values: bool = False
    #: the entries are the complex conjugates of those of the pairwise matrix named here:
    #: ``conj(F)_ij = expr(conj d_i, conj d_j)`` (the formulas have real coefficients)
    conjugate_of: str | None = None

    @property
    def is_indicator(self) -> bool:
        """A cluster indicator ``K`` (entries :class:`SameCluster`)."""
        return isinstance(self.expr, SameCluster)

    @property
    def swapped(self) -> sp.Expr:
        """``expr(d_j, d_i)``."""
        return self.expr.xreplace({DI: DJ, DJ: DI})

    @property
    def is_antisymmetric(self) -> bool:
        return sp.simplify(self.expr + self.swapped) == 0 and sp.sympify(self.diagonal_value) == 0

    @property
    def is_symmetric(self) -> bool:
        return sp.simplify(self.expr - self.swapped) == 0


def conjugate(F: "PairwiseMatrix") -> "PairwiseMatrix":
    """``conj(F)`` of a pairwise matrix of complex values, itself a pairwise matrix (of ``conj d``)."""
    d = F.definition
    if d.conjugate_of is not None:
        return PairwiseMatrix(d.conjugate_of, *F.shape)
    name = d.name + "conj"
    if name not in PairwiseMatrix._registry or PairwiseMatrix._registry[name].conjugate_of != d.name:
        PairwiseMatrix._registry[name] = PairwiseDef(
            name, d.diagonal_of, d.expr, d.diagonal_value, origin=d.origin, meaning=f"conj({d.name}): " + d.meaning,
            zero_on=d.zero_on, complex_values=True, conjugate_of=d.name)
    return PairwiseMatrix(name, *F.shape)


class PairwiseMatrix(MatrixSymbol):
    """A square matrix whose entries follow a :class:`PairwiseDef`.

    It behaves as a ``MatrixSymbol`` in expressions; its definition is kept in a registry keyed by
    name so that SymPy's tree rebuilding (which only passes ``args``) keeps working.
    """

    _registry: dict[str, PairwiseDef] = {}

    @classmethod
    def define(cls, definition: PairwiseDef, n) -> "PairwiseMatrix":
        cls._registry[definition.name] = definition
        return cls(definition.name, n, n)

    @classmethod
    def activate(cls, definitions) -> None:
        """Make ``definitions`` (name -> :class:`PairwiseDef`: a derivation's) the ones read by name."""
        cls._registry.update(definitions)

    @property
    def definition(self) -> PairwiseDef:
        return self._registry[self.name]

    def _eval_transpose(self):
        d = self.definition
        if d.complex_values:
            return None  # F^H = conj(F)^T: the engine's transpose rule writes it with conjugate()
        if d.is_symmetric:
            return self
        if d.is_antisymmetric:
            return -self
        return None


@dataclass
class Structure:
    """Properties a derivation declares for its symbols, consulted by the rewrite rules.

    With ``complex`` set, symbols hold complex matrices and ``X^T`` (``Transpose``) is read as the
    conjugate transpose ``X^H``: "symmetric" means Hermitian, "skew" anti-Hermitian, ``sym``/``skew``
    are the Hermitian/anti-Hermitian parts, and scalar coefficients stay real.  Rules that hold only
    for real matrices (``diag(X^T) = diag(X)``, the zero diagonal of a skew matrix) are then off.
    Diagonal symbols are real in both fields; a symbol declared both diagonal and skew is an
    anti-Hermitian (imaginary) diagonal.
    """

    symmetric: set[str] = field(default_factory=set)
    diagonal: set[str] = field(default_factory=set)
    skew: set[str] = field(default_factory=set)
    #: name -> name of the matrix M with ``X^T M X = I`` (``None`` for ``M = I``)
    orthonormal: dict[str, str | None] = field(default_factory=dict)
    complex: bool = False
    #: gauge parameter -> the cluster indicator ``K`` it is supported on (``Ω = K ∘ Ω``)
    clustered: dict[str, str] = field(default_factory=dict)
    #: lower / upper triangular symbols; ``unit``: unit diagonal, ``strict``: zero diagonal
    lower: set[str] = field(default_factory=set)
    upper: set[str] = field(default_factory=set)
    unit: set[str] = field(default_factory=set)
    strict: set[str] = field(default_factory=set)
    #: triangular symbols whose diagonal is real (complex derivations: the Cholesky factor, whose
    #: diagonal is positive, and its tangent)
    real_diagonal: set[str] = field(default_factory=set)
    #: diagonal symbols whose entries are complex (the eigenvalues of a general matrix): not
    #: Hermitian, ``D^H = conj(D)``, still commuting with every diagonal
    complex_diagonal: set[str] = field(default_factory=set)

    def __setattr__(self, name, value):
        if getattr(self, "_frozen", False):
            raise AttributeError(f"a frozen Structure cannot change ({name})")
        object.__setattr__(self, name, value)

    def frozen(self) -> "Structure":
        """An immutable copy (frozensets, read-only mappings): the structure of a finished spec."""
        import types

        copy = Structure(frozenset(self.symmetric), frozenset(self.diagonal), frozenset(self.skew),
                         types.MappingProxyType(dict(self.orthonormal)), self.complex,
                         types.MappingProxyType(dict(self.clustered)), frozenset(self.lower), frozenset(self.upper),
                         frozenset(self.unit), frozenset(self.strict), frozenset(self.real_diagonal),
                         frozenset(self.complex_diagonal))
        object.__setattr__(copy, "_frozen", True)
        return copy

    def is_symmetric(self, name: str) -> bool:
        return ((name in self.symmetric or name in self.diagonal) and name not in self.skew
                and name not in self.complex_diagonal)

    def real(self) -> "Structure":
        """The same declarations for real matrices (the specialisation of a complex rule)."""
        return Structure(set(self.symmetric), set(self.diagonal), set(self.skew), dict(self.orthonormal), False,
                         dict(self.clustered), set(self.lower), set(self.upper), set(self.unit), set(self.strict),
                         set(self.real_diagonal), set(self.complex_diagonal))

    def triangle(self, name: str) -> tuple[str, str] | None:
        """``(side, diagonal)`` of a triangular symbol: side ``lower``/``upper``, diagonal
        ``unit``/``zero``/``general``; ``None`` if the symbol is not declared triangular."""
        side = "lower" if name in self.lower else ("upper" if name in self.upper else None)
        if side is None:
            return None
        return side, ("unit" if name in self.unit else ("zero" if name in self.strict else "general"))

    def describe(self, name: str) -> list[str]:
        props = []
        if name in self.complex_diagonal:
            props.append("complex diagonal")
        elif name in self.diagonal:
            props.append("diagonal")
        elif name in self.symmetric:
            props.append("symmetric")
        if name in self.skew:
            props.append("skew-symmetric")
        tri = self.triangle(name)
        if tri is not None:
            side, diag = tri
            props.append({"unit": f"unit {side} triangular", "zero": f"strictly {side} triangular"}.get(diag, f"{side} triangular"))
        if name in self.orthonormal:
            m = self.orthonormal[name]
            props.append("orthonormal columns" if m is None else f"{m}-orthonormal columns")
        return props

"""Scalar outputs (``1×1`` symbols): ``Trace``, ``LogAbsDet``, ``SignDet``, ``Det``, the
``Adjugate`` and ``ScalarIdentity`` (a ``1×1`` value times the identity)."""
from __future__ import annotations

import sympy as sp
from sympy import Basic
from sympy.matrices.expressions import Inverse, MatMul, MatrixExpr, Transpose, ZeroMatrix

from .base import EngineNode, _UnaryMatrixNode
from .projections import Skew, Sym


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
        saved = b.saved_factor(self.arg)  # the LU the forward saved: det(A) A^-1 without a second LU
        if saved is not None:
            value, (lu, pivots), adjoint = saved
            return b.emit("adjugate_lu", [value, lu, pivots], "matrix", [("adjoint", str(adjoint))])
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

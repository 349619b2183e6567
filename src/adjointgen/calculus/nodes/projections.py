"""The linear projections: ``DiagPart`` (``I ∘ X``), ``Sym`` / ``Skew`` (``(X ± X^T)/2``),
``LowerHalf`` and ``StrictlyLower`` (the triangular parts of the triangular factorizations)."""
from __future__ import annotations

import sympy as sp
from sympy.matrices.expressions import Transpose

from .base import _UnaryMatrixNode


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

"""Pairwise matrices, ``F_ij = f(d_i, d_j)`` (eigengaps, reciprocal gaps, divided differences):
the scalar formula is a SymPy expression a derivation step produced, never typed in; and the
cluster indicator ``SameCluster``."""
from __future__ import annotations

from dataclasses import dataclass

import sympy as sp
from sympy.matrices.expressions import MatrixSymbol

from .base import DI, DJ


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

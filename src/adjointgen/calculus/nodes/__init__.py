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

One module per family of nodes (``base``, ``projections``, ``pairwise``, ``structure``, ``solves``,
``functions``, ``scalars``); a node's class is its section: its rules live with it.
"""
from __future__ import annotations

from .base import DI, DJ, EngineNode, _UnaryMatrixNode  # noqa: F401
from .projections import DiagPart, LowerHalf, Skew, StrictlyLower, Sym  # noqa: F401
from .pairwise import PairwiseDef, PairwiseMatrix, SameCluster, conjugate  # noqa: F401
from .structure import Structure  # noqa: F401
from .solves import OperatorSolve, ShiftedSolve, SylvesterSolve, TriangularSylvesterSolve  # noqa: F401
from .functions import DiagFunction, ExpFrechet, ExpFrechetSolve, MatrixExp  # noqa: F401
from .scalars import Adjugate, Det, LogAbsDet, ScalarIdentity, SignDet, Trace, _ScalarNode  # noqa: F401


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

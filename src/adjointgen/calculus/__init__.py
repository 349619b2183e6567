"""The derivation engine: matrix-expression nodes, algebra, derivations."""
from sympy.matrices.expressions import HadamardProduct, Identity, Inverse, MatrixSymbol, Transpose, ZeroMatrix

from .algebra import DerivationError
from .derivation import Derivation, Equation
from .nodes import Adjugate, Det, DiagPart, ExpFrechet, ExpFrechetSolve, LogAbsDet, MatrixExp, LowerHalf, PairwiseMatrix, ScalarIdentity, SignDet, Skew, StrictlyLower, Sym, Trace

__all__ = [
    "Adjugate", "Derivation", "DerivationError", "Det", "DiagPart", "ExpFrechet", "ExpFrechetSolve", "MatrixExp", "Equation", "HadamardProduct", "Identity",
    "Inverse", "LogAbsDet", "LowerHalf", "MatrixSymbol", "PairwiseMatrix", "ScalarIdentity", "SignDet", "Skew", "StrictlyLower",
    "Sym", "Trace", "Transpose",
    "ZeroMatrix",
]

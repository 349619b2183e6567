"""The derivation engine: matrix-expression nodes, algebra, derivations."""
from sympy.matrices.expressions import HadamardProduct, Identity, Inverse, MatrixSymbol, Transpose, ZeroMatrix

from .algebra import DerivationError
from .derivation import Derivation, Equation
from .nodes import DiagPart, LowerHalf, PairwiseMatrix, Skew, StrictlyLower, Sym

__all__ = [
    "Derivation", "DerivationError", "DiagPart", "Equation", "HadamardProduct", "Identity",
    "Inverse", "LowerHalf", "MatrixSymbol", "PairwiseMatrix", "Skew", "StrictlyLower", "Sym", "Transpose",
    "ZeroMatrix",
]

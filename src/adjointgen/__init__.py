"""adjointgen: derived, audited JVP/VJP rules for matrix decompositions.

``import adjointgen.torch as agt`` for the PyTorch functions, ``adjointgen.generated.cupy`` for the
NumPy/CuPy rule functions, ``adjointgen.LinearOperator`` for matrix-free operators.
"""
from .runtime.errors import ConvergenceError
from .runtime.gauge import PhaseDependentLossError
from .runtime.linear_operator import LinearOperator

__all__ = ["ConvergenceError", "LinearOperator", "PhaseDependentLossError"]
__version__ = "0.1.0"

"""Exceptions raised by the hand-written runtime (eigensolvers, projected linear solvers)."""

from __future__ import annotations

import math

__all__ = ["ConvergenceError"]


class ConvergenceError(ValueError):
    """An iterative solver stopped without reaching its tolerance.

    It is a ``ValueError`` so that callers catching bad-input errors also catch it. The attributes
    say how far the solver got, so that the message and a caller's retry logic need no parsing.

    Attributes:
        method: the solver that failed (``"arpack"``, ``"lobpcg"``, ``"cg"``, ``"minres"``, ...).
        residual: the largest relative residual reached (``inf`` when none could be computed).
        tol: the tolerance that was asked for.
        iterations: iterations (or matrix products, for ARPACK) spent before giving up.
    """

    def __init__(self, message: str, *, method: str, residual: float, tol: float, iterations: int):
        self.method = method
        self.residual = float(residual)
        self.tol = float(tol)
        self.iterations = int(iterations)
        reached = "no residual available" if not math.isfinite(self.residual) else f"{self.residual:.3e}"
        super().__init__(
            f"{message} [method={method}, residual reached={reached}, tol={self.tol:.3e}, "
            f"iterations={self.iterations}]"
        )

"""Solves that generated rules call with a factorization the forward saved (``d.forward(saves=)``).

``lu_solve(A, LU, pivots, B)`` is ``A^-1 B`` (``A^-H B`` with ``adjoint``; ``B A^-1`` with
``left=False``).  A first-order backward runs without a graph (grad mode off): then the LU factors
of the forward are reused, an ``O(n^2 p)`` solve instead of a new ``O(n^3)`` factorization.  When a
graph is recorded (``create_graph=True``, forward-mode transforms), the factors are constants of the
graph, so the solve is done with ``A`` itself and every higher derivative stays exact.  No formula
lives here: which factorization to use is a numerical choice, the rule is the derived one.
"""
from __future__ import annotations

import torch

__all__ = ["lu_solve"]


def _reusable(*tensors) -> bool:
    if torch.is_grad_enabled():
        return False
    from .checks import is_traced

    return not any(isinstance(t, torch.Tensor) and (is_traced(t) or _is_dual(t)) for t in tensors)


def _is_dual(t: torch.Tensor) -> bool:
    try:
        from torch._C._functorch import is_functorch_wrapped_tensor

        if is_functorch_wrapped_tensor(t):
            return True
    except ImportError:  # pragma: no cover - older torch
        pass
    return torch.autograd.forward_ad.unpack_dual(t).tangent is not None


def lu_solve(A, LU, pivots, B, *, adjoint: bool = False, left: bool = True):
    """``op(A)^-1 B`` (``left``) or ``B op(A)^-1``, ``op(A) = A^H`` with ``adjoint``."""
    if LU is not None and _reusable(A, B):
        return torch.linalg.lu_solve(LU, pivots, B, left=left, adjoint=adjoint)
    M = A.mH if adjoint else A
    return torch.linalg.solve(M, B, left=left)

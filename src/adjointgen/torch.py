"""PyTorch API: differentiable matrix decompositions with derived, audited rules.

``import adjointgen.torch as agt``.  Every function accepts batches ``(..., m, n)``, float32 and
float64, on CPU and CUDA, and is differentiable in reverse and forward mode (``torch.autograd``,
``torch.func.grad``/``jvp``/``vmap``), including higher derivatives.  Bad input raises
``ValueError`` naming the problem.
"""
from __future__ import annotations

import torch

from .generated.torch.eigh import EighFunction
from .runtime import checks

__all__ = ["eigh"]


def eigh(A: torch.Tensor, B: torch.Tensor | None = None):
    """Symmetric eigendecomposition ``A = V diag(w) V^T``.

    Args:
        A: real symmetric matrices ``(..., n, n)``, float32 or float64.  Only symmetric
            perturbations are meaningful, so the gradient with respect to ``A`` is symmetric.
        B: reserved for the generalized problem ``A V = B V diag(w)``.

    Returns:
        ``(w, V)``: eigenvalues ascending ``(..., n)`` and orthonormal eigenvectors ``(..., n, n)``
        as :func:`torch.linalg.eigh`.

    Gradients of the eigenvectors are defined only for distinct eigenvalues; a loss must not
    depend on the sign of an eigenvector.

    Raises:
        ValueError: ``A`` not a square floating matrix, not symmetric (within 100 eps relative),
            or containing NaN/Inf.
    """
    checks.symmetric_matrix(A, "A")
    if B is not None:
        raise NotImplementedError("the generalized problem eigh(A, B) is not available yet")
    return EighFunction.apply(A)

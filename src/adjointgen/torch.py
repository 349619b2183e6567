"""PyTorch API: differentiable matrix decompositions with derived, audited rules.

``import adjointgen.torch as agt``.  Every function accepts batches ``(..., m, n)``, float32 and
float64, on CPU and CUDA, and is differentiable in reverse and forward mode (``torch.autograd``,
``torch.func.grad``/``jvp``/``vmap``), including higher derivatives.  Bad input raises
``ValueError`` naming the problem.
"""
from __future__ import annotations

import torch

from .generated.torch.eigh import EighFunction
from .generated.torch.eigh_generalized import EighGeneralizedFunction
from .runtime import checks

__all__ = ["eigh"]


def eigh(A: torch.Tensor, B: torch.Tensor | None = None):
    """Symmetric eigendecomposition ``A = V diag(w) V^T``, or with ``B`` the generalized
    symmetric-definite problem ``A V = B V diag(w)``, ``V^T B V = I``.

    Args:
        A: real symmetric matrices ``(..., n, n)``, float32 or float64.  Only symmetric
            perturbations are meaningful, so the gradient with respect to ``A`` is symmetric.
        B: optional symmetric positive definite matrices of the same shape (broadcast over the
            batch); differentiable too (symmetric gradient).

    Returns:
        ``(w, V)``: eigenvalues ascending ``(..., n)`` and eigenvectors ``(..., n, n)``,
        orthonormal (``B``-orthonormal with ``B``), as :func:`torch.linalg.eigh` /
        :func:`scipy.linalg.eigh`.

    Gradients of the eigenvectors are defined only for distinct eigenvalues; a loss must not
    depend on the sign of an eigenvector.

    Raises:
        ValueError: ``A`` (or ``B``) not a square floating matrix, not symmetric (within 100 eps
            relative), containing NaN/Inf; ``B`` not positive definite or of another shape.
    """
    checks.symmetric_matrix(A, "A")
    if B is None:
        return EighFunction.apply(A)
    checks.symmetric_matrix(B, "B")
    if B.shape[-2:] != A.shape[-2:]:
        raise ValueError(f"B must have the shape of A: A is {tuple(A.shape)}, B is {tuple(B.shape)}")
    if B.dtype != A.dtype:
        raise ValueError(f"B must have A's dtype {A.dtype}, got {B.dtype}")
    batch = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    A = A.expand(*batch, *A.shape[-2:])
    B = B.expand(*batch, *B.shape[-2:])
    return EighGeneralizedFunction.apply(A, B)

"""Forward computations declared by ``derivations/weighted_lstsq.py``."""


def weighted_lstsq(A, W, B):
    """``X = (A^T W A)^-1 A^T W B`` for torch tensors (batched), by a Cholesky solve of the
    normal equations (``A^T W A`` is positive definite for full-rank ``A`` and SPD ``W``)."""
    import torch

    AtW = A.mT @ W
    L = torch.linalg.cholesky(AtW @ A)
    return torch.cholesky_solve(AtW @ B, L)


def weighted_lstsq_numpy(A, W, B):
    """The same for NumPy, CuPy or JAX arrays (computed with the inputs' own array module, so the
    generated JAX function traces it under ``jit``)."""
    import numpy as np

    xp = A.__array_namespace__() if hasattr(A, "__array_namespace__") else np
    AtW = xp.swapaxes(A, -1, -2) @ W
    return xp.linalg.solve(AtW @ A, AtW @ B)

"""Forward computations declared by ``derivations/weighted_lstsq.py``."""


def weighted_lstsq(A, W, B):
    """``X = (A^T W A)^-1 A^T W B`` for torch tensors (batched), by a Cholesky solve of the
    normal equations (``A^T W A`` is positive definite for full-rank ``A`` and SPD ``W``)."""
    import torch

    AtW = A.mT @ W
    L = torch.linalg.cholesky(AtW @ A)
    return torch.cholesky_solve(AtW @ B, L)


def weighted_lstsq_numpy(A, W, B):
    """The same for NumPy arrays."""
    import numpy as np

    AtW = np.swapaxes(A, -1, -2) @ W
    return np.linalg.solve(AtW @ A, AtW @ B)

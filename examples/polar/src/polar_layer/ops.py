"""Forward computations declared by ``derivations/polar.py``: ``A = U P`` from the SVD
``A = W diag(s) V^H``: ``U = W V^H`` (unitary), ``P = V diag(s) V^H`` (Hermitian positive definite
for nonsingular ``A``)."""


def polar(A):
    """``(U, P)`` for torch tensors (batched, real or complex)."""
    import torch

    W, s, Vh = torch.linalg.svd(A)
    V = Vh.mH
    return W @ Vh, (V * s.to(A.dtype).unsqueeze(-2)) @ Vh


def polar_numpy(A):
    """The same for NumPy, CuPy or JAX arrays (with the inputs' own array module)."""
    import numpy as np

    xp = A.__array_namespace__() if hasattr(A, "__array_namespace__") else np
    W, s, Vh = xp.linalg.svd(A)
    V = xp.conj(xp.swapaxes(Vh, -1, -2))
    return W @ Vh, (V * s[..., None, :]) @ Vh

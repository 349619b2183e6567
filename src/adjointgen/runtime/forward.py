"""Forward computations called by the generated autograd functions (no formulas live here)."""
from __future__ import annotations

import torch


def eigh(A):
    """Full symmetric eigendecomposition, eigenvalues ascending (LAPACK/cuSOLVER via torch)."""
    w, V = torch.linalg.eigh(A)
    return w, V

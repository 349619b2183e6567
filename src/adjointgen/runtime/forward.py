"""Forward computations called by the generated autograd functions (no formulas live here)."""
from __future__ import annotations

import torch


def eigh(A):
    """Full symmetric eigendecomposition, eigenvalues ascending (LAPACK/cuSOLVER via torch)."""
    w, V = torch.linalg.eigh(A)
    return w, V


def eigh_generalized(A, B):
    """``A V = B V diag(w)``, ``V^T B V = I`` through the Cholesky factor ``B = L L^T``:
    ``L^-1 A L^-T = Y diag(w) Y^T``, ``V = L^-T Y``.  Raises ``ValueError`` when ``B`` is not
    positive definite."""
    L, info = torch.linalg.cholesky_ex(B)
    if not _is_traced(info) and bool((info != 0).any()):
        raise ValueError("B is not positive definite (Cholesky factorization failed)")
    C = torch.linalg.solve_triangular(L, A, upper=False)
    C = torch.linalg.solve_triangular(L, C.mT, upper=False)
    C = 0.5 * (C + C.mT)
    w, Y = torch.linalg.eigh(C)
    V = torch.linalg.solve_triangular(L.mT, Y, upper=True)
    return w, V


def _is_traced(x):
    from .checks import _is_traced as traced

    return traced(x)


def pinv(A, atol=None, rtol=None, hermitian=False):
    """``torch.linalg.pinv`` semantics with the rank-revealing fast path of
    :func:`adjointgen.runtime.pinv.pinv_forward`."""
    from .pinv import pinv_forward

    return pinv_forward(A, atol=atol, rtol=rtol, hermitian=hermitian)


def svd(A):
    """Thin SVD ``A = U diag(S) V^H`` (returns ``V``, not ``V^H``); real or complex ``A``."""
    U, S, Vh = torch.linalg.svd(A, full_matrices=False)
    return U, S, Vh.mH.resolve_conj()  # no lazy-conjugate view: forward mode needs a plain layout

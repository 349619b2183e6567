"""Forward computations that the derivations declare (``d.forward(torch=...)``) where no library
function has the right conventions.  Algorithms only: no derivative formula lives here."""
from __future__ import annotations

import torch

from .checks import NotPositiveDefiniteError, _is_traced


def eigh_generalized(A, B):
    """``A V = B V diag(w)``, ``V^T B V = I`` through the Cholesky factor ``B = L L^T``:
    ``L^-1 A L^-T = Y diag(w) Y^T``, ``V = L^-T Y``.  Raises :class:`NotPositiveDefiniteError` (a
    ``ValueError``) when ``B`` is not positive definite."""
    L, info = torch.linalg.cholesky_ex(B)
    if not _is_traced(info) and bool((info != 0).any()):
        raise NotPositiveDefiniteError("B is not positive definite (Cholesky factorization failed)")
    C = torch.linalg.solve_triangular(L, A, upper=False)
    C = torch.linalg.solve_triangular(L, C.mH, upper=False)
    C = 0.5 * (C + C.mH)
    w, Y = torch.linalg.eigh(C)
    V = torch.linalg.solve_triangular(L.mH, Y, upper=True)
    return w, V


def pinv(A, atol=None, rtol=None, hermitian=False):
    """``torch.linalg.pinv`` semantics with the rank-revealing fast path of
    :func:`adjointgen.runtime.pinv.pinv_forward`."""
    from .pinv import pinv_forward

    return pinv_forward(A, atol=atol, rtol=rtol, hermitian=hermitian)


def svd(A):
    """Thin SVD ``A = U diag(S) Vh``, as ``torch.linalg.svd(A, full_matrices=False)``."""
    return torch.linalg.svd(A, full_matrices=False)

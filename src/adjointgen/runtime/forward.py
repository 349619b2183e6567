"""Forward computations that the derivations declare (``d.forward(torch=...)``) where no library
function has the right conventions.  Algorithms only: no derivative formula lives here."""
from __future__ import annotations

import torch

from .checks import NotPositiveDefiniteError, is_traced
from .linalg import pivot_parity
from .verdict import nonzero, verdict


def eigh(A):
    """``(w, V)`` as ``torch.linalg.eigh``, with the eigenvectors of eigenvalues equal to rounding
    rotated to a generic basis of their eigenspace (:func:`adjointgen.runtime.degeneracy.generic_basis`)."""
    from .degeneracy import generic_basis

    w, V = torch.linalg.eigh(A)
    (V,) = generic_basis(w, V)
    return w, V


def eigh_generalized(A, B):
    """``A V = B V diag(w)``, ``V^T B V = I`` through the Cholesky factor ``B = L L^T``:
    ``L^-1 A L^-T = Y diag(w) Y^T``, ``V = L^-T Y``.  Raises :class:`NotPositiveDefiniteError` (a
    ``ValueError``) when ``B`` is not positive definite."""
    L, info = torch.linalg.cholesky_ex(B)
    if not is_traced(info) and bool((info != 0).any()):
        raise NotPositiveDefiniteError("B is not positive definite (Cholesky factorization failed)")
    C = torch.linalg.solve_triangular(L, A, upper=False)
    C = torch.linalg.solve_triangular(L, C.mH, upper=False)
    C = 0.5 * (C + C.mH)
    w, Y = torch.linalg.eigh(C)
    V = torch.linalg.solve_triangular(L.mH, Y, upper=True)
    from .degeneracy import generic_basis

    (V,) = generic_basis(w, V)  # V_c R: still B-orthonormal
    return w, V


def pinv(A, atol=None, rtol=None, hermitian=False):
    """``torch.linalg.pinv`` semantics with the rank-revealing fast path of
    :func:`adjointgen.runtime.pinv.pinv_forward`."""
    from .pinv import pinv_forward

    return pinv_forward(A, atol=atol, rtol=rtol, hermitian=hermitian)


def lstsq(A, B, rcond=None):
    """``(X, P)``: the minimum-norm least-squares solution ``X = A⁺ B`` and the pseudo-inverse
    ``P = A⁺`` the rules use, with ``torch.linalg.lstsq``'s rank cutoff (singular values at most
    ``rcond * sigma_max`` are discarded; ``rcond`` defaults to ``eps * max(m, n)``).  ``P`` comes
    from the rank-revealing fast path of :func:`adjointgen.runtime.pinv.pinv_forward` (one LU,
    Cholesky or QR when no singular value is near the cutoff, else the SVD)."""
    from .pinv import pinv_forward

    P = pinv_forward(A, rtol=rcond)
    return P @ B, P


def svd(A):
    """Thin SVD ``A = U diag(S) Vh``, as ``torch.linalg.svd(A, full_matrices=False)``, with the pairs
    of singular values equal to rounding rotated to a generic basis (``(U_c R, V_c R)``, the same
    ``R``: ``U S Vh`` is unchanged)."""
    from .degeneracy import generic_basis

    U, S, Vh = torch.linalg.svd(A, full_matrices=False)
    U, V = generic_basis(S, U, Vh.mH)
    return U, S, V.mH


def cholesky(A):
    """``L`` with ``A = L L^H``, lower triangular, as ``torch.linalg.cholesky``; raises
    :class:`NotPositiveDefiniteError` (a ``ValueError`` and a ``torch.linalg.LinAlgError``) naming
    the leading minor that fails."""
    L, info = torch.linalg.cholesky_ex(A)
    if not is_traced(info):
        from .checks import not_positive_definite

        nonzero(info, lambda: not_positive_definite("A", info))
    return L


def _raise_singular(info, what: str):
    if is_traced(info):
        return

    def error():
        from .checks import SingularMatrixError

        bad = (info != 0).nonzero()[0].tolist()
        where = f" (batch index {tuple(bad)})" if bad else ""
        pivot = int(info[tuple(bad)]) if bad else int(info)
        return SingularMatrixError(f"{what}: A is singular{where}: pivot {pivot} of its LU factorization is zero")

    nonzero(info, error)


def inv(A):
    """``A^-1`` as ``torch.linalg.inv``; raises :class:`SingularMatrixError` (a ``ValueError`` and
    a ``torch.linalg.LinAlgError``) for a singular ``A``."""
    X, info = torch.linalg.inv_ex(A)
    _raise_singular(info, "inv")
    return X


def solve(A, B):
    """``(X, LU, pivots)``: ``X = A^-1 B`` as ``torch.linalg.solve`` (B a matrix) and the LU factors
    of ``A`` it used, which the backward reuses; raises :class:`SingularMatrixError`."""
    LU, pivots, info = torch.linalg.lu_factor_ex(A)
    _raise_singular(info, "solve")
    return torch.linalg.lu_solve(LU, pivots, B), LU, pivots


def solve_lower(A, B):
    """``A^-1 B`` for a lower triangular ``A`` (its upper triangle is not read), as
    ``torch.linalg.solve_triangular(A, B, upper=False)``; raises :class:`SingularMatrixError` for
    a zero on the diagonal (torch returns Inf/NaN there)."""
    diagonal = A.diagonal(dim1=-2, dim2=-1)
    if not is_traced(diagonal) and diagonal.numel():
        from .verdict import verdict

        def error():
            from .checks import SingularMatrixError

            bad = (diagonal == 0).nonzero()[0].tolist()
            where = f" (batch index {tuple(bad[:-1])})" if len(bad) > 1 else ""
            return SingularMatrixError(f"solve_triangular: A is singular{where}: its diagonal entry {bad[-1]} is zero")

        verdict(diagonal == 0, error)
    return torch.linalg.solve_triangular(A, B, upper=False)


def lu(A):
    """``(P, L, U)`` with ``A = P L U``, as ``torch.linalg.lu`` (partial pivoting; tall and wide
    ``A`` too).  A singular ``A`` factors (a zero on ``U``'s diagonal), as torch; its derivative is
    refused where it is taken (:func:`adjointgen.composite.lu.check_pivots`)."""
    P, L, U = torch.linalg.lu(A)
    return P, L, U


def qr(A):
    """Reduced QR ``(Q, R)`` of a tall or square ``A``, as ``torch.linalg.qr(A)`` (LAPACK's signs)."""
    Q, R = torch.linalg.qr(A, mode="reduced")
    return Q, R


def slogdet(A):
    """``(sign, logabsdet, LU, pivots)``: ``torch.linalg.slogdet(A)`` (real or complex ``A``) and the
    LU factors it is computed from, which the backward reuses.  A singular ``A`` gives
    ``(0, -inf)``, as torch."""
    LU, pivots, _ = torch.linalg.lu_factor_ex(A)
    diagonal = LU.diagonal(dim1=-2, dim2=-1)
    sign = pivot_parity(pivots, A.dtype) * diagonal.sgn().prod(-1)  # a unit phase for complex A, 0 for a singular one
    logabsdet = diagonal.abs().log().sum(-1)
    return sign, logabsdet, LU, pivots


def det(A):
    """``(det, LU, pivots)``: ``torch.linalg.det(A)`` (real or complex; 0 for a singular ``A``) and
    the LU factors of ``A`` it is computed from, which the backward reuses (torch's own
    ``_linalg_det`` returns the factors of ``A^T`` on some devices)."""
    LU, pivots, _ = torch.linalg.lu_factor_ex(A)
    return pivot_parity(pivots, A.dtype) * LU.diagonal(dim1=-2, dim2=-1).prod(-1), LU, pivots


@torch.compiler.disable  # SciPy on the host: a compiler runs it as is (tracing into SciPy took 40 s)
def sqrtm_general(A):
    """The principal square root of general square ``A`` (batched, real or complex) by SciPy's
    Schur method on the host (tensors on other devices make a round trip); a ``ValueError`` names an
    eigenvalue on the closed negative real axis."""
    from .checks import host_arrays
    from .xp import sqrtm_general as on_host

    X = on_host(*host_arrays("sqrtm", A))
    return torch.from_numpy(X).to(device=A.device, dtype=A.dtype)


def eig(A):
    """Eigenvalues and unit-norm eigenvectors of general square ``A`` (complex, batched), as
    ``torch.linalg.eig`` (LAPACK's ``geev``), with the eigenvectors of eigenvalues equal to rounding
    rotated to a generic basis of their eigenspace and renormalized
    (:func:`adjointgen.runtime.degeneracy.generic_basis`): LAPACK's basis there has exact zeros (the
    identity's eigenvectors are ``I``), at which the first-order test of basis dependence vanishes."""
    from .degeneracy import generic_basis

    w, V = torch.linalg.eig(A)
    (V,) = generic_basis(w, V, normalize=True)
    return w, V


def matrix_exp(A):
    """``exp(A)`` of general square ``A``, as ``torch.linalg.matrix_exp``."""
    return torch.linalg.matrix_exp(A)


@torch.compiler.disable  # SciPy on the host: a compiler runs it as is (tracing into SciPy took 40 s)
def logm_general(A):
    """The principal logarithm of general square ``A`` (batched, real or complex) by SciPy's
    inverse scaling and squaring on the host (tensors on other devices make a round trip); a
    ``ValueError`` names an eigenvalue on the closed negative real axis."""
    from .checks import host_arrays
    from .xp import logm_general as on_host

    X = on_host(*host_arrays("logm", A))
    return torch.from_numpy(X).to(device=A.device, dtype=A.dtype)

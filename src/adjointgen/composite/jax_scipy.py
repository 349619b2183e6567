"""``agj.scipy``: the functions of ``jax.scipy.linalg`` that adjointgen differentiates, with their
signatures, defaults and results, over the same derived rules as :mod:`adjointgen.jax` (so
``import adjointgen.jax as agj; agj.scipy.cholesky`` replaces ``jax.scipy.linalg.cholesky``).

Where SciPy's conventions differ from NumPy's, these keep SciPy's: ``cholesky`` returns the upper
factor by default and reads one triangle (``lower``), ``qr`` defaults to ``mode="full"`` and
returns tuples (``(r,)`` for ``mode="r"``), ``svd`` returns a plain tuple.  ``eigh(a, b)`` solves
the generalized problem, which JAX does not have.  The SciPy keywords that only tune memory or
checks (``overwrite_a``, ``check_finite``, ``lapack_driver``, ...) are accepted and ignored, as
JAX does.
"""
from __future__ import annotations

from ..generated.jax import matrix_exp as _matrix_exp
from ..generated.jax import polar as _polar
from ..generated.jax import schur as _schur
from ..generated.jax import solve_sylvester as _solve_sylvester
from ..generated.jax import sqrtm_general as _sqrtm_general
from . import jax_dropins as _d
from . import jax_lax as _lax

__all__ = ["cholesky", "det", "eigh", "expm", "inv", "lu", "polar", "qr", "schur", "solve", "solve_sylvester",
           "solve_triangular", "sqrtm", "svd"]


def cholesky(a, lower=False, overwrite_a=False, check_finite=True):
    """The Cholesky factor of Hermitian positive definite ``a``, as ``jax.scipy.linalg.cholesky``:
    upper ``U`` with ``a = U^H U`` (``lower=True``: lower ``L``, ``a = L L^H``), reading only the
    triangle it returns (the other one is not read, as LAPACK's)."""
    del overwrite_a, check_finite
    a = _d.as_inexact(a)
    if lower:
        return _lax.cholesky(a, symmetrize_input=False)
    return _d._H(_lax.cholesky(_d._H(a), symmetrize_input=False))


def det(a, overwrite_a=False, check_finite=True):
    """The determinant, as ``jax.scipy.linalg.det`` (``derivations/det.py``)."""
    del overwrite_a, check_finite
    return _d.det(a)


def eigh(a, b=None, lower=True, eigvals_only=False, overwrite_a=False, overwrite_b=False, turbo=True,
         eigvals=None, type=1, check_finite=True, *, symmetrize_input=True):
    """Hermitian eigendecomposition ``(w, v)``, as ``jax.scipy.linalg.eigh`` (``w`` alone with
    ``eigvals_only``), of the Hermitian part of ``a`` (``symmetrize_input=False``: of the triangle
    ``lower`` names, as LAPACK).  With ``b`` Hermitian positive definite, the generalized problem
    ``a v = w b v``, ``v^H b v = I``, which JAX does not have (``b`` is read the same way).  Only
    SciPy's ``type=1`` and ``eigvals=None``, as JAX."""
    del overwrite_a, overwrite_b, turbo, check_finite
    if type != 1:
        raise NotImplementedError("eigh: only type=1 (a v = w b v) is implemented, as in jax.scipy.linalg")
    if eigvals is not None:
        raise NotImplementedError("eigh: only eigvals=None is implemented, as in jax.scipy.linalg")
    out = _d.eigh(a, b, UPLO="L" if lower else "U", symmetrize_input=symmetrize_input, eigvals_only=eigvals_only)
    return out if eigvals_only else tuple(out)


def expm(A, *, upper_triangular=False, max_squarings=16):
    """``exp(A)``, as ``jax.scipy.linalg.expm`` (its keywords accepted; the forward is JAX's):
    ``derivations/matrix_exp.py``'s Fréchet derivative (exact at repeated eigenvalues too)."""
    del upper_triangular, max_squarings
    return _matrix_exp.matrix_exp(_d.as_inexact(A))


def inv(a, overwrite_a=False, check_finite=True):
    """``a^-1``, as ``jax.scipy.linalg.inv`` (``derivations/inv.py``)."""
    del overwrite_a, check_finite
    return _d.inv(a)


def lu(a, permute_l=False, overwrite_a=False, check_finite=True):
    """``(p, l, u)`` with ``a = p l u`` (``(p l, u)`` with ``permute_l``), as
    ``jax.scipy.linalg.lu``, for any shape (``derivations/lu.py``)."""
    return _d.lu(a, permute_l=permute_l, overwrite_a=overwrite_a, check_finite=check_finite)


def qr(a, overwrite_a=False, lwork=None, mode="full", pivoting=False, check_finite=True):
    """QR factorization, as ``jax.scipy.linalg.qr``: ``(q, r)`` (``mode="full"``: ``q`` square;
    ``"economic"``: reduced), ``(r,)`` for ``mode="r"``; with ``pivoting`` the column permutation
    ``p`` (``a[:, p] = q r``) is appended."""
    del overwrite_a, lwork, check_finite
    if mode not in ("full", "r", "economic"):
        raise ValueError(f"Unsupported QR decomposition mode '{mode}'")
    q, r, *p = _lax.qr(a, pivoting=pivoting, full_matrices=mode in ("full", "r"))
    if mode == "r":
        return (r, *p)
    return (q, r, *p)


def solve(a, b, lower=False, overwrite_a=False, overwrite_b=False, debug=False, check_finite=True, assume_a="gen"):
    """``x`` with ``a x = b``, as ``jax.scipy.linalg.solve`` (``assume_a`` "gen", "sym", "her" or
    "pos": the same solution; ``derivations/solve.py``)."""
    del lower, overwrite_a, overwrite_b, debug, check_finite
    if assume_a not in ("gen", "sym", "her", "pos"):
        raise ValueError(f"solve: expected assume_a to be one of 'gen', 'sym', 'her' or 'pos', got {assume_a!r}")
    return _d.solve(a, b)


def solve_triangular(a, b, trans=0, lower=False, unit_diagonal=False, overwrite_b=False, debug=None,
                     check_finite=True):
    """``x`` with ``op(a) x = b`` for triangular ``a``, as ``jax.scipy.linalg.solve_triangular``."""
    return _d.solve_triangular(a, b, trans=trans, lower=lower, unit_diagonal=unit_diagonal)


def sqrtm(A, blocksize=1):
    """The principal square root, as ``jax.scipy.linalg.sqrtm`` (``derivations/sqrtm_general.py``)."""
    del blocksize
    return _sqrtm_general.sqrtm_general(_d.as_inexact(A))


def svd(a, full_matrices=True, compute_uv=True, overwrite_a=False, check_finite=True, lapack_driver="gesdd"):
    """``(u, s, vh)`` (``s`` alone without ``compute_uv``), as ``jax.scipy.linalg.svd``."""
    del overwrite_a, check_finite, lapack_driver
    out = _d.svd(a, full_matrices=full_matrices, compute_uv=compute_uv)
    return tuple(out) if compute_uv else out


def schur(a, output="real"):
    """``(T, Z)`` with ``a = Z T Z^H``, as ``jax.scipy.linalg.schur`` (which has no derivative): the rules
    of ``derivations/schur.py`` (a loss must not depend on the phases of ``Z``'s columns; repeated
    eigenvalues, and the real form's ``2 x 2`` blocks, raise in the derivative)."""
    return _schur.schur(_d.as_inexact(a), output=output)


def polar(a, side="right", *, method="qdwh", eps=None, max_iterations=None):
    """``(unitary, posdef)``, as ``jax.scipy.linalg.polar``: the rules of ``derivations/polar.py``
    (no division by gaps: exact at repeated singular values, at an orthogonal ``a`` too); the forward
    is SciPy's on the host whatever ``method`` (``eps`` and ``max_iterations`` tune JAX's iteration
    only)."""
    del method, eps, max_iterations
    return _polar.polar(_d.as_inexact(a), side=side)


def solve_sylvester(A, B, C, *, method="schur", tol=1e-8):
    """``X`` with ``A X + X B = C``, as ``jax.scipy.linalg.solve_sylvester``, with the rules of
    ``derivations/solve_sylvester.py`` (one Sylvester solve in the derivative).  A singular equation
    (an eigenvalue of ``A`` the negative of one of ``B``) raises naming them where JAX returns NaN
    above ``tol``."""
    del method, tol
    return _solve_sylvester.solve_sylvester(*(_d.as_inexact(x) for x in (A, B, C)))


# the rest of jax.scipy.linalg as JAX has it, so that ``agj.scipy`` stands in for the namespace: matrix
# constructors, and factorizations whose JAX derivative divides by no gap (``cho_factor``, ``lu_factor``
# and their solves) or that JAX does not differentiate (``eigh_tridiagonal``, ``hessenberg``, ``funm``)
from jax.scipy.linalg import (  # noqa: E402
    block_diag, cho_factor, cho_solve, circulant, companion, convolution_matrix, dft, eigh_tridiagonal, expm_frechet,
    fiedler, fiedler_companion, funm, hadamard, hankel, helmert, hessenberg, hilbert, invhilbert, invpascal, leslie,
    lu_factor, lu_solve, pascal, qr_multiply, rsf2csf, toeplitz)

"""The ``_ex`` variants of ``adjointgen.torch`` (as ``torch.linalg``'s): the factorization and an
``info`` tensor (0 where it succeeded, else the LAPACK-style index of the failure) instead of an
error; ``check_errors=True`` raises as the plain function does."""
from __future__ import annotations

import torch

from ..runtime import routes as _routes
from . import cholesky, inv, lu_factor, solve


def cholesky_ex(A: torch.Tensor, *, upper: bool = False, check_errors: bool = False):
    """``(L, info)`` as :func:`torch.linalg.cholesky_ex`: ``info`` (int32, batch-shaped) is 0 where
    ``A`` is positive definite and the order of the first leading minor that is not otherwise.
    Where every matrix is positive definite ``L`` is :func:`cholesky`'s, with its derived rule;
    where one is not, ``check_errors=True`` raises :class:`adjointgen.NotPositiveDefiniteError`,
    and otherwise the result is torch's own, whose ``L`` (and gradient) are meaningful only where
    ``info == 0``, as in torch.

    Raises:
        ValueError: not a square floating matrix, NaN/Inf, not symmetric.
    """
    from ..runtime.checks import NotPositiveDefiniteError

    try:
        L = cholesky(A, upper=upper)
    except NotPositiveDefiniteError:
        if check_errors:
            raise
        _routes.taken("cholesky_ex", "torch")
        return torch.linalg.cholesky_ex(A, upper=upper)
    _routes.taken("cholesky_ex", "derived")
    return torch.return_types.linalg_cholesky_ex((L, torch.zeros(A.shape[:-2], dtype=torch.int32, device=A.device)))


def inv_ex(A: torch.Tensor, *, check_errors: bool = False):
    """``(inverse, info)`` as :func:`torch.linalg.inv_ex`: ``info`` (int32, batch-shaped) is 0 where
    ``A`` is invertible and the index of the first zero pivot of its LU factorization otherwise.
    Where every matrix is invertible the inverse is :func:`inv`'s, with its derived rule; where one
    is not, ``check_errors=True`` raises :class:`adjointgen.SingularMatrixError`, and otherwise the
    result is torch's own (meaningful only where ``info == 0``, as in torch).

    Raises:
        ValueError: not a square floating matrix, NaN/Inf.
    """
    from ..runtime.checks import SingularMatrixError

    try:
        X = inv(A)
    except SingularMatrixError:
        if check_errors:
            raise
        _routes.taken("inv_ex", "torch")
        return torch.linalg.inv_ex(A)
    _routes.taken("inv_ex", "derived")
    return torch.return_types.linalg_inv_ex((X, torch.zeros(A.shape[:-2], dtype=torch.int32, device=A.device)))


def solve_ex(A: torch.Tensor, B: torch.Tensor, *, left: bool = True, check_errors: bool = False):
    """``(result, info)`` as :func:`torch.linalg.solve_ex`: ``info`` (int32, batch-shaped) is 0 where
    ``A`` is invertible and the index of the first zero pivot of its LU factorization otherwise.
    Where every ``A`` is invertible the result is :func:`solve`'s, with its derived rule; where one is
    not, ``check_errors=True`` raises :class:`adjointgen.SingularMatrixError`, and otherwise the result
    is torch's own (meaningful only where ``info == 0``, as in torch).

    Raises:
        ValueError: as :func:`solve` (shapes, NaN/Inf, dtypes).
    """
    from ..runtime.checks import SingularMatrixError

    try:
        X = solve(A, B, left=left)
    except SingularMatrixError:
        if check_errors:
            raise
        _routes.taken("solve_ex", "torch")
        return torch.linalg.solve_ex(A, B, left=left)
    _routes.taken("solve_ex", "derived")
    # torch's info has A's batch shape (one LU per A), also where B broadcasts it
    return torch.return_types.linalg_solve_ex((X, torch.zeros(A.shape[:-2], dtype=torch.int32, device=A.device)))


def lu_factor_ex(A: torch.Tensor, *, pivot: bool = True, check_errors: bool = False):
    """``(LU, pivots, info)`` as :func:`torch.linalg.lu_factor_ex`: ``info`` (int32, batch-shaped) is 0
    where ``U`` has no zero pivot and the index of the first one otherwise.  Where no ``U`` has one
    the factors are :func:`lu_factor`'s, with the derived rules of :func:`lu`; where one has,
    ``check_errors=True`` raises :class:`adjointgen.SingularMatrixError`, and otherwise the result is
    torch's own (the factorization exists, but a derivative through ``U^-1`` does not).

    Raises:
        ValueError: as :func:`lu_factor` (not floating, NaN/Inf).
    """
    from ..runtime.checks import SingularMatrixError

    try:
        LU, pivots = lu_factor(A, pivot=pivot)
    except SingularMatrixError:
        if check_errors:
            raise
        _routes.taken("lu_factor_ex", "torch")
        return torch.linalg.lu_factor_ex(A, pivot=pivot)
    _routes.taken("lu_factor_ex", "derived")
    info = torch.zeros(A.shape[:-2], dtype=torch.int32, device=A.device)
    return torch.return_types.linalg_lu_factor_ex((LU, pivots, info))

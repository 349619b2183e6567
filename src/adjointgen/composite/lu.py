"""Autograd glue for ``lu(A)`` of any shape: the square rules of ``derivations/lu.py`` applied to a
square completion of the factors, and the pivot check.

A tall ``A`` (m > n) is the first n columns of ``A_ext = [A | P E]`` (``E`` the last m - n columns
of the identity), whose factorization with the same ``P`` is ``L_ext = [L | E]``,
``U_ext = diag(U, I)``; a wide ``A`` (m < n) is the first m rows of ``A_ext = [A; 0 I]`` with
``P_ext = diag(P, I)``, ``L_ext = diag(L, I)``, ``U_ext = [U; 0 I]``.  With ``P`` held fixed (it is
piecewise constant) the factorization of ``A_ext`` is unique, so the square rule's tangents of
``A_ext`` along ``[dA | 0]`` (``[dA; 0]``) restricted to ``L``'s and ``U``'s blocks are those of
``A``, and its cotangent's first columns (rows) are ``A``'s.  The square rules cost ``O(max(m, n)^3)``
here, not ``O(m n min(m, n))``.
"""
from __future__ import annotations

import torch

from ..generated.torch import lu as square
from ..runtime import dispatch as _dispatch
from ..runtime.checks import SingularMatrixError, is_traced, vmap_as_batch
from ..runtime import function as _function
from ..runtime.function import nested_forward as _nested_forward
from ..runtime.verdict import verdict


def check_pivots(U, what: str = "the derivative of the LU factors needs nonzero pivots", L=None) -> None:
    """Raise :class:`SingularMatrixError` where ``U`` (``(..., k, n)``) has a zero on its diagonal,
    or (with ``L``) one at the level of the elimination's rounding: there the rules divide by the
    pivot (``U^-1``), and the factors of a rank-deficient ``A`` are not differentiable in general.

    The rounding level of pivot ``k`` is ``k eps (|L| |U|)_kk`` (the componentwise backward error of
    Gaussian elimination): a pivot below it has no correct digits (a matrix of rank ``r`` factors with
    pivots of size ``eps`` after the ``r``-th), and neither has a derivative that divides by it.  A
    graded matrix (``diag(1, 1e-20)``) has small pivots that are exact, and passes."""
    pivots = U.diagonal(dim1=-2, dim2=-1)
    if is_traced(pivots) or pivots.numel() == 0:
        return
    zero = pivots == 0

    def zero_pivot():
        bad = zero.nonzero()[0].tolist()
        where = f" (batch index {tuple(bad[:-1])})" if len(bad) > 1 else ""
        return SingularMatrixError(f"lu: {what}, and U[{bad[-1]}, {bad[-1]}] is zero{where}: A is rank deficient")

    verdict(zero, zero_pivot)
    if L is None or is_traced(L):
        return
    k = pivots.shape[-1]
    with torch.no_grad():
        size = (L.detach().abs()[..., :k, :k] * U.detach().abs()[..., :k, :k].mT).sum(-1)  # (|L| |U|)_kk
        real = pivots.real.dtype if pivots.is_complex() else pivots.dtype
        level = torch.arange(1, k + 1, device=U.device, dtype=real) * torch.finfo(real).eps * size
        noise = (pivots.detach().abs() <= level) & ~zero

    def rounding_pivot():
        bad = noise.nonzero()[0].tolist()
        index = tuple(bad[:-1])
        where = f" (batch index {index})" if len(bad) > 1 else ""
        pivot, scale = float(pivots.detach().abs()[tuple(bad)]), float(size[tuple(bad)])
        return SingularMatrixError(
            f"lu: {what}, and U[{bad[-1]}, {bad[-1]}] = {pivot:.2e}{where} is at the level of the "
            f"elimination's rounding ({bad[-1] + 1} eps (|L||U|)_kk = {float(level[tuple(bad)]):.2e}; "
            f"condition estimate {scale / max(pivot, 1e-300):.2e}): A is numerically rank deficient, "
            "and a derivative that divides by this pivot has no correct digits")

    verdict(noise, rounding_pivot)


def _eye_like(X, size):
    return torch.eye(size, dtype=X.dtype, device=X.device).expand(*X.shape[:-2], size, size)


def _zeros(X, rows, cols):
    return X.new_zeros((*X.shape[:-2], rows, cols))


def _block_diagonal(X, size):
    """``diag(X, 0_size)`` for square ``X``."""
    k = X.shape[-1]
    return torch.cat([torch.cat([X, _zeros(X, k, size)], -1),
                      torch.cat([_zeros(X, size, k), _zeros(X, size, size)], -1)], -2)


def _completed(P, L, U):
    """``(P_ext, L_ext, U_ext)`` of the square completion (see the module docstring)."""
    m, k = L.shape[-2:]
    n = U.shape[-1]
    if m > n:
        L_ext = torch.cat([L, torch.cat([_zeros(L, n, m - n), _eye_like(L, m - n)], -2)], -1)
        U_ext = _block_diagonal(U, m - n) + torch.cat([_zeros(U, n, m), torch.cat([_zeros(U, m - n, n), _eye_like(U, m - n)], -1)], -2)
        return P, L_ext, U_ext
    if m < n:
        eye = _eye_like(L, n - m)
        P_ext = _block_diagonal(P, n - m) + torch.cat([_zeros(P, m, n), torch.cat([_zeros(P, n - m, m), eye], -1)], -2)
        L_ext = _block_diagonal(L, n - m) + torch.cat([_zeros(L, m, n), torch.cat([_zeros(L, n - m, m), eye], -1)], -2)
        U_ext = torch.cat([U, torch.cat([_zeros(U, n - m, m), eye], -1)], -2)
        return P_ext, L_ext, U_ext
    return P, L, U


def _vjp(P, L, U, gL, gU):
    m, k = L.shape[-2:]
    n = U.shape[-1]
    rule = _dispatch.for_data(L, square.lu_vjp, square.lu_vjp_complex)
    if m == n:
        return rule(P, L, U, gL, gU)
    P_ext, L_ext, U_ext = _completed(P, L, U)
    size = max(m, n)
    gL_ext = torch.cat([gL, _zeros(gL, m, size - k)], -1) if m > n else _block_diagonal(gL, n - m)
    gU_ext = _block_diagonal(gU, m - n) if m > n else torch.cat([gU, _zeros(gU, n - m, n)], -2)
    gA = rule(P_ext, L_ext, U_ext, gL_ext, gU_ext)
    return gA[..., :, :n] if m > n else gA[..., :m, :]


def _jvp(P, L, U, dA):
    m, k = L.shape[-2:]
    n = U.shape[-1]
    rule = _dispatch.for_data(L, square.lu_jvp, square.lu_jvp_complex)
    if m == n:
        return rule(P, L, U, dA)
    P_ext, L_ext, U_ext = _completed(P, L, U)
    dA_ext = torch.cat([dA, _zeros(dA, m, m - n)], -1) if m > n else torch.cat([dA, _zeros(dA, n - m, n)], -2)
    dL, dU = rule(P_ext, L_ext, U_ext, dA_ext)
    if m > n:
        return dL[..., :, :n], dU[..., :n, :n]
    return dL[..., :m, :m], dU[..., :m, :]


class LuFunction(_function.Function):
    """``(P, L, U, pivots) = lu(A)`` for ``(..., m, n)`` ``A``, real or complex, from
    ``torch.linalg.lu_factor``; ``P`` and LAPACK's ``pivots`` are not differentiable.  With
    ``pivot=False`` (CUDA only, as torch) ``P`` is empty, as ``torch.linalg.lu`` returns it, and the
    rules take ``P = I``."""

    @staticmethod
    def forward(A, pivot=True):
        LU, pivots, _ = torch.linalg.lu_factor_ex(A, pivot=pivot)  # pivot=False on the CPU: torch's error
        P, L, U = torch.lu_unpack(LU, pivots, unpack_pivots=pivot)
        return P, L, U, pivots

    @staticmethod
    def setup_context(ctx, inputs, output):
        P, L, U, pivots = output
        ctx.mark_non_differentiable(P, pivots)
        ctx.save_for_backward(P, L, U)
        ctx.save_for_forward(P, L, U)

    @staticmethod
    def backward(ctx, gP, gL, gU, gpivots):
        P, L, U = ctx.saved_tensors
        check_pivots(U, L=L)
        gL = torch.zeros_like(L) if gL is None else gL
        gU = torch.zeros_like(U) if gU is None else gU
        return _vjp(_permutation(P, L), L, U, gL, gU), None

    @staticmethod
    @_nested_forward
    def jvp(ctx, dA, _):
        P, L, U = ctx.saved_tensors
        check_pivots(U, L=L)
        dL, dU = _jvp(_permutation(P, L), L, U, dA)
        return None, dL, dU, None

    @staticmethod
    def vmap(info, in_dims, A, pivot=True):
        return vmap_as_batch(LuFunction, info, in_dims, A, pivot)


#: the function without ``jvp``, which ``torch.compile`` traces
LuFunctionCompiled = LuFunction._for_compiler

def _permutation(P, L):
    """``P`` of ``A = P L U``: the identity where the factorization did not pivot (``P`` empty)."""
    if P.numel() or L.numel() == 0:
        return P
    m = L.shape[-2]
    return _eye_like(L, m).expand(*L.shape[:-2], m, m)


def packed(L, U):
    """``LU`` as ``torch.linalg.lu_factor`` packs it: ``L``'s strictly lower part and ``U`` in one
    ``(..., m, n)`` matrix (differentiable: a sum of zero-padded triangles)."""
    m, k = L.shape[-2:]
    n = U.shape[-1]
    low = L.tril(-1)
    if n > k:
        low = torch.cat([low, _zeros(L, m, n - k)], -1)
    if m > k:
        U = torch.cat([U, _zeros(U, m - k, n)], -2)
    return low + U


def unpacked(LU, pivots):
    """``(P, L, U)`` of a square packed ``LU`` (``P`` from the pivots, not differentiable; ``L``
    and ``U`` differentiable in ``LU``)."""
    P, _, _ = torch.lu_unpack(LU.detach(), pivots, unpack_data=False)
    n = LU.shape[-1]
    L = LU.tril(-1) + torch.eye(n, dtype=LU.dtype, device=LU.device)
    return P.to(LU.dtype), L, LU.triu()

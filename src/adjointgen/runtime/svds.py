"""Autograd glue for the truncated SVD ``svds(A, k)``: forward by the partial eigensolver on the
Gram operator, backward and forward mode by the rules derived in ``derivations/svds.py``.

The rules multiply by ``A``, by ``A^T`` and solve with ``A^T A - s_i^2 I`` on the complement of
span(V).  :class:`GramView` lets the generated code write ``A.mT @ A`` while the product stays
matrix-free (a :class:`LinearOperator`) beyond the size where the direct bordered solve is used.
"""
from __future__ import annotations

import torch

from ..generated.torch import svds as rules
from .eigsolvers import partial_eigh
from .linear_operator import LinearOperator
from .solvers import DENSE_DIRECT_MAX_N, backward_tol, solve_options


class GramView:
    """A dense matrix (or its transpose) whose product with another view is a lazy operator.

    ``view.mT`` is the transposed view; ``view @ tensor`` is the dense product; ``view @ view`` is
    the Gram operator ``X -> L (R X)`` — dense when small enough for the direct solve."""

    def __init__(self, A: torch.Tensor, transposed: bool = False):
        self.A = A
        self.transposed = transposed

    @property
    def mT(self) -> "GramView":
        return GramView(self.A, not self.transposed)

    def dense(self) -> torch.Tensor:
        return self.A.mT if self.transposed else self.A

    def __matmul__(self, other):
        left = self.dense()
        if not isinstance(other, GramView):
            return left @ other
        right = other.dense()
        if right.shape[-1] <= DENSE_DIRECT_MAX_N:
            return left @ right
        return LinearOperator(lambda X, L, R: L @ (R @ X), (left.shape[-2], right.shape[-1]),
                              params=(left, right), dtype=left.dtype, device=left.device, symmetric=True)


class SvdsFunction(torch.autograd.Function):
    """``(U, S, V) = svds(A, k)`` for one tall (m >= n) matrix; ``V`` is n×k."""

    @staticmethod
    def forward(A, k, largest, tol, maxiter):
        n = A.shape[-1]
        gram = LinearOperator(lambda X, A_: A_.mT @ (A_ @ X), (n, n), params=(A,), dtype=A.dtype, device=A.device)
        w, V, _ = partial_eigh(gram, k, None, largest=largest, tol=tol, maxiter=maxiter)
        S = w.clamp_min(0).sqrt()
        U = (A @ V) / S
        return U, S, V

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, k, largest, tol, maxiter = inputs
        ctx.tol = tol
        ctx.save_for_backward(A, *output)
        ctx.save_for_forward(A, *output)

    @staticmethod
    def backward(ctx, gU, gS, gV):
        A, U, S, V = ctx.saved_tensors
        gU = torch.zeros_like(U) if gU is None else gU
        gS = torch.zeros_like(S) if gS is None else gS
        gV = torch.zeros_like(V) if gV is None else gV
        with solve_options(tol=backward_tol(ctx.tol, S.dtype)):
            gA = rules.svds_vjp(GramView(A), U, S, V, gU, gS, gV)
        return gA, None, None, None, None

    @staticmethod
    def jvp(ctx, dA, *_):
        A, U, S, V = ctx.saved_tensors
        with solve_options(tol=backward_tol(ctx.tol, S.dtype)):
            return rules.svds_jvp(GramView(A), U, S, V, dA)

"""Autograd glue for the truncated SVD ``svds(A, k)``: forward by the partial eigensolver on the
Gram matrix, backward and forward mode by the rules derived in ``derivations/svds.py``.

The rules multiply by ``A``, by ``A^T`` and solve with ``A^T A - s_i^2 I`` on the complement of
span(V).  :class:`GramView` lets the generated code write ``A.mT @ A``.

Forward: for ``n <= GRAM_MAX_N`` the Gram matrix ``G = A^T A`` is formed once (one GEMM, ``2 m n^2``
flops) and handed to :func:`partial_eigh` as a dense matrix: its block Lanczos route on
``(sigma I - G)^{-1}`` is much cheaper than Lanczos on the operator ``X -> A^T (A X)`` (each product
streams the m x n matrix twice), its eigenvalue count is certified by a Cholesky factorization, and
that factorization plus the extra Ritz vectors precondition the backward's shifted solves
(:class:`~adjointgen.runtime.linsolve.DenseFactorAid`). Measured on 2 CPU threads, 4000 x 2000 float64,
k = 16 (see ``benchmarks/bench_svd.py``). Beyond ``GRAM_MAX_N`` the Gram operator stays matrix-free.
Forming ``G`` squares the condition number exactly as the Gram operator does: singular values below
``sqrt(eps) * S[0]`` lose relative accuracy either way.

Backward: the generated rule's ``A.mT @ A`` is the stored ``G`` for ``n > 400`` (an iterative solve,
first derivatives only, as before); for ``n <= 400`` it is recomputed in the graph, so the exact
bordered solve stays differentiable twice.
"""
from __future__ import annotations

import torch

from ..generated.torch import svds as rules
from .eigsolvers import partial_eigh
from .linear_operator import LinearOperator
from .solvers import DENSE_DIRECT_MAX_N, backward_tol, solve_options

#: tall matrices with at most this many columns form the Gram matrix A^T A in the forward
GRAM_MAX_N = 4000


class GramView:
    """A dense matrix (or its transpose) whose product with another view is the Gram matrix.

    ``view.mT`` is the transposed view; ``view @ tensor`` is the dense product; ``view @ view`` is
    ``L R``: dense when small enough for the direct solve (computed in the graph), the stored Gram
    matrix ``gram`` (``A^T A``, computed without a graph in the forward) when there is one and no
    graph is being recorded, else the lazy operator ``X -> L (R X)``."""

    def __init__(self, A: torch.Tensor, transposed: bool = False, gram: torch.Tensor | None = None):
        self.A = A
        self.transposed = transposed
        self.gram = gram

    @property
    def mT(self) -> "GramView":
        return GramView(self.A, not self.transposed, self.gram)

    def dense(self) -> torch.Tensor:
        return self.A.mT if self.transposed else self.A

    def __matmul__(self, other):
        left = self.dense()
        if not isinstance(other, GramView):
            return left @ other
        right = other.dense()
        if right.shape[-1] <= DENSE_DIRECT_MAX_N:
            return left @ right
        recording = torch.is_grad_enabled() and (self.A.requires_grad or other.A.requires_grad)
        if (self.gram is not None and self.transposed and not other.transposed and other.A is self.A
                and not recording):
            return self.gram
        return LinearOperator(lambda X, L, R: L @ (R @ X), (left.shape[-2], right.shape[-1]),
                              params=(left, right), dtype=left.dtype, device=left.device, symmetric=True)


class _SvdsCore(torch.autograd.Function):
    """``(U, S, V, G, aid) = svds(A, k)`` for one tall (m >= n) matrix; ``V`` is n×k, ``G`` the Gram
    matrix (or ``None``) and ``aid`` the backward's preconditioner, both non-differentiable."""

    @staticmethod
    def forward(A, k, largest, tol, maxiter):
        n = A.shape[-1]
        gram = None
        if n <= GRAM_MAX_N:
            gram = A.mT @ A
            gram = (gram + gram.mT) / 2
            w, V, info = partial_eigh(gram, k, None, largest=largest, tol=tol, maxiter=maxiter)
        else:
            operator = LinearOperator(lambda X, A_: A_.mT @ (A_ @ X), (n, n), params=(A,), dtype=A.dtype,
                                      device=A.device)
            w, V, info = partial_eigh(operator, k, None, largest=largest, tol=tol, maxiter=maxiter)
        S = w.clamp_min(0).sqrt()
        U = (A @ V) / S
        return U, S, V, gram, info.aid

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, k, largest, tol, maxiter = inputs
        U, S, V, gram, aid = output
        if gram is not None:
            ctx.mark_non_differentiable(gram)
        ctx.tol = tol
        ctx.gram = gram
        ctx.aid = aid
        ctx.save_for_backward(A, U, S, V)
        ctx.save_for_forward(A, U, S, V)

    @staticmethod
    def backward(ctx, gU, gS, gV, _ggram=None, _gaid=None):
        A, U, S, V = ctx.saved_tensors
        gU = torch.zeros_like(U) if gU is None else gU
        gS = torch.zeros_like(S) if gS is None else gS
        gV = torch.zeros_like(V) if gV is None else gV
        with solve_options(tol=backward_tol(ctx.tol, S.dtype), aid=ctx.aid):
            gA = rules.svds_vjp(GramView(A, gram=ctx.gram), U, S, V, gU, gS, gV)
        return gA, None, None, None, None

    @staticmethod
    def jvp(ctx, dA, *_):
        A, U, S, V = ctx.saved_tensors
        with solve_options(tol=backward_tol(ctx.tol, S.dtype), aid=ctx.aid):
            dU, dS, dV = rules.svds_jvp(GramView(A, gram=ctx.gram), U, S, V, dA)
        return dU, dS, dV, None, None


class SvdsFunction:
    """``(U, S, V) = SvdsFunction.apply(A, k, largest, tol, maxiter)`` for one tall matrix."""

    @staticmethod
    def apply(A, k, largest, tol, maxiter):
        U, S, V, _gram, _aid = _SvdsCore.apply(A, k, largest, tol, maxiter)
        return U, S, V

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
from ..runtime import completion as _completion
from ..runtime import degeneracy as _degeneracy
from ..runtime import gauge as _gauge
from ..runtime import linalg as _linalg
from ..runtime import value_blocks as _value_blocks
from ..runtime.eigsolvers import partial_eigh
from ..runtime.linear_operator import LinearOperator
from ..runtime.solvers import DENSE_DIRECT_MAX_N, backward_tol, solve_options
from .eigsh import _Cut
from ..runtime.function import nested_forward as _nested_forward

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
    """``(U, S, V, G, info, cut) = svds(A, k)`` for one tall (m >= n) matrix; ``V`` is n×k, ``G`` the
    Gram matrix (or ``None``), ``info`` the partial eigensolver's
    :class:`~adjointgen.runtime.eigsolvers.PartialEighInfo` for the Gram matrix (its ``aid``
    preconditions the backward) and ``cut`` the kept pairs of a cluster that ``k`` cuts
    (:class:`_Cut`), all non-differentiable."""

    @staticmethod
    def forward(A, k, largest, tol, maxiter):
        from ..runtime.checks import is_traced

        if is_traced(A):
            # meta, fake: no values for the partial solvers; a compiler runs what is traced here, so it is
            # the dense solution, in svds' order (descending when largest, else ascending) and with the
            # partial solver's signs (the largest entry of each right vector positive)
            U, S, Vh = torch.linalg.svd(A, full_matrices=False)
            if largest:
                U, S, V = U[..., :k], S[..., :k], Vh.mT[..., :k]
            else:
                U, S, V = U[..., -k:].flip(-1), S[..., -k:].flip(-1), Vh.mT[..., -k:].flip(-1)
            index = V.abs().argmax(dim=-2, keepdim=True)
            sign = torch.sign(torch.gather(V, -2, index))
            sign = torch.where(sign == 0, torch.ones_like(sign), sign)
            return (U * sign).clone(), S.clone(), (V * sign).clone(), None, None, _Cut(())
        n = A.shape[-1]
        gram = None
        if n <= GRAM_MAX_N:
            gram = _linalg.gram(A)  # (BLAS's rank-k update on the CPU: half the flops of A^T @ A)
            w, V, info = partial_eigh(gram, k, None, largest=largest, tol=tol, maxiter=maxiter)
        else:
            operator = LinearOperator(lambda X, A_: A_.mT @ (A_ @ X), (n, n), params=(A,), dtype=A.dtype,
                                      device=A.device)
            w, V, info = partial_eigh(operator, k, None, largest=largest, tol=tol, maxiter=maxiter)
        S = w.clamp_min(0).sqrt()
        U = _left_vectors(A, V, S)
        U, V = _degeneracy.generic_basis(S, U, V)
        return U, S, V, gram, info, _Cut(tuple(info.split))

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, k, largest, tol, maxiter = inputs
        U, S, V, gram, info, cut = output
        if gram is not None:
            ctx.mark_non_differentiable(gram)
        ctx.tol = tol
        ctx.gram = gram
        ctx.aid = None if info is None else info.aid
        ctx.k = k
        ctx.largest = largest
        ctx.split = cut.split
        ctx.save_for_backward(A, U, S, V)
        ctx.save_for_forward(A, U, S, V)

    @staticmethod
    def backward(ctx, gU, gS, gV, _ggram=None, _ginfo=None, _gcut=None):
        A, U, S, V = ctx.saved_tensors
        if ctx.split:
            _degeneracy.check_cut("svds", ctx.k, ctx.largest, S, ctx.split, (gS, gU, gV), what="singular values")
        gU = torch.zeros_like(U) if gU is None else gU
        gS = torch.zeros_like(S) if gS is None else gS
        gV = torch.zeros_like(V) if gV is None else gV
        from ..runtime.checks import per_element

        (gA,) = per_element(lambda *t: (_backward(ctx, *t),), A, U, S, V, gU, gS, gV)
        return gA, None, None, None, None

    @staticmethod
    def vmap(info, in_dims, A, k, largest, tol, maxiter):
        from ..runtime.checks import vmap_by_loop

        return vmap_by_loop(_SvdsCore, info, in_dims, A, k, largest, tol, maxiter)

    @staticmethod
    @_nested_forward
    def jvp(ctx, dA, *_):
        A, U, S, V = ctx.saved_tensors
        if ctx.split:
            _degeneracy.check_cut("svds", ctx.k, ctx.largest, S, ctx.split, None, what="singular values")
        with solve_options(tol=backward_tol(ctx.tol, S.dtype), aid=ctx.aid):
            dU, dS, dV = rules.svds_jvp(GramView(A, gram=ctx.gram), U, S, V, dA)
        return dU, dS, dV, None, None, None


def _backward(ctx, A, U, S, V, gU, gS, gV):
    """``gA`` of one problem: the cluster checks (a loss through ``U f(S) V^H`` completed), then the
    derived rule."""
    if _gauge.enabled() and _degeneracy.has_clusters(S):
        U, V, gS, gU, gV = _completion.complete("svds", S, (U, V), gS, (gU, gV), what="singular values")
        residual = rules.svds_gauge_clusters(U, S, V, gU, gV)
        split = None if _degeneracy.completing(S) else gS  # (not re-expressed: deferred checks)
        _degeneracy.check("svds", residual, _degeneracy.cluster_mask(S), split, gU, gV, what="singular values",
                          values=S, gd=gS)
    gram = ctx.gram if ctx.gram is not None and ctx.gram.shape == (A.shape[-1],) * 2 else None
    with solve_options(tol=backward_tol(ctx.tol, S.dtype), aid=ctx.aid):
        if not (_gauge.enabled() and _degeneracy.has_clusters(S)):
            return rules.svds_vjp(GramView(A, gram=gram), U, S, V, gU, gS, gV)
        # a second derivative at a cluster moves the singular values as a block (runtime.value_blocks)
        with _value_blocks.second_order("svds", rules.VALUE_BLOCK, dict(U=U, S=S, V=V, A=A), gS, (gU, gV)) as prepared:
            gS, (gU, gV) = prepared.values_cotangent, prepared.cotangents
            gA = rules.svds_vjp(GramView(A, gram=gram), U, S, V, gU, gS, gV)
        return prepared.add((gA,))[0]


def _left_vectors(A, V, S):
    """``U = A V S^-1``; the columns of (numerically) zero singular values -- any orthonormal vectors
    orthogonal to the others -- completed from the QR factorization of ``[U_kept, I]``."""
    zero = _degeneracy.zero_mask(S)
    U = (A @ V) / torch.where(zero, 1, S)
    if not bool(zero.any()):
        return U
    keep = ~zero
    m = A.shape[-2]
    basis = torch.cat([U[:, keep], torch.eye(m, dtype=U.dtype, device=U.device)], dim=-1)
    Q, _ = torch.linalg.qr(basis)
    U = U.clone()
    U[:, zero] = Q[:, int(keep.sum()):int(keep.sum()) + int(zero.sum())]
    return U


class SvdsFunction:
    """``(U, S, V) = SvdsFunction.apply(A, k, largest, tol, maxiter)`` for one tall matrix."""

    @staticmethod
    def apply(A, k, largest, tol, maxiter, return_info=False):
        U, S, V, _gram, info, _cut = _SvdsCore.apply(A, k, largest, tol, maxiter)
        return (U, S, V, info) if return_info else (U, S, V)

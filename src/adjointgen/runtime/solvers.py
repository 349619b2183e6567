"""The projected shifted solve ``S`` that generated rules call (``_solvers.shifted_solve``).

Column ``i`` of ``S(X)`` is ``w_i`` with ``P (A - d_i B) w_i = P x_i`` and ``U^T B w_i = 0``,
``P = I - B U U^T`` (``^T``: the conjugate transpose for complex Hermitian data).  Small dense problems use the exact bordered solve (differentiable, so second
derivatives work); larger or matrix-free ones use block CG/MINRES on ``P X`` to the tolerance set by
:func:`solve_options` (the partial eigensolver sets it from its own tolerance), preconditioned by
the factorization the forward eigensolver certified its count with, and deflated by its extra Ritz
vectors, when it left them (``solve_options(aid=...)``, :class:`~adjointgen.runtime.linsolve.ShiftedSolveAid`).
"""
from __future__ import annotations

import contextlib
import contextvars

import torch

from .linear_operator import LinearOperator, as_operator
from .linsolve import solve_projected_shifted, solve_projected_shifted_dense

#: dense problems up to this size use the direct bordered solve
DENSE_DIRECT_MAX_N = 400

_options: contextvars.ContextVar = contextvars.ContextVar("adjointgen_solve_options", default={})


@contextlib.contextmanager
def solve_options(**options):
    """Options for the iterative solves inside: ``tol`` (relative residual per column),
    ``maxiter``, ``direct`` (force or forbid the bordered dense solve), ``aid`` (a
    :class:`~adjointgen.runtime.linsolve.ShiftedSolveAid` left by the forward eigensolver for these
    eigenpairs: it preconditions the iterative solve when its shape and shifts match)."""
    token = _options.set({**_options.get(), **{k: v for k, v in options.items() if v is not None}})
    try:
        yield
    finally:
        _options.reset(token)


def default_tol(dtype) -> float:
    return 1e-11 if dtype in (torch.float64, torch.complex128) else 1e-5


def backward_tol(forward_tol, dtype) -> float:
    """The backward solves' tolerance, tied to the forward's (never looser than it)."""
    base = default_tol(dtype)
    return base if forward_tol is None else min(base, float(forward_tol))


def _is_dense(x) -> bool:
    return isinstance(x, torch.Tensor) and x.layout == torch.strided


def shifted_solve(A, B, U, d, X):
    """``S(X)`` for dense tensors (batched), torch sparse matrices or :class:`LinearOperator`.

    Inside a declared block of the values ``d`` (a second derivative at a cluster,
    :mod:`~adjointgen.runtime.value_blocks`) the derivative in ``d`` goes through the block:
    column ``i`` moves with ``d_i`` as ``S(B S(X))_i``, one more solve (times ``d_i'`` where the
    shifts are a function of the values, ``S_i^2`` in the partial SVD's)."""
    from .value_blocks import active_for, block_term, shift_derivative

    active, dshift = active_for(d), None
    if active is None:
        active, dshift = shift_derivative(d)
    if active is not None:
        fixed = d.detach()
        Y = shifted_solve(A, B, U, fixed, X)
        with torch.no_grad():
            D = shifted_solve(A, B, U, fixed, Y if B is None else B @ Y)
            D = D if dshift is None else D * dshift.unsqueeze(-2).to(D.dtype)
        return Y + block_term(D, active)
    opts = _options.get()
    n = U.shape[-2]
    dense = _is_dense(A) and (B is None or _is_dense(B))
    direct = opts.get("direct", dense and n <= DENSE_DIRECT_MAX_N)
    if direct:
        if not dense:
            raise ValueError("the direct bordered solve needs dense A and B")
        return solve_projected_shifted_dense(A, B, U, d, X)
    if U.dim() > 2:  # a batch of dense problems: one iterative solve each
        batch = U.shape[:-2]
        flat = lambda t: t.expand(*batch, *t.shape[-2:]).reshape(-1, *t.shape[-2:])
        Af, Uf, Xf = flat(A), flat(U), flat(X)
        df = d.expand(*batch, d.shape[-1]).reshape(-1, d.shape[-1])
        Bf = None if B is None else flat(B)
        out = [shifted_solve(Af[i], None if Bf is None else Bf[i], Uf[i], df[i], Xf[i]) for i in range(Uf.shape[0])]
        return torch.stack(out).reshape(X.shape)
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (A, B, U, d, X)):
        return _IterativeShiftedSolve.apply(A, B, U, d, X, dict(opts))
    return _iterative(A, B, U, d, X, opts)


def _iterative(A, B, U, d, X, opts):
    opA = A if isinstance(A, LinearOperator) else as_operator(A)
    opB = None if B is None else (B if isinstance(B, LinearOperator) else as_operator(B))
    BU = U if opB is None else opB.matmul(U)
    R = X - BU @ (U.mH @ X)  # P X
    # twice: a column of X (nearly) inside span(U) (a loss on the vectors of an eigenvector that is
    # constant, say) leaves rounding of size eps |X| along U after one projection, which no solve
    # in the complement can match (the relative residual then stalls or the iterate blows up)
    R = R - BU @ (U.mH @ R)
    tol = opts.get("tol", default_tol(X.dtype))
    preconditioner = None
    aid = opts.get("aid")
    if aid is not None and aid.matches(U, d):
        if hasattr(aid, "solve"):  # the full spectrum is known: the solve is exact
            return aid.solve(U, d, R)
        preconditioner = aid.preconditioner(opA, opB, U, BU, d)
    return solve_projected_shifted(opA, opB, U, BU, d, R, tol=tol, maxiter=opts.get("maxiter"),
                                   preconditioner=preconditioner)


class _IterativeShiftedSolve(torch.autograd.Function):
    """``S(X)`` by block CG with the exact derivative in ``X`` (``S`` is self-adjoint, so the
    cotangent of ``X`` is ``S(g)``).  Differentiating an iterative solve with respect to the
    operator (``A``, ``B``, ``U``, shifts) would differentiate the iterate, not the solution; that is
    refused with an error rather than returned inaccurate."""

    @staticmethod
    def forward(ctx, A, B, U, d, X, opts):
        ctx.operands = (A, B, U, d)
        ctx.opts = opts
        ctx.save_for_backward(*[t for t in (U, d) if isinstance(t, torch.Tensor)])
        with torch.no_grad():
            return _iterative(A, B, U, d, X, opts)

    @staticmethod
    def backward(ctx, g):
        A, B, U, d = ctx.operands
        if any(ctx.needs_input_grad[:4]):
            raise RuntimeError(
                "second derivatives through the iterative projected shifted solve (dense n > "
                f"{DENSE_DIRECT_MAX_N}, sparse or matrix-free input) are not supported; use a dense "
                f"input with n <= {DENSE_DIRECT_MAX_N} (exact bordered solve) for higher derivatives")
        with torch.no_grad():
            return None, None, None, None, _iterative(A, B, U.detach(), d.detach(), g, ctx.opts), None

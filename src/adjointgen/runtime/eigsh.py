"""Autograd glue for the partial eigensolver: forward by :func:`partial_eigh`, backward and forward
mode by the generated rules of ``derivations/eigsh.py`` and ``derivations/eigsh_generalized.py``.

Dense inputs get the dense cotangent ``gA = sym(...)`` from ``eigsh_vjp``.  Sparse and matrix-free
inputs get the low-rank form ``gA = sym(L R^T)`` from ``eigsh_vjp_factors``: gathered on the
sparsity pattern in O(nnz k), or pushed through the operator's matvec to its parameters — never an
n×n dense tensor.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..generated.torch import eigsh as rules
from ..generated.torch import eigsh_generalized as rules_generalized
from .eigsolvers import partial_eigh
from .linear_operator import LinearOperator, sparse_lowrank_pattern_grad
from .solvers import backward_tol, solve_options


@dataclass(frozen=True)
class _Spec:
    k: int
    largest: bool
    tol: float | None
    maxiter: int | None
    A_op: LinearOperator | None  # set when A is a LinearOperator (its params follow A, B)
    B_op: LinearOperator | None
    n_params_A: int


def _dense(x) -> bool:
    return isinstance(x, torch.Tensor) and x.layout == torch.strided


def _operator(spec, A, B, params):
    """The operators with the current parameter tensors (the Function's inputs)."""
    opA = A
    if spec.A_op is not None:
        opA = LinearOperator(spec.A_op._matvec, spec.A_op.shape, params=tuple(params[: spec.n_params_A]),
                             dtype=spec.A_op.dtype, device=spec.A_op.device)
    opB = B
    if spec.B_op is not None:
        opB = LinearOperator(spec.B_op._matvec, spec.B_op.shape, params=tuple(params[spec.n_params_A:]),
                             dtype=spec.B_op.dtype, device=spec.B_op.device)
    return opA, opB


class EigshFunction(torch.autograd.Function):
    """``(w, V) = eigsh(A, k, B)`` for one (unbatched) problem."""

    @staticmethod
    def forward(spec, A, B, *params):
        opA, opB = _operator(spec, A, B, params)
        w, V, _ = partial_eigh(opA, spec.k, opB, largest=spec.largest, tol=spec.tol, maxiter=spec.maxiter)
        return w, V

    @staticmethod
    def setup_context(ctx, inputs, output):
        spec, A, B, *params = inputs
        w, V = output
        ctx.spec = spec
        ctx.n_params = len(params)
        ctx.save_for_backward(w, V, A, B, *params)
        ctx.save_for_forward(w, V, A, B)

    @staticmethod
    def backward(ctx, gw, gV):
        w, V, A, B, *params = ctx.saved_tensors
        spec = ctx.spec
        opA, opB = _operator(spec, A, B, params)
        gw = torch.zeros_like(w) if gw is None else gw
        gV = torch.zeros_like(V) if gV is None else gV
        generalized = opB is not None
        args = (opA, opB, w, V, gw, gV) if generalized else (opA, w, V, gw, gV)
        module = rules_generalized if generalized else rules
        with solve_options(tol=backward_tol(spec.tol, w.dtype)):
            if _dense(opA) and (opB is None or _dense(opB)):
                grads = module.eigsh_generalized_vjp(*args) if generalized else (module.eigsh_vjp(*args),)
                gA, gB = grads[0], (grads[1] if generalized else None)
                return (None, gA, gB) + (None,) * ctx.n_params
            factors = module.eigsh_generalized_vjp_factors(*args) if generalized else module.eigsh_vjp_factors(*args)
        (LA, RA), (LB, RB) = factors[:2], (factors[2:4] if generalized else (None, None))
        gA, param_grads_A = _input_gradient(A, spec.A_op, params[: spec.n_params_A], LA, RA, ctx.needs_input_grad[1])
        gB, param_grads_B = (None, ())
        if generalized:
            gB, param_grads_B = _input_gradient(B, spec.B_op, params[spec.n_params_A:], LB, RB, ctx.needs_input_grad[2])
        return (None, gA, gB, *param_grads_A, *param_grads_B)

    @staticmethod
    def jvp(ctx, _spec_tangent, dA, dB, *dparams):
        w, V, A, B = ctx.saved_tensors
        if ctx.spec.A_op is not None or not _dense(A) or (B is not None and not _dense(B)):
            raise NotImplementedError("forward mode of eigsh needs dense A and B")
        with solve_options(tol=backward_tol(ctx.spec.tol, w.dtype)):
            if B is None:
                return rules.eigsh_jvp(A, w, V, dA)
            dB = torch.zeros_like(B) if dB is None else dB
            dA = torch.zeros_like(A) if dA is None else dA
            return rules_generalized.eigsh_generalized_jvp(A, B, w, V, dA, dB)


def _input_gradient(X, op, params, L, R, needed):
    """The gradient ``sym(L R^T)`` in the input's own form (dense, sparse pattern, or the
    operator's parameters by one extra matvec)."""
    if op is not None:
        wanted = [p for p in params if isinstance(p, torch.Tensor) and p.requires_grad]
        if not wanted:
            return None, (None,) * len(params)
        with torch.enable_grad():
            detached = [p.detach().requires_grad_() if isinstance(p, torch.Tensor) else p for p in params]
            # <sym(L R^T), dA> = (sum_r L_r^T dA R_r + R_r^T dA L_r) / 2: two matvecs, so that the
            # parameters get the gradient of the symmetric cotangent whatever their role
            total = 0.5 * ((L.detach() * op._matvec(R.detach(), *detached)).sum()
                           + (R.detach() * op._matvec(L.detach(), *detached)).sum())
            tensors = [p for p in detached if isinstance(p, torch.Tensor) and p.requires_grad]
            grads = iter(torch.autograd.grad(total, tensors, allow_unused=True))
        return None, tuple(next(grads) if isinstance(p, torch.Tensor) and p.requires_grad else None for p in params)
    if X is None or not needed:
        return None, ()
    if _dense(X):
        return 0.5 * (L @ R.mT + R @ L.mT), ()
    half = sparse_lowrank_pattern_grad(X, 0.5 * L, R)
    other = sparse_lowrank_pattern_grad(X, 0.5 * R, L)
    if X.layout == torch.sparse_csr:
        values = half.values() + other.values()
        return torch.sparse_csr_tensor(X.crow_indices(), X.col_indices(), values, X.shape), ()
    return torch.sparse_coo_tensor(half.indices(), half.values() + other.values(), X.shape,
                                   is_coalesced=X.is_coalesced()), ()


def eigsh(A, k, B=None, *, largest=True, tol=None, maxiter=None):
    """See :func:`adjointgen.torch.eigsh`."""
    if isinstance(A, torch.Tensor) and _dense(A) and A.dim() > 2:
        batch = A.shape[:-2]
        Bb = None if B is None else B.expand(*batch, *B.shape[-2:])
        outs = [eigsh(A.reshape(-1, *A.shape[-2:])[i], k, None if Bb is None else Bb.reshape(-1, *B.shape[-2:])[i],
                      largest=largest, tol=tol, maxiter=maxiter)
                for i in range(A.reshape(-1, *A.shape[-2:]).shape[0])]
        w = torch.stack([o[0] for o in outs]).reshape(*batch, -1)
        V = torch.stack([o[1] for o in outs]).reshape(*batch, A.shape[-1], -1)
        return w, V
    A_op = A if isinstance(A, LinearOperator) else None
    B_op = B if isinstance(B, LinearOperator) else None
    params_A = tuple(A_op.params) if A_op is not None else ()
    params_B = tuple(B_op.params) if B_op is not None else ()
    spec = _Spec(int(k), bool(largest), tol, maxiter, A_op, B_op, len(params_A))
    return EigshFunction.apply(spec, None if A_op is not None else A, None if B_op is not None else B,
                               *params_A, *params_B)

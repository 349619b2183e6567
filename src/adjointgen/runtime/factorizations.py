"""Glue for the factorizations' public functions: the extra columns of a complete QR."""
from __future__ import annotations

import torch
from .function import nested_forward as _nested_forward

__all__ = ["complete_q"]


class _ComplementBasis(torch.autograd.Function):
    """The extra columns ``Q2`` of a complete QR (any orthonormal basis of the complement of
    span(A)): passed through, and a backward that reaches them with a nonzero cotangent raises.
    Forward mode cannot tell whether the tangent of ``Q2`` is used, so it raises as torch does."""

    generate_vmap_rule = True

    @staticmethod
    def forward(Q2, A):
        return Q2.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        if g is not None and bool(g.ne(0).any()):
            raise RuntimeError(
                "qr(mode='complete') with m > n: the loss depends on the extra columns of Q, an arbitrary "
                "orthonormal basis of the complement of span(A), so it has no gradient; use mode='reduced' "
                "(or the projector Q2 Q2^T = I - Q1 Q1^T)")
        return None, None

    @staticmethod
    @_nested_forward
    def jvp(ctx, gQ2, gA):
        raise RuntimeError(
            "qr(mode='complete') with m > n is not differentiable in forward mode: the extra columns of Q "
            "are an arbitrary orthonormal basis of the complement of span(A) (torch.linalg.qr raises "
            "the same); use mode='reduced'")


def complete_q(A: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
    """``[Q, Q2]`` for a tall ``A`` with reduced factor ``Q``: LAPACK's complete factor (whose first
    columns are ``Q``) with the extra columns guarded by :class:`_ComplementBasis`."""
    with torch.no_grad():
        full, _ = torch.linalg.qr(A.detach(), mode="complete")
    return torch.cat([Q, _ComplementBasis.apply(full[..., Q.shape[-1]:], A)], dim=-1)

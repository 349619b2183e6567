"""Autograd glue for ``svd(A, full_matrices=True)`` with m != n: the thin rules of
``derivations/svd.py`` plus the complement rules of ``derivations/svd_complement.py`` (a tall A;
a wide A goes through ``A^T = V S U^T``)."""
from __future__ import annotations

import torch

from ..generated.torch import svd as thin
from ..generated.torch import svd_complement as complement
from ..runtime import completion as _completion
from ..runtime import degeneracy as _degeneracy
from ..runtime import gauge as _gauge
from ..runtime import value_blocks as _value_blocks
from ..runtime import function as _function
from ..runtime.function import nested_forward as _nested_forward
from ..runtime.verdict import deferred


def _tall_vjp(U, S, V, U2, gU, gS, gV, gU2, rtol=None, A=None):
    check = _gauge.enabled()
    if check:
        U, V, gS, gU, gV = _completion.complete("svd", S, (U, V), gS, (gU, gV), rtol, what="singular values")
    if not (check and A is not None and _degeneracy.has_clusters(S, rtol)):
        return _tall_rules(U, S, V, U2, gU, gS, gV, gU2, rtol, check)
    # a second derivative at a cluster moves the singular values as a block (runtime.value_blocks)
    with _value_blocks.second_order("svd", thin.RULES.block, dict(U=U, S=S, V=V, A=A), gS, (gU, gV, gU2),
                                    rtol) as prepared:
        gS, (gU, gV, gU2) = prepared.values_cotangent, prepared.cotangents
        gA = _tall_rules(U, S, V, U2, gU, gS, gV, gU2, rtol, check)
    return prepared.add((gA,))[0]


def _split(S, gS):
    """The value cotangent to check for a split of a cluster: none where :func:`complete` re-expressed
    the loss (it raises itself for one it cannot), ``gS`` where the checks are deferred."""
    return None if _degeneracy.completing(S) else gS


def _tall_rules(U, S, V, U2, gU, gS, gV, gU2, rtol, check):
    if check and U2.shape[-1] > 0:  # the extra columns are defined only up to U2 -> U2 exp(Ω)
        basis = complement.svd_complement_gauge_basis_complex if U.is_complex() else complement.svd_complement_gauge_basis
        _gauge.check_basis("svd", basis(U2, gU2), gU2)
        _check_rank_deficient(U, S, U2, gU, gU2, rtol)
    if U.is_complex():
        if check:
            gA, residual, residual_clusters = thin.svd_vjp_complex_checked(U, S, V, gU, gS, gV, cluster_rtol=rtol)
            _gauge.check("svd", residual, gU, gV)
            _degeneracy.check("svd", residual_clusters, _degeneracy.cluster_mask(S, rtol), _split(S, gS), gU, gV,
                              what="singular values", values=S)
        else:
            gA = thin.svd_vjp_complex(U, S, V, gU, gS, gV, cluster_rtol=rtol)
        return gA + complement.svd_complement_vjp_complex(U, S, V, U2, gU2, cluster_rtol=rtol)
    if check:
        gA, residual_clusters = thin.svd_vjp_checked(U, S, V, gU, gS, gV, cluster_rtol=rtol)
        _degeneracy.check("svd", residual_clusters, _degeneracy.cluster_mask(S, rtol), _split(S, gS), gU, gV,
                          what="singular values", values=S)
    else:
        gA = thin.svd_vjp(U, S, V, gU, gS, gV, cluster_rtol=rtol)
    return gA + complement.svd_complement_vjp(U, S, V, U2, gU2, cluster_rtol=rtol)


def _check_rank_deficient(U, S, U2, gU, gU2, rtol):
    """At zero singular values (to ``rtol``) the complement of the range is spanned by their vectors
    ``U_0`` and the extra columns ``U2`` together, and a rotation mixing the two is as valid: the
    split between them (``U2 U2^H`` itself) is not a function of ``A``.  Raise
    :class:`~adjointgen.runtime.gauge.ComplementBasisError` where the loss's derivative along such a
    rotation, ``U_0^H gU2 - (U2^H gU_0)^H``, is not zero (the thin factors' own null-space check
    covers rotations inside ``U_0``)."""
    from ..runtime.checks import physical

    if S.shape[-1] == 0 or U2.shape[-1] == 0:
        return
    zero = _degeneracy.zero_mask(S, rtol)
    plain = physical(zero)
    if plain is None or not bool(plain[0].any()):
        return
    import torch

    with torch.no_grad():
        mask = zero.unsqueeze(-2).to(U.dtype)
        X = (U * mask).mH @ gU2 - ((U2.mH @ (gU * mask)).mH)
        _gauge.check_mixing("svd", torch.linalg.matrix_norm(X),
                            torch.linalg.matrix_norm(gU * mask) + torch.linalg.matrix_norm(gU2))


def _tall_jvp(U, S, V, U2, dA):
    if U.is_complex():
        dU, dS, dV = thin.svd_jvp_complex(U, S, V, dA)
        return dU, dS, dV, complement.svd_complement_jvp_complex(U, S, V, U2, dA)
    dU, dS, dV = thin.svd_jvp(U, S, V, dA)
    return dU, dS, dV, complement.svd_complement_jvp(U, S, V, U2, dA)


class SvdFullFunction(_function.Function):
    """``(U_full, S, Vh_full) = svd(A, full_matrices=True)`` for m != n, real or complex ``A``."""

    generate_vmap_rule = True

    @staticmethod
    def forward(A):
        from ..runtime.degeneracy import generic_basis

        U, S, Vh = torch.linalg.svd(A, full_matrices=True)
        # the thin factors at a generic basis of every cluster, as the thin SVD's forward
        # (runtime.forward.svd): at LAPACK's basis, with its exact zeros, the backward's cluster check
        # cannot see a loss that depends on the basis; the extra columns span the same complement
        k = S.shape[-1]
        U1, V1 = generic_basis(S, U[..., :k], Vh[..., :k, :].mH)
        return torch.cat([U1, U[..., k:]], dim=-1), S, torch.cat([V1.mH, Vh[..., k:, :]], dim=-2)

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, = inputs
        ctx.tall = A.shape[-2] >= A.shape[-1]
        ctx.save_for_backward(*output, A)
        ctx.save_for_forward(*output)

    @staticmethod
    def backward(ctx, gU, gS, gVh):
        U, S, Vh, A = ctx.saved_tensors
        gU = torch.zeros_like(U) if gU is None else gU
        gS = torch.zeros_like(S) if gS is None else gS
        gVh = torch.zeros_like(Vh) if gVh is None else gVh
        k = S.shape[-1]
        if ctx.tall:  # U = [U1 U2], Vh square
            return _tall_vjp(U[..., :k], S, Vh.mH, U[..., k:], gU[..., :k], gS, gVh.mH, gU[..., k:], A=A)
        # wide: A^H = V S U^H with V = [V1 V2] tall; U square
        V = Vh.mH
        gV = gVh.mH
        return _tall_vjp(V[..., :k], S, U, V[..., k:], gV[..., :k], gS, gU, gV[..., k:], A=A.mH).mH.resolve_conj()

    @staticmethod
    @_nested_forward
    def jvp(ctx, dA):
        U, S, Vh = ctx.saved_tensors
        k = S.shape[-1]
        if ctx.tall:
            dU1, dS, dV, dU2 = _tall_jvp(U[..., :k], S, Vh.mH, U[..., k:], dA)
            return torch.cat([dU1, dU2], dim=-1), dS, dV.mH
        V = Vh.mH
        dV1, dS, dU, dV2 = _tall_jvp(V[..., :k], S, U, V[..., k:], dA.mH)
        return dU, dS, torch.cat([dV1, dV2], dim=-1).mH


#: the function without ``jvp``, which ``torch.compile`` traces
SvdFullFunctionCompiled = SvdFullFunction._for_compiler

class NullSpaceCheck(torch.autograd.Function):
    """``(U, S)`` unchanged; the backward checks what a loss may not depend on at the zero singular
    values of a tall (wide) thin SVD: their vectors beyond their span
    (:func:`adjointgen.runtime.gauge.check_null_space`) and their values, which have a kink at 0
    (``s(A + t u_perp v^T) = |t|``)."""

    @staticmethod
    def forward(U, S, zero):
        return U.clone(), S.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        U, S, zero = inputs
        ctx.save_for_backward(U, S, zero)

    @staticmethod
    def backward(ctx, gU, gS):
        U, S, zero = ctx.saved_tensors
        if _gauge.enabled():
            square = U.shape[-2] == U.shape[-1]
            if gU is not None and not square:
                _gauge.check_null_space("svd", U, gU, zero)
            if gS is not None:
                # a square matrix has no complement: U f(S) V^H with an odd f is smooth there, and its
                # cotangents say so (check_zero_values)
                _gauge.check_zero_values("svd", gS, zero, *((U, gU, S) if square else ()))
        return gU, gS, None

    @staticmethod
    @_nested_forward
    def jvp(ctx, dU, dS, _):
        return dU, dS

    @staticmethod
    def vmap(info, in_dims, U, S, zero):
        from ..runtime.checks import vmap_as_batch

        return vmap_as_batch(NullSpaceCheck, info, in_dims, U, S, zero)


def guard_null_space(U, S, rtol=None):
    """``(U, S)`` (``U`` the longer side's singular vectors, ``(..., m, k)`` with ``m >= k``) routed
    through :class:`NullSpaceCheck` when some singular value is zero (to ``rtol``) and a gradient
    may flow (a square matrix: its zero values only)."""
    from ..runtime.checks import physical

    if U.shape[-2] < U.shape[-1] or S.numel() == 0 or not (U.requires_grad or S.requires_grad or _is_dual(U)):
        return U, S
    if not deferred(S):
        plain = physical(S)
        if plain is None or not _degeneracy.any_zero(plain[0], rtol):
            return U, S
    return NullSpaceCheck.apply(U, S, _degeneracy.zero_mask(S.detach(), rtol))


def _is_dual(x) -> bool:
    try:
        import torch.autograd.forward_ad as fwAD

        return fwAD.unpack_dual(x).tangent is not None
    except Exception:  # pragma: no cover
        return False

"""Spectral losses at clusters: a loss through ``V f(D) V^H`` (eigenvectors inside a cluster of equal
values) is gauge invariant, but its cotangents ``gV`` alone are not; :func:`complete` re-expresses
them, per cluster, as the cotangents of the values and of an invariant basis, so that the derived
rules apply (called by :func:`adjointgen.runtime.dispatch.vjp` where the rules declare a completion).
"""
from __future__ import annotations

import math

import torch

from .degeneracy import _clusters_of, cluster_mask, completing, default_rtol, has_clusters


def complete(op: str, d: torch.Tensor, vectors, gd: torch.Tensor, cotangents, rtol=None, broadening=None,
             what: str = "eigenvalues"):
    """``(*vectors, gd, *cotangents)`` re-expressed so that the rule gives the exact gradient of a
    loss through ``V f(D) V^H`` (``U f(S) V^H`` for the SVD) at a cluster of equal values ``d``.

    At a cluster the rule keeps, of the cluster's block ``M`` of the gradient (the symmetric part of
    it, for the SVD), only its diagonal ``gd``: enough when ``M`` is a multiple of the identity (the
    sum of the cluster's eigenvalues, a projector onto it), which the cotangents show by equal ``gd``
    at the generic basis the forward returns (:func:`generic_basis`).  For a loss
    ``Φ(V diag(f(d)) V^H)`` -- ``V diag(w) V^H`` itself, ``exp``, any ``f`` -- ``M = f'(d_c) V_c^H ∇Φ V_c``
    is not; the cotangents carry it nevertheless: ``gd_i = f' (V_c^H ∇Φ V_c)_ii`` and
    ``S = sym(V_c^H gV_c) = 2 f(d_c) V_c^H ∇Φ V_c`` (for the SVD, ``sym(U_c^H gU_c + V_c^H gV_c)/2``), so
    ``gd = ρ diag(S)`` with one ``ρ`` per cluster and ``M = ρ S``.  When the cotangents fit that
    form (to ``sqrt(eps)``, or to the cluster's own spread of values when that is larger), ``M`` is
    diagonalised, ``M = Q Λ Q^H``, and the rule gets ``V_c Q`` (``U_c Q``), ``Λ`` and ``gV_c Q``: the
    same loss in the basis where its block is diagonal.  When they do not (``w[0]`` alone, a sum of
    terms of different forms, ``f(d_c) = 0``), no gradient follows from them and
    :class:`~adjointgen.runtime.gauge.DegenerateSubspaceError` is raised, as for any loss that
    depends on the individual values of a cluster.

    Inside a ``torch.func`` transform that batches the values (``vmap``) nothing is re-expressed:
    the split check raises instead (a clear error, never a wrong gradient)."""
    from .checks import is_traced
    from .gauge import DegenerateSubspaceError, describe_cluster

    vectors, cotangents = tuple(vectors), tuple(cotangents)
    unchanged = (*vectors, gd, *cotangents)
    if broadening is not None or d.shape[-1] < 2 or not completing(d) or not has_clusters(d, rtol):
        return unchanged
    if any(is_traced(t) for t in (d, gd, *vectors, *cotangents)):
        # vmap: re-expressed by an autograd function whose vmap rule hands it the plain tensors
        out = _Complete.apply(_Options((op, len(vectors), rtol, broadening, what)), d, gd, *vectors, *cotangents)
        return tuple(out)
    mask = cluster_mask(d, rtol)
    real = d.dtype
    eps = torch.finfo(real).eps
    tiny = torch.finfo(real).tiny
    batch = d.shape[:-1]
    n = d.shape[-1]
    flat = [X.reshape(-1, *X.shape[-2:]) for X in vectors]
    gflat = [G.reshape(-1, *G.shape[-2:]).clone() for G in cotangents]  # a root block edits them
    gdf = gd.reshape(-1, n)
    dflat = d.detach().reshape(-1, n)
    maskf = mask.reshape(-1, n, n)
    dtype = vectors[0].dtype
    Q_full = torch.eye(n, dtype=dtype, device=d.device).repeat(gdf.shape[0], 1, 1)
    new_gd = [gdf[b] for b in range(gdf.shape[0])]
    changed = rooted = False
    for b in range(maskf.shape[0]):
        for members in _clusters_of(maskf[b].cpu()):
            idx = torch.tensor(members, device=d.device)
            g = gdf[b].index_select(0, idx)
            level = float(gdf[b].detach().abs().max())  # the whole gradient's: a split of rounding is none
            spread = float((g.detach() - g.detach().mean()).abs().max())
            # with the size of the vectors' cotangents in the units of gd (as :func:`check`)
            whole = level + max((float(torch.linalg.vector_norm(G[b].detach(), dim=-2).max()) for G in gflat),
                                default=0.0) / max(float(dflat[b].abs().max()), tiny)
            if spread <= math.sqrt(eps) * whole + tiny:
                continue  # the block is a multiple of the identity: the rule's own answer
            S = 0
            for X, G in zip(flat, gflat):
                Xc, Gc = X[b].index_select(-1, idx), G[b].index_select(-1, idx)
                S = S + Xc.mH @ Gc
            S = S / len(flat)
            S = 0.5 * (S + S.mH)
            s = S.diagonal().real
            rho = (g * s).sum() / (s * s).sum().clamp_min(tiny)
            values = dflat[b].index_select(0, idx)
            width = float(values.max() - values.min()) / max(float(dflat[b].abs().max()), tiny)
            allowed = max(math.sqrt(eps), 100 * width)
            scale = level + float(rho.detach().abs()) * float(s.detach().abs().max())
            size = max(float(G[b].detach().abs().max()) for G in gflat) + tiny
            fits = (float((g - rho * s).detach().abs().max()) <= allowed * scale + tiny
                    and float(s.detach().abs().max()) > math.sqrt(eps) * size)
            gauge_part = None
            if not fits and len(flat) == 1:
                M, gauge_part = _root_block(flat[0][b], idx, gflat[0][b].index_select(-1, idx), g, values, dflat[b],
                                            eps, tiny)
                fits = M is not None
            else:
                M = rho * S
            if not fits and spread <= 100 * default_rtol(real) * whole + tiny:
                continue  # a spread within the tolerance of near-equal values: the rule's own answer
            if not fits:
                where = f"batch index {b}, " if len(batch) else ""
                raise DegenerateSubspaceError(
                    f"{op}: the loss depends on the individual {what} of a cluster ({where}"
                    f"{describe_cluster(members, dflat[b].cpu(), what)} are "
                    f"equal within the cluster tolerance), which are not differentiable there, and its cotangents "
                    f"are not those of a function of V diag(f(w)) V^H (U f(S) V^H), whose gradient they would "
                    f"determine; only symmetric functions of a cluster (their sum, the projector onto it), "
                    f"functions of V diag(f(w)) V^H, and adjointgen.torch.funm are differentiable at a cluster. "
                    f"In a second derivative (gradgradcheck, the gradient of a gradient) the loss is the first "
                    f"derivative: at a cluster it is exact for invariant losses of eigh, eigh(A, B), eigsh, svd "
                    f"and svds of dense matrices, and for adjointgen.torch.funm; a loss with "
                    f"its own second derivative in the cluster's values (sum(w**2)) needs reverse over reverse "
                    f"by torch.autograd.grad(create_graph=True) or torch.func.vjp(torch.func.grad(f)), not "
                    f"jacrev of jacrev. "
                    f"Set the tolerance with cluster_rtol= (or adjointgen.runtime.degeneracy.set_rtol), use "
                    f"broadening= for a biased finite surrogate, or disable the check with "
                    f"adjointgen.runtime.gauge.set_enabled(False)")
            _, Q = torch.linalg.eigh(M.detach())
            Q_full[b][idx.unsqueeze(-1), idx] = Q.to(dtype)
            if gauge_part is not None:  # its information is in M now: the cluster's residual is zero
                rooted = True
                for G in gflat:
                    G[b][:, idx] = G[b][:, idx] - gauge_part
            new_gd[b] = new_gd[b].index_put((idx,), (Q.mH @ M @ Q).diagonal().real.to(gd.dtype))
            changed = True
    if not changed:
        return unchanged
    Q_full = Q_full.reshape(*batch, n, n)
    out = (*(X @ Q_full for X in vectors), torch.stack(new_gd).reshape(gd.shape),
           *(G.reshape(C.shape) @ Q_full for G, C in zip(gflat, cotangents)))
    if rooted and torch.is_grad_enabled():
        # the block read off the cluster's rounding (_root_block) is a first derivative only
        from .function import no_further_derivative
        from .gauge import DegenerateSubspaceError

        message = (f"{op}: a further derivative through a loss through V diag(f(w)) V^H at a cluster of equal {what} "
                   f"where f vanishes (V diag(w) V^H at a zero cluster) is not available: its first derivative is "
                   f"read off the cluster's rounding; adjointgen.torch.funm has exact derivatives of every order")
        out = tuple(no_further_derivative(t, DegenerateSubspaceError, message) if t.requires_grad else t for t in out)
    return out


def _root_block(V, idx, Gc, g, values, d, eps, tiny):
    """``(M, gauge part)`` of a cluster ``idx`` of eigenvalues ``values`` where ``f`` vanishes: a
    loss ``Φ(V diag(f(w)) V^H)`` whose ``f(d_c) = 0`` (``V diag(w) V^H`` at a zero cluster, ``sin``,
    ``w - λ`` at ``λ``) has ``S ≈ 0``, and the block ``M = f'(d_c) V_c^H ∇Φ V_c`` is carried by the
    cluster's rounding instead: with ``f(d_i) = f' (d_i - λ)`` the cotangents are
    ``X = V_c^H gV_c = P diag(d_c - λ)`` and ``gd = diag(P) / 2`` for a Hermitian ``P = 2 M``.
    ``λ`` is fitted to the diagonal, ``P`` read off ``X`` and checked Hermitian, every member's
    ``d_i - λ`` must be resolved (not zero: a value exactly at ``λ`` carries nothing, and a loss on
    one eigenvalue, ``w[0]``, fits ``λ = d_0``).  Returns ``(None, None)`` when the cotangents do
    not fit.  The gauge part ``W skew(X)`` is what the caller takes out of ``gV_c``: a change of
    the cluster's block of ``V^H gV`` alone, with ``W = V_c`` for orthonormal vectors and the
    columns ``c`` of ``V^{-H}`` (``B V_c``) for the generalized problem's square ``V``; a partial
    generalized basis fits nothing."""
    Vc = V.index_select(-1, idx)
    k = Vc.shape[-1]
    with torch.no_grad():
        if Vc.is_complex() != Gc.is_complex():
            return None, None
        if float((Vc.mH @ Vc - torch.eye(k, dtype=Vc.dtype, device=Vc.device)).abs().max()) <= math.sqrt(eps):
            W = Vc
        elif V.shape[-1] == V.shape[-2]:  # V^H B V = I: V^{-H} = B V
            eye = torch.eye(V.shape[-1], dtype=V.dtype, device=V.device).index_select(-1, idx)
            W = torch.linalg.solve(V.detach().mH, eye)
        else:
            return None, None
        X = (Vc.mH @ Gc).detach()
        gr = g.detach().real if g.is_complex() else g.detach()
        dv = values.detach().to(gr.dtype)
        xd = X.diagonal().real
        den = 2 * float((gr * gr).sum())
        if den <= tiny:
            return None, None
        # λ in the frame of the cluster's centre, where d_i - c is exact: resolved to eps of the
        # cluster's spread, not of |d| (a cluster at 2 with f = w - 2 is resolved by its rounding)
        centre = float(dv.mean())
        local = dv - centre
        lam = float((gr * (2 * gr * local - xd)).sum()) / den
        delta = local - lam
        big = float(delta.abs().max())
        if big <= tiny or float(delta.abs().min()) <= 1e3 * eps * (big + float(local.abs().max())) + tiny:
            return None, None  # a member at λ carries nothing (w[0] fits λ = d_0; LAPACK's exact zeros)
        # f linear across the cluster: to its width (relative), as the fit of S
        allowed = max(math.sqrt(eps), 100 * float(dv.max() - dv.min()) / max(float(d.detach().abs().max()), tiny))
        diag_fit = (xd - 2 * gr * delta).abs()
        if float(diag_fit.max()) > allowed * float((xd.abs() + 2 * (gr * delta).abs()).max()) + tiny:
            return None, None
        P = X / delta.to(X.dtype).unsqueeze(-2)
        scale = float(P.abs().max()) + tiny
        if float((P - P.mH).abs().max()) > allowed * scale or float(X.diagonal().imag.abs().max()
                                                                      if X.is_complex() else 0.0) > allowed * scale * big:
            return None, None
        # each pair from the side with the larger |d - λ| (the better resolved quotient)
        first = (delta.abs().unsqueeze(-2) >= delta.abs().unsqueeze(-1))
        P = torch.where(first, P, P.mH)
        M = 0.5 * P
        M = M - torch.diag_embed(M.diagonal()) + torch.diag_embed(g.detach().to(M.dtype))
        gauge_part = W @ (0.5 * (X - X.mH))
    return M.to(Vc.dtype if Vc.is_complex() else M.dtype), gauge_part


class _Options:
    """Opaque non-tensor arguments of :class:`_Complete` (not flattened by the transforms)."""

    __slots__ = ("values", "changed")

    def __init__(self, values):
        self.values = values


class _Complete(torch.autograd.Function):
    """:func:`complete` under ``vmap``: its ``vmap`` rule makes the batch dimension a batch
    dimension of plain tensors, where the clusters are found and re-expressed per matrix.  Where
    nothing was re-expressed it is the identity, and so is its derivative; re-expressed cotangents
    are not differentiated further: a second derivative through them raises (second derivatives
    at a cluster of a loss through ``V f(D) V^H`` under ``vmap`` are not available)."""

    @staticmethod
    def forward(options, d, gd, *rest):
        op, k, rtol, broadening, what = options.values
        out = complete(op, d, rest[:k], gd, rest[k:], rtol, broadening, what)
        options.changed = any(not any(t is x for x in (d, gd, *rest)) for t in out)
        return tuple(t.clone() if any(t is x for x in (d, gd, *rest)) else t for t in out)

    @staticmethod
    def setup_context(ctx, inputs, output):
        options = inputs[0]
        ctx.op = options.values[0]
        ctx.changed = getattr(options, "changed", True)
        ctx.k = options.values[1]

    @staticmethod
    def backward(ctx, *grads):
        if ctx.changed:
            from .gauge import DegenerateSubspaceError

            raise DegenerateSubspaceError(
                f"{ctx.op}: a second derivative under vmap (jacrev of a gradient) through a cluster whose "
                "loss goes through V f(D) V^H is not available; take it without vmap (torch.autograd.grad "
                "of the gradient, or torch.func.vjp of torch.func.grad)")
        k = ctx.k
        gvec, ggd, gcot = grads[:k], grads[k], grads[k + 1:]
        return (None, None, ggd, *gvec, *gcot)

    @staticmethod
    def vmap(info, in_dims, options, d, gd, *rest):
        from .checks import vmap_as_batch

        return vmap_as_batch(_Complete, info, in_dims, options, d, gd, *rest)

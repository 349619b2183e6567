"""Second derivatives at clusters: the values of a cluster moved as one block (torch).

At a cluster of equal values (eigenvalues, singular values) the rules' pairwise matrices
(``F_ij = 1/(d_j - d_i)`` between clusters, ``1/(d_i + d_j)``) are the same for every member of
the cluster, and the rules are gauge invariant.  Their derivative is not the derivative in each
value separately: splitting the cluster moves its values as the eigenvalues of a block
``Λ_c = V_c^H A V_c``, whose off-diagonal entries a cotangent of the value vector cannot carry.
Reverse over reverse through the vector therefore hands the second backward cotangents that
differ inside a cluster, and an invariant loss's Hessian raised ``DegenerateSubspaceError``.

Here the backward of a rule at a cluster takes its pairwise products ``F ∘ X`` from
:func:`times`, which differentiates ``F`` through the block instead: for ``F_ij = q(d_i, d_j)``

    d(F ∘ X) = F ∘ dX + P ∘ (dΛ X) + Q ∘ (X dΛ),   P = ∂q/∂d_i,  Q = ∂q/∂d_j,

with ``dΛ`` the block-diagonal (diagonal and clusters) part of the operation's values' derivative
as a matrix (the block whose diagonal is the values' tangent, derived with the operation's rules
(``Derivation.derive_vjp``, :class:`~adjointgen.runtime.rules.ValueBlock`): ``V^H dA V`` for eigh,
``V^H (dA - w dB) V`` for the generalized
problem, the Hermitian part of ``U^H dA V`` for the SVD), and its transpose delivers the
cotangent of the operation's inputs directly.  The value vector is read as a constant there.
The operation's dispatch (:mod:`adjointgen.runtime.dispatch`) declares the block around the rule
call (:func:`declared`), only where the values have a cluster and a second derivative is being
built (grad mode on inside a backward).

A loss's own second derivative in the values reaches the second backward through the value
cotangent ``g_w``, as a vector again: for a symmetric function ``ℓ(w)`` (``sum(w**2)``) its Hessian
inside a cluster is ``a I + b 11^T``, and the Lewis–Sendov derivative of ``V diag(ℓ'(w)) V^H`` needs
``a`` on the whole block, ``a (dΛ_c - mean(diag dΛ_c) I)``, not on its diagonal alone.
:func:`loss_curvature` reads ``a`` from one Hessian-vector product of the loss (a direction of
zero sum inside each cluster, which a symmetric function maps to ``a`` times itself, and which
checks that it does), hands the loss the cluster means of its second cotangent, and adds the rest
through the block.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Callable

import torch
from .function import nested_forward as _nested_forward
from .function import no_further_derivative

__all__ = ["Block", "active_for", "from_rules", "add_diag", "block_term", "cut", "declared", "loss_curvature", "scale_cols",
           "scale_rows", "second_order", "times"]


@dataclass(frozen=True)
class Block:
    """How an operation's values move as a block: ``values`` (the env name of the value vector),
    ``basis`` (the env names of the tensors the maps read, as constants), ``inputs`` (the env names
    of the inputs the block moves with), ``jvp(basis, *tangents) -> dΛ`` (a full matrix; its
    Hermitian part on the diagonal and the clusters is used) and ``vjp(basis, M) -> cotangents of
    inputs`` for a Hermitian block-diagonal ``M``: the derived rules of the operation's
    :class:`~adjointgen.runtime.rules.ValueBlock` (:func:`from_rules`)."""

    values: str
    basis: tuple[str, ...]
    inputs: tuple[str, ...]
    jvp: Callable
    vjp: Callable


def from_rules(record, complex_: bool) -> Block:
    """The :class:`Block` of a generated operation's :class:`~adjointgen.runtime.rules.ValueBlock`
    (its derived block rules, complex or real)."""
    jvp, vjp = record.calls(complex_)
    tangents = tuple("d" + name for name in record.inputs)
    basis = tuple(sorted({*jvp.args, *jvp.keywords, *vjp.args, *vjp.keywords} - set(tangents) - {record.cotangent}))

    def forward(values, *dinputs):
        return jvp({**dict(zip(basis, values)), **dict(zip(tangents, dinputs))})[0]

    def backward(values, M):
        if complex_ and not M.is_complex():  # the block of complex rules is Hermitian, not real
            M = M.to(next(v.dtype for v in values if v.is_complex()))
        return vjp({**dict(zip(basis, values)), record.cotangent: M})

    return Block(record.values, basis, record.inputs, forward, backward)


def _block(record, env: dict) -> Block | None:
    if record is None:
        return None
    complex_ = any(isinstance(env.get(name), torch.Tensor) and env[name].is_complex()
                   for name in (*record.inputs, record.values))
    return from_rules(record, complex_)


@dataclass(frozen=True)
class _Active:
    values: torch.Tensor
    mask: torch.Tensor  # (..., n, n) bool: the diagonal and the clusters
    basis: tuple  # the maps' constants (detached)
    inputs: tuple  # the inputs the block moves with, with their history
    block: Block
    switch: "_Switch"  # on while a rule's own derivative in the values is read (cotangents cut)

    @property
    def dtype(self):
        """The dtype of the block's maps (complex where any of their constants is)."""
        dtype = self.values.dtype
        for b in self.basis:
            dtype = torch.promote_types(dtype, b.dtype)
        return dtype


class _Switch:
    """Whether :class:`_Cut` passes derivatives (off while :func:`_direct_derivative` reads the
    rule's own dependence on the values, without the loss's through its cotangents)."""

    __slots__ = ("on",)

    def __init__(self):
        self.on = False


_ACTIVE: contextvars.ContextVar[_Active | None] = contextvars.ContextVar("adjointgen_value_block", default=None)


def _active():
    """The active value block, ``None`` under a compiler (which traces no context variable: a
    second derivative at a cluster is not compiled)."""
    return None if torch.compiler.is_compiling() else _ACTIVE.get()


@contextlib.contextmanager
def declared(record, env: dict, rtol=None):
    """Within this context, :func:`times` of the operation's values differentiates through the block
    (``record``, its :class:`~adjointgen.runtime.rules.ValueBlock`: when it has one, its inputs are
    dense tensors and grad mode is on: a second derivative is being built); otherwise nothing
    changes."""
    block = _block(record, env)
    if block is None or not torch.is_grad_enabled() or not all(
            isinstance(env.get(name), torch.Tensor) and env[name].layout == torch.strided for name in block.inputs):
        yield
        return
    from .degeneracy import cluster_mask

    d = env[block.values]
    n = d.shape[-1]
    mask = cluster_mask(d.detach(), rtol) | torch.eye(n, dtype=torch.bool, device=d.device)
    basis = tuple(env[name].detach() for name in block.basis)
    token = _ACTIVE.set(_Active(d, mask, basis, tuple(env[name] for name in block.inputs), block, _Switch()))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


class Prepared:
    """What :func:`second_order` yields: the value cotangent and the other cotangents to hand the
    rules, and :meth:`add` for the input cotangents they return."""

    def __init__(self, values_cotangent, cotangents, extra, unavailable=None):
        self.values_cotangent, self.cotangents, self.extra = values_cotangent, cotangents, extra
        self.unavailable = unavailable  # (error class, message): the input cotangents have no derivative

    def add(self, grads):
        """The rules' input cotangents (in :attr:`Block.inputs` order) with the loss's own
        second-derivative terms added (``None`` entries kept)."""
        if self.unavailable is not None:
            from .function import no_further_derivative

            return tuple(g if g is None else no_further_derivative(g, *self.unavailable) for g in grads)
        if self.extra is None:
            return tuple(grads)
        extra = (*self.extra, *(None,) * (len(grads) - len(self.extra)))
        return tuple(g if g is None or e is None else g + e for g, e in zip(grads, extra))


@contextlib.contextmanager
def second_order(op: str, record, env: dict, values_cotangent, cotangents=(), rtol=None):
    """Around the evaluation of ``op``'s rules in a backward (``record``: its
    :class:`~adjointgen.runtime.rules.ValueBlock`): :func:`declared`, the value cotangent through
    :func:`loss_curvature` and every cotangent through :func:`cut`.  Yields a :class:`Prepared`.
    Outside a second derivative at a cluster everything passes unchanged."""
    d = env.get(record.values) if record is not None else None
    if isinstance(d, torch.Tensor) and d.is_complex() and torch.is_grad_enabled():
        from .degeneracy import has_clusters
        from .gauge import DegenerateSubspaceError

        if has_clusters(d.detach(), rtol):
            # complex values (a general matrix's eigenvalues): a cluster moves as the eigenvalues of a
            # block that is not Hermitian, and a function of them (Re w, |w|) need not have a second
            # derivative there at all; the block machinery below is for Hermitian blocks
            yield Prepared(values_cotangent, tuple(cotangents), None, (DegenerateSubspaceError, (
                f"{op}: a second derivative at a cluster of equal complex values is not available (the "
                "cluster moves as the eigenvalues of a non-Hermitian block, where a function of the values "
                "such as Re(w)**2 or |w| need not be twice differentiable); set cluster_rtol= to a smaller "
                "tolerance if the values are distinct, or differentiate a polynomial of A (trace(A @ A)) "
                "directly")))
            return
    with declared(record, env, rtol):
        g, extra = loss_curvature(_unseen_curvature(op, record, env, values_cotangent, cotangents, rtol))
        yield Prepared(cut(g), tuple(cut(c) for c in cotangents), extra)


def _unseen_curvature(op: str, record, env: dict, gw, cotangents, rtol):
    """``g_w``, made to raise when differentiated where :func:`loss_curvature` cannot read the
    loss's curvature: inside a ``torch.func`` transform (``jacrev(jacrev(f))``) the cotangent's
    dependence on the values belongs to an outer level, invisible here.  A loss of the values
    alone reaches the next backward in a form the cluster checks complete (``sum(w**2)``); one
    that also moves the cluster's vectors (``trace(V diag(w**3) V^T)``) would lose the cluster's
    curvature silently, so its second derivative raises."""
    if not isinstance(gw, torch.Tensor) or gw.requires_grad or not torch.is_grad_enabled():
        return gw
    from torch._C._functorch import is_functorch_wrapped_tensor

    if not is_functorch_wrapped_tensor(gw):
        return gw
    block = record
    if block is None:
        return gw
    from .checks import physical
    from .degeneracy import cluster_mask, has_clusters

    d = env[block.values]
    plain = physical(d, gw, *[c for c in cotangents if isinstance(c, torch.Tensor)])
    if plain is None or not has_clusters(plain[0], rtol) or not bool(plain[1].any()):
        return gw  # no clusters, or a loss of the vectors alone (a projector: g_w = 0)
    plain = (plain[0], *plain[2:])
    mask = cluster_mask(plain[0], rtol)
    in_cluster = mask.any(-2) & (mask.sum(-2) > 1)
    moved = False
    for c in plain[1:]:
        if c.shape[-1] != in_cluster.shape[-1]:
            continue
        norms = torch.linalg.vector_norm(c, dim=-2)
        scale = norms.amax(-1, keepdim=True)
        moved = moved or bool(((norms > torch.finfo(norms.dtype).eps ** 0.5 * scale) & in_cluster).any())
    if not moved:
        return gw
    from .gauge import DegenerateSubspaceError

    return no_further_derivative(
        gw, DegenerateSubspaceError,
        f"{op}: a second derivative by torch.func transforms (jacrev of jacrev, hessian) at a cluster of equal "
        f"values, of a loss that depends on both the cluster's values and its vectors, is not available (the "
        f"loss's curvature inside the cluster is not visible to the first backward there); take it by "
        f"torch.autograd (torch.autograd.functional.hessian, torch.autograd.grad(create_graph=True), "
        f"gradgradcheck), which reads it, or build the matrix function with adjointgen.torch.funm")


def times(F: torch.Tensor, X: torch.Tensor, d: torch.Tensor, k, kind: str, broadening=None) -> torch.Tensor:
    """``F ∘ X`` for ``F_ij = 1/(k d_i - k d_j)`` (``kind="difference"``) or ``1/(k d_i + k d_j)``
    (``"sum"``), masked at clusters.  Inside :func:`declared` for the values ``d`` its derivative in
    ``d`` goes through the block (module docstring); elsewhere it is the plain product."""
    active = _active()
    if broadening is not None or active is None or active.values is not d:
        return F * X
    Fd = F.detach()
    P = -k * Fd * Fd
    Q = -P if kind == "difference" else P
    return _BlockTimes.apply(X, Fd, P, Q, active.mask, _Meta(active.block, len(active.basis)),
                             *active.basis, *active.inputs)


def cut(x):
    """Inside :func:`declared`: the cotangent ``x`` of the rule, unchanged, whose graph (the loss's)
    :func:`_direct_derivative` does not follow; elsewhere ``x`` itself."""
    active = _active()
    if active is None or not isinstance(x, torch.Tensor) or not x.requires_grad:
        return x
    return _Cut.apply(x, active.switch)


def _direct_derivative(v: torch.Tensor, active):
    """``∂v/∂d``, entrywise, of a vector ``v(d)`` of the rule, computed from the declared values
    ``d`` directly (the cotangents' own dependence on them, the loss's, is cut: :func:`cut`);
    ``None`` where ``v`` does not depend on them that way, its graph is hidden by a transform, or
    ``v_i`` depends on other entries than ``d_i`` (then nothing is re-expressed: a second backward
    that needs it raises at the cluster check)."""
    if not isinstance(v, torch.Tensor) or not v.requires_grad or v.is_complex() or \
            v.shape[-1:] != active.values.shape[-1:] or active.values.is_complex():
        return None
    from .gauge import GaugeDependentLossError

    u = (1.5 + torch.sin(1.7 * torch.arange(v.shape[-1], dtype=v.dtype, device=v.device) + 0.3)).expand(v.shape)
    active.switch.on = True
    try:
        dv, = torch.autograd.grad(v, active.values, torch.ones_like(v), retain_graph=True, allow_unused=True)
        if dv is None:
            return None
        du, = torch.autograd.grad(v, active.values, u, retain_graph=True, allow_unused=True)
    except (RuntimeError, GaugeDependentLossError):
        return None
    finally:
        active.switch.on = False
    dv, du = dv.detach(), du.detach()
    try:  # entrywise: the derivative along u is dv * u
        eps = torch.finfo(dv.dtype).eps
        if du is None or not torch.allclose(du, dv * u, rtol=1e3 * eps, atol=1e3 * eps * float(dv.abs().max()) + 1e-300):
            return None
    except RuntimeError:  # batched by a transform: no host decision
        pass
    return dv


def shift_derivative(d: torch.Tensor):
    """``(active, d')`` where the vector ``d`` is an entrywise function of the declared block's
    values (a shifted solve's shifts), else ``(None, None)``."""
    active = _active()
    dv = None if active is None else _direct_derivative(d, active)
    return (None, None) if dv is None else (active, dv)


def _unmoved(v: torch.Tensor, dv: torch.Tensor, active) -> torch.Tensor:
    """``v`` whose derivative along the declared values entry by entry (``dv ∘ dd``) is removed:
    the block puts it back as a matrix."""
    d = active.values
    return v - dv * (d - d.detach())


def _scaled(v: torch.Tensor, X: torch.Tensor, side: str) -> torch.Tensor:
    rows = side == "rows"
    plain = (lambda v: v.unsqueeze(-1) * X) if rows else (lambda v: X * v.unsqueeze(-2))
    active = _active()
    dv = None if active is None else _direct_derivative(v, active)
    if dv is None:
        return plain(v)
    P = dv.unsqueeze(-1 if rows else -2).to(X.dtype)
    zero = torch.zeros((), dtype=X.dtype, device=X.device).expand_as(P)
    moved = _BlockTimes.apply(X, zero, P, P, active.mask, _Meta(active.block, len(active.basis), side=side),
                              *active.basis, *active.inputs)
    return plain(_unmoved(v, dv, active)) + moved


def add_diag(X: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``X + diag(v)``.  Inside :func:`declared`, where ``v`` depends entrywise on the declared
    values (``-w ∘ g_w`` in the generalized eigenproblem's derivative in ``B``), that dependence
    moves them as the block: ``diag(v'(d) ∘ dd)`` becomes ``v'(d) ∘_rows dΛ``."""
    plain = lambda v: torch.diagonal_scatter(X, X.diagonal(dim1=-2, dim2=-1) + v, dim1=-2, dim2=-1)  # noqa: E731
    active = _active()
    dv = None if active is None else _direct_derivative(v, active)
    if dv is None:
        return plain(v)
    D = torch.diag_embed(dv).to(active.dtype)
    return plain(_unmoved(v, dv, active)) + block_term(D, active).to(X.dtype)


def scale_rows(v: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """``diag(v) X``.  Inside :func:`declared`, where ``v`` is an entrywise function of the
    declared values (``1/S`` in the SVD's rules), its derivative moves them as the block:
    ``d(diag(v(d)) X) = (v'(d) ∘_rows dΛ) X`` (a matrix function of the block, ``v'`` being equal
    on a cluster), not entry by entry."""
    return _scaled(v, X, "rows")


def scale_cols(X: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``X diag(v)``, with the derivative of :func:`scale_rows` inside :func:`declared`."""
    return _scaled(v, X, "cols")


def active_for(d: torch.Tensor):
    """The declared block whose values are ``d`` (None outside :func:`declared` for them)."""
    active = _active()
    return active if active is not None and active.values is d else None


def block_term(D: torch.Tensor, active) -> torch.Tensor:
    """Zero, with the derivative ``D dΛ`` (``dΛ`` the block of the values, ``D`` constant): the
    block part of the derivative of a function ``Y(d)`` whose column ``i`` depends on ``d_i`` alone,
    ``D_i = ∂Y_i/∂d_i`` (a shifted solve per eigenvalue), added to ``Y`` evaluated at fixed ``d``."""
    return _BlockTerm.apply(D.detach(), active.mask, _Meta(active.block, len(active.basis)),
                            *active.basis, *active.inputs)


def _direction(mask: torch.Tensor, dtype) -> torch.Tensor:
    """A fixed direction of zero sum inside each cluster of ``mask`` (diagonal included), with
    unequal entries (zero outside clusters)."""
    n = mask.shape[-1]
    m = mask.to(dtype)
    size = m.sum(-1)
    raw = torch.sin(1.7 * torch.arange(n, dtype=dtype, device=mask.device) + 0.3)
    u = raw - (m @ raw.expand_as(size).unsqueeze(-1)).squeeze(-1) / size
    return torch.where(size > 1, u, torch.zeros((), dtype=dtype, device=mask.device))


def loss_curvature(gw):
    """Inside :func:`declared`: ``(g_w', extra)`` for the value cotangent ``g_w`` of a second
    derivative being built, where the loss's own Hessian in the values reaches the next backward
    correctly at clusters (module docstring): ``g_w'`` equals ``g_w`` and passes the cluster means
    of its cotangent on; ``extra`` are zero terms of the block's input cotangents (in the order of
    :attr:`Block.inputs`) whose derivative is ``a (dΛ_c - mean(diag dΛ_c) I)``, or ``None`` where
    ``g_w`` does not depend on the values.  Raises :class:`DegenerateSubspaceError` when the
    loss's Hessian inside a cluster is not that of a symmetric function of its values."""
    active = _active()
    if active is None or not isinstance(gw, torch.Tensor) or not gw.requires_grad:
        return gw, None
    mask = active.mask
    try:
        if not bool((mask.sum(-1) > 1).any()):
            return gw, None
    except RuntimeError:  # batched by a transform: no host decision
        pass
    real = gw.real.dtype if gw.is_complex() else gw.dtype
    u = _direction(mask, real).to(gw.dtype)
    from .gauge import DegenerateSubspaceError, GaugeDependentLossError

    try:
        Hu, = torch.autograd.grad(gw, active.values, u, retain_graph=True, allow_unused=True)
    except (RuntimeError, GaugeDependentLossError):
        # the values are not in the loss's graph here (a transform's copy), or its graph has no
        # second derivative at the cluster (cotangents re-expressed at a cluster, a third order):
        # a second backward, if one is taken, raises there
        return gw, None
    if Hu is None:
        return gw, None
    Hu = Hu.detach()
    m = mask.to(real)
    uu = (u * u.conj()).real
    num = m @ (u.conj() * Hu).real.unsqueeze(-1)
    den = (m @ uu.unsqueeze(-1)).clamp_min(torch.finfo(real).tiny)
    a = torch.where(uu > 0, (num / den).squeeze(-1), torch.zeros((), dtype=real, device=u.device))
    off = (Hu - a * u).abs()
    # the loss's curvature in the values' units, max|g_w| / max|w|, as a floor: at a zero cluster
    # (sum(w**3) there) the Hessian inside it is rounding beside the rest
    floor = (gw.detach().abs().amax(-1, keepdim=True)
             / active.values.detach().abs().amax(-1, keepdim=True).clamp_min(torch.finfo(real).tiny))
    tol = torch.finfo(real).eps ** 0.5 * (Hu.abs().amax(-1, keepdim=True) + (a.abs().amax(-1, keepdim=True) + floor)
                                          * u.abs().amax(-1, keepdim=True))
    from .checks import physical

    plain = physical(off, tol)  # under vmap (jacrev of a gradient): the batch's values
    asymmetric = plain is not None and bool((plain[0] > plain[1]).any())
    if asymmetric:
        # the first derivative is right; the second, through g_w, is not available: it raises when
        # taken (a graph built for one -- create_graph=True, torch.func.grad -- may never be used)
        return no_further_derivative(
            gw, DegenerateSubspaceError,
            "in a second derivative at a cluster of equal values, the loss's second derivative in "
            "those values is not that of a symmetric function of them (it depends on the individual "
            "values of the cluster, which are not differentiable there); V diag(f(w)) V^H built from the "
            "outputs has exact second derivatives through adjointgen.torch.funm"), None
    means = m / m.sum(-1, keepdim=True)
    # the cluster's entries of g_w differ by rounding (the first-order checks said so): their means
    # make the rule's block a multiple of the identity, whose derivative in the basis -- the
    # commutator with the rounding -- would reach the next backward as a residual
    centred = (means.to(gw.dtype) @ gw.detach().unsqueeze(-1)).squeeze(-1)
    gw = gw + (centred - gw.detach())
    D = (a.unsqueeze(-1) * means).to(active.dtype)
    term = _BlockTerm.apply(D, mask, _Meta(active.block, len(active.basis), curvature=True),
                            *active.basis, *active.inputs)
    extra = active.block.vjp(active.basis, term)
    extra = tuple(e.real if e.is_complex() and not x.is_complex() else e for e, x in zip(extra, active.inputs))
    return _ClusterMean.apply(gw, means), extra


def _curvature(D, X):
    """``a (X - mean(diag X) I)`` on each cluster of ``D = a_i / |c(i)|`` (``a`` constant on a
    cluster; zero rows outside clusters): self-adjoint."""
    a = D.sum(-1, keepdim=True)
    on = torch.where(D != 0, X, torch.zeros((), dtype=X.dtype, device=X.device))
    return a * on - torch.diag_embed((D.to(X.dtype) @ X.diagonal(0, -2, -1).unsqueeze(-1)).squeeze(-1))


class _ClusterMean(torch.autograd.Function):
    """The identity, whose derivative (either mode) takes the means inside each cluster."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, means):
        return x.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[1])
        ctx.save_for_forward(inputs[1])

    @staticmethod
    def backward(ctx, g):
        means, = ctx.saved_tensors
        return (means.to(g.dtype) @ g.unsqueeze(-1)).squeeze(-1), None

    @staticmethod
    @_nested_forward
    def jvp(ctx, dx, dmeans):
        means, = ctx.saved_tensors
        return (means.to(dx.dtype) @ dx.unsqueeze(-1)).squeeze(-1)


class _Cut(torch.autograd.Function):
    """The identity, whose derivative is zero while its switch is on (:func:`cut`)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, switch):
        return x.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.switch = inputs[1]

    @staticmethod
    def backward(ctx, g):
        return (torch.zeros_like(g) if ctx.switch.on else g), None

    @staticmethod
    @_nested_forward
    def jvp(ctx, dx, dswitch):
        return dx


class _Meta:
    """The non-tensor arguments of :class:`_BlockTimes` (opaque to the transforms); ``curvature``
    makes :class:`_BlockTerm`'s ``D`` act by :func:`_curvature` instead of ``D @ dΛ``."""

    __slots__ = ("block", "n_basis", "curvature", "side")

    def __init__(self, block, n_basis, curvature=False, side="both"):
        self.block, self.n_basis, self.curvature, self.side = block, n_basis, curvature, side


def _tangents(ctx, dinputs):
    """The inputs' tangents, zeros for those without one."""
    return tuple(torch.zeros(shape, dtype=dtype, device=ctx.saved_tensors[0].device) if t is None else t
                 for t, shape, (dtype, _) in zip(dinputs, ctx.input_shapes, ctx.input_kinds))


def _hermitian_on(mask, M):
    return torch.where(mask, 0.5 * (M + M.mH), torch.zeros((), dtype=M.dtype, device=M.device))


class _BlockTimes(torch.autograd.Function):
    """``F ∘ X`` with the derivative of ``F`` through the block of the values (module docstring);
    the inputs after the basis only receive that derivative."""

    generate_vmap_rule = True

    @staticmethod
    def forward(X, F, P, Q, mask, meta, *rest):
        return F * X

    @staticmethod
    def setup_context(ctx, inputs, output):
        X, F, P, Q, mask, meta, *rest = inputs
        ctx.meta = meta
        ctx.input_kinds = tuple((t.dtype, t.is_complex()) for t in rest[meta.n_basis:])
        ctx.input_shapes = tuple(t.shape for t in rest[meta.n_basis:])
        saved = (X, F, P, Q, mask, *rest[:meta.n_basis])
        ctx.save_for_backward(*saved)
        ctx.save_for_forward(*saved)

    @staticmethod
    def backward(ctx, Z):
        X, F, P, Q, mask, *basis = ctx.saved_tensors
        side = ctx.meta.side  # "rows": F_ij depends on d_i alone, "cols": on d_j, "both": a pairwise F
        M = (P * Z) @ X.mH if side != "cols" else 0
        M = M + X.mH @ (Q * Z) if side != "rows" else M
        M = _hermitian_on(mask, M)
        grads = ctx.meta.block.vjp(basis, M)
        grads = tuple(g.real if g.is_complex() and not complex_ else g
                      for g, (_, complex_) in zip(grads, ctx.input_kinds))
        outs = _NoFurther.apply(F * Z, *grads)
        return (outs[0], None, None, None, None, None, *(None,) * len(basis), *outs[1:])

    @staticmethod
    @_nested_forward
    def jvp(ctx, dX, dF, dP, dQ, dmask, dmeta, *drest):
        X, F, P, Q, mask, *basis = ctx.saved_tensors
        out = F * dX if dX is not None else torch.zeros_like(F * X)
        dinputs = drest[len(basis):]
        if all(t is None for t in dinputs):
            return out
        dL = _hermitian_on(mask, ctx.meta.block.jvp(basis, *_tangents(ctx, dinputs)))
        side = ctx.meta.side
        if side != "cols":
            out = out + P * (dL @ X)
        if side != "rows":
            out = out + Q * (X @ dL)
        return _NoFurther.apply(out)[0]


class _BlockTerm(torch.autograd.Function):
    """:func:`block_term`: zero, with the derivative ``D dΛ`` in the block's inputs."""

    generate_vmap_rule = True

    @staticmethod
    def forward(D, mask, meta, *rest):
        return torch.zeros_like(D)

    @staticmethod
    def setup_context(ctx, inputs, output):
        D, mask, meta, *rest = inputs
        ctx.meta = meta
        ctx.input_kinds = tuple((t.dtype, t.is_complex()) for t in rest[meta.n_basis:])
        ctx.input_shapes = tuple(t.shape for t in rest[meta.n_basis:])
        saved = (D, mask, *rest[:meta.n_basis])
        ctx.save_for_backward(*saved)
        ctx.save_for_forward(*saved)

    @staticmethod
    def backward(ctx, Z):
        D, mask, *basis = ctx.saved_tensors
        M = _hermitian_on(mask, _curvature(D, Z) if ctx.meta.curvature else D.mH @ Z)
        grads = ctx.meta.block.vjp(basis, M)
        grads = tuple(g.real if g.is_complex() and not c else g for g, (_, c) in zip(grads, ctx.input_kinds))
        return (None, None, None, *(None,) * len(basis), *_NoFurther.apply(*grads))

    @staticmethod
    @_nested_forward
    def jvp(ctx, dD, dmask, dmeta, *drest):
        D, mask, *basis = ctx.saved_tensors
        dinputs = drest[len(basis):]
        if all(t is None for t in dinputs):
            return torch.zeros_like(D)
        dL = _hermitian_on(mask, ctx.meta.block.jvp(basis, *_tangents(ctx, dinputs)))
        return _NoFurther.apply(_curvature(D, dL) if ctx.meta.curvature else D @ dL)[0]


class _NoFurther(torch.autograd.Function):
    """The identity, whose derivative raises: :class:`_BlockTimes`'s own derivatives read ``P`` and
    ``Q`` as constants, so a third derivative at a cluster is not available (a clear error)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(*xs):
        return tuple(x.clone() for x in xs)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise _third_order_error()

    @staticmethod
    @_nested_forward
    def jvp(ctx, *tangents):
        raise _third_order_error()


def _third_order_error():
    from .gauge import DegenerateSubspaceError

    return DegenerateSubspaceError(
        "a third derivative at a cluster of equal values is not available (second derivatives there are "
        "exact; the third would need the second divided differences of the rules' pairwise matrices)")

"""Autograd glue for the partial eigensolver: forward by :func:`partial_eigh`, backward and forward
mode by the generated rules of ``derivations/eigsh.py`` and ``derivations/eigsh_generalized.py``.

Dense inputs get the dense cotangent ``gA = sym(...)`` from ``eigsh_vjp``.  Sparse and matrix-free
inputs get the low-rank form ``gA = sym(L R^T)`` from ``eigsh_vjp_factors``: gathered on the
sparsity pattern in O(nnz k), or pushed through the operator's matvec to its parameters — never an
n×n dense tensor.

A ``k`` that cuts through a degenerate eigenvalue (the k-th and (k+1)-th computed eigenvalues equal
to within the solver's resolution, :attr:`PartialEighInfo.split`) leaves the kept pairs of that
cluster arbitrary: which of its eigenvectors are "the k extreme ones" is not determined, and neither
is any function of them — not ``V[:, i]``, not ``w[i]`` (the sum of the k smallest eigenvalues is a
concave function of ``A`` with a kink exactly there, by Ky Fan's principle; it is differentiable
only when the whole cluster is kept).  The forward warns; the backward (and forward mode) raises
:class:`~adjointgen.runtime.gauge.DegenerateSubspaceError` when the cotangent of an affected pair
(``gw[i]`` or ``gV[:, i]`` for ``i`` in ``split``) is nonzero, and differentiates normally when the
loss ignores those pairs.  Forward mode cannot know which outputs the loss uses and raises whenever
the split is present.

Batches: dense ``A`` and ``B`` broadcast over their batch dimensions like torch's (``A`` (3, 3) with
``B`` (2, 3, 3), ``A`` (2, 3, 3) with ``B`` (2, 1, 3, 3) -> batch (2, 2)); an empty batch returns
empty results of the right shapes (and an empty gradient).

Complex Hermitian input (complex64/complex128 ``A``, Hermitian positive definite ``B``; dense,
sparse or a complex :class:`LinearOperator`) returns real eigenvalues and complex eigenvectors and
uses the rules derived for complex data (``eigsh_vjp_complex``, ``eigsh_jvp_complex``, and the
generalized ones). Each eigenvector is defined only up to a phase ``e^{i theta}``: the backward
first evaluates the derived phase residual ``diag(skew(V^H gV))`` and raises
:class:`~adjointgen.runtime.gauge.PhaseDependentLossError` (a ``GaugeDependentLossError``) when the
loss depends on the phases, as :func:`adjointgen.torch.eigh` does (switched off with
:func:`adjointgen.runtime.gauge.set_enabled`). Sparse and matrix-free complex input gets its
low-rank cotangent ``gA = sym(L R^H)`` as the adjoint of the derived complex JVP with respect to
the products ``dA X`` it is made of (the JVP uses ``dA`` only through them): one backward pass over
the JVP, whose shifted solve becomes the same projected solve of ``gV`` as in the real rule.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch

from ..generated.torch import eigsh as rules
from ..generated.torch import eigsh_generalized as rules_generalized
from ..runtime import checks as _checks
from ..runtime import completion as _completion
from ..runtime import degeneracy as _degeneracy
from ..runtime import gauge as _gauge
from ..runtime import value_blocks as _value_blocks
from ..runtime.eigsolvers import partial_eigh
from ..runtime.gauge import DegenerateSubspaceError
from ..runtime.linear_operator import LinearOperator, as_operator, sparse_lowrank_pattern_grad
from ..runtime.solvers import backward_tol, solve_options
from ..runtime.function import nested_forward as _nested_forward


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


def _split_error(spec, w, split, what):
    return _degeneracy.cut_error("eigsh", spec.k, spec.largest, w, split, what)


def _dense_traced(spec, A, B):
    """``(w, V)``: the ``k`` extreme pairs of the dense (generalized) problem by ``eigh`` (through
    the Cholesky factor of ``B``), with no value read on the host: what ``torch.compile`` traces and
    runs (the partial solvers decide on values).  The order (descending when ``largest``) and the
    signs (the largest entry of each vector real and positive) are the partial solvers'."""
    from ..runtime.eigsolvers.common import fix_signs

    if B is None:
        w, V = torch.linalg.eigh(A)
    else:
        L = torch.linalg.cholesky(B)
        C = torch.linalg.solve_triangular(L, torch.linalg.solve_triangular(L, A, upper=False).mH, upper=False)
        w, Y = torch.linalg.eigh(0.5 * (C + C.mH))
        V = torch.linalg.solve_triangular(L.mH, Y, upper=True)
    if spec.largest:
        w, V = w[..., -spec.k:].flip(-1), V[..., -spec.k:].flip(-1)
    else:
        w, V = w[..., :spec.k], V[..., :spec.k]
    return w.clone(), fix_signs(V)


class EigshFunction(torch.autograd.Function):
    """``(w, V, split) = eigsh(A, k, B)`` for one (unbatched) problem; ``split`` (a non-differentiable
    bool mask over the k pairs) marks the kept pairs of a degenerate cluster that ``k`` cuts."""

    @staticmethod
    def forward(spec, A, B, *params):
        if isinstance(A, torch.Tensor) and _dense(A) and _checks.is_traced(A):
            # meta, fake: no values for the partial solvers; a compiler runs what is traced here, so it
            # is the dense solution itself, in eigsh's order and sign convention
            return (*_dense_traced(spec, A, B), _Cut(()), None)  # no info without values
        opA, opB = _operator(spec, A, B, params)
        w, V, info = partial_eigh(opA, spec.k, opB, largest=spec.largest, tol=spec.tol, maxiter=spec.maxiter)
        (V,) = _degeneracy.generic_basis(w, V)  # a generic basis of exactly degenerate kept eigenspaces
        if V.is_complex() and w._base is not None:
            # forward AD (torch 2.x) fails an internal assert for a real output that is a view when the
            # inputs are complex: return the k eigenvalues as a tensor of their own
            w = w.clone()
        return w, V, _Cut(tuple(info.split)), info

    @staticmethod
    def setup_context(ctx, inputs, output):
        spec, A, B, *params = inputs
        w, V, cut, info = output
        # the forward's certifying factorization (and extra Ritz vectors) precondition the solves
        ctx.aid = None if info is None else info.aid
        ctx.spec = spec
        ctx.n_params = len(params)
        ctx.split = cut.split  # the kept pairs of a cluster k cuts (no host read here: vmap calls this)
        ctx.save_for_backward(w, V, A, B, *params)
        ctx.save_for_forward(w, V, A, B)

    @staticmethod
    def backward(ctx, gw, gV, _gcut=None, _ginfo=None):
        w, V, A, B, *params = ctx.saved_tensors
        spec = ctx.spec
        if ctx.split:
            _degeneracy.check_cut("eigsh", spec.k, spec.largest, w, ctx.split, (gw, gV))
        if not params and _dense(A) and (B is None or _dense(B)):
            # dense: per batch element under vmap (the solves and checks decide on values)
            from ..runtime.checks import per_element

            gw = torch.zeros_like(w) if gw is None else gw
            gV = torch.zeros_like(V) if gV is None else gV
            need_B = B is not None and ctx.needs_input_grad[2]
            grads = per_element(lambda *t: _dense_backward(ctx, *t), w, V, A, B, gw, gV)
            return (None, grads[0], grads[1] if need_B else None)
        return _backward(ctx, w, V, A, B, params, gw, gV)

    @staticmethod
    def vmap(info, in_dims, spec, A, B, *params):
        from ..runtime.checks import vmap_by_loop

        if spec.A_op is not None or spec.B_op is not None or not _dense(A) or (B is not None and not _dense(B)):
            raise NotImplementedError("vmap of eigsh needs dense A and B")
        return vmap_by_loop(EigshFunction, info, in_dims, spec, A, B, *params)

    @staticmethod
    @_nested_forward
    def jvp(ctx, _spec_tangent, dA, dB, *dparams):
        w, V, A, B = ctx.saved_tensors
        if ctx.split:
            raise _split_error(ctx.spec, w, ctx.split, "the forward-mode derivative of those pairs")
        if ctx.spec.A_op is not None or not _dense(A) or (B is not None and not _dense(B)):
            raise NotImplementedError("forward mode of eigsh needs dense A and B")
        complex_ = V.is_complex()
        with solve_options(tol=backward_tol(ctx.spec.tol, w.dtype), aid=ctx.aid):
            if B is None:
                dw, dV = (rules.eigsh_jvp_complex if complex_ else rules.eigsh_jvp)(A, w, V, dA)
            else:
                dB = torch.zeros_like(B) if dB is None else dB
                dA = torch.zeros_like(A) if dA is None else dA
                jvp = rules_generalized.eigsh_generalized_jvp_complex if complex_ else rules_generalized.eigsh_generalized_jvp
                dw, dV = jvp(A, B, w, V, dA, dB)
        return dw, dV, None, None


class _Cut:
    """The indices of the kept pairs of a cluster that ``k`` cuts (an opaque output: a tuple would be
    flattened by the transforms); under ``vmap`` those of every batch element."""

    __slots__ = ("split",)

    def __init__(self, split):
        self.split = split

    @classmethod
    def merge(cls, cuts):
        return cls(tuple(sorted(set().union(*(c.split for c in cuts)))))


def _dense_backward(ctx, w, V, A, B, gw, gV):
    """``(gA, gB)`` of one dense problem (``gB`` a zero placeholder for the standard problem)."""
    out = _backward(ctx, w, V, A, B, (), gw, gV)
    gA, gB = out[1], out[2]
    return gA, (torch.zeros((), dtype=w.dtype, device=w.device) if gB is None else gB)


def _backward(ctx, w, V, A, B, params, gw, gV):
    """The backward of one problem: the cluster checks, then the derived rules (dense, sparse or
    matrix-free; complex data by :func:`_complex_backward`)."""
    spec = ctx.spec
    opA, opB = _operator(spec, A, B, params)
    gw = torch.zeros_like(w) if gw is None else gw
    gV = torch.zeros_like(V) if gV is None else gV
    generalized = opB is not None
    V, gw, gV = _cluster_checks(generalized, w, V, gw, gV)
    args = (opA, opB, w, V, gw, gV) if generalized else (opA, w, V, gw, gV)
    module = rules_generalized if generalized else rules
    # a second derivative at a cluster moves its eigenvalues as a block (runtime.value_blocks)
    if not (_gauge.enabled() and _degeneracy.has_clusters(w)):
        return _rules_backward(ctx, spec, module, generalized, args, opA, opB, A, B, params, w, V, gw, gV)
    with _value_blocks.second_order("eigsh_generalized" if generalized else "eigsh", module.VALUE_BLOCK,
                                    dict(w=w, V=V, A=A, B=B), gw, (gV,)) as prepared:
        gw, (gV,) = prepared.values_cotangent, prepared.cotangents
        args = (*args[:-2], gw, gV)
        out = _rules_backward(ctx, spec, module, generalized, args, opA, opB, A, B, params, w, V, gw, gV)
    return (out[0], *prepared.add(out[1:3]), *out[3:])


def _rules_backward(ctx, spec, module, generalized, args, opA, opB, A, B, params, w, V, gw, gV):
    if V.is_complex():
        return _complex_backward(ctx, spec, module, generalized, args, A, B, params, w, V, gw, gV)
    with solve_options(tol=backward_tol(spec.tol, w.dtype), aid=ctx.aid):
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


def _cluster_checks(generalized, w, V, gw, gV):
    """Clusters of equal eigenvalues inside the kept set: a loss through ``V f(w) V^H`` completed
    (:func:`adjointgen.runtime.completion.complete`), then the derived cluster residual checked: a
    loss that depends on the basis inside a cluster, or on its individual eigenvalues, raises."""
    if not _gauge.enabled() or not _degeneracy.has_clusters(w):
        return V, gw, gV
    name = "eigsh_generalized" if generalized else "eigsh"
    V, gw, gV = _completion.complete("eigsh", w, (V,), gw, (gV,))
    module = rules_generalized if generalized else rules
    residual = getattr(module, f"{name}_gauge_clusters{'_complex' if V.is_complex() else ''}")(w, V, gV)
    # (the split of the values is checked where complete() did not re-express the loss: deferred checks)
    split = None if _degeneracy.completing(w) else gw
    _degeneracy.check("eigsh", residual, _degeneracy.cluster_mask(w), split, gV, values=w, gd=gw)
    return V, gw, gV


def _complex_backward(ctx, spec, module, generalized, args, A, B, params, w, V, gw, gV):
    """The backward for complex data: the phase check, then the derived complex VJP (dense input)
    or the low-rank factors of the complex JVP's adjoint (sparse and matrix-free input)."""
    name = "eigsh_generalized" if generalized else "eigsh"
    opA, opB = args[0], (args[1] if generalized else None)
    dense = _dense(opA) and (opB is None or _dense(opB))
    with solve_options(tol=backward_tol(spec.tol, w.dtype), aid=ctx.aid):
        if dense:
            if _gauge.enabled():
                *grads, residual, _clusters = getattr(module, name + "_vjp_complex_checked")(*args)
                _gauge.check("eigsh", residual, gV)
            else:
                grads = getattr(module, name + "_vjp_complex")(*args)
                grads = list(grads) if generalized else [grads]
            gA, gB = grads[0], (grads[1] if generalized else None)
            return (None, gA, gB) + (None,) * ctx.n_params
        if _gauge.enabled():
            _gauge.check("eigsh", getattr(module, name + "_gauge")(V, gV), gV)
        jvp = getattr(module, name + "_jvp_complex")
        factors = _adjoint_factors(jvp, args[:-2], w, V, gw, gV, 2 if generalized else 1)
    (LA, RA), (LB, RB) = factors[0], (factors[1] if generalized else (None, None))
    gA, param_grads_A = _input_gradient(A, spec.A_op, params[: spec.n_params_A], LA, RA, ctx.needs_input_grad[1])
    gB, param_grads_B = (None, ())
    if generalized:
        gB, param_grads_B = _input_gradient(B, spec.B_op, params[spec.n_params_A:], LB, RB, ctx.needs_input_grad[2])
    return (None, gA, gB, *param_grads_A, *param_grads_B)


class _Products:
    """Stands for an input tangent ``dX`` in a generated JVP that uses it only in products
    ``dX @ Y`` (as the derived eigsh rules do): every product returns a fresh zero leaf tensor, and
    its right factor ``Y`` is kept. The JVP is linear in those products, so the gradient of
    ``<g_out, d_out>`` with respect to the leaves, ``G_j``, gives the input cotangent
    ``sum_j G_j Y_j^H`` (before its Hermitian projection): the low-rank VJP factors ``L = [G_j]``,
    ``R = [Y_j]``."""

    def __init__(self):
        self.right: list[torch.Tensor] = []
        self.leaves: list[torch.Tensor] = []

    def __matmul__(self, Y):
        leaf = torch.zeros(Y.shape, dtype=Y.dtype, device=Y.device, requires_grad=True)
        self.right.append(Y.detach())
        self.leaves.append(leaf)
        return leaf


def _adjoint_factors(jvp, primals, w, V, gw, gV, n_tangents):
    """``[(L, R)]`` per input with ``g_in = sym(L R^H)``: the adjoint of ``jvp(*primals, dX...)``
    applied to the cotangents ``(gw, gV)`` (torch's convention: the loss ``<gw, dw> + Re <gV, dV>``),
    by one backward pass through the JVP (its projected shifted solve is then applied to ``gV``, the
    solve being self-adjoint)."""
    tangents = [_Products() for _ in range(n_tangents)]
    # only the products are differentiated (the solve refuses derivatives in its operator)
    primals = [p.detach() if isinstance(p, torch.Tensor) else p for p in primals]
    with torch.enable_grad():
        dw, dV = jvp(*primals, *tangents)
        leaves = [leaf for t in tangents for leaf in t.leaves]
        pairing = (gw.detach() * dw).sum() + (gV.detach().conj() * dV).sum().real
        grads = torch.autograd.grad(pairing, leaves, allow_unused=True)
    grads = iter(grads)
    factors = []
    for t in tangents:
        if not t.leaves:  # the JVP does not use this input
            factors.append((V.new_zeros(V.shape), V))
            continue
        L = [next(grads) for _ in t.leaves]
        L = [torch.zeros_like(leaf) if g is None else g for g, leaf in zip(L, t.leaves)]
        factors.append((torch.cat(L, dim=-1), torch.cat(t.right, dim=-1)))
    return factors


def _input_gradient(X, op, params, L, R, needed):
    """The gradient ``sym(L R^H) = (L R^H + R L^H) / 2`` (Hermitian; ``sym(L R^T)`` for real data,
    where the conjugates are no-ops) in the input's own form (dense, sparse pattern, or the
    operator's parameters by one extra matvec), for the real pairing ``<gA, dA> = Re tr(gA^H dA)``."""
    if op is not None:
        wanted = [p for p in params if isinstance(p, torch.Tensor) and p.requires_grad]
        if not wanted:
            return None, (None,) * len(params)
        with torch.enable_grad():
            detached = [p.detach().requires_grad_() if isinstance(p, torch.Tensor) else p for p in params]
            # Re <sym(L R^H), dA> = Re (sum_r L_r^H dA R_r + R_r^H dA L_r) / 2 for a Hermitian dA
            total = 0.5 * ((L.detach().conj() * op._matvec(R.detach(), *detached)).sum()
                           + (R.detach().conj() * op._matvec(L.detach(), *detached)).sum()).real
            tensors = [p for p in detached if isinstance(p, torch.Tensor) and p.requires_grad]
            grads = iter(torch.autograd.grad(total, tensors, allow_unused=True))
        return None, tuple(next(grads) if isinstance(p, torch.Tensor) and p.requires_grad else None for p in params)
    if X is None or not needed:
        return None, ()
    if _dense(X):
        return 0.5 * (L @ R.mH + R @ L.mH), ()
    half = sparse_lowrank_pattern_grad(X, 0.5 * L, R.conj())
    other = sparse_lowrank_pattern_grad(X, 0.5 * R, L.conj())
    if X.layout == torch.sparse_csr:
        values = half.values() + other.values()
        return torch.sparse_csr_tensor(X.crow_indices(), X.col_indices(), values, X.shape,
                                       check_invariants=False), ()
    # _indices/_values: the user's COO tensor may be uncoalesced (the gradient keeps its entries)
    return torch.sparse_coo_tensor(half._indices(), half._values() + other._values(), X.shape,
                                   is_coalesced=X.is_coalesced(), check_invariants=False), ()


def _check_k(k):
    """``k`` as a Python int: integers (also numpy/torch integer scalars) only, never a bool."""
    if isinstance(k, bool) or (isinstance(k, torch.Tensor) and k.dtype == torch.bool):
        raise ValueError(f"eigsh: k must be an integer, got {k!r}")
    if isinstance(k, torch.Tensor) and (k.dim() != 0 or k.is_floating_point() or k.is_complex()):
        raise ValueError(f"eigsh: k must be an integer, got {k!r}")
    try:
        return operator.index(k)
    except TypeError:
        raise ValueError(f"eigsh: k must be an integer, got {k!r} ({type(k).__name__})") from None


def _empty_batch(A, B, k, batch, n):
    """Empty results connected to ``A`` (and ``B``) so that autograd returns empty gradients."""
    if not 1 <= k <= n:
        raise ValueError(f"eigsh: k must satisfy 1 <= k <= n = {n}, got k = {k}")
    Ab = A.expand(*batch, n, n)
    anchor = Ab.sum((-2, -1)) * 0
    if B is not None:
        anchor = anchor + B.expand(*batch, n, n).sum((-2, -1)) * 0
    w = (anchor.real if anchor.is_complex() else anchor).unsqueeze(-1).expand(*batch, k)  # real eigenvalues
    V = (Ab[..., :, :1] * 0 + anchor[..., None, None]).expand(*batch, n, k)
    return w, V


def _as_input(X):
    """Torch tensors and LinearOperators as they are; numpy arrays, scipy sparse matrices and scipy
    LinearOperators converted (to a dense tensor, a torch CSR tensor, a LinearOperator)."""
    if X is None or isinstance(X, (torch.Tensor, LinearOperator)):
        return X
    op = as_operator(X)
    return getattr(op, "matrix", op)


def eigsh(A, k, B=None, *, largest=True, tol=None, maxiter=None, return_info=False):
    """See :func:`adjointgen.torch.eigsh`."""
    k = _check_k(k)
    batched = (_dense(A) and A.dim() > 2) or (_dense(B) and B.dim() > 2)
    if batched:
        if not _dense(A) or (B is not None and not _dense(B)):
            raise ValueError("eigsh: batched input (more than 2 dimensions) must be dense, for A and B")
        if A.dim() < 2 or (B is not None and B.dim() < 2):
            raise ValueError("eigsh: A and B must have shape (..., n, n)")
        if B is not None and B.shape[-2:] != A.shape[-2:]:
            raise ValueError(
                f"eigsh: A and B must have the same matrix shape, got {tuple(A.shape)} and {tuple(B.shape)}")
        try:
            batch = torch.broadcast_shapes(A.shape[:-2], () if B is None else B.shape[:-2])
        except RuntimeError:
            raise ValueError(f"eigsh: the batch shapes of A {tuple(A.shape)} and B {tuple(B.shape)} do not "
                             "broadcast") from None
        n = A.shape[-1]
        if not 1 <= k <= n:
            raise ValueError(f"eigsh: k must satisfy 1 <= k <= n = {n}, got k = {k}")
        if math.prod(batch) == 0:
            return (*_empty_batch(A, B, k, batch, n), []) if return_info else _empty_batch(A, B, k, batch, n)
        Af = A.expand(*batch, *A.shape[-2:]).reshape(-1, *A.shape[-2:])
        Bf = None if B is None else B.expand(*batch, *B.shape[-2:]).reshape(-1, *B.shape[-2:])
        outs = [eigsh(Af[i], k, None if Bf is None else Bf[i], largest=largest, tol=tol, maxiter=maxiter,
                      return_info=True) for i in range(Af.shape[0])]
        w = torch.stack([o[0] for o in outs]).reshape(*batch, -1)
        V = torch.stack([o[1] for o in outs]).reshape(*batch, n, -1)
        return (w, V, [o[2] for o in outs]) if return_info else (w, V)
    A, B = _as_input(A), _as_input(B)
    A_op = A if isinstance(A, LinearOperator) else None
    B_op = B if isinstance(B, LinearOperator) else None
    params_A = tuple(A_op.params) if A_op is not None else ()
    params_B = tuple(B_op.params) if B_op is not None else ()
    spec = _Spec(k, bool(largest), tol, maxiter, A_op, B_op, len(params_A))
    w, V, _split, info = EigshFunction.apply(spec, None if A_op is not None else A, None if B_op is not None else B,
                                             *params_A, *params_B)
    return (w, V, info) if return_info else (w, V)

"""Clusters of equal eigenvalues and singular values: detection, and the checks of the backward.

Inside a cluster of equal eigenvalues the eigenvectors are free, ``U_c -> U_c Q`` (Q orthogonal,
unitary for complex data): a gauge, like the phases.  The derivations declare it
(``d.clusters(D)``, a parameter ``within=K``) and the engine derives the loss's derivative along it,
the cluster blocks of ``skew(U^T gU)`` (``skew(U^T gU + V^T gV)`` for the SVD).  The generated
backward then

* takes the rule's reciprocal gaps as zero inside a cluster (so neither ``inf`` nor ``inf * 0 =
  NaN`` is formed, also in second derivatives, and a missing cotangent contributes nothing);
* raises :class:`~adjointgen.runtime.gauge.DegenerateSubspaceError` when the derived residual is not
  zero: the loss depends on the basis chosen inside the cluster, so it has no gradient;
* raises it too when the loss depends on the individual eigenvalues of a cluster (their cotangents
  differ inside it): at exact degeneracy only symmetric functions of a cluster's eigenvalues are
  differentiable.  This also catches a matrix function written as ``V diag(f(w)) V^T``, whose
  gradient at a degeneracy needs the divided differences of ``f``, which the eigendecomposition's
  cotangents do not carry: use :func:`adjointgen.torch.funm` (exact there) instead.

Two eigenvalues are in one cluster when ``|d_i - d_j| <= rtol * max_k |d_k|`` (per matrix), with
``rtol`` from :func:`set_rtol` / :func:`tolerance` or the public functions' ``cluster_rtol``
argument; the default is ``sqrt(eps)`` of the dtype (1.5e-8 in float64, 3.5e-4 in float32): gaps
below it are where the reciprocal-gap terms would amplify rounding errors by more than
``1/sqrt(eps)``.  The checks read values on the host (a synchronisation on GPUs) and are switched
off with the phase check, :func:`adjointgen.runtime.gauge.set_enabled`.
"""
from __future__ import annotations

import contextlib
import math

import torch

__all__ = ["check", "cluster_mask", "default_rtol", "negligible", "pairs_apart", "reciprocal", "set_rtol", "tolerance", "zero_mask"]

_RTOL: float | None = None
#: whether :func:`pairs_apart` may report separated values (off inside :func:`formed_products`)
_FUSED = True


@contextlib.contextmanager
def formed_products():
    """``with formed_products(): ...`` -- every reciprocal-gap product forms its masked matrix (the
    path taken at clusters), as if no values were apart: how the code generator checks that path
    on instances whose values are apart."""
    global _FUSED
    previous, _FUSED = _FUSED, False
    try:
        yield
    finally:
        _FUSED = previous


def default_rtol(dtype: torch.dtype) -> float:
    """The relative cluster tolerance in use for ``dtype``."""
    if _RTOL is not None:
        return _RTOL
    real = torch.empty((), dtype=dtype).real.dtype if dtype.is_complex else dtype
    return math.sqrt(torch.finfo(real).eps)


def set_rtol(rtol: float | None) -> None:
    """Set the process-wide relative cluster tolerance (``None``: ``sqrt(eps)`` of each dtype)."""
    global _RTOL
    if rtol is not None and not rtol >= 0:
        raise ValueError(f"cluster rtol must be non-negative, got {rtol}")
    _RTOL = None if rtol is None else float(rtol)


@contextlib.contextmanager
def tolerance(rtol: float | None):
    """``with tolerance(1e-6): loss.backward()`` -- a relative cluster tolerance for the block."""
    previous = _RTOL
    set_rtol(rtol)
    try:
        yield
    finally:
        set_rtol(previous)


def cluster_mask(d: torch.Tensor, rtol: float | None = None) -> torch.Tensor:
    """``(..., n, n)`` booleans: ``i != j`` with ``|d_i - d_j| <= rtol * max_k |d_k|``."""
    rtol = default_rtol(d.dtype) if rtol is None else float(rtol)
    with torch.no_grad():
        d = d.detach()
        scale = d.abs().amax(-1, keepdim=True) if d.shape[-1] else d.new_ones(*d.shape[:-1], 1)
        scale = scale.clamp_min(torch.finfo(d.dtype).tiny).unsqueeze(-1)
        close = (d.unsqueeze(-1) - d.unsqueeze(-2)).abs() <= rtol * scale
        eye = torch.eye(d.shape[-1], dtype=torch.bool, device=d.device)
        return close & ~eye


def has_clusters(d: torch.Tensor, rtol: float | None = None) -> bool:
    """Whether any two entries of a vector of ``d`` (any batch element) form a cluster, as
    :func:`cluster_mask` has it, in ``O(n log n)``: neighbours after sorting (the backward skips
    the cluster residual, which is zero, when there is none).  ``False`` for a tensor batched by
    ``vmap``, where :func:`check` cannot raise and is skipped."""
    from .checks import _is_traced

    if d.shape[-1] < 2 or d.numel() == 0 or _is_traced(d):  # under vmap the check is skipped anyway
        return False
    return _close_pair(d, "difference", default_rtol(d.dtype) if rtol is None else float(rtol))


#: the last few answers of :func:`_close_pair` (a backward asks for the same vector twice: the
#: gauge check, then the reciprocal-gap products), keyed by the tensor and its version counter
_RECENT: list = []


def _host_array(x: torch.Tensor):
    """``x`` as a NumPy array when it is a plain real CPU tensor (not a transform's wrapper), else ``None``."""
    if x.device.type != "cpu" or x.is_complex():
        return None
    try:
        from torch._C._functorch import is_functorch_wrapped_tensor

        if is_functorch_wrapped_tensor(x):
            return None
    except ImportError:  # pragma: no cover - older torch
        pass
    try:
        return x.resolve_conj().resolve_neg().numpy()
    except (RuntimeError, TypeError):  # no storage (a tensor subclass), an unsupported dtype
        return None


def _close_pair(d: torch.Tensor, kind: str, rtol: float) -> bool:
    """Whether two entries of ``d`` (of ``d`` and ``-d`` for a ``sum``) are within ``rtol`` times the
    largest ``|d|``: sorted neighbours, on the host."""
    import weakref

    key = (id(d), d._version, kind, rtol)
    for ref, k, answer in _RECENT:
        if k == key and ref() is d:
            return answer
    x = d.detach()
    v = _host_array(x)
    if v is not None:  # a host vector: NumPy's small-array calls are cheaper than a dozen torch calls
        import numpy as np

        scale = np.maximum(np.abs(v).max(-1, keepdims=True), np.finfo(v.dtype).tiny)
        v = v if kind == "difference" else np.concatenate([v, -v], axis=-1)  # d_i + d_j = d_i - (-d_j)
        answer = bool(v.shape[-1] >= 2 and (np.diff(np.sort(v, axis=-1), axis=-1) <= rtol * scale).any())
    else:
        with torch.no_grad():
            scale = x.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
            values = x if kind == "difference" else torch.cat([x, -x], dim=-1)
            answer = False
            if values.shape[-1] >= 2:
                gaps = torch.diff(values.sort(-1).values, dim=-1)
                answer = bool((gaps <= rtol * scale).any())
    try:
        _RECENT.insert(0, (weakref.ref(d), key, answer))
        del _RECENT[4:]
    except TypeError:  # a tensor subclass without weak references: no memory
        pass
    return answer


def pairs_apart(d: torch.Tensor, kind: str, rtol: float | None = None) -> bool:
    """Whether no pair of entries makes a pairwise denominator vanish, as :func:`negligible` has it,
    off the diagonal of a ``difference`` ``d_i - d_j`` (no clusters) or anywhere for a ``sum``
    ``d_i + d_j`` (no ``d_i`` near ``-d_j``, no ``d_i`` near 0): then the denominator needs no mask.
    ``O(n log n)`` on the host; ``False`` (unknown) while a transform traces the values."""
    from .checks import _is_traced

    if not _FUSED or _is_traced(d):
        return False
    if d.numel() == 0:
        return True
    return not _close_pair(d, kind, default_rtol(d.dtype) if rtol is None else float(rtol))


def negligible(denominator: torch.Tensor, d: torch.Tensor, rtol: float | None = None) -> torch.Tensor:
    """The pairs where a pairwise denominator vanishes and its entry is taken as zero:
    ``|den_ij| <= rtol * max_k |d_k|`` -- the diagonal and a cluster of equal values for the gap
    ``d_j - d_i``, a pair of zero singular values for ``s_i + s_j``."""
    rtol = default_rtol(d.dtype) if rtol is None else float(rtol)
    with torch.no_grad():
        scale = d.detach().abs().amax(-1, keepdim=True) if d.shape[-1] else d.new_ones(*d.shape[:-1], 1)
        scale = scale.clamp_min(torch.finfo(d.dtype).tiny).unsqueeze(-1)
        return denominator.detach().abs() <= rtol * scale


def zero_mask(s: torch.Tensor, rtol: float | None = None) -> torch.Tensor:
    """``(..., k)`` booleans: ``|s_i| <= rtol * max_j |s_j|`` (zero singular values)."""
    rtol = default_rtol(s.dtype) if rtol is None else float(rtol)
    with torch.no_grad():
        scale = s.detach().abs().amax(-1, keepdim=True) if s.shape[-1] else s.new_ones(*s.shape[:-1], 1)
        return s.detach().abs() <= rtol * scale.clamp_min(torch.finfo(s.dtype).tiny)


def reciprocal(s: torch.Tensor, rtol: float | None = None) -> torch.Tensor:
    """``1/s``, and 0 where ``s`` vanishes (:func:`zero_mask`): the gauge of the singular vectors of
    zero singular values leaves those terms free.  No ``1/0`` is formed, also in second derivatives."""
    zero = zero_mask(s, rtol)
    return torch.where(zero, 0, 1 / torch.where(zero, 1, s))


def _clusters_of(mask: torch.Tensor) -> list[list[int]]:
    """The clusters (index lists, size >= 2) of one matrix's mask."""
    n = mask.shape[-1]
    seen, out = set(), []
    for i in range(n):
        if i in seen:
            continue
        members = [i] + [int(j) for j in mask[i].nonzero().flatten().tolist() if int(j) != i]
        if len(members) > 1:
            out.append(sorted(set(members)))
        seen.update(members)
    return out


def check(op: str, residual: torch.Tensor, clusters: torch.Tensor, split: torch.Tensor | None, *cotangents,
          what: str = "eigenvalues") -> None:
    """Raise :class:`DegenerateSubspaceError` when, inside a cluster of equal ``what``, the loss
    depends on the basis (the derived residual is not zero) or on the individual values (their
    cotangents ``split`` differ)."""
    from .checks import _is_traced
    from .gauge import DegenerateSubspaceError

    if _is_traced(residual) or clusters.numel() == 0:
        return
    with torch.no_grad():
        if not bool(clusters.any()):
            return
        real = residual.real.dtype if residual.is_complex() else residual.dtype
        eps = torch.finfo(real).eps
        tiny = torch.finfo(real).tiny
        norms = sum(torch.linalg.vector_norm(g, dim=-2) for g in cotangents) if cotangents else None
        bad_basis = torch.zeros_like(clusters)
        if norms is not None:
            scale = norms.unsqueeze(-1) + norms.unsqueeze(-2)
            bad_basis = clusters & (residual.abs() > math.sqrt(eps) * scale + tiny)
        bad_split = torch.zeros_like(clusters)
        if split is not None:
            g = split.real if split.is_complex() else split
            level = g.abs().amax(-1, keepdim=True).unsqueeze(-1)
            spread = (g.unsqueeze(-1) - g.unsqueeze(-2)).abs()
            bad_split = clusters & (spread > max(math.sqrt(eps), 100 * default_rtol(real)) * level + tiny)
        if not bool((bad_basis | bad_split).any()):
            return
        flat_mask = clusters.reshape(-1, *clusters.shape[-2:])
        flat_bad = (bad_basis | bad_split).reshape(-1, *clusters.shape[-2:])
        b = int(flat_bad.any(-1).any(-1).nonzero()[0])
        members = next(c for c in _clusters_of(flat_mask[b]) if bool(flat_bad[b][c][:, c].any()))
        where = f"batch index {b}, " if clusters.dim() > 2 else ""
        if bool(bad_basis.reshape(flat_bad.shape)[b].any()):
            reason = (f"the loss depends on the basis chosen inside the cluster ({where}{what} {members} are equal "
                      f"within the cluster tolerance): any rotation of those vectors is as valid, so the loss has "
                      f"no gradient; use a loss that depends on them only through their span (e.g. the "
                      f"projector onto the cluster)")
        else:
            reason = (f"the loss depends on the individual {what} of a cluster ({where}{what} {members} are equal "
                      f"within the cluster tolerance), which are not differentiable there; only symmetric "
                      f"functions of a cluster (their sum, the projector onto it) are.  A matrix function written "
                      f"as V diag(f(w)) V^T needs the divided differences of f: use adjointgen.torch.funm")
        raise DegenerateSubspaceError(
            f"{op}: {reason}. Set the tolerance with cluster_rtol= (or adjointgen.runtime.degeneracy.set_rtol), "
            "use broadening= for a biased finite surrogate, or disable the check with "
            "adjointgen.runtime.gauge.set_enabled(False)")

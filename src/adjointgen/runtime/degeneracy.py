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

Forward mode cannot see the loss that follows; its masked quotients raise instead
(:func:`check_tangent`) when the direction splits a cluster, whose block the tangents cannot carry.

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

from . import gauge
from .checks import _all_finite, host_values, is_traced, physical
from .gauge import tangent_split_error
from .verdict import deferred, verdict

__all__ = [
    "check",
    "check_tangent",
    "cluster_mask",
    "default_rtol",
    "negligible",
    "pairs_apart",
    "reciprocal",
    "set_rtol",
    "tolerance",
    "zero_mask",
]

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
    found = _DEFAULT_RTOL.get(dtype)
    if found is None:
        real = torch.empty((), dtype=dtype).real.dtype if dtype.is_complex else dtype
        found = _DEFAULT_RTOL[dtype] = math.sqrt(torch.finfo(real).eps)
    return found


_DEFAULT_RTOL: dict = {}


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
        scale = d.abs().amax(-1, keepdim=True) if d.shape[-1] else d.abs().new_ones(*d.shape[:-1], 1)
        scale = scale.clamp_min(torch.finfo(scale.dtype).tiny).unsqueeze(-1)
        close = (d.unsqueeze(-1) - d.unsqueeze(-2)).abs() <= rtol * scale
        eye = torch.eye(d.shape[-1], dtype=torch.bool, device=d.device)
        return close & ~eye


def has_clusters(d: torch.Tensor, rtol: float | None = None) -> bool:
    """Whether any two entries of a vector of ``d`` (any batch element) form a cluster, as
    :func:`cluster_mask` has it, in ``O(n log n)``: neighbours after sorting (the backward skips
    the cluster residual, which is zero, when there is none).  ``False`` for a tensor batched by
    ``vmap``, where :func:`check` cannot raise and is skipped."""
    if d.shape[-1] < 2 or d.numel() == 0:
        return False
    rtol = default_rtol(d.dtype) if rtol is None else float(rtol)
    small = None if d.is_complex() else host_values(d)
    if small is not None:  # (a plain CPU tensor of a few values)
        n = d.shape[-1]
        return _close_pair_small([small[i:i + n] for i in range(0, len(small), n)], False, rtol)
    plain = physical(d)
    if plain is None:  # a compiler traces the values: no host decision (the check is skipped too)
        return False
    return _close_pair(plain[0], "difference", rtol)


def maybe_clusters(d: torch.Tensor, rtol: float | None = None) -> bool:
    """Whether ``d`` may have a cluster: :func:`has_clusters`, or ``True`` without a read where the
    checks are deferred (:mod:`adjointgen.runtime.verdict`): the checked path then runs, on the device."""
    return deferred(d) or has_clusters(d, rtol)


def completing(d: torch.Tensor) -> bool:
    """Whether :func:`complete` re-expresses a loss at a cluster of ``d`` (it reads the cluster on the
    host): not where the checks are deferred, where the split of the values is checked instead."""
    return not deferred(d)


#: the last few answers of :func:`_close_pair` (a backward asks for the same vector twice: the
#: gauge check, then the reciprocal-gap products), keyed by the tensor and its version counter
_RECENT: list = []


def _host_array(x: torch.Tensor):
    """``x`` as a NumPy array when it is a plain CPU tensor (not a transform's wrapper), else ``None``."""
    if x.device.type != "cpu":
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

    small = None if d.is_complex() else host_values(d)
    if small is not None:  # a few real values on the CPU: plain Python, cheaper than remembering the answer
        n = d.shape[-1]
        return _close_pair_small([small[i:i + n] for i in range(0, len(small), n)], kind == "sum", rtol)
    key = (id(d), d._version, kind, rtol)
    for ref, k, answer in _RECENT:
        if k == key and ref() is d:
            return answer
    x = d.detach()
    v = _host_array(x)
    if v is not None and v.size <= 64 and not v.dtype.kind == "c":  # a few values: plain Python is cheapest
        answer = _close_pair_small(v.reshape(-1, v.shape[-1]).tolist(), kind == "sum", rtol)
    elif v is not None:  # a host vector: NumPy's small-array calls are cheaper than a dozen torch calls
        import numpy as np

        scale = np.maximum(np.abs(v).max(-1, keepdims=True), np.finfo(v.dtype).tiny)
        v = v if kind == "difference" else np.concatenate([v, -v], axis=-1)  # d_i + d_j = d_i - (-d_j)
        if np.iscomplexobj(v):
            answer = _close_in_plane(v, rtol * scale)
        else:
            answer = bool(v.shape[-1] >= 2 and (np.diff(np.sort(v, axis=-1), axis=-1) <= rtol * scale).any())
    else:
        with torch.no_grad():
            scale = x.abs().amax(-1, keepdim=True)
            scale = scale.clamp_min(torch.finfo(scale.dtype).tiny)
            values = x if kind == "difference" else torch.cat([x, -x], dim=-1)
            answer = False
            if values.shape[-1] >= 2 and values.is_complex():  # points of the plane: every pair
                gaps = (values.unsqueeze(-1) - values.unsqueeze(-2)).abs()
                gaps = gaps + torch.diag_embed(torch.full_like(gaps[..., 0], torch.inf))
                answer = bool((gaps <= rtol * scale.unsqueeze(-1)).any())
            elif values.shape[-1] >= 2:
                gaps = torch.diff(values.sort(-1).values, dim=-1)
                answer = bool((gaps <= rtol * scale).any())
    try:
        _RECENT.insert(0, (weakref.ref(d), key, answer))
        del _RECENT[4:]
    except TypeError:  # a tensor subclass without weak references: no memory
        pass
    return answer


def _close_pair_small(rows, plus: bool, rtol: float) -> bool:
    """:func:`_close_pair` of a few real values (a list of rows) in plain Python."""
    for row in rows:
        if not row:
            continue
        scale = max(max(map(abs, row)), 2.2250738585072014e-308)
        values = sorted(row + [-x for x in row]) if plus else sorted(row)
        tol = rtol * scale
        if any(b - a <= tol for a, b in zip(values, values[1:])):
            return True
    return False


def _close_in_plane(v, tol) -> bool:
    """Whether two entries of each row of complex ``v`` are within ``tol`` (``(..., 1)``): sorted by
    real part, a close pair is ``s`` places apart with real parts within ``tol``, so the shifts stop
    at the first one whose real gaps all exceed it (one or two for separated values)."""
    import numpy as np

    n = v.shape[-1]
    s = np.take_along_axis(v, np.argsort(v.real, axis=-1), axis=-1)
    for shift in range(1, n):
        near = (s.real[..., shift:] - s.real[..., :-shift]) <= tol
        if not near.any():
            return False
        if (near & (np.abs(s[..., shift:] - s[..., :-shift]) <= tol)).any():
            return True
    return False


def pairs_apart(d: torch.Tensor, kind: str, rtol: float | None = None) -> bool:
    """Whether no pair of entries makes a pairwise denominator vanish, as :func:`negligible` has it,
    off the diagonal of a ``difference`` ``d_i - d_j`` (no clusters) or anywhere for a ``sum``
    ``d_i + d_j`` (no ``d_i`` near ``-d_j``, no ``d_i`` near 0): then the denominator needs no mask.
    ``O(n log n)`` on the host; ``False`` (unknown) while a transform traces the values, and on a
    GPU while the gauge checks are off (the answer would be the backward's only host
    synchronisation: the masked product needs none)."""
    if not _FUSED or is_traced(d) or deferred(d) or (d.device.type != "cpu" and not gauge.enabled()):
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
        scale = d.detach().abs().amax(-1, keepdim=True) if d.shape[-1] else d.abs().new_ones(*d.shape[:-1], 1)
        scale = scale.clamp_min(torch.finfo(scale.dtype).tiny).unsqueeze(-1)
        return denominator.detach().abs() <= rtol * scale


def zero_mask(s: torch.Tensor, rtol: float | None = None) -> torch.Tensor:
    """``(..., k)`` booleans: ``|s_i| <= rtol * max_j |s_j|`` (zero singular values)."""
    rtol = default_rtol(s.dtype) if rtol is None else float(rtol)
    with torch.no_grad():
        scale = s.detach().abs().amax(-1, keepdim=True) if s.shape[-1] else s.abs().new_ones(*s.shape[:-1], 1)
        return s.detach().abs() <= rtol * scale.clamp_min(torch.finfo(scale.dtype).tiny)


def any_zero(s: torch.Tensor, rtol: float | None = None) -> bool:
    """Whether :func:`zero_mask` holds anywhere, read on the host (``s`` a plain tensor: no compiler
    or ``vmap`` wrapper; a few real values on the CPU are tested in plain Python)."""
    small = None if s.is_complex() or s.shape[-1] == 0 else host_values(s)
    if small is not None and _all_finite(small):
        n, rtol = s.shape[-1], default_rtol(s.dtype) if rtol is None else float(rtol)
        for i in range(0, len(small), n):
            row = small[i:i + n]
            tol = rtol * max(max(map(abs, row)), 2.2250738585072014e-308)
            if any(abs(v) <= tol for v in row):
                return True
        return False
    return bool(zero_mask(s, rtol).any())


def reciprocal(s: torch.Tensor, rtol: float | None = None) -> torch.Tensor:
    """``1/s``, and 0 where ``s`` vanishes (:func:`zero_mask`): the gauge of the singular vectors of
    zero singular values leaves those terms free.  No ``1/0`` is formed, also in second derivatives."""
    zero = zero_mask(s, rtol)
    return torch.where(zero, 0, 1 / torch.where(zero, 1, s))


def _clusters_of(mask: torch.Tensor) -> list[list[int]]:
    """The clusters (index lists, size >= 2) of one matrix's mask (tensor operations: the mask may
    be a ``torch.func`` tensor, which has no storage to hand NumPy)."""
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
          what: str = "eigenvalues", values: torch.Tensor | None = None, gd: torch.Tensor | None = None) -> None:
    """Raise :class:`DegenerateSubspaceError` when, inside a cluster of equal ``what``, the loss
    depends on the basis (the derived residual is not zero) or on the individual values (their
    cotangents ``split`` differ); ``values`` (the eigen- or singular values) name the cluster in
    the message.

    A residual counts against the cotangents of its own vectors and, with ``values`` and the value
    cotangent ``gd`` (``split``, or passed as ``gd=`` where the split is not checked), against what
    the rule drops with it: its quotient by the pair's gap ``d_j - d_i`` (the within-cluster term
    of the gradient, zero in the rule) below ``sqrt(eps)`` of the gradient's size
    ``max|gd| + max|gV| / max|d|``.  A loss through ``V f(D) V^H`` with ``f(d_c) = f'(d_c) = 0``
    (``(A - λ)^2`` at a cluster at ``λ``, ``A^2`` at a zero cluster) has cotangents of the size of
    the cluster's rounding there, a residual that is large beside them and negligible beside the
    gradient."""
    from .checks import physical
    from .gauge import DegenerateSubspaceError, describe_cluster

    if clusters.numel() == 0:
        return
    if gd is None:
        gd = split
    plain = physical(residual, clusters, split, values, gd, *cotangents)
    if plain is None:  # a compiler traces the values
        return
    residual, clusters, split, values, gd, *cotangents = plain
    if not deferred(clusters) and not bool(clusters.any()):  # (eager: no cluster, nothing more to read)
        return
    with torch.no_grad():
        real = residual.real.dtype if residual.is_complex() else residual.dtype
        eps = torch.finfo(real).eps
        tiny = torch.finfo(real).tiny
        norms = sum(torch.linalg.vector_norm(g, dim=-2) for g in cotangents) if cotangents else None
        bad_basis = torch.zeros_like(clusters)
        if norms is not None:
            scale = norms.unsqueeze(-1) + norms.unsqueeze(-2)
            if norms.shape[-1]:  # the cotangents' own rounding: n eps of their largest column (a column that is
                # zero in exact arithmetic -- a second derivative's, off the loss's eigenspace -- is rounding)
                scale = scale + (norms.amax(-1, keepdim=True) * (norms.shape[-1] * math.sqrt(eps))).unsqueeze(-1)
            if values is not None and gd is not None and values.shape[-1] and not values.is_complex():
                # the dropped quotient residual / (d_j - d_i) against the gradient's size
                size = values.abs().amax(-1, keepdim=True).clamp_min(tiny)
                gradient = gd.abs().amax(-1, keepdim=True) + norms.amax(-1, keepdim=True) / size
                gaps = (values.unsqueeze(-1) - values.unsqueeze(-2)).abs()
                scale = scale + gaps * gradient.unsqueeze(-1)
            bad_basis = clusters & (residual.abs() > math.sqrt(eps) * scale + tiny)
        bad_split = torch.zeros_like(clusters)
        if split is not None:
            g = split  # complex values (eig): their complex differences
            level = g.abs().amax(-1, keepdim=True).unsqueeze(-1)
            if norms is not None and values is not None and values.shape[-1]:
                # the size of the whole gradient in the units of g (vectors are unit-free): rounding of
                # the vectors' terms that reaches g (a second backward's cancellations) is not a split
                size = values.abs().amax(-1, keepdim=True).clamp_min(tiny)
                level = level + (norms.amax(-1, keepdim=True) / size).unsqueeze(-1)
            spread = (g.unsqueeze(-1) - g.unsqueeze(-2)).abs()
            bad_split = clusters & (spread > max(math.sqrt(eps), 100 * default_rtol(real)) * level + tiny)

    late = deferred(clusters)

    def error():
        flat_mask = clusters.reshape(-1, *clusters.shape[-2:])
        flat_bad = (bad_basis | bad_split).reshape(-1, *clusters.shape[-2:])
        b = int(flat_bad.any(-1).any(-1).nonzero()[0])
        members = next(c for c in _clusters_of(flat_mask[b]) if bool(flat_bad[b][c][:, c].any()))
        where = f"batch index {b}, " if clusters.dim() > 2 else ""
        rows = None if values is None else values.detach().reshape(-1, values.shape[-1])
        named = describe_cluster(members, None if rows is None or not rows.shape[0] else rows[b % rows.shape[0]].cpu(),
                                 what)
        if bool(bad_basis.reshape(flat_bad.shape)[b].any()):
            reason = (f"the loss depends on the basis chosen inside the cluster ({where}{named} are equal "
                      f"within the cluster tolerance): any rotation of those vectors is as valid, so the loss has "
                      f"no gradient; use a loss that depends on them only through their span (e.g. the "
                      f"projector onto the cluster)")
        else:
            reason = (f"the loss depends on the individual {what} of a cluster ({where}{named} are equal "
                      f"within the cluster tolerance), which are not differentiable there; only symmetric "
                      f"functions of a cluster (their sum, the projector onto it) are.  A matrix function written "
                      f"as V diag(f(w)) V^T (V diag(f(w)) V^-1) needs the divided differences of f: use "
                      f"adjointgen.torch.funm (matrix_exp, logm, sqrtm for a general matrix).  In a "
                      f"second derivative the loss is the first derivative, which depends on a cluster this way "
                      f"for every loss but symmetric functions of its values")
            if late:
                reason += ("; the checks were deferred (adjointgen.runtime.verdict), a mode which cannot re-express "
                           "a loss through V f(D) V^H at a cluster (that needs the cluster on the host): the eager "
                           "mode, with adjointgen.checking('eager'), gives its exact gradient")
        return DegenerateSubspaceError(
            f"{op}: {reason}. Set the tolerance with cluster_rtol= (or adjointgen.runtime.degeneracy.set_rtol), "
            "use broadening= for a biased finite surrogate, or disable the check with "
            "adjointgen.runtime.gauge.set_enabled(False)")

    verdict(bad_basis | bad_split, error)


def check_independent(op: str, V: torch.Tensor, d: torch.Tensor, rtol=None) -> None:
    """Raise :class:`~adjointgen.runtime.checks.DefectiveMatrixError` when the columns of ``V``
    (eigenvectors, not orthonormal) of a cluster of equal ``d`` are numerically dependent: their
    smallest singular value below ``rtol`` (the cluster tolerance) times their largest.  A
    defective (Jordan) matrix: its eigenvector matrix, which the rules invert, is singular.
    Cheap where ``d`` has no cluster (``O(n^2)`` complex, ``O(n log n)`` real)."""
    from .checks import DefectiveMatrixError, physical
    from .gauge import describe_cluster

    if not has_clusters(d, rtol):
        return
    plain = physical(V, d)
    if plain is None:
        return
    V, d = plain
    rtol_ = default_rtol(d.dtype) if rtol is None else float(rtol)
    with torch.no_grad():
        masks = cluster_mask(d, rtol).reshape(-1, d.shape[-1], d.shape[-1])
        Vs = V.detach().reshape(-1, *V.shape[-2:])
        ds = d.detach().reshape(-1, d.shape[-1])
        for b in range(masks.shape[0]):
            for members in _clusters_of(masks[b]):
                s = torch.linalg.svdvals(Vs[b % Vs.shape[0]][:, members])
                if not bool(s[-1] > rtol_ * s[0]):
                    where = f"batch index {b}, " if masks.shape[0] > 1 else ""
                    raise DefectiveMatrixError(
                        f"{op}: the matrix is defective (not diagonalizable) at a cluster of equal eigenvalues "
                        f"({where}{describe_cluster(members, ds[b % ds.shape[0]].cpu(), 'eigenvalues')}): their "
                        f"eigenvectors are linearly dependent (smallest singular value {float(s[-1]):.2e} of "
                        f"{float(s[0]):.2e}), so the eigenvector matrix the derivatives invert is singular and "
                        f"the eigenvectors have no derivative there")


#: estimated relative error of an eigenvalue gap above which a derivative that divides by it is refused
RESOLUTION_LIMIT = 0.1


def check_resolved(op: str, V: torch.Tensor, d: torch.Tensor, A: torch.Tensor | None, rtol=None) -> None:
    """Raise :class:`~adjointgen.runtime.checks.DefectiveMatrixError` where two eigenvalues of a
    non-normal matrix, not in one cluster, are closer than rounding can resolve: a nearly defective
    matrix (a perturbed Jordan block splits its eigenvalue by ``eps^(1/k)``), whose derivative,
    which divides by their gap, has no correct digits.

    Rounding moves ``w_i`` by about ``eps ‖A‖_F κ_i``, with ``κ_i = ‖y_i‖ ‖x_i‖ / |y_i^H x_i|``
    (``‖(V^-1)_i,:‖ ‖V_:,i‖``) its condition number; a pair whose gap is within
    ``RESOLUTION_LIMIT^-1`` times that (``eps ‖A‖_F (κ_i + κ_j) >= RESOLUTION_LIMIT |w_i - w_j|``)
    raises, naming the eigenvalues and their condition estimates.  Pairs inside a cluster are the
    cluster checks' (:func:`check_independent`)."""
    from .checks import DefectiveMatrixError, physical

    n = d.shape[-1]
    if n < 2 or d.numel() == 0:
        return
    plain = physical(V, d) if A is None else physical(V, d, A)
    if plain is None:
        return
    with torch.no_grad():
        Vp, dp = plain[0].detach(), plain[1].detach()
        norm = (torch.linalg.matrix_norm(plain[2].detach()) if A is not None
                else dp.abs().amax(-1)).reshape(-1)
        Vs = Vp.reshape(-1, n, n)
        ds = dp.reshape(-1, n)
        inv, info = torch.linalg.inv_ex(Vs)
        kappa = torch.linalg.vector_norm(inv, dim=-1) * torch.linalg.vector_norm(Vs, dim=-2)
        kappa = torch.where(info[:, None] == 0, kappa, torch.full_like(kappa, math.inf))
        eps = torch.finfo(ds.real.dtype if ds.is_complex() else ds.dtype).eps
        error = eps * norm[:, None] * kappa
        gap = (ds[:, :, None] - ds[:, None, :]).abs()
        clustered = cluster_mask(ds, rtol) | torch.eye(n, dtype=torch.bool, device=ds.device)
        unresolved = (error[:, :, None] + error[:, None, :] >= RESOLUTION_LIMIT * gap) & ~clustered
        if not bool(unresolved.any()):
            return
        b, i, j = (int(t) for t in unresolved.nonzero()[0])
        where = f" (batch index {b})" if ds.shape[0] > 1 else ""
        raise DefectiveMatrixError(
            f"{op}: the matrix is numerically defective{where}: eigenvalues {complex(ds[b, i]):.6g} and "
            f"{complex(ds[b, j]):.6g} (indices {i}, {j}) are {float(gap[b, i, j]):.2e} apart, while rounding moves "
            f"them by about {float(error[b, i]):.2e} and {float(error[b, j]):.2e} (condition estimates "
            f"{float(kappa[b, i]):.2e}, {float(kappa[b, j]):.2e}): the derivative divides by their gap and has no "
            "correct digits. A perturbed Jordan block does this; a loss symmetric in the eigenvalues of the block "
            "(their sum, the projector onto their invariant subspace) is smooth, but not computable from eig")


# ------------------------------------------------------------------ forward mode at clusters
def check_tangent(op: str, X: torch.Tensor, denominator: torch.Tensor, d: torch.Tensor, rtol=None) -> None:
    """Raise :class:`~adjointgen.runtime.gauge.DegenerateSubspaceError` when a JVP's projected
    tangent ``X`` (the operand of a masked pairwise quotient: ``V^H dA V``) splits a cluster.

    Inside a cluster of equal values ``d`` the masked quotient drops ``X``'s block, which is right
    only when that block is a multiple of the identity: then the cluster moves as a whole and every
    loss invariant under its rotations gets the exact tangent.  Otherwise the values' tangents are the
    eigenvalues of the block (not its diagonal) and the basis rotates to its eigenvectors; what a
    loss downstream needs depends on the loss, which forward mode cannot see, so the tangent would
    be silently wrong for some (``Φ(V f(w) V^H)``).  Off with the other checks
    (:func:`adjointgen.runtime.gauge.set_enabled`)."""
    from .checks import physical
    from .gauge import enabled

    if not enabled() or d.shape[-1] < 2 or X.numel() == 0:
        return
    same = negligible(denominator, d, rtol)
    plain = physical(X, same, d)
    if plain is None:  # a compiler traces the values
        return
    X, same, d = plain
    with torch.no_grad():
        n = X.shape[-1]
        off = same & ~torch.eye(n, dtype=torch.bool, device=same.device)
        if not deferred(off) and not bool(off.any()):  # (eager: no cluster, nothing more to read)
            return
        real = X.real.dtype if X.is_complex() else X.dtype
        eps, tiny = torch.finfo(real).eps, torch.finfo(real).tiny
        X = X.detach()
        level = X.abs().amax((-2, -1), keepdim=True)
        diag = X.diagonal(dim1=-2, dim2=-1)
        spread = (diag.unsqueeze(-1) - diag.unsqueeze(-2)).abs()
        bad = off & ((X.abs() > math.sqrt(eps) * level + tiny) | (spread > math.sqrt(eps) * level + tiny))

    def error():
        flat_bad = bad.reshape(-1, n, n)
        flat_same = off.expand_as(bad).reshape(-1, n, n)
        b = int(flat_bad.any(-1).any(-1).nonzero()[0])
        members = next(c for c in _clusters_of(flat_same[b].cpu()) if bool(flat_bad[b][c][:, c].any()))
        where = f"batch index {b}, " if flat_bad.shape[0] > 1 else ""
        rows = d.detach().reshape(-1, d.shape[-1])
        return tangent_split_error(op, members, where, rows[b % rows.shape[0]].cpu() if rows.shape[0] else None)

    verdict(bad, error)


# ------------------------------------------------------------------ a generic basis of exact clusters
def rounding_rtol(n: int, dtype) -> float:
    """The relative tolerance of "equal to rounding" for ``n`` values of ``dtype``
    (:func:`adjointgen.runtime.xp.rounding_rtol`, shared with the JAX side)."""
    found = _ROUNDING_RTOL.get((n, dtype))
    if found is None:
        from .xp import rounding_rtol as shared

        real = {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dtype, dtype)
        if len(_ROUNDING_RTOL) > 256:
            _ROUNDING_RTOL.clear()
        found = _ROUNDING_RTOL[(n, dtype)] = shared(n, torch.finfo(real).eps)
    return found


_ROUNDING_RTOL: dict = {}


def _generic_rotation(k: int, dtype: torch.dtype, device) -> torch.Tensor:
    """A fixed orthogonal (complex: unitary) ``k × k`` matrix with no special structure: QR of a
    matrix drawn from a generator seeded by ``k`` (the same in every process)."""
    key = (k, dtype, str(device))
    R = _ROTATIONS.get(key)
    if R is None:
        g = torch.Generator().manual_seed(0x5EED + k)
        real = torch.empty((), dtype=dtype).real.dtype
        M = torch.randn(k, k, dtype=torch.float64, generator=g)
        if dtype.is_complex:
            M = M + 1j * torch.randn(k, k, dtype=torch.float64, generator=g)
        Q, Rr = torch.linalg.qr(M)
        Q = Q * (Rr.diagonal().sgn().conj() if dtype.is_complex else Rr.diagonal().sign())
        R = Q.to(dtype=dtype if dtype.is_complex else real, device=device)
        _ROTATIONS[key] = R
    return R


_ROTATIONS: dict = {}


def rounding_clusters(d: torch.Tensor) -> list[list[list[int]]] | None:
    """For each matrix of the batch (flattened), the clusters (index lists) of values equal to
    rounding -- ``|d_i - d_j| <= rtol max(|d_i|, |d_j|)`` with :func:`rounding_rtol`, relative to
    the pair, so that a graded spectrum (``1e-300, 1, 1e100, 1e300``) keeps every eigenvector, and
    measured from each cluster's first value, so that its spread stays below that bound -- or
    ``None`` when there is none (an ``O(n log n)`` host test)."""
    if d.shape[-1] < 2 or d.numel() == 0:
        return None
    real = d.real.dtype if d.is_complex() else d.dtype
    rtol = rounding_rtol(d.shape[-1], real)
    if not _close_pair(d, "difference", rtol):
        return None
    flat = d.detach().reshape(-1, d.shape[-1]).cpu()
    out = []
    for row in flat:
        if row.is_complex():  # points of the plane: the points near a first one (spread <= 2 rtol)
            size = torch.maximum(row.abs()[:, None], row.abs()[None, :])
            close = ((row[:, None] - row[None, :]).abs() <= rtol * size).tolist()
            seen, clusters = set(), []
            for i in range(len(close)):
                if i in seen:
                    continue
                group = {i} | {m for m, near in enumerate(close[i]) if near and m not in seen}
                seen |= group
                if len(group) > 1:
                    clusters.append(sorted(group))
            out.append(clusters)
            continue
        order = torch.argsort(row).tolist()
        clusters, current = [], [order[0]]
        for b in order[1:]:
            first, value = float(row[current[0]]), float(row[b])
            if value - first <= rtol * max(abs(first), abs(value)):  # the spread from the cluster's first
                current.append(b)
            else:
                if len(current) > 1:
                    clusters.append(sorted(current))
                current = [b]
        if len(current) > 1:
            clusters.append(sorted(current))
        out.append(clusters)
    return out if any(out) else None


def generic_basis(d: torch.Tensor, *vectors: torch.Tensor, normalize: bool = False) -> tuple[torch.Tensor, ...]:
    """``vectors`` (each ``(..., m, n)``, columns paired with the values ``d`` ``(..., n)``) with the
    columns of every cluster of values equal to rounding rotated by one fixed generic orthogonal
    (unitary) matrix -- the same for every array, so ``U S V^H`` and ``V^H B V = I`` are kept.

    Inside an exactly degenerate eigenspace any basis is as valid, and LAPACK's has exact zeros
    (the identity's eigenvectors are ``I``): at such a basis the first-order test of whether a loss
    depends on the basis can vanish by accident (``V[1, 0]``, ``Vh[1, 0]``).  At a generic basis it
    cannot, so the backward's checks do not depend on the basis LAPACK happened to pick.  Values
    only near-equal (apart by more than rounding) keep their eigenvectors.  ``normalize``: the
    rotated columns are scaled to unit norm again (eigenvectors that are not orthonormal, ``eig``)."""
    if not vectors:
        return vectors
    small = None if d.is_complex() or d.shape[-1] < 2 else host_values(d)
    if small is not None:  # a few real values on the CPU (so are the vectors): no cluster is the usual answer
        n = d.shape[-1]
        if not _close_pair_small([small[i:i + n] for i in range(0, len(small), n)], False,
                                 rounding_rtol(n, d.dtype)):
            return vectors
    elif any(is_traced(v) for v in (d, *vectors)):
        return vectors
    if deferred(d) and not d.is_complex():  # sorted values: their clusters are runs, rotated on the device
        return _rotate_runs(d, vectors, normalize)
    clusters = rounding_clusters(d)
    if clusters is None:
        return vectors
    batch = d.shape[:-1]
    out = []
    for V in vectors:
        W = V.detach().clone().reshape(-1, *V.shape[-2:]) if V.dim() > 2 else V.detach().clone()[None]
        flat_batch = W.shape[0]
        for b in range(flat_batch):
            for c in clusters[b % len(clusters)] if len(clusters) == flat_batch else clusters[0]:
                idx = torch.tensor(c, device=V.device)
                R = _generic_rotation(len(c), V.dtype, V.device)
                Wc = W[b][:, idx] @ R
                W[b][:, idx] = Wc / torch.linalg.vector_norm(Wc, dim=-2, keepdim=True) if normalize else Wc
        out.append(W.reshape(*batch, *V.shape[-2:]) if V.dim() > 2 else W[0])
    return tuple(out)


def _rotate_runs(d: torch.Tensor, vectors, normalize: bool):
    """:func:`generic_basis` without a read, for sorted values (``eigh``, ``svd``), whose clusters of
    values equal to rounding are runs of neighbours: ``V R`` with the Cayley transform
    ``R = (I - S)^-1 (I + S)`` of the tridiagonal skew ``S``, ``S_i,i+1 = θ_i`` (fixed generic angles)
    where the pair ``(i, i + 1)`` is equal to rounding and 0 elsewhere.  ``S`` is block diagonal over
    the runs, so ``R`` is orthogonal (unitary), dense inside each run (no entry of LAPACK's basis left
    exactly zero) and the identity outside them (those columns are left as they are, bit for bit).
    ``U S V^H`` and ``V^H B V = I`` are kept; every array of a call gets the same ``R``."""
    n = d.shape[-1]
    if n < 2:
        return tuple(vectors)
    real = d.dtype
    rtol = rounding_rtol(n, real)
    dtype = vectors[0].dtype
    with torch.no_grad():
        x = d.detach()
        pair = torch.maximum(x[..., :-1].abs(), x[..., 1:].abs())
        equal = (x[..., 1:] - x[..., :-1]).abs() <= rtol * pair  # (..., n - 1): pair (i, i + 1) in one run
        theta = _RUN_ANGLES.get((n, real, x.device))
        if theta is None:
            theta = _RUN_ANGLES[n, real, x.device] = (
                0.4 + 0.7 * torch.frac(torch.arange(n - 1, dtype=torch.float64) * 0.6180339887498949)).to(real).to(
                x.device)
        upper = torch.diag_embed(theta * equal, offset=1).to(dtype)
        skew = upper - upper.mT
        eye = torch.eye(n, dtype=dtype, device=x.device)
        R = torch.linalg.solve_ex(eye - skew, eye + skew)[0]  # (I - S is never singular; _ex: no sync on a GPU)
    out = []
    for V in vectors:
        W = V.detach() @ R
        if normalize:
            W = W / torch.linalg.vector_norm(W, dim=-2, keepdim=True)
        out.append(W)
    return tuple(out)


#: the generic angles of :func:`_rotate_runs`, per size, dtype and device
_RUN_ANGLES: dict = {}


# ------------------------------------------------------------------ spectral losses at clusters
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


# ------------------------------------------------------------------ a partial decomposition's cut
def cut_error(op: str, k: int, largest: bool, values, split, what: str = "the gradient of a loss that uses them",
              kind: str = "eigenvalue"):
    from .gauge import DegenerateSubspaceError

    side = "largest" if largest else "smallest"
    shown = ", ".join(f"{float(values[i]):.6g}" for i in split)
    return DegenerateSubspaceError(
        f"{op}: k = {k} cuts through a degenerate {kind}: the kept {kind}(s) {shown} "
        f"(index {', '.join(map(str, split))}) coincide with the first discarded one to within the "
        f"solver's resolution, so which vectors of that cluster are the {k} {side} is "
        f"arbitrary and {what} is not defined. Change k so the cluster is kept whole or left out, or "
        "make the loss independent of those pairs")


def check_cut(op: str, k: int, largest: bool, values, split, cotangents, what: str = "eigenvalues") -> None:
    """Raise when ``k`` cuts a cluster and the loss uses a kept member of it: the cluster's kept
    vectors are then an arbitrary part of its eigenspace and nothing about them is differentiable
    -- not the vectors, not the values (the sum of the ``k`` extreme eigenvalues has a kink there,
    Ky Fan).  ``cotangents=None`` (forward mode, which cannot know what the loss uses) raises
    whenever there is a cut.  The cotangents are read on the host (``torch.func`` wrappers taken
    off)."""
    from .checks import physical

    kind = "singular value" if what == "singular values" else "eigenvalue"
    if cotangents is None:
        raise cut_error(op, k, largest, values, split, "the forward-mode derivative of those pairs", kind)
    index = torch.tensor(split, device=values.device)
    for g in cotangents:
        if g is None:
            continue
        plain = physical(g)
        if plain is None:
            continue
        if bool((plain[0].index_select(-1, index) != 0).any()):
            raise cut_error(op, k, largest, values, split, kind=kind)


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

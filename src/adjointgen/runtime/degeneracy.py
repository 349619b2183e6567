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

from . import gauge, memo
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
        found = memo.store(_DEFAULT_RTOL, dtype, math.sqrt(torch.finfo(real).eps))
    return found


_DEFAULT_RTOL: dict = memo.table()


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
        found = memo.store(_ROUNDING_RTOL, (n, dtype), shared(n, torch.finfo(real).eps), limit=256)
    return found


_ROUNDING_RTOL: dict = memo.table()


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
        memo.store(_ROTATIONS, key, R)
    return R


_ROTATIONS: dict = memo.table()


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
            theta = memo.store(_RUN_ANGLES, (n, real, x.device), (
                0.4 + 0.7 * torch.frac(torch.arange(n - 1, dtype=torch.float64) * 0.6180339887498949)).to(real).to(
                x.device))
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
_RUN_ANGLES: dict = memo.table()


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

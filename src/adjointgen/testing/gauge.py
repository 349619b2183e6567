"""Comparisons that ignore a gauge: eigenvector phases and bases of subspaces (clusters of equal
values)."""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from . import Tensors, _as_tuple, _unravel


def align_phases(vectors: Tensors, reference: Tensors):
    """Multiply each column of ``vectors`` by the sign (real) or unit phase (complex) that best aligns
    it with the same column of ``reference``: ``d_j = c_j / |c_j|``, ``c_j = sum_t (X_t^H R_t)_jj``
    (``d_j = 1`` where ``c_j = 0``), so that ``diag(X^H R)`` becomes real and nonnegative.

    Args:
        vectors: eigenvectors ``(..., n, k)``, or a tuple of tensors sharing one gauge per column,
            e.g. ``(U, V)`` of an SVD (``V = Vh.mH``): the same phase is applied to both.
        reference: the same structure and shapes.

    Returns:
        The aligned tensor (or tuple), differentiable like its inputs.
    """
    single = isinstance(vectors, torch.Tensor)
    xs, rs = _as_tuple(vectors), _as_tuple(reference)
    if len(xs) != len(rs):
        raise ValueError(f"align_phases: {len(xs)} tensors but {len(rs)} references")
    c = None
    for x, r in zip(xs, rs):
        if x.shape != r.shape:
            raise ValueError(f"align_phases: shapes {tuple(x.shape)} and {tuple(r.shape)} differ")
        term = (x.conj() * r).sum(-2)
        c = term if c is None else c + term
    if c.is_complex():
        size = c.abs()
        phase = torch.where(size > 0, c / torch.where(size > 0, size, torch.ones_like(size)), torch.ones_like(c))
    else:
        phase = torch.where(c < 0, -torch.ones_like(c), torch.ones_like(c))
    aligned = tuple(x * phase.unsqueeze(-2).to(x.dtype) for x in xs)
    return aligned[0] if single else aligned


def assert_close_up_to_phase(actual: Tensors, expected: Tensors, *, rtol: float | None = None,
                             atol: float | None = None) -> None:
    """Assert that ``actual`` equals ``expected`` up to a sign (real) or unit phase (complex) per
    column: :func:`align_phases` then :func:`torch.testing.assert_close` (its default tolerances for
    the dtype unless given).  Pass ``(U, V)`` tuples for singular vectors so that one phase per
    singular pair must fit both.  Raises ``AssertionError``."""
    xs, rs = _as_tuple(actual), _as_tuple(expected)
    aligned = _as_tuple(align_phases(xs, rs))
    for t, (x, r) in enumerate(zip(aligned, rs)):
        which = f" (tensor {t} of {len(rs)}, sharing one phase per column)" if len(rs) > 1 else ""
        torch.testing.assert_close(x, r, rtol=rtol, atol=atol,
                                   msg=lambda m, which=which: f"not equal up to a per-column "
                                                               f"sign/phase{which}, after alignment: {m}")


def _clusters(values: torch.Tensor, tol: float | None) -> list[list[int]]:
    """Groups of column indices whose values are within ``tol`` of a neighbour (sorted by value)."""
    values = values.detach().to(torch.float64).cpu()
    if values.numel() == 0:
        return []
    if tol is None:
        scale = float(values.abs().max())
        tol = math.sqrt(torch.finfo(torch.float64).eps) * (scale if scale > 0 else 1.0)
    order = torch.argsort(values).tolist()
    groups = [[order[0]]]
    for previous, current in zip(order, order[1:]):
        if float(values[current] - values[previous]) <= tol:
            groups[-1].append(current)
        else:
            groups.append([current])
    return [sorted(g) for g in groups]


def assert_close_subspaces(actual: Tensors, expected: Tensors, eigenvalues: torch.Tensor | None = None, *,
                           clusters: Sequence[Sequence[int]] | None = None, cluster_tol: float | None = None,
                           rtol: float | None = None, atol: float | None = None) -> None:
    """Assert that two sets of eigenvectors (or singular vectors) ``(..., n, k)`` span the same
    subspaces: the projectors ``X_c X_c^H`` agree for every cluster ``c`` of columns.

    Invariant under any unitary change of basis inside a cluster -- a sign or phase per column, and
    a rotation of a degenerate eigenspace -- so degenerate spectra compare correctly.  Also right for
    ``B``-orthonormal vectors of a generalized problem (their bases of one subspace differ by a
    unitary factor too).

    Args:
        actual, expected: eigenvectors, or tuples ``(U, V)`` of singular vectors sharing a gauge:
            then ``U_c U_c^H``, ``V_c V_c^H`` and ``U_c V_c^H`` are compared, so the rotation must
            be the same on both sides.
        eigenvalues: ``(..., k)`` values of the columns (eigenvalues, singular values).  Columns whose
            values lie within ``cluster_tol`` of each other (chained, after sorting; default
            ``sqrt(eps_float64) * max |value|``) form one cluster, per batch element.
        clusters: explicit groups of column indices instead (the same for every batch element).
            With neither, all ``k`` columns are one cluster: the spans are compared.
        rtol, atol: for :func:`torch.testing.assert_close` of the projectors (its defaults for the
            dtype unless given).

    Raises:
        AssertionError: naming the batch element, the cluster's columns and values.
    """
    xs, rs = _as_tuple(actual), _as_tuple(expected)
    if len(xs) != len(rs):
        raise ValueError(f"assert_close_subspaces: {len(xs)} tensors but {len(rs)} expected")
    for x, r in zip(xs, rs):
        if x.shape != r.shape:
            raise AssertionError(f"assert_close_subspaces: shapes {tuple(x.shape)} and {tuple(r.shape)} differ")
    batch, k = xs[0].shape[:-2], xs[0].shape[-1]
    if eigenvalues is not None and clusters is not None:
        raise ValueError("assert_close_subspaces: pass eigenvalues or clusters, not both")
    if eigenvalues is not None and eigenvalues.shape[-1] != k:
        raise ValueError(f"assert_close_subspaces: {eigenvalues.shape[-1]} values for {k} columns")
    flat_x = [x.reshape(-1, *x.shape[-2:]) for x in xs]
    flat_r = [r.reshape(-1, *r.shape[-2:]) for r in rs]
    values = (eigenvalues.expand(*batch, k).reshape(-1, k) if eigenvalues is not None else None)
    for b in range(flat_x[0].shape[0]):
        if clusters is not None:
            groups = [list(g) for g in clusters]
        elif values is not None:
            groups = _clusters(values[b].real if values.is_complex() else values[b], cluster_tol)
        else:
            groups = [list(range(k))]
        where = f"batch element {_unravel(b, tuple(batch))}, " if batch else ""
        for group in groups:
            index = torch.tensor(group, dtype=torch.long, device=flat_x[0].device)
            label = f"{where}columns {group}"
            if values is not None:
                label += f" (values {[round(float(v), 12) for v in values[b][group]]})"
            for s in range(len(xs)):
                for t in range(s, len(xs)):
                    P = flat_x[s][b][:, index] @ flat_x[t][b][:, index].mH
                    Q = flat_r[s][b][:, index] @ flat_r[t][b][:, index].mH
                    name = "X X^H" if len(xs) == 1 else f"X{s} X{t}^H"
                    torch.testing.assert_close(
                        P, Q, rtol=rtol, atol=atol,
                        msg=lambda m, label=label, name=name: f"different subspaces at {label}: the "
                                                              f"projectors {name} differ: {m}")

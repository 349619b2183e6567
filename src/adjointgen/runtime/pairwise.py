"""The guarded quotients of generated pairwise matrices (torch), written once.

A derivation's pairwise matrix ``F_ij = num(d_i, d_j) / den(d_i, d_j)`` (reciprocal gaps,
divided differences) is generated as its formula only; how it is evaluated without ``inf`` or NaN,
also in second derivatives, is decided here:

- :func:`quotient`: ``F_ii`` is a separate value (``f'(d_i)``, a constant), the denominator's
  diagonal is set to 1 before dividing;
- :func:`masked_quotient`: ``F`` is zero where the denominator is negligible (a cluster of equal
  values, where the gauge leaves those entries free); the denominator is set to ``inf`` there
  before dividing, so no gradient reaches the replaced entries; with a broadening the biased,
  finite surrogate is taken instead;
- :func:`check_tangent` (from :mod:`~adjointgen.runtime.degeneracy`): a JVP's masked quotient
  raises when its tangent splits a cluster, whose block the mask would drop;
- :func:`divided_by_gaps`: ``X / (v_i - v_j)`` (zero diagonal) or ``X / (v_i + v_j)`` in one
  division, when no pair is close (:func:`adjointgen.runtime.degeneracy.pairs_apart`), so ``F`` is
  never formed;
- :func:`masked_times`: ``scale * F ∘ X`` for a masked ``F``: the choice between the one division
  above and the masked product, and the tangent check of a JVP;
- :func:`times`, :func:`scale_rows`, :func:`scale_cols`, :func:`add_diag` (from
  :mod:`~adjointgen.runtime.value_blocks`): ``F ∘ X``, ``diag(v) X``, ``X diag(v)`` and
  ``X + diag(v)``, whose second derivative at a cluster moves the cluster's values as a block.

The NumPy/CuPy backend's counterparts are :func:`adjointgen.runtime.xp.quotient` and
:func:`adjointgen.runtime.xp.masked_quotient`.
"""
from __future__ import annotations

import torch

from .degeneracy import check_tangent, negligible, pairs_apart
from .value_blocks import add_diag, scale_cols, scale_rows, times

__all__ = ["add_diag", "check_tangent", "divided_by_gaps", "masked_quotient", "masked_times", "operands", "quotient",
           "scale_cols", "scale_rows", "times"]


def operands(d: torch.Tensor):
    """``(d_i, d_j)``: ``d`` as a column and as a row, broadcasting to ``(..., n, n)``."""
    return d.unsqueeze(-1), d.unsqueeze(-2)


def quotient(numerator, denominator, diagonal, d: torch.Tensor) -> torch.Tensor:
    """``numerator / denominator`` off the diagonal, ``diagonal`` on it, with no ``inf``/NaN formed
    on the diagonal (nor in its derivatives)."""
    on_diagonal = torch.eye(d.shape[-1], dtype=torch.bool, device=d.device)
    return torch.where(on_diagonal, diagonal, numerator / torch.where(on_diagonal, 1, denominator))


def masked_quotient(numerator, denominator, d: torch.Tensor, rtol=None, broadened=None) -> torch.Tensor:
    """``numerator / denominator``, and 0 where the denominator is negligible
    (:func:`~adjointgen.runtime.degeneracy.negligible`: the diagonal and clusters of equal ``d``).
    ``broadened``: a callable giving the broadened form, taken instead where the pairs are apart."""
    same = negligible(denominator, d, rtol)
    if broadened is not None:
        return torch.where(same, 0, broadened())
    return numerator / torch.where(same, torch.inf, denominator)


def divided_by_gaps(X: torch.Tensor, v: torch.Tensor, kind: str) -> torch.Tensor:
    """``X / (v_i - v_j)`` with a zero diagonal (``kind="difference"``) or ``X / (v_i + v_j)``
    (``"sum"``), one division; only for ``v`` whose pairs are apart."""
    if kind == "difference":
        denominator = v.unsqueeze(-1) - v.unsqueeze(-2)
        denominator.diagonal(dim1=-2, dim2=-1).fill_(torch.inf)  # a fresh tensor: F_ii = 0
    else:
        denominator = v.unsqueeze(-1) + v.unsqueeze(-2)
    return X / denominator


def masked_times(F, d: torch.Tensor, X: torch.Tensor, scale, rtol, broadening, tangent, denominator, fused=None):
    """``scale * F ∘ X`` for a generated masked pairwise matrix ``F(d, scale, rtol, broadening)``
    whose denominator is ``denominator(d_i, d_j)``.

    ``fused = (kind, factor)`` when ``F_ij = c / (a d_i ∓ a d_j)`` (``factor = a / c``, ``kind``
    ``"difference"`` or ``"sum"``): where no pair of ``d`` makes the denominator vanish
    (:func:`~adjointgen.runtime.degeneracy.pairs_apart`, on the host in ``O(n log n)``), ``X`` is
    divided by ``v_i ∓ v_j`` with ``v = d factor / scale`` in one division and ``F`` is never formed;
    otherwise (clusters, a broadening, a transform tracing ``d``) ``F`` is formed, masked, and its
    product's derivative in ``d`` moves a cluster's values as a block (:func:`times`).

    ``tangent``: the operation whose JVP this is; ``X`` is then a projected tangent, which must not
    split a cluster (:func:`check_tangent`).
    """
    if fused is not None and broadening is None and pairs_apart(d, fused[0], rtol):
        return divided_by_gaps(X, d * (fused[1] / scale), fused[0])
    if tangent is not None and broadening is None:
        check_tangent(tangent, X, denominator(*operands(d)), d, rtol)
    if fused is None:
        return F(d, scale, rtol, broadening) * X
    return times(F(d, scale, rtol, broadening), X, d, fused[1] / scale, fused[0], broadening)

"""The gauge check of complex decompositions.

The singular vectors of a complex matrix are defined up to a phase per pair,
``(u_j, v_j) -> e^{iθ_j} (u_j, v_j)``, the eigenvectors of a Hermitian one up to ``u_j -> e^{iθ_j} u_j``.
A loss has a gradient only if it does not depend on those phases; the derivations
(``derivations/svd.py``, ``derivations/eigh.py``) derive the loss's derivative along them, the
residual (``R = diag(skew(U^H gU + V^H gV))``, ``diag(skew(V^H gV))``), zero for a well-defined loss.  The generated
backward evaluates it and calls :func:`check`; the check reads the result on the host, which is a
device-to-host synchronisation on a GPU.  Turn it off with :func:`set_enabled` (or the
:func:`disabled` context manager) and nothing is computed or synchronised.
"""
from __future__ import annotations

import contextlib

from .verdict import verdict

__all__ = ["ComplementBasisError", "DegenerateSubspaceError", "GaugeDependentLossError", "PhaseDependentLossError",
           "check", "check_basis", "check_null_space", "check_zero_values", "disabled", "enabled", "set_enabled"]

_ENABLED = True

#: how the errors name the vectors of each operation, and invariant alternatives
class GaugeDependentLossError(ValueError):
    """The loss depends on a gauge of the outputs: a freedom that leaves every defining identity
    unchanged (the phase of a complex eigenvector or singular vector, the basis inside a cluster of
    equal eigenvalues or singular values, the basis of the extra ``full_matrices`` columns), so its
    gradient is not defined.  The message names the operation and the vectors concerned."""


class PhaseDependentLossError(GaugeDependentLossError):
    """The loss depends on the phase of a complex eigenvector or singular pair."""


class ComplementBasisError(GaugeDependentLossError):
    """The loss depends on a basis of which only the span is defined: the extra columns of
    ``svd(full_matrices=True)``, or the left (right) singular vectors of zero singular values of a
    tall (wide) thin SVD, which may be rotated into the rest of the orthogonal complement of the
    range."""


class DegenerateSubspaceError(GaugeDependentLossError):
    """The loss depends on the basis chosen inside a cluster of equal eigenvalues (singular
    values), or a partial decomposition cuts through such a cluster."""


def enabled() -> bool:
    """Whether backward passes check the gauge residual (the default)."""
    return _ENABLED


def set_enabled(flag: bool) -> None:
    """Turn the gauge check on or off for the whole process (the autograd engine may run backward
    on other threads, so this is a process-wide setting rather than a context variable)."""
    global _ENABLED
    _ENABLED = bool(flag)


@contextlib.contextmanager
def disabled():
    """``with disabled(): loss.backward()`` skips the check (and its GPU synchronisation)."""
    previous = enabled()
    set_enabled(False)
    try:
        yield
    finally:
        set_enabled(previous)


def _excess(residual, scale, floor=None):
    """``(relative size of |residual| / scale, whether it exceeds sqrt(eps))`` elementwise, on plain
    tensors (``torch.func`` wrappers taken off), or ``None`` while a compiler traces the values;
    ``floor`` is added to ``scale`` (after both are taken off, so their ``vmap`` levels align)."""
    import torch

    from .checks import physical

    plain = physical(residual, scale, floor)
    if plain is None:
        return None
    residual, scale, floor = plain
    scale = scale if floor is None else scale + floor
    real = residual.real.dtype if residual.is_complex() else residual.dtype
    tiny = torch.finfo(real).tiny
    bad = residual.abs() > (torch.finfo(real).eps ** 0.5) * scale + tiny
    return (residual.abs() / scale.clamp_min(tiny)), bad


def check(op: str, residual, *cotangents, floor=None, phases=(), invariant="") -> None:
    """Raise :class:`PhaseDependentLossError` when ``|R_j|`` exceeds ``sqrt(eps)`` times the size of
    the cotangent columns it is built from (``|u_j^H g_j| <= ‖g_j‖`` for a unit ``u_j``), plus
    ``floor`` (``(..., 1)``: the size of the loss's other derivatives, below which cotangents of the
    vectors are rounding, e.g. in a second derivative of a loss of the values alone), plus the
    rounding of the cotangents themselves: ``n eps`` times their largest column (a column that is
    zero in exact arithmetic comes out at rounding size, with a residual of its own size -- the
    second derivative of a loss of one eigenspace reaches the other vectors so)."""
    import torch

    with torch.no_grad():
        columns = sum(torch.linalg.vector_norm(g, dim=-2) for g in cotangents)
        if columns.shape[-1]:
            real = columns.dtype
            rounding = columns.amax(-1, keepdim=True) * (columns.shape[-1] * torch.finfo(real).eps ** 0.5)
            floor = rounding if floor is None else floor + rounding
        found = _excess(residual, columns, floor)
        if found is not None:
            relative, bad = found

            def error():
                j = int(bad.reshape(-1, bad.shape[-1]).any(0).nonzero()[0])
                return PhaseDependentLossError(phase_message(op, phases, invariant, j, float(relative.max())))

            verdict(bad, error)


def phase_message(op: str, phases=(), invariant="", j=None, relative=None) -> str:
    """The error of a loss that depends on a phase gauge; ``phases`` (the outputs whose columns
    it rotates) and ``invariant`` (forms invariant to it) come from the derivation's gauge."""
    columns = f"column {j} of " if j is not None else "the columns of "
    where = columns + " and ".join(phases) if phases else ("vector " + str(j) if j is not None else "a complex vector")
    size = f" (relative residual {relative:.2e})" if relative is not None else ""
    return (f"{op}: the loss depends on the phase of {where}{size}: complex vectors are defined only up to a "
            f"phase e^{{i theta}} each (shared by the columns of the same index), and a loss must be invariant "
            f"to it, e.g. use {invariant or '|X| or X X^H'} instead of the vectors themselves. "
            "Disable this check with adjointgen.runtime.gauge.set_enabled(False)")


def check_basis(op: str, residual, cotangent) -> None:
    """The rotation gauge ``U2 -> U2 exp(Ω)`` of the extra ``full_matrices`` columns: raise
    :class:`ComplementBasisError` when ``‖R‖ = ‖skew(U2^H gU2)‖`` exceeds ``sqrt(eps) ‖gU2‖`` (a loss
    must use U2 only through its span, e.g. the projector ``U2 U2^H``)."""
    import torch

    with torch.no_grad():
        found = _excess(torch.linalg.matrix_norm(residual), torch.linalg.matrix_norm(cotangent))
        if found is not None:
            verdict(found[1], lambda: ComplementBasisError(
                f"{op}: the loss depends on the basis of the extra columns of full_matrices=True "
                f"(relative residual {float(found[0].max()):.2e}): only their span is defined, so use them "
                "through the projector U2 U2^H (or |U2|-free invariants of it). "
                "Disable this check with adjointgen.runtime.gauge.set_enabled(False)"))


def check_null_space(op: str, U, gU, zero) -> None:
    """The left singular vectors ``U_0`` of zero singular values (``zero``, a mask over the columns)
    of a tall thin SVD may be rotated into the rest of the complement of the range,
    ``U_0 -> U_0 + (I - U U^H) N``: raise :class:`ComplementBasisError` when the loss's derivative
    along that, ``(I - U U^H) gU_0``, exceeds ``sqrt(eps) ‖gU‖``."""
    import torch

    with torch.no_grad():
        g0 = gU * zero.unsqueeze(-2).to(gU.dtype)
        residual = g0 - U @ (U.mH @ g0)
        found = _excess(torch.linalg.matrix_norm(residual), torch.linalg.matrix_norm(gU))
        if found is not None:
            verdict(found[1], lambda: ComplementBasisError(
                f"{op}: the loss depends on the singular vectors of a zero singular value beyond their span "
                f"(relative residual {float(found[0].max()):.2e}): for a rank-deficient matrix those of the longer "
                "side may be any orthonormal vectors of the complement of the range, so only quantities that "
                "do not change when they are rotated into it (such as U S Vh, or U diag(s > 0)) have a gradient. "
                "Disable this check with adjointgen.runtime.gauge.set_enabled(False)"))


def check_mixing(op: str, residual, scale) -> None:
    """``full_matrices`` at zero singular values: their vectors and the extra columns span the
    complement of the range together, and any rotation mixing them is as valid.  Raise
    :class:`ComplementBasisError` when the loss's derivative along one (``residual``) exceeds
    ``sqrt(eps)`` of the cotangents of those columns (``scale``)."""
    import torch

    with torch.no_grad():
        found = _excess(residual, scale)
        if found is not None:
            verdict(found[1], lambda: ComplementBasisError(
                f"{op}: the matrix is rank deficient (a singular value is zero to the cluster tolerance), and the "
                f"loss depends on how the complement of its range is split between the singular vectors of the zero "
                f"values and the extra columns of full_matrices=True (relative residual {float(found[0].max()):.2e}): "
                "that split is arbitrary, so only quantities of their span together (the projector onto the whole "
                "complement) have a gradient. Disable this check with adjointgen.runtime.gauge.set_enabled(False)"))


def check_zero_values(op: str, gS, zero, U=None, gU=None, S=None) -> None:
    """A zero singular value is ``|t|`` along ``A + t u v^H`` (``u``, ``v`` its vectors, or for a
    tall (wide) thin SVD ``u`` out of the range): not differentiable.  Raise
    :class:`DegenerateSubspaceError` when the loss's cotangent of one exceeds ``sqrt(eps) ‖gS‖``
    (the nuclear norm; ``U diag(S) Vh`` of a tall rank-deficient matrix, whose gradient the
    decomposition's cotangents then do not determine).

    For a square matrix (``U``, ``gU``, ``S`` given) a loss ``Φ(U f(S) V^H)`` with an odd ``f``
    (``U S V^H`` itself, ``sinh``) is smooth, and its cotangents show it where ``s_i`` is resolved:
    ``(U^H gU)_ii = f(s_i) (U^H ∇Φ V)_ii = gS_i s_i`` to first order, where a loss on ``s_i`` itself
    has ``gU = 0``; such entries pass."""
    import torch

    from .checks import physical

    with torch.no_grad():
        plain = physical(gS, zero, *((S, U, gU) if gU is not None else ()))
        if plain is None:
            return
        g, z = plain[:2]
        real = g.real.dtype if g.is_complex() else g.dtype
        eps, tiny = torch.finfo(real).eps, torch.finfo(real).tiny
        used = z & (g.abs() > eps ** 0.5 * g.abs().amax(-1, keepdim=True) + tiny)
        if len(plain) > 2:
            s, u, gu = plain[2:]
            x = (u.mH @ gu).diagonal(0, -2, -1).real
            gs = (g.real if g.is_complex() else g) * s
            odd = (s.abs() > tiny) & ((x - gs).abs() <= eps ** 0.5 * (x.abs() + gs.abs()))
            used = used & ~odd
        verdict(used, lambda: DegenerateSubspaceError(
                f"{op}: the loss depends on a zero singular value of a rank-deficient matrix: such a value is |t| "
                "along a perturbation t u v^H of its vectors (out of the range, for a tall or wide matrix), not "
                "differentiable (the nuclear norm has a kink there). U f(S) V^H with an odd f (U S V^H itself) is "
                "smooth, and passes for a square matrix; of a tall or wide one the singular vectors that would "
                "carry its gradient are free. Use a loss that is smooth in A (such as S.square().sum()), or "
                "differentiate A "
                "directly. Disable this check with adjointgen.runtime.gauge.set_enabled(False)"))


def clusters_of(mask) -> list[list[int]]:
    """The clusters (index lists, size >= 2) of one ``(n, n)`` boolean mask of equal pairs (a NumPy
    array, or anything ``numpy.asarray`` takes)."""
    import numpy

    mask = numpy.asarray(mask)
    seen, out = set(), []
    for i in range(mask.shape[-1]):
        if i in seen:
            continue
        members = sorted({i, *(int(j) for j in numpy.flatnonzero(mask[i]))})
        if len(members) > 1:
            out.append(members)
        seen.update(members)
    return out


def describe_cluster(members, values=None, what: str = "values") -> str:
    """``"eigenvalues 2, 2 (indices 1, 2)"``: a cluster named by its values (when known) and indices."""
    indices = ", ".join(str(int(i)) for i in members)
    if values is None:
        return f"{what} at indices {indices}"

    def shown_value(x):
        x = x.item() if hasattr(x, "item") else x
        return f"{x.real:.6g}{x.imag:+.6g}j" if isinstance(x, complex) else f"{float(x):.6g}"

    shown = ", ".join(shown_value(values[int(i)]) for i in members)
    return f"{what} {shown} (indices {indices})"


def tangent_split_error(op: str, members, where: str = "", values=None):
    """The error of a forward-mode derivative whose direction splits a cluster (``values``: the
    values of that matrix of the batch, to name the cluster by them)."""
    return DegenerateSubspaceError(
        f"{op}: a forward-mode derivative (jvp, jacfwd, hessian, jvp of a gradient) at a cluster of equal values "
        f"({where}{describe_cluster(members, values)} are equal within the cluster tolerance) along a direction that splits it: "
        f"the direction's block on the cluster (V^H dA V, for the SVD the symmetric part of U^H dA V) is not a "
        f"multiple of the identity, so the values' tangents and the basis inside the cluster are not defined. A "
        f"tangent cannot carry what a loss invariant under the cluster's rotations needs (its block), and forward "
        f"mode cannot see which loss follows. Use reverse mode (torch.autograd.grad, torch.func.grad, jax.grad, "
        f"jacrev), which checks the loss; for a Hessian with torch, reverse over reverse (torch.func.jacrev(jacrev(f)), "
        f"torch.autograd.functional.hessian, gradgradcheck), exact here for invariant losses; the library's funm for a "
        f"matrix function, or broadening= for a biased finite surrogate; set the tolerance with cluster_rtol=")


def singular_factor_message(op: str, name: str, index: int, pivot: float, where: str, k: int, degree: int,
                            scale: float) -> str:
    """The error of a triangular factor the rules invert with a pivot at rounding level (torch's
    :func:`adjointgen.runtime.checks.invertible_factor` and the JAX runtime's check)."""
    return (f"{op}: the derivative divides by the diagonal of {name}, and {name}[{index}, {index}] = {pivot:.2e}{where} "
            f"is at the level of rounding (({k} eps)^(1/{degree}) times its row or column norm {scale:.2e}; "
            f"condition estimate {scale / max(pivot, 1e-300):.2e}): the input is numerically rank deficient, and "
            "the derivative has no correct digits")

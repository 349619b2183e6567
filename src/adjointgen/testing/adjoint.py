"""The dot-product identity of a JVP and a VJP (:func:`adjoint_check`, :func:`dot_product_check`)."""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.autograd import forward_ad as _fwAD

from . import (GradcheckError, SymmetricSpec, Tensors, _as_tuple, _call, _is_diff_tensor, _real_dtype, _resolve_symmetric,
               inner, symmetrize)


def _default_rtol(tensors) -> float:
    single = any(t is not None and _real_dtype(t.dtype) in (torch.float32, torch.float16, torch.bfloat16)
                 for t in tensors)
    return 1e-4 if single else 1e-10


def adjoint_check(jvp: Callable, vjp: Callable, tangents: Tensors, cotangents: Tensors, *,
                  rtol: float | None = None, raise_exception: bool = True) -> float:
    """The dot-product identity ``<g, jvp(t)> = <vjp(g), t>`` for a JVP/VJP pair written by hand.

    ``jvp(*tangents)`` returns the output tangents, ``vjp(*cotangents)`` the input cotangents (a
    tensor or a tuple each, ``None`` entries count as zero), paired by :func:`inner`.

    Returns:
        The relative discrepancy ``|lhs - rhs| / (|lhs| + |rhs|)`` (0 when both vanish).

    Raises:
        GradcheckError: the discrepancy exceeds ``rtol`` (default ``1e-10``; ``1e-4`` if any tensor is
            single precision) and ``raise_exception`` is true.
    """
    tangents, cotangents = _as_tuple(tangents), _as_tuple(cotangents)
    output_tangents = _as_tuple(jvp(*tangents))
    input_cotangents = _as_tuple(vjp(*cotangents))
    if len(output_tangents) != len(cotangents):
        raise ValueError(f"adjoint_check: jvp returned {len(output_tangents)} tensors for {len(cotangents)} cotangents")
    if len(input_cotangents) != len(tangents):
        raise ValueError(f"adjoint_check: vjp returned {len(input_cotangents)} tensors for {len(tangents)} tangents")
    lhs = float(inner(cotangents, output_tangents))
    rhs = float(inner(input_cotangents, tangents))
    discrepancy = _discrepancy(lhs, rhs)
    if rtol is None:
        rtol = _default_rtol(list(tangents) + list(cotangents))
    if raise_exception and not discrepancy <= rtol:
        raise GradcheckError(
            f"adjoint_check: the VJP is not the adjoint of the JVP: <g, J t> = {lhs:.17g} but "
            f"<J^T g, t> = {rhs:.17g}; relative discrepancy {discrepancy:.3e} > rtol = {rtol:.1e}",
            numerical=lhs, analytical=rhs)
    return discrepancy


def _discrepancy(lhs: float, rhs: float) -> float:
    scale = abs(lhs) + abs(rhs)
    if scale == 0:
        return 0.0
    return abs(lhs - rhs) / scale if math.isfinite(scale) else math.inf


def dot_product_check(
    func: Callable[..., Tensors],
    inputs: Tensors,
    *,
    tangents: Tensors | None = None,
    cotangents: Tensors | None = None,
    symmetric: SymmetricSpec = "auto",
    rtol: float | None = None,
    raise_exception: bool = True,
    seed: int = 0,
) -> float:
    """The dot-product identity ``<g, J t> = <J^T g, t>`` of ``func`` at ``inputs``: forward mode
    (``torch.func.jvp``; ``torch.autograd.forward_ad`` for autograd Functions without
    ``setup_context``) against reverse mode (``torch.autograd.grad``), with the real inner product
    ``Re tr(X^H Y)``.  Cheap (one JVP and one VJP) and independent of finite differences, so it
    holds to rounding error: it catches a VJP that is not the transpose of the JVP.

    Differentiated: the inputs with a tangent given, else those that require grad, else every
    floating-point or complex tensor input.

    Args:
        tangents: one per input (``None`` for inputs held fixed); default random normal, symmetric
            (Hermitian) for the inputs flagged symmetric.
        cotangents: one per output (``None`` for outputs left out); default random normal for every
            floating-point output.  For eigenvectors use a gauge-invariant ``func`` (projectors), or
            the backward of a decomposition may reject the loss.
        symmetric: as in :func:`gradcheck`; decides the random tangents.
        rtol: the largest relative discrepancy accepted (default ``1e-10``; ``1e-4`` in single
            precision).
        seed: seeds the random tangents and cotangents.

    Returns:
        The relative discrepancy ``|<g, J t> - <J^T g, t>| / (|<g, J t>| + |<J^T g, t>|)``.

    Raises:
        GradcheckError: above ``rtol`` with ``raise_exception=True``.
    """
    inputs = _as_tuple(inputs)
    if tangents is not None:
        tangents = _as_tuple(tangents)
        if len(tangents) != len(inputs):
            raise ValueError(f"dot_product_check: {len(tangents)} tangents for {len(inputs)} inputs")
        active = [i for i, t in enumerate(tangents) if t is not None]
    else:
        active = [i for i, x in enumerate(inputs) if _is_diff_tensor(x) and x.requires_grad] or \
                 [i for i, x in enumerate(inputs) if _is_diff_tensor(x)]
    if not active:
        raise ValueError("dot_product_check: no floating-point or complex input to differentiate")
    generator = torch.Generator().manual_seed(seed)
    if tangents is None:
        flags = _resolve_symmetric(symmetric, inputs, active, "dot_product_check")
        tangents = [None] * len(inputs)
        for i in active:
            t = _randn_like(inputs[i], generator)
            tangents[i] = symmetrize(t) if flags[i] else t
        tangents = tuple(tangents)
    primals = tuple(inputs[i].detach() for i in active)
    primal_tangents = tuple(tangents[i] for i in active)

    def restricted(*xs):
        args = list(inputs)
        for i, x in zip(active, xs):
            args[i] = x
        return tuple(_call(func, args))

    with torch.no_grad():
        reference = restricted(*primals)
    outs = [o for o, y in enumerate(reference) if y is not None]
    if cotangents is None:
        cotangents = tuple(_randn_like(y, generator) if y is not None else None for y in reference)
    else:
        cotangents = _as_tuple(cotangents)
        if len(cotangents) != len(reference):
            raise ValueError(f"dot_product_check: {len(cotangents)} cotangents for {len(reference)} outputs")

    def only_float(*xs):
        ys = restricted(*xs)
        return tuple(ys[o] for o in outs)

    try:
        _, output_tangents = torch.func.jvp(only_float, primals, primal_tangents)
        functorch_ok = True
    except RuntimeError as error:  # an autograd.Function written for torch.autograd only
        if "setup_context" not in str(error):
            raise
        functorch_ok = False
    if not functorch_ok:
        with _fwAD.dual_level():
            duals = [_fwAD.make_dual(x, t) for x, t in zip(primals, primal_tangents)]
            output_tangents = tuple(_fwAD.unpack_dual(y).tangent for y in only_float(*duals))
    output_tangents = [torch.zeros_like(reference[o]) if t is None else t for o, t in zip(outs, output_tangents)]

    leaves = [x.clone().requires_grad_() for x in primals]
    with torch.enable_grad():
        ys = only_float(*leaves)
    pairs = [(y, cotangents[o]) for o, y in zip(outs, ys) if cotangents[o] is not None and y.requires_grad]
    if pairs:
        input_cotangents = torch.autograd.grad([y for y, _ in pairs], leaves, [g for _, g in pairs], allow_unused=True)
    else:
        input_cotangents = [None] * len(leaves)

    lhs = float(inner([cotangents[o] for o in outs], output_tangents))
    rhs = float(inner(list(input_cotangents), list(primal_tangents)))
    discrepancy = _discrepancy(lhs, rhs)
    if rtol is None:
        rtol = _default_rtol(list(primals) + [reference[o] for o in outs])
    if raise_exception and not discrepancy <= rtol:
        names = ", ".join(f"input {i}" for i in active)
        raise GradcheckError(
            f"dot_product_check: reverse mode is not the adjoint of forward mode (differentiating {names}): "
            f"<g, J t> = {lhs:.17g} (torch.func.jvp) but <J^T g, t> = {rhs:.17g} (torch.autograd.grad); "
            f"relative discrepancy {discrepancy:.3e} > rtol = {rtol:.1e}",
            numerical=lhs, analytical=rhs)
    return discrepancy


def _randn_like(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    real = _real_dtype(x.dtype)
    if x.is_complex():
        t = torch.complex(torch.randn(x.shape, generator=generator, dtype=real),
                          torch.randn(x.shape, generator=generator, dtype=real))
    else:
        t = torch.randn(x.shape, generator=generator, dtype=real)
    return t.to(x.device)

"""Gradient checks for functions of symmetric (Hermitian) matrices, and gauge-aware comparisons of
eigenvectors and singular vectors.

:func:`torch.autograd.gradcheck` perturbs every entry of every input on its own.  A function of a
symmetric matrix is defined only on symmetric matrices -- ``torch.linalg.eigh`` reads one triangle,
others symmetrise first -- so perturbing ``A[i, j]`` without ``A[j, i]`` leaves its domain, and the
check reports a mismatch that is only the symmetry (pytorch#38948).  The checks here perturb the
inputs flagged symmetric along symmetric (complex: Hermitian) directions only, ``A[i, j]`` and
``A[j, i]`` together, and every other input freely::

    import torch
    import adjointgen.testing as agtest

    A = torch.randn(5, 5, dtype=torch.float64)
    A = ((A + A.mT) / 2).requires_grad_()
    f = lambda A: torch.linalg.eigh(A).eigenvalues
    torch.autograd.gradcheck(f, (A,), raise_exception=False)  # False: a false mismatch
    agtest.gradcheck(f, (A,))                   # True: symmetric directions (auto-detected)
    agtest.gradgradcheck(f, (A,), symmetric=True)
    agtest.dot_product_check(f, (A,))           # <g, J t> = <J^T g, t>, relative discrepancy

    w, V = torch.linalg.eigh(A.detach())
    agtest.assert_close_up_to_phase(-V, V)      # the sign (complex: phase) of each column is a gauge

    w, V = torch.linalg.eigh(torch.diag(torch.tensor([1.0, 2.0, 2.0], dtype=torch.float64)))
    R = torch.tensor([[1.0, 0, 0], [0, 0.6, -0.8], [0, 0.8, 0.6]], dtype=torch.float64)
    agtest.assert_close_subspaces(V @ R, V, w)  # a rotation inside the eigenspace of 2 is a gauge too

What is checked:

* :func:`gradcheck` -- the whole Jacobian restricted to the allowed directions: central finite
  differences ``(f(x + eps d) - f(x - eps d)) / (2 eps)`` against the reverse-mode rows
  ``Re <vjp(e_k), d>`` (and, with ``check_forward_ad=True``, against the forward-mode columns).
  Arguments, tolerances (``|analytical - numerical| <= atol + rtol |numerical|`` entrywise) and
  defaults are those of :func:`torch.autograd.gradcheck`; a failure raises :class:`GradcheckError`
  naming the input, the output, the entry and direction of the largest mismatch.
* :func:`gradgradcheck` -- the same check applied to the map ``(inputs, grad_outputs) -> vjp``.
* :func:`dot_product_check` -- the adjoint identity between forward mode (``torch.func.jvp``) and
  reverse mode (``torch.autograd.grad``) for random tangents and cotangents; :func:`adjoint_check`
  does the same for a hand-written JVP/VJP pair.
* :func:`align_phases`, :func:`assert_close_up_to_phase`, :func:`assert_close_subspaces` -- compare
  eigenvectors or singular vectors up to their gauge (a sign or unit phase per column; a rotation
  inside a cluster of equal eigenvalues).

Conventions.  Complex tensors follow torch: the gradient of a real loss ``L`` with respect to
``z = x + iy`` is ``dL/dx + i dL/dy``, and the cotangent ``v`` of a complex output ``y`` stands for the
loss ``Re <v, y>``.  Every inner product is the real one, ``<X, Y> = Re tr(X^H Y)`` (:func:`inner`).
Symmetric directions have unit entries: ``E_ij + E_ji`` for ``i < j`` and ``E_ii`` (complex adds
``i (E_ij - E_ji)``), so a Jacobian entry is the derivative with respect to the pair ``A[i, j] =
A[j, i]`` as one variable.  Batched inputs ``(..., n, n)`` are symmetric per batch element.

Eigenvectors and singular vectors are defined up to a gauge, so finite differences of them are
meaningful only if the function fixes it (compose with :func:`align_phases` to a reference) or if
the outputs are invariant under it (projectors ``V V^H``, ``|V|``, ``U diag(S) V^H`` pieces).
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Union

import torch
from torch.autograd import forward_ad as _fwAD
from torch.autograd.gradcheck import GradcheckError as _TorchGradcheckError

__all__ = [
    "GradcheckError", "adjoint_check", "align_phases", "assert_close_subspaces", "assert_close_up_to_phase",
    "central_difference", "dot_product_check", "gradcheck", "gradgradcheck", "inner", "symmetrize",
]

Tensors = Union[torch.Tensor, Sequence[torch.Tensor]]
#: ``symmetric=``: ``"auto"``, one bool for every input, one bool per input, or a predicate on a tensor
SymmetricSpec = Union[bool, str, Sequence[bool], Callable[[torch.Tensor], bool]]


class GradcheckError(_TorchGradcheckError):
    """A gradient check failed.  A subclass of the ``GradcheckError`` that
    :func:`torch.autograd.gradcheck` raises (so a ``RuntimeError``),
    with the failing input and output indices and the worst entry's values as attributes (``None``
    where they do not apply)."""

    def __init__(self, message: str, *, input_index: int | None = None, output_index: int | None = None,
                 numerical: float | None = None, analytical: float | None = None):
        super().__init__(message)
        self.input_index = input_index
        self.output_index = output_index
        self.numerical = numerical
        self.analytical = analytical


# --------------------------------------------------------------------------------------------------
# small public helpers


def symmetrize(X: torch.Tensor) -> torch.Tensor:
    """``(X + X^H) / 2`` over the last two dimensions: the symmetric (Hermitian) part, exactly
    symmetric in floating point."""
    return 0.5 * (X + X.mH)


def inner(X, Y) -> torch.Tensor:
    """The real inner product ``<X, Y> = Re tr(X^H Y) = Re sum(conj(X) * Y)``, summed over the pairs
    when ``X`` and ``Y`` are sequences of tensors (``None`` on either side counts as zero).  The
    pairing under which torch's complex VJP is the adjoint of its JVP.  Returns a 0-dim real tensor."""
    if isinstance(X, torch.Tensor) or isinstance(Y, torch.Tensor):
        X, Y = (X,), (Y,)
    X, Y = tuple(X), tuple(Y)
    if len(X) != len(Y):
        raise ValueError(f"inner: {len(X)} tensors on the left, {len(Y)} on the right")
    total = None
    for x, y in zip(X, Y):
        if x is None or y is None:
            continue
        if x.shape != y.shape:
            raise ValueError(f"inner: shapes {tuple(x.shape)} and {tuple(y.shape)} differ")
        term = (x.conj() * y).real.sum() if (x.is_complex() or y.is_complex()) else (x * y).sum()
        total = term if total is None else total + term
    return torch.zeros((), dtype=torch.float64) if total is None else total


def central_difference(func: Callable, inputs: Tensors, tangents: Tensors, *, eps: float = 1e-6):
    """Central finite difference ``(f(x + eps t) - f(x - eps t)) / (2 eps)`` of ``func`` along the
    tangents (one per input, ``None`` for inputs held fixed), evaluated without autograd.

    Returns a tensor if ``func`` returns one, else a tuple with one entry per output (``None`` for
    outputs that are not floating-point or complex tensors).  Make eigenvector outputs comparable
    first, e.g. ``lambda A: align_phases(torch.linalg.eigh(A)[1], V0)``."""
    inputs, tangents = _as_tuple(inputs), _as_tuple(tangents)
    if len(tangents) != len(inputs):
        raise ValueError(f"central_difference: {len(inputs)} inputs but {len(tangents)} tangents")

    def shifted(step):
        return tuple(x if t is None else x.detach() + step * t for x, t in zip(inputs, tangents))

    with torch.no_grad():
        plus, minus = func(*shifted(eps)), func(*shifted(-eps))
    single = isinstance(plus, torch.Tensor)
    plus, minus = _as_tuple(plus), _as_tuple(minus)
    result = tuple((p - m) / (2 * eps) if _is_diff_tensor(p) else None for p, m in zip(plus, minus))
    return result[0] if single else result


# --------------------------------------------------------------------------------------------------
# plumbing


def _as_tuple(x) -> tuple:
    if isinstance(x, torch.Tensor):
        return (x,)
    if isinstance(x, (tuple, list)):
        return tuple(x)
    return (x,)


def _is_diff_tensor(x) -> bool:
    return isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex())


def _real_flat(t: torch.Tensor) -> torch.Tensor:
    """The real coordinates of ``t``, flattened: ``(Re, Im)`` pairs for complex tensors."""
    t = t.detach()
    if t.is_complex():
        return torch.view_as_real(t.resolve_conj()).reshape(-1)
    return t.reshape(-1)


def _from_real_flat(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if like.is_complex():
        return torch.view_as_complex(v.reshape(*like.shape, 2).contiguous())
    return v.reshape(like.shape)


def _is_symmetric(x: torch.Tensor, rtol: float | None = None) -> bool:
    """Square in the last two dimensions and ``max |X - X^H| <= rtol max |X|`` (100 eps default)."""
    if not _is_diff_tensor(x) or x.dim() < 2 or x.shape[-1] != x.shape[-2]:
        return False
    if x.numel() == 0:
        return True
    real = x.real.dtype if x.is_complex() else x.dtype
    rtol = 100 * torch.finfo(real).eps if rtol is None else rtol
    with torch.no_grad():
        x = x.detach()
        return bool((x - x.mH).abs().amax() <= rtol * x.abs().amax())


def _resolve_symmetric(symmetric: SymmetricSpec, inputs: tuple, checked: Sequence[int], who: str) -> list[bool]:
    """One flag per input (False for inputs that are not checked); flagged inputs must be symmetric."""
    n = len(inputs)
    if isinstance(symmetric, str):
        if symmetric != "auto":
            raise ValueError(f"{who}: symmetric must be a bool, a sequence of bools, a callable or 'auto', "
                             f"got {symmetric!r}")
        flags = [i in checked and _is_symmetric(inputs[i]) for i in range(n)]
        return flags
    if isinstance(symmetric, bool):
        flags = [symmetric and i in checked for i in range(n)]
    elif callable(symmetric):
        flags = [i in checked and bool(symmetric(inputs[i])) for i in range(n)]
    else:
        symmetric = list(symmetric)
        if len(symmetric) != n:
            raise ValueError(f"{who}: symmetric has {len(symmetric)} entries for {n} inputs")
        flags = [bool(s) and i in checked for i, s in enumerate(symmetric)]
    for i, flag in enumerate(flags):
        if not flag:
            continue
        x = inputs[i]
        if x.dim() < 2 or x.shape[-1] != x.shape[-2]:
            raise ValueError(f"{who}: input {i} is flagged symmetric but has shape {tuple(x.shape)}, "
                             f"not (..., n, n)")
        if not _is_symmetric(x):
            with torch.no_grad():
                asym = float((x.detach() - x.detach().mH).abs().amax())
            kind = "Hermitian" if x.is_complex() else "symmetric"
            raise ValueError(f"{who}: input {i} is flagged symmetric but is not {kind}: "
                             f"max |A - A^{'H' if x.is_complex() else 'T'}| = {asym:.3e} (more than 100 eps "
                             f"relative; pass adjointgen.testing.symmetrize(A))")
    return flags


class _Directions:
    """The real directions an input is perturbed along, each with at most two nonzero entries:
    ``d_r = a_r e_{p_r} + b_r e_{q_r}`` in the flattened input."""

    def __init__(self, x: torch.Tensor, symmetric: bool):
        self.shape, self.dtype, self.device = x.shape, x.dtype, x.device
        self.symmetric, self.complex = symmetric, x.is_complex()
        numel = x.numel()
        if symmetric:
            n = x.shape[-1]
            batch = numel // (n * n) if n else 0
            i, j = torch.triu_indices(n, n)
            offsets = (torch.arange(batch) * n * n)[:, None]
            p, q = (offsets + i * n + j).reshape(-1), (offsets + j * n + i).reshape(-1)
            off_diagonal = (i != j).repeat(batch)
            a = torch.ones(p.shape, dtype=x.dtype)
            b = off_diagonal.to(x.dtype)
            kind = ["re"] * p.numel()
            if self.complex:  # i (E_ij - E_ji), i < j: the imaginary part of a Hermitian matrix
                p2, q2 = p[off_diagonal], q[off_diagonal]
                a2 = torch.full(p2.shape, 1j, dtype=x.dtype)
                p, q = torch.cat([p, p2]), torch.cat([q, q2])
                a, b = torch.cat([a, a2]), torch.cat([b, -a2])
                kind += ["im"] * p2.numel()
        else:
            p = torch.arange(numel)
            q = p
            a = torch.ones(numel, dtype=x.dtype)
            b = torch.zeros(numel, dtype=x.dtype)
            kind = ["re"] * numel
            if self.complex:
                p, q = torch.cat([p, p]), torch.cat([q, q])
                a, b = torch.cat([a, torch.full((numel,), 1j, dtype=x.dtype)]), torch.cat([b, b])
                kind += ["im"] * numel
        self.p, self.q, self.a, self.b, self.kind = p, q, a, b, kind

    def __len__(self):
        return self.p.numel()

    def dense(self, r: int) -> torch.Tensor:
        """``d_r`` as a tensor shaped like the input."""
        return self.shifted(torch.zeros(self.shape, dtype=self.dtype), r, 1.0).to(self.device)

    def combine(self, coefficients: torch.Tensor) -> torch.Tensor:
        """``sum_r c_r d_r`` (real coefficients) as a tensor shaped like the input."""
        c = coefficients.to(self.a.dtype)
        t = torch.zeros(int(math.prod(self.shape)), dtype=self.dtype)
        t.index_add_(0, self.p, c * self.a)
        t.index_add_(0, self.q, c * self.b)
        return t.reshape(self.shape).to(self.device)

    def shifted(self, x: torch.Tensor, r: int, step: float) -> torch.Tensor:
        """``x + step d_r`` as a new tensor: an exactly symmetric ``x`` stays exactly symmetric."""
        flat = x.detach().clone().reshape(-1)
        p, q = int(self.p[r]), int(self.q[r])
        a, b = self.a[r].item(), self.b[r].item()
        flat[p] += step * a
        if b != 0:
            flat[q] += step * b
        return flat.reshape(self.shape)

    def project(self, g: torch.Tensor) -> torch.Tensor:
        """``Re <g, d_r>`` for every direction: a reverse-mode row of the restricted Jacobian."""
        flat = g.detach().reshape(-1).cpu()
        a, b = self.a, self.b
        if flat.is_complex() or a.is_complex():
            return (flat[self.p].conj() * a + flat[self.q].conj() * b).real.to(torch.float64)
        return (flat[self.p] * a + flat[self.q] * b).to(torch.float64)

    def describe(self, r: int, name: str) -> str:
        """The direction in words, e.g. ``A[1, 0, 2] and A[1, 2, 0] together``."""
        shape = tuple(self.shape)
        p, q = int(self.p[r]), int(self.q[r])
        ip, iq = _unravel(p, shape), _unravel(q, shape)
        part = "the imaginary part of " if self.kind[r] == "im" else ("the real part of " if self.complex else "")
        if self.symmetric and p != q:
            sign = "minus " if self.kind[r] == "im" else ""
            return f"{part}{name}{list(ip)} and {sign}{part}{name}{list(iq)} together"
        return f"{part}{name}{list(ip)}"


def _unravel(k: int, shape: tuple) -> tuple:
    index = []
    for size in reversed(shape):
        index.append(k % size)
        k //= size
    return tuple(reversed(index))


def _describe_output(row: int, out: torch.Tensor, name: str) -> str:
    if out.is_complex():
        element, part = _unravel(row // 2, tuple(out.shape)), ("real", "imaginary")[row % 2]
        return f"the {part} part of {name}{list(element)}"
    return f"{name}{list(_unravel(row, tuple(out.shape)))}"


def _call(func, args) -> list:
    """The outputs of ``func(*args)`` as a list (``None`` for entries that are not float tensors)."""
    out = func(*args)
    return [o if _is_diff_tensor(o) else None for o in _as_tuple(out)]


def _fmt(x: float) -> str:
    return f"{x:.6g}"


# --------------------------------------------------------------------------------------------------
# the Jacobian check


def gradcheck(
    func: Callable[..., Tensors],
    inputs: Tensors,
    *,
    symmetric: SymmetricSpec = "auto",
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    raise_exception: bool = True,
    nondet_tol: float = 0.0,
    check_undefined_grad: bool = True,
    check_backward_ad: bool = True,
    check_forward_ad: bool = False,
    fast_mode: bool = False,
    seed: int = 0,
) -> bool:
    """Check the derivatives of ``func`` at ``inputs`` against central finite differences, perturbing
    symmetric inputs along symmetric (Hermitian) directions only.

    Like :func:`torch.autograd.gradcheck`, the inputs checked are the floating-point and complex
    tensors with ``requires_grad=True``; the others are passed unchanged.  ``func`` returns a tensor
    or a tuple of tensors (entries that are not floating-point tensors are ignored).

    Args:
        func: the function; it is called with perturbed copies of the inputs.
        inputs: a tensor or a tuple of arguments.
        symmetric: which checked inputs are symmetric (complex: Hermitian) matrices ``(..., n, n)``,
            perturbed along ``E_ij + E_ji`` (complex also ``i (E_ij - E_ji)``) instead of entry by
            entry.  ``"auto"`` (default): the square inputs with ``max |A - A^H| <= 100 eps max |A|``;
            ``True``/``False``: every checked input / none; a sequence of bools, one per input; or
            a predicate called on each checked input.  An input flagged symmetric that is not raises
            ``ValueError``.  Inputs not flagged are perturbed freely, entry by entry.
        eps: the finite-difference step.
        atol, rtol: entrywise tolerance ``|analytical - numerical| <= atol + rtol |numerical|``.
        raise_exception: raise :class:`GradcheckError` on failure (default) or return ``False``.
        nondet_tol: reverse mode is run twice; the two Jacobians must agree within this tolerance.
        check_undefined_grad: as torch: backward must accept undefined (absent) cotangents for all
            outputs, and for each output alone, and give zero or no gradient when all are absent.
        check_backward_ad: check reverse mode (``torch.autograd.grad``, one output at a time, the
            other outputs' cotangents absent, so a backward mishandling a missing cotangent fails).
        check_forward_ad: also check forward mode (``torch.autograd.forward_ad`` dual tensors).
        fast_mode: compare ``v^T J u`` for one random ``u`` (restricted to the allowed directions)
            and random ``v`` per input-output pair, with ``atol`` scaled as torch scales it, instead
            of the whole Jacobian: two evaluations and one backward per output instead of one per
            direction and one per output entry.
        seed: seeds the random vectors of ``fast_mode``.

    Returns:
        ``True`` if every entry agrees; ``False`` on failure with ``raise_exception=False``.

    Raises:
        GradcheckError: with the input, the output, the entry (and direction) of the largest
            mismatch, the numerical and analytical values and how many entries fail.
        ValueError: no input requires grad, or an input flagged symmetric is not symmetric.
    """
    try:
        return _gradcheck(func, inputs, symmetric=symmetric, eps=eps, atol=atol, rtol=rtol, nondet_tol=nondet_tol,
                          check_undefined_grad=check_undefined_grad, check_backward_ad=check_backward_ad,
                          check_forward_ad=check_forward_ad, fast_mode=fast_mode, seed=seed, who="gradcheck")
    except GradcheckError:
        if raise_exception:
            raise
        return False


def _gradcheck(func, inputs, *, symmetric, eps, atol, rtol, nondet_tol, check_undefined_grad, check_backward_ad,
               check_forward_ad, fast_mode, seed, who, input_names=None, output_names=None):
    """The check behind gradcheck and gradgradcheck: returns True or raises GradcheckError."""
    inputs = _as_tuple(inputs)
    checked = [i for i, x in enumerate(inputs) if _is_diff_tensor(x) and x.requires_grad]
    if not checked:
        raise ValueError(f"{who} expects at least one floating-point or complex input with requires_grad=True")
    if not (check_backward_ad or check_forward_ad):
        raise ValueError(f"{who}: at least one of check_backward_ad and check_forward_ad must be True")
    flags = _resolve_symmetric(symmetric, inputs, checked, who)
    in_name = (lambda i: input_names[i]) if input_names else (lambda i: f"input {i}")
    for i in checked:
        if inputs[i].dtype not in (torch.float64, torch.complex128):
            warnings.warn(f"{who}: {in_name(i)} is {inputs[i].dtype}, not double precision: the default eps "
                          f"and tolerances are meant for float64/complex128", stacklevel=3)
    out_name = (lambda o: output_names[o]) if output_names else (lambda o: f"output {o}")
    directions = {i: _Directions(inputs[i], flags[i]) for i in checked}

    def evaluate(i, r, step, coefficients=None):
        args = list(inputs)
        if coefficients is None:
            args[i] = directions[i].shifted(inputs[i], r, step)
        else:
            args[i] = inputs[i].detach() + step * directions[i].combine(coefficients)
        with torch.no_grad():
            return _call(func, args)

    with torch.no_grad():
        reference = _call(func, [x.detach() if isinstance(x, torch.Tensor) else x for x in inputs])
    outs = [o for o in range(len(reference)) if reference[o] is not None]
    if not outs:
        raise ValueError(f"{who}: func returned no floating-point or complex tensor")
    sizes = {o: _real_flat(reference[o]).numel() for o in outs}

    def difference(plus, minus):
        columns = {}
        for o in outs:
            if plus[o] is None or minus[o] is None or plus[o].shape != reference[o].shape:
                raise GradcheckError(f"{who}: {out_name(o)} changed type or shape under a perturbation "
                                     f"({tuple(reference[o].shape)} at the input point)", output_index=o)
            columns[o] = ((_real_flat(plus[o]) - _real_flat(minus[o])) / (2 * eps)).to(torch.float64).cpu()
        return columns

    def fail(message, **info):
        raise GradcheckError(message, **info)

    if check_backward_ad and check_undefined_grad:
        _check_undefined_grad(func, inputs, checked, who, in_name)
    generator = torch.Generator().manual_seed(seed)

    if fast_mode:
        # v^T J u per (input, output) pair; u within the allowed directions, both nonnegative and normalised
        coefficients = {}
        for i in checked:
            c = torch.rand(len(directions[i]), generator=generator, dtype=torch.float64)
            coefficients[i] = c / c.norm()
        vs = {}
        for o in outs:
            v = torch.rand(sizes[o], generator=generator, dtype=torch.float64)
            vs[o] = v / v.norm()
        numerical = {}
        for i in checked:
            cols = difference(evaluate(i, None, eps, coefficients[i]), evaluate(i, None, -eps, coefficients[i]))
            for o in outs:
                numerical[i, o] = float(vs[o] @ cols[o])
        analytical = {}
        if check_backward_ad:
            rows = _reverse_rows(func, inputs, checked, outs, reference, who,
                                 cotangents={o: vs[o] for o in outs}, out_name=out_name, in_name=in_name,
                                 nondet_tol=nondet_tol)
            if isinstance(rows, str):
                return fail(rows)
            for (i, o), g in rows.items():
                analytical["reverse", i, o] = float(inner(g[0], directions[i].combine(coefficients[i])))
        if check_forward_ad:
            for i in checked:
                tangent = directions[i].combine(coefficients[i])
                columns = _forward_columns(func, inputs, i, [tangent], outs, reference)
                for o in outs:
                    analytical["forward", i, o] = float(vs[o] @ columns[o][:, 0])
        for (mode, i, o), value in analytical.items():
            num = numerical[i, o]
            tol = atol * float(coefficients[i].sum()) * float(vs[o].sum()) + rtol * abs(num)
            if not abs(value - num) <= tol:
                return fail(
                    f"{who} (fast mode, {mode} mode): mismatch for {out_name(o)} with respect to "
                    f"{in_name(i)}{' (symmetric directions)' if flags[i] else ''}: v^T J u numerical "
                    f"{_fmt(num)}, analytical {_fmt(value)}, |difference| {abs(value - num):.3e} > "
                    f"tolerance {tol:.3e}.  Run with fast_mode=False for the entry that fails.",
                    input_index=i, output_index=o, numerical=num, analytical=value)
        return True

    # slow mode: the whole restricted Jacobian, column by column (numerical) and row by row (analytical)
    numerical = {}
    for i in checked:
        columns = [difference(evaluate(i, r, eps), evaluate(i, r, -eps)) for r in range(len(directions[i]))]
        for o in outs:
            numerical[i, o] = (torch.stack([c[o] for c in columns], dim=1) if columns
                               else torch.zeros(sizes[o], 0, dtype=torch.float64))
    analytical = {}
    if check_backward_ad:
        rows = _reverse_rows(func, inputs, checked, outs, reference, who, cotangents=None,
                             out_name=out_name, in_name=in_name, nondet_tol=nondet_tol)
        if isinstance(rows, str):
            return fail(rows)
        for (i, o), grads in rows.items():
            analytical["reverse", i, o] = (torch.stack([directions[i].project(g) for g in grads])
                                           if grads else torch.zeros(0, len(directions[i]), dtype=torch.float64))
    if check_forward_ad:
        for i in checked:
            tangents = [directions[i].dense(r) for r in range(len(directions[i]))]
            columns = _forward_columns(func, inputs, i, tangents, outs, reference)
            for o in outs:
                analytical["forward", i, o] = columns[o]
    for (mode, i, o), value in analytical.items():
        message = _compare(numerical[i, o], value, atol, rtol, mode=mode, who=who, input_name=in_name(i),
                           output_name=out_name(o), x=inputs[i], out=reference[o], directions=directions[i], eps=eps)
        if message:
            worst = message[1]
            return fail(message[0], input_index=i, output_index=o, numerical=worst[0], analytical=worst[1])
    return True


def _reverse_rows(func, inputs, checked, outs, reference, who, *, cotangents, out_name, in_name, nondet_tol):
    """``{(i, o): [vjp_i(e_k) for each real coordinate k of output o]}`` (or one row for the given
    cotangents), each computed twice to check reentrancy; a string describes a failure."""
    with torch.enable_grad():
        outputs = _call(func, list(inputs))
    rows = {(i, o): [] for i in checked for o in outs}
    for o in outs:
        out = outputs[o]
        if out is None or out.shape != reference[o].shape:
            return f"{who}: {out_name(o)} differs between calls with and without autograd"
        size = _real_flat(reference[o]).numel()
        if cotangents is None:  # one real coordinate at a time: e_k, and i e_k for imaginary parts
            units = [torch.nn.functional.one_hot(torch.tensor(k), size) for k in range(size)]
        else:
            units = [cotangents[o]]
        for unit in units:
            cotangent = _from_real_flat(unit.to(_real_dtype(out.dtype)), out).to(out.device)
            grads = []
            for _ in range(2):
                if out.requires_grad:
                    g = torch.autograd.grad(out, [inputs[i] for i in checked], cotangent,
                                            retain_graph=True, allow_unused=True)
                else:
                    g = [None] * len(checked)
                grads.append([torch.zeros_like(inputs[i]) if gi is None else gi for i, gi in zip(checked, g)])
            for slot, i in enumerate(checked):
                g1, g2 = grads[0][slot], grads[1][slot]
                if g1.shape != inputs[i].shape or g1.dtype != inputs[i].dtype:
                    return (f"{who}: the gradient of {out_name(o)} with respect to {in_name(i)} has shape "
                            f"{tuple(g1.shape)} and dtype {g1.dtype}; the input has {tuple(inputs[i].shape)} "
                            f"and {inputs[i].dtype}")
                same_nan = torch.isnan(g1.detach()) & torch.isnan(g2.detach())  # NaN is reported below
                spread = float((g1.detach() - g2.detach()).abs().masked_fill(same_nan, 0).max()) if g1.numel() else 0.0
                if not spread <= nondet_tol:
                    return (f"{who}: backward is not reentrant: two identical backward passes for {out_name(o)} "
                            f"give gradients of {in_name(i)} differing by {spread:.3e} > nondet_tol = {nondet_tol:.3e}")
                rows[i, o].append(g1.detach())
    return rows


def _check_undefined_grad(func, inputs, checked, who, in_name):
    """Backward with undefined cotangents for all outputs (then for each output alone, the others
    zero) must run and give zero or no gradient, as torch.autograd.gradcheck checks."""
    undefined = getattr(getattr(torch._C, "_functions", None), "UndefinedGrad", None)
    if undefined is None:  # pragma: no cover - a torch without the hook: nothing to check with
        return
    with torch.enable_grad():
        count = len([y for y in _call(func, list(inputs)) if y is not None and y.requires_grad])
    cases = [None] + (list(range(count)) if count > 1 else [])
    for case in cases:
        with torch.enable_grad():
            ys = [y for y in _call(func, list(inputs)) if y is not None and y.requires_grad]
            ys = [undefined()(y) if case is None or k == case else y for k, y in enumerate(ys)]
        if not ys:
            return
        what = "all outputs" if case is None else f"differentiable output {case}"
        try:
            grads = torch.autograd.grad(ys, [inputs[i] for i in checked], [torch.zeros_like(y) for y in ys],
                                        allow_unused=True)
        except RuntimeError as error:
            raise GradcheckError(f"{who}: backward fails when the cotangent of {what} is undefined "
                                 f"(absent): {error}") from error
        for i, g in zip(checked, grads):
            if g is not None and not bool((g == 0).all()):
                raise GradcheckError(f"{who}: with zero or undefined cotangents ({what} undefined) the gradient "
                                     f"of {in_name(i)} is not zero: max |g| = {float(g.abs().max()):.3e}",
                                     input_index=i)


def _real_dtype(dtype):
    return {torch.complex64: torch.float32, torch.complex128: torch.float64, torch.complex32: torch.float16}.get(dtype, dtype)


def _forward_columns(func, inputs, i, tangents, outs, reference):
    """``{o: J_oi t for each tangent t}`` as real columns, by forward-mode dual tensors."""
    columns = {o: [] for o in outs}
    for t in tangents:
        with _fwAD.dual_level():
            args = list(inputs)
            args[i] = _fwAD.make_dual(inputs[i].detach(), t)
            outputs = _call(func, args)
            for o in outs:
                tangent = _fwAD.unpack_dual(outputs[o]).tangent if outputs[o] is not None else None
                if tangent is None:
                    tangent = torch.zeros_like(reference[o])
                columns[o].append(_real_flat(tangent).to(torch.float64).cpu())
    return {o: (torch.stack(c, dim=1) if c else torch.zeros(_real_flat(reference[o]).numel(), 0, dtype=torch.float64))
            for o, c in columns.items()}


def _compare(numerical, analytical, atol, rtol, *, mode, who, input_name, output_name, x, out, directions, eps):
    """``None`` if ``|analytical - numerical| <= atol + rtol |numerical|`` everywhere, else the message
    and the worst entry's (numerical, analytical)."""
    difference = (analytical - numerical).abs()
    tolerance = atol + rtol * numerical.abs()
    bad = ~(difference <= tolerance)  # NaN fails
    if not bool(bad.any()):
        return None
    excess = torch.where(torch.isnan(difference), torch.full_like(difference, math.inf), difference / tolerance)
    row, column = divmod(int(torch.argmax(excess)), numerical.shape[1])
    num, ana = float(numerical[row, column]), float(analytical[row, column])
    kind = "Hermitian" if directions.complex else "symmetric"
    restricted = f", perturbed along {kind} directions" if directions.symmetric else ""
    lines = [
        f"{who}: {mode}-mode Jacobian mismatch for {output_name} (y) with respect to {input_name} (x{restricted}).",
        f"  largest mismatch: d {_describe_output(row, out, 'y')} / d ({directions.describe(column, 'x')}):",
        f"    numerical {_fmt(num)}, analytical {_fmt(ana)}, |difference| {abs(ana - num):.3e} "
        f"> atol + rtol |numerical| = {atol + rtol * abs(num):.3e}",
        f"  {int(bad.sum())} of {bad.numel()} entries fail; the largest |difference| is "
        f"{float(difference.nan_to_num(math.inf).max()):.3e}",
    ]
    if abs(num) * eps > 0.1:
        lines.append("  the numerical derivative is of order 1/eps: the function jumps under the perturbation "
                     "(did an eigenvector or singular vector change sign or phase? fix the gauge with "
                     "align_phases or use gauge-invariant outputs)")
    if not directions.symmetric and _is_symmetric(x):
        lines.append(f"  {input_name} is symmetric but was perturbed entry by entry; if func assumes a "
                     f"symmetric (Hermitian) input, pass symmetric=True for it")
    return "\n".join(lines), (num, ana)


# --------------------------------------------------------------------------------------------------
# second derivatives


def gradgradcheck(
    func: Callable[..., Tensors],
    inputs: Tensors,
    grad_outputs: Tensors | None = None,
    *,
    symmetric: SymmetricSpec = "auto",
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    raise_exception: bool = True,
    nondet_tol: float = 0.0,
    check_undefined_grad: bool = True,
    fast_mode: bool = False,
    seed: int = 0,
) -> bool:
    """Check second derivatives: :func:`gradcheck` of the map ``(inputs, grad_outputs) -> the
    gradients of func's outputs, contracted with grad_outputs, with respect to the inputs``
    (reverse over reverse, as :func:`torch.autograd.gradgradcheck`).

    The symmetric inputs (``symmetric=`` as in :func:`gradcheck`, resolved on ``inputs``) are
    perturbed along symmetric directions, the ``grad_outputs`` freely, and the gradient of a
    symmetric input is symmetrised, ``(g + g^H) / 2``, before it is compared: its skew part is
    invisible to symmetric perturbations and implementation-defined (``torch.linalg.eigh`` returns
    a non-symmetric one).  What is checked is the Hessian restricted to symmetric directions.

    Args:
        grad_outputs: cotangents, one per floating-point output of ``func`` that requires grad;
            default random (uniform in [-1, 1), seeded by ``seed``), with ``requires_grad=True``.
        Others: as :func:`gradcheck`.

    Raises:
        GradcheckError: naming ``input i`` or ``grad_outputs[k]`` and ``the gradient w.r.t. input i``.
    """
    inputs = _as_tuple(inputs)
    checked = [i for i, x in enumerate(inputs) if _is_diff_tensor(x) and x.requires_grad]
    if not checked:
        raise ValueError("gradgradcheck expects at least one floating-point or complex input with requires_grad=True")
    flags = _resolve_symmetric(symmetric, inputs, checked, "gradgradcheck")
    with torch.enable_grad():
        outputs = _call(func, list(inputs))
    differentiable = [o for o, y in enumerate(outputs) if y is not None and y.requires_grad]
    if not differentiable:
        raise ValueError("gradgradcheck: no output of func requires grad")
    if grad_outputs is None:
        generator = torch.Generator().manual_seed(seed)
        grad_outputs = []
        for o in differentiable:
            y = outputs[o]
            v = 2 * torch.rand(_real_flat(y).numel(), generator=generator, dtype=torch.float64) - 1
            grad_outputs.append(_from_real_flat(v.to(_real_dtype(y.dtype)), y).to(y.device).requires_grad_())
    grad_outputs = _as_tuple(grad_outputs)
    if len(grad_outputs) != len(differentiable):
        raise ValueError(f"gradgradcheck: {len(grad_outputs)} grad_outputs for {len(differentiable)} outputs "
                         f"that require grad")
    n_in = len(inputs)

    def first_derivatives(*args):
        xs, vs = list(args[:n_in]), args[n_in:]
        with torch.enable_grad():
            for i in checked:  # finite differences call this without a graph: start one
                if not xs[i].requires_grad:
                    xs[i] = xs[i].detach().requires_grad_()
            ys = _call(func, xs)
            pairs = [(ys[o], v) for o, v in zip(differentiable, vs) if ys[o] is not None and ys[o].requires_grad]
            grads = torch.autograd.grad([y for y, _ in pairs], [xs[i] for i in checked], [v for _, v in pairs],
                                        create_graph=True, allow_unused=True) if pairs else [None] * len(checked)
        grads = [torch.zeros_like(xs[i]) if g is None else g for i, g in zip(checked, grads)]
        # only the symmetric part of a symmetric input's gradient acts on symmetric directions
        return tuple(symmetrize(g) if flags[i] else g for i, g in zip(checked, grads))

    input_names = [f"input {i}" for i in range(n_in)] + [f"grad_outputs[{k}]" for k in range(len(grad_outputs))]
    output_names = [f"the gradient w.r.t. input {i}" for i in checked]
    try:
        return _gradcheck(first_derivatives, inputs + grad_outputs, symmetric=flags + [False] * len(grad_outputs),
                          eps=eps, atol=atol, rtol=rtol, nondet_tol=nondet_tol,
                          check_undefined_grad=check_undefined_grad, check_backward_ad=True,
                          check_forward_ad=False, fast_mode=fast_mode, seed=seed, who="gradgradcheck",
                          input_names=input_names, output_names=output_names)
    except GradcheckError:
        if raise_exception:
            raise
        return False


# the dot-product identity and the gauge-aware comparisons: their own modules
from .adjoint import adjoint_check, dot_product_check  # noqa: E402
from .gauge import align_phases, assert_close_subspaces, assert_close_up_to_phase  # noqa: E402

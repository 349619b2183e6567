"""Matrix functions ``X = f(A) = V f(w) V^H`` of Hermitian ``A``: the autograd functions around the
pieces a derivation generic in ``f`` generates (``derivations/funm.py``).

For each concrete ``f`` the generator emits a :class:`~adjointgen.runtime.divided.ScalarProgram`
(``f`` over primitives, with their derivatives), and the derivation's rule
``gA = V (L ∘ (V^H sym(gX) V)) V^H`` (reverse mode, and forward mode: the map is self-adjoint).
:mod:`adjointgen.runtime.divided` evaluates ``f``, ``L_ij = f[w_i, w_j]`` and ``f[a, b, c]`` from the
program without cancellation.  This module puts them together:

* :class:`Spectral` -- one concrete function: its program, its rule, its checks;
* the forward (``torch.linalg.eigh``, then ``V f(w) V^H``, where an infinite ``f(w_k)`` reaches only
  the entries its eigenvector touches) with domain checks that name the offending eigenvalue;
* the first derivative ``K = Df(A)[G]`` as an autograd function of its own, whose backward and
  forward mode are the second-order rule (:func:`second_order`), so that ``torch.func.hessian``,
  ``gradgradcheck`` and forward-over-reverse work, also at exactly repeated eigenvalues (``L`` and
  ``T`` are continuous there; no eigenvector gauge enters).

Each autograd function has its own ``vmap`` rule (the batch dimension becomes a batch dimension of
the matrices), so the domain checks, which need values, run on plain tensors under every
``torch.func`` transform.  Third derivatives are not implemented and raise.
"""
from __future__ import annotations

import math

import torch

from . import checks as _checks
from . import divided as _divided
from . import function as _function
from .function import nested_forward as _nested_forward

__all__ = ["Spectral", "apply", "second_order"]

#: elements of T evaluated at once in the second-order contraction (memory ~ 30 such arrays)
SECOND_ORDER_BLOCK = 1 << 21


class Spectral:
    """One concrete spectral function ``f``.

    Args:
        name: the public name (``expm``), for messages.
        program: ``f`` as a :class:`~adjointgen.runtime.divided.ScalarProgram` (its options are the
            public function's, ``("p",)`` for ``x**p``).
        frechet: the derivation's rule ``(w, V, G, L) -> V (L ∘ (V^H sym(G) V)) V^H``.
        frechet_general: the derivation's rule along unstructured tangents,
            ``(w, V, G, L) -> V (L ∘ (V^H G V)) V^H`` (``Derivation.general_directions``): the
            derivative at Hermitian ``A`` of the general-matrix function ``f`` restricts (``None``:
            the derivation declares none).
        domain: optional extra condition on the eigenvalues stated by the user, a
            :class:`~adjointgen.runtime.divided.ScalarProgram` of a boolean (``None``: none).
    """

    def __init__(self, name, program, *, frechet, frechet_general=None, domain=None, domain_text=None):
        self.name, self.program, self.frechet, self.frechet_general = name, program, frechet, frechet_general
        self.expr = program.text
        self.options = tuple(program.options)
        self.domain, self.domain_text = domain, domain_text

    def __repr__(self):
        return f"Spectral({self.name!r}, {self.expr!r})"

    # ------------------------------------------------------------------ elementwise pieces
    def f(self, w, opts=()):
        return _divided.values(self.program, w, opts)

    def L(self, w, opts=()):
        """The Daleckii–Krein matrix ``L_ij = f[w_i, w_j]`` (``f'(w_i)`` on the diagonal)."""
        return _divided.first(self.program, w.unsqueeze(-1), w.unsqueeze(-2), opts)

    def dd2(self, a, b, c, *opts):
        return _divided.second(self.program, a, b, c, opts)

    # ------------------------------------------------------------------ domain checks
    def check_domain(self, w, opts=()):
        """``w``, with eigenvalues a rounding error outside a closed end of the domain moved onto
        it; a :class:`ValueError` naming the eigenvalue if one is outside otherwise (skipped for
        tensors without values: meta and fake tensors, compiler tracing)."""
        if w.numel() == 0 or _checks.is_traced(w):
            return w
        if self.domain is not None:
            ok = _divided.values(self.domain, w, opts)
            if not bool(ok.all()):
                bad = ~ok
                raise ValueError(f"{self.name}: A has the eigenvalue {_divided.evaluate._locate(w, bad)}, outside the "
                                 f"stated domain {self.domain_text} of {self.expr}")
        return _divided.check_domain(self.program, w, opts, order=0, name=self.name, tol=_rounding(w))

    def check_smooth(self, w, opts=(), order=1, A=None):
        """A :class:`ValueError` if ``f`` has no ``order``-th derivative at an eigenvalue (``sqrt`` at
        0), or at one within rounding of such a point (unless ``A`` is diagonal: its eigenvalues
        are exact)."""
        if w.numel() == 0 or _checks.is_traced(w):
            return
        exact = (lambda: _is_diagonal(A)) if A is not None else None
        _divided.check_domain(self.program, w, opts, order=order, name=self.name, tol=_rounding(w), exact=exact)

    def apply_rule(self, w, V, G, L, general=False):
        """The derived rule ``V (L ∘ (V^H sym(G) V)) V^H`` (``general``: along unstructured ``G``,
        ``V (L ∘ (V^H G V)) V^H``); where ``L`` has infinite entries (``f`` or its divided
        difference overflows) they reach only the entries they touch: the rule on the finite part,
        and on the magnitudes of ``V``, ``G`` for where an infinity arrives (no ``inf * 0`` turns
        into NaN)."""
        G = G.to(V.dtype) if V.is_complex() and not G.is_complex() else G
        rule = self.frechet_general if general else self.frechet
        finite = torch.isfinite(L)
        if _checks.is_traced(L) or bool(finite.all()):
            return rule(w, V, G, L)
        if bool(torch.isnan(L).any()):
            i, j = (int(t) for t in torch.nonzero(torch.isnan(L).reshape(-1, *L.shape[-2:]).any(0))[0])
            wf = w.reshape(-1, w.shape[-1])
            raise ValueError(f"{self.name}: the divided difference of {self.expr} at the eigenvalues "
                             f"{float(wf[0, i]):.6g} and {float(wf[0, j]):.6g} is not a number (an intermediate of "
                             "f overflows); the derivative cannot be evaluated there")
        zero = torch.zeros((), dtype=L.dtype)
        K = rule(w, V, G, torch.where(finite, L, zero))
        absV, absG = V.abs(), G.abs()
        reach = rule(w, absV, absG, (~finite).to(absV.dtype))
        direction = rule(w, V, G, torch.where(finite, zero, L.sign()))
        real = direction.real if direction.is_complex() else direction
        inf = torch.full((), math.inf, dtype=real.dtype)
        out = torch.where(reach > 0, (inf * real.sign()).to(K.dtype), K)
        return torch.where((reach > 0) & (real == 0), torch.full((), math.nan, dtype=real.dtype).to(K.dtype), out)

    def checked_L(self, w, opts=(), A=None, order=1):
        """``L`` where ``f`` is differentiable at every eigenvalue (:meth:`check_smooth`); its NaNs
        are refused by :meth:`apply_rule`."""
        self.check_smooth(w, opts, order, A)
        return self.L(w, opts)




def _rounding(w):
    """``8 n eps max|w|`` per matrix of the batch: what rounding moves an eigenvalue by."""
    eps = torch.finfo(w.dtype).eps
    return 8 * w.shape[-1] * eps * w.abs().amax(-1, keepdim=True)


def _is_diagonal(A) -> bool:
    return not bool((A - torch.diag_embed(torch.diagonal(A, dim1=-2, dim2=-1))).any())


def _assemble(V, fw):
    """``V diag(fw) V^H``, where an infinite ``fw_k`` reaches only the entries ``(i, j)`` with
    ``V_ik V_jk != 0`` (``expm(diag(800, 1))`` is ``[[inf, 0], [0, e]]``, as torch's)."""
    fw = fw.to(V.dtype)
    finite = torch.isfinite(fw)
    if _checks.is_traced(fw) or bool(finite.all()):
        return (V * fw.unsqueeze(-2)) @ V.mH
    part = torch.where(finite, fw, torch.zeros((), dtype=fw.dtype))
    X = (V * part.unsqueeze(-2)) @ V.mH
    big = (~finite).to(V.real.dtype if V.is_complex() else V.dtype)
    reach = (V.abs() * big.unsqueeze(-2)) @ V.abs().mT  # > 0 where an infinite eigenvalue reaches
    sign = fw.real.sign() if fw.is_complex() else fw.sign()
    direction = (V * torch.where(finite, torch.zeros((), dtype=fw.dtype), sign.to(fw.dtype)).unsqueeze(-2)) @ V.mH
    inf = torch.full((), math.inf, dtype=X.real.dtype if X.is_complex() else X.dtype)
    if X.is_complex():
        re = torch.where(reach > 0, torch.where(direction.real != 0, inf * direction.real.sign(), X.real), X.real)
        im = torch.where(reach > 0, torch.where(direction.imag != 0, inf * direction.imag.sign(), X.imag), X.imag)
        return torch.complex(re, im)
    undefined = (reach > 0) & (direction == 0)
    out = torch.where(reach > 0, inf * direction.sign(), X)
    return torch.where(undefined, torch.full((), math.nan, dtype=X.dtype), out)


# ------------------------------------------------------------------ the second-order rule
def second_order(V, w, G, H, dd2, opts=()):
    """``V S V^H`` with ``S_ij = Σ_k f[w_i, w_k, w_j] (G̃_ik H̃_kj + H̃_ik G̃_kj)``, ``G̃ = V^H G V``,
    ``H̃ = V^H H V`` (``G``, ``H`` Hermitian): the second derivative ``D²f(A)[G, H]`` of the matrix
    function (:meth:`adjointgen.calculus.Derivation.second_order`).  ``T`` is evaluated in blocks of
    ``k`` of :data:`SECOND_ORDER_BLOCK` elements."""
    Vh = V.mH
    Gt, Ht = Vh @ G @ V, Vh @ H @ V
    n = w.shape[-1]
    batch = max(1, math.prod(w.shape[:-1]))
    step = max(1, SECOND_ORDER_BLOCK // max(1, batch * n * n))
    S = None
    for k0 in range(0, n, step):
        ks = slice(k0, min(n, k0 + step))
        T = dd2(w[..., :, None, None], w[..., None, ks, None], w[..., None, None, :], *opts).to(Gt.dtype)
        part = (torch.einsum("...ikj,...ik,...kj->...ij", T, Gt[..., :, ks], Ht[..., ks, :])
                + torch.einsum("...ikj,...ik,...kj->...ij", T, Ht[..., :, ks], Gt[..., ks, :]))
        S = part if S is None else S + part
    if S is None:
        S = torch.zeros_like(Gt)
    return V @ S @ Vh


def _sym(X):
    return 0.5 * (X + X.mH)


class _Bound:
    """A :class:`Spectral` with its option values and the directions of its derivatives (``general``:
    unstructured, the general-matrix function's; else Hermitian): one opaque argument of the
    autograd functions (a tuple would be flattened by the ``torch.func`` transforms, which then
    miscount tangents)."""

    __slots__ = ("spec", "opts", "general", "reverse")

    def __init__(self, spec, opts, general=False, reverse=False):
        self.spec, self.opts, self.general, self.reverse = spec, tuple(opts), bool(general), bool(reverse)

    def mode(self, reverse: bool) -> "_Bound":
        """This function's first derivative read forward (``Df(A)[G]``) or in reverse
        (``Df(A)^*[G] = Df(A^H)[G]``): the same value at Hermitian ``A``, but along unstructured
        directions their derivatives in ``A`` differ (``A^H`` moves along ``dA^H``)."""
        return self if reverse == self.reverse else _Bound(self.spec, self.opts, self.general, reverse)

    def part(self, X):
        """What the rules see of a direction ``X``: all of it (general), its Hermitian part otherwise."""
        return X if self.general else _sym(X)

    def adjoint(self, X):
        """The direction paired with ``X`` in the adjoint of the second-order rule:
        ``<K, D²f[G, H]> = <D²f[G^H, K], H>``."""
        return X.mH if self.general else X


def _to_front(x, dim, size):
    """``x`` with its vmapped dimension ``dim`` in front (broadcast when it has none)."""
    if dim is None:
        return x.expand(size, *x.shape)
    return x.movedim(dim, 0)


class _Funm(_function.Function):
    """``X, w, V = f(A)`` (``w``, ``V`` non-differentiable: the eigendecomposition the rules use)."""

    @staticmethod
    def forward(A, bound):
        spec, opts = bound.spec, bound.opts
        w, V = torch.linalg.eigh(A)
        w = spec.check_domain(w, opts)
        return _assemble(V, spec.f(w, opts)), w, V

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, ctx.bound = inputs
        _, w, V = output
        ctx.mark_non_differentiable(w, V)
        ctx.save_for_backward(A, w, V)
        ctx.save_for_forward(A, w, V)

    @staticmethod
    def backward(ctx, gX, _gw, _gV):
        A, w, V = ctx.saved_tensors
        if gX is None:
            return None, None
        if not torch.is_grad_enabled() and not _checks.is_traced(gX):  # no higher derivatives: the rule
            spec, opts = ctx.bound.spec, ctx.bound.opts
            return spec.apply_rule(w, V, gX, spec.checked_L(w, opts, A), ctx.bound.general), None
        return _Frechet.apply(A, gX, w, V, ctx.bound.mode(reverse=True)), None

    @staticmethod
    @_nested_forward
    def jvp(ctx, dA, *_):
        A, w, V = ctx.saved_tensors
        return _Frechet.apply(A, dA, w, V, ctx.bound.mode(reverse=False)), None, None

    @staticmethod
    def vmap(info, in_dims, A, bound):
        X, w, V = _Funm.apply(_to_front(A, in_dims[0], info.batch_size), bound)
        return (X, w, V), (0, 0, 0)


#: the function without ``jvp``, which ``torch.compile`` traces
_FunmCompiled = _Funm._for_compiler

class _Frechet(torch.autograd.Function):
    """``K = Df(A)[sym(G)] = V (L ∘ (V^H sym(G) V)) V^H`` (the derived rule; along unstructured ``G``
    for a general-matrix function); its derivatives are the second-order rule:
    ``dK = Df(A)[sym(dG)] + D²f(A)[sym(G), dA]``.  Read in reverse (``bound.reverse``, a VJP), ``K``
    is ``Df(A^H)[G]``, whose derivative along an unstructured ``dA`` is ``D²f(A)[G, dA^H]``."""

    @staticmethod
    def forward(A, G, w, V, bound):
        spec, opts = bound.spec, bound.opts
        return spec.apply_rule(w, V, G, spec.checked_L(w, opts, A), bound.general)

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, G, w, V, ctx.bound = inputs
        ctx.save_for_backward(A, G, w, V)
        ctx.save_for_forward(A, G, w, V)

    @staticmethod
    def backward(ctx, gK):
        A, G, w, V = ctx.saved_tensors
        b = ctx.bound
        gA = None
        if ctx.needs_input_grad[0]:  # <gK, D²f[G, dA]> = <D²f[G^H, gK], dA>; in reverse dA^H: D²f[G, gK^H]
            gA = (_Second.apply(A, G, b.adjoint(gK), w, V, b) if b.reverse
                  else _Second.apply(A, b.adjoint(G), gK, w, V, b))
        gG = _Frechet.apply(A, gK, w, V, b.mode(not b.reverse)) if ctx.needs_input_grad[1] else None
        return gA, gG, None, None, None

    @staticmethod
    @_nested_forward
    def jvp(ctx, dA, dG, *_):
        A, G, w, V = ctx.saved_tensors
        out = None
        if dG is not None:
            out = _Frechet.apply(A, dG, w, V, ctx.bound)
        if dA is not None:
            b = ctx.bound
            part = _Second.apply(A, G, b.adjoint(dA) if b.reverse else dA, w, V, b)
            out = part if out is None else out + part
        return out

    @staticmethod
    def vmap(info, in_dims, A, G, w, V, bound):
        n = info.batch_size
        args = [_to_front(t, d, n) for t, d in zip((A, G, w, V), in_dims[:4])]
        return _Frechet.apply(*args, bound), 0


class _Second(torch.autograd.Function):
    """``D²f(A)[sym(G), sym(H)]`` (unstructured ``G``, ``H`` for a general-matrix function): linear
    in ``G`` and ``H``; its derivative in ``A`` (a third derivative) is not implemented."""

    @staticmethod
    def forward(A, G, H, w, V, bound):
        spec, opts = bound.spec, bound.opts
        spec.check_smooth(w, opts, order=2, A=A)
        dtype = V.dtype
        return second_order(V, w, bound.part(G.to(dtype)), bound.part(H.to(dtype)), spec.dd2, opts)

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, G, H, w, V, ctx.bound = inputs
        ctx.save_for_backward(A, G, H, w, V)
        ctx.save_for_forward(A, G, H, w, V)

    @staticmethod
    def backward(ctx, gS):
        A, G, H, w, V = ctx.saved_tensors
        if ctx.needs_input_grad[0]:
            raise NotImplementedError(f"{ctx.bound.spec.name}: third derivatives are not implemented")
        b = ctx.bound
        gG = _Second.apply(A, gS, b.adjoint(H), w, V, b) if ctx.needs_input_grad[1] else None
        gH = _Second.apply(A, b.adjoint(G), gS, w, V, b) if ctx.needs_input_grad[2] else None
        return None, gG, gH, None, None, None

    @staticmethod
    @_nested_forward
    def jvp(ctx, dA, dG, dH, *_):
        A, G, H, w, V = ctx.saved_tensors
        if dA is not None:
            raise NotImplementedError(f"{ctx.bound.spec.name}: third derivatives are not implemented")
        out = None
        if dG is not None:
            out = _Second.apply(A, dG, H, w, V, ctx.bound)
        if dH is not None:
            part = _Second.apply(A, G, dH, w, V, ctx.bound)
            out = part if out is None else out + part
        return out

    @staticmethod
    def vmap(info, in_dims, A, G, H, w, V, bound):
        n = info.batch_size
        args = [_to_front(t, d, n) for t, d in zip((A, G, H, w, V), in_dims[:5])]
        return _Second.apply(*args, bound), 0


def apply(spec: Spectral, A, *opts, general: bool = False):
    """``spec``'s ``f(A)`` for Hermitian ``A`` (checked), differentiable to second order.  Options
    (``p`` of ``x**p``) are real numbers; integer values take the integer semantics (any sign of the
    eigenvalues) without any symbolic expansion.

    ``general``: ``f`` is the restriction of a general-matrix function (``exp``, ``log``, ``sqrt``
    of any square matrix) whose derivatives are wanted along every direction, not only Hermitian
    ones: the derivation's rules along unstructured tangents (``spec.frechet_general``)."""
    if general and spec.frechet_general is None:
        raise ValueError(f"{spec.name}: its derivation declares no rules along unstructured tangents "
                         "(Derivation.general_directions)")
    _checks.matrix_input(A, "A", square=True, symmetric=True, positive_definite=False, complex_ok=True)
    if len(opts) != len(spec.options):
        raise TypeError(f"{spec.name}: expected the options {', '.join(spec.options) or 'none'}, got {len(opts)} value(s)")
    for name, value in zip(spec.options, opts):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{spec.name}: {name} must be a real number (int or float), not {type(value).__name__}")
        if not math.isfinite(value):
            raise ValueError(f"{spec.name}: {name} must be finite, not {value}")
    return _function.apply(_Funm, A, _Bound(spec, tuple(float(o) for o in opts), general), compiled=_FunmCompiled)[0]

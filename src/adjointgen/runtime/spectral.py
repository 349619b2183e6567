"""Matrix functions ``X = f(A) = V f(w) V^H`` of Hermitian ``A``: the autograd functions around the
pieces a derivation generic in ``f`` generates (``derivations/funm.py``).

For each concrete ``f`` the generator emits ``f`` elementwise, its divided differences ``f[a, b]``
(the Daleckii–Krein matrix ``L``) and ``f[a, b, c]``, each in a form that does not cancel
(:mod:`adjointgen.codegen.divided`), and the derivation's rules ``gA = V (L ∘ (V^H sym(gX) V)) V^H``
(reverse mode, and forward mode: the map is self-adjoint).  This module puts them together:

* :class:`Spectral` -- one concrete function: its generated pieces and its domain;
* the forward (``torch.linalg.eigh``, then ``V f(w) V^H``) with domain checks that name the
  offending eigenvalue;
* the first derivative ``K = Df(A)[G]`` as an autograd function of its own, whose backward and
  forward mode are the second-order rule (:func:`second_order`), so that ``torch.func.hessian``,
  ``gradgradcheck`` and forward-over-reverse work, also at exactly repeated eigenvalues (``L`` and
  ``T`` are continuous there; no eigenvector gauge enters);
* :func:`funm`: any SymPy expression, compiled here by rendering the same template the generator
  uses (cached per expression).

Third derivatives are not implemented and raise.
"""
from __future__ import annotations

import functools
import math

import torch

from . import checks as _checks
from . import domains as _domains

__all__ = ["Spectral", "apply", "funm", "second_order", "CATALOGUE_ALIASES"]

#: names ``funm`` accepts for the generated catalogue (``"exp"`` and ``"expm"`` alike)
CATALOGUE_ALIASES = {"exp": "expm", "log": "logm", "sqrt": "sqrtm"}
#: elements of T evaluated at once in the second-order contraction (memory ~ 30 such arrays)
SECOND_ORDER_BLOCK = 1 << 21


class Spectral:
    """One concrete spectral function ``f``.

    Args:
        name: the public name (``expm``).
        expr: ``f`` as text, for messages (``exp(x)``).
        f, dd, dd2: the generated elementwise ``f(x, *options)``, ``f[a, b]`` and ``f[a, b, c]``.
        frechet: the derivation's rule ``(w, V, G, L) -> V (L ∘ (V^H sym(G) V)) V^H``.
        options: names of ``f``'s options (``("p",)`` for ``x**p``).
        domain, smooth: where ``f`` is continuous and where ``f'`` is, as
            ``((lo, hi, lo_open, hi_open), ...)``; ``None``: found by SymPy for the options given.
        sympy_expr: ``(expression, variable, option symbols)`` to find the domains by.
    """

    def __init__(self, name, expr, *, f, dd, dd2, frechet, options=(), domain=None, smooth=None, sympy_expr=None):
        self.name, self.expr = name, expr
        self.f, self.dd, self.dd2, self.frechet = f, dd, dd2, frechet
        self.options = tuple(options)
        self._domain, self._smooth = domain, smooth
        self.sympy_expr = sympy_expr

    def __repr__(self):
        return f"Spectral({self.name!r}, {self.expr!r})"

    def L(self, w, opts=()):
        """The Daleckii–Krein matrix ``L_ij = f[w_i, w_j]`` (``f'(w_i)`` on the diagonal)."""
        return self.dd(w.unsqueeze(-1), w.unsqueeze(-2), *opts)

    def intervals(self, opts=()):
        """(domain of ``f``, domain of ``f'``) for these option values."""
        if self._domain is not None:
            return self._domain, self._smooth
        return _domains.intervals_for(self.sympy_expr, tuple(float(o) for o in opts))

    # ------------------------------------------------------------------ domain checks
    def check_domain(self, w, opts=()):
        """``w``, with eigenvalues a rounding error outside a closed end of the domain moved onto
        it; a :class:`ValueError` naming the eigenvalue if one is outside otherwise."""
        domain, _ = self.intervals(opts)
        if w.numel() == 0 or domain == _domains.REALS or _inside_one(w, domain, finite=True):
            return w
        snapped = _domains.check_domain(self.name, self.expr, w.detach().cpu().numpy(), domain)
        return w if snapped is None else torch.as_tensor(snapped, device=w.device)

    def check_smooth(self, w, opts=()):
        """A :class:`ValueError` if ``f'`` is not finite at an eigenvalue (``sqrt`` at 0)."""
        _, smooth = self.intervals(opts)
        if w.numel() and smooth != _domains.REALS and not _inside_one(w, smooth, margin=True):
            _domains.check_smooth(self.name, self.expr, w.detach().cpu().numpy(), smooth)


def _inside_one(w, intervals, finite=False, margin=False) -> bool:
    """Every eigenvalue inside the first interval (and finite), by two reductions: the common case,
    decided without leaving the device; ``False`` sends the caller to the detailed check.  With
    ``margin``, an open end must be cleared by more than rounding (``8 n eps max|w|``)."""
    lo, hi, lo_open, hi_open = intervals[0]
    wmin, wmax = w.amin(), w.amax()
    tol = 8 * w.shape[-1] * torch.finfo(w.dtype).eps * torch.maximum(wmax.abs(), wmin.abs()) if margin else 0
    ok = ((wmin > lo + tol) if lo_open else (wmin >= lo)) & ((wmax < hi - tol) if hi_open else (wmax <= hi))
    if finite:
        ok = ok & torch.isfinite(wmax) & torch.isfinite(wmin)
    return bool(ok)


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
    """A :class:`Spectral` with its option values: one opaque argument of the autograd functions
    (a tuple would be flattened by the ``torch.func`` transforms, which then miscount tangents)."""

    __slots__ = ("spec", "opts")

    def __init__(self, spec, opts):
        self.spec, self.opts = spec, tuple(opts)


class _Funm(torch.autograd.Function):
    """``X, w, V = f(A)`` (``w``, ``V`` non-differentiable: the eigendecomposition the rules use)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(A, bound):
        spec, opts = bound.spec, bound.opts
        w, V = torch.linalg.eigh(A)
        w = spec.check_domain(w, opts)
        fw = spec.f(w, *opts).to(V.dtype)
        return (V * fw.unsqueeze(-2)) @ V.mH, w, V

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
        if not torch.is_grad_enabled():  # no higher derivatives asked for: the rule itself
            spec, opts = ctx.bound.spec, ctx.bound.opts
            spec.check_smooth(w, opts)
            return spec.frechet(w, V, gX.to(V.dtype) if V.is_complex() else gX, spec.L(w, opts)), None
        return _Frechet.apply(A, gX, w, V, ctx.bound), None

    @staticmethod
    def jvp(ctx, dA, *_):
        A, w, V = ctx.saved_tensors
        return _Frechet.apply(A, dA, w, V, ctx.bound), None, None


class _Frechet(torch.autograd.Function):
    """``K = Df(A)[sym(G)] = V (L ∘ (V^H sym(G) V)) V^H`` (the derived rule); its derivatives are the
    second-order rule: ``dK = Df(A)[sym(dG)] + D²f(A)[sym(G), dA]``."""

    generate_vmap_rule = True

    @staticmethod
    def forward(A, G, w, V, bound):
        spec, opts = bound.spec, bound.opts
        spec.check_smooth(w, opts)
        return spec.frechet(w, V, G.to(V.dtype) if not G.is_complex() and V.is_complex() else G, spec.L(w, opts))

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, G, w, V, ctx.bound = inputs
        ctx.save_for_backward(A, G, w, V)
        ctx.save_for_forward(A, G, w, V)

    @staticmethod
    def backward(ctx, gK):
        A, G, w, V = ctx.saved_tensors
        gA = _Second.apply(A, G, gK, w, V, ctx.bound) if ctx.needs_input_grad[0] else None
        gG = _Frechet.apply(A, gK, w, V, ctx.bound) if ctx.needs_input_grad[1] else None
        return gA, gG, None, None, None

    @staticmethod
    def jvp(ctx, dA, dG, *_):
        A, G, w, V = ctx.saved_tensors
        out = None
        if dG is not None:
            out = _Frechet.apply(A, dG, w, V, ctx.bound)
        if dA is not None:
            part = _Second.apply(A, G, dA, w, V, ctx.bound)
            out = part if out is None else out + part
        return out


class _Second(torch.autograd.Function):
    """``D²f(A)[sym(G), sym(H)]``: linear in ``G`` and ``H``; its derivative in ``A`` (a third
    derivative) is not implemented."""

    generate_vmap_rule = True

    @staticmethod
    def forward(A, G, H, w, V, bound):
        dtype = V.dtype
        return second_order(V, w, _sym(G.to(dtype)), _sym(H.to(dtype)), bound.spec.dd2, bound.opts)

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
        gG = _Second.apply(A, gS, H, w, V, ctx.bound) if ctx.needs_input_grad[1] else None
        gH = _Second.apply(A, G, gS, w, V, ctx.bound) if ctx.needs_input_grad[2] else None
        return None, gG, gH, None, None, None

    @staticmethod
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


def apply(spec: Spectral, A, *opts):
    """``spec``'s ``f(A)`` for Hermitian ``A`` (checked), differentiable to second order.

    With integer options (``powm(A, 2)``), ``f`` with them substituted is compiled on first use
    (:func:`funm`): its divided differences take the exact forms (``a + b`` for ``x**2``), valid for
    eigenvalues of either sign."""
    _checks.matrix_input(A, "A", square=True, symmetric=True, positive_definite=False, complex_ok=True)
    if len(opts) != len(spec.options):
        raise TypeError(f"{spec.name}: expected the options {', '.join(spec.options) or 'none'}, got {len(opts)} value(s)")
    for name, value in zip(spec.options, opts):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{spec.name}: {name} must be a real number (int or float), not {type(value).__name__}")
        if not math.isfinite(value):
            raise ValueError(f"{spec.name}: {name} must be finite, not {value}")
    opts = tuple(float(o) for o in opts)
    if opts and spec.sympy_expr is not None and all(o == round(o) for o in opts):
        spec, opts = _specialized(spec, tuple(int(o) for o in opts)), ()
    return _Funm.apply(A, _Bound(spec, opts))[0]


@functools.lru_cache(maxsize=64)
def _specialized(spec: Spectral, opts: tuple) -> Spectral:
    expr, var = _domains.parse(spec.sympy_expr, opts)
    compiled = _compile(expr, var)
    return Spectral(spec.name, f"{spec.expr} with {', '.join(f'{n} = {o}' for n, o in zip(spec.options, opts))}",
                    f=compiled.f, dd=compiled.dd, dd2=compiled.dd2, frechet=spec.frechet, domain=compiled._domain,
                    smooth=compiled._smooth)


# ------------------------------------------------------------------ any SymPy function
def funm(A, f):
    """``f(A) = V f(w) V^H`` for a symmetric (Hermitian) ``A`` and any scalar ``f``, differentiable to
    second order (reverse and forward mode, ``torch.func`` transforms), also at repeated
    eigenvalues.

    Args:
        A: symmetric (Hermitian) ``(..., n, n)`` matrices, float32/float64 (complex64/complex128).
        f: a SymPy expression in one symbol (``sympy.cos(x)``, ``x**3 - x``), or one of the generated
            functions' names: ``"expm"`` (or ``"exp"``), ``"logm"`` (``"log"``), ``"sqrtm"``
            (``"sqrt"``).  An expression is compiled on first use (the generator's own template and
            stable divided differences; cached); for one used in a hot loop, or that needs an option,
            generate it into a project instead (``adjointgen init``, a derivation that instantiates
            ``derivations/funm.py``'s ``f``).

    Raises:
        ValueError: ``A`` not a symmetric floating matrix, or an eigenvalue outside ``f``'s domain
            (named in the message); in a derivative, an eigenvalue where ``f'`` is not finite.
        TypeError: ``f`` is neither a name of the catalogue nor a SymPy expression in one symbol.
    """
    return apply(_spec_of(f), A)


def _spec_of(f) -> Spectral:
    if isinstance(f, str):
        from ..generated.torch import funm as generated

        name = CATALOGUE_ALIASES.get(f, f)
        spec = getattr(generated, "SPECTRAL", {}).get(name)
        if spec is None or spec.options:
            known = sorted(k for k, s in getattr(generated, "SPECTRAL", {}).items() if not s.options)
            raise TypeError(f"funm: unknown function name {f!r}; use one of {', '.join(known)} or a SymPy "
                            "expression (powm(A, p) takes its option)")
        return spec
    import sympy as sp

    try:
        expr = sp.sympify(f)
    except (sp.SympifyError, TypeError):
        raise TypeError(f"funm: f must be a SymPy expression in one symbol or a name, not {f!r}") from None
    if not isinstance(expr, sp.Expr) or len(expr.free_symbols) != 1:
        symbols = sorted(map(str, expr.free_symbols)) if isinstance(expr, sp.Expr) else "-"
        raise TypeError(f"funm: f must be an expression in exactly one symbol, not {expr!r} (symbols: {symbols})")
    (var,) = expr.free_symbols
    return _compile(expr, var)


_COMPILED: dict = {}


def _compile(expr, var) -> Spectral:
    """The :class:`Spectral` of ``expr`` (in ``var``), rendered from the generator's template."""
    import sympy as sp

    x = sp.Symbol("x", real=True)
    expr = sp.sympify(expr).xreplace({var: x})
    key = sp.srepr(expr)
    if key not in _COMPILED:
        from ..codegen.generate import render_instance
        from ..generated.torch import funm as generated

        ns = render_instance("torch", "funm_custom", expr, x)
        _COMPILED[key] = Spectral("funm", sp.sstr(expr), f=ns["funm_custom_f"], dd=ns["funm_custom_dd"],
                                  dd2=ns["funm_custom_dd2"], frechet=generated.FRECHET,
                                  domain=ns["FUNM_CUSTOM_DOMAIN"], smooth=ns["FUNM_CUSTOM_SMOOTH"],
                                  sympy_expr=(sp.sstr(expr), "x", ()))
    return _COMPILED[key]

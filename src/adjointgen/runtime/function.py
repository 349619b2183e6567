"""What every adjointgen autograd function shares with torch's autograd machinery.

- :func:`apply`: calling a generated function without ``torch.autograd.Function.apply``'s binding;
- :func:`nested_forward`: the decorator of every ``jvp`` staticmethod, so that forward mode over
  forward mode is exact (torch switches it off inside a custom function's ``jvp``);
- :func:`auxiliary`: the auxiliary outputs a rule reads, recomputed by the forward where the rule
  itself is differentiated;
- :func:`no_further_derivative`: a value that is right, on a path a further derivative (either
  mode) must not take: differentiating it raises.

``torch.autograd.Function.apply`` binds its arguments to ``forward``'s signature with
``inspect.signature`` on every call (to apply default arguments for ``setup_context``): about 30
microseconds per call on a 2-core CPU, a quarter of the fixed cost of a small ``cholesky``.  The
generated ``forward`` methods take their arguments positionally and have no defaults, so outside
the ``torch.func`` transforms and a compiler, :func:`apply` goes straight to the C++ ``apply`` (as
``torch.autograd.Function.apply`` itself does after binding).  Under a transform or a compiler,
with keyword arguments, and for a ``forward`` with defaults, it is ``cls.apply``.  The fixed cost
per call: ``python benchmarks/bench_factorizations.py`` (its last table).
"""
from __future__ import annotations

import inspect

import torch

try:
    from torch._C import _are_functorch_transforms_active as _transforms_active
    from torch._functorch.utils import unwrap_dead_wrappers as _unwrap_dead_wrappers
except ImportError:  # pragma: no cover - a torch without these: always cls.apply
    _transforms_active = None

#: autograd function class -> whether its forward binds to the arguments as given (no defaults)
_PLAIN: dict = {}


def _plain_signature(forward) -> bool:
    try:
        parameters = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):  # pragma: no cover
        return False
    return all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
               for p in parameters)


class Function(torch.autograd.Function):
    """The base of adjointgen's autograd functions: each subclass gets a twin for compilers
    (``_for_compiler``), the same function without its ``jvp``, which TorchDynamo cannot trace
    ("custom jvp"): under ``torch.compile`` (``fullgraph=True`` too) :func:`apply` calls the twin, so
    the forward and backward are traced into the graph; forward mode is not compiled."""

    #: the twin without ``jvp`` (``None``: this class, which has none of its own)
    _for_compiler = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _make_twin(cls)


@torch.compiler.disable  # (a module first imported inside a compiled function defines its classes there)
def _make_twin(cls) -> None:
    if cls.__dict__.get("_twin", False) or "jvp" not in cls.__dict__:
        return
    cls._for_compiler = type(cls.__name__ + "Compiled", (cls,), {
        "_twin": True, "jvp": staticmethod(torch.autograd.Function.jvp), "__module__": cls.__module__,
        "__qualname__": cls.__qualname__ + "Compiled"})


def apply(cls, *args, compiled=None):
    """``cls.apply(*args)`` for a ``torch.autograd.Function`` subclass ``cls`` with a
    ``setup_context``, without the per-call signature binding where it changes nothing; under a
    compiler, ``compiled``: the twin of a :class:`Function` without ``jvp`` (``cls._for_compiler``,
    handed over by the caller from a module global, which a compiler resolves to the class)."""
    if torch.compiler.is_compiling():
        return (cls if compiled is None else compiled).apply(*args)  # (a compiler traces apply itself)
    try:
        if _transforms_active is None or _transforms_active():
            return cls.apply(*args)
        plain = _PLAIN.get(cls)
        if plain is None:
            plain = _PLAIN[cls] = _plain_signature(cls.forward)
        if not plain:
            return cls.apply(*args)
        # what torch.autograd.Function.apply does outside the transforms, after binding
        return super(torch.autograd.Function, cls).apply(*_unwrap_dead_wrappers(args))
    except Exception:
        # a failure of the computation (LAPACK's, on a NaN) whose cause a deferred check recorded before
        # it: that check's error, with its own message, is the one to raise
        from .verdict import raise_deferred

        raise_deferred()
        raise


def _functorch():
    try:
        from torch._C import _functorch as ft
    except ImportError:  # pragma: no cover - a torch without functorch
        return None
    return ft


def _own_level(tensors) -> int | None:
    """The ``torch.func`` level the rule runs at: the outermost wrapper of the tensors it saved (the
    inputs as the function received them at that level), or ``None`` outside the transforms."""
    ft = _functorch()
    if ft is None:
        return None
    levels = [ft.maybe_get_level(t) for t in tensors
              if isinstance(t, torch.Tensor) and ft.is_functorch_wrapped_tensor(t)]
    return max(levels) if levels else None


def _tracked(t, own: int | None = None) -> bool:
    """Whether a derivative of a computation on ``t`` is being taken outside the rule that runs it:
    ``t`` requires grad while a graph is recorded (``create_graph=True``), carries a forward-AD
    tangent, or, under the ``torch.func`` transforms, a gradient-tracking level other than ``own``,
    the one the rule runs at (which computes the first derivative; ``vmap`` levels are not
    derivatives)."""
    if not isinstance(t, torch.Tensor):
        return False
    ft = _functorch()
    if ft is not None:
        while ft.is_functorch_wrapped_tensor(t):
            if ft.is_gradtrackingtensor(t) and ft.maybe_get_level(t) != own:
                return True
            t = ft.get_unwrapped(t)
    if torch.is_grad_enabled() and t.requires_grad:
        return True
    return torch.autograd.forward_ad.unpack_dual(t).tangent is not None


def auxiliary(op: str, forward, inputs: tuple, kwargs: dict, saved: tuple, index: tuple, names: tuple) -> tuple:
    """The auxiliary outputs (``names``, at positions ``index`` of ``forward``'s outputs) for the rules
    of ``op``: the ``saved`` values in a first derivative; recomputed by running ``forward`` again on
    the ``inputs`` where a derivative of the rules themselves is being taken (a second derivative,
    a ``torch.func`` transform over the rule), so that their derivative is the forward's own and the
    higher derivative is exact rather than one that treats them as constants."""
    own = _own_level(inputs)
    if not any(_tracked(t, own) for t in inputs):
        return saved
    what = ", ".join(names)
    try:
        outputs = forward(*inputs, **kwargs)
    except Exception as exc:  # e.g. a NumPy round trip on a tensor that requires grad
        raise RuntimeError(
            f"{op}: a derivative of its rules needs the derivative of the auxiliary output(s) {what}, which the "
            f"rules read: running the forward again to differentiate them failed ({type(exc).__name__}: {exc}). "
            f"Make the declared torch forward differentiable (torch operations), or declare {what} hidden=True with "
            f"rules of their own") from exc
    outputs = tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,)
    values = tuple(outputs[i] for i in index)
    lost = [name for name, v in zip(names, values) if not _tracked(v, own)]
    if lost:
        raise RuntimeError(
            f"{op}: a derivative of its rules needs the derivative of the auxiliary output(s) {', '.join(lost)}, which "
            f"the rules read, but the declared torch forward returns them not differentiable (computed outside "
            f"torch's autograd, or detached). Make the forward differentiable (torch operations), or declare them "
            f"hidden=True with rules of their own")
    return values


def nested_forward(jvp):
    """Decorate an autograd function's ``jvp`` staticmethod so that forward mode over forward mode
    (``torch.func.jvp`` of ``torch.func.jvp``, ``jacfwd(jacfwd(f))``) is exact.

    torch runs a custom function's ``jvp`` with forward-mode AD switched off at every level, so the
    outer ``jvp`` level does not see the inner ``jvp``'s computation and its second-order terms are
    silently dropped (pytorch/pytorch#197867: ``x**4`` through a custom ``Square`` gives ``[108, 0,
    0]`` for its first three derivatives).  Under the ``torch.func`` transforms this switches it back on
    around the rule, which is made of differentiable torch operations; the outer levels then
    differentiate it as they differentiate any torch code.  Outside the transforms (one
    ``torch.autograd.forward_ad`` level, which cannot nest) nothing changes."""
    import functools

    @functools.wraps(jvp)
    def wrapper(ctx, *tangents):
        if (_transforms_active is not None and _transforms_active() and not torch._C._is_fwd_grad_enabled()
                and _outer_forward_level(ctx.saved_tensors)):
            from torch.autograd.forward_ad import _set_fwd_grad_enabled

            with _set_fwd_grad_enabled(True):
                # the saved values without this level's own tangent (the rule computes that
                # tangent): only the outer levels' tangents flow through the rule
                return jvp(_PrimalContext(ctx), *(_primal(t) for t in tangents))
        return jvp(ctx, *tangents)

    return wrapper


def _outer_forward_level(saved) -> bool:
    """Whether a ``torch.func`` forward-mode level other than the one running the rule (the level
    of the tensors it saved) is active: then forward mode is nested."""
    own = _own_level(saved)
    if own is None:
        return False
    try:
        from torch._C._functorch import TransformType
        from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters
    except ImportError:  # pragma: no cover - another torch: assume nesting (the exact path)
        return True
    return any(i.key() == TransformType.Jvp and i.level() < own for i in retrieve_all_functorch_interpreters())


def _primal(t):
    """``t`` without the current forward level's tangent (through ``vmap`` levels, which have no
    batching rule for it)."""
    if not isinstance(t, torch.Tensor):
        return t
    ft = _functorch()
    if ft is not None and ft.is_batchedtensor(t):
        level = ft.maybe_get_level(t)
        inner, bdim = ft._unwrap_batched(t, level)
        return ft._add_batch_dim(_primal(inner), bdim, level)
    return torch.autograd.forward_ad.unpack_dual(t).primal


class _PrimalContext:
    """An autograd function's context whose saved tensors come without the current forward level's
    tangent (for :func:`nested_forward`); every other attribute is the context's own."""

    __slots__ = ("_ctx",)

    def __init__(self, ctx):
        object.__setattr__(self, "_ctx", ctx)

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def __setattr__(self, name, value):
        setattr(self._ctx, name, value)

    @property
    def saved_tensors(self):
        return tuple(_primal(t) for t in self._ctx.saved_tensors)


class _Raising:
    """An exception class and its message, opaque to the transforms."""

    __slots__ = ("error", "message")

    def __init__(self, error, message):
        self.error, self.message = error, message


class _NoFurtherDerivative(torch.autograd.Function):
    """The identity, whose derivative (either mode) raises the exception it carries."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, raising):
        return x.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.raising = inputs[1]

    @staticmethod
    def backward(ctx, g):
        raise ctx.raising.error(ctx.raising.message)

    @staticmethod
    @nested_forward
    def jvp(ctx, dx, _):
        raise ctx.raising.error(ctx.raising.message)


def no_further_derivative(x: torch.Tensor, error: type, message: str) -> torch.Tensor:
    """``x`` (a copy), whose derivative raises ``error(message)`` when one is taken -- by
    ``torch.autograd``, a ``torch.func`` transform, forward or reverse mode -- and not before."""
    return _NoFurtherDerivative.apply(x, _Raising(error, message))

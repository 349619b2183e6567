"""Calling the generated autograd functions without ``torch.autograd.Function.apply``'s binding.

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


def apply(cls, *args):
    """``cls.apply(*args)`` for a ``torch.autograd.Function`` subclass ``cls`` with a
    ``setup_context``, without the per-call signature binding where it changes nothing."""
    if torch.compiler.is_compiling() or _transforms_active is None or _transforms_active():
        return cls.apply(*args)  # (a compiler traces cls.apply itself)
    plain = _PLAIN.get(cls)
    if plain is None:
        plain = _PLAIN[cls] = _plain_signature(cls.forward)
    if not plain:
        return cls.apply(*args)
    # what torch.autograd.Function.apply does outside the transforms, after binding
    return super(torch.autograd.Function, cls).apply(*_unwrap_dead_wrappers(args))

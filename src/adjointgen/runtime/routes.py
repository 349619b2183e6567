"""Which route a public function took: a recorder for the route audit.

A public function often has several routes to its result -- a Hermitian shortcut, a square variant
of the rules, full or thin factors, a values-only routine where no derivative follows, a cheaper
factorization where it is safe.  Each is a branch written by hand, and each must give the general
function's value and derivatives.  Every such branch calls :func:`taken` with the caller's name and
the route's; ``tests/test_routes.py`` lists every route of every function, drives each with the
inputs that trigger it (exactly symmetric, orthogonal, zero, identity, rank deficient; traced by
``vmap`` or a compiler) and checks it against the general function along unstructured tangents.  A
route that calls :func:`taken` with a name the list does not have fails that test, and so does a
``taken`` call in the source that the list does not name.

Outside :func:`recording` a call costs one context-variable read.
"""
from __future__ import annotations

import contextlib
import contextvars

__all__ = ["recording", "taken"]

_LOG: contextvars.ContextVar[list | None] = contextvars.ContextVar("adjointgen_routes", default=None)


def taken(function: str, route: str) -> None:
    """Record that ``function`` took ``route`` (inside :func:`recording`; otherwise nothing)."""
    import torch

    if torch.compiler.is_compiling():  # (a compiler traces no context variable; the log is eager-only)
        return
    log = _LOG.get()
    if log is not None:
        log.append((function, route))


@contextlib.contextmanager
def recording():
    """``with recording() as log:`` -- ``log`` collects ``(function, route)`` pairs in call order."""
    log: list = []
    token = _LOG.set(log)
    try:
        yield log
    finally:
        _LOG.reset(token)

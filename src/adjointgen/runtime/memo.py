"""The runtime's memo tables (tolerances per dtype, fixed rotations, accepted argument signatures):
filled by plain calls only.  Under ``torch.compile`` a table is read but never written: TorchDynamo
refuses a write to a module-level dict inside an autograd function (a graph break, an error under
``fullgraph=True``), and a program whose first call is compiled would otherwise fail there."""
from __future__ import annotations

import torch

__all__ = ["clear", "store", "table"]

_TABLES: list[dict] = []


def table() -> dict:
    """A new memo table (registered, so that :func:`clear` empties it)."""
    found: dict = {}
    _TABLES.append(found)
    return found


def store(memo: dict, key, value, limit: int | None = None):
    """``value``, remembered under ``key`` unless a compiler is tracing (then only returned).  With
    ``limit``, a full table is emptied first."""
    if not torch.compiler.is_compiling():
        if limit is not None and len(memo) >= limit:
            memo.clear()
        memo[key] = value
    return value


def clear() -> None:
    """Empty every memo table: the next call computes afresh, as a process's first call does."""
    for memo in _TABLES:
        memo.clear()

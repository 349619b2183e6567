"""Verdicts of the checks that read values: raised at once, or recorded on the device and raised later.

A check that needs values (a NaN in the input, a non-symmetric matrix, a zero pivot, a loss that
depends on a gauge) computes its verdict as a tensor of booleans on the data's device and hands it
to :func:`verdict` with a function that builds the error.  What happens then is the check mode's
choice:

``"eager"``
    The verdict is read on the host at once (one read per check) and the error raised from the call
    that found it: the behaviour of a CPU tensor by default.
``"deferred"``
    Nothing is read.  The verdict stays on the device, recorded with its error, and
    :func:`raise_deferred` raises the first recorded error (one read per device for all of them);
    the host decisions that only choose a faster path (no cluster, so no mask) take the path that
    needs no decision.  On a GPU a read is a synchronisation, which this avoids: the default of a
    tensor that is not on the CPU.
``"auto"`` (the default)
    Eager on the CPU, deferred elsewhere.

``with checking("deferred"): ...`` (or :func:`set_mode`) chooses one for a block.  Call
:func:`raise_deferred` where the program synchronises anyway (reading the loss for a log line):
until then a result computed from an invalid input is not defined.  At most ``_MAX`` verdicts are
kept with their errors; later ones are folded into one flag whose error says so.
"""
from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # (imported by the library-free gauge module, which the JAX side reads too)
    import torch

__all__ = ["checking", "deferred", "mode", "nonzero", "pending", "raise_deferred", "set_mode", "verdict"]

MODES = ("auto", "eager", "deferred")
_MODE = "auto"
#: verdicts kept with their errors until :func:`raise_deferred`
_MAX = 64


class _Pending(threading.local):
    def __init__(self):
        self.entries: list = []
        self.overflow = None


_PENDING = _Pending()


def mode() -> str:
    """The check mode in use: ``"auto"``, ``"eager"`` or ``"deferred"``."""
    return _MODE


def set_mode(new: str) -> None:
    """Choose the check mode for the process (see the module's documentation)."""
    global _MODE
    if new not in MODES:
        raise ValueError(f"check mode must be one of {', '.join(MODES)}, got {new!r}")
    _MODE = new


@contextlib.contextmanager
def checking(new: str):
    """``with checking("deferred"): loss.backward()`` -- a check mode for the block."""
    previous = _MODE
    set_mode(new)
    try:
        yield
    finally:
        set_mode(previous)


def deferred(x: torch.Tensor | None = None) -> bool:
    """Whether the checks of values on ``x``'s device are deferred (no host read)."""
    if _MODE != "auto":
        return _MODE == "deferred"
    return x is not None and not x.is_cpu and not x.is_meta


def verdict(bad: torch.Tensor, error: Callable[[], Exception]) -> None:
    """``bad`` (booleans, any shape; true where the check fails): raise ``error()`` if any is true,
    now (eager) or at :func:`raise_deferred` (deferred).  ``error`` may read values on the host: it
    runs only for a failed check."""
    if not deferred(bad):
        if bool(bad.any()):
            raise error()
        return
    flag = bad.detach().any()
    state = _PENDING
    if len(state.entries) < _MAX:
        state.entries.append((flag, error))
    else:
        state.overflow = flag if state.overflow is None else state.overflow | flag.to(state.overflow.device)


def nonzero(info: torch.Tensor, error: Callable[[], Exception]) -> None:
    """:func:`verdict` of ``info != 0`` (a LAPACK status per matrix, any shape): eager on a CPU tensor
    of a few entries, read as a list (the comparison and the reduction cost more than the read)."""
    if info.is_cpu and info.numel() <= 256 and not deferred(info) and type(info).__name__ == "Tensor":
        values = info.tolist()
        for _ in range(info.dim() - 1):
            values = [v for row in values for v in row]
        if any(values) if info.dim() else values:
            raise error()
        return
    verdict(info != 0, error)


def pending() -> int:
    """How many verdicts are recorded and not yet read."""
    return len(_PENDING.entries) + (_PENDING.overflow is not None)


def raise_deferred() -> None:
    """Read the recorded verdicts (one transfer per device) and raise the first failed check's error;
    the record is cleared either way."""
    state = _PENDING
    entries, overflow = state.entries, state.overflow
    state.entries, state.overflow = [], None
    if not entries and overflow is None:
        return
    flags = [f for f, _ in entries] + ([overflow] if overflow is not None else [])
    by_device: dict = {}
    for i, f in enumerate(flags):
        by_device.setdefault(f.device, []).append(i)
    import torch

    failed = [False] * len(flags)
    for indices in by_device.values():
        for i, value in zip(indices, torch.stack([flags[i] for i in indices]).tolist()):
            failed[i] = bool(value)
    for (flag, error), bad in zip(entries, failed):
        if bad:
            raise error()
    if overflow is not None and failed[-1]:
        raise RuntimeError(f"a deferred adjointgen check failed after the first {_MAX} recorded ones (whose errors "
                           "are kept): call raise_deferred() more often, or rerun under checking('eager') to see it")

"""Timing helpers shared by the benchmark scripts (median of repeats after a warm-up)."""
import statistics
import time

import torch


def median_time(fn, *, repeats=7, warmup=2, sync=None):
    for _ in range(warmup):
        fn()
        if sync:
            sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def table(rows, headers):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(str(h).rjust(w) for h, w in zip(headers, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


def backward_time(fn, inputs, grad, *, repeats=7, warmup=2, sync=None):
    """Median time of the backward alone: each repeat builds the forward graph of ``fn(*inputs)``
    untimed, then times ``torch.autograd.grad`` with the cotangents ``grad``."""
    times = []
    for i in range(warmup + repeats):
        xs = [x.detach().requires_grad_() for x in inputs]
        out = fn(*xs)
        out = out if isinstance(out, tuple) else (out,)
        if sync:
            sync()
        t0 = time.perf_counter()
        torch.autograd.grad(out, xs, grad)
        if sync:
            sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)

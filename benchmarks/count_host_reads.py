"""Host reads and fixed cost per call of the dense operations against torch.linalg (issue 45).

For each operation, a forward + backward at n = 5 (float64, CPU) counts the reads of device values
on the host: ``aten._local_scalar_dense`` (``item``, ``bool``, ``float``) through a dispatch mode, and
calls of ``Tensor.tolist``, ``Tensor.numpy`` and ``Tensor.cpu``.  On a GPU each is a synchronisation.
Then the time of a forward + backward at n = 4 on one thread (the fixed cost: minimum of 5 runs of
2000 calls), ours over torch's.

    python benchmarks/count_host_reads.py
"""
from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import table  # noqa: E402

import adjointgen.torch as agt  # noqa: E402


class _Scalars(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.n += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def counting():
    counts = {"tolist": 0, "numpy": 0, "cpu": 0}
    saved = {name: getattr(torch.Tensor, name) for name in counts}
    for name, orig in saved.items():
        def wrapped(self, *a, _orig=orig, _name=name, **k):
            counts[_name] += 1
            return _orig(self, *a, **k)
        setattr(torch.Tensor, name, wrapped)
    mode = _Scalars()
    try:
        with mode:
            yield counts
    finally:
        for name, orig in saved.items():
            setattr(torch.Tensor, name, orig)
        counts["scalar"] = mode.n


def _cases(n):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, n, dtype=torch.float64, generator=g)
    S = X @ X.mT + n * torch.eye(n, dtype=torch.float64)
    return {
        "eigh": (lambda f: f.eigh, S, lambda o: o[0].sum() + (o[1] ** 2).sum()),
        "svd": (lambda f: (lambda a: f.svd(a, full_matrices=False)), X, lambda o: o[1].sum()),
        "cholesky": (lambda f: f.cholesky, S, lambda o: o.sum()),
        "qr": (lambda f: f.qr, X, lambda o: o[0].sum() + o[1].sum()),
        "inv": (lambda f: f.inv, S, lambda o: o.sum()),
        "solve": (lambda f: (lambda a: f.solve(a, a[:, :2])), S, lambda o: o.sum()),
        "det": (lambda f: f.det, S, lambda o: o),
        "slogdet": (lambda f: f.slogdet, S, lambda o: o[1]),
        "lu": (lambda f: f.lu, X, lambda o: o[1].sum() + o[2].sum()),
        "matrix_exp": (lambda f: f.matrix_exp, X, lambda o: o.sum()),
    }


def _step(fn, A, loss):
    A = A.clone().requires_grad_()
    loss(fn(A)).backward()


def _time(fn, A, loss, calls=2000):
    for _ in range(200):
        _step(fn, A, loss)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            _step(fn, A, loss)
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def main():
    torch.set_num_threads(1)
    rows = []
    reads = _cases(5)
    for name, (get, A, loss) in _cases(4).items():
        counted = []
        for ns in (torch.linalg, agt):
            getr, Ar, lossr = reads[name]
            _step(getr(ns), Ar, lossr)  # warm
            with counting() as c:
                _step(getr(ns), Ar, lossr)
            counted.append(c)
        t_torch, t_ours = _time(get(torch.linalg), A, loss), _time(get(agt), A, loss)
        ours = counted[1]
        rows.append((name, sum(counted[0].values()), sum(ours.values()),
                     ", ".join(f"{k} {v}" for k, v in ours.items() if v), f"{t_torch * 1e6:.0f}",
                     f"{t_ours * 1e6:.0f}", f"{t_ours / t_torch:.2f}"))
    print(table(rows, ("op", "torch reads", "our reads", "ours by kind", "torch us", "ours us", "ours / torch")))


if __name__ == "__main__":
    main()

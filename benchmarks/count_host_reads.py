"""Host reads and fixed cost per call of the dense operations against torch.linalg.

For each operation, a forward + backward at n = 5 (float64, CPU) counts the reads of device values
on the host with the suite's counter (tests/host_reads.py: ``aten._local_scalar_dense`` through a
dispatch mode, ``Tensor.tolist``, ``Tensor.numpy``, ``Tensor.cpu``), for torch and for adjointgen
with its checks eager (a CPU tensor's default) and deferred (a GPU tensor's: no read, see
adjointgen.runtime.verdict).  On a GPU each read is a synchronisation.  Then the time of a forward +
backward at n = 4 on one thread (the fixed cost: minimum of 5 runs of 2000 calls), ours over torch's,
with the ATen operations each dispatches (the work issued, a count that does not depend on the clock),
and the floor: cholesky's derived rule in a bare Python ``autograd.Function`` (no checks, no dispatch).

    python benchmarks/count_host_reads.py
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _timing import table  # noqa: E402
from host_reads import cases as _cases, counting, step  # noqa: E402  (the suite's counter)

import adjointgen.torch as agt  # noqa: E402
from adjointgen.runtime import verdict  # noqa: E402


def _step(fn, A, loss):
    step(fn, A, loss)


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


class _CountOps:
    """The ATen operations a forward + backward dispatches (a deterministic measure of the work
    issued, next to the noisy clock): ours and torch's."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counter.n += 1
                return func(*args, **(kwargs or {}))

        self.n, self.mode = 0, Mode()

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def _aten_ops(fn, A, loss) -> int:
    with _CountOps() as c:
        _step(fn, A, loss)
    return c.n


def _bare_cholesky():
    """``cholesky`` with its derived VJP in a bare ``torch.autograd.Function`` (no checks, no
    dispatch, no forward mode): the floor of any Python autograd function running the same rule."""
    from adjointgen.generated.torch.cholesky import cholesky_vjp

    class Bare(torch.autograd.Function):
        @staticmethod
        def forward(A):
            return torch.linalg.cholesky_ex(A)[0]

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(output)

        @staticmethod
        def backward(ctx, gL):
            return cholesky_vjp(ctx.saved_tensors[0], gL)

    return super(torch.autograd.Function, Bare).apply  # (Function.apply without the signature binding)


def main(argv=None):
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="fewer calls per timing (a smoke run)")
    args = p.parse_args(argv)
    calls = 200 if args.quick else 2000
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows, results = [], []
    reads = _cases(5)
    try:
        for name, (get, A, loss) in _cases(4).items():
            counted = []
            for ns, mode in ((torch.linalg, "auto"), (agt, "eager"), (agt, "deferred")):
                getr, Ar, lossr = reads[name]
                with verdict.checking(mode):
                    _step(getr(ns), Ar, lossr)  # warm
                    with counting() as c:
                        _step(getr(ns), Ar, lossr)
                counted.append(sum(c.values()))
            t_torch = _time(get(torch.linalg), A, loss, calls)
            t_eager = _time(get(agt), A, loss, calls)
            with verdict.checking("deferred"):
                t_deferred = _time(get(agt), A, loss, calls)
            verdict.raise_deferred()
            ops = [_aten_ops(get(ns), A, loss) for ns in (torch.linalg, agt)]
            rows.append((name, *counted, *ops, f"{t_torch * 1e6:.0f}", f"{t_eager * 1e6:.0f}",
                         f"{t_deferred * 1e6:.0f}", f"{t_eager / t_torch:.2f}", f"{t_deferred / t_torch:.2f}"))
            results.append({"benchmark": "host reads", "case": f"{name}: reads per fwd+bwd, deferred checks, minus torch's",
                            "value": counted[2] - counted[0], "format": "d", "target": "<= 0"})
            results.append({"benchmark": "fixed cost", "case": f"{name}: fwd+bwd at n = 4, one thread, eager checks",
                            "ratio": t_eager / t_torch, "anchor": "torch.linalg", "target": "<= 1.5"})
        get, A, loss = _cases(4)["cholesky"]
        t_torch, t_bare = _time(get(torch.linalg), A, loss, calls), _time(_bare_cholesky(), A, loss, calls)
        floor = ("cholesky, the derived rule in a bare autograd.Function", "", "", "", "", "",
                 f"{t_torch * 1e6:.0f}", f"{t_bare * 1e6:.0f}", "", f"{t_bare / t_torch:.2f}", "")
        rows.append(floor)
        results.append({"benchmark": "fixed cost", "case": "cholesky: derived rule in a bare autograd.Function "
                        "(no checks, no dispatch): the floor of a Python autograd function", "ratio": t_bare / t_torch,
                        "anchor": "torch.linalg", "target": "(information)"})
    finally:
        torch.set_num_threads(threads)
    print(table(rows, ("op", "torch reads", "eager reads", "deferred reads", "torch aten ops", "our aten ops",
                       "torch us", "eager us", "deferred us", "eager / torch", "deferred / torch")))
    return results


if __name__ == "__main__":
    main()

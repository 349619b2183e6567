"""Host reads and fixed cost per call of the dense operations against torch.linalg.

For each operation, a forward + backward at n = 5 (float64, CPU) counts the reads of device values
on the host with the suite's counter (tests/host_reads.py: ``aten._local_scalar_dense`` through a
dispatch mode, ``Tensor.tolist``, ``Tensor.numpy``, ``Tensor.cpu``), for torch and for adjointgen
with its checks eager (a CPU tensor's default) and deferred (a GPU tensor's: no read, see
adjointgen.runtime.verdict).  On a GPU each read is a synchronisation.  Then the time of a forward +
backward at n = 4 on one thread (the fixed cost: minimum of 5 runs of 2000 calls), ours over torch's.

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
            rows.append((name, *counted, f"{t_torch * 1e6:.0f}", f"{t_eager * 1e6:.0f}", f"{t_deferred * 1e6:.0f}",
                         f"{t_eager / t_torch:.2f}", f"{t_deferred / t_torch:.2f}"))
            results.append({"benchmark": "host reads", "case": f"{name}: reads per fwd+bwd, deferred checks, minus torch's",
                            "value": counted[2] - counted[0], "format": "d", "target": "<= 0"})
            results.append({"benchmark": "fixed cost", "case": f"{name}: fwd+bwd at n = 4, one thread, eager checks",
                            "ratio": t_eager / t_torch, "anchor": "torch.linalg", "target": "<= 1.5"})
    finally:
        torch.set_num_threads(threads)
    print(table(rows, ("op", "torch reads", "eager reads", "deferred reads", "torch us", "eager us", "deferred us",
                       "eager / torch", "deferred / torch")))
    return results


if __name__ == "__main__":
    main()

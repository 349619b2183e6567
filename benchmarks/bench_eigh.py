"""Generated eigh backward vs torch.linalg.eigh's built-in backward, and generation time.

    python benchmarks/bench_eigh.py [--quick] [--device cuda]

Prints, for each size and dtype, the median time of one backward pass (the forward is shared and
not timed) and the ratio generated / built-in (below 1.0 means faster), then the time of
`adjointgen generate --check` for the whole catalogue.
"""
import argparse
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _timing import median_time, table  # noqa: E402

import adjointgen.torch as agt  # noqa: E402


def backward_time(eig, A, gw, gV, sync):
    A = A.detach().requires_grad_()
    w, V = eig(A)
    return median_time(lambda: torch.autograd.grad((w, V), A, (gw, gV), retain_graph=True), sync=sync)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    sizes = [128, 256] if args.quick else [256, 512, 1024]
    if args.device == "cuda":
        sizes = [1024, 2048, 4096]
    sync = torch.cuda.synchronize if args.device == "cuda" else None
    rows = []
    for dtype in (torch.float64, torch.float32):
        for n in sizes:
            g = torch.Generator().manual_seed(n)
            X = torch.randn(n, n, dtype=dtype, generator=g)
            A = ((X + X.mT) / 2).to(args.device)
            gw = torch.randn(n, dtype=dtype, generator=g).to(args.device)
            gV = torch.randn(n, n, dtype=dtype, generator=g).to(args.device)
            t_gen = backward_time(agt.eigh, A, gw, gV, sync)
            t_ref = backward_time(torch.linalg.eigh, A, gw, gV, sync)
            rows.append((str(dtype).replace("torch.", ""), n, f"{t_gen * 1e3:.2f}", f"{t_ref * 1e3:.2f}", f"{t_gen / t_ref:.2f}"))
    print(f"eigh backward on {args.device} ({torch.get_num_threads()} threads), median ms")
    print(table(rows, ["dtype", "n", "adjointgen", "torch", "ratio"]))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "adjointgen", "--root", root, "generate", "--check"], capture_output=True, text=True)
    dt = time.perf_counter() - t0
    print(f"\nadjointgen generate --check (audit + render of the whole catalogue): {dt:.1f} s (exit {r.returncode})")


if __name__ == "__main__":
    main()

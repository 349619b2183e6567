"""Generated thin-SVD backward vs torch.linalg.svd's built-in backward (ratios in one run).

    python benchmarks/bench_svd.py [--quick] [--device cuda]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _timing import median_time, table  # noqa: E402

import adjointgen.torch as agt  # noqa: E402


def backward_time(svd, A, grads, sync):
    A = A.detach().requires_grad_()
    outs = svd(A)
    return median_time(lambda: torch.autograd.grad(outs, A, grads, retain_graph=True), sync=sync)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    shapes = [(256, 128)] if args.quick else [(512, 256), (1024, 512)]
    if args.device == "cuda":
        shapes = [(4096, 2048)]
    sync = torch.cuda.synchronize if args.device == "cuda" else None
    rows = []
    for dtype in (torch.float64, torch.float32):
        for m, n in shapes:
            g = torch.Generator().manual_seed(m)
            A = torch.randn(m, n, dtype=dtype, generator=g).to(args.device)
            grads = (torch.randn(m, n, dtype=dtype, generator=g).to(args.device),
                     torch.randn(n, dtype=dtype, generator=g).to(args.device),
                     torch.randn(n, n, dtype=dtype, generator=g).to(args.device))
            t_gen = backward_time(agt.svd, A, grads, sync)
            t_ref = backward_time(lambda a: torch.linalg.svd(a, full_matrices=False), A, grads, sync)
            rows.append((str(dtype).replace("torch.", ""), f"{m}x{n}", f"{t_gen * 1e3:.1f}", f"{t_ref * 1e3:.1f}",
                         f"{t_gen / t_ref:.2f}"))
    print(f"thin SVD backward on {args.device} ({torch.get_num_threads()} threads), median ms")
    print(table(rows, ["dtype", "shape", "adjointgen", "torch", "ratio"]))


if __name__ == "__main__":
    main()

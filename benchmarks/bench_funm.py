"""Forward + backward of the matrix functions against their torch anchors (issue 11).

* ``expm``: ``agt.expm`` against ``torch.linalg.matrix_exp`` on symmetric float64 matrices,
  ``n = 128, 512, 1024``: ``ratio = ours / torch`` (< 1: we are faster).
* ``sqrtm``: ``agt.sqrtm`` against the square root composed from ``torch.linalg.eigh`` under torch
  autograd (``V diag(sqrt(w)) V^T``): ratio, and whether each gradient is finite on a matrix with a
  repeated eigenvalue (torch's eigh backward divides by the zero gap there).

Times are medians of repeats after a warm-up, both sides timed in the same run.

    python benchmarks/bench_funm.py            # n = 128, 512, 1024
    python benchmarks/bench_funm.py --quick    # n = 64, 128 (~2 s)
    python benchmarks/bench_funm.py --device cuda
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import median_time, table  # noqa: E402

import adjointgen.torch as agt  # noqa: E402


def spd(n, device, repeated=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64, generator=g))
    w = torch.linspace(0.5, 3.0, n, dtype=torch.float64)
    if repeated:
        w[: n // 4] = 1.0
    A = (Q * w) @ Q.mT
    return ((A + A.mT) / 2).to(device)


def eigh_sqrtm(A):
    w, V = torch.linalg.eigh(A)
    return (V * w.sqrt().unsqueeze(-2)) @ V.mT


def fwd_bwd(fn, A, G):
    def run():
        X = A.detach().requires_grad_()
        (g,) = torch.autograd.grad(fn(X), X, G)
        return g
    return run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    sizes = (64, 128) if args.quick else (128, 512, 1024)
    repeats = 3 if args.quick else args.repeats
    rows, results = [], []
    for n in sizes:
        A = spd(n, device)
        G = torch.randn(n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(device)
        ours = median_time(fwd_bwd(agt.expm, A, G), repeats=repeats, sync=sync)
        anchor = median_time(fwd_bwd(torch.linalg.matrix_exp, A, G), repeats=repeats, sync=sync)
        rows.append(("expm", n, f"{ours * 1e3:.1f}", f"{anchor * 1e3:.1f}", f"{ours / anchor:.2f}", "", ""))
        results.append({"benchmark": "funm", "case": f"expm fwd+bwd n={n}", "ratio": ours / anchor,
                        "anchor": "torch.linalg.matrix_exp", "target": "<= 1.0"})
        ours = median_time(fwd_bwd(agt.sqrtm, A, G), repeats=repeats, sync=sync)
        anchor = median_time(fwd_bwd(eigh_sqrtm, A, G), repeats=repeats, sync=sync)
        R = spd(n, device, repeated=True)
        finite_ours = bool(torch.isfinite(fwd_bwd(agt.sqrtm, R, G)()).all())
        finite_torch = bool(torch.isfinite(fwd_bwd(eigh_sqrtm, R, G)()).all())
        rows.append(("sqrtm", n, f"{ours * 1e3:.1f}", f"{anchor * 1e3:.1f}", f"{ours / anchor:.2f}",
                     finite_ours, finite_torch))
        results.append({"benchmark": "funm", "case": f"sqrtm fwd+bwd n={n} (finite at a repeated eigenvalue: "
                                                     f"ours {finite_ours}, torch {finite_torch})",
                        "ratio": ours / anchor, "anchor": "eigh-composed sqrtm", "target": "<= 1.0"})
    print(f"forward + backward, float64, {device}; anchor: torch.linalg.matrix_exp (expm), eigh-composed sqrtm")
    print(table(rows, ("op", "n", "ours ms", "anchor ms", "ours/anchor", "finite (repeated) ours", "torch")))
    return results


if __name__ == "__main__":
    main()

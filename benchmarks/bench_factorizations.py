"""Cholesky, QR, inverse, solve, slogdet, LU, least squares (tall and wide), det, the general
matrix exponential and the general eigendecomposition: the generated functions vs their torch.linalg
namesakes, forward + backward and the backward alone (the graph built outside the timer); ratios
in one run, below 1.0: faster.

    python benchmarks/bench_factorizations.py [--quick] [--device cuda]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _timing import backward_time, median_time, table  # noqa: E402

import adjointgen.torch as agt  # noqa: E402


def fwd_bwd(fn, inputs, grad):
    def run():
        xs = [x.detach().requires_grad_() for x in inputs]
        out = fn(*xs)
        out = out if isinstance(out, tuple) else (out,)
        return torch.autograd.grad(out, xs, grad)
    return run


def cases(n, dtype, device, g):
    M = torch.randn(n, n, dtype=dtype, generator=g)
    spd = (M @ M.mT / n + torch.eye(n, dtype=dtype)).to(device)
    A = (M + n ** 0.5 * torch.eye(n, dtype=dtype)).to(device)
    T = torch.randn(2 * n, n, dtype=dtype, generator=g).to(device)
    B = torch.randn(n, 8, dtype=dtype, generator=g).to(device)
    W = torch.randn(n // 2, n, dtype=dtype, generator=g).to(device)
    E = (torch.randn(n, n, dtype=dtype, generator=g) / n ** 0.5).to(device)  # spectral radius ~1

    def r(*shape):
        return torch.randn(shape, dtype=dtype, generator=g).to(device)

    return {
        "cholesky": (agt.cholesky, torch.linalg.cholesky, (spd,), (r(n, n).tril(),)),
        "qr (tall 2n x n)": (agt.qr, torch.linalg.qr, (T,), (r(2 * n, n), r(n, n).triu())),
        "inv": (agt.inv, torch.linalg.inv, (A,), (r(n, n),)),
        "solve (n x 8)": (agt.solve, torch.linalg.solve, (A, B), (r(n, 8),)),
        "slogdet": ((lambda a: agt.slogdet(a)[1]), (lambda a: torch.linalg.slogdet(a)[1]), (A,), (r(),)),
        "det": (agt.det, torch.linalg.det, (A,), (r(),)),
        "lu (L, U)": ((lambda a: tuple(agt.lu(a)[1:])), (lambda a: tuple(torch.linalg.lu(a)[1:])), (A,),
                      (r(n, n).tril(-1), r(n, n).triu())),
        "lstsq (tall 2n x n, 8)": ((lambda a, b: agt.lstsq(a, b).solution),
                                   (lambda a, b: torch.linalg.lstsq(a, b).solution), (T, r(2 * n, 8)), (r(n, 8),)),
        "lstsq (wide n/2 x n, 8)": ((lambda a, b: agt.lstsq(a, b).solution),
                                    (lambda a, b: torch.linalg.lstsq(a, b).solution), (W, r(n // 2, 8)), (r(n, 8),)),
        "matrix_exp": (agt.matrix_exp, torch.linalg.matrix_exp, (E,), (r(n, n),)),
        # eig: the loss sees the eigenvectors through |V| (phase-invariant, as both libraries require)
        "eig (w, |V|)": ((lambda a: _phase_free(*agt.eig(a))), (lambda a: _phase_free(*torch.linalg.eig(a))), (E,),
                         (torch.complex(r(n), r(n)), r(n, n))),
    }


def _phase_free(w, V):
    return w, V.abs()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    sizes = [64] if args.quick else [256, 512]
    sync = torch.cuda.synchronize if args.device == "cuda" else None
    rows, results = [], []
    for dtype in (torch.float64, torch.float32):
        for n in sizes:
            g = torch.Generator().manual_seed(n)
            for name, (ours, theirs, inputs, grad) in cases(n, dtype, args.device, g).items():
                t_ref = median_time(fwd_bwd(theirs, inputs, grad), sync=sync)
                t_gen = median_time(fwd_bwd(ours, inputs, grad), sync=sync)
                b_ref = backward_time(theirs, inputs, grad, sync=sync)
                b_gen = backward_time(ours, inputs, grad, sync=sync)
                dt = str(dtype).replace("torch.", "")
                rows.append((name, dt, n, f"{t_gen * 1e3:.2f}", f"{t_ref * 1e3:.2f}", f"{t_gen / t_ref:.2f}",
                             f"{b_gen * 1e3:.2f}", f"{b_ref * 1e3:.2f}", f"{b_gen / b_ref:.2f}"))
                results.append({"benchmark": "factorizations", "case": f"{name} fwd+bwd n={n} {dt}",
                                "ratio": t_gen / t_ref, "anchor": "torch.linalg", "target": "<= 1.0"})
                results.append({"benchmark": "factorizations", "case": f"{name} backward n={n} {dt}",
                                "ratio": b_gen / b_ref, "anchor": "torch.linalg", "target": "<= 1.0"})
    print(f"factorizations on {args.device} ({torch.get_num_threads()} threads), median ms")
    print(table(rows, ["op", "dtype", "n", "fwd+bwd", "torch", "ratio", "bwd", "torch", "ratio"]))
    results += fixed_costs(sizes[0], args.device, sync)
    return results


def fixed_costs(n, device, sync):
    """What is left of the gap to torch: the extra microseconds per forward + backward at n = 4 (the
    fixed per-call cost: input checks, the Python autograd Function, unfused elementwise passes) next
    to the extra microseconds at size n, float64."""
    rows, results = [], []
    tiny = cases(4, torch.float64, device, torch.Generator().manual_seed(4))
    sized = cases(n, torch.float64, device, torch.Generator().manual_seed(n))
    for name in tiny:
        extra = []
        for table_ in (tiny, sized):
            ours, theirs, inputs, grad = table_[name]
            t_ref = median_time(fwd_bwd(theirs, inputs, grad), repeats=21, sync=sync)
            t_gen = median_time(fwd_bwd(ours, inputs, grad), repeats=21, sync=sync)
            extra.append((t_gen - t_ref) * 1e6)
        rows.append((name, f"{extra[0]:.0f}", f"{extra[1]:.0f}"))
        results.append({"benchmark": "factorizations", "case": f"{name} fwd+bwd: extra us per call at n=4 (fixed)",
                        "value": extra[0], "format": ".0f", "anchor": "torch.linalg"})
        results.append({"benchmark": "factorizations", "case": f"{name} fwd+bwd: extra us per call at n={n}",
                        "value": extra[1], "format": ".0f", "anchor": "torch.linalg"})
    print(f"\nextra time per forward + backward over torch, microseconds, float64 (n = 4: the fixed cost)")
    print(table(rows, ["op", "n = 4", f"n = {n}"]))
    return results


if __name__ == "__main__":
    main()

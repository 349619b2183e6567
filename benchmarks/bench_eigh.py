"""Generated eigh vs torch.linalg.eigh, forward + backward (ratios in one run), and the time of
``adjointgen generate --check``.

    python benchmarks/bench_eigh.py [--quick] [--device cuda] [--no-generate]

For each size and dtype: the median time of ``eigh`` followed by the backward of a loss with
cotangents on ``w`` and ``V`` (random, on a matrix with a well-separated spectrum, so that neither
library's degeneracy handling enters), for ``agt.eigh`` and ``torch.linalg.eigh``, and the ratio
(below 1.0: faster).  Then the backward alone with the degeneracy handling on (cluster detection,
the derived gauge residual's check where clusters exist, masked reciprocal gaps where values are
not apart) and off (``adjointgen.runtime.gauge.disabled()``), against torch's backward, whose
reciprocal gaps are not masked.  Then the time of ``adjointgen generate --check`` for the whole
catalogue.
"""
import argparse
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _timing import backward_time, median_time, table  # noqa: E402

import adjointgen.torch as agt  # noqa: E402
from adjointgen.runtime import gauge  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def separated(n, dtype, device, g):
    """A random symmetric matrix with eigenvalues spaced 4e-3 apart, from 1."""
    Q, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64, generator=g))
    # spacing 4e-3, max 1 + 4e-3 n: gaps above float32's cluster tolerance (3.5e-4 max|w|) for every n
    A = (Q * (1.0 + 4e-3 * torch.arange(n, dtype=torch.float64))) @ Q.mT
    return ((A + A.mT) / 2).to(dtype).to(device)


def fwd_bwd(eig, A, gw, gV):
    def run():
        X = A.detach().requires_grad_()
        w, V = eig(X)
        return torch.autograd.grad((w, V), X, (gw, gV))
    return run


def generate_check_time():
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "adjointgen", "--root", ROOT, "generate", "--check"],
                       capture_output=True, text=True)
    return time.perf_counter() - t0, r.returncode


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-generate", action="store_true", help="skip timing adjointgen generate --check")
    args = p.parse_args(argv)
    sizes = [64, 128] if args.quick else [256, 512, 1024]
    if args.device == "cuda":
        sizes = [512, 1024, 2048]
    sync = torch.cuda.synchronize if args.device == "cuda" else None
    rows, results = [], []
    for dtype in (torch.float64, torch.float32):
        for n in sizes:
            g = torch.Generator().manual_seed(n)
            A = separated(n, dtype, args.device, g)
            gw = torch.randn(n, dtype=dtype, generator=g).to(args.device)
            gV = torch.randn(n, n, dtype=dtype, generator=g).to(args.device)
            t_ref = median_time(fwd_bwd(torch.linalg.eigh, A, gw, gV), sync=sync)
            t_gen = median_time(fwd_bwd(agt.eigh, A, gw, gV), sync=sync)
            name = str(dtype).replace("torch.", "")
            rows.append((name, n, f"{t_gen * 1e3:.2f}", f"{t_ref * 1e3:.2f}", f"{t_gen / t_ref:.2f}"))
            results.append({"benchmark": "eigh", "case": f"fwd+bwd n={n} {name}", "ratio": t_gen / t_ref,
                            "anchor": "torch.linalg.eigh", "target": "<= 1.0"})
    print(f"eigh forward + backward on {args.device} ({torch.get_num_threads()} threads), median ms")
    print(table(rows, ["dtype", "n", "adjointgen", "torch", "ratio"]))
    rows = []
    for n in sizes:
        g = torch.Generator().manual_seed(n + 1)
        A = separated(n, torch.float64, args.device, g)
        cot = (torch.randn(n, dtype=torch.float64, generator=g).to(args.device),
               torch.randn(n, n, dtype=torch.float64, generator=g).to(args.device))
        t_on = backward_time(agt.eigh, (A,), cot, sync=sync)
        with gauge.disabled():
            t_off = backward_time(agt.eigh, (A,), cot, sync=sync)
        t_torch = backward_time(torch.linalg.eigh, (A,), cot, sync=sync)
        rows.append((n, f"{t_on * 1e3:.2f}", f"{t_off * 1e3:.2f}", f"{t_torch * 1e3:.2f}", f"{t_on / t_off:.2f}",
                     f"{t_on / t_torch:.2f}"))
        results.append({"benchmark": "eigh", "case": f"backward, degeneracy handling on / off n={n} float64",
                        "ratio": t_on / t_off, "anchor": "checks off", "target": "<= 1.05"})
        results.append({"benchmark": "eigh", "case": f"backward, degeneracy handling on n={n} float64",
                        "ratio": t_on / t_torch, "anchor": "torch backward (unmasked gaps)", "target": "<= 1.05"})
    print("\neigh backward alone, float64, separated spectrum, median ms")
    print(table(rows, ["n", "on", "off", "torch", "on/off", "on/torch"]))
    if not args.no_generate and not args.quick:
        dt, rc = generate_check_time()
        print(f"\nadjointgen generate --check (audit + render of the whole catalogue): {dt:.1f} s (exit {rc})")
        results.append({"benchmark": "generate", "case": "generate --check, whole catalogue", "seconds": dt,
                        "target": "<= 20 s"})
    return results


if __name__ == "__main__":
    main()

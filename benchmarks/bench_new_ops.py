"""Forward + backward of the decompositions no framework differentiates (schur, polar, signm,
solve_sylvester, solve_continuous_lyapunov) against what they cannot do without: SciPy's forward of
the same operation plus one forward-sized solve.

For each operation and size one run times, in turn (median of repeats after a warm-up):

* ``scipy``  — SciPy's function on the same matrices (``scipy.linalg.schur``, ``polar``, ``signm``,
  ``solve_sylvester``, ``solve_continuous_lyapunov``);
* ``solve``  — one Sylvester solve of the same size (``scipy.linalg.solve_sylvester``), the
  forward-sized solve every one of these backwards needs at least once;
* ``ours``   — ``adjointgen.torch.<op>`` forward and ``torch.autograd.grad`` of a random linear loss
  of its outputs (a loss invariant to the gauge where the outputs have one: ``|T|`` of ``schur``);

and reports ``ours / (scipy + solve)``, target ``<= 1.2`` (issue 44).

    python benchmarks/bench_new_ops.py             # n = 64, 128, 256
    python benchmarks/bench_new_ops.py --quick     # n = 16, 32 (a smoke run; CI)
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import scipy.linalg
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import median_time, table  # noqa: E402

import adjointgen.torch as agt  # noqa: E402
from adjointgen.runtime import xp as _xp  # noqa: E402


def _cases(n: int, rng):
    """name -> (our function of torch tensors, SciPy's of arrays, arrays, the loss of our outputs)."""
    A = rng.standard_normal((n, n)) / np.sqrt(n) + 2.0 * np.eye(n)  # eigenvalues in the right half-plane
    B = rng.standard_normal((n, n)) / np.sqrt(n) + 2.0 * np.eye(n)
    Q = rng.standard_normal((n, n))
    # real eigenvalues for the real Schur form (triangular), well separated
    V = np.eye(n) + 0.1 * rng.standard_normal((n, n)) / np.sqrt(n)
    S = (V * np.linspace(1.0, 2.0 * n, n)) @ np.linalg.inv(V)
    # sign: eigenvalues on both sides of the imaginary axis
    M = rng.standard_normal((n, n)) / np.sqrt(n) + np.diag(np.where(np.arange(n) % 2 == 0, 2.0, -2.0))
    W = [torch.from_numpy(rng.standard_normal((n, n))) for _ in range(2)]

    def linear(*outs):
        return sum((o * w).sum() for o, w in zip(outs, W))

    return {
        "schur": (lambda A: agt.schur(A), lambda a: scipy.linalg.schur(a), (S,),
                  lambda out: linear(out[0].abs())),
        "polar": (lambda A: agt.polar(A), lambda a: scipy.linalg.polar(a), (A,), lambda out: linear(*out)),
        "signm": (lambda A: agt.signm(A), lambda a: scipy.linalg.signm(a), (M,), lambda out: linear(*out)),
        "solve_sylvester": (lambda A, B, Q: agt.solve_sylvester(A, B, Q), scipy.linalg.solve_sylvester, (A, B, Q),
                            lambda out: linear(*out)),
        "solve_continuous_lyapunov": (lambda A, Q: agt.solve_continuous_lyapunov(A, Q),
                                      scipy.linalg.solve_continuous_lyapunov, (A, Q), lambda out: linear(*out)),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sizes", default=None, help="comma-separated n")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else ([16, 32] if args.quick else [64, 128, 256])
    repeats = 3 if args.quick else 7
    rng = np.random.default_rng(0)
    rows, results = [], []
    for n in sizes:
        for name, (ours, theirs, arrays, loss) in _cases(n, rng).items():
            tensors = [torch.from_numpy(a) for a in arrays]

            def run_ours():
                # the host solver keeps recent Schur forms by content (a backward reuses its forward's):
                # forget them, so that each repeat pays its forward's as a call on new matrices does
                _xp._SCHUR_CACHE.clear()
                xs = [t.detach().requires_grad_() for t in tensors]
                out = ours(*xs)
                torch.autograd.grad(loss(out if isinstance(out, tuple) else (out,)), xs)

            t_scipy = median_time(lambda: theirs(*arrays), repeats=repeats)
            t_solve = median_time(lambda: scipy.linalg.solve_sylvester(arrays[0], arrays[0].T, arrays[0]),
                                  repeats=repeats)
            t_ours = median_time(run_ours, repeats=repeats)
            ratio = t_ours / (t_scipy + t_solve)
            rows.append((name, n, f"{t_scipy * 1e3:.2f}", f"{t_solve * 1e3:.2f}", f"{t_ours * 1e3:.2f}", f"{ratio:.2f}"))
            results.append({"benchmark": "new_ops", "case": f"{name} fwd+bwd, n = {n}", "ratio": ratio,
                            "anchor": "SciPy's forward + one Sylvester solve", "target": "<= 1.2"})
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"float64, CPU, torch threads {torch.get_num_threads()}, load average {load:.1f}")
    print(table(rows, ("op", "n", "scipy ms", "solve ms", "ours fwd+bwd ms", "ours / (scipy + solve)")))
    return results


if __name__ == "__main__":
    main()

"""Partial eigenpairs with gradients: adjointgen.torch.eigsh vs torch.linalg.eigh (full) and
torch.lobpcg, forward + backward, accuracy and time ratios in one run.

    python benchmarks/bench_eigsh.py [--quick]

(a) dense n = 2000, k = 8, float64: time of forward + backward and the gradient's relative error
    against the full-eigh reference; torch.lobpcg's backward is attempted and its outcome recorded.
(b) 2-D Laplacian plus a random diagonal potential on a G×G grid (G = 300, n = 90,000), k = 8
    largest, torch sparse CSR: forward + backward time, peak RSS, vs torch.lobpcg's forward alone;
    the gradient is checked against the dense reference on a 40×40 grid.
"""
import argparse
import os
import resource
import sys
import time
import warnings

import numpy as np
import scipy.sparse as sps
import torch

sys.path.insert(0, os.path.dirname(__file__))
from _timing import table  # noqa: E402

import adjointgen.torch as agt  # noqa: E402


def loss(w, V, W):
    """Gauge-invariant (squares of V^T W) and O(n k): no n×n product."""
    return (w ** 2).sum() + (V.mT @ W).pow(2).sum()


def dense_case(n, k):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, n, dtype=torch.float64, generator=g)
    A = (X + X.mT) / 2
    W = torch.randn(n, 4, dtype=torch.float64, generator=g)
    rows = []
    # adjointgen
    A1 = A.clone().requires_grad_()
    t0 = time.perf_counter()
    w, V = agt.eigsh(A1, k)
    g1, = torch.autograd.grad(loss(w, V, W), A1)
    t_ag = time.perf_counter() - t0
    # full eigh reference
    A2 = A.clone().requires_grad_()
    t0 = time.perf_counter()
    wf, Vf = torch.linalg.eigh(A2)
    g2, = torch.autograd.grad(loss(wf[-k:].flip(0), Vf[:, -k:].flip(1), W), A2)
    t_full = time.perf_counter() - t0
    err = float((g1 - g2).norm() / g2.norm())
    rows.append(("adjointgen eigsh", f"{t_ag:.2f}", f"{t_ag / t_full:.2f}", f"{err:.1e}"))
    rows.append(("torch.linalg.eigh (full)", f"{t_full:.2f}", "1.00", "reference"))
    # torch.lobpcg
    A3 = A.clone().requires_grad_()
    t0 = time.perf_counter()
    try:
        wl, Vl = torch.lobpcg(A3, k=k, largest=True)
        g3, = torch.autograd.grad(loss(wl, Vl, W), A3)
        t_l = time.perf_counter() - t0
        rows.append(("torch.lobpcg", f"{t_l:.2f}", f"{t_l / t_full:.2f}", f"{float((g3 - g2).norm() / g2.norm()):.1e}"))
    except Exception as exc:  # record the failure
        rows.append(("torch.lobpcg", f"{time.perf_counter() - t0:.2f}", "-", f"failed: {type(exc).__name__}: {str(exc)[:60]}"))
    print(f"(a) dense n = {n}, k = {k}, float64, forward + backward ({torch.get_num_threads()} threads)")
    print(table(rows, ["method", "seconds", "ratio to full eigh", "gradient rel. error"]))


def grid_operator(G, seed=0):
    lap1 = sps.diags([-np.ones(G - 1), 2 * np.ones(G), -np.ones(G - 1)], [-1, 0, 1])
    eye = sps.identity(G)
    L = sps.kron(lap1, eye) + sps.kron(eye, lap1)
    potential = np.random.default_rng(seed).uniform(0, 1, G * G)
    H = (L + sps.diags(potential)).tocsr()
    H.sort_indices()
    return torch.sparse_csr_tensor(torch.from_numpy(H.indptr.astype(np.int64)), torch.from_numpy(H.indices.astype(np.int64)),
                                   torch.from_numpy(H.data), size=H.shape)


def sparse_case(G, k, lobpcg_limit):
    H = grid_operator(G).requires_grad_()
    n = G * G
    W = torch.randn(n, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    w, V = agt.eigsh(H, k)
    t_fwd = time.perf_counter() - t0
    gH, = torch.autograd.grad(loss(w, V, W), H)
    t_total = time.perf_counter() - t0
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rows = [("adjointgen eigsh fwd+bwd", f"{t_total:.2f}", f"forward {t_fwd:.2f} s; grad is {gH.layout}, nnz {gH.values().numel()}",
             f"{(rss1 - rss0) / 1024:.0f} MiB")]
    Hd = grid_operator(G).detach()
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            wl, _ = torch.lobpcg(Hd.to_sparse_coo(), k=k, largest=True, niter=lobpcg_limit, tol=1e-8)
        t_l = time.perf_counter() - t0
        note = f"niter cap {lobpcg_limit}; max |w - w_lobpcg| = {float((wl - w.detach()).abs().max()):.1e}"
    except Exception as exc:
        t_l = time.perf_counter() - t0
        note = f"failed: {type(exc).__name__}"
    rows.append(("torch.lobpcg forward only", f"{t_l:.2f}", note, "-"))
    print(f"\n(b) sparse grid {G}x{G} (n = {n}), k = {k} largest, float64")
    print(table(rows, ["method", "seconds", "notes", "peak RSS growth"]))
    print(f"speed-up vs torch.lobpcg forward alone: {t_l / t_total:.1f}x (a lower bound when lobpcg stopped at its cap)")


def sparse_gradient_check(G, k):
    H = grid_operator(G, seed=3).requires_grad_()
    W = torch.randn(G * G, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    gH, = torch.autograd.grad(loss(*agt.eigsh(H, k), W), H)
    D = H.detach().to_dense().requires_grad_()
    wf, Vf = torch.linalg.eigh(D)
    gD, = torch.autograd.grad(loss(wf[-k:].flip(0), Vf[:, -k:].flip(1), W), D)
    gD = 0.5 * (gD + gD.mT)
    dense_on_pattern = gD[H.detach().to_sparse_coo().indices()[0], H.detach().to_sparse_coo().indices()[1]]
    err = float((gH.to_sparse_coo().coalesce().values() - dense_on_pattern).norm() / dense_on_pattern.norm())
    print(f"\n(c) sparse gradient on a {G}x{G} grid vs dense reference (on the pattern): relative error {err:.1e}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    dense_case(600 if args.quick else 2000, 8)
    sparse_case(60 if args.quick else 300, 8, lobpcg_limit=200 if args.quick else 1000)
    sparse_gradient_check(20 if args.quick else 40, 8)


if __name__ == "__main__":
    main()

"""Generated thin SVD vs torch.linalg.svd, forward + backward (ratios in one run), real and complex
(both libraries check that the complex cotangents are phase invariant); then ``agt.svds`` (k = 16
of 4000 x 2000) against the full SVD, and the gradient accuracy of ``torch.svd_lowrank``.

    python benchmarks/bench_svd.py [--quick] [--device cuda]

The matrices have well-separated singular values (``U diag(linspace(1, 2, n)) V^H``), so that
neither library's degeneracy handling enters; cotangents on ``U``, ``S`` and ``Vh`` are random.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _timing import median_time, table  # noqa: E402

import adjointgen.torch as agt  # noqa: E402


def invariant_cotangents(A, dtype, g):
    """Random cotangents (gU, gS, gVh); for complex A made phase invariant,
    Im diag(U^H gU + Vh gVh^H) = 0, so that both libraries' phase checks pass."""
    m, n = A.shape
    real = torch.empty(0, dtype=dtype).real.dtype
    gU = torch.randn(m, n, dtype=dtype, generator=g).to(A.device)
    gS = torch.randn(n, dtype=real, generator=g).to(A.device)
    gVh = torch.randn(n, n, dtype=dtype, generator=g).to(A.device)
    if dtype.is_complex:
        U, _, Vh = torch.linalg.svd(A, full_matrices=False)
        gU = phase_invariant(U, Vh, gU, gVh)
    return gU, gS, gVh


def phase_invariant(U, Vh, gU, gVh):
    """``gU`` corrected so that ``Im diag(U^H gU + Vh gVh^H) = 0`` for these ``U``, ``Vh`` (O(mn))."""
    r = ((U.conj() * gU).sum(-2) + (Vh * gVh.conj()).sum(-1)).imag
    return gU - U * (1j * r)


def _cotangents_for(outs, grads):
    """The cotangents, made phase invariant for the decomposition just computed where it is
    complex (a GPU's SVD need not return the same phases twice)."""
    U, S, Vh = outs
    gU, gS, gVh = grads
    if U.is_complex():
        gU = phase_invariant(U.detach(), Vh.detach(), gU, gVh)
    return gU, gS, gVh


def separated(m, n, dtype, device, g):
    """``U diag(linspace(1, 2, n)) V^H`` with random orthonormal ``U``, ``V``."""
    U, _ = torch.linalg.qr(torch.randn(m, n, dtype=dtype, generator=g))
    V, _ = torch.linalg.qr(torch.randn(n, n, dtype=dtype, generator=g))
    s = torch.linspace(1.0, 2.0, n, dtype=torch.float64).to(U.real.dtype)
    return ((U * s) @ V.mH).to(device)


def backward_time(svd, A, grads, sync):
    A = A.detach().requires_grad_()
    outs = svd(A)
    grads = _cotangents_for(outs, grads)
    return median_time(lambda: torch.autograd.grad(outs, A, grads, retain_graph=True), sync=sync)


def fwd_bwd_time(svd, A, grads, sync):
    def run():
        X = A.detach().requires_grad_()
        outs = svd(X)
        return torch.autograd.grad(outs, X, _cotangents_for(outs, grads))
    return median_time(run, sync=sync)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    shapes = [(256, 128)] if args.quick else [(512, 256), (1024, 512)]
    if args.device == "cuda":
        shapes = [(2048, 1024)]
    sync = torch.cuda.synchronize if args.device == "cuda" else None
    rows, results = [], []
    for dtype in (torch.float64, torch.float32, torch.complex128, torch.complex64):
        for m, n in shapes:
            g = torch.Generator().manual_seed(m)
            A = separated(m, n, dtype, args.device, g)
            grads = invariant_cotangents(A, dtype, g)
            t_ref = fwd_bwd_time(lambda a: torch.linalg.svd(a, full_matrices=False), A, grads, sync)
            t_gen = fwd_bwd_time(lambda a: agt.svd(a, full_matrices=False), A, grads, sync)
            name = str(dtype).replace("torch.", "")
            rows.append((name, f"{m}x{n}", f"{t_gen * 1e3:.1f}", f"{t_ref * 1e3:.1f}", f"{t_gen / t_ref:.2f}"))
            results.append({"benchmark": "svd", "case": f"fwd+bwd {m}x{n} {name}", "ratio": t_gen / t_ref,
                            "anchor": "torch.linalg.svd", "target": "<= 1.0"})
    print(f"thin SVD forward + backward on {args.device} ({torch.get_num_threads()} threads), median ms")
    print(table(rows, ["dtype", "shape", "adjointgen", "torch", "ratio"]))
    if args.device == "cuda":
        cupy_backward(shapes, sync)
    if args.device == "cpu":
        results += truncated(*((2400, 1200, 16, 2) if args.quick else (4000, 2000, 16, 3)))
        lowrank_accuracy()
    return results


def cupy_backward(shapes, sync):
    """The generated CuPy rule (its elementwise parts as the generated CUDA kernels) vs torch's
    built-in backward on the same GPU."""
    try:
        import cupy as cp
    except Exception as exc:  # pragma: no cover - machine dependent
        print(f"\nCuPy not available ({exc}): no CuPy rows")
        return
    from adjointgen.generated.cupy import svd as rules_xp

    rows = []
    for dtype in (torch.float64, torch.float32, torch.complex128):
        for m, n in shapes:
            g = torch.Generator().manual_seed(m)
            A = torch.randn(m, n, dtype=dtype, generator=g).cuda()
            U, S, Vh = torch.linalg.svd(A, full_matrices=False)
            gU, gS, gVh = _cotangents_for((U, S, Vh), invariant_cotangents(A, dtype, g))
            xs = [cp.asarray(t.resolve_conj().contiguous()) for t in (U, S, Vh.mH, gU, gS, gVh.mH)]
            vjp = rules_xp.svd_vjp_complex if dtype.is_complex else rules_xp.svd_vjp
            t_cp = median_time(lambda: vjp(*xs), sync=cp.cuda.Device().synchronize)
            t_ref = backward_time(lambda a: torch.linalg.svd(a, full_matrices=False), A, (gU, gS, gVh), sync)
            rows.append((str(dtype).replace("torch.", ""), f"{m}x{n}", f"{t_cp * 1e3:.1f}", f"{t_ref * 1e3:.1f}",
                         f"{t_cp / t_ref:.2f}"))
    print("\nthin SVD backward, generated CuPy rule vs torch built-in (CUDA), median ms")
    print(table(rows, ["dtype", "shape", "adjointgen (CuPy)", "torch", "ratio"]))


def svds_families(m, n, g):
    """Tall m x n test matrices a user meets: name -> (A, what)."""
    def orthonormal(rows, cols):
        return torch.linalg.qr(torch.randn(rows, cols, dtype=torch.float64, generator=g))[0]

    def with_values(s):
        return (orthonormal(m, n) * s) @ orthonormal(n, n).mT

    j = torch.arange(1, n + 1, dtype=torch.float64)
    top = torch.rand(n, dtype=torch.float64, generator=g)
    top[:20] = 10 + 1e-3 * torch.arange(20, 0, -1, dtype=torch.float64)
    r = 20
    return {
        "flat Gaussian": (torch.randn(m, n, dtype=torch.float64, generator=g),
                          "randn: Marchenko-Pastur, no gap at the top"),
        "decaying": (torch.randn(m, n, dtype=torch.float64, generator=g) / j.sqrt(), "randn columns scaled 1/sqrt(j)"),
        "power law": (with_values(1 / j), "singular values 1/j"),
        "low rank + noise": (orthonormal(m, r) @ (3 * torch.randn(r, n, dtype=torch.float64, generator=g))
                             + 0.01 * torch.randn(m, n, dtype=torch.float64, generator=g), "rank 20 plus 1e-2 noise"),
        "clustered top": (with_values(top), "20 singular values 10 + 1e-3 j above U(0, 1)"),
    }


def truncated(m, n, k, repeats):
    """agt.svds forward + backward vs full torch.linalg.svd forward + backward (keep k), medians of
    ``repeats`` alternating runs, on every family of :func:`svds_families` with cotangents on U, S and
    Vh, and on the decaying one also on S alone and on U and S."""
    import statistics
    import time

    g = torch.Generator().manual_seed(1)
    families = svds_families(m, n, g)
    Wu = torch.randn(m, 3, dtype=torch.float64, generator=g)
    Wv = torch.randn(n, 3, dtype=torch.float64, generator=g)
    losses = {
        "S": lambda U, S, Vh: S.pow(2).sum(),
        "U, S": lambda U, S, Vh: S.pow(2).sum() + ((U @ U[:3].mT) * Wu).sum(),
        "U, S, Vh": lambda U, S, Vh: S.pow(2).sum() + ((U @ U[:3].mT) * Wu).sum() + ((Vh.mT @ Vh[:, :3]) * Wv).sum(),
    }
    cases = [("decaying", "S"), ("decaying", "U, S")] + [(family, "U, S, Vh") for family in families]
    rows, results = [], []
    for family, name in cases:
        A, what = families[family]
        loss = losses[name]
        ours, full, forward, errors, methods = [], [], [], [], set()
        for _ in range(repeats):
            A1 = A.clone().requires_grad_()
            t0 = time.perf_counter()
            *out, info = agt.svds(A1, k, return_info=True)
            t1 = time.perf_counter()
            g1, = torch.autograd.grad(loss(*out), A1)
            t2 = time.perf_counter()
            A2 = A.clone().requires_grad_()
            t3 = time.perf_counter()
            U, S, Vh = torch.linalg.svd(A2, full_matrices=False)
            g2, = torch.autograd.grad(loss(U[:, :k], S[:k], Vh[:k]), A2)
            t4 = time.perf_counter()
            ours.append(t2 - t0)
            forward.append(t1 - t0)
            full.append(t4 - t3)
            methods.add(info.method)
            errors.append(float((g1 - g2).norm() / g2.norm()))
        o, f, a = statistics.median(ours), statistics.median(forward), statistics.median(full)
        rows.append((family, name, "/".join(sorted(methods)), f"{o:.3f}", f"{f:.3f}", f"{a:.3f}", f"{o / a:.2f}",
                     f"{max(errors):.1e}"))
        # the Gram matrix's spectrum decides the route as for eigsh; even where the Krylov route gives up
        # (flat, clustered) the direct subset solver on the n x n Gram matrix beats the full m x n SVD
        results.append({"benchmark": "svds", "case": f"{family}: k={k} of {m}x{n}, cotangents on {name}",
                        "ratio": o / a, "anchor": "full torch.linalg.svd", "target": "<= 0.35"})
    print(f"\ntruncated k = {k} of {m}x{n} float64, forward + backward, {torch.get_num_threads()} threads, "
          f"median of {repeats}; route: the Gram matrix's partial eigensolver")
    for family, (_, what) in families.items():
        print(f"    {family}: {what}")
    print(table(rows, ["spectrum", "cotangents on", "route", "svds s", "svds fwd s", "full svd s (anchor)", "ratio",
                       "grad rel. error"]))
    return results


def lowrank_accuracy():
    """The issue's accuracy case: 200x120, slowly decaying spectrum, k = 10; torch.svd_lowrank's
    gradient (it differentiates through its random sketch) against the exact one."""
    g = torch.Generator().manual_seed(2)
    Q1, _ = torch.linalg.qr(torch.randn(200, 120, dtype=torch.float64, generator=g))
    Q2, _ = torch.linalg.qr(torch.randn(120, 120, dtype=torch.float64, generator=g))
    A = (Q1 * torch.arange(1, 121, dtype=torch.float64).rsqrt()) @ Q2.mT
    k = 10

    def loss(U, S, V):
        return S.pow(2).sum() + (U @ U.mT)[:, :5].sum()

    def grad(fn):
        A_ = A.clone().requires_grad_()
        return torch.autograd.grad(loss(*fn(A_)), A_)[0]

    def full(a):
        U, S, Vh = torch.linalg.svd(a, full_matrices=False)
        return U[:, :k], S[:k], Vh[:k].mT

    ref = grad(full)
    ours = grad(lambda a: (lambda U, S, Vh: (U, S, Vh.mT))(*agt.svds(a, k)))
    torch.manual_seed(0)
    low = grad(lambda a: torch.svd_lowrank(a, q=k, niter=4))
    rel = lambda x: float((x - ref).norm() / ref.norm())
    print(f"200x120, k = 10, slowly decaying spectrum: gradient rel. error adjointgen.svds {rel(ours):.1e}, "
          f"torch.svd_lowrank(q=k, niter=4) {rel(low):.1e}")


if __name__ == "__main__":
    main()

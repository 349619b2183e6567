"""Forward benchmarks of the partial eigensolvers and the projected shifted solve.

    python benchmarks/bench_eigsolvers.py            # full sizes (several minutes on 2 cores)
    python benchmarks/bench_eigsolvers.py --quick    # small sizes (seconds)
    python benchmarks/bench_eigsolvers.py --threads 1   # pin torch/OpenMP/OpenBLAS threads

On a machine shared with other jobs, pin the threads: an OpenMP or OpenBLAS pool whose threads wait
for a descheduled sibling turns milliseconds into seconds (measured here: torch.linalg.eigh of a
600 x 600 matrix took 7.8 s with 2 threads on 2 busy cores).

Cases (float64, CPU):
  (a) dense random symmetric n = 2000, k = 8 largest: partial_eigh (auto route, and ARPACK forced)
      against torch.linalg.eigh (full) and torch.lobpcg;
  (b) 2-D Laplacian plus a random diagonal potential on a 300 x 300 grid (n = 90,000, CSR),
      k = 8 largest: partial_eigh (auto: ARPACK; and the torch LOBPCG route) against torch.lobpcg;
  (c) solve_projected_shifted for case (b)'s eigenpairs with 8 right-hand sides: unpreconditioned,
      Jacobi, and preconditioned by the forward's aid (its certifying sparse LDL^T and a few more
      factorizations near the kept eigenvalues; the time includes making them).

Every measurement runs in its own subprocess, so that its peak memory (the growth of ru_maxrss
after the inputs are built) is its own and a hard time cap can stop it; a capped run is reported
as such. Times are wall-clock seconds of one run; "ratio" is time / the anchor of the same case
(marked "anchor"). The residual column is max_i ||A u_i - w_i u_i|| / (||A|| ||u_i||) for
eigensolvers (||A|| by power iteration) and the largest relative residual per column for (c).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SIZES = {
    "full": {"dense_n": 2000, "grid": 300, "k": 8},
    "quick": {"dense_n": 600, "grid": 60, "k": 8},
}
TORCH_LOBPCG_NITER = 2000
SOLVE_TOL = 1e-10


# ---------------------------------------------------------------------------------------------------
# inputs (built inside each subprocess, deterministically)
# ---------------------------------------------------------------------------------------------------
def dense_problem(n: int):
    """A dense random symmetric float64 matrix (GOE-like), seeded."""
    import torch

    g = torch.Generator().manual_seed(0)
    G = torch.randn(n, n, generator=g, dtype=torch.float64)
    return (G + G.T) / 2


def laplacian_problem(grid: int, layout: str):
    """2-D 5-point Laplacian on a grid x grid mesh plus a random diagonal potential in [0, 1)."""
    import numpy as np
    import scipy.sparse as sp
    import torch

    T = sp.diags([-np.ones(grid - 1), 2 * np.ones(grid), -np.ones(grid - 1)], [-1, 0, 1])
    eye = sp.identity(grid)
    potential = np.random.default_rng(0).random(grid * grid)
    S = (sp.kron(T, eye) + sp.kron(eye, T) + sp.diags(potential)).tocsr()
    S.sort_indices()
    csr = torch.sparse_csr_tensor(
        torch.from_numpy(S.indptr.astype(np.int64)), torch.from_numpy(S.indices.astype(np.int64)),
        torch.from_numpy(S.data), size=S.shape,
    )
    return csr if layout == "csr" else csr.to_sparse_coo().coalesce()


def residual_of(A, w, U) -> float:
    """max_i ||A u_i - w_i u_i|| / (||A|| ||u_i||), ||A|| by 20 power-iteration steps."""
    import torch

    from adjointgen.runtime.eigsolvers.common import _estimate_norm
    from adjointgen.runtime.linear_operator import as_operator

    with torch.no_grad():
        op = as_operator(A)
        norm = _estimate_norm(op, steps=20)
        R = op.matmul(U) - U * w
        return float((torch.linalg.vector_norm(R, dim=0) / (norm * torch.linalg.vector_norm(U, dim=0))).max())


def warm_up() -> None:
    """Import and call every code path once on a tiny problem, so that no measurement pays for
    imports (scipy.linalg alone takes ~0.2 s) or first-call library initialisation."""
    import torch

    from adjointgen.runtime.eigsolvers import partial_eigh
    from adjointgen.runtime.linsolve import solve_projected_shifted

    small = dense_problem(64)
    for method in ("dense", "arpack", "lobpcg"):
        partial_eigh(small, 2, method=method)
    w, U, _ = partial_eigh(laplacian_problem(12, "csr"), 2)
    torch.linalg.eigh(small)
    torch.lobpcg(small, k=2, largest=True)
    R = torch.randn(U.shape[0], 2, dtype=torch.float64)
    solve_projected_shifted(laplacian_problem(12, "csr"), None, U, U, w, R - U @ (U.T @ R), tol=1e-8)


# ---------------------------------------------------------------------------------------------------
# one measurement (runs in a subprocess)
# ---------------------------------------------------------------------------------------------------
def run_case(name: str, size: str) -> dict:
    """Build the inputs of one case, time it once and return its row as a dict."""
    import warnings

    import torch

    from adjointgen.runtime.eigsolvers import partial_eigh
    from adjointgen.runtime.linsolve import solve_projected_shifted

    warnings.filterwarnings("ignore", message=".*(beta state|invariant checks).*")
    cfg = SIZES[size]
    k = cfg["k"]
    result: dict = {"iterations": "", "note": ""}
    if name.startswith("a_"):
        A = dense_problem(cfg["dense_n"])
    elif name.startswith(("b_", "c_")):
        A = laplacian_problem(cfg["grid"], "coo" if name == "b_torch_lobpcg" else "csr")
    else:
        raise SystemExit(f"unknown case {name}")
    if name.startswith("c_"):
        w, U, forward_info = partial_eigh(A, k, largest=True)
        g = torch.Generator().manual_seed(1)
        R = torch.randn(U.shape[0], k, generator=g, dtype=torch.float64)
        R = R - U @ (U.T @ R)
    warm_up()
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if name in ("a_partial_eigh", "b_partial_eigh"):
        w, U, info = partial_eigh(A, k, largest=True)
        result.update(method=f"partial_eigh[{info.method}]", iterations=info.iterations)
    elif name in ("a_partial_eigh_arpack", "b_partial_eigh_lobpcg"):
        method = "arpack" if name.startswith("a_") else "lobpcg"
        w, U, info = partial_eigh(A, k, largest=True, method=method)
        result.update(method=f"partial_eigh[{info.method}]", iterations=info.iterations)
    elif name == "a_torch_eigh":
        w_all, V_all = torch.linalg.eigh(A)
        w, U = w_all[-k:].flip(0), V_all[:, -k:].flip(1)
        result.update(method="torch.linalg.eigh (full)")
    elif name in ("a_torch_lobpcg", "b_torch_lobpcg"):
        result.update(method="torch.lobpcg")
        steps = []
        try:
            w, U = torch.lobpcg(
                A, k=k, largest=True, niter=TORCH_LOBPCG_NITER, tol=1e-10,
                tracker=lambda worker: steps.append(worker.ivars["istep"]),
            )
            reached = max(steps, default=0)
            capped = "; stopped at the cap, NOT converged" if reached >= TORCH_LOBPCG_NITER else ""
            result["iterations"] = f"{reached} (niter cap {TORCH_LOBPCG_NITER}, tol 1e-10{capped})"
        except Exception as exc:  # record the failure, not a traceback
            result.update(error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:60]}")
    elif name.startswith("c_solve"):
        preconditioner = "jacobi" if name.endswith("jacobi") else None
        label = ", jacobi" if preconditioner else ""
        if name.endswith("aid"):  # the forward's certifying factorization (and more, made here)
            from adjointgen.runtime.linear_operator import as_operator

            preconditioner = forward_info.aid.preconditioner(as_operator(A), None, U, U, w)
            label = f", {type(forward_info.aid).__name__}"
        X, info = solve_projected_shifted(
            A, None, U, U, w, R, tol=SOLVE_TOL, return_info=True, preconditioner=preconditioner
        )
        result.update(
            method=f"solve_projected_shifted[cg{label}]",
            iterations=f"{info.iterations} (per column {min(info.cg_iterations)}..{max(info.cg_iterations)})",
            residual=info.residual,
            note=f"tol={SOLVE_TOL:g}, d = top-{k} eigenvalues, sign {info.signs[0]:+d}",
        )
    result["time_s"] = time.perf_counter() - start
    result["peak_mib"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - baseline) / 1024.0
    if "error" not in result and not name.startswith("c_"):
        result["residual"] = residual_of(A, w, U)
    return result


# ---------------------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------------------
def cases(size: str) -> list[tuple[str, str, bool]]:
    """(case id, section title, is_anchor)."""
    cfg = SIZES[size]
    n_dense, grid, k = cfg["dense_n"], cfg["grid"], cfg["k"]
    a = f"(a) dense n={n_dense} k={k}"
    b = f"(b) sparse {grid}x{grid} n={grid * grid} k={k}"
    c = f"(c) projected solve n={grid * grid} m={k}"
    return [
        ("a_torch_eigh", a, True),
        ("a_partial_eigh", a, False),
        ("a_partial_eigh_arpack", a, False),
        ("a_torch_lobpcg", a, False),
        ("b_partial_eigh", b, True),
        ("b_partial_eigh_lobpcg", b, False),
        ("b_torch_lobpcg", b, False),
        ("c_solve", c, True),
        ("c_solve_jacobi", c, False),
        ("c_solve_aid", c, False),
    ]


def main() -> None:
    """Run every case in its own subprocess and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--timeout", type=float, default=None, help="cap per measurement, seconds")
    parser.add_argument("--threads", type=int, default=None,
                        help="OMP/MKL/OpenBLAS threads in each measurement (default: libraries' own)")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    size = "quick" if args.quick else "full"
    if args.case:
        print(json.dumps(run_case(args.case, size)))
        return
    timeout = args.timeout or (60.0 if args.quick else 300.0)
    environment = dict(os.environ)
    if args.threads:
        for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            environment[variable] = str(args.threads)
        os.environ.update({v: environment[v] for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")})
    import torch

    print(
        f"# bench_eigsolvers ({size}); torch {torch.__version__}, {torch.get_num_threads()} torch threads, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; cap {timeout:.0f} s per run"
    )
    header = (
        f"{'case':36s} {'method':38s} {'time_s':>8s} {'ratio':>7s} {'peak_MiB':>9s} {'residual':>9s}"
        "  iterations / note"
    )
    print(header)
    print("-" * len(header))
    anchors: dict[str, float] = {}
    for case_id, section, is_anchor in cases(size):
        command = [sys.executable, str(Path(__file__).resolve()), "--case", case_id]
        command += ["--quick"] if args.quick else []
        try:
            completed = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=environment
            )
            lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
            if completed.returncode != 0 or not lines:
                tail = (completed.stderr.strip().splitlines() or ["no output"])[-1]
                result = {"method": case_id, "error": tail[:80]}
            else:
                result = json.loads(lines[-1])
        except subprocess.TimeoutExpired:
            result = {"method": case_id, "error": f"stopped at the {timeout:.0f} s cap"}
        if "error" in result:
            method = result.get("method", case_id)
            print(f"{section:36s} {method:38s} {'-':>8s} {'-':>7s} {'-':>9s} {'-':>9s}  FAILED: {result['error']}")
            continue
        time_s = result["time_s"]
        if is_anchor:
            anchors[section] = time_s
        ratio = "anchor" if is_anchor else (f"{time_s / anchors[section]:.2f}" if section in anchors else "-")
        residual = result.get("residual")
        residual_text = f"{residual:.1e}" if isinstance(residual, float) else "-"
        detail = " ".join(str(part) for part in (result.get("iterations", ""), result.get("note", "")) if part != "")
        print(
            f"{section:36s} {result['method']:38s} {time_s:8.2f} {ratio:>7s} {result['peak_mib']:9.1f} "
            f"{residual_text:>9s}  {detail}"
        )


if __name__ == "__main__":
    main()

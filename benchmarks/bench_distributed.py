"""adjointgen.petsc at scale: the k smallest eigenpairs of a 2D grid Laplacian with varying
coefficients (``tests/petsc/problem.py``, ``n = N^2``), forward + backward, on 1 and 2 MPI ranks,
against SciPy's single-process ``eigsh`` forward (SuperLU), both by shift-invert about
``SIGMA = 0.0499``, just below the spectrum (``A = L + 0.05 I`` with ``L`` the free-boundary
Laplacian, whose smallest eigenvalue is 0): the gaps of a 10^6-node grid are ~1e-5, so a shift at
0 would leave the factorization a poor preconditioner of the backward's solves.

    python benchmarks/bench_distributed.py              # N = 1000: n = 10^6, k = 8
    python benchmarks/bench_distributed.py --N 300      # a quicker run

Needs the PETSc environment of ``scripts/check-petsc.sh`` (run it once; it leaves the virtualenv
in /tmp/adjointgen-petsc-venv and prints the PETSC_DIR/SLEPC_DIR it used).  Per rank it reports the
forward and backward time and the peak resident memory, and from the memory the run added per
owned row a projection of the ranks a 10^8-row problem needs (linear in the rows: the sparse
factorization's fill grows as n log n in 2D, so it is a lower bound).
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

SIGMA = 0.0499
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _rank_main(N: int, k: int, out: str):
    import petsc4py

    petsc4py.init([])
    from petsc4py import PETSc

    sys.path.insert(0, str(ROOT / "tests" / "petsc"))
    import problem

    import adjointgen.petsc as agp

    mpi = PETSc.COMM_WORLD.tompi4py()
    theta, phi, field = problem.parameters(N)
    theta.requires_grad_()
    A, _ = problem.matrices(N, theta, phi)
    rstart, rend = agp.ownership(N * N)
    rows, cols, values = problem.rows_of(rstart, rend, A)
    pattern = agp.Pattern(rows, cols, N * N)
    del A, rows, cols
    mpi.Barrier()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    w, V = agp.eigsh(values, pattern, k, sigma=SIGMA)
    mpi.Barrier()
    t1 = time.perf_counter()
    loss = problem.loss(w, V, field[rstart:rend], 1.0 / mpi.Get_size())
    loss.backward()
    mpi.Barrier()
    t2 = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    stats = mpi.gather({"forward": t1 - t0, "backward": t2 - t1, "peak_mib": peak / 1024,
                        "added_mib": (peak - base) / 1024, "rows": rend - rstart}, root=0)
    if mpi.Get_rank() == 0:
        Path(out).write_text(json.dumps({"w": w.tolist(), "ranks": stats}))


def _scipy_forward(N: int, k: int):
    import scipy.sparse as sps
    import scipy.sparse.linalg as spla

    sys.path.insert(0, str(ROOT / "tests" / "petsc"))
    import problem

    theta, phi, _ = problem.parameters(N)
    A, _ = problem.matrices(N, theta, phi)
    idx = A.indices().numpy()
    M = sps.csr_matrix((A.values().numpy(), (idx[0], idx[1])), shape=A.shape)
    t0 = time.perf_counter()
    w = spla.eigsh(M, k, sigma=SIGMA, which="LM", tol=1e-10, return_eigenvectors=True)[0]
    return time.perf_counter() - t0, sorted(w.tolist())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--N", type=int, default=1000)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--ranks", default="1,2")
    p.add_argument("--budget-gib", type=float, default=16.0, help="memory per rank for the projection")
    p.add_argument("--rank-main", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank_main:
        return _rank_main(args.N, args.k, args.rank_main)
    n = args.N ** 2
    print(f"2D grid Laplacian, n = {n:,}, k = {args.k} smallest, shift-invert about {SIGMA} (MUMPS), certified")
    t_scipy, w_scipy = _scipy_forward(args.N, args.k)
    print(f"SciPy eigsh forward (one process, SuperLU): {t_scipy:.1f} s")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    rows = []
    for ranks in (int(r) for r in args.ranks.split(",")):
        out = Path(f"/tmp/bench_distributed_{ranks}.json")
        out.unlink(missing_ok=True)
        subprocess.run(["mpirun", "-n", str(ranks), sys.executable, __file__, "--N", str(args.N), "--k", str(args.k),
                        "--rank-main", str(out)], check=True, env=env)
        data = json.loads(out.read_text())
        agree = max(abs(a - b) / abs(b) for a, b in zip(data["w"], w_scipy))
        for r, s in enumerate(data["ranks"]):
            per_row = s["added_mib"] * 2 ** 20 / s["rows"]
            rows.append((ranks, r, s["forward"], s["backward"], s["peak_mib"], per_row, agree))
    print(f"\n{'ranks':>5} {'rank':>4} {'forward s':>9} {'backward s':>10} {'fwd+bwd / SciPy fwd':>19} "
          f"{'peak MiB':>8} {'bytes/row':>9} {'w vs SciPy':>10}")
    for ranks, r, f, b, peak, per_row, agree in rows:
        print(f"{ranks:>5} {r:>4} {f:>9.1f} {b:>10.1f} {(f + b) / t_scipy:>19.2f} {peak:>8.0f} {per_row:>9.0f} "
              f"{agree:>10.1e}")
    worst = max(per_row for *_, per_row, _ in rows)
    need = 1e8 * worst / (args.budget_gib * 2 ** 30)
    print(f"\nprojection to n = 10^8: {worst:.0f} bytes per owned row (the largest measured) x 10^8 rows = "
          f"{1e8 * worst / 2 ** 30:.0f} GiB, so at least {max(1, int(need) + 1)} ranks of {args.budget_gib:g} GiB "
          f"(a lower bound: a 2D factorization's fill grows as n log n)")


if __name__ == "__main__":
    main()

"""One MPI rank of the distributed tests (``mpirun -n R python tests/petsc/worker.py CASE N OUT``).

Cases: ``standard`` / ``generalized`` (with ``sigma=0`` shift-invert: ``standard-si``,
``generalized-si``) write the eigenvalues and the gradients of the problem's parameters (summed
over the ranks) to ``OUT`` (rank 0); ``nan`` puts a NaN in rank 1's values and ``basis`` takes a
basis-dependent loss at a degenerate eigenvalue: every rank writes the message it raised to
``OUT.<rank>``; ``skip`` runs the uniform problem (a repeated eigenvalue) through Krylov-Schur
without shift-invert, which returns one copy of it: the certificate must catch the skip."""
from __future__ import annotations

import json
import os
import sys

import petsc4py

petsc4py.init([])
import numpy as np  # noqa: E402
import torch  # noqa: E402
from petsc4py import PETSc  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import problem  # noqa: E402

import adjointgen.petsc as agp  # noqa: E402


def main(case: str, N: int, out: str, k: int = 4):
    mpi = PETSc.COMM_WORLD.tompi4py()
    rank, size = mpi.Get_rank(), mpi.Get_size()
    theta, phi, field = problem.parameters(N)
    if case in ("basis", "skip"):  # uniform coefficients: the grid's symmetry makes eigenvalues 2 and 3 equal
        theta, phi = torch.zeros_like(theta), torch.zeros_like(phi)
    theta.requires_grad_()
    phi.requires_grad_()
    A, B = problem.matrices(N, theta, phi)
    rstart, rend = agp.ownership(N * N)
    rows, cols, values_A, values_B = problem.rows_of(rstart, rend, A, B)
    pattern = agp.Pattern(rows, cols, N * N)
    values_B = values_B if case.startswith("generalized") else None
    sigma = 0.0 if case.endswith("-si") or case == "basis" else None
    try:
        if case == "nan" and rank == 1:
            values_A = values_A.detach().clone()
            values_A[0] = float("nan")
        # tol: 1e-12 for gradients to 1e-8; the default (1e-10) where Krylov-Schur skips a copy
        w, V = agp.eigsh(values_A, pattern, k, values_B, sigma=sigma, tol=1e-10 if case == "skip" else 1e-12)
        if case == "basis":
            loss = V[:, 1].square().mul(field[rstart:rend]).sum() + 0 * w.sum()
        else:
            loss = problem.loss(w, V, field[rstart:rend], 1.0 / size)
        loss.backward()
    except Exception as e:  # noqa: BLE001 - the test compares what every rank raised
        if os.environ.get("ADJOINTGEN_PETSC_TRACE"):
            import traceback
            traceback.print_exc()
        with open(f"{out}.{rank}", "w") as f:
            f.write(f"{type(e).__name__}: {e}")
        return
    grad_theta = mpi.allreduce(theta.grad.numpy())
    grad_phi = mpi.allreduce(np.zeros(phi.shape) if phi.grad is None else phi.grad.numpy())
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"w": w.tolist(), "theta": grad_theta.tolist(), "phi": grad_phi.tolist()}, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])

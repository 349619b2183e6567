"""adjointgen.petsc on 2 MPI ranks against the single-process agt.eigsh (skipped where petsc4py,
slepc4py, mpi4py or mpirun are missing; CI runs it in its own step, scripts/check-petsc.sh)."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import adjointgen.torch as agt

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("petsc4py", "slepc4py", "mpi4py")) or not shutil.which("mpirun"),
    reason="needs petsc4py, slepc4py, mpi4py and mpirun (scripts/check-petsc.sh)")

HERE = Path(__file__).parent / "petsc"
sys.path.insert(0, str(HERE))
import problem  # noqa: E402


def _mpirun(case, N, tmp_path, ranks=2, timeout=300):
    out = tmp_path / f"{case}.json"
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    # a timeout: a rank that failed alone must not leave the others waiting (the test would hang)
    r = subprocess.run(["mpirun", "-n", str(ranks), sys.executable, str(HERE / "worker.py"), case, str(N), str(out)],
                       capture_output=True, text=True, timeout=timeout, env=env)
    errors = {int(p.suffix[1:]): p.read_text() for p in tmp_path.glob(f"{case}.json.*")}
    result = json.loads(out.read_text()) if out.exists() else None
    assert r.returncode == 0 or errors, r.stdout[-3000:] + r.stderr[-3000:]
    return result, errors


def _reference(N, generalized):
    theta, phi, field = problem.parameters(N)
    theta.requires_grad_()
    phi.requires_grad_()
    A, B = problem.matrices(N, theta, phi)
    w, V = agt.eigsh(A, 4, B if generalized else None, largest=False)
    problem.loss(w, V, field).backward()
    return w.detach().numpy(), theta.grad.numpy(), None if phi.grad is None else phi.grad.numpy()


def _close(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert np.abs(got - want).max() <= 1e-8 * np.abs(want).max(), (np.abs(got - want).max(), np.abs(want).max())


@pytest.mark.parametrize("case,N", [("standard", 100), ("generalized", 100), ("standard-si", 30), ("generalized-si", 30)])
def test_two_ranks_match_the_single_process_gradient(case, N, tmp_path):
    # n = N^2 unknowns; the gradient with respect to the edge coefficients (and the masses), summed
    # over the ranks, against agt.eigsh of the same sparse matrices in one process
    got, errors = _mpirun(case, N, tmp_path)
    assert not errors, errors
    w, g_theta, g_phi = _reference(N, case.startswith("generalized"))
    _close(got["w"], w)
    _close(got["theta"], g_theta)
    if g_phi is not None:
        _close(got["phi"], g_phi)


@pytest.mark.parametrize("case,kind,text", [
    ("nan", "ValueError", "(rank 1): values of A contain NaN"),
    ("basis", "DegenerateSubspaceError", "the loss depends on the basis chosen inside the cluster"),
    ("skip", "ConvergenceError", "not certified"),
])
def test_failures_raise_the_same_error_on_every_rank(case, kind, text, tmp_path):
    got, errors = _mpirun(case, 20, tmp_path, timeout=120)
    assert got is None and sorted(errors) == [0, 1], errors
    assert errors[0] == errors[1], errors
    assert errors[0].startswith(kind) and text in errors[0], errors[0]

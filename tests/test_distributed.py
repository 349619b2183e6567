"""Data-parallel training through adjointgen's functions: ``DistributedDataParallel`` over gloo with
two CPU processes gives the single-process gradients, and a gauge error on one rank fails both
ranks promptly instead of leaving the other waiting in the gradient all-reduce."""
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

WORKER = Path(__file__).with_name("distributed_worker.py")

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def run_ranks(tmp_path, world, mode, timeout=240):
    """Start ``world`` worker processes; return (return codes, results, seconds)."""
    port = free_port()
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(rank), str(world), port, str(tmp_path), mode],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(world)]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"a rank hung for {timeout} s: {outputs}")
    seconds = time.perf_counter() - start
    results = [torch.load(tmp_path / f"rank{rank}.pt") if (tmp_path / f"rank{rank}.pt").exists() else None
               for rank in range(world)]
    return [p.returncode for p in procs], results, seconds, outputs


@pytest.mark.slow  # two ranks started as processes
def test_ddp_gradients_equal_single_process(tmp_path):
    one = tmp_path / "one"
    two = tmp_path / "two"
    one.mkdir()
    two.mkdir()
    codes, (reference,), _, out = run_ranks(one, 1, "train")
    assert codes == [0], out
    codes, results, _, out = run_ranks(two, 2, "train")
    assert codes == [0, 0], out
    for r in results:
        for name in ("W", "M"):
            g, ref = r[name], reference[name]
            assert torch.isfinite(g).all() and ref.abs().max() > 0
            assert float((g - ref).abs().max() / ref.abs().max()) < 1e-12, name
    # the ranks' gradients are the all-reduced average: identical
    assert torch.equal(results[0]["W"], results[1]["W"]) and torch.equal(results[0]["M"], results[1]["M"])


def test_gauge_error_on_one_rank_does_not_hang_the_other(tmp_path):
    codes, results, seconds, out = run_ranks(tmp_path, 2, "degenerate")
    assert codes[0] != 0 and results[0]["error"] == "DegenerateSubspaceError", out
    assert "eigenvalue" in results[0]["message"]  # eigh or eigsh, whichever backward runs first
    # rank 1 finished its own backward and waits in the all-reduce for rank 0's buckets: it fails as
    # soon as rank 0's process exits (gloo closes the connection), long before the 60 s timeout
    assert codes[1] != 0, out
    assert results[1] is not None and results[1]["error"] in ("RuntimeError", "DistBackendError"), out
    assert seconds < 50, f"took {seconds:.0f} s"

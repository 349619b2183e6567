"""One rank of the data-parallel check in ``tests/test_distributed.py`` (run as a script).

    python tests/distributed_worker.py RANK WORLD PORT OUT MODE

A small model whose loss goes through ``agt.eigh``, ``agt.svd``, ``agt.eigsh`` and ``agt.funm`` is
trained one step under ``torch.nn.parallel.DistributedDataParallel`` (gloo, CPU); ``WORLD = 1`` is
the single-process reference on the whole batch. Each rank saves its gradients (or the exception it
raised) to ``OUT/rank{RANK}.pt``.

``MODE``: ``"train"``, or ``"degenerate"``: rank 0's batch makes the eigh input exactly degenerate
under a basis-dependent loss, so that its backward raises ``DegenerateSubspaceError``; rank 1 must not
hang in the gradient all-reduce that rank 0 never joins.
"""
import datetime
import faulthandler
import os
import sys
import traceback

import sympy
import torch
import torch.distributed as dist

import adjointgen.torch as agt

N, BATCH = 6, 8


class SpectralModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.W = torch.nn.Parameter(torch.randn(N, N, dtype=torch.float64, generator=g))
        self.M = torch.nn.Parameter(torch.randn(N + 2, N, dtype=torch.float64, generator=g))

    def forward(self, x, degenerate=False):
        S = self.W + self.W.mT
        # (b, n, n) symmetric with separated spectra; degenerate: diag(x) (x[:, 0] = x[:, 1]: a cluster)
        A = (0.0 if degenerate else 1.0) * S + torch.diag_embed(x)
        w, V = agt.eigh(A)
        P = V[..., -2:] @ V[..., -2:].mT                   # projector: gauge invariant
        loss = (w ** 2).sum(-1) + P[..., 0, :].sum(-1)
        if degenerate:
            loss = loss + V[..., 0, :].pow(3).sum(-1)      # depends on the basis of the cluster
        U, s, Vh = agt.svd(self.M @ torch.diag_embed(x))   # (b, n + 2, n)
        loss = loss + s.sum(-1) + (U[..., :, :1] @ Vh[..., :1, :]).pow(2).sum((-2, -1))
        we, Ve = agt.eigsh(A, 2)
        loss = loss + we.sum(-1) + (Ve @ Ve.mT).diagonal(dim1=-2, dim2=-1).pow(2).sum(-1)
        F = agt.funm(A / 10, sympy.cos(sympy.Symbol("x")))
        return (loss + F.sum((-2, -1))).mean()


def batch(mode):
    g = torch.Generator().manual_seed(1)
    x = 3 * torch.randn(BATCH, N, dtype=torch.float64, generator=g)
    return x


def main():
    rank, world, port, out, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    # a rank still running after 150 s prints every thread's stack and exits: the test shows where it hung
    faulthandler.dump_traceback_later(150, exit=True)
    torch.set_num_threads(1)
    model = SpectralModel()
    x = batch(mode)
    result = {}
    try:
        if world > 1:
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
            dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
            model = torch.nn.parallel.DistributedDataParallel(model)
            x = x.chunk(world)[rank]
        degenerate = mode == "degenerate" and rank == 0
        if degenerate:
            x = x.clone()
            x[:, 1] = x[:, 0]
        loss = model(x, degenerate=degenerate)
        loss.backward()
        module = model.module if world > 1 else model
        result = {"W": module.W.grad, "M": module.M.grad, "loss": loss.detach()}
    except Exception as exc:  # recorded for the parent test, printed: the process fails
        result = {"error": type(exc).__name__, "message": str(exc), "trace": traceback.format_exc()}
        torch.save(result, os.path.join(out, f"rank{rank}.pt"))
        traceback.print_exc()
        _exit(1)
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    if world > 1:
        dist.destroy_process_group()
    _exit(0)


def _exit(code):
    """Leave without tearing down: freeing DDP's reducer after ``destroy_process_group`` hung one run
    in twenty (both ranks' results saved; rank 1 stuck in C++ destructors with no Python frame, as
    ``faulthandler`` showed), so the process ends here, its results written."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()

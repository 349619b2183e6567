"""A 2D grid eigenproblem for the distributed tests and benchmark: ``A`` a Laplacian with a
coefficient ``exp(theta_e)`` per edge plus ``0.05 I``; ``B`` a mass matrix ``diag(exp(phi))`` plus
``0.05`` times the unit Laplacian (symmetric positive definite, ``A``'s pattern)."""
from __future__ import annotations

import torch


def parameters(N: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    m = 2 * N * (N - 1)
    theta = 0.5 * torch.randn(m, dtype=torch.float64, generator=g)
    phi = 0.3 * torch.randn(N * N, dtype=torch.float64, generator=g)
    field = torch.rand(N * N, dtype=torch.float64, generator=g)  # weights of the loss
    return theta, phi, field


def matrices(N: int, theta: torch.Tensor, phi: torch.Tensor):
    """The global ``A`` and ``B`` (coalesced sparse COO, same pattern), differentiable in the
    parameters."""
    n = N * N
    idx = torch.arange(n).reshape(N, N)
    edges = torch.cat([torch.stack([idx[:, :-1].reshape(-1), idx[:, 1:].reshape(-1)]),
                       torch.stack([idx[:-1, :].reshape(-1), idx[1:, :].reshape(-1)])], 1)
    i, j = edges
    d = torch.arange(n)
    rows, cols = torch.cat([i, j, i, j, d]), torch.cat([j, i, i, j, d])
    kappa = theta.exp()
    unit = torch.full_like(kappa, 0.05)
    A = torch.sparse_coo_tensor(torch.stack([rows, cols]),
                                torch.cat([-kappa, -kappa, kappa, kappa, torch.full((n,), 0.05, dtype=theta.dtype)]),
                                (n, n)).coalesce()
    B = torch.sparse_coo_tensor(torch.stack([rows, cols]), torch.cat([-unit, -unit, unit, unit, phi.exp()]),
                                (n, n)).coalesce()
    return A, B


def loss(w, V, field_rows, weight=1.0):
    """``weight * sum(c * w) + sum(V**2 * field)`` (sign-free); a rank passes its rows of the field
    and ``weight = 1 / size`` so that the ranks' losses sum to the single-process one."""
    c = torch.arange(1, w.shape[0] + 1, dtype=w.dtype)
    return weight * (c * w).sum() + (V ** 2 * field_rows[:, None]).sum()


def rows_of(rstart: int, rend: int, *matrices):
    """This rank's share of coalesced sparse matrices with one pattern: ``(rows, cols)`` of the
    stored entries in rows ``[rstart, rend)`` and each matrix's values there (differentiable)."""
    rows, cols = matrices[0].indices()
    mine = (rows >= rstart) & (rows < rend)
    return rows[mine], cols[mine], *(M.values()[mine] for M in matrices)

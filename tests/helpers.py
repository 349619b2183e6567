"""Shared numerics for the tests: symmetric directions, gauge-invariant losses, FD."""
import torch


def sym(X):
    return 0.5 * (X + X.mT)


def random_symmetric(*shape, dtype=torch.float64, gap=None, generator=None):
    X = torch.randn(*shape, dtype=dtype, generator=generator)
    return sym(X)


def gauge_invariant_eigh_loss(w, V, weights):
    """Depends on V only through projectors V_i V_i^T (sign-invariant), on w through powers."""
    n = V.shape[-1]
    k = max(1, n // 2)
    P = V[..., :, :k] @ V[..., :, :k].mT
    return (w.pow(2) * torch.linspace(0.5, 1.5, n, dtype=w.dtype)).sum() + (P * weights).sum() + (V.pow(2) * weights).sum()


def rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-300))

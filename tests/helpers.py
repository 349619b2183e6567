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
    return (w.pow(2) * torch.linspace(0.5, 1.5, n, dtype=w.dtype, device=w.device)).sum() + (P * weights).sum() + (V.pow(2) * weights).sum()


def rel(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def spd(n, cond, *, dtype=torch.float64, seed=0, batch=()):
    """Random SPD matrix with the given condition number (log-spaced spectrum)."""
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(*batch, n, n, dtype=torch.float64, generator=g))
    s = torch.logspace(0, float(torch.log10(torch.tensor(cond))), n, dtype=torch.float64)
    return sym((Q * s) @ Q.mT).to(dtype)


def reference_generalized_eigh(A, B):
    """Dense reference: Cholesky reduction and torch.linalg.eigh, differentiated by autograd."""
    L = torch.linalg.cholesky(B)
    C = torch.linalg.solve_triangular(L, torch.linalg.solve_triangular(L, A, upper=False).mT, upper=False)
    w, Y = torch.linalg.eigh(sym(C))
    return w, torch.linalg.solve_triangular(L.mT, Y, upper=True)

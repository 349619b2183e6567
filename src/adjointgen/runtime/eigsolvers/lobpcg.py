"""The LOBPCG route: torch operations only, so it runs on any device and with matvec closures for B.

Part of :mod:`adjointgen.runtime.eigsolvers` (its docstring describes the routes and certificates)."""
from __future__ import annotations

import math
import torch

from ..errors import ConvergenceError
from .common import _LOBPCG_DEFAULT_MAXITER, _SEED, _apply_B, _b_gram_cholesky, _b_orthonormalize_svqb, _random_block

# ---------------------------------------------------------------------------------------------------
# LOBPCG route (torch, any device)
# ---------------------------------------------------------------------------------------------------


def _solve_lobpcg(opA, opB, m, largest, tol, maxiter, normA, normB, *, k=None, X0=None, seed=_SEED):
    """``m`` extreme pairs by block LOBPCG; returns ``(w, U, iterations, products)``. ``X0``: start
    vectors (completed by random ones to the block size); ``k``: the pairs the caller asked for
    (errors name it and report their residual)."""
    n = opA.shape[0]
    k = m if k is None else k
    dtype, device = opA.dtype, opA.device
    eps = torch.finfo(dtype).eps
    drop_rtol = 100 * eps
    sign = -1.0 if largest else 1.0  # minimise sign * A
    block = max(m, min(2 * m, n // 3))
    if maxiter is None:
        maxiter = _LOBPCG_DEFAULT_MAXITER
    products = 0

    def rayleigh_ritz(Z, AZ, BZ):
        L = _b_gram_cholesky(Z.mH @ BZ)
        H = Z.mH @ AZ
        H = (H + H.mH) / 2
        Hr = torch.linalg.solve_triangular(L, H, upper=False)
        Hr = torch.linalg.solve_triangular(L, Hr.mH, upper=False)
        theta, C = torch.linalg.eigh(sign * (Hr + Hr.mH) / 2)
        C = torch.linalg.solve_triangular(L.mH, C, upper=True)
        return sign * theta, C

    def combine(Y, BY, C):
        """``(Y C, B Y C)`` without a second product when ``B`` is the identity."""
        YC = Y @ C
        return YC, (YC if opB is None else BY @ C)

    X = _random_block(n, block, dtype, device, seed)
    if X0 is not None:
        start = X0.to(dtype=dtype, device=device)[:, :block]
        X = torch.cat([start, X[:, start.shape[1]:]], dim=1)
    BX = _apply_B(opB, X)
    T = _b_orthonormalize_svqb(X, BX, drop_rtol)
    X, BX = combine(X, BX, T)
    AX = opA.matmul(X)
    products += X.shape[1]
    theta, C = rayleigh_ritz(X, AX, BX)
    (X, BX), AX = combine(X, BX, C[:, :block]), AX @ C[:, :block]
    theta = theta[:block]
    P = None
    residual = torch.full((block,), math.inf, dtype=dtype.to_real(), device=device)
    for iteration in range(1, maxiter + 1):
        R = AX - BX * theta
        scale = (normA + theta.abs() * normB) * torch.linalg.vector_norm(X, dim=0)
        residual = torch.linalg.vector_norm(R, dim=0) / scale.clamp_min(torch.finfo(dtype).tiny)
        converged = residual <= tol
        if bool(converged[:m].all()):
            return theta[:m], X[:, :m], iteration - 1, products
        active = ~converged
        active[m:] = True  # guard vectors keep improving the wanted ones
        W = R[:, active]
        S = W if P is None else torch.cat([W, P], dim=1)
        for _ in range(2):  # B-orthogonalise against X (twice is enough)
            S = S - X @ (BX.mH @ S)
        BS = _apply_B(opB, S)
        T = _b_orthonormalize_svqb(S, BS, drop_rtol)
        if T.shape[1] == 0:
            break
        S, BS = combine(S, BS, T)
        AS = opA.matmul(S)
        products += S.shape[1]
        Z, AZ = torch.cat([X, S], 1), torch.cat([AX, AS], 1)
        BZ = Z if opB is None else torch.cat([BX, BS], 1)
        theta_all, C = rayleigh_ritz(Z, AZ, BZ)
        C = C[:, :block]
        (X, BX), AX = combine(Z, BZ, C), AZ @ C
        theta = theta_all[:block]
        C_rest = C[block:]
        P = S @ C_rest
    raise ConvergenceError(
        f"partial_eigh: LOBPCG did not converge for the {k} wanted eigenpairs of an n = {n} problem",
        method="lobpcg", residual=float(residual[:k].max()), tol=tol, iterations=maxiter,
    )

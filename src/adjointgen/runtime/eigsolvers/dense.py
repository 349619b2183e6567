"""The dense route: LAPACK's subset solvers (or torch.linalg.eigh) on an explicit matrix.

Part of :mod:`adjointgen.runtime.eigsolvers` (its docstring describes the routes and certificates)."""
from __future__ import annotations

import math
from typing import Any
import numpy as np
import torch

from ..errors import ConvergenceError
from .common import _dense_matrix, _not_positive_definite

# ---------------------------------------------------------------------------------------------------
# dense route
# ---------------------------------------------------------------------------------------------------


def _solve_dense(opA, opB, m: int, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``m`` extreme eigenpairs (any order) by a dense direct solver."""
    n = opA.shape[0]
    A = _dense_matrix(opA)
    B = None if opB is None else _dense_matrix(opB)
    subset = [n - m, n - 1] if largest else [0, m - 1]
    if A.device.type == "cpu":
        import scipy.linalg

        a = A.detach().resolve_conj().numpy()
        b = None if B is None else B.detach().resolve_conj().numpy()
        if m == n:
            subset_kw: dict[str, Any] = {"driver": "evd" if b is None else "gvd"}
        else:
            subset_kw = {"subset_by_index": subset, "driver": "evr" if b is None else "gvx"}
        try:
            w, V = scipy.linalg.eigh(a, b, lower=True, check_finite=False, **subset_kw)
        except np.linalg.LinAlgError as exc:
            if b is not None and "positive definite" in str(exc):
                raise _not_positive_definite(f"LAPACK: {exc}") from None
            raise ConvergenceError(
                f"partial_eigh: dense LAPACK solver failed: {exc}", method="dense", residual=math.inf,
                tol=0.0, iterations=0,
            ) from None
        return torch.from_numpy(np.ascontiguousarray(w)), torch.from_numpy(np.ascontiguousarray(V))
    if B is None:
        w, V = torch.linalg.eigh(A)
    else:
        L, info = torch.linalg.cholesky_ex(B)
        if int(info) != 0:
            raise _not_positive_definite(f"Cholesky failed at leading minor {int(info)}")
        C = torch.linalg.solve_triangular(L, A, upper=False)
        C = torch.linalg.solve_triangular(L, C.mH, upper=False)
        w, V = torch.linalg.eigh((C + C.mH) / 2)
        V = torch.linalg.solve_triangular(L.mH, V, upper=True)
    keep = slice(n - m, n) if largest else slice(0, m)
    return w[keep], V[:, keep]

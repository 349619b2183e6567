"""Forwards of the auxiliary-output test derivation: torch (differentiable by torch), a host
round trip torch cannot differentiate, and one for NumPy and JAX arrays."""
import sys

import numpy as np
import torch


def symexp(A):
    w, V = torch.linalg.eigh(A)
    return (V * torch.exp(w).unsqueeze(-2)) @ V.mH, w, V


def symexp_host(A):
    X, w, V = symexp_array(A.detach().cpu().numpy())
    return tuple(torch.from_numpy(np.ascontiguousarray(t)).to(A) for t in (X, w, V))


def symexp_array(A):
    jax = sys.modules.get("jax")
    xp = jax.numpy if jax is not None and isinstance(A, jax.Array) else np
    w, V = xp.linalg.eigh(A)
    return (V * xp.exp(w)[..., None, :]) @ xp.swapaxes(V, -1, -2), w, V

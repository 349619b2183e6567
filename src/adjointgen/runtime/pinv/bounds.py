"""Randomized bounds on sigma_max and on sigma_min (power iterations on the factor and its inverse).

Part of :mod:`adjointgen.runtime.pinv` (its docstring says what the whole guarantees)."""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch

from .common import N_PROBES, SIGMA_SLACK, _PROBE_SEED, _STAGE_PROBABILITY
from .arguments import _outside_functorch

# --------------------------------------------------------------------------------------------------
# randomized norm bounds
# --------------------------------------------------------------------------------------------------


def _per_probe_failure(probability: float) -> float:
    return probability ** (1.0 / N_PROBES)


def _levels_needed(n: int, probability: float = _STAGE_PROBABILITY) -> int:
    """Smallest L with ``(0.8 sqrt(n) SIGMA_SLACK^-L)^N_PROBES <= probability`` (at least 2)."""
    ratio = 0.8 * math.sqrt(max(n, 1)) / _per_probe_failure(probability)
    return max(2, math.ceil(math.log(ratio) / math.log(SIGMA_SLACK)))


def _slack(n: int, levels: int, probability: float = _STAGE_PROBABILITY) -> float:
    """Smallest slack ``s >= 1`` with ``(0.8 sqrt(n) s^-levels)^N_PROBES <= probability``."""
    ratio = 0.8 * math.sqrt(max(n, 1)) / _per_probe_failure(probability)
    return max(1.0, ratio ** (1.0 / levels))


def _probes(batch_shape, n: int, dtype: torch.dtype, device: torch.device, stream: int) -> torch.Tensor:
    """Gaussian probes (uniform directions on the real or complex sphere), private fixed-seed RNG.

    Drawn by NumPy, not by a torch random operation: inside ``jacfwd``/``hessian`` (and gradcheck's
    batched forward-mode check, which uses the older ``torch._vmap_internals``) a ``vmap`` level is
    active even though ``A`` is a plain tensor, and a random operation there would raise in vmap's
    default ``randomness="error"`` mode. The probes do not depend on ``A``, so a plain tensor is right.
    """
    import numpy as np

    rng = np.random.default_rng(_PROBE_SEED + stream)
    real = torch.empty((), dtype=dtype).real.dtype
    shape = (*batch_shape, n, N_PROBES)
    draw = rng.standard_normal(shape)
    if dtype.is_complex:
        draw = draw + 1j * rng.standard_normal(shape)
    with _outside_functorch():
        out = torch.from_numpy(draw)
        return out.to(dtype=dtype if dtype.is_complex else real, device=device)


class _PowerIteration:
    """``N_PROBES`` probes pushed through ``operators`` (applied cyclically), resumable.

    Each application counts ``levels_per_application`` levels (2 for a Gram-type operator whose norm
    is ``sigma^2``). Vectors are renormalised after every application and the log norms summed, so
    nothing overflows. A breakdown (inf/NaN from a singular factor) yields inf/NaN, which every
    acceptance test rejects.
    """

    def __init__(
        self,
        operators: Sequence[Callable[[torch.Tensor], torch.Tensor]],
        start: Callable[[], torch.Tensor],
        levels_per_application: int,
    ):
        self.operators = operators
        self.levels_per_application = levels_per_application
        self.start = start  # drawn on the first application: an iteration that never runs costs nothing
        self.v: Optional[torch.Tensor] = None
        self.log_growth: Optional[torch.Tensor] = None
        self.applications = 0

    @property
    def levels(self) -> int:
        return self.applications * self.levels_per_application

    def run(self, levels: int) -> None:
        """Iterate on until at least ``levels`` levels have been run."""
        if self.levels >= levels:
            return
        if self.v is None:
            start = self.start()
            self.v = start / torch.linalg.vector_norm(start, dim=-2, keepdim=True)
            self.log_growth = torch.zeros_like(self.v[..., :1, :].real)
        tiny = torch.finfo(self.log_growth.dtype).tiny
        while self.levels < levels:
            v = self.operators[self.applications % len(self.operators)](self.v)
            norm = torch.linalg.vector_norm(v, dim=-2, keepdim=True)
            self.log_growth = self.log_growth + torch.log(norm)
            self.v = v / norm.clamp_min(tiny)
            self.applications += 1

    def growth(self) -> torch.Tensor:
        """Largest over the probes of ``‖v_L‖^(1/L)``, shape ``batch``."""
        return torch.exp(self.log_growth.amax(dim=-1).squeeze(-1) / self.levels)

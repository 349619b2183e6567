"""The constants of the decision, the result record PinvInfo, the logger.

Part of :mod:`adjointgen.runtime.pinv` (its docstring says what the whole guarantees)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional, Union

import torch

_log = logging.getLogger("adjointgen.pinv")

Tolerance = Union[None, float, int, torch.Tensor]

#: A fast path needs ``sigma_min_lo > CUTOFF_MARGIN * cutoff_up``.
CUTOFF_MARGIN = 10.0
#: Largest per-level slack of the full stage (see the module docstring).
SIGMA_SLACK = 1.5
#: Independent random probes per power iteration.
N_PROBES = 16
#: Each of the two bounds (sigma_min, sigma_max) of each matrix is wrong with at most this
#: probability, both stages together (each stage gets half).
FAILURE_PROBABILITY = 1e-12
#: Levels of the quick stage: LU and Hermitian Cholesky (upper bound ‖A‖_F), Gram route.
QUICK_LEVELS = {"lu": 2, "hermitian": 2, "gram": 4}
#: The Gram route is refused when the rounding correction exceeds this fraction of the bound.
GRAM_CORRECTION_MAX = 0.25
#: ``hermitian=True`` requires ``‖A - A^H‖_F <= SYMMETRY_FACTOR * n * eps * ‖A‖_F``.
SYMMETRY_FACTOR = 10.0
_PROBE_SEED = 0x5EED_9F1
_STAGE_PROBABILITY = FAILURE_PROBABILITY / 2


@dataclass(frozen=True)
class PinvInfo:
    """How ``pinv_forward`` computed its result.

    Attributes:
        method: ``"lu"``, ``"cholesky"``, ``"qr"`` (fast paths), ``"svd"`` or ``"eigh"``
            (``torch.linalg.pinv``).
        reason: one sentence saying why this method was chosen, with the numbers that decided it.
        sigma_min_est: smallest lower bound on ``sigma_min`` over the batch (``None`` when not
            estimated or when the factorization broke down).
        sigma_max_est: largest upper bound on ``sigma_max`` over the batch (``None`` when not estimated).
        cutoff: largest upper bound on torch's cutoff ``max(atol, rtol * sigma_max)`` over the batch.
        levels: power-iteration levels run for the lower bound on ``sigma_min`` (0 when none ran):
            ``QUICK_LEVELS[...]`` when the quick stage decided, more when the full stage ran.
    """

    method: str
    reason: str
    sigma_min_est: Optional[float]
    sigma_max_est: Optional[float]
    cutoff: Optional[float]
    levels: int = 0

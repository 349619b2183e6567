import os

if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    # the workers share the cores: one BLAS/OpenMP thread each (set before NumPy and torch load)
    os.environ["OMP_NUM_THREADS"] = "1"
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

#: ``-n auto`` (pyproject's addopts) runs this many pytest-xdist workers: one per core, at most
#: MAX_WORKERS (each imports torch and JAX; beyond that the subprocess-heavy tests gain nothing)
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config):
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1))


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture
def rng():
    return np.random.default_rng(1234)



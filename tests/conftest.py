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




#: tests of the default run moved to the slow step (``-m slow``, which CI runs too) to keep the
#: README's command under 6 minutes on 2 cores: each took 5-20 s under ``--durations=0`` and repeats a
#: check a lighter test of the default run makes (the complex twin of a real case, a second sample of
#: a function, a second compile of the same function); node-id prefixes
SLOW_IN_DEFAULT = (
    "tests/test_architecture.py::test_a_finished_derivation_is_a_frozen_spec_that_no_stage_writes[svds]",
    "tests/test_torch_semantics.py::test_every_function_runs_under_torch_compile[solve vector]",
    "tests/test_jax_strict.py::test_lax_eig_left_and_right_eigenvectors_and_geev_normalization[complex128]",
    "tests/test_jax_strict.py::test_complete_qr_of_a_tall_matrix_span_exact_basis_raises[complex128]",
    "tests/test_jax_strict.py::test_values_dtypes_and_derivatives_match_jax_under_strict_promotion[lu wide-complex128]",
    "tests/test_jax_strict.py::test_values_dtypes_and_derivatives_match_jax_under_strict_promotion[svd-complex128]",
    "tests/test_jax_strict.py::test_values_dtypes_and_derivatives_match_jax_under_strict_promotion[eigh-complex128]",
    "tests/test_jax.py::test_float32_keeps_its_dtype_and_agrees_with_float64[svd]",
    "tests/test_jax.py::test_lapack_basis_of_exact_clusters_does_not_hide_basis_dependence[zero]",
    "tests/test_second_order_clusters.py::test_no_false_gauge_errors_in_second_derivatives_of_an_invariant_loss[eigsh-complex]",
    "tests/test_second_order_clusters.py::test_no_false_gauge_errors_in_second_derivatives_of_an_invariant_loss[eigsh(A, B)-complex]",
    "tests/test_second_order_clusters.py::test_no_false_gauge_errors_in_second_derivatives_of_an_invariant_loss[eigh(A, B)-complex]",
    "tests/test_second_order_clusters.py::test_gradgradcheck_at_a_cluster[svd_tall-complex-",
    "tests/test_second_order_clusters.py::test_gradgradcheck_at_a_cluster[eigh_generalized_in_B-complex-",
    "tests/test_eigsh_aids.py::test_krylov_budget_hands_over_to_the_direct_solver[smallest]",
    "tests/test_eigsh_aids.py::test_block_lanczos_route_certifies_and_preconditions[smallest]",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(SLOW_IN_DEFAULT):
            item.add_marker(pytest.mark.slow)

"""``adjointgen.jax`` stands in for ``jax.numpy.linalg`` and ``agj.scipy`` for ``jax.scipy.linalg``
as whole namespaces: the decompositions with derived rules (``schur``, ``polar``, ``solve_sylvester``
in SciPy's signatures too), the rest as JAX has it."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import jax.scipy.linalg as jsl  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import adjointgen.jax as agj  # noqa: E402


def test_every_function_of_both_namespaces_is_here():
    for namespace, ours in ((jnp.linalg, agj), (jsl, agj.scipy)):
        names = [n for n in dir(namespace) if not n.startswith("_") and callable(getattr(namespace, n))
                 and not isinstance(getattr(namespace, n), type)]
        assert not [n for n in names if not hasattr(ours, n)], namespace.__name__
    assert agj.vector_norm is jnp.linalg.vector_norm and agj.scipy.toeplitz is jsl.toeplitz
    assert agj.scipy.polar is not jsl.polar and "vector_norm" in dir(agj)


def _mats(seed=0):
    rng = np.random.default_rng(seed)
    A = jnp.asarray(rng.standard_normal((4, 4)) + 4 * np.eye(4))
    B = jnp.asarray(rng.standard_normal((4, 4)) + 4 * np.eye(4))
    C = jnp.asarray(rng.standard_normal((4, 4)))
    return A, B, C


def test_scipy_signatures_match_jax_values_and_have_derivatives():
    A, B, C = _mats()
    T, Z = agj.scipy.schur(A, output="complex")
    T0, Z0 = jsl.schur(A, output="complex")
    assert np.abs(np.asarray(T) - np.asarray(T0)).max() < 1e-12 and np.abs(np.asarray(Z) - np.asarray(Z0)).max() < 1e-12
    import scipy.linalg

    for side in ("right", "left"):  # both orientations (JAX's own QDWH takes tall A with side='right' only)
        for got, want in zip(agj.scipy.polar(A[:, :3], side=side), scipy.linalg.polar(np.asarray(A[:, :3]), side=side)):
            assert got.shape == want.shape and np.abs(np.asarray(got) - np.asarray(want)).max() < 1e-12
    X = agj.scipy.solve_sylvester(A, B, C)
    assert np.abs(np.asarray(X) - np.asarray(jsl.solve_sylvester(A, B, C))).max() < 1e-12
    check_grads(lambda a: jnp.abs(agj.scipy.schur(a, output="complex")[0]), (A,), order=1, modes=("rev",))
    check_grads(lambda a: agj.scipy.polar(a, side="left"), (A[:3],), order=2, modes=("fwd", "rev"))
    check_grads(lambda a, b, c: agj.scipy.solve_sylvester(a, b, c), (A, B, C), order=1, modes=("fwd", "rev"))

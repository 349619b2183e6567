"""JAX: a triangular factor the rules invert with a pivot at rounding level (a numerically
rank-deficient QR or Cholesky input) raises where the values are concrete and gives NaN under
``jit``, in forward and reverse mode: its derivative has no correct digits."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import adjointgen.jax as agj  # noqa: E402
from adjointgen.runtime.checks import SingularMatrixError  # noqa: E402


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


def _loss(A):
    Q, R = agj.qr(A)
    return jnp.sum(R ** 2) + jnp.sum(Q[:, :1])


RANK_ONE = np.outer(np.arange(1, 6.0), np.arange(1, 4.0))


def test_rank_deficient_qr_raises_with_concrete_values():
    with pytest.raises(SingularMatrixError, match=r"qr: the derivative divides by the diagonal of R"):
        jax.grad(_loss)(RANK_ONE)
    with pytest.raises(SingularMatrixError, match="rank deficient"):
        jax.jvp(_loss, (RANK_ONE,), (np.ones_like(RANK_ONE),))


def test_rank_deficient_qr_is_nan_under_jit_in_both_modes():
    assert np.isnan(np.asarray(jax.jit(jax.grad(_loss))(RANK_ONE))).all()
    _, t = jax.jit(lambda A, E: jax.jvp(_loss, (A,), (E,)))(RANK_ONE, np.ones_like(RANK_ONE))
    assert np.isnan(float(t))


def test_only_the_singular_batch_element_is_nan():
    A = np.stack([RANK_ONE, np.random.default_rng(0).standard_normal((5, 3))])
    g = jax.jit(jax.vmap(jax.grad(_loss)))(A)
    assert np.isnan(np.asarray(g[0])).all()
    want = jax.grad(_loss)(A[1])
    np.testing.assert_allclose(np.asarray(g[1]), np.asarray(want), rtol=1e-12, atol=1e-12)


def test_full_rank_gradient_is_unchanged_by_the_check():
    A = np.random.default_rng(1).standard_normal((5, 3))
    eager, jitted = jax.grad(_loss)(A), jax.jit(jax.grad(_loss))(A)
    assert np.isfinite(np.asarray(eager)).all()
    np.testing.assert_allclose(np.asarray(eager), np.asarray(jitted), rtol=1e-12, atol=1e-12)
    # against central differences along a random direction
    E = np.random.default_rng(2).standard_normal(A.shape)
    h = 1e-6
    fd = (float(_loss(A + h * E)) - float(_loss(A - h * E))) / (2 * h)
    assert abs(float(jnp.sum(eager * E)) - fd) < 1e-7 * max(1.0, abs(fd))


@pytest.mark.parametrize("scale", [1e-300, 1.0, 1e300])
def test_well_conditioned_factors_pass_at_every_scale(scale):
    """The pivot test is homogeneous: entries near 1e300 (whose squares overflow) or 1e-300 pass
    where the factor is well conditioned (once, the norms overflowed and raised a false error)."""
    A = np.array([[3.0, 1.0, 0.5], [1.0, 4.0, 1.0], [0.5, 1.0, 5.0], [1.0, 0.0, 1.0]]) * scale
    g = jax.grad(lambda A: jnp.sum(agj.qr(A)[1]) / scale)(A)
    assert np.isfinite(np.asarray(g)).all()
    S = np.array([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]])
    g = jax.grad(lambda S: jnp.sum(agj.cholesky(S)))(S * scale)
    reference = jax.grad(lambda S: jnp.sum(agj.cholesky(S)))(S)
    np.testing.assert_allclose(np.asarray(g) * np.sqrt(scale), np.asarray(reference), rtol=1e-12)  # L(sS) = sqrt(s) L(S)
    with pytest.raises(SingularMatrixError):
        jax.grad(_loss)(RANK_ONE * scale)

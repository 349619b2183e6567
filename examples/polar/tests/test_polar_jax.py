"""The JAX function generated from the same derivation: the torch layer's values and gradients, and
JAX's own gradient checker to second order in both modes, real and complex."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

from polar_layer._adjoint.jax.polar import polar  # noqa: E402


def problem(seed=0, complex_=False, n=4):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((n, n)) + (1j * rng.standard_normal((n, n)) if complex_ else 0)
    return jnp.asarray(A + 2 * np.sqrt(n) * np.eye(n))


@pytest.mark.parametrize("complex_", [False, True], ids=["real", "complex"])
def test_check_grads_to_second_order(complex_):
    A = problem(1, complex_)

    def loss(a):
        U, P = polar(a)
        return jnp.real(jnp.sum(U[0] * jnp.conj(U[1])) + jnp.sum(jnp.abs(P) ** 2))

    check_grads(loss, (A,), order=2, modes=("fwd", "rev"))


def test_matches_the_torch_layer():
    torch = pytest.importorskip("torch")
    from polar_layer._adjoint.torch.polar import polar as torch_polar

    A = problem(2)
    t = torch.tensor(np.asarray(A)).requires_grad_()
    U, P = torch_polar(t)
    gt, = torch.autograd.grad((U[0] ** 2).sum() + (P ** 3).sum(), t)
    g = jax.grad(lambda a: (polar(a)[0][0] ** 2).sum() + (polar(a)[1] ** 3).sum())(A)
    np.testing.assert_allclose(np.asarray(polar(A)[0]), U.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(np.asarray(g), gt.numpy(), atol=1e-11)
    # under jit and vmap too
    batch = jnp.stack([A, problem(3)])
    np.testing.assert_allclose(jax.jit(jax.vmap(lambda a: polar(a)[1]))(batch)[0], P.detach().numpy(), atol=1e-12)

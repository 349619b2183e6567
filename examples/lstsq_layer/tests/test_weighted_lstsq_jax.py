"""The JAX function generated from the same derivation: values and gradients equal to the torch
layer's, and JAX's own gradient checker in both modes."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

from lstsq_layer._adjoint.jax.weighted_lstsq import weighted_lstsq  # noqa: E402


def problem(seed=0):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((7, 3))
    Q = np.linalg.qr(rng.standard_normal((7, 7)))[0]
    W = (Q * np.linspace(0.5, 2.0, 7)) @ Q.T
    return jnp.asarray(A), jnp.asarray(0.5 * (W + W.T)), jnp.asarray(rng.standard_normal((7, 2)))


def test_matches_the_torch_layer_in_value_and_gradient():
    torch = pytest.importorskip("torch")
    from lstsq_layer._adjoint.torch.weighted_lstsq import weighted_lstsq as torch_layer

    A, W, B = problem()
    ts = [torch.tensor(np.asarray(x)).requires_grad_() for x in (A, W, B)]
    out = torch_layer(*ts)
    np.testing.assert_allclose(weighted_lstsq(A, W, B), out.detach().numpy(), atol=1e-12)
    torch_grads = torch.autograd.grad((out ** 2).sum(), ts)
    jax_grads = jax.grad(lambda *xs: jnp.sum(weighted_lstsq(*xs) ** 2), argnums=(0, 1, 2))(A, W, B)
    for g, t in zip(jax_grads, torch_grads):
        np.testing.assert_allclose(g, t.numpy(), atol=1e-10)


def test_check_grads_both_modes_under_jit():
    A, W, B = problem(1)
    check_grads(jax.jit(weighted_lstsq), (A, W, B), order=2, modes=("fwd", "rev"))

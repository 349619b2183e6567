"""Reverse mode of the generated JAX functions runs the derived VJP: the derived JVP is one linear
primitive (``adjointgen.runtime.jax.linear_rule``) whose transpose is the VJP; forward mode runs the
JVP, and derivatives of either differentiate the JVP's operations."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from adjointgen.runtime import jax as rt  # noqa: E402
from adjointgen.runtime.rules import Call  # noqa: E402


def _square_map(scale_back):
    """A toy operation ``X = A^2``: JVP ``dX = A dA + dA A``; its transpose is
    ``gA = A^H gX + gX A^H``, returned times ``scale_back`` (a wrong VJP for 2)."""

    def jvp(A, dA):
        return (A @ dA + dA @ A,)

    def vjp(A, gX):
        AH = jnp.conj(jnp.swapaxes(A, -1, -2))
        return (scale_back * (AH @ gX + gX @ AH),)

    call, back = Call(jvp, ("A", "dA")), Call(vjp, ("A", "gX"))

    @jax.custom_jvp
    def square(A):
        return A @ A

    @square.defjvp
    def _(primals, tangents):
        (A,), (dA,) = primals, tangents
        (dX,) = rt.linear_rule("square", call, back, {"A": A, "dA": dA}, ("dA",), ("gX",))
        return square(A), dX

    return square


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_reverse_mode_is_the_given_vjp_and_forward_mode_the_jvp(dtype):
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        A = jnp.asarray(rng.standard_normal((3, 3)).astype(dtype) + (1j * rng.standard_normal((3, 3)) if dtype == np.complex128 else 0))
        W = jnp.asarray(rng.standard_normal((3, 3)))
        dA = jnp.asarray(rng.standard_normal((3, 3)).astype(dtype))

        def loss(square):
            return lambda A: jnp.sum(jnp.real(square(A) * W))

        exact = jax.grad(loss(lambda A: A @ A))(A)
        np.testing.assert_allclose(jax.grad(loss(_square_map(1.0)))(A), exact, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(jax.jit(jax.grad(loss(_square_map(1.0))))(A), exact, rtol=1e-13, atol=1e-13)
        # a VJP twice the transpose shows in reverse mode only: the primitive's transpose is the VJP
        np.testing.assert_allclose(jax.grad(loss(_square_map(2.0)))(A), 2 * exact, rtol=1e-13, atol=1e-13)
        tangent = jax.jvp(_square_map(2.0), (A,), (dA,))[1]
        np.testing.assert_allclose(tangent, A @ dA + dA @ A, rtol=1e-13, atol=1e-13)


def test_second_derivatives_and_vmap_through_the_primitive():
    with jax.enable_x64(True):
        rng = np.random.default_rng(1)
        A = jnp.asarray(rng.standard_normal((3, 3)))
        W = jnp.asarray(rng.standard_normal((3, 3)))
        ours, ref = (lambda A: jnp.sum(_square_map(1.0)(A) @ A * W)), (lambda A: jnp.sum(A @ A @ A * W))
        for transform in (jax.hessian, lambda f: jax.jacrev(jax.jacrev(f)), lambda f: jax.jacfwd(jax.jacrev(f)),
                          lambda f: jax.jacfwd(jax.jacfwd(f))):
            np.testing.assert_allclose(transform(ours)(A), transform(ref)(A), rtol=1e-12, atol=1e-12)
        batch = jnp.asarray(rng.standard_normal((4, 3, 3)))
        np.testing.assert_allclose(jax.vmap(jax.grad(ours))(batch), jax.vmap(jax.grad(ref))(batch), rtol=1e-12, atol=1e-12)
        # an unbatched tangent next to a batched primal (vmap over A only, of a jvp with a fixed dA)
        dA = jnp.asarray(rng.standard_normal((3, 3)))
        got = jax.vmap(lambda A: jax.jvp(_square_map(1.0), (A,), (dA,))[1])(batch)
        np.testing.assert_allclose(got, batch @ dA + dA @ batch, rtol=1e-12, atol=1e-12)


def test_the_generated_functions_run_the_derived_vjp_in_reverse_mode():
    """jit(grad(expm)): the primitive is transposed away (the derived VJP's operations instead); a
    jvp keeps it; "jax" transposition has none of it."""
    import adjointgen.jax as agj

    with jax.enable_x64(True):
        A = jnp.asarray(np.random.default_rng(2).standard_normal((4, 4)) / 2)
        loss = lambda A: jnp.sum(agj.expm(A) ** 2)  # noqa: E731
        assert "adjointgen_linear_rule" not in str(jax.make_jaxpr(jax.grad(loss))(A))
        assert "adjointgen_linear_rule" in str(jax.make_jaxpr(lambda A: jax.jvp(loss, (A,), (A,)))(A))
        with rt.transposition("jax"):
            assert "adjointgen_linear_rule" not in str(jax.make_jaxpr(lambda A: jax.jvp(loss, (A,), (A,)))(A))
            g_jax = jax.grad(loss)(A)
        np.testing.assert_allclose(jax.grad(loss)(A), g_jax, rtol=1e-12, atol=1e-12)
        with pytest.raises(ValueError, match="derived.*jax"):
            with rt.transposition("neither"):
                pass

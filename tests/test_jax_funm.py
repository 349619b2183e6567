"""agj.funm(A, f) for any real scalar f: values against SciPy and the torch side, exact gradients
at repeated eigenvalues, second order by JAX's checker, jit/vmap, domains, and where it refuses."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import scipy.linalg  # noqa: E402
import sympy  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import adjointgen.jax as agj  # noqa: E402
from adjointgen import DegenerateSubspaceError  # noqa: E402

x = sympy.Symbol("x")
RNG = np.random.default_rng(4121)


def herm(n, complex_=False, spectrum=None):
    M = RNG.standard_normal((n, n)) + (1j * RNG.standard_normal((n, n)) if complex_ else 0)
    if spectrum is None:
        return jnp.asarray(M + M.conj().T)
    Q, _ = np.linalg.qr(M)
    return jnp.asarray((Q * np.asarray(spectrum)) @ Q.conj().T)


FUNCTIONS = [
    ("cos", sympy.cos(x), scipy.linalg.cosm, None),
    ("exp", sympy.exp(x), scipy.linalg.expm, None),
    ("x log x", x * sympy.log(x), lambda a: a @ scipy.linalg.logm(a), "positive"),
    ("softplus", sympy.log(1 + sympy.exp(x)), lambda a: scipy.linalg.logm(np.eye(len(a)) + scipy.linalg.expm(a)), None),
    ("sqrt", "sqrt", scipy.linalg.sqrtm, "positive"),
]


@pytest.mark.parametrize("name, f, ref, kind", FUNCTIONS, ids=[f[0] for f in FUNCTIONS])
@pytest.mark.parametrize("complex_", [False, True])
def test_values_and_second_order_gradients(name, f, ref, kind, complex_):
    spectrum = RNG.uniform(0.5, 3.0, 4) if kind == "positive" else None
    A = herm(4, complex_, spectrum)
    np.testing.assert_allclose(np.asarray(agj.funm(A, f)), ref(np.asarray(A)), rtol=1e-10, atol=1e-10)
    W = jnp.asarray(RNG.standard_normal((4, 4)))
    loss = lambda A: jnp.real(jnp.sum(agj.funm(A, f) * W))  # noqa: E731
    check_grads(loss, (A,), order=1 if complex_ else 2, modes=("rev",) if complex_ else ("fwd", "rev"))


def test_matches_the_torch_side():
    torch = pytest.importorskip("torch")
    import adjointgen.torch as agt

    A = herm(5)
    G = RNG.standard_normal((5, 5))
    f = sympy.atan(x) * x
    At = torch.tensor(np.asarray(A), requires_grad=True)
    (agt.funm(At, f) * torch.tensor(G)).sum().backward()
    g = jax.grad(lambda A: jnp.sum(agj.funm(A, f) * G))(A)
    np.testing.assert_allclose(np.asarray(agj.funm(A, f)), agt.funm(At, f).detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(0.5 * (g + g.T)), At.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("spectrum", [[1.0, 1.0, 2.0], [2.0, 2.0, 2.0], [1.0, 1.0 + 1e-13, 3.0]])
def test_exact_at_repeated_eigenvalues_where_the_eigendecomposition_has_no_gradient(spectrum):
    A = herm(3, spectrum=spectrum)
    for entry in [(0, 1), (2, 2)]:
        g = jax.grad(lambda A: agj.funm(A, sympy.exp(x))[entry])(A)
        ge = jax.grad(lambda A: agj.expm(A)[entry])(A)  # the general-matrix exponential: no gauge
        np.testing.assert_allclose(np.asarray(0.5 * (g + g.T)), np.asarray(0.5 * (ge + ge.T)), atol=1e-12)
    diag = jnp.diag(jnp.asarray(spectrum))
    g = jax.grad(lambda A: agj.funm(A, sympy.exp(x))[0, 1])(diag)
    ge = jax.grad(lambda A: agj.expm(A)[0, 1])(diag)
    np.testing.assert_allclose(np.asarray(0.5 * (g + g.T)), np.asarray(0.5 * (ge + ge.T)), atol=1e-12)


def test_transforms_jit_vmap_and_empty():
    A = jnp.stack([herm(4), herm(4)])
    f = lambda A: jnp.sum(agj.funm(A, sympy.sin(x) ** 2) ** 2)  # noqa: E731
    g = jax.vmap(jax.grad(f))(A)
    np.testing.assert_allclose(np.asarray(g[1]), np.asarray(jax.grad(f)(A[1])), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(f))(A[0])), np.asarray(jax.grad(f)(A[0])), rtol=1e-12)
    assert agj.funm(jnp.zeros((0, 3, 3)), "exp").shape == (0, 3, 3)
    assert jax.hessian(f)(A[0]).shape == (4, 4, 4, 4)


def test_domains_and_what_it_refuses():
    with pytest.raises(ValueError, match="log"):
        agj.funm(-jnp.eye(2), sympy.log(x))
    with pytest.raises(ValueError, match="domain"):
        agj.funm(jnp.eye(2) * 3, sympy.exp(x), domain=sympy.Interval(0, 2))
    with pytest.raises(TypeError, match="unknown function name"):
        agj.funm(jnp.eye(2), "tanhm")
    # a third derivative is NaN, never a silent value
    A, E = herm(3), herm(3)
    f = lambda A: jnp.sum(agj.funm(A, sympy.exp(x)))  # noqa: E731
    third = jax.jvp(lambda A: jax.jvp(jax.grad(f), (A,), (E,))[1], (A,), (E,))[1]
    assert bool(jnp.isnan(third).all())
    # a second derivative at an exact cluster goes through the eigenvectors' forward mode: it raises
    B = herm(3, spectrum=[1.0, 1.0, 2.0])
    with pytest.raises(DegenerateSubspaceError):
        jax.jvp(jax.grad(f), (B,), (E,))

"""solve_triangular: torch.linalg.solve_triangular's values, gradients and shape rules for every
(upper, left, unitriangular), real and complex; the unread triangle gets no gradient; a zero on the
diagonal raises; every torch.func transform; the NumPy and JAX functions of the same derivation."""
import itertools

import numpy as np
import pytest
import torch

import adjointgen
import adjointgen.torch as agt

CASES = list(itertools.product((False, True), (True, False), (False, True)))


def _problem(dtype, left, batch_A=(2, 1), batch_B=(3,), n=4, p=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(*batch_A, n, n, dtype=dtype, generator=g) + 3 * torch.eye(n, dtype=dtype)
    B = torch.randn(*batch_B, *((n, p) if left else (p, n)), dtype=dtype, generator=g)
    return A, B


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=str)
@pytest.mark.parametrize("upper,left,unit", CASES)
def test_values_and_gradients_match_torch_with_a_dense_other_triangle(dtype, upper, left, unit):
    A, B = _problem(dtype, left)  # A is dense: only the named triangle may be read
    A.requires_grad_()
    B.requires_grad_()
    X = agt.solve_triangular(A, B, upper=upper, left=left, unitriangular=unit)
    Xt = torch.linalg.solve_triangular(A, B, upper=upper, left=left, unitriangular=unit)
    assert X.shape == Xt.shape
    torch.testing.assert_close(X, Xt, rtol=1e-12, atol=1e-12)
    G = torch.randn_like(X)
    gA, gB = torch.autograd.grad(X, (A, B), G)
    tA, tB = torch.autograd.grad(Xt, (A, B), G)
    torch.testing.assert_close(gA, tA, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gB, tB, rtol=1e-10, atol=1e-12)
    read = torch.ones(4, 4, dtype=torch.bool)
    read = read.triu(1 if unit else 0) if upper else read.tril(-1 if unit else 0)
    unread = ~read
    assert gA[..., unread].abs().max() == 0  # not read, so no gradient there


@pytest.mark.parametrize("upper,left,unit", CASES)
def test_gradcheck_gradgradcheck_and_forward_mode(upper, left, unit):
    A, B = _problem(torch.complex128, left, batch_A=(), batch_B=())
    f = lambda a, b: agt.solve_triangular(a, b, upper=upper, left=left, unitriangular=unit)  # noqa: E731
    args = (A.requires_grad_(), B.requires_grad_())
    assert torch.autograd.gradcheck(f, args, check_forward_ad=True)
    assert torch.autograd.gradgradcheck(f, args)


def test_every_torch_func_transform_agrees_with_torch():
    A, B = _problem(torch.float64, True, batch_A=(), batch_B=())
    ours = lambda a, b: agt.solve_triangular(a, b, upper=True).square().sum()  # noqa: E731
    ref = lambda a, b: torch.linalg.solve_triangular(a, b, upper=True).square().sum()  # noqa: E731
    for transform in (torch.func.grad, torch.func.jacrev, torch.func.jacfwd, torch.func.hessian):
        got, want = transform(ours, argnums=(0, 1))(A, B), transform(ref, argnums=(0, 1))(A, B)
        for g, w in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)
    As, Bs = _problem(torch.float64, True, batch_A=(5,), batch_B=(5,))
    got = torch.func.vmap(torch.func.grad(ours))(As, Bs)
    want = torch.func.vmap(torch.func.grad(ref))(As, Bs)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_float32_empty_and_shape_errors():
    A, B = _problem(torch.float32, True)
    torch.testing.assert_close(agt.solve_triangular(A, B, upper=False),
                               torch.linalg.solve_triangular(A, B, upper=False), rtol=1e-5, atol=1e-5)
    for bA, bB, n in (((0,), (0,), 3), ((), (), 0), ((2, 0), (1,), 2)):
        A0, B0 = torch.randn(*bA, n, n), torch.randn(*bB, n, 2)
        assert agt.solve_triangular(A0, B0, upper=True).shape == torch.linalg.solve_triangular(A0, B0, upper=True).shape
    with pytest.raises(RuntimeError):
        agt.solve_triangular(torch.eye(3), torch.ones(4, 2), upper=False)
    with pytest.raises(ValueError):
        agt.solve_triangular(torch.eye(3), torch.ones(3), upper=False)  # torch wants a matrix B too
    with pytest.raises(ValueError, match="NaN|finite"):
        agt.solve_triangular(torch.full((3, 3), float("nan")), torch.ones(3, 1), upper=False)


def test_a_zero_on_the_diagonal_raises_instead_of_inf():
    A = torch.tensor([[1.0, 0.0], [2.0, 0.0]], dtype=torch.float64)
    assert not torch.linalg.solve_triangular(A, torch.ones(2, 1, dtype=torch.float64), upper=False).isfinite().all()
    with pytest.raises(adjointgen.SingularMatrixError, match="diagonal"):
        agt.solve_triangular(A, torch.ones(2, 1, dtype=torch.float64), upper=False)
    # unitriangular does not read the diagonal: no error
    X = agt.solve_triangular(A, torch.ones(2, 1, dtype=torch.float64), upper=False, unitriangular=True)
    torch.testing.assert_close(X, torch.tensor([[1.0], [-1.0]], dtype=torch.float64))


def test_the_numpy_rules_and_function():
    import adjointgen.cupy as agc
    from adjointgen.generated.cupy import solve_triangular as module

    rng = np.random.default_rng(3)
    A = np.tril(rng.standard_normal((2, 4, 4))) + 3 * np.eye(4)
    B = rng.standard_normal((2, 4, 3))
    X = module.solve_triangular(A + np.triu(rng.standard_normal((4, 4)), 1), B)  # the upper triangle is not read
    np.testing.assert_allclose(X, np.linalg.solve(A, B), rtol=1e-12)
    gX = rng.standard_normal(X.shape)
    gA, gB = agc.solve_triangular_vjp(A, X, gX)
    At = torch.tensor(A, requires_grad=True)
    Bt = torch.tensor(B, requires_grad=True)
    torch.autograd.backward(torch.linalg.solve_triangular(At, Bt, upper=False), torch.tensor(gX))
    np.testing.assert_allclose(gA, At.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gB, Bt.grad.numpy(), rtol=1e-10, atol=1e-12)
    with pytest.raises(np.linalg.LinAlgError, match="diagonal"):
        module.solve_triangular(np.tril(A[0]) - np.diag(np.diag(A[0])), B[0])


def test_the_jax_function():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    import adjointgen.jax as agj

    rng = np.random.default_rng(4)
    A = jnp.asarray(rng.standard_normal((4, 4)) + 3 * np.eye(4))
    B = jnp.asarray(rng.standard_normal((4, 2)))
    f = lambda a, b: jnp.sum(agj.solve_triangular(a, b, lower=True) ** 2)  # noqa: E731
    ref = lambda a, b: jnp.sum(jax.scipy.linalg.solve_triangular(a, b, lower=True) ** 2)  # noqa: E731
    for g, w in zip(jax.grad(f, (0, 1))(A, B), jax.grad(ref, (0, 1))(A, B)):
        np.testing.assert_allclose(np.tril(g) if g.shape == A.shape else g, np.tril(w) if w.shape == A.shape else w,
                                   rtol=1e-10, atol=1e-12)
    gA = jax.grad(f)(A, B)
    assert float(jnp.abs(jnp.triu(gA, 1)).max()) == 0

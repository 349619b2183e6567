"""lu, lu_factor, lu_solve: torch.linalg's values, pivots and gradients for square, tall and wide
matrices (unstructured cotangents included), real and complex; gradcheck/gradgradcheck and forward
mode; every torch.func transform; float32, empty and broadcast batches; a zero pivot raises in a
derivative; the NumPy and JAX functions of the same derivation."""
import numpy as np
import pytest
import torch

import adjointgen
import adjointgen.torch as agt

SHAPES = [(4, 4), (6, 3), (3, 6), (2, 5, 4), (2, 1, 4, 5), (1, 1), (5, 1), (1, 5)]


def _A(shape, dtype, seed=0):
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_values_pivots_and_gradients_match_torch(shape, dtype):
    A = _A(shape, dtype).requires_grad_()
    P, L, U = agt.lu(A)
    P0, L0, U0 = torch.linalg.lu(A)
    assert torch.equal(P, P0) and not P.requires_grad
    torch.testing.assert_close(L, L0, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(U, U0, rtol=1e-12, atol=1e-12)
    # unstructured cotangents: the entries of L and U that are structurally 0 or 1 get no gradient
    gL, gU = torch.randn_like(L), torch.randn_like(U)
    ours, = torch.autograd.grad(L, A, gL, retain_graph=True)
    ours = ours + torch.autograd.grad(U, A, gU)[0]
    ref, = torch.autograd.grad(L0, A, gL, retain_graph=True)
    ref = ref + torch.autograd.grad(U0, A, gU)[0]
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    LU, pivots = agt.lu_factor(A)
    LU0, pivots0 = torch.linalg.lu_factor(A)
    assert torch.equal(pivots, pivots0)
    torch.testing.assert_close(LU, LU0, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5)], ids=str)
def test_gradcheck_gradgradcheck_and_forward_mode(shape):
    A = _A(shape, torch.complex128, seed=1).requires_grad_()
    f = lambda a: tuple(agt.lu(a)[1:])  # noqa: E731
    assert torch.autograd.gradcheck(f, (A,), check_forward_ad=True, check_batched_grad=True,
                                    check_batched_forward_grad=True)
    assert torch.autograd.gradgradcheck(f, (A,))
    assert torch.autograd.gradcheck(lambda a: agt.lu_factor(a).LU, (A,), check_forward_ad=True)


@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5)], ids=str)
def test_every_torch_func_transform_agrees_with_torch(shape):
    A = _A(shape, torch.float64, seed=2)

    def loss(lu):
        return lambda a: sum((t * t.roll(1, -1)).sum() for t in lu(a)[1:])

    ours, ref = loss(agt.lu), loss(torch.linalg.lu)
    for transform in (torch.func.grad, torch.func.jacrev, torch.func.jacfwd, torch.func.hessian):
        torch.testing.assert_close(transform(ours)(A), transform(ref)(A), rtol=1e-9, atol=1e-10)
    As = _A((3, *shape), torch.float64, seed=3)
    torch.testing.assert_close(torch.func.vmap(torch.func.grad(ours))(As), torch.func.vmap(torch.func.grad(ref))(As),
                               rtol=1e-9, atol=1e-10)
    t = torch.randn_like(A)
    got = torch.func.jvp(lambda a: agt.lu(a).U, (A,), (t,))[1]
    torch.testing.assert_close(got, torch.func.jvp(lambda a: torch.linalg.lu(a).U, (A,), (t,))[1])


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=str)
def test_lu_solve_matches_torch_and_differentiates_in_LU_and_B(left, adjoint, dtype):
    LU, pivots = torch.linalg.lu_factor(_A((2, 4, 4), dtype, seed=4))
    B = _A((2, 4, 3) if left else (2, 3, 4), dtype, seed=5)
    LU.requires_grad_()
    B.requires_grad_()
    X = agt.lu_solve(LU, pivots, B, left=left, adjoint=adjoint)
    X0 = torch.linalg.lu_solve(LU, pivots, B, left=left, adjoint=adjoint)
    torch.testing.assert_close(X, X0, rtol=1e-10, atol=1e-12)
    G = torch.randn_like(X)
    for g, w in zip(torch.autograd.grad(X, (LU, B), G), torch.autograd.grad(X0, (LU, B), G)):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-11)
    assert torch.autograd.gradcheck(lambda a, b: agt.lu_solve(a, pivots[0], b, left=left, adjoint=adjoint),
                                    (LU[0].detach().requires_grad_(), B[0].detach().requires_grad_()),
                                    check_forward_ad=True)


def test_lu_then_lu_solve_is_solve():
    A = _A((3, 5, 5), torch.float64, seed=6).requires_grad_()
    B = _A((3, 5, 2), torch.float64, seed=7)
    X = agt.lu_solve(*agt.lu_factor(A), B)
    torch.testing.assert_close(X, torch.linalg.solve(A, B), rtol=1e-10, atol=1e-12)
    g, = torch.autograd.grad(X.square().sum(), A)
    torch.testing.assert_close(g, torch.autograd.grad(torch.linalg.solve(A, B).square().sum(), A)[0],
                               rtol=1e-9, atol=1e-11)


def test_float32_empty_batches_and_bad_input():
    A = _A((2, 4, 3), torch.float32)
    for got, want in zip(agt.lu(A), torch.linalg.lu(A)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for shape in ((0, 3, 3), (2, 0, 4, 4), (0, 0), (3, 0), (0, 3), (2, 3, 0)):
        A0 = torch.randn(*shape, requires_grad=True)
        for got, want in zip(agt.lu(A0), torch.linalg.lu(A0)):
            assert got.shape == want.shape
        agt.lu(A0).U.sum().backward()
        assert A0.grad.shape == A0.shape
    with pytest.raises(ValueError, match="NaN|Inf"):
        agt.lu(torch.full((3, 3), float("nan")))
    with pytest.raises(ValueError):
        agt.lu(torch.ones(3))
    with pytest.raises(ValueError):
        agt.lu(torch.ones(3, 3, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="without pivoting"):  # torch's own error on the CPU
        agt.lu(torch.eye(3), pivot=False)


def test_a_zero_pivot_raises_in_a_derivative_instead_of_nan():
    singular = torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    P, L, U = agt.lu(singular)  # the factorization exists, as torch's
    for got, want in zip((P, L, U), torch.linalg.lu(singular)):
        torch.testing.assert_close(got, want)
    with pytest.raises(adjointgen.SingularMatrixError, match="pivot"):
        U.sum().backward()
    with pytest.raises(adjointgen.SingularMatrixError, match="pivot"):
        torch.func.jvp(lambda a: agt.lu(a).L, (singular.detach(),), (torch.ones(2, 2, dtype=torch.float64),))
    with pytest.raises(RuntimeError):  # torch.linalg.lu_factor raises for a zero pivot, and so does ours
        torch.linalg.lu_factor(singular)
    with pytest.raises(adjointgen.SingularMatrixError, match="lu_factor"):
        agt.lu_factor(singular)


def test_the_numpy_function_and_rules():
    import adjointgen.cupy as agc
    from adjointgen.generated.cupy import lu as module

    rng = np.random.default_rng(8)
    A = rng.standard_normal((2, 4, 4))
    P, L, U = module.lu(A)
    np.testing.assert_allclose(P @ L @ U, A, rtol=1e-12, atol=1e-12)
    gL, gU = np.tril(rng.standard_normal(L.shape), -1), np.triu(rng.standard_normal(U.shape))
    gA = agc.lu_vjp(P, L, U, gL, gU)
    At = torch.tensor(A, requires_grad=True)
    _, Lt, Ut = torch.linalg.lu(At)
    torch.autograd.backward((Lt, Ut), (torch.tensor(gL), torch.tensor(gU)))
    np.testing.assert_allclose(gA, At.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_the_jax_function():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from jax.test_util import check_grads

    import adjointgen.jax as agj

    A = jnp.asarray(np.random.default_rng(9).standard_normal((4, 4)))
    P, L, U = agj.lu(A)
    np.testing.assert_allclose(np.asarray(P @ L @ U), np.asarray(A), rtol=1e-12, atol=1e-12)
    loss = lambda a: jnp.sum(agj.lu(a)[1] ** 2) + jnp.sum(jnp.sin(agj.lu(a)[2]))  # noqa: E731
    ref = lambda a: jnp.sum(jax.scipy.linalg.lu(a)[1] ** 2) + jnp.sum(jnp.sin(jax.scipy.linalg.lu(a)[2]))  # noqa: E731
    np.testing.assert_allclose(jax.grad(loss)(A), jax.grad(ref)(A), rtol=1e-10, atol=1e-12)
    check_grads(loss, (A,), order=2, modes=("fwd", "rev"))


def test_numerically_singular_pivots_raise_with_the_condition_estimate():
    # rank 2 of 4: the last pivots are rounding (5e-17), not zero; the derivative divided by them (2e16)
    g = torch.Generator().manual_seed(1)
    A = (torch.randn(4, 2, dtype=torch.float64, generator=g) @ torch.randn(2, 4, dtype=torch.float64, generator=g))
    A.requires_grad_()
    P, L, U = agt.lu(A)
    with pytest.raises(adjointgen.SingularMatrixError, match="condition estimate .*numerically rank deficient"):
        torch.autograd.grad(L.sum() + U.sum(), A)
    with pytest.raises(adjointgen.SingularMatrixError, match="numerically rank deficient"):
        torch.func.jvp(lambda a: agt.lu(a)[1], (A.detach(),), (torch.ones_like(A),))
    # a graded matrix has tiny pivots that are exact: its derivative is right (L_21 = a_21 / a_11)
    D = torch.diag(torch.tensor([1.0, 1e-20, 1e-30], dtype=torch.float64)).requires_grad_()
    E = torch.zeros(3, 3, dtype=torch.float64)
    E[2, 1] = 1.0
    _, dL = torch.func.jvp(lambda a: agt.lu(a)[1], (D.detach(),), (E,))
    assert float(dL[2, 1]) == pytest.approx(1e20, rel=1e-12)

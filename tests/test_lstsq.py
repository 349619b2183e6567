"""lstsq: torch.linalg.lstsq's result tuple for every driver (shapes, dtypes, which parts are
computed), its solutions and gradients for tall, wide, square and rank-deficient A, real and
complex, vector right-hand sides and broadcast batches (sizes 0 and 1 included); gradcheck,
gradgradcheck and forward mode; every torch.func transform; the errors torch gives; the NumPy and
JAX functions of the same derivation."""
import numpy as np
import pytest
import torch

import adjointgen.torch as agt
from adjointgen.runtime.checks import ShapeError

DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def _randn(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def _rank_deficient(m, n, r, dtype=torch.float64, seed=0):
    return _randn(m, r, dtype=dtype, seed=seed) @ _randn(r, n, dtype=dtype, seed=seed + 1)


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("shapes", [((6, 4), (6, 3)), ((4, 6), (4, 2)), ((5, 5), (5, 1)), ((2, 6, 3), (2, 6)),
                                    ((1, 6, 3), (3, 6, 2)), ((3, 6, 3), (1, 6, 2)), ((0, 6, 3), (0, 6, 2)),
                                    ((4, 0), (4, 2)), ((0, 3), (0, 2)), ((2, 1, 5, 3), (1, 4, 5, 2))], ids=str)
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=str)
def test_result_tuple_matches_torch(shapes, driver, dtype):
    A, B = _randn(*shapes[0], dtype=dtype), _randn(*shapes[1], dtype=dtype, seed=1)
    ours, ref = agt.lstsq(A, B, driver=driver), torch.linalg.lstsq(A, B, driver=driver)
    assert type(ours) is type(ref)
    for name in ("solution", "residuals", "rank", "singular_values"):
        a, b = getattr(ours, name), getattr(ref, name)
        assert a.shape == b.shape and a.dtype == b.dtype, (name, a.shape, b.shape, a.dtype, b.dtype)
        if name == "rank":
            assert torch.equal(a, b)
        elif name == "residuals" and driver == "gels" and A.shape[-1] == 0:
            # torch's gels returns zeros here; the residual of X = 0 is ||B||^2
            torch.testing.assert_close(a, B.abs().pow(2).sum(-2))
        else:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=str)
@pytest.mark.parametrize("m, n, r", [(7, 4, 4), (4, 7, 4), (5, 5, 5), (7, 5, 2), (5, 7, 3), (6, 6, 3)])
def test_solution_and_gradient_match_torch_full_and_deficient_rank(m, n, r, dtype):
    """torch's lstsq backward is the pseudo-inverse's: compare with gelsd (minimum-norm at every
    rank); rank-deficient directions are kept at constant rank by the structure of the loss."""
    A = _rank_deficient(m, n, r, dtype).requires_grad_()
    B = _randn(m, 3, dtype=dtype, seed=5).requires_grad_()
    ours, ref = agt.lstsq(A, B), torch.linalg.lstsq(A, B, driver="gelsd")
    assert int(ours.rank) == r == int(ref.rank)
    torch.testing.assert_close(ours.solution, ref.solution, rtol=1e-9, atol=1e-10)
    G = _randn(n, 3, dtype=dtype, seed=7)
    g_ours = torch.autograd.grad((ours.solution * G.conj()).real.sum(), (A, B))
    g_ref = torch.autograd.grad((ref.solution * G.conj()).real.sum(), (A, B))
    for a, b in zip(g_ours, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)


def test_rank_deficient_gradient_is_the_constant_rank_derivative():
    """Along a direction that keeps the rank, the derivative is the finite difference (central,
    fourth order) of the minimum-norm solution."""
    L, R, B = _randn(7, 2), _randn(2, 5, seed=1), _randn(7, 3, seed=2)
    dL, dR = _randn(7, 2, seed=3), _randn(2, 5, seed=4)
    A = (L @ R).requires_grad_()
    dA = dL @ R + L @ dR
    _, jvp = torch.func.jvp(lambda a: agt.lstsq(a, B).solution, (A.detach(),), (dA,))
    h = 1e-3
    x = lambda t: agt.lstsq((L + t * dL) @ (R + t * dR), B).solution  # noqa: E731
    fd = (-x(2 * h) + 8 * x(h) - 8 * x(-h) + x(-2 * h)) / (12 * h)
    torch.testing.assert_close(jvp, fd, rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("shape", [(6, 4), (4, 6), (4, 4)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=str)
def test_gradcheck_gradgradcheck_and_forward_mode(shape, dtype):
    A = _randn(*shape, dtype=dtype, seed=2).requires_grad_()
    B = _randn(shape[0], 2, dtype=dtype, seed=3).requires_grad_()
    f = lambda a, b: agt.lstsq(a, b, driver="gelsd")[:2]  # noqa: E731  (solution and residuals)
    assert torch.autograd.gradcheck(f, (A, B), check_forward_ad=True, check_batched_grad=True,
                                    check_batched_forward_grad=True)
    assert torch.autograd.gradgradcheck(f, (A, B), check_fwd_over_rev=True)


@pytest.mark.parametrize("shape", [(6, 4), (4, 6)], ids=str)
def test_every_torch_func_transform_agrees_with_torch(shape):
    A, B = _randn(*shape, seed=4), _randn(shape[0], 2, seed=5)

    def loss(lstsq):
        return lambda a, b: (lstsq(a, b).solution.sin() * torch.arange(2.0, dtype=a.dtype)).sum()

    ours, ref = loss(agt.lstsq), loss(torch.linalg.lstsq)
    for transform in (torch.func.grad, torch.func.jacrev, torch.func.jacfwd, torch.func.hessian):
        for argnums in (0, 1):
            torch.testing.assert_close(transform(ours, argnums=argnums)(A, B), transform(ref, argnums=argnums)(A, B),
                                       rtol=1e-9, atol=1e-10)
    As, Bs = torch.stack([A, 2 * A, A.flip(-1)]), torch.stack([B, B, -B])
    torch.testing.assert_close(torch.func.vmap(torch.func.grad(ours))(As, Bs),
                               torch.func.vmap(torch.func.grad(ref))(As, Bs), rtol=1e-9, atol=1e-10)


def test_float32_and_vector_right_hand_side():
    A, b = _randn(2, 6, 3, dtype=torch.float32), _randn(2, 6, dtype=torch.float32, seed=1)
    ours, ref = agt.lstsq(A, b), torch.linalg.lstsq(A, b)
    assert ours.solution.shape == (2, 3) and ours.solution.dtype == torch.float32
    torch.testing.assert_close(ours.solution, ref.solution, rtol=1e-4, atol=1e-5)


def test_rcond_sets_the_rank_as_torch_does():
    A = torch.diag(torch.tensor([1.0, 1e-3, 1e-9], dtype=torch.float64))
    B = torch.ones(3, 1, dtype=torch.float64)
    for rcond in (None, 1e-6, 1e-2):
        ours, ref = agt.lstsq(A, B, rcond, driver="gelsd"), torch.linalg.lstsq(A, B, rcond, driver="gelsd")
        assert torch.equal(ours.rank, ref.rank)
        torch.testing.assert_close(ours.solution, ref.solution, rtol=1e-9, atol=1e-9)


def test_errors_are_torchs():
    A, B = _randn(5, 3), _randn(5, 2)
    cases = [((_randn(5), _randn(5)), {}, "at least 2 dimensions"),
             ((A, _randn(4, 2)), {}, "should match"),
             ((A, B.float()), {}, "same dtype"),
             ((A, B), {"driver": "lapack"}, "driver"),
             ((_randn(2, 5, 3), _randn(5)), {}, "greater or equal")]
    for args, kwargs, match in cases:
        with pytest.raises(RuntimeError, match=match):
            torch.linalg.lstsq(*args, **kwargs)
        with pytest.raises(ShapeError, match=match):
            agt.lstsq(*args, **kwargs)
    with pytest.raises(ValueError, match="NaN"):
        agt.lstsq(torch.full((5, 3), float("nan"), dtype=torch.float64), B)
    with pytest.raises(ValueError, match="rcond"):
        agt.lstsq(A, B, -1.0)


@pytest.mark.slow  # 13-25 s: the default suite keeps its time; CI's slow step runs it
def test_the_numpy_and_jax_functions():
    from adjointgen.generated.cupy import lstsq as module

    rng = np.random.default_rng(3)
    A, B = rng.standard_normal((2, 6, 4)), rng.standard_normal((2, 6, 3))
    X, P = module.lstsq(A, B)
    np.testing.assert_allclose(X[1], np.linalg.lstsq(A[1], B[1], rcond=None)[0], rtol=1e-10)
    np.testing.assert_allclose(P[1], np.linalg.pinv(A[1]), rtol=1e-10)
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from jax.test_util import check_grads

    import adjointgen.jax as agj

    a, b = jnp.asarray(A[0]), jnp.asarray(B[0])
    np.testing.assert_allclose(np.asarray(agj.lstsq(a, b)[0]), X[0], rtol=1e-10)
    loss = lambda a, b: jnp.sum(jnp.sin(agj.lstsq(a, b)[0]))  # noqa: E731
    ref = lambda a, b: jnp.sum(jnp.sin(jnp.linalg.lstsq(a, b)[0]))  # noqa: E731
    for g, h in zip(jax.grad(loss, (0, 1))(a, b), jax.grad(ref, (0, 1))(a, b)):
        np.testing.assert_allclose(g, h, rtol=1e-9, atol=1e-12)
    check_grads(loss, (a, b), order=2, modes=("fwd", "rev"))

"""agt.polar / agj.polar (``derivations/polar.py``): values against SciPy, gradients against finite
differences (real and complex, tall and square, second order), exact at an orthogonal A (P = I,
where an SVD-composed polar divides by zero gaps), batches, float32, torch.func transforms, and the
side='left' and wide A (composed from the derived right polar decomposition of A or A^H), and the
options that raise."""
import numpy as np
import pytest
import scipy.linalg
import torch

import adjointgen.torch as agt


def full_rank(m, n, seed=0, dtype=torch.float64, batch=()):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(*batch, m, n, dtype=dtype, generator=g)
    return A + 2 * m ** 0.5 * torch.eye(m, n, dtype=dtype)


def orthogonal(n, seed=0, dtype=torch.float64):
    Q, _ = torch.linalg.qr(torch.randn(n, n, dtype=dtype, generator=torch.Generator().manual_seed(seed)))
    return Q


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("shape", [(4, 4), (5, 3)])
def test_values_match_scipy(dtype, shape):
    A = full_rank(*shape, seed=1, dtype=dtype, batch=(2,))
    U, P = agt.polar(A)
    assert U.shape == A.shape and P.shape == (2, shape[1], shape[1]) and U.dtype == P.dtype == dtype
    for i in range(2):
        u, p = scipy.linalg.polar(A[i].numpy())
        assert np.abs(U[i].numpy() - u).max() < 1e-13 and np.abs(P[i].numpy() - p).max() < 1e-12


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("shape", [(3, 3), (4, 2)])
def test_gradcheck_gradgradcheck_and_forward_mode(dtype, shape):
    A = full_rank(*shape, seed=2, dtype=dtype).requires_grad_()
    assert torch.autograd.gradcheck(agt.polar, (A,))
    assert torch.autograd.gradgradcheck(agt.polar, (A,))
    assert torch.autograd.gradcheck(agt.polar, (A,), check_forward_ad=True, check_backward_ad=False,
                                    check_undefined_grad=False, check_batched_forward_grad=False)


def test_derivative_matches_finite_differences_of_scipy():
    A, E = full_rank(5, 3, seed=3), torch.randn(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    f = lambda t: scipy.linalg.polar(A.numpy() + t * E.numpy())
    h = 1e-4
    (up, pp), (um, pm) = f(h), f(-h)
    _, (dU, dP) = torch.func.jvp(agt.polar, (A,), (E,))
    assert np.abs(dU.numpy() - (up - um) / (2 * h)).max() < 1e-7
    assert np.abs(dP.numpy() - (pp - pm) / (2 * h)).max() < 1e-7


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_orthogonal_input_is_exact(dtype):
    """At an orthogonal (unitary) A all singular values are 1: U = A, P = I, and the derivative is
    finite and right to every order (the rules divide by p_i + p_j = 2, never by a gap)."""
    Q = orthogonal(4, 5, dtype)
    U, P = agt.polar(Q)
    assert torch.allclose(P, torch.eye(4, dtype=dtype), atol=1e-14, rtol=0)
    assert torch.allclose(U, Q, atol=1e-14, rtol=0)
    Q1 = Q.clone().requires_grad_()
    gA, = torch.autograd.grad(sum((x * x.conj()).real.sum() + x.real.sum() for x in agt.polar(Q1)), Q1)
    assert torch.isfinite(torch.view_as_real(gA) if dtype.is_complex else gA).all()
    assert torch.autograd.gradcheck(agt.polar, (Q1,))
    assert torch.autograd.gradgradcheck(agt.polar, (Q1,))
    # dP at P = I along E: the symmetric part of Q^H E (dO solves 2 dO = Q^H E - E^H Q)
    E = torch.randn(4, 4, dtype=dtype, generator=torch.Generator().manual_seed(6))
    _, (dU, dP) = torch.func.jvp(agt.polar, (Q,), (E,))
    M = Q.mH @ E
    assert torch.allclose(dP, (M + M.mH) / 2, atol=1e-13, rtol=0)
    assert torch.allclose(dU, Q @ (M - M.mH) / 2, atol=1e-13, rtol=0)


def test_batches_empty_batch_and_float32():
    A = full_rank(3, 3, seed=7, batch=(2, 3)).requires_grad_()
    U, P = agt.polar(A)
    assert U.shape == (2, 3, 3, 3) and P.shape == (2, 3, 3, 3)
    gA, = torch.autograd.grad((U.sum() + P.sum()), A)
    for idx in [(0, 0), (1, 2)]:
        a = A[idx].detach().clone().requires_grad_()
        u, p = agt.polar(a)
        g, = torch.autograd.grad(u.sum() + p.sum(), a)
        assert torch.allclose(gA[idx], g, atol=1e-13, rtol=0)
    E = torch.zeros(0, 4, 3, dtype=torch.float64, requires_grad=True)
    U, P = agt.polar(E)
    assert U.shape == (0, 4, 3) and P.shape == (0, 3, 3)
    (U.sum() + P.sum()).backward()
    assert E.grad.shape == E.shape
    A32 = full_rank(4, 3, seed=8, dtype=torch.float32).requires_grad_()
    U, P = agt.polar(A32)
    assert U.dtype == P.dtype == torch.float32
    g32, = torch.autograd.grad(P.sum() + U[0].sum(), A32)
    A64 = A32.detach().double().requires_grad_()
    U, P = agt.polar(A64)
    g64, = torch.autograd.grad(P.sum() + U[0].sum(), A64)
    assert g32.dtype == torch.float32 and torch.allclose(g32.double(), g64, atol=1e-4, rtol=0)


def test_torch_func_transforms():
    A = full_rank(3, 3, seed=9)
    f = lambda a: agt.polar(a)[1]  # noqa: E731
    jr, jf = torch.func.jacrev(f)(A), torch.func.jacfwd(f)(A)
    assert torch.allclose(jr, jf, atol=1e-12, rtol=0)
    loss = lambda a: (agt.polar(a)[1] ** 2).sum() + agt.polar(a)[0][0, 1]  # noqa: E731
    H = torch.func.hessian(loss)(A)
    Hfd = torch.autograd.functional.hessian(loss, A)
    assert torch.allclose(H, Hfd, atol=1e-10, rtol=0)
    B = full_rank(3, 3, seed=10, batch=(4,))
    Uv, Pv = torch.func.vmap(agt.polar)(B)
    Ub, Pb = agt.polar(B)
    assert torch.allclose(Uv, Ub, atol=1e-14, rtol=0) and torch.allclose(Pv, Pb, atol=1e-14, rtol=0)
    gv = torch.func.vmap(torch.func.grad(lambda a: f(a).sum()))(B)
    B1 = B.clone().requires_grad_()
    gb, = torch.autograd.grad(f(B1).sum(), B1)
    assert torch.allclose(gv, gb, atol=1e-12, rtol=0)


SIDES_SHAPES = [("right", (5, 3)), ("right", (3, 5)), ("right", (4, 4)), ("left", (3, 5)), ("left", (5, 3)),
                ("left", (4, 4))]


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("side, shape", SIDES_SHAPES)
def test_both_sides_and_wide_input_match_scipy(side, shape, dtype):
    """side='left' (A = P U) and wide A, composed from the derived right polar decomposition of A or
    A^H (adjointgen.catalogue._extensions.polar): SciPy's values and shapes."""
    A = full_rank(*shape, seed=21, dtype=dtype, batch=(2,))
    if shape[0] < shape[1]:
        A = full_rank(shape[1], shape[0], seed=21, dtype=dtype, batch=(2,)).mH.contiguous()
    U, P = agt.polar(A, side=side)
    k = shape[1] if side == "right" else shape[0]
    assert U.shape == A.shape and P.shape == (2, k, k) and U.dtype == P.dtype == dtype
    assert not (U.is_conj() or P.is_conj())
    for i in range(2):
        u, p = scipy.linalg.polar(A[i].numpy(), side=side)
        assert np.abs(U[i].numpy() - u).max() < 1e-13 and np.abs(P[i].numpy() - p).max() < 1e-12
    assert torch.allclose(P, P.mH, atol=1e-14 * P.abs().max().item(), rtol=0)  # Hermitian


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("side, shape", [s for s in SIDES_SHAPES if s != ("right", (5, 3))])
def test_both_sides_and_wide_input_derivatives(side, shape, dtype):
    """gradcheck, gradgradcheck and forward mode of every side and orientation, and the JVP against
    central differences of SciPy's polar."""
    A = full_rank(*shape, seed=22, dtype=dtype)
    if shape[0] < shape[1]:
        A = full_rank(shape[1], shape[0], seed=22, dtype=dtype).mH.contiguous()
    f = lambda a: agt.polar(a, side=side)  # noqa: E731
    A1 = A.clone().requires_grad_()
    assert torch.autograd.gradcheck(f, (A1,))
    assert torch.autograd.gradgradcheck(f, (A1,))
    assert torch.autograd.gradcheck(f, (A1,), check_forward_ad=True, check_backward_ad=False,
                                    check_undefined_grad=False, check_batched_forward_grad=False)
    E = torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(23))
    h = 1e-5
    (up, pp), (um, pm) = (scipy.linalg.polar(A.numpy() + s * h * E.numpy(), side=side) for s in (1, -1))
    _, (dU, dP) = torch.func.jvp(f, (A,), (E,))
    assert np.abs(dU.numpy() - (up - um) / (2 * h)).max() < 1e-7
    assert np.abs(dP.numpy() - (pp - pm) / (2 * h)).max() < 1e-7


@pytest.mark.parametrize("side", ["right", "left"])
def test_wide_input_with_orthonormal_rows_is_exact(side):
    """A = [I 0] (3x5): U = A, P_right = diag(1, 1, 1, 0, 0) (singular: zero singular values of A^H A
    repeat), P_left = I; the derivative is finite and right to second order."""
    A = torch.eye(3, 5, dtype=torch.float64)
    U, P = agt.polar(A, side=side)
    assert torch.allclose(U, A, atol=1e-15, rtol=0)
    k = 5 if side == "right" else 3
    assert torch.allclose(P, torch.diag((torch.arange(k) < 3).double()), atol=1e-15, rtol=0)
    A1 = A.clone().requires_grad_()
    f = lambda a: agt.polar(a, side=side)  # noqa: E731
    assert torch.autograd.gradcheck(f, (A1,))
    assert torch.autograd.gradgradcheck(f, (A1,))


def test_transforms_of_the_extension():
    """vmap, jacrev = jacfwd and hessian of side='left' and of wide input."""
    B = full_rank(5, 3, seed=24, batch=(3,)).mH.contiguous()  # 3x5, wide
    for side in ("right", "left"):
        f = lambda a: agt.polar(a, side=side)[1]  # noqa: E731
        assert torch.allclose(torch.func.vmap(f)(B), f(B), atol=1e-14, rtol=0)
        assert torch.allclose(torch.func.jacrev(f)(B[0]), torch.func.jacfwd(f)(B[0]), atol=1e-12, rtol=0)
        loss = lambda a: (agt.polar(a, side=side)[1] ** 2).sum() + agt.polar(a, side=side)[0][0, 1]  # noqa: E731
        assert torch.allclose(torch.func.hessian(loss)(B[0]), torch.autograd.functional.hessian(loss, B[0]),
                              atol=1e-10, rtol=0)


def test_bad_side_raises_and_the_derived_domain_is_checked():
    with pytest.raises(ValueError, match="side must be 'right' or 'left'"):
        agt.polar(full_rank(3, 3), side="up")
    with pytest.raises(ValueError, match="NaN"):
        agt.polar(torch.full((3, 5), float("nan"), dtype=torch.float64), side="left")


def _jax():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    from jax.test_util import check_grads

    import adjointgen.jax as agj

    return jax.numpy, check_grads, agj


def test_jax_matches_torch_and_finite_differences():
    jnp, check_grads, agj = _jax()
    for shape, dtype, order, side in [((4, 3), torch.float64, 2, "right"), ((3, 3), torch.complex128, 1, "right"),
                                      ((3, 4), torch.float64, 2, "right"), ((4, 3), torch.complex128, 1, "left")]:
        A = full_rank(*shape, seed=11, dtype=dtype)
        f = lambda a: agj.polar(a, side=side)  # noqa: E731
        U, P = f(jnp.asarray(A.numpy()))
        u, p = agt.polar(A, side=side)
        assert np.abs(np.asarray(U) - u.numpy()).max() < 1e-13 and np.abs(np.asarray(P) - p.numpy()).max() < 1e-13
        check_grads(f, (jnp.asarray(A.numpy()),), order=order, modes=("rev",))
    Q = jnp.asarray(orthogonal(3, 12).numpy())
    check_grads(agj.polar, (Q,), order=1, modes=("fwd", "rev"))
    assert np.abs(np.asarray(agj.polar(Q)[1]) - np.eye(3)).max() < 1e-14


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_jax_second_order_both_modes(dtype):
    jnp, check_grads, agj = _jax()
    for A in [full_rank(4, 3, seed=13, dtype=dtype), full_rank(3, 3, seed=14, dtype=dtype), orthogonal(3, 15, dtype)]:
        check_grads(agj.polar, (jnp.asarray(A.numpy()),), order=2, modes=("fwd", "rev"))


@pytest.mark.parametrize("side, shape", [("right", (3, 5)), ("left", (5, 3)), ("left", (4, 4))])
def test_numpy_function_matches_scipy(side, shape):
    from adjointgen.generated.cupy.polar import polar  # the NumPy/CuPy forward, extended alike

    A = full_rank(*shape, seed=25).numpy()
    for got, want in zip(polar(A, side=side), scipy.linalg.polar(A, side=side)):
        assert got.shape == want.shape and np.abs(got - want).max() < 1e-13

"""The generated polar decomposition against the SVD-composed one, finite differences and every
autograd mode, real and complex."""
import pytest
import torch

from polar_layer._adjoint.torch.polar import polar


def composed(A):
    """U = W V^H, P = V diag(s) V^H through torch's own SVD (and its gradient)."""
    W, s, Vh = torch.linalg.svd(A)
    return W @ Vh, (Vh.mH * s.to(A.dtype).unsqueeze(-2)) @ Vh


def problem(seed=0, batch=(), dtype=torch.float64, n=4):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(*batch, n, n, dtype=dtype, generator=g) + 2 * n ** 0.5 * torch.eye(n, dtype=dtype)
    return A


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_values_and_gradient_equal_the_svd_composed_ones(dtype):
    A = problem(0, (3,), dtype).requires_grad_()
    U, P = polar(A)
    U0, P0 = composed(A)
    assert torch.allclose(U, U0, atol=1e-12) and torch.allclose(P, P0, atol=1e-12)
    assert torch.allclose(U @ P, A, atol=1e-12) and torch.allclose(P, P.mH, atol=1e-13)
    g = torch.Generator().manual_seed(1)
    GU, GP = (torch.randn(*A.shape, dtype=dtype, generator=g) for _ in range(2))
    ours, = torch.autograd.grad((U, P), A, (GU, GP), retain_graph=True)
    theirs, = torch.autograd.grad((U0, P0), A, (GU, GP))
    assert float((ours - theirs).abs().max() / theirs.abs().max()) < 1e-12


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_gradcheck_and_gradgradcheck(dtype):
    A = problem(2, (), dtype).requires_grad_()
    assert torch.autograd.gradcheck(polar, (A,))
    assert torch.autograd.gradgradcheck(polar, (A,))
    assert torch.autograd.gradcheck(polar, (A,), check_forward_ad=True, check_backward_ad=False,
                                    check_undefined_grad=False, check_batched_forward_grad=True)


def test_orthogonal_input_second_order():
    """At an orthogonal A, P = I has one n-fold eigenvalue: the Sylvester solves divide by
    p_i + p_j = 2, so first and second derivatives stay exact where an eigh-based P would not."""
    Q, _ = torch.linalg.qr(problem(3))
    Q = Q.requires_grad_()
    U, P = polar(Q)
    assert torch.allclose(P, torch.eye(4, dtype=torch.float64), atol=1e-12)
    assert torch.autograd.gradgradcheck(polar, (Q,))
    H = torch.func.hessian(lambda a: polar(a)[1].pow(2).sum() + polar(a)[0][0].sum())(Q.detach())
    assert torch.isfinite(H).all()


def test_torch_func_transforms():
    A = problem(4, (2,))
    loss = lambda a: polar(a)[1].diagonal(dim1=-2, dim2=-1).pow(2).sum() + polar(a)[0][..., 0, 1].sum()
    g_vmap = torch.func.vmap(torch.func.grad(loss))(A)
    g_loop = torch.stack([torch.func.grad(loss)(a) for a in A])
    assert torch.allclose(g_vmap, g_loop, atol=1e-12)
    J_rev = torch.func.jacrev(lambda a: polar(a)[0])(A[0])
    J_fwd = torch.func.jacfwd(lambda a: polar(a)[0])(A[0])
    assert torch.allclose(J_rev, J_fwd, atol=1e-12)


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        polar(torch.full((3, 3), float("nan"), dtype=torch.float64))
    with pytest.raises(ValueError):
        polar(torch.randn(3, 4, dtype=torch.float64))

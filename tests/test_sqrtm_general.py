"""The principal square root of general (non-Hermitian) matrices: values against SciPy, gradients
against finite differences of SciPy's sqrtm (complex step where real), every autograd mode, and the
principal-branch errors."""
import numpy as np
import pytest
import scipy.linalg
import torch

import adjointgen.torch as agt


def general(n=4, seed=0, dtype=torch.float64, batch=()):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*batch, n, n, dtype=dtype, generator=g) + 2 * n ** 0.5 * torch.eye(n, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_values_match_scipy(dtype):
    A = general(4, 1, dtype, (2,))
    X = agt.sqrtm(A)
    for i in range(2):
        want = scipy.linalg.sqrtm(A[i].numpy())
        assert np.abs(X[i].numpy() - want).max() < 1e-12
    assert X.dtype == dtype and torch.allclose(X @ X, A, atol=1e-12)


def test_frechet_derivative_matches_finite_differences_of_scipy():
    """Against fourth-order central differences of SciPy's sqrtm (a complex step does not apply:
    SciPy's Schur method is not analytic in a complex perturbation), in forward and reverse mode."""
    A = general(4, 2)
    E = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    f = lambda t: scipy.linalg.sqrtm(A.numpy() + t * E.numpy()).real
    h = 1e-3
    fd = (8 * (f(h) - f(-h)) - (f(2 * h) - f(-2 * h))) / (12 * h)
    _, tangent = torch.func.jvp(agt.sqrtm, (A,), (E,))
    assert np.abs(tangent.numpy() - fd).max() < 1e-9 * np.abs(fd).max()
    G = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    A1 = A.clone().requires_grad_()
    gA, = torch.autograd.grad((agt.sqrtm(A1) * G).sum(), A1)
    assert abs(float((gA * E).sum()) - float((G.numpy() * fd).sum())) < 1e-9 * float(np.abs(G.numpy() * fd).sum())


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_gradcheck_gradgradcheck_and_forward_mode(dtype):
    A = general(3, 5, dtype).requires_grad_()
    assert torch.autograd.gradcheck(agt.sqrtm, (A,))
    assert torch.autograd.gradgradcheck(agt.sqrtm, (A,))
    assert torch.autograd.gradcheck(agt.sqrtm, (A,), check_forward_ad=True, check_backward_ad=False,
                                    check_undefined_grad=False, check_batched_forward_grad=False)


def test_finite_differences_of_scipy_complex():
    A = general(3, 6, torch.complex128)
    E = torch.randn(3, 3, dtype=torch.complex128, generator=torch.Generator().manual_seed(7))
    h = 1e-6
    fd = (scipy.linalg.sqrtm((A + h * E).numpy()) - scipy.linalg.sqrtm((A - h * E).numpy())) / (2 * h)
    _, tangent = torch.func.jvp(agt.sqrtm, (A,), (E,))
    assert np.abs(tangent.numpy() - fd).max() < 1e-8 * np.abs(fd).max()


def test_transforms_and_batches():
    A = general(3, 8, batch=(2,))
    loss = lambda a: agt.sqrtm(a)[..., 0, :].pow(2).sum()
    g_vmap = torch.func.vmap(torch.func.grad(loss))(A)
    g_loop = torch.stack([torch.func.grad(loss)(a) for a in A])
    assert torch.allclose(g_vmap, g_loop, atol=1e-12)
    assert torch.allclose(torch.func.jacrev(agt.sqrtm)(A[0]), torch.func.jacfwd(agt.sqrtm)(A[0]), atol=1e-11)
    assert torch.isfinite(torch.func.hessian(loss)(A[0])).all()


def test_principal_branch_errors():
    A = torch.tensor([[-1.0, 1.0], [0.0, 2.0]], dtype=torch.float64)  # eigenvalue -1, not symmetric
    with pytest.raises(ValueError, match="-1"):
        agt.sqrtm(A)
    assert torch.allclose(agt.sqrtm(torch.eye(3, dtype=torch.float64) * 4), 2 * torch.eye(3, dtype=torch.float64))

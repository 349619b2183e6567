"""agt.signm / agj.signm (``derivations/signm.py``): values against SciPy, gradients against finite
differences (real and complex, second order), repeated eigenvalues (no special case: the rules
solve with A S = (A^2)^(1/2), never divide by a gap), batches, float32, torch.func transforms, and
the named error for an eigenvalue on the imaginary axis."""
import numpy as np
import pytest
import scipy.linalg
import torch

import adjointgen.torch as agt


def with_signs(n, seed=0, dtype=torch.float64, batch=()):
    """``V diag(1, -2, 3, -4, ...) V^-1``: eigenvalues on both sides of the imaginary axis."""
    g = torch.Generator().manual_seed(seed)
    V = torch.eye(n, dtype=dtype) + 0.3 * torch.randn(*batch, n, n, dtype=dtype, generator=g)
    w = torch.tensor([(1 + i) * (-1) ** i for i in range(n)], dtype=dtype)
    return (V * w[..., None, :]) @ torch.linalg.inv(V)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_values_match_scipy(dtype):
    A = with_signs(4, 1, dtype, (2,))
    S = agt.signm(A)
    assert S.dtype == dtype
    for i in range(2):
        assert np.abs(S[i].numpy() - scipy.linalg.signm(A[i].numpy())).max() < 1e-12
    assert torch.allclose(S @ S, torch.eye(4, dtype=dtype).expand(2, 4, 4), atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_gradcheck_gradgradcheck_and_forward_mode(dtype):
    A = with_signs(3, 2, dtype).requires_grad_()
    assert torch.autograd.gradcheck(agt.signm, (A,))
    assert torch.autograd.gradgradcheck(agt.signm, (A,))
    assert torch.autograd.gradcheck(agt.signm, (A,), check_forward_ad=True, check_backward_ad=False,
                                    check_undefined_grad=False, check_batched_forward_grad=False)


def test_derivative_matches_finite_differences_of_scipy():
    A = with_signs(4, 3)
    E = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    f = lambda t: scipy.linalg.signm(A.numpy() + t * E.numpy())  # noqa: E731
    h = 1e-4
    _, dS = torch.func.jvp(agt.signm, (A,), (E,))
    assert np.abs(dS.numpy() - (f(h) - f(-h)) / (2 * h)).max() < 1e-6


def test_repeated_eigenvalues_are_no_special_case():
    """A = diag(2, 2, -1) (a repeated eigenvalue, and a diagonalizable one): S = diag(1, 1, -1),
    and the derivative, dS = (dA - S dA S) / (|a_i| + |a_j|) entrywise, exists and is exact."""
    A = torch.diag(torch.tensor([2.0, 2.0, -1.0], dtype=torch.float64))
    S = agt.signm(A)
    assert torch.equal(S, torch.diag(torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64)))
    E = torch.randn(3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    _, dS = torch.func.jvp(agt.signm, (A,), (E,))
    a = torch.tensor([2.0, 2.0, 1.0], dtype=torch.float64)
    want = (E - S @ E @ S) / (a[:, None] + a[None, :])
    assert torch.allclose(dS, want, atol=1e-14, rtol=0)
    assert torch.autograd.gradcheck(agt.signm, (A.clone().requires_grad_(),))


def test_eigenvalue_on_the_imaginary_axis_raises():
    A = torch.tensor([[0.0, 1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 2.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"signm: the eigenvalue .*1j of A is on the imaginary axis"):
        agt.signm(A)
    with pytest.raises(ValueError, match=r"signm: the eigenvalue 0\+0j of A is on the imaginary axis"):
        agt.signm(torch.diag(torch.tensor([1.0, 0.0], dtype=torch.float64)))


def test_batches_empty_batch_and_float32():
    A = with_signs(3, 6, batch=(2, 2)).requires_grad_()
    S = agt.signm(A)
    gA, = torch.autograd.grad((S * S.detach()).sum(), A)
    for idx in [(0, 1), (1, 0)]:
        a = A[idx].detach().clone().requires_grad_()
        s = agt.signm(a)
        g, = torch.autograd.grad((s * s.detach()).sum(), a)
        assert torch.allclose(gA[idx], g, atol=1e-13, rtol=0)
    E = torch.zeros(0, 3, 3, dtype=torch.float64, requires_grad=True)
    S = agt.signm(E)
    assert S.shape == (0, 3, 3)
    S.sum().backward()
    assert E.grad.shape == E.shape
    A32 = with_signs(4, 7, torch.float32).requires_grad_()
    S32 = agt.signm(A32)
    assert S32.dtype == torch.float32
    g32, = torch.autograd.grad(S32[0].sum(), A32)
    A64 = A32.detach().double().requires_grad_()
    g64, = torch.autograd.grad(agt.signm(A64)[0].sum(), A64)
    assert g32.dtype == torch.float32 and torch.allclose(g32.double(), g64, atol=1e-4, rtol=0)


def test_torch_func_transforms():
    A = with_signs(3, 8)
    jr, jf = torch.func.jacrev(agt.signm)(A), torch.func.jacfwd(agt.signm)(A)
    assert torch.allclose(jr, jf, atol=1e-12, rtol=0)
    loss = lambda a: (agt.signm(a) * a).sum()  # noqa: E731
    assert torch.allclose(torch.func.hessian(loss)(A), torch.autograd.functional.hessian(loss, A), atol=1e-10, rtol=0)
    B = with_signs(3, 9, batch=(3,))
    assert torch.allclose(torch.func.vmap(agt.signm)(B), agt.signm(B), atol=1e-14, rtol=0)
    gv = torch.func.vmap(torch.func.grad(lambda a: agt.signm(a)[0, 1]))(B)
    B1 = B.clone().requires_grad_()
    gb, = torch.autograd.grad(agt.signm(B1)[:, 0, 1].sum(), B1)
    assert torch.allclose(gv, gb, atol=1e-12, rtol=0)


def test_jax_matches_torch_and_finite_differences():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from jax.test_util import check_grads

    import adjointgen.jax as agj

    for dtype, order in [(torch.float64, 2), (torch.complex128, 1)]:
        A = with_signs(3, 10, dtype)
        S = agj.signm(jnp.asarray(A.numpy()))
        assert np.abs(np.asarray(S) - agt.signm(A).numpy()).max() < 1e-13
        check_grads(agj.signm, (jnp.asarray(A.numpy()),), order=order, modes=("rev",))
    check_grads(agj.signm, (jnp.asarray(with_signs(3, 11).numpy()),), order=1, modes=("fwd",))
    with pytest.raises(ValueError, match="imaginary axis"):
        agj.signm(jnp.asarray([[0.0, 1.0], [-1.0, 0.0]]))

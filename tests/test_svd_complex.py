"""Complex SVD: the rule derived over complex matrices (phase gauge included) against
torch.linalg.svd's built-in backward, finite differences, the dot-product identity and the gauge
check for a loss that depends on the phase of a singular vector."""
import numpy as np
import pytest
import torch

import adjointgen.testing as agtest
import adjointgen.torch as agt
from adjointgen.generated.cupy import svd as rules_xp
from adjointgen.generated.torch import svd as rules
from adjointgen.runtime import gauge
from helpers import rel


def cmatrix(*shape, seed=0, dtype=torch.complex128):
    g = torch.Generator().manual_seed(seed)
    return torch.complex(torch.randn(*shape, dtype=torch.float64, generator=g),
                         torch.randn(*shape, dtype=torch.float64, generator=g)).to(dtype)


def invariant_loss(U, S, Vh, W1, W2):
    """Phase-invariant: U, Vh enter through projectors, |U| and U diag(S) Vh pieces."""
    Pu = U @ U.mH
    Pv = Vh.mH @ Vh
    part = U[..., :, :1] @ Vh[..., :1, :]  # the phase of pair 0 cancels
    return (S.pow(3).sum() + (Pu * W1).real.sum() + (Pv * W2).imag.sum() + U.abs().pow(3).sum()
            + (part.abs() ** 2).sum() * 0.3 + (part * W1[..., :, :1].conj()).real.sum())


@pytest.mark.parametrize("m, n, batch", [(7, 3, ()), (3, 7, ()), (5, 5, ()), (1, 4, ()), (6, 4, (2,))])
def test_gradient_matches_torch_builtin(m, n, batch):
    A = cmatrix(*batch, m, n, seed=m * 7 + n)
    W1, W2 = cmatrix(m, m, seed=1), cmatrix(n, n, seed=2)
    A1 = A.clone().requires_grad_()
    g1, = torch.autograd.grad(invariant_loss(*agt.svd(A1, full_matrices=False), W1, W2), A1)
    A2 = A.clone().requires_grad_()
    g2, = torch.autograd.grad(invariant_loss(*torch.linalg.svd(A2, full_matrices=False), W1, W2), A2)
    assert g1.dtype == torch.complex128
    assert rel(g1, g2) <= 1e-10


@pytest.mark.parametrize("m, n", [(6, 4), (4, 6), (5, 5)])
def test_gradient_matches_finite_differences(m, n):
    A, dA = cmatrix(m, n, seed=10), cmatrix(m, n, seed=11)
    W1, W2 = cmatrix(m, m, seed=3), cmatrix(n, n, seed=4)
    f = lambda A: invariant_loss(*agt.svd(A, full_matrices=False), W1, W2)
    A1 = A.clone().requires_grad_()
    g, = torch.autograd.grad(f(A1), A1)
    fd = agtest.central_difference(f, (A,), (dA,), eps=1e-5)
    directional = float(agtest.inner(g, dA))  # <g, dA> = Re tr(g^H dA)
    assert abs(directional - float(fd)) <= 1e-7 * max(1.0, abs(float(fd)))


def test_vjp_is_adjoint_of_jvp_under_real_inner_product():
    A, dA = cmatrix(6, 4, seed=20), cmatrix(6, 4, seed=21)
    U, S, Vh = torch.linalg.svd(A, full_matrices=False)
    V = Vh.mH
    gU, gV = cmatrix(6, 4, seed=22), cmatrix(4, 4, seed=23)
    gS = torch.randn(4, dtype=torch.float64)
    jvp = lambda dA: rules.svd_jvp_complex(U, S, V, dA)
    vjp = lambda gU, gS, gV: rules.svd_vjp_complex(U, S, V, gU, gS, gV)
    assert jvp(dA)[1].dtype == torch.float64
    # <gA, dA> = <gU, dU> + <gS, dS> + <gV, dV> under <X, Y> = Re tr(X^H Y)
    assert agtest.adjoint_check(jvp, vjp, (dA,), (gU, gS, gV), rtol=1e-12) <= 1e-12


def test_forward_mode_matches_finite_differences_of_invariants():
    A, dA = cmatrix(5, 3, seed=30), cmatrix(5, 3, seed=31)
    W1, W2 = cmatrix(5, 5, seed=5), cmatrix(3, 3, seed=6)
    f = lambda A: invariant_loss(*agt.svd(A, full_matrices=False), W1, W2)
    _, df = torch.func.jvp(f, (A,), (dA,))
    fd = agtest.central_difference(f, (A,), (dA,), eps=1e-5)
    assert abs(float(df) - float(fd)) <= 1e-7 * max(1.0, abs(float(fd)))
    _, (_, dS, _) = torch.func.jvp(agt.svd, (A,), (dA,))
    _, (_, rS, _) = torch.func.jvp(lambda a: torch.linalg.svd(a, full_matrices=False), (A,), (dA,))
    assert rel(dS, rS) < 1e-12


def test_second_derivatives_gradcheck():
    A = cmatrix(4, 3, seed=40).requires_grad_()
    W1, W2 = cmatrix(4, 4, seed=7), cmatrix(3, 3, seed=8)
    f = lambda A: invariant_loss(*agt.svd(A, full_matrices=False), W1, W2)
    assert torch.autograd.gradgradcheck(f, (A,), atol=1e-6, rtol=1e-5)


def test_phase_dependent_loss_raises_and_check_can_be_disabled():
    A = cmatrix(5, 3, seed=50).requires_grad_()
    U, S, Vh = agt.svd(A, full_matrices=False)
    with pytest.raises(gauge.PhaseDependentLossError, match="phase of column 0 of U and V"):
        torch.autograd.grad(U[0, 0].real, A)
    U, S, Vh = agt.svd(A, full_matrices=False)
    with gauge.disabled():  # no check (no host synchronisation): a gradient for the fixed gauge
        g, = torch.autograd.grad(U[0, 0].real, A)
    assert torch.isfinite(g).all() and gauge.enabled()
    # a phase-invariant loss passes the check also with a tiny cotangent
    U, S, Vh = agt.svd(A, full_matrices=False)
    g, = torch.autograd.grad(1e-12 * (U.abs() ** 2).sum() + S.sum(), A)
    assert torch.isfinite(g).all()


def test_gauge_residual_matches_its_definition():
    A = cmatrix(6, 4, seed=55)
    U, S, Vh = torch.linalg.svd(A, full_matrices=False)
    gU, gV = cmatrix(6, 4, seed=56), cmatrix(4, 4, seed=57)
    R = rules.svd_gauge(U, Vh.mH, gU, gV)
    expected = 1j * torch.diagonal(U.mH @ gU + Vh @ gV).imag
    assert rel(R, expected) < 1e-14


@pytest.mark.parametrize("m, n", [(7, 3), (3, 7)])
def test_full_matrices_complex_projector_loss_matches_finite_differences(m, n):
    A, dA = cmatrix(m, n, seed=60 + m), cmatrix(m, n, seed=61)
    Wm, Wn = cmatrix(m, m, seed=62), cmatrix(n, n, seed=63)
    k = min(m, n)

    def f(A):
        U, S, Vh = agt.svd(A, full_matrices=True)
        U2, V2 = U[..., :, k:], Vh[..., k:, :].mH
        return (((U2 @ U2.mH) * Wm).real.sum() + ((V2 @ V2.mH) * Wn).real.sum() + S.pow(2).sum()
                + (U[:, :k].abs() ** 2 * Wm[:, :k].real).sum())

    A1 = A.clone().requires_grad_()
    g, = torch.autograd.grad(f(A1), A1)
    fd = agtest.central_difference(f, (A,), (dA,), eps=1e-5)
    assert abs(float(agtest.inner(g, dA)) - float(fd)) <= 1e-7 * max(1.0, abs(float(fd)))
    _, df = torch.func.jvp(f, (A,), (dA,))
    assert abs(float(df) - float(fd)) <= 1e-7 * max(1.0, abs(float(fd)))


def test_complex64():
    A = cmatrix(8, 5, seed=70, dtype=torch.complex64).requires_grad_()
    W1, W2 = cmatrix(8, 8, seed=1, dtype=torch.complex64), cmatrix(5, 5, seed=2, dtype=torch.complex64)
    g1, = torch.autograd.grad(invariant_loss(*agt.svd(A, full_matrices=False), W1, W2), A)
    A2 = A.detach().clone().requires_grad_()
    g2, = torch.autograd.grad(invariant_loss(*torch.linalg.svd(A2, full_matrices=False), W1, W2), A2)
    assert g1.dtype == torch.complex64 and rel(g1, g2) < 1e-4


def test_numpy_backend_equals_torch_backend():
    A = cmatrix(2, 6, 4, seed=80)
    U, S, Vh = torch.linalg.svd(A, full_matrices=False)
    V = Vh.mH.resolve_conj()
    gU, gV, dA = cmatrix(2, 6, 4, seed=81), cmatrix(2, 4, 4, seed=82), cmatrix(2, 6, 4, seed=83)
    gS = torch.randn(2, 4, dtype=torch.float64)
    args = [x.numpy() for x in (U, S, V, gU, gS, gV)]
    np.testing.assert_allclose(rules_xp.svd_vjp_complex(*args), rules.svd_vjp_complex(U, S, V, gU, gS, gV).numpy(),
                               rtol=1e-11, atol=1e-11)
    for a, b in zip(rules_xp.svd_jvp_complex(U.numpy(), S.numpy(), V.numpy(), dA.numpy()),
                    rules.svd_jvp_complex(U, S, V, dA)):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(rules_xp.svd_gauge(U.numpy(), V.numpy(), gU.numpy(), gV.numpy()),
                               rules.svd_gauge(U, V, gU, gV).numpy(), rtol=1e-12, atol=1e-12)


def test_real_input_uses_the_real_specialisation():
    """On real data the complex rule reduces to the real one (the phase terms vanish)."""
    g = torch.Generator().manual_seed(90)
    A = torch.randn(6, 4, dtype=torch.float64, generator=g)
    U, S, Vh = torch.linalg.svd(A, full_matrices=False)
    gU, gV = torch.randn(6, 4, dtype=torch.float64, generator=g), torch.randn(4, 4, dtype=torch.float64, generator=g)
    gS = torch.randn(4, dtype=torch.float64, generator=g)
    real = rules.svd_vjp(U, S, Vh.mT, gU, gS, gV)
    as_complex = rules.svd_vjp_complex(*(x.to(torch.complex128) for x in (U,)), S, Vh.mT.to(torch.complex128),
                                       gU.to(torch.complex128), gS, gV.to(torch.complex128))
    assert rel(as_complex, real.to(torch.complex128)) < 1e-13


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu_and_check_can_skip_the_sync():
    A = cmatrix(2, 64, 32, seed=95)
    W1, W2 = cmatrix(64, 64, seed=96), cmatrix(32, 32, seed=97)
    A1 = A.clone().requires_grad_()
    g_cpu, = torch.autograd.grad(invariant_loss(*agt.svd(A1, full_matrices=False), W1, W2), A1)
    Ac = A.cuda().requires_grad_()
    g_gpu, = torch.autograd.grad(invariant_loss(*agt.svd(Ac, full_matrices=False), W1.cuda(), W2.cuda()), Ac)
    assert rel(g_gpu.cpu(), g_cpu) < 1e-10
    A2 = Ac.detach().clone().requires_grad_()
    U, S, Vh = agt.svd(A2, full_matrices=False)
    loss = (U.abs() ** 2).sum() + S.sum()
    with gauge.disabled():
        torch.cuda.set_sync_debug_mode("error")  # a device-to-host synchronisation in backward raises
        try:
            g, = torch.autograd.grad(loss, A2)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(g).all()

"""Hermitian eigh: the rule derived over complex matrices (eigenvector phases as a gauge) against
torch.linalg.eigh's built-in backward, finite differences and the phase check."""
import numpy as np
import pytest
import torch

import adjointgen.testing as agtest
import adjointgen.torch as agt
from adjointgen.generated.cupy import eigh as rules_xp
from adjointgen.generated.torch import eigh as rules
from adjointgen.runtime import gauge
from helpers import rel


def hermitian(*shape, seed=0, dtype=torch.complex128):
    g = torch.Generator().manual_seed(seed)
    X = torch.complex(torch.randn(*shape, dtype=torch.float64, generator=g),
                      torch.randn(*shape, dtype=torch.float64, generator=g))
    return ((X + X.mH) / 2).to(dtype)


def invariant_loss(w, V, W):
    """Phase-invariant: V enters through V diag(f(w)) V^H and |V|."""
    P = V @ torch.diag_embed(torch.sin(w).to(V.dtype)) @ V.mH
    return (P * W).real.sum() + (V.abs() ** 3).sum() + w.pow(2).sum()


@pytest.mark.parametrize("n, batch", [(1, ()), (4, ()), (7, ()), (5, (2,))])
def test_gradient_matches_torch_builtin(n, batch):
    A = hermitian(*batch, n, n, seed=n)
    W = hermitian(n, n, seed=100)
    A1 = A.clone().requires_grad_()
    g1, = torch.autograd.grad(invariant_loss(*agt.eigh(A1), W), A1)
    A2 = A.clone().requires_grad_()
    g2, = torch.autograd.grad(invariant_loss(*torch.linalg.eigh(A2), W), A2)
    assert g1.dtype == torch.complex128
    assert rel(g1, g2) <= 1e-10
    assert rel(g1, g1.mH) <= 1e-14  # Hermitian gradient


def test_gradient_and_forward_mode_match_finite_differences():
    A, dA, W = hermitian(6, 6, seed=10), hermitian(6, 6, seed=11), hermitian(6, 6, seed=12)
    f = lambda A: invariant_loss(*agt.eigh(A), W)
    A1 = A.clone().requires_grad_()
    g, = torch.autograd.grad(f(A1), A1)
    fd = float(agtest.central_difference(f, (A,), (dA,), eps=1e-5))  # along the Hermitian dA
    assert abs(float(agtest.inner(g, dA)) - fd) <= 1e-7 * max(1.0, abs(fd))  # <g, dA> = Re tr(g^H dA)
    _, df = torch.func.jvp(f, (A,), (dA,))
    assert abs(float(df) - fd) <= 1e-7 * max(1.0, abs(fd))
    _, (dw, _) = torch.func.jvp(agt.eigh, (A,), (dA,))
    assert dw.dtype == torch.float64
    # every Hermitian direction (Re and Im of each pair A[i, j] = conj(A[j, i])), both modes
    assert agtest.gradcheck(f, (A1,), symmetric=True, check_forward_ad=True)


def test_second_derivatives_gradcheck():
    A = hermitian(4, 4, seed=20).requires_grad_()
    W = hermitian(4, 4, seed=21)
    # perturbs A along Hermitian directions only: no symmetrisation (A + A^H) / 2 in f needed
    f = lambda A: invariant_loss(*agt.eigh(A), W)
    assert agtest.gradgradcheck(f, (A,), symmetric=True, atol=1e-6, rtol=1e-5)


def test_phase_dependent_loss_raises():
    A = hermitian(5, 5, seed=30).requires_grad_()
    w, V = agt.eigh(A)
    with pytest.raises(gauge.PhaseDependentLossError, match="phase of column 0 of V"):
        torch.autograd.grad(V[0, 0].imag + V[-1, 0].imag, A)  # Im moves with the phase (LAPACK makes V[0] real)


def test_numpy_backend_equals_torch_backend():
    A = hermitian(2, 6, 6, seed=40)
    w, V = torch.linalg.eigh(A)
    g = torch.Generator().manual_seed(41)
    gw = torch.randn(2, 6, dtype=torch.float64, generator=g)
    gV = hermitian(2, 6, 6, seed=42) @ V
    np.testing.assert_allclose(rules_xp.eigh_vjp_complex(w.numpy(), V.numpy(), gw.numpy(), gV.numpy()),
                               rules.eigh_vjp_complex(w, V, gw, gV).numpy(), rtol=1e-11, atol=1e-11)


def test_non_hermitian_complex_raises():
    A = hermitian(4, 4, seed=50)
    A[0, 1] += 1j
    with pytest.raises(ValueError, match="not Hermitian"):
        agt.eigh(A)
    with pytest.raises(ValueError, match="dtype"):  # complex A with a real B: one dtype, as torch has it
        agt.eigh(hermitian(3, 3), torch.eye(3, dtype=torch.float64))

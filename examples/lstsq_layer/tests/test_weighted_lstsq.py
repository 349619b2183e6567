"""The generated layer against torch's own least squares and finite differences."""
import torch

from lstsq_layer._adjoint.torch.weighted_lstsq import weighted_lstsq


def problem(seed=0, batch=()):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(*batch, 7, 3, dtype=torch.float64, generator=g)
    Q, _ = torch.linalg.qr(torch.randn(7, 7, dtype=torch.float64, generator=g))
    W = (Q * torch.linspace(0.5, 2.0, 7, dtype=torch.float64)) @ Q.mT
    B = torch.randn(*batch, 7, 2, dtype=torch.float64, generator=g)
    return A, 0.5 * (W + W.mT), B


def test_matches_lstsq_of_the_whitened_problem():
    A, W, B = problem()
    R = torch.linalg.cholesky(W).mT  # W = R^T R: minimise |R (A X - B)|
    want = torch.linalg.lstsq(R @ A, R @ B).solution
    assert torch.allclose(weighted_lstsq(A, W, B), want, atol=1e-12)


def test_gradcheck_in_every_input():
    A, W, B = problem(1)

    def f(A, S, B):  # W through a symmetric parametrisation, so finite differences stay symmetric
        return weighted_lstsq(A, 0.5 * (S + S.mT), B)

    inputs = tuple(x.clone().requires_grad_() for x in (A, W, B))
    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)


def test_batched_and_forward_mode():
    A, W, B = problem(2, batch=(3,))
    T = torch.randn_like(A)
    _, tangent = torch.func.jvp(lambda a: weighted_lstsq(a, W, B), (A,), (T,))
    eps = 1e-6
    fd = (weighted_lstsq(A + eps * T, W, B) - weighted_lstsq(A - eps * T, W, B)) / (2 * eps)
    assert torch.allclose(tangent, fd, atol=1e-7)


def test_bad_weight_is_refused():
    A, W, B = problem(3)
    try:
        weighted_lstsq(A, -W, B)
    except ValueError as exc:
        assert "positive definite" in str(exc)
    else:
        raise AssertionError("a negative definite W was accepted")

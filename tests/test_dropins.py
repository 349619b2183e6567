"""The values-only and ``_ex`` drop-ins: eigvalsh, svdvals, cholesky_ex, inv_ex (and eigh's UPLO),
against torch, with the derived rules' guarantees where a gradient follows."""
import pytest
import torch

import adjointgen
import adjointgen.torch as agt

f64 = torch.float64


def _sym(*batch, n=4, dtype=f64, seed=0):
    X = torch.randn(*batch, n, n, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    return X + X.mH


@pytest.mark.parametrize("dtype", [torch.float32, f64, torch.complex128], ids=str)
def test_values_match_torch_with_and_without_a_gradient(dtype):
    A = _sym(2, 3, dtype=dtype)
    M = torch.randn(2, 5, 3, dtype=dtype)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    for uplo in ("L", "U"):
        torch.testing.assert_close(agt.eigvalsh(A, uplo), torch.linalg.eigvalsh(A, uplo), **tol)
        torch.testing.assert_close(agt.eigh(A, uplo)[0], torch.linalg.eigh(A, uplo)[0], **tol)
    torch.testing.assert_close(agt.svdvals(M), torch.linalg.svdvals(M), **tol)
    Ar, Mr = A.clone().requires_grad_(), M.clone().requires_grad_()
    torch.testing.assert_close(agt.eigvalsh(Ar), torch.linalg.eigvalsh(A), **tol)
    torch.testing.assert_close(agt.svdvals(Mr), torch.linalg.svdvals(M), **tol)
    (g,) = torch.autograd.grad(agt.eigvalsh(Ar).square().sum(), Ar)
    torch.testing.assert_close(g, 2 * A, **tol)  # d tr(A^2) = 2 A
    (g,) = torch.autograd.grad(agt.svdvals(Mr).square().sum(), Mr)
    torch.testing.assert_close(g, 2 * M, **tol)  # d ||M||_F^2 = 2 M


def test_transforms_follow_the_derived_rules():
    A = _sym(n=5)
    torch.testing.assert_close(torch.func.jacfwd(agt.eigvalsh)(A), torch.func.jacfwd(torch.linalg.eigvalsh)(A))
    torch.testing.assert_close(torch.func.jacrev(agt.eigvalsh)(A), torch.func.jacrev(torch.linalg.eigvalsh)(A))
    M = torch.randn(3, 6, 4, dtype=f64)
    torch.testing.assert_close(torch.func.vmap(torch.func.jacrev(agt.svdvals))(M),
                               torch.func.vmap(torch.func.jacrev(torch.linalg.svdvals))(M))
    assert torch.autograd.gradgradcheck(agt.svdvals, (M[0].clone().requires_grad_(),))


def test_at_a_cluster_symmetric_functions_are_exact_and_single_values_raise():
    Q = torch.linalg.qr(torch.randn(4, 4, dtype=f64, generator=torch.Generator().manual_seed(2)))[0]
    A = (Q * torch.tensor([1.0, 2.0, 2.0, 3.0], dtype=f64)) @ Q.mT
    A = ((A + A.mT) / 2).requires_grad_()
    (g,) = torch.autograd.grad(agt.eigvalsh(A)[1:3].sum(), A)
    torch.testing.assert_close(g, Q[:, 1:3] @ Q[:, 1:3].mT)  # the projector onto the cluster
    with pytest.raises(adjointgen.DegenerateSubspaceError):
        torch.autograd.grad(agt.eigvalsh(A)[1], A)  # torch returns a one-sided derivative


def test_bad_input_raises():
    with pytest.raises(ValueError, match="UPLO"):
        agt.eigvalsh(_sym(), "X")
    with pytest.raises(ValueError, match="symmetric"):
        agt.eigvalsh(torch.randn(3, 3, dtype=f64) + torch.triu(torch.ones(3, 3, dtype=f64), 1))
    with pytest.raises(ValueError):
        agt.svdvals(torch.tensor([[float("nan")]]))


def test_cholesky_ex_and_inv_ex_report_failures_as_torch_does():
    A = torch.eye(3, dtype=f64).repeat(3, 1, 1)
    A[1, 2, 2] = -1.0
    L, info = agt.cholesky_ex(A)
    Lt, infot = torch.linalg.cholesky_ex(A)
    assert torch.equal(info, infot) and info.dtype == torch.int32
    torch.testing.assert_close(L[info == 0], Lt[infot == 0])
    with pytest.raises(adjointgen.NotPositiveDefiniteError, match="batch index"):
        agt.cholesky_ex(A, check_errors=True)
    good = _sym(2) + 10 * torch.eye(4, dtype=f64)
    good.requires_grad_()
    L, info = agt.cholesky_ex(good, upper=True)
    assert info.shape == (2,) and not info.any()
    torch.testing.assert_close(L, torch.linalg.cholesky(good, upper=True))
    (g,) = torch.autograd.grad(L.sum(), good)
    (gt,) = torch.autograd.grad(torch.linalg.cholesky(good, upper=True).sum(), good)
    torch.testing.assert_close(g, (gt + gt.mT) / 2)  # torch's gradient is not symmetrized, ours is

    S = torch.zeros(2, 3, 3, dtype=f64)
    S[0] = torch.eye(3)
    X, info = agt.inv_ex(S)
    assert torch.equal(info, torch.linalg.inv_ex(S).info)
    torch.testing.assert_close(X[0], torch.eye(3, dtype=f64))
    with pytest.raises(adjointgen.SingularMatrixError):
        agt.inv_ex(S, check_errors=True)
    B = (torch.randn(4, 4, dtype=f64) + 4 * torch.eye(4, dtype=f64)).requires_grad_()
    X, info = agt.inv_ex(B)
    (g,) = torch.autograd.grad(X.sum(), B)
    (gt,) = torch.autograd.grad(torch.linalg.inv(B).sum(), B)
    torch.testing.assert_close(g, gt)


def test_solve_ex_and_lu_factor_ex_report_failures_as_torch_does():
    S = torch.zeros(2, 3, 3, dtype=f64)
    S[0] = torch.eye(3)
    B = torch.randn(2, 3, 2, dtype=f64)
    X, info = agt.solve_ex(S, B)
    assert torch.equal(info, torch.linalg.solve_ex(S, B).info) and info.dtype == torch.int32
    torch.testing.assert_close(X[0], B[0])
    LU, piv, info = agt.lu_factor_ex(S)
    assert torch.equal(info, torch.linalg.lu_factor_ex(S).info)
    for f in (lambda: agt.solve_ex(S, B, check_errors=True), lambda: agt.lu_factor_ex(S, check_errors=True)):
        with pytest.raises(adjointgen.SingularMatrixError):
            f()
    # invertible: the derived rules, torch's values and gradients; info of A's batch shape also where B broadcasts
    A = (torch.randn(2, 4, 4, dtype=f64) + 4 * torch.eye(4, dtype=f64)).requires_grad_()
    Bv = torch.randn(5, 2, 4, 3, dtype=f64)
    X, info = agt.solve_ex(A, Bv, left=True)
    Xt, infot = torch.linalg.solve_ex(A, Bv)
    assert info.shape == infot.shape and not info.any()
    (g,) = torch.autograd.grad(X.sum(), A)
    (gt,) = torch.autograd.grad(Xt.sum(), A)
    torch.testing.assert_close(g, gt)
    LU, piv, info = agt.lu_factor_ex(A)
    LUt, pivt, infot = torch.linalg.lu_factor_ex(A)
    torch.testing.assert_close(LU, LUt)
    assert torch.equal(piv, pivt) and torch.equal(info, infot)
    (g,) = torch.autograd.grad((LU ** 2).sum(), A)
    (gt,) = torch.autograd.grad((LUt ** 2).sum(), A)
    torch.testing.assert_close(g, gt)


def test_every_torch_linalg_function_is_here():
    """``adjointgen.torch`` stands in for the whole ``torch.linalg`` namespace: the decompositions and
    solves with derived rules, the rest as torch has them."""
    names = [n for n in dir(torch.linalg) if not n.startswith("_") and callable(getattr(torch.linalg, n))
             and not isinstance(getattr(torch.linalg, n), type)]
    assert not [n for n in names if not hasattr(agt, n)]
    assert agt.matrix_norm is torch.linalg.matrix_norm and agt.solve is not torch.linalg.solve

"""agt.schur / agj.schur (``derivations/schur.py``): values against SciPy, gradients against finite
differences of the real form (real eigenvalues) and of losses invariant to the complex form's phase
gauge (|T|, diag(T), the projectors onto leading invariant subspaces), complex outputs of real data,
batches, float32, torch.func transforms, and the named errors: repeated eigenvalues, 2 x 2 blocks of
the real form (pointing at output='complex'), a phase-dependent loss."""
import numpy as np
import pytest
import scipy.linalg
import torch

import adjointgen
import adjointgen.torch as agt
from adjointgen import PhaseDependentLossError
from adjointgen.runtime.checks import SingularMatrixError


def distinct(n, seed=0, dtype=torch.float64, batch=()):
    """``V diag(w) V^-1`` with eigenvalues about 1.5 apart (real ones for real dtypes)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.arange(n, dtype=torch.float64) * 1.5 - n / 2 + 0.3 * torch.rand(n, dtype=torch.float64, generator=g)
    if dtype.is_complex:
        w = w + 0.5j * torch.rand(n, dtype=torch.float64, generator=g)
    V = torch.eye(n, dtype=dtype) + 0.3 * torch.randn(*batch, n, n, dtype=dtype, generator=g)
    return (V * w.to(dtype)) @ torch.linalg.inv(V)


def invariants(k):
    """A loss's inputs that the phases of Z do not change: |T|, diag(T), Z[:, :k] Z[:, :k]^H."""
    def f(A, output="complex"):
        T, Z = agt.schur(A, output=output)
        Zk = Z[..., :k]
        return T.abs(), T.diagonal(dim1=-2, dim2=-1), Zk @ Zk.mH
    return f


@pytest.mark.parametrize("dtype,output", [(torch.float64, "real"), (torch.float64, "complex"),
                                          (torch.complex128, "complex"), (torch.complex128, "real")])
def test_values_match_scipy(dtype, output):
    A = distinct(4, 1, dtype, (2,))
    T, Z = agt.schur(A, output=output)
    assert T.dtype == Z.dtype == (dtype if output == "real" else torch.complex128)
    for i in range(2):
        t, z = scipy.linalg.schur(A[i].numpy(), output=output)
        assert np.abs(T[i].numpy() - t).max() < 1e-13 and np.abs(Z[i].numpy() - z).max() < 1e-13
    assert torch.allclose(Z @ T @ Z.mH, A.to(T.dtype), atol=1e-12, rtol=0)


def test_real_form_gradcheck_gradgradcheck_and_forward_mode():
    """The real form of a real A with real eigenvalues: the gauge is the signs of Z's columns (no
    residual), so every output is differentiable."""
    A = distinct(3, 2).requires_grad_()
    assert torch.autograd.gradcheck(agt.schur, (A,))
    assert torch.autograd.gradgradcheck(agt.schur, (A,))
    assert torch.autograd.gradcheck(agt.schur, (A,), check_forward_ad=True, check_backward_ad=False,
                                    check_undefined_grad=False, check_batched_forward_grad=False)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_complex_form_invariant_losses_gradcheck(dtype):
    """The complex form (of complex data, and of real data: its cotangent is the real part) through
    the losses the phases leave unchanged."""
    A = distinct(3, 3, dtype).requires_grad_()
    assert torch.autograd.gradcheck(invariants(1), (A,))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_complex_form_invariant_losses_second_order(dtype):
    A = distinct(3, 3, dtype).requires_grad_()
    for k in (1, 2):
        assert torch.autograd.gradgradcheck(invariants(k), (A,))


def test_derivative_matches_finite_differences_of_scipy():
    A = distinct(4, 4)
    E = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    f = lambda t: scipy.linalg.schur(A.numpy() + t * E.numpy())  # noqa: E731
    h = 1e-4
    (tp, zp), (tm, zm) = f(h), f(-h)
    _, (dT, dZ) = torch.func.jvp(agt.schur, (A,), (E,))
    assert np.abs(dT.numpy() - (tp - tm) / (2 * h)).max() < 1e-6
    assert np.abs(dZ.numpy() - (zp - zm) / (2 * h)).max() < 1e-6


def test_repeated_eigenvalue_raises():
    A = torch.tensor([[1.0, 2.0, 0.5], [0.0, 1.0, 3.0], [0.0, 0.0, 2.0]], dtype=torch.float64)  # defective
    for B in [A, torch.diag(torch.tensor([1.0, 1.0, 2.0], dtype=torch.float64))]:  # and not defective
        B = B.clone().requires_grad_()
        T, Z = agt.schur(B)
        with pytest.raises(SingularMatrixError, match=r"equal to rounding \(a repeated eigenvalue"):
            torch.autograd.grad(T.abs().sum() + Z.sum(), B)


def test_real_form_with_a_2x2_block_points_at_the_complex_form():
    # eigenvalues 1 +- i sqrt(3) and 3; a block that is not normal (else |T[0, 1]| = 0 has a kink)
    A = torch.tensor([[1.0, -3.0, 1.0], [1.0, 1.0, 0.5], [0.0, 0.0, 3.0]], dtype=torch.float64, requires_grad=True)
    T, Z = agt.schur(A)
    assert T[1, 0] != 0
    with pytest.raises(ValueError, match=r"2 x 2 block of a real Schur form .* \(output='complex'\)"):
        torch.autograd.grad(T.abs().sum(), A)
    with pytest.raises(ValueError, match=r"2 x 2 block of a real Schur form"):
        torch.func.jvp(agt.schur, (A.detach(),), (torch.ones(3, 3, dtype=torch.float64),))
    # the complex form of the same A is differentiable along invariant losses, in both modes
    f = invariants(1)
    assert torch.autograd.gradcheck(f, (A,))
    assert torch.autograd.gradcheck(f, (A,), check_forward_ad=True, check_backward_ad=False,
                                    check_undefined_grad=False, check_batched_forward_grad=False)


def test_phase_dependent_loss_raises():
    A = distinct(3, 6, torch.complex128).requires_grad_()
    T, Z = agt.schur(A, output="complex")
    with pytest.raises(PhaseDependentLossError, match="schur: the loss depends on the phase"):
        torch.autograd.grad(Z[0].real.sum(), A)
    T, Z = agt.schur(A, output="complex")
    with pytest.raises(PhaseDependentLossError):
        torch.autograd.grad(T[0, 1].real, A)
    T, Z = agt.schur(A, output="complex")  # invariant: no error
    gA, = torch.autograd.grad(T.abs().sum() + (Z[:, :2] @ Z[:, :2].mH).real.sum(), A)
    assert torch.isfinite(torch.view_as_real(gA)).all()


def test_batches_empty_batch_and_float32():
    A = distinct(3, 7, batch=(2, 2)).requires_grad_()
    T, Z = agt.schur(A)
    gA, = torch.autograd.grad(T.sum() + Z[..., 0].sum(), A)
    for idx in [(0, 1), (1, 0)]:
        a = A[idx].detach().clone().requires_grad_()
        t, z = agt.schur(a)
        g, = torch.autograd.grad(t.sum() + z[..., 0].sum(), a)
        assert torch.allclose(gA[idx], g, atol=1e-13, rtol=0)
    E = torch.zeros(0, 3, 3, dtype=torch.float64, requires_grad=True)
    T, Z = agt.schur(E)
    assert T.shape == Z.shape == (0, 3, 3)
    (T.sum() + Z.sum()).backward()
    assert E.grad.shape == E.shape
    A32 = distinct(4, 8).float().requires_grad_()
    T32, Z32 = agt.schur(A32)
    assert T32.dtype == Z32.dtype == torch.float32
    g32, = torch.autograd.grad(T32.triu(1).sum(), A32)
    A64 = A32.detach().double().requires_grad_()
    g64, = torch.autograd.grad(agt.schur(A64)[0].triu(1).sum(), A64)
    assert g32.dtype == torch.float32 and torch.allclose(g32.double(), g64, atol=1e-3, rtol=0)


def test_torch_func_transforms():
    A = distinct(3, 9)
    T_of = lambda a: agt.schur(a)[0]  # noqa: E731
    assert torch.allclose(torch.func.jacrev(T_of)(A), torch.func.jacfwd(T_of)(A), atol=1e-12, rtol=0)
    loss = lambda a: (agt.schur(a)[0].triu(1) ** 2).sum()  # noqa: E731
    assert torch.allclose(torch.func.hessian(loss)(A), torch.autograd.functional.hessian(loss, A), atol=1e-10, rtol=0)
    B = distinct(3, 10, batch=(3,))
    Tv, Zv = torch.func.vmap(agt.schur)(B)
    Tb, Zb = agt.schur(B)
    assert torch.allclose(Tv, Tb, atol=1e-14, rtol=0) and torch.allclose(Zv, Zb, atol=1e-14, rtol=0)


def test_jax_matches_torch_and_finite_differences():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from jax.test_util import check_grads

    import adjointgen.jax as agj

    A = distinct(3, 11)
    T, Z = agj.schur(jnp.asarray(A.numpy()))
    t, z = agt.schur(A)
    assert np.abs(np.asarray(T) - t.numpy()).max() < 1e-13 and np.abs(np.asarray(Z) - z.numpy()).max() < 1e-13
    check_grads(agj.schur, (jnp.asarray(A.numpy()),), order=1, modes=("rev",))
    Ac = jnp.asarray(distinct(3, 12, torch.complex128).numpy())

    def invariant(a):
        T, Z = agj.schur(a, output="complex")
        return jnp.abs(T), jnp.diagonal(T), Z[:, :1] @ Z[:, :1].conj().T

    check_grads(invariant, (Ac,), order=1, modes=("fwd", "rev"))
    A2 = jnp.asarray([[1.0, -3.0, 1.0], [1.0, 1.0, 0.5], [0.0, 0.0, 3.0]])  # a 2 x 2 block in the real form
    check_grads(invariant, (A2,), order=1, modes=("fwd", "rev"))
    with pytest.raises(ValueError, match=r"\(output='complex'\)"):
        jax.grad(lambda a: jnp.abs(agj.schur(a)[0]).sum())(A2)
    with pytest.raises(PhaseDependentLossError):
        jax.grad(lambda a: jnp.real(agj.schur(a, output="complex")[1][0, 0]))(Ac)


@pytest.mark.slow
def test_jax_second_order_both_modes():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from jax.test_util import check_grads

    import adjointgen.jax as agj

    check_grads(agj.schur, (jnp.asarray(distinct(3, 13).numpy()),), order=2, modes=("fwd", "rev"))

    def invariant(a):
        T, Z = agj.schur(a, output="complex")
        return jnp.abs(T), jnp.diagonal(T), Z[:, :2] @ Z[:, :2].conj().T

    check_grads(invariant, (jnp.asarray(distinct(3, 14, torch.complex128).numpy()),), order=2, modes=("fwd", "rev"))


def test_host_computations_run_numpys_blas_on_one_thread_and_restore_it():
    """runtime.host.single_threaded_blas: OpenBLAS on one thread for a host computation between torch's
    CPU operations (both pools contending for the cores cost 10-50x on 2 cores), its setting after."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from adjointgen.runtime.host import single_threaded_blas

    def blas_threads():
        return {i["filepath"]: i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"}

    before = blas_threads()
    assert before
    with single_threaded_blas():
        assert set(blas_threads().values()) == {1}
    assert blas_threads() == before


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128, torch.float32])
@pytest.mark.parametrize("upper", [True, False])
def test_triangular_sylvester_block_solve_is_the_column_solve(dtype, upper):
    """runtime.linalg.triangular_sylvester_solve: LAPACK's block solve on the host where no derivative of
    the solve is taken (a first-order backward), the differentiable column solve where one is; the
    same solution of tril(X T - T X, -1) = tril(C, -1), batched, odd and even sizes."""
    from adjointgen.runtime.linalg import triangular_sylvester_solve

    g = torch.Generator().manual_seed(5)
    for n in (1, 2, 7, 16):
        T = torch.randn(3, n, n, dtype=dtype, generator=g).triu() + torch.diag(torch.arange(n, dtype=torch.float64) * 2).to(dtype)
        T = T if upper else T.mT
        C = torch.randn(3, n, n, dtype=dtype, generator=g)
        with torch.no_grad():
            blocks = triangular_sylvester_solve(T, C, upper=upper)
        columns = triangular_sylvester_solve(T.clone().requires_grad_(), C, upper=upper).detach()
        tol = 1e-4 if dtype == torch.float32 else 1e-11
        assert blocks.dtype == columns.dtype == dtype and torch.equal(blocks, blocks.tril(-1))
        assert torch.allclose(blocks, columns, atol=tol, rtol=tol)
        R = (blocks @ T - T @ blocks).tril(-1)
        assert torch.allclose(R, C.tril(-1), atol=10 * tol, rtol=tol)
    T = torch.diag(torch.tensor([1.0, 2.0, 1.0], dtype=torch.float64))
    with torch.no_grad(), pytest.raises(adjointgen.SingularMatrixError, match="equal to rounding"):
        triangular_sylvester_solve(T, torch.ones(3, 3, dtype=torch.float64))

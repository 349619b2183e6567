"""The Sylvester step: the engine's solve_sylvester (refuses what it cannot solve) and the runtime
solvers the generated code calls (torch, NumPy, JAX) against SciPy, with their derivatives, also
where A has repeated eigenvalues."""
import numpy as np
import pytest
import scipy.linalg
import torch

from adjointgen.calculus import Derivation, DerivationError, Identity
from adjointgen.runtime import xp as runtime_xp
from adjointgen.runtime.checks import SingularMatrixError
from adjointgen.runtime.linalg import sylvester


def spd(n, dtype=torch.float64, seed=0):
    X = torch.randn(n, n, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    return X @ X.mH + n * torch.eye(n, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_torch_solver_matches_scipy_and_differentiates(dtype):
    A, B = spd(4, dtype, 1), spd(4, dtype, 2)
    C = torch.randn(2, 4, 4, dtype=dtype, generator=torch.Generator().manual_seed(3))
    X = sylvester(A, B, C)  # broadcasting over C's batch
    for i in range(2):
        want = scipy.linalg.solve_sylvester(A.numpy(), B.numpy(), C[i].numpy())
        assert np.abs(X[i].numpy() - want).max() < 1e-13
    herm = lambda a: (a + a.mH) / 2
    f = lambda a, b, c: sylvester(herm(a), herm(b), c)
    inputs = [t.clone().requires_grad_() for t in (A, B, C[0])]
    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)
    assert torch.autograd.gradcheck(f, inputs, check_forward_ad=True, check_backward_ad=False,
                                    check_undefined_grad=False,
                                    # complex: torch's batched forward AD asserts on the test's own a.mH
                                    # view of a dual input (before our function is reached)
                                    check_batched_forward_grad=not dtype.is_complex)


def test_repeated_eigenvalues_and_transforms():
    """At A = B = I (one n-fold eigenvalue) derivatives of every order exist and are exact: the
    solver's derivatives are Sylvester solves, not eigh's."""
    C = torch.randn(3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    I = torch.eye(3, dtype=torch.float64)
    loss = lambda p: sylvester((p + p.mT) / 2, (p + p.mT) / 2, C).pow(2).sum()
    H = torch.func.hessian(loss)(I)
    h = 1e-4
    E = torch.zeros(3, 3, dtype=torch.float64)
    E[0, 1] = 1
    g = torch.func.grad(loss)
    fd = (g(I + h * E) - g(I - h * E)) / (2 * h)
    assert torch.allclose(H[0, 1], fd, atol=1e-7)
    batch = torch.stack([spd(3, seed=5), spd(3, seed=6)])
    Cs = torch.randn(2, 3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    assert torch.allclose(torch.func.vmap(lambda a, c: sylvester(a, a, c))(batch, Cs), sylvester(batch, batch, Cs))


def test_singular_equation_raises():
    A = torch.diag(torch.tensor([1.0, -1.0, 2.0], dtype=torch.float64))
    with pytest.raises(SingularMatrixError, match="negative"):
        sylvester(A, A, torch.ones(3, 3, dtype=torch.float64))


def test_numpy_and_jax_solvers_match_scipy():
    A, B = spd(4, seed=8).numpy(), spd(4, seed=9).numpy()
    C = np.random.default_rng(0).standard_normal((4, 4))
    want = scipy.linalg.solve_sylvester(A, B, C)
    assert np.abs(runtime_xp.sylvester(np, A, B, C) - want).max() < 1e-13
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from jax.test_util import check_grads

    from adjointgen.runtime import jax as runtime_jax

    assert np.abs(np.asarray(runtime_jax.sylvester(jnp, jnp.asarray(A), jnp.asarray(B), jnp.asarray(C))) - want).max() < 1e-12
    herm = lambda a: (a + a.T) / 2
    check_grads(lambda a, c: runtime_jax.sylvester(jnp, herm(a), herm(a), c), (jnp.asarray(A), jnp.asarray(C)),
                order=2, modes=("fwd", "rev"))


def lyapunov_derivation(symmetric):
    d = Derivation("lyap", __file__, title="test")
    n = d.dim("n")
    A = d.input("A", n, n, symmetric=symmetric)
    X = d.output("X", n, n)
    C = d.input("C", n, n)
    eq = d.identity("A X + X A = C", A * X + X * A, C)
    return d, eq, A, X


def test_solve_sylvester_step_solves_and_refuses():
    d, eq, A, X = lyapunov_derivation(True)
    solved = d.solve_sylvester(eq, X, A)
    assert str(solved.rhs) == "Syl[A, A](C)"
    assert solved.rhs.hermitian
    d, eq, A, X = lyapunov_derivation(False)  # a general A: Bartels-Stewart in the generated code
    assert not d.solve_sylvester(eq, X, A).rhs.hermitian
    d, _, A, X = lyapunov_derivation(True)
    wrong = d.identity("A X - X A = 0", A * X - X * A, 0 * Identity(A.shape[0]))
    with pytest.raises(DerivationError, match="no terms"):
        d.solve_sylvester(wrong, X, A)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_general_solver_matches_scipy_and_differentiates(dtype):
    g = torch.Generator().manual_seed(10)
    A = torch.randn(4, 4, dtype=dtype, generator=g) + 4 * torch.eye(4, dtype=dtype)
    B = torch.randn(4, 4, dtype=dtype, generator=g) + 4 * torch.eye(4, dtype=dtype)
    C = torch.randn(2, 4, 4, dtype=dtype, generator=g)
    X = sylvester(A, B, C, hermitian=False)
    assert float((A @ X + X @ B - C).abs().max()) < 1e-13
    f = lambda a, b, c: sylvester(a, b, c, hermitian=False)
    inputs = [t.clone().requires_grad_() for t in (A, B, C[0])]
    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)
    # (not batched: vmap over the dual-number forward AD reaches the host solver with batched tensors;
    # torch.func's jacfwd, jacrev and hessian below go through the vmap rule)
    assert torch.autograd.gradcheck(f, inputs, check_forward_ad=True, check_backward_ad=False,
                                    check_undefined_grad=False, check_batched_forward_grad=False)
    if not dtype.is_complex:  # (torch.func.jacrev takes real inputs only)
        J = torch.func.jacrev(lambda a: f(a, B, C[0]))(A)
        assert torch.allclose(J, torch.func.jacfwd(lambda a: f(a, B, C[0]))(A), atol=1e-12)
    assert torch.allclose(torch.func.vmap(lambda c: f(A, B, c))(C), X)
    assert np.abs(runtime_xp.sylvester(np, A.numpy(), B.numpy(), C.numpy(), hermitian=False) - X.numpy()).max() < 1e-13
    with pytest.raises(SingularMatrixError):
        sylvester(A, -A, C[0], hermitian=False)


@pytest.mark.parametrize("route", ["hermitian", "general", "numpy", "numpy hermitian"])
def test_every_route_names_the_eigenvalues_that_collide(route):
    """A singular equation (an eigenvalue of A the negative of one of B) raises on every route,
    naming both eigenvalues: the Bartels-Stewart solver would otherwise perturb them silently."""
    A = torch.diag(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    B = torch.diag(torch.tensor([5.0, -2.0], dtype=torch.float64))
    V = torch.tensor([[1.0, 0.5], [0.0, 1.0]], dtype=torch.float64)
    C = torch.ones(3, 2, dtype=torch.float64)
    if route == "hermitian":
        call = lambda: sylvester(A, B, C)
    elif route == "general":
        call = lambda: sylvester(A, V @ B @ torch.linalg.inv(V), C, hermitian=False)
    elif route == "numpy":
        call = lambda: runtime_xp.sylvester(np, A.numpy(), (V @ B @ torch.linalg.inv(V)).numpy(), C.numpy(),
                                            hermitian=False)
    else:
        call = lambda: runtime_xp.sylvester(np, A.numpy(), B.numpy(), C.numpy())
    with pytest.raises(SingularMatrixError, match=r"a_\d = 2 of A is, to rounding, the negative of the eigenvalue "
                                                  r"b_\d = -2 of B"):
        call()


def test_bartels_stewart_one_schur_form_for_a_and_its_adjoint():
    """``b = a`` (square roots) and ``b = a^H`` (Lyapunov) take one Schur form; the solution matches
    SciPy's (and satisfies the equation where SciPy's does not: complex ``a`` with real ``b``), real
    data stays real, and a batch element that fails is named."""
    rng = np.random.default_rng(11)
    for a in (rng.standard_normal((5, 5)), rng.standard_normal((5, 5)) + 1j * rng.standard_normal((5, 5))):
        a = a - 4 * np.eye(5)
        c = rng.standard_normal((5, 5))
        for b in (a, a.conj().T, rng.standard_normal((5, 5)) - 4 * np.eye(5)):
            x = runtime_xp.bartels_stewart(a, b, c)
            assert np.abs(a @ x + x @ b - c).max() < 1e-13
            if np.iscomplexobj(a) == np.iscomplexobj(b):  # (SciPy 1.17 solves complex a, real b wrongly)
                assert np.abs(x - scipy.linalg.solve_sylvester(a, b, c)).max() < 1e-13
            assert np.iscomplexobj(x) == np.iscomplexobj(a)
    a = np.stack([np.eye(2), np.diag([1.0, -1.0])])
    with pytest.raises(SingularMatrixError, match=r"batch index \(1,\)"):
        runtime_xp.sylvester(np, a, a, np.ones((2, 2, 2)), hermitian=False)


# ---------------------------------------------------------------- the public operations (issue 44)
def _shifted(m, n, seed, dtype=torch.float64, batch=(), shift=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*batch, m, n, dtype=dtype, generator=g) + shift * 2 * m ** 0.5 * torch.eye(m, n, dtype=dtype)


def _sylvester_inputs(dtype=torch.float64, batch=(), seed=20, m=4, n=3):
    return _shifted(m, m, seed, dtype, batch), _shifted(n, n, seed + 1, dtype, batch), \
        _shifted(m, n, seed + 2, dtype, batch, shift=0.0)


def _lyapunov_inputs(dtype=torch.float64, batch=(), seed=30, n=4):
    return _shifted(n, n, seed, dtype, batch, shift=-1.0), _shifted(n, n, seed + 1, dtype, batch, shift=0.0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_solve_sylvester_and_lyapunov_match_scipy(dtype):
    import adjointgen.torch as agt

    A, B, Q = _sylvester_inputs(dtype, (2,))
    X = agt.solve_sylvester(A, B, Q)
    assert X.shape == Q.shape and X.dtype == dtype
    for i in range(2):
        assert np.abs(X[i].numpy() - scipy.linalg.solve_sylvester(A[i].numpy(), B[i].numpy(), Q[i].numpy())).max() < 1e-13
    A, Q = _lyapunov_inputs(dtype, (2,))
    X = agt.solve_continuous_lyapunov(A, Q)
    assert X.dtype == dtype
    for i in range(2):
        assert np.abs(X[i].numpy() - scipy.linalg.solve_continuous_lyapunov(A[i].numpy(), Q[i].numpy())).max() < 1e-13


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_solve_sylvester_and_lyapunov_gradients(dtype):
    import adjointgen.torch as agt

    for f, inputs in [(agt.solve_sylvester, _sylvester_inputs(dtype, m=3, n=2)),
                      (agt.solve_continuous_lyapunov, _lyapunov_inputs(dtype, n=3))]:
        inputs = [t.clone().requires_grad_() for t in inputs]
        assert torch.autograd.gradcheck(f, inputs)
        assert torch.autograd.gradgradcheck(f, inputs)
        assert torch.autograd.gradcheck(f, inputs, check_forward_ad=True, check_backward_ad=False,
                                        check_undefined_grad=False, check_batched_forward_grad=False)


def test_lyapunov_derivative_matches_finite_differences_of_scipy():
    import adjointgen.torch as agt

    A, Q = _lyapunov_inputs()
    g = torch.Generator().manual_seed(40)
    dA, dQ = torch.randn(4, 4, dtype=torch.float64, generator=g), torch.randn(4, 4, dtype=torch.float64, generator=g)
    f = lambda t: scipy.linalg.solve_continuous_lyapunov((A + t * dA).numpy(), (Q + t * dQ).numpy())  # noqa: E731
    h = 1e-5
    _, dX = torch.func.jvp(agt.solve_continuous_lyapunov, (A, Q), (dA, dQ))
    assert np.abs(dX.numpy() - (f(h) - f(-h)) / (2 * h)).max() < 1e-7


def test_solve_sylvester_and_lyapunov_batches_float32_and_transforms():
    import adjointgen.torch as agt

    A, B, Q = (t.requires_grad_() for t in _sylvester_inputs(batch=(2, 3)))
    X = agt.solve_sylvester(A, B, Q)
    gA, gB, gQ = torch.autograd.grad((X * X.detach()).sum(), (A, B, Q))
    a, b, q = (t[1, 2].detach().clone().requires_grad_() for t in (A, B, Q))
    x = agt.solve_sylvester(a, b, q)
    for want, got in zip(torch.autograd.grad((x * x.detach()).sum(), (a, b, q)), (gA, gB, gQ)):
        assert torch.allclose(got[1, 2], want, atol=1e-13, rtol=0)
    A0, Q0 = (torch.zeros(0, 3, 3, dtype=torch.float64, requires_grad=True) for _ in range(2))
    X0 = agt.solve_continuous_lyapunov(A0, Q0)
    assert X0.shape == (0, 3, 3)
    X0.sum().backward()
    assert A0.grad.shape == Q0.grad.shape == (0, 3, 3)
    A32, Q32 = (t.float().requires_grad_() for t in _lyapunov_inputs())
    X32 = agt.solve_continuous_lyapunov(A32, Q32)
    assert X32.dtype == torch.float32
    g32 = torch.autograd.grad(X32[0].sum(), (A32, Q32))
    A64, Q64 = (t.detach().double().requires_grad_() for t in (A32, Q32))
    g64 = torch.autograd.grad(agt.solve_continuous_lyapunov(A64, Q64)[0].sum(), (A64, Q64))
    for x, y in zip(g32, g64):
        assert x.dtype == torch.float32 and torch.allclose(x.double(), y, atol=1e-5, rtol=0)
    # torch.func: jacrev = jacfwd, vmap = the batch, hessian = autograd's
    A, B, Q = _sylvester_inputs(m=3, n=2)
    f = lambda a: agt.solve_sylvester(a, B, Q)  # noqa: E731
    assert torch.allclose(torch.func.jacrev(f)(A), torch.func.jacfwd(f)(A), atol=1e-12, rtol=0)
    A, Q = _lyapunov_inputs(n=3)
    loss = lambda a: (agt.solve_continuous_lyapunov(a, Q) ** 2).sum()  # noqa: E731
    assert torch.allclose(torch.func.hessian(loss)(A), torch.autograd.functional.hessian(loss, A), atol=1e-10, rtol=0)
    Ab, Qb = _lyapunov_inputs(batch=(3,), n=3)
    assert torch.allclose(torch.func.vmap(agt.solve_continuous_lyapunov)(Ab, Qb),
                          agt.solve_continuous_lyapunov(Ab, Qb), atol=1e-14, rtol=0)


def test_solve_sylvester_and_lyapunov_name_the_colliding_eigenvalues():
    import adjointgen.torch as agt

    A = torch.diag(torch.tensor([1.0, 2.0], dtype=torch.float64))
    B = torch.diag(torch.tensor([-2.0, 5.0], dtype=torch.float64))
    with pytest.raises(SingularMatrixError, match=r"a_1 = 2 of A is, to rounding, the negative of the eigenvalue "
                                                  r"b_0 = -2 of B"):
        agt.solve_sylvester(A, B, torch.ones(2, 2, dtype=torch.float64))
    rotation = torch.tensor([[0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)  # eigenvalues +-i: i + conj(i) = 0
    with pytest.raises(SingularMatrixError, match=r"has no unique solution: the eigenvalue a_\d = 0[+-]1j of A"):
        agt.solve_continuous_lyapunov(rotation, torch.eye(2, dtype=torch.float64))


def test_solve_sylvester_and_lyapunov_jax():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from jax.test_util import check_grads

    import adjointgen.jax as agj
    import adjointgen.torch as agt

    A, B, Q = _sylvester_inputs(m=3, n=2)
    X = agj.solve_sylvester(*(jnp.asarray(t.numpy()) for t in (A, B, Q)))
    assert np.abs(np.asarray(X) - agt.solve_sylvester(A, B, Q).numpy()).max() < 1e-13
    check_grads(agj.solve_sylvester, tuple(jnp.asarray(t.numpy()) for t in (A, B, Q)), order=2, modes=("rev",))
    A, Q = _lyapunov_inputs(torch.complex128, n=3)
    check_grads(agj.solve_continuous_lyapunov, (jnp.asarray(A.numpy()), jnp.asarray(Q.numpy())), order=1,
                modes=("fwd", "rev"))
    with pytest.raises(SingularMatrixError):
        agj.solve_continuous_lyapunov(jnp.asarray([[0.0, 1.0], [-1.0, 0.0]]), jnp.eye(2))


@pytest.mark.parametrize("complex_", [False, True])
def test_the_adjoint_solve_reuses_the_forwards_schur_forms(complex_, monkeypatch):
    """runtime.xp.bartels_stewart keeps the Schur forms of recent matrices by content: the backward's
    solve with A^H, B^H (Q S^H Q^H: trsyl with S^H) computes none, and every combination of a matrix and
    the conjugate transpose of a cached one solves the equation."""
    import scipy.linalg

    from adjointgen.runtime import xp

    rng = np.random.default_rng(3 + complex_)

    def mat(n, m, shift=0.0):
        x = rng.standard_normal((n, m)) + (1j * rng.standard_normal((n, m)) if complex_ else 0)
        return x + shift * np.eye(n, m)

    A, B, C = mat(5, 5, 3.0), mat(3, 3, 3.0), mat(5, 3)
    xp.bartels_stewart(A, B, C)  # the forward: both forms cached
    calls = []
    real_schur = scipy.linalg.schur
    monkeypatch.setattr(scipy.linalg, "schur", lambda *a, **k: calls.append(a) or real_schur(*a, **k))
    for a, b in [(A.conj().T, B.conj().T), (A, B), (A.conj().T, B), (A, B.conj().T)]:
        X = xp.bartels_stewart(a, b, C)
        assert np.abs(a @ X + X @ b - C).max() < 1e-12
    assert not calls
    S = mat(4, 4, 3.0)
    Q = mat(4, 4)
    for a, b in [(S, S.conj().T), (S.conj().T, S), (S.conj().T, S.conj().T)]:  # Lyapunov's pairs
        X = xp.bartels_stewart(a, b, Q)
        assert np.abs(a @ X + X @ b - Q).max() < 1e-12
    assert len(calls) == 1  # S's form, once

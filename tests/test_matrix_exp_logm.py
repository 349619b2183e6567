"""The exponential and the principal logarithm of general (non-Hermitian) matrices, derived from
``X = exp(A)`` and ``exp(X) = A`` (the engine's Fréchet derivative of exp and its inverse):
values against torch and SciPy; gradients against torch.linalg.matrix_exp's and against
fourth-order differences of SciPy's logm; gradcheck/gradgradcheck and forward mode, real and
complex; every torch.func transform; agt.expm/agt.logm of non-symmetric input; branch errors;
float32 and empty batches; the NumPy and JAX functions; the engine's step on its own."""
import numpy as np
import pytest
import scipy.linalg
import torch

import adjointgen
import adjointgen.torch as agt


def _A(n=4, seed=0, dtype=torch.float64, batch=(), shift=0.0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(*batch, n, n, dtype=dtype, generator=g) + shift * torch.eye(n, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=str)
def test_matrix_exp_matches_torch_values_and_gradients(dtype):
    A = _A(4, 1, dtype, (2, 3), scale=0.7).requires_grad_()
    X, X0 = agt.matrix_exp(A), torch.linalg.matrix_exp(A)
    torch.testing.assert_close(X, X0, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(agt.expm(A), X0, rtol=1e-13, atol=1e-13)  # non-symmetric: the general route
    G = torch.randn_like(X)
    torch.testing.assert_close(torch.autograd.grad(X, A, G)[0], torch.autograd.grad(X0, A, G)[0], rtol=1e-10, atol=1e-12)
    a = A[0, 0].detach().requires_grad_()
    assert torch.autograd.gradcheck(agt.matrix_exp, (a,), check_forward_ad=True, check_batched_grad=True)
    assert torch.autograd.gradgradcheck(agt.matrix_exp, (a,))


def test_matrix_exp_at_large_norm_and_nilpotent_input():
    A = _A(5, 2, scale=6.0).requires_grad_()  # ||A|| ~ 30: scaling and squaring
    G = torch.randn(5, 5, dtype=torch.float64)
    ours, = torch.autograd.grad(agt.matrix_exp(A), A, G)
    ref, = torch.autograd.grad(torch.linalg.matrix_exp(A), A, G)
    torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-9 * ref.abs().max().item())
    N = torch.triu(torch.ones(4, 4, dtype=torch.float64), 1).requires_grad_()  # nilpotent, defective
    torch.testing.assert_close(agt.matrix_exp(N), torch.linalg.matrix_exp(N))
    assert torch.autograd.gradcheck(agt.matrix_exp, (N,))


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=str)
def test_logm_values_match_scipy(dtype):
    A = _A(4, 3, dtype, (2,), shift=2 * 4 ** 0.5)
    X = agt.logm(A)
    assert X.dtype == dtype
    for i in range(2):
        np.testing.assert_allclose(X[i].numpy(), scipy.linalg.logm(A[i].numpy()), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.linalg.matrix_exp(X), A, rtol=1e-12, atol=1e-12)


def test_logm_frechet_derivative_matches_finite_differences_of_scipy():
    A = _A(4, 4, shift=4.0)
    E = _A(4, 5)
    f = lambda t: scipy.linalg.logm(A.numpy() + t * E.numpy()).real  # noqa: E731
    h = 1e-3
    fd = (8 * (f(h) - f(-h)) - (f(2 * h) - f(-2 * h))) / (12 * h)
    _, tangent = torch.func.jvp(agt.logm, (A,), (E,))
    assert np.abs(tangent.numpy() - fd).max() < 1e-9 * np.abs(fd).max()
    G = _A(4, 6)
    A1 = A.clone().requires_grad_()
    gA, = torch.autograd.grad((agt.logm(A1) * G).sum(), A1)
    assert abs(float((gA * E).sum()) - float((G.numpy() * fd).sum())) < 1e-9 * float(np.abs(G.numpy() * fd).sum())
    # (no complex step: SciPy's logm of A + i h E is not the analytic continuation of the real one)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=str)
def test_logm_gradcheck_gradgradcheck_and_forward_mode(dtype):
    A = _A(3, 7, dtype, shift=3.0).requires_grad_()
    # nondet_tol: the host Schur decomposition behind the solve is not bitwise reproducible across
    # memory alignments (1e-16-level differences between two identical backward calls)
    assert torch.autograd.gradcheck(agt.logm, (A,), check_forward_ad=True, nondet_tol=1e-14)
    assert torch.autograd.gradgradcheck(agt.logm, (A,), nondet_tol=1e-14)


def test_every_torch_func_transform():
    A = _A(4, 8, shift=4.0)
    for fn, ref in ((agt.matrix_exp, torch.linalg.matrix_exp), (agt.logm, None)):
        f = lambda a, fn=fn: (fn(a) * torch.cos(a)).sum()  # noqa: E731
        g = torch.func.grad(f)(A)
        torch.testing.assert_close(torch.func.jacrev(f)(A), g)
        torch.testing.assert_close(torch.func.jacfwd(f)(A), g)
        H = torch.func.hessian(f)(A)
        torch.testing.assert_close(H, torch.func.jacfwd(torch.func.grad(f))(A))
        if ref is not None:
            r = lambda a: (ref(a) * torch.cos(a)).sum()  # noqa: E731
            torch.testing.assert_close(g, torch.func.grad(r)(A), rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(H, torch.func.hessian(r)(A), rtol=1e-8, atol=1e-10)
        As = torch.stack([A, A + 0.1 * _A(4, 9)])
        got = torch.func.vmap(torch.func.grad(f))(As)
        torch.testing.assert_close(got[1], torch.func.grad(f)(As[1]), rtol=1e-10, atol=1e-12)


def test_logm_branch_errors_and_symmetric_inputs():
    with pytest.raises(ValueError, match="logm.*-2"):
        agt.logm(torch.diag(torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)) + torch.triu(torch.ones(3, 3), 1))
    with pytest.raises(ValueError, match="negative real axis"):
        agt.logm(torch.zeros(2, 2, dtype=torch.float64) + torch.tensor([[0.0, 1.0], [0.0, 0.0]]))
    S = _A(4, 10)
    S = S @ S.mT + torch.eye(4, dtype=torch.float64)  # symmetric positive definite: funm's rule
    torch.testing.assert_close(agt.logm(S), torch.from_numpy(scipy.linalg.logm(S.numpy())), rtol=1e-12, atol=1e-12)


def test_float32_and_empty_batches():
    A = _A(3, 11, torch.float32, shift=3.0)
    np.testing.assert_allclose(agt.logm(A).numpy(), scipy.linalg.logm(A.double().numpy()), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(agt.matrix_exp(A), torch.linalg.matrix_exp(A))
    for shape in ((0, 3, 3), (2, 0, 2, 2), (0, 0)):
        A0 = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
        for fn in (agt.matrix_exp, agt.logm):
            out = fn(A0 + 0)
            assert out.shape == A0.shape
            out.sum().backward()
        assert A0.grad.shape == A0.shape


@pytest.mark.slow  # 13-25 s: the default suite keeps its time; CI's slow step runs it
def test_the_numpy_rules_and_the_jax_functions():
    import adjointgen.cupy as agc

    A = _A(4, 12, scale=0.5)
    G = _A(4, 13)
    At = A.clone().requires_grad_()
    ref, = torch.autograd.grad(torch.linalg.matrix_exp(At), At, G)
    np.testing.assert_allclose(agc.matrix_exp_vjp(A.numpy(), scipy.linalg.expm(A.numpy()), G.numpy()), ref.numpy(),
                               rtol=1e-10, atol=1e-12)
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from jax.test_util import check_grads

    import adjointgen.jax as agj

    a = jnp.asarray(A.numpy())
    np.testing.assert_allclose(agj.matrix_exp(a), scipy.linalg.expm(A.numpy()), rtol=1e-12, atol=1e-12)
    check_grads(agj.matrix_exp, (a,), order=2, modes=("fwd", "rev"))
    b = jnp.asarray(_A(3, 14, shift=3.0).numpy())
    np.testing.assert_allclose(agj.logm_general(b), scipy.linalg.logm(np.asarray(b)), rtol=1e-12, atol=1e-12)
    check_grads(agj.logm_general, (b,), order=1, modes=("fwd", "rev"))


LOG_OF_PRODUCT = '''
"""X = log(B A) through exp(X) = B A: invert_operator in a derivation of one's own."""
import numpy as np
import scipy.linalg

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, MatrixExp


def forward(A, B):
    return {"X": scipy.linalg.logm(B @ A).real}


def sample(rng, n):
    A = rng.standard_normal((n, n)) + 3 * np.eye(n)
    B = np.eye(n) + 0.1 * rng.standard_normal((n, n))
    dA, dB = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    base, tangents = fd_tangents(forward, {"A": A, "B": B}, {"A": dA, "B": dB})
    return {"A": A, "B": B, "dA": dA, "dB": dB, "X": base["X"], "dX": tangents["X"]}


d = Derivation("log_of_product", __file__, title="X = log(B A)")
n = d.dim("n")
A = d.input("A", n, n)
B = d.input("B", n, n)
X = d.output("X", n, n)
dA, dB, dX = d.tangent(A), d.tangent(B), d.tangent(X)
d.instances(sample, [{"n": 3}, {"n": 4}])
s = d.differentiate(d.identity("exp(X) = B A", MatrixExp(X), B * A), "differentiate: L_exp[X](dX) = dB A + B dA")
d.set_jvp(dX=d.invert_operator(s, dX, "invert L_exp[X]"))
d.derive_vjp()
'''


def test_invert_operator_is_a_general_step_audited_in_a_derivation(tmp_path):
    """The engine's step in a user's derivation (exp(X) = B A): audited, its JVP against finite
    differences; the same derivation with a wrong operator (L_exp at A instead of X) fails."""
    from adjointgen.audit import audit
    from adjointgen.calculus import DerivationError
    from adjointgen.codegen import generate as gen

    path = tmp_path / "log_of_product.py"
    path.write_text(LOG_OF_PRODUCT)
    report = audit(gen.load_derivation_file(path), symbolic=False)
    assert report.passed, report.to_text()
    step = next(s for s in report.steps if s.label == "invert L_exp[X]")
    assert step.residual is not None and step.residual < 1e-10
    assert all(s.residual < 1e-7 for s in report.steps if s.kind == "jvp")
    wrong = LOG_OF_PRODUCT.replace("d.set_jvp(dX=d.invert_operator(s, dX, \"invert L_exp[X]\"))",
                                   "from adjointgen.calculus import ExpFrechetSolve, Equation\n"
                                   "d.set_jvp(dX=Equation(dX, ExpFrechetSolve(B * dA + dB * A, B * A)))")
    assert wrong != LOG_OF_PRODUCT
    path.write_text(wrong)
    try:
        bad = audit(gen.load_derivation_file(path), symbolic=False)
    except DerivationError:
        return  # refused outright: also a failure
    assert not bad.passed
    # dX outside the operator (exp(X) = B A + X): the step refuses, naming what is wrong
    path.write_text(LOG_OF_PRODUCT.replace("MatrixExp(X), B * A)", "MatrixExp(X), B * A + X)"))
    with pytest.raises(DerivationError, match="appears outside"):
        gen.load_derivation_file(path)

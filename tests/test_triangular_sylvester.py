"""The triangular Sylvester step (the Schur decomposition's ``tril₋(Z^H dZ)``): the engine's
``solve_strictly_lower`` and its node ``Syl₋[T]``, the audit's dense and explicit evaluations, and
the runtime solvers (torch, NumPy, JAX) with their derivatives and errors."""
import numpy as np
import pytest
import sympy as sp
import torch

from adjointgen.calculus import Derivation, DerivationError, Identity
from adjointgen.calculus.evaluate import NUMPY, SYMPY
from adjointgen.calculus.nodes import TriangularSylvesterSolve
from adjointgen.runtime import xp as runtime_xp
from adjointgen.runtime.checks import SingularMatrixError
from adjointgen.runtime.linalg import triangular_sylvester_solve


def triangular(rng, n, upper=True, complex_=True, batch=()):
    T = rng.standard_normal((*batch, n, n)) + (1j * rng.standard_normal((*batch, n, n)) if complex_ else 0)
    T = T + 3 * np.diag(np.arange(n))  # distinct diagonal entries
    return np.triu(T) if upper else np.tril(T)


@pytest.mark.parametrize("upper", [True, False], ids=["upper", "lower"])
def test_runtime_solvers_match_the_dense_solve(upper):
    rng = np.random.default_rng(0)
    T = triangular(rng, 5, upper, batch=(2,))
    C = rng.standard_normal((2, 5, 5))
    want = np.stack([NUMPY.triangular_sylvester_solve(T[k], C[k], upper) for k in range(2)])
    for k in range(2):  # the dense solve solves the equation, with a strictly lower solution
        X = want[k]
        assert np.abs(np.tril(X @ T[k] - T[k] @ X, -1) - np.tril(C[k], -1)).max() < 1e-12
        assert not np.triu(X).any()
    got = triangular_sylvester_solve(torch.from_numpy(T), torch.from_numpy(C), upper).numpy()
    assert np.abs(got - want).max() < 1e-12
    assert np.abs(runtime_xp.triangular_sylvester_solve(np, T, C, upper) - want).max() < 1e-12
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    solve = jax.jit(lambda t, c: runtime_xp.triangular_sylvester_solve(jnp, t, c, upper))
    assert np.abs(np.asarray(solve(jnp.asarray(T), jnp.asarray(C))) - want).max() < 1e-12


def test_the_adjoint_is_the_solve_with_the_conjugate_transpose():
    """``<G, Syl₋[T](C)> = <Syl₋[T^H](G), C>`` (``Re tr(X^H Y)``), as the node's adjoint rule says."""
    rng = np.random.default_rng(1)
    T = triangular(rng, 5)
    C, G = (rng.standard_normal((5, 5)) + 1j * rng.standard_normal((5, 5)) for _ in range(2))
    left = np.real(np.vdot(G, NUMPY.triangular_sylvester_solve(T, C, True)))
    right = np.real(np.vdot(NUMPY.triangular_sylvester_solve(T.conj().T, G, False), C))
    assert abs(left - right) < 1e-12 * abs(left)
    node = TriangularSylvesterSolve(sp.MatrixSymbol("C", 3, 3), sp.MatrixSymbol("T", 3, 3), True)
    inner, adjoint = node.adjoint_rule(sp.MatrixSymbol("G", 3, 3))
    assert inner == node.arg and adjoint.upper is False and adjoint.operator[0] == sp.MatrixSymbol("T", 3, 3).T


def test_the_explicit_solve_is_exact():
    """The symbolic replay's evaluation: entry by entry, an identity of rational functions."""
    T = sp.Matrix(3, 3, lambda i, j: sp.Symbol(f"t{i}{j}") if i <= j else 0)
    C = sp.Matrix(3, 3, lambda i, j: sp.Symbol(f"c{i}{j}"))
    for t, upper in ((T, True), (T.T, False)):
        X = SYMPY.triangular_sylvester_solve(t, C, upper)
        R = X * t - t * X
        assert all(sp.simplify(R[i, j] - C[i, j]) == 0 for i in range(3) for j in range(i))
        assert all(X[i, j] == 0 for i in range(3) for j in range(i, 3))


def test_torch_solver_differentiates_to_second_order_and_batches():
    rng = np.random.default_rng(2)
    T = torch.from_numpy(triangular(rng, 4, complex_=False)).requires_grad_()
    C = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    f = lambda t, c: triangular_sylvester_solve(t.triu(), c)  # noqa: E731 - perturbations of T stay triangular
    assert torch.autograd.gradcheck(f, (T, C))
    assert torch.autograd.gradgradcheck(f, (T, C))
    J = torch.func.jacfwd(f, argnums=1)(T.detach(), C.detach())
    assert torch.allclose(J, torch.func.jacrev(f, argnums=1)(T.detach(), C.detach()))
    Ts = torch.from_numpy(triangular(rng, 4, complex_=False, batch=(3,)))
    Cs = torch.randn(3, 4, 4, dtype=torch.float64)
    assert torch.allclose(torch.func.vmap(f)(Ts, Cs), f(Ts, Cs))


def test_equal_diagonal_entries_and_a_block_are_named():
    C = torch.ones(3, 3, dtype=torch.float64)
    T = torch.tensor([[1.0, 2.0, 0.0], [0.0, 3.0, 1.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    with pytest.raises(SingularMatrixError, match=r"T\[0, 0\] = 1 and T\[2, 2\] = 1 of T are equal"):
        triangular_sylvester_solve(T, C)
    block = torch.tensor([[1.0, 2.0, 0.0], [-2.0, 1.0, 1.0], [0.0, 0.0, 3.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"T\[1, 0\] = -2 is not zero -- a 2 x 2 block of a real Schur form"):
        triangular_sylvester_solve(block, C)
    with pytest.raises(SingularMatrixError, match=r"batch index \(1,\)"):
        runtime_xp.triangular_sylvester_solve(np, np.stack([np.diag([1.0, 2.0]), np.eye(2)]), np.ones((2, 2)))


def _schur_like(skew=True, upper=True):
    d = Derivation("trisyl", __file__, title="test", field="complex")
    n = d.dim("n")
    A = d.input("A", n, n)
    T = d.output("T", n, n, upper=upper)
    Z = d.output("Z", n, n, orthonormal=True)
    eq = d.identity("A Z = Z T", A * Z, Z * T)
    orth = d.identity("Z^T Z = I", Z.T * Z, Identity(n))
    square = d.identity("Z Z^T = I", Z * Z.T, Identity(n))
    left = d.substitute(d.right_multiply(d.substitute(d.left_multiply(eq, Z.T), orth), Z.T), square)  # Z^T A = T Z^T
    s = d.substitute(d.substitute(d.left_multiply(d.differentiate(eq), Z.T), orth), left)
    if skew:
        dC = d.introduce("dC", Z.T * d.tangent(Z), skew_by=d.differentiate(orth))
    else:
        dC = d.introduce("dC", Z.T * d.tangent(Z))
    return d, d.strictly_lower_part(d.use_definition(s, dC)), dC, T


def test_the_step_solves_for_the_strictly_lower_part_and_refuses_what_it_cannot():
    d, low, dC, T = _schur_like()
    solved = d.solve_strictly_lower(low, dC, T)
    assert str(solved.lhs) == "tril₋(dC)"
    assert isinstance(solved.rhs, TriangularSylvesterSolve) and solved.rhs.upper
    assert d.steps[-1].kind == "solve_triangular_sylvester" and d.steps[-1].replay is not None
    d, low, dC, T = _schur_like(skew=False)
    with pytest.raises(DerivationError, match="skew"):
        d.solve_strictly_lower(low, dC, T)
    d, low, dC, T = _schur_like(upper=False)
    with pytest.raises(DerivationError, match="upper triangular"):
        d.solve_strictly_lower(low, dC, T)

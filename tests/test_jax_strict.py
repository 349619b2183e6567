"""agj as a drop-in under JAX's own test configuration (``JaxTestCase``: strict dtype promotion,
``jax_numpy_rank_promotion='raise'``, ``jax_enable_checks``): values, dtypes and derivatives against
JAX's own functions, the ``jax.lax.linalg`` and ``jax.scipy.linalg`` signatures (``agj.lax``,
``agj.scipy``), non-square ``lu``, wide ``qr``, left eigenvectors and geev's normalization, and
``Precision.HIGHEST`` in every matrix product of a derivative.  The whole of JAX's own tests runs
in ``tests/test_jax_upstream.py`` (slow)."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import jax.scipy.linalg as jsl  # noqa: E402
from jax import lax  # noqa: E402

import adjointgen.jax as agj  # noqa: E402
from adjointgen import PhaseDependentLossError  # noqa: E402

RNG = np.random.default_rng(20260607)


@pytest.fixture(autouse=True)
def jax_test_configuration():
    """JaxTestCase's thread-local settings, for every test of this module."""
    with jax.numpy_dtype_promotion("strict"), jax.numpy_rank_promotion("raise"), jax.enable_checks(True):
        yield


def arr(*shape, dtype="float64"):
    x = RNG.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * RNG.standard_normal(shape)
    return jnp.asarray(x.astype(dtype))


def close(a, b, tol):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert jnp.shape(x) == jnp.shape(y) and jnp.result_type(x) == jnp.result_type(y), (jnp.shape(x), jnp.shape(y))
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


TOL = {"float32": 2e-3, "complex64": 2e-3, "float64": 1e-9, "complex128": 1e-9}


def hermitian(*shape, dtype):
    a = arr(*shape, dtype=dtype)
    return (a + jnp.conj(jnp.swapaxes(a, -1, -2))) / 2


def spd(*shape, dtype):
    a = arr(*shape, dtype=dtype)
    return a @ jnp.conj(jnp.swapaxes(a, -1, -2)) + jnp.broadcast_to(shape[-1] * jnp.eye(shape[-1], dtype=dtype), shape)


# (name, agj function, JAX's, input maker, a loss of the outputs invariant to every gauge)
def _eigh_loss(out):
    w, V = out
    return jnp.sum(jnp.sin(w)) + jnp.sum(jnp.abs(V[..., :, 0]) ** 2 @ jnp.arange(V.shape[-2]).astype(w.dtype))


def _svd_loss(out):
    U, S, Vh = out
    k = S.shape[-1]
    P = U[..., :, :k] @ (S[..., :, None].astype(U.dtype) * Vh[..., :k, :])
    return jnp.sum(jnp.cos(S)) + jnp.sum(jnp.abs(P) ** 2) + jnp.sum(jnp.abs(U[..., :1, :1]) ** 2)


def _sum_abs(out):
    return sum(jnp.sum(jnp.abs(x) ** 2 + jnp.real(x)) for x in jax.tree_util.tree_leaves(out))


CASES = [
    ("eigh", agj.eigh, jnp.linalg.eigh, lambda dt: hermitian(2, 4, 4, dtype=dt), _eigh_loss),
    ("svd", lambda a: agj.svd(a, full_matrices=False), lambda a: jnp.linalg.svd(a, full_matrices=False),
     lambda dt: arr(2, 5, 3, dtype=dt), _svd_loss),
    ("eigvals", agj.eigvals, jnp.linalg.eigvals, lambda dt: arr(4, 4, dtype=dt), _sum_abs),
    ("qr wide", agj.qr, jnp.linalg.qr, lambda dt: arr(2, 3, 5, dtype=dt), _sum_abs),
    ("qr tall", agj.qr, jnp.linalg.qr, lambda dt: arr(5, 3, dtype=dt), _sum_abs),
    ("cholesky", agj.cholesky, jnp.linalg.cholesky, lambda dt: spd(2, 3, 3, dtype=dt), _sum_abs),
    ("slogdet", agj.slogdet, jnp.linalg.slogdet, lambda dt: arr(2, 4, 4, dtype=dt), _sum_abs),
    ("pinv", agj.pinv, jnp.linalg.pinv, lambda dt: arr(2, 4, 3, dtype=dt), _sum_abs),
    ("lu tall", agj.lu, jsl.lu, lambda dt: arr(5, 3, dtype=dt), _sum_abs),
    ("lu wide", agj.lu, jax.vmap(jsl.lu), lambda dt: arr(2, 3, 5, dtype=dt), _sum_abs),
    ("triangular_solve", lambda a: agj.lax.triangular_solve(a, a[..., :2, :], lower=True, transpose_a=True),
     lambda a: lax.linalg.triangular_solve(a, a[..., :2, :], lower=True, transpose_a=True),
     lambda dt: arr(4, 4, dtype=dt) + 4 * jnp.eye(4, dtype=dt), _sum_abs),
    ("expm", agj.scipy.expm, jsl.expm, lambda dt: arr(3, 3, dtype=dt) / 3, _sum_abs),
]


#: the cases the default suite runs (real and complex data mixed in the rules, a wide qr and lu); the
#: others run in the slow step (JAX's own tests, tests/test_jax_upstream.py, cover them there too)
FAST = {("svd", "complex128"), ("qr wide", "float32"), ("lu wide", "complex128"), ("eigh", "complex128")}


@pytest.mark.parametrize("name, ours, theirs, make, loss, dtype", [
    pytest.param(*case, dtype, id=f"{case[0]}-{dtype}",
                 marks=() if (case[0], dtype) in FAST else pytest.mark.slow)
    for case in CASES for dtype in ("float32", "complex128")])
def test_values_dtypes_and_derivatives_match_jax_under_strict_promotion(name, ours, theirs, make, loss, dtype):
    """The same outputs (values, dtypes, shapes) as JAX's function, and the same gradient and JVP
    of a loss that is invariant to every gauge, with JAX's strict dtype and rank promotion on."""
    a = make(dtype)
    da = make(dtype)
    tol = TOL[dtype]
    if name == "eigvals":  # the order of the eigenvalues is LAPACK's for both
        close(ours(a), theirs(a), tol)
    else:
        close(jax.tree_util.tree_map(lambda x: jnp.abs(x), ours(a)), jax.tree_util.tree_map(jnp.abs, theirs(a)), tol)

    def value(f):
        return lambda a: jnp.real(loss(f(a)))

    close(jax.grad(value(ours))(a), jax.grad(value(theirs))(a), tol)
    close(jax.jvp(value(ours), (a,), (da,)), jax.jvp(value(theirs), (a,), (da,)), tol)


@pytest.mark.parametrize("dtype", ["int32", pytest.param("int64", marks=pytest.mark.slow), "bool",
                                   pytest.param("float32", marks=pytest.mark.slow), "complex64"])
def test_output_dtypes_are_jaxs(dtype):
    a = jnp.asarray(np.array([[2, 1, 0], [1, 3, 1], [0, 1, 4]]).astype(dtype))
    for ours, theirs in ((agj.eigh, jnp.linalg.eigh), (agj.svd, jnp.linalg.svd), (agj.qr, jnp.linalg.qr),
                         (agj.det, jnp.linalg.det), (agj.slogdet, jnp.linalg.slogdet), (agj.inv, jnp.linalg.inv),
                         (agj.cholesky, jnp.linalg.cholesky), (agj.eig, jnp.linalg.eig), (agj.scipy.lu, jsl.lu)):
        if dtype == "bool" and theirs in (jnp.linalg.inv, jnp.linalg.cholesky):
            continue  # a boolean identity-like matrix is singular / not positive definite
        got = [x.dtype for x in jax.tree_util.tree_leaves(ours(a))]
        want = [x.dtype for x in jax.tree_util.tree_leaves(theirs(a))]
        assert got == want, (theirs.__name__, got, want)


@pytest.mark.parametrize("name, f, args", [
    ("eigh", agj.eigh, (arr(3, 3, dtype="float32"),)),
    ("cholesky", agj.cholesky, (spd(3, 3, dtype="float32"),)),
    ("triangular_solve", agj.lax.triangular_solve, (jnp.tril(arr(3, 3, dtype="float32")), arr(1, 3, dtype="float32"))),
    ("svd", agj.svd, (arr(4, 3, dtype="float32"),)),
])
def test_every_matrix_product_of_a_derivative_is_at_highest_precision(name, f, args):
    """As JAX asks of its derivative rules (float32 products would round to bfloat16 or TF32 on
    accelerators): every dot_general of the compiled JVP and VJP, the forward's and those inside
    adjointgen's primitives included (the lowered program, where nothing is opaque)."""
    import re

    def loss(*a):
        return sum(jnp.sum(jnp.abs(x) ** 2) for x in jax.tree_util.tree_leaves(f(*a)))

    for program in (lambda *a: jax.jvp(f, a, a), jax.grad(loss, argnums=tuple(range(len(args))))):
        text = jax.jit(program).lower(*args).as_text()
        dots = re.findall(r"stablehlo.dot_general.*", text)
        assert dots, "no matrix product found"
        assert all("HIGHEST, HIGHEST" in d for d in dots), [d for d in dots if "HIGHEST, HIGHEST" not in d][:3]


def test_batched_forwards_under_rank_promotion_raise():
    a = hermitian(10, 3, 3, dtype="float32")
    jax.jvp(agj.eigh, (a,), (a,))
    jax.jvp(lambda a: agj.svd(a, compute_uv=False), (a,), (a,))
    jax.jvp(agj.eig, (a,), (a,))


# ---------------------------------------------------------------- jax.lax.linalg signatures
@pytest.mark.parametrize("dtype", [pytest.param("float64", marks=pytest.mark.slow), "complex128"])
def test_lax_eig_left_and_right_eigenvectors_and_geev_normalization(dtype):
    """``agj.lax.eig``: the values of ``lax.linalg.eig`` (w, vl, vr: unit columns, largest component
    real, LAPACK's signs), and with ``enable_eigvec_derivs`` the derivative JAX's own rule gives
    under that normalization (an independent implementation)."""
    a = arr(4, 4, dtype=dtype)
    da = arr(4, 4, dtype=dtype)
    ours = agj.lax.eig(a)
    theirs = lax.linalg.eig(a)
    close(ours, theirs, 1e-10)
    w, vl, vr = ours
    close(jnp.conj(vl.T) @ a.astype(vl.dtype), w[:, None] * jnp.conj(vl.T), 1e-10)
    for left, right in ((True, True), (True, False), (False, True)):
        f = lambda a, eig: eig(a, compute_left_eigenvectors=left, compute_right_eigenvectors=right,  # noqa: E731
                               enable_eigvec_derivs=True)
        close(jax.jvp(lambda a: f(a, agj.lax.eig), (a,), (da,)), jax.jvp(lambda a: f(a, lax.linalg.eig), (a,), (da,)),
              1e-8)
    # reverse mode: the transposition of the same derivative
    g = lambda eig: jax.grad(lambda a: sum(jnp.sum(jnp.real(x) + jnp.imag(x) ** 2)  # noqa: E731
                                           for x in eig(a, enable_eigvec_derivs=True)))(a)
    close(g(agj.lax.eig), g(lax.linalg.eig), 1e-8)


def test_lax_eig_without_fixed_phases_keeps_the_phase_gauge():
    """Without ``enable_eigvec_derivs`` (where JAX raises), a loss invariant to the phases of the
    vectors is differentiated, and one that depends on them raises ``PhaseDependentLossError``."""
    a = arr(4, 4, dtype="complex128")
    invariant = lambda a: jnp.sum(jnp.arange(4.0) @ jnp.abs(agj.lax.eig(a)[1]) ** 2)  # noqa: E731
    fixed = lambda a: jnp.sum(jnp.arange(4.0) @ jnp.abs(agj.lax.eig(a, enable_eigvec_derivs=True)[1]) ** 2)  # noqa: E731
    close(jax.grad(invariant)(a), jax.grad(fixed)(a), 1e-9)
    with pytest.raises(PhaseDependentLossError):
        jax.grad(lambda a: jnp.sum(jnp.real(agj.lax.eig(a)[2])))(a)


@pytest.mark.parametrize("shape", [pytest.param((4, 4), marks=pytest.mark.slow), pytest.param((5, 3), marks=pytest.mark.slow),
                                   (3, 5)])
def test_lax_lu_packed_factors(shape):
    a = arr(*shape)
    lu, pivots, perm = agj.lax.lu(a)
    lu2, pivots2, perm2 = lax.linalg.lu(a)
    close(lu, lu2, 1e-12)
    assert (pivots == pivots2).all() and (perm == perm2).all()
    f = lambda lu_fn: jax.grad(lambda a: jnp.sum(jnp.sin(lu_fn(a)[0])))(a)  # noqa: E731
    close(f(agj.lax.lu), f(lax.linalg.lu), 1e-10)


@pytest.mark.parametrize("left_side, lower, transpose_a, conjugate_a, unit_diagonal", [
    (True, False, True, True, True), (False, True, False, True, False),
    *(pytest.param(left, *flags, marks=pytest.mark.slow) for left in (True, False)
      for flags in ((True, False, False, False), (True, True, False, True), (False, False, True, False)))])
def test_lax_triangular_solve_flags(left_side, lower, transpose_a, conjugate_a, unit_diagonal):
    a = arr(4, 4, dtype="complex128") + 4 * jnp.eye(4, dtype="complex128")
    b = arr(4, 2, dtype="complex128") if left_side else arr(2, 4, dtype="complex128")
    kw = dict(left_side=left_side, lower=lower, transpose_a=transpose_a, conjugate_a=conjugate_a,
              unit_diagonal=unit_diagonal)
    close(agj.lax.triangular_solve(a, b, **kw), lax.linalg.triangular_solve(a, b, **kw), 1e-12)
    loss = lambda f: lambda a, b: jnp.sum(jnp.abs(f(a, b, **kw)) ** 2)  # noqa: E731
    close(jax.grad(loss(agj.lax.triangular_solve), (0, 1))(a, b),
          jax.grad(loss(lax.linalg.triangular_solve), (0, 1))(a, b), 1e-10)
    v = b[:, 0] if left_side else b[0]  # a vector right-hand side
    close(agj.lax.triangular_solve(a, v, **kw), lax.linalg.triangular_solve(a, v, **kw), 1e-12)


def test_lax_signatures_and_results():
    h = hermitian(4, 4, dtype="float64")
    close(agj.lax.eigh(h), lax.linalg.eigh(h), 1e-10)  # (v, w): eigenvectors first
    low = jnp.tril(h) + 10 * jnp.eye(4)
    close(agj.lax.eigh(low, symmetrize_input=False, lower=True)[1],
          lax.linalg.eigh(low, symmetrize_input=False, lower=True)[1], 1e-10)
    s = spd(4, 4, dtype="float64")
    close(agj.lax.cholesky(s), lax.linalg.cholesky(s), 1e-10)
    a = arr(5, 3)
    close(jax.tree_util.tree_map(jnp.abs, agj.lax.svd(a, full_matrices=False)),
          jax.tree_util.tree_map(jnp.abs, lax.linalg.svd(a, full_matrices=False)), 1e-10)
    close(agj.lax.svd(a, compute_uv=False), lax.linalg.svd(a, compute_uv=False), 1e-10)
    close(agj.lax.qr(a.T), lax.linalg.qr(a.T), 1e-10)
    q, r, p = agj.lax.qr(arr(4, 3), pivoting=True, full_matrices=False)
    assert p.dtype == jnp.int32 and q.shape == (4, 3)


def test_scipy_signatures_and_results():
    a, h, s = arr(4, 4), hermitian(4, 4, dtype="float64"), spd(4, 4, dtype="float64")
    close(agj.scipy.cholesky(s), jsl.cholesky(s), 1e-10)  # upper by default, as SciPy
    close(agj.scipy.cholesky(s, lower=True), jsl.cholesky(s, lower=True), 1e-10)
    close(agj.scipy.eigh(h), jsl.eigh(h), 1e-10)
    close(agj.scipy.eigh(h, eigvals_only=True), jsl.eigh(h, eigvals_only=True), 1e-10)
    t = arr(3, 4)
    close(jax.tree_util.tree_map(jnp.abs, agj.scipy.qr(t)), jax.tree_util.tree_map(jnp.abs, jsl.qr(t)), 1e-10)
    close(jax.tree_util.tree_map(jnp.abs, agj.scipy.qr(t.T, mode="economic")),
          jax.tree_util.tree_map(jnp.abs, jsl.qr(t.T, mode="economic")), 1e-10)
    close(jnp.abs(agj.scipy.qr(t, mode="r")[0]), jnp.abs(jsl.qr(t, mode="r")[0]), 1e-10)
    close(agj.scipy.lu(t), jsl.lu(t), 1e-10)
    close(agj.scipy.solve(s, a, assume_a="pos"), jsl.solve(s, a, assume_a="pos"), 1e-10)
    close(agj.scipy.det(a), jsl.det(a), 1e-10)
    close(agj.scipy.inv(a), jsl.inv(a), 1e-10)
    with pytest.raises(NotImplementedError, match="type=1"):
        agj.scipy.eigh(h, type=2)


@pytest.mark.parametrize("dtype", [pytest.param("float64", marks=pytest.mark.slow), "complex128"])
def test_complete_qr_of_a_tall_matrix_span_exact_basis_raises(dtype):
    """``mode="complete"`` of a tall matrix: JAX's values (LAPACK's complement basis), the exact
    derivative of a loss of the complement's span (against JAX's, whose rule differentiates
    LAPACK's basis: a span loss must agree), and ``ComplementBasisError`` for a loss of the basis."""
    from adjointgen import ComplementBasisError

    a, da = arr(5, 3, dtype=dtype), arr(5, 3, dtype=dtype)
    W = arr(5, 5, dtype=dtype)
    close(agj.qr(a, mode="complete"), jnp.linalg.qr(a, mode="complete"), 1e-12)

    def span(qr):
        def loss(a):
            Q, R = qr(a, mode="complete")
            Q2 = Q[:, 3:]
            return jnp.real(jnp.sum((Q2 @ jnp.conj(Q2.T)) * W)) + jnp.sum(jnp.abs(R) ** 2)
        return loss

    close(jax.grad(span(agj.qr))(a), jax.grad(span(jnp.linalg.qr))(a), 1e-10)
    close(jax.jvp(span(agj.qr), (a,), (da,)), jax.jvp(span(jnp.linalg.qr), (a,), (da,)), 1e-10)
    with pytest.raises(ComplementBasisError, match="mode='complete'"):
        jax.grad(lambda a: jnp.sum(jnp.abs(agj.qr(a, mode="complete")[0][:, 4]) ** 3))(a)


@pytest.mark.parametrize("symmetrize_input, lower", [pytest.param(True, True, marks=pytest.mark.slow), (False, False)])
def test_generalized_eigh_with_jaxs_conventions(symmetrize_input, lower):
    """``agj.eigh(a, b)`` / ``agj.scipy.eigh(a, b)``, which JAX does not have: with
    ``symmetrize_input=False`` both matrices are read from the triangle ``lower`` names (SciPy's
    ``eigh(a, b, lower=)`` reads them so, an independent reference), with ``True`` from their
    Hermitian parts; the gradient in ``b`` too."""
    import scipy.linalg

    a = arr(4, 4, dtype="complex128")
    b = spd(4, 4, dtype="complex128") + 0.1 * jnp.triu(arr(4, 4, dtype="complex128"), 1)  # not Hermitian
    w, v = agj.scipy.eigh(a, b, lower=lower, symmetrize_input=symmetrize_input)
    if symmetrize_input:
        h = lambda x: (x + jnp.conj(x.T)) / 2  # noqa: E731
        want = scipy.linalg.eigh(np.asarray(h(a)), np.asarray(h(b)), eigvals_only=True)
    else:
        want = scipy.linalg.eigh(np.asarray(a), np.asarray(b), lower=lower, eigvals_only=True)
    np.testing.assert_allclose(w, want, rtol=1e-10, atol=1e-10)
    close(agj.eigh(a, b, UPLO="L" if lower else "U", symmetrize_input=symmetrize_input).eigenvalues, w, 1e-12)
    g = jax.grad(lambda b: jnp.sum(agj.scipy.eigh(a, b, lower=lower, symmetrize_input=symmetrize_input,
                                                  eigvals_only=True) ** 2))
    fd = lambda e: (jnp.sum(agj.scipy.eigh(a, b + 1e-6 * e, lower=lower, symmetrize_input=symmetrize_input,  # noqa: E731
                                           eigvals_only=True) ** 2)
                    - jnp.sum(agj.scipy.eigh(a, b - 1e-6 * e, lower=lower, symmetrize_input=symmetrize_input,
                                             eigvals_only=True) ** 2)) / 2e-6
    e = arr(4, 4, dtype="complex128")
    # JAX's gradient of a real function of complex b is conj(df/db): the derivative along e is Re(sum(g e))
    np.testing.assert_allclose(float(jnp.real(jnp.sum(g(b) * e))), float(fd(e)), rtol=1e-6, atol=1e-8)

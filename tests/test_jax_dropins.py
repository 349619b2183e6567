"""agj's functions as drop-ins for jax.numpy.linalg / jax.scipy.linalg: the same signatures, the
same results (named tuples, vector right-hand sides, triangles, modes), the same gradients where
JAX's are right, and the complement of a full SVD as a gauge (exact for its span, an error for
its basis); agj.eigsh(A, k, B), which JAX lacks."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import jax.scipy.linalg as jsl  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import adjointgen.jax as agj  # noqa: E402
from adjointgen import ComplementBasisError  # noqa: E402

RNG = np.random.default_rng(20261204)


def arr(*shape, complex_=False):
    x = RNG.standard_normal(shape)
    return jnp.asarray(x + 1j * RNG.standard_normal(shape) if complex_ else x)


def close(a, b, tol=1e-10):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert jnp.shape(x) == jnp.shape(y)
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


A4 = arr(4, 4) + 4 * jnp.eye(4)
H4 = A4 + A4.T
B4 = A4 @ A4.T
b4 = arr(4)


@pytest.mark.parametrize("name, ours, theirs", [
    ("solve vector", lambda: agj.solve(A4, b4), lambda: jnp.linalg.solve(A4, b4)),
    ("solve batched vector", lambda: agj.solve(jnp.stack([A4, 2 * A4]), b4),
     lambda: jnp.linalg.solve(jnp.stack([A4, 2 * A4]), b4)),
    ("eigh", lambda: agj.eigh(H4), lambda: jnp.linalg.eigh(H4)),
    ("eigh UPLO=U unsymmetrized", lambda: agj.eigh(A4, "U", symmetrize_input=False).eigenvalues,
     lambda: jnp.linalg.eigh(A4, "U", symmetrize_input=False).eigenvalues),
    ("eigh UPLO=L unsymmetrized", lambda: agj.eigh(A4, UPLO="L", symmetrize_input=False).eigenvalues,
     lambda: jnp.linalg.eigh(A4, "L", symmetrize_input=False).eigenvalues),
    ("eigvalsh", lambda: agj.eigvalsh(H4), lambda: jnp.linalg.eigvalsh(H4)),
    ("svd S", lambda: agj.svd(A4[:3]).S, lambda: jnp.linalg.svd(A4[:3]).S),
    ("svd compute_uv=False", lambda: agj.svd(A4, compute_uv=False), lambda: jnp.linalg.svd(A4, compute_uv=False)),
    ("svdvals", lambda: agj.svdvals(A4), lambda: jnp.linalg.svdvals(A4)),
    ("qr r", lambda: agj.qr(A4, mode="r"), lambda: jnp.linalg.qr(A4, mode="r")),
    ("qr reduced", lambda: agj.qr(A4[:, :3]), lambda: jnp.linalg.qr(A4[:, :3])),
    ("qr complete wide", lambda: agj.qr(A4[:3], mode="complete"), lambda: jnp.linalg.qr(A4[:3], mode="complete")),
    ("cholesky upper", lambda: agj.cholesky(B4, upper=True), lambda: jnp.linalg.cholesky(B4, upper=True)),
    ("lstsq", lambda: agj.lstsq(A4[:, :3], b4), lambda: jnp.linalg.lstsq(A4[:, :3], b4)),
    ("lstsq numpy_resid", lambda: agj.lstsq(A4[:, :3], b4, numpy_resid=True),
     lambda: jnp.linalg.lstsq(A4[:, :3], b4, numpy_resid=True)),
    ("lstsq matrix", lambda: agj.lstsq(A4[:, :3], jnp.stack([b4, -b4], 1)),
     lambda: jnp.linalg.lstsq(A4[:, :3], jnp.stack([b4, -b4], 1))),
    ("lu", lambda: agj.lu(A4), lambda: jsl.lu(A4)),
    ("lu permute_l", lambda: agj.lu(A4, permute_l=True), lambda: jsl.lu(A4, permute_l=True)),
    ("slogdet", lambda: agj.slogdet(A4), lambda: jnp.linalg.slogdet(A4)),
    ("pinv rtol", lambda: agj.pinv(A4[:3], 1e-10), lambda: jnp.linalg.pinv(A4[:3], 1e-10)),
    ("expm keywords", lambda: agj.expm(A4 / 4, max_squarings=8), lambda: jsl.expm(A4 / 4)),
    ("sqrtm blocksize", lambda: agj.sqrtm(B4, 1), lambda: jsl.sqrtm(B4).real),
])
def test_same_results_as_jax(name, ours, theirs):
    got, want = ours(), theirs()
    if hasattr(want, "_fields"):  # a named tuple: ours has the same fields
        assert getattr(got, "_fields", None) == want._fields, name
    close(got, want)


@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("trans", [0, 1, 2, "N", "T", "C"])
@pytest.mark.parametrize("unit", [False, True])
@pytest.mark.parametrize("complex_", [False, True])
def test_solve_triangular_every_case_matches_scipy_in_value_and_gradient(lower, trans, unit, complex_):
    a = arr(4, 4, complex_=complex_) + 4 * jnp.eye(4)
    b = arr(4, 2, complex_=complex_)
    kw = dict(trans=trans, lower=lower, unit_diagonal=unit)
    close(agj.solve_triangular(a, b, **kw), jsl.solve_triangular(a, b, **kw))
    close(agj.solve_triangular(a, b[:, 0], **kw), jsl.solve_triangular(a, b[:, 0], **kw))
    f = lambda s: lambda a, b: jnp.sum(jnp.abs(s(a, b, **kw)) ** 2)  # noqa: E731
    for g, w in zip(jax.grad(f(agj.solve_triangular), (0, 1))(a, b), jax.grad(f(jsl.solve_triangular), (0, 1))(a, b)):
        close(g, w, 1e-9)


def test_eigh_with_b_is_the_generalized_problem_jax_lacks():
    import scipy.linalg

    w, V = agj.eigh(H4, B4)
    close(w, scipy.linalg.eigh(np.asarray(H4), np.asarray(B4), eigvals_only=True))
    close(V.T @ B4 @ V, jnp.eye(4))
    close(agj.eigh(H4, B4, eigvals_only=True), w)
    check_grads(lambda a, b: jnp.sum(agj.eigh(a, b, eigvals_only=True) ** 2), (H4, B4), order=1, modes=("rev",))


@pytest.mark.slow  # heavy (JAX compiles or a whole-catalogue audit): CI's slow step
@pytest.mark.parametrize("shape", [(6, 3), (3, 6), (4, 4)], ids=["tall", "wide", "square"])
@pytest.mark.parametrize("complex_", [False, True])
def test_full_svd_complement_span_exact_basis_raises(shape, complex_):
    A = arr(*shape, complex_=complex_)
    U, S, Vh = agj.svd(A)
    ref = jnp.linalg.svd(A)
    assert U.shape == ref.U.shape and Vh.shape == ref.Vh.shape
    m, n = shape
    k = min(m, n)
    close(U @ jnp.conj(U.T), jnp.eye(m))
    close(jnp.conj(Vh.T) @ Vh, jnp.eye(n))
    close((U[:, :k] * S) @ Vh[:k], A)
    W = arr(max(m, n), max(m, n))

    def span(A):  # the projector onto the complement (and S): invariant under the basis
        U, S, Vh = agj.svd(A)
        C = U[:, k:] if m >= n else jnp.conj(Vh[k:].T)
        return jnp.sum(jnp.abs(C @ jnp.conj(C.T)) ** 2 * W[:C.shape[0], :C.shape[0]]) + jnp.sum(S)

    check_grads(span, (A,), order=1 if complex_ else 2, modes=("rev",) if complex_ else ("fwd", "rev"))
    if m == n:
        return

    def basis(A):
        U, S, Vh = agj.svd(A)
        return jnp.abs(U[0, -1] if m > n else Vh[-1, 0]) ** 2

    with pytest.raises(ComplementBasisError):
        jax.grad(basis)(A)
    assert bool(jnp.isnan(jax.jit(jax.grad(basis))(A)).all())  # under jit: NaN, never a silent value
    # the thin factors keep no complement: no check, as jnp.linalg.svd(full_matrices=False)
    jax.grad(lambda A: jnp.abs(agj.svd(A, full_matrices=False)[0][0, 0]) ** 2)(A)


@pytest.mark.slow  # heavy (JAX compiles or a whole-catalogue audit): CI's slow step
def test_transforms_through_the_dropins():
    A = jnp.stack([A4, A4 + 0.1 * arr(4, 4)])
    f = lambda a: jnp.sum(agj.solve(a, b4) ** 2) + jnp.sum(agj.lstsq(a, b4)[0]) + agj.slogdet(a).logabsdet  # noqa: E731
    g = jax.vmap(jax.grad(f))(A)
    for i in range(2):
        close(g[i], jax.grad(f)(A[i]), 1e-9)
    close(jax.jit(jax.grad(f))(A4), jax.grad(f)(A4))
    check_grads(f, (A4,), order=2, modes=("fwd", "rev"))


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="UPLO"):
        agj.eigh(A4, UPLO="X", symmetrize_input=False)
    with pytest.raises(ValueError, match="trans"):
        agj.solve_triangular(A4, b4, trans=3)
    with pytest.raises(ValueError, match="mode"):
        agj.qr(A4, mode="economic")
    with pytest.raises(NotImplementedError, match="raw"):
        agj.qr(A4[:, :3], mode="raw")
    with pytest.raises(ValueError, match="rtol or rcond"):
        agj.pinv(A4, 1e-3, rcond=1e-3)


# ---------------------------------------------------------------- eigsh(A, k, B)
@pytest.mark.slow  # heavy (JAX compiles or a whole-catalogue audit): CI's slow step
def test_eigsh_generalized_values_gradients_and_errors():
    import scipy.linalg

    from adjointgen import DegenerateSubspaceError

    M, N = arr(8, 8), arr(8, 8)
    A, B = M + M.T, N @ N.T / 8 + jnp.eye(8)
    w, V = agj.eigsh(A, 3, B)
    close(w, scipy.linalg.eigh(np.asarray(A), np.asarray(B), eigvals_only=True)[::-1][:3])
    close(V.T @ B @ V, jnp.eye(3))
    f = lambda A, B: (lambda w, V: jnp.sum(w ** 2) + jnp.sum((V @ V.T) * A))(*agj.eigsh(A, 3, B))  # noqa: E731
    check_grads(f, (A, B), order=2, modes=("fwd", "rev"))
    top = jax.grad(lambda A, B: jnp.sum(agj.eigsh(A, 3, B, largest=False)[0] ** 2), (0, 1))(A, B)
    full = jax.grad(lambda A, B: jnp.sum(agj.eigh(A, B)[0][:3] ** 2), (0, 1))(A, B)
    close(top, full, 1e-9)
    close(jax.jit(jax.grad(f))(A, B), jax.grad(f)(A, B))
    close(jax.vmap(jax.grad(f))(jnp.stack([A, A]), jnp.stack([B, B]))[1], jax.grad(f)(A, B))
    with pytest.raises(ValueError, match="positive definite"):
        agj.eigsh(A, 3, -B)
    # k that cuts a repeated generalized eigenvalue: every derivative raises
    Q = jnp.linalg.inv(jnp.linalg.cholesky(B).T)  # Q^T B Q = I: the pencil (B Q D Q^T B, B) has eigenvalues D
    A2 = B @ Q @ jnp.diag(jnp.array([1.0, 2, 3, 4, 5, 6, 7, 7])) @ Q.T @ B
    with pytest.raises(DegenerateSubspaceError):
        jax.grad(lambda A: jnp.sum(agj.eigsh(A, 1, B)[0]))(A2)


def test_eigsh_lobpcg_is_jittable_without_a_host_call_and_matches_lapack():
    from adjointgen.runtime.errors import ConvergenceError

    M = arr(60, 60)
    A = M + M.T
    loss = lambda method: lambda A: (lambda w, V: jnp.sum(w ** 2) + jnp.sum((V @ V.T) * A))(  # noqa: E731
        *agj.eigsh(A, 4, method=method))
    for largest in (True, False):
        w, V = agj.eigsh(A, 4, method="lobpcg", largest=largest)
        w2, V2 = agj.eigsh(A, 4, largest=largest)
        close(w, w2, 1e-11)
        close(jnp.abs(V.T @ V2), jnp.eye(4), 1e-9)
    close(jax.grad(loss("lobpcg"))(A), jax.grad(loss("lapack"))(A), 1e-9)
    assert "pure_callback" not in str(jax.make_jaxpr(jax.grad(loss("lobpcg")))(A))  # no host round trip
    close(jax.jit(jax.grad(loss("lobpcg")))(A), jax.grad(loss("lapack"))(A), 1e-9)
    with pytest.raises(ConvergenceError):
        agj.eigsh(A, 4, method="lobpcg", maxiter=2)
    assert bool(jnp.isnan(jax.jit(lambda A: agj.eigsh(A, 4, method="lobpcg", maxiter=2)[0])(A)).all())
    with pytest.raises(ValueError, match="5 \\(k \\+ 1\\) < n"):
        agj.eigsh(A[:10, :10], 4, method="lobpcg")
    with pytest.raises(TypeError, match="real"):
        agj.eigsh(A.astype(complex), 4, method="lobpcg")


@pytest.mark.slow  # heavy (JAX compiles check_grads of order 2): CI's slow step
def test_device_forwards_of_eigsh_and_svds_are_jittable_without_a_host_call():
    """method="device": the whole decomposition on the array's device, the wanted pairs kept; the
    same values and derivatives as LAPACK on the host, real, complex and generalized, no
    pure_callback in the jaxpr, and the same cut and positive-definiteness errors."""
    from adjointgen import DegenerateSubspaceError

    rng = np.random.default_rng(0)  # its own generator: the matrices do not depend on the order of the tests
    M, N, C, T = (jnp.asarray(rng.standard_normal(shape)) for shape in ((9, 9), (9, 9), (9, 9), (9, 5)))
    C = C + 1j * jnp.asarray(rng.standard_normal((9, 9)))
    A, B, H = M + M.T, N @ N.T / 9 + jnp.eye(9), C + jnp.conj(C.T)

    def eig_loss(method, b=None, largest=True):
        def f(A):
            w, V = agj.eigsh(A, 3, b, method=method, largest=largest)
            return jnp.sum(w ** 2) + jnp.sum(jnp.abs(V @ jnp.conj(V.T)) ** 2)
        return f

    for X, b in ((A, None), (H, None), (A, B)):
        for largest in (True, False):
            w, V = agj.eigsh(X, 3, b, method="device", largest=largest)
            w2, V2 = agj.eigsh(X, 3, b, largest=largest)
            close(w, w2, 1e-11)
            close(jnp.abs(jnp.conj(V.T) @ (V2 if b is None else b @ V2)), jnp.eye(3), 1e-9)
            close(jax.grad(eig_loss("device", b, largest))(X), jax.grad(eig_loss("lapack", b, largest))(X), 1e-9)
        jaxpr = str(jax.make_jaxpr(jax.grad(eig_loss("device", b)))(X))
        assert "pure_callback" not in jaxpr  # no host round trip
        close(jax.jit(jax.grad(eig_loss("device", b)))(X), jax.grad(eig_loss("lapack", b))(X), 1e-9)
    check_grads(eig_loss("device"), (A,), order=2, modes=("fwd", "rev"))
    with pytest.raises(ValueError, match="positive definite"):
        agj.eigsh(A, 3, -B, method="device")

    for largest in (True, False):
        svd_loss = lambda method: lambda T: (lambda U, S, Vh: jnp.sum(S ** 3) + jnp.sum(((U * S) @ Vh) ** 2))(  # noqa: E731
            *agj.svds(T, 2, method=method, largest=largest))
        close(agj.svds(T, 2, method="device", largest=largest)[1], agj.svds(T, 2, largest=largest)[1], 1e-12)
        close(jax.grad(svd_loss("device"))(T), jax.grad(svd_loss("lapack"))(T), 1e-9)
        assert "pure_callback" not in str(jax.make_jaxpr(jax.grad(svd_loss("device")))(T))
    check_grads(svd_loss("device"), (T,), order=2, modes=("fwd", "rev"))
    with pytest.raises(ValueError, match="method"):
        agj.svds(T, 2, method="lobpcg")

    Q, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    A2 = jnp.asarray(Q @ np.diag([0.5, 1.0, 2.0, 3.0, 3.0, 4.0]) @ Q.T)  # k = 2 cuts the pair at 3
    with pytest.raises(DegenerateSubspaceError, match="cuts"):
        jax.grad(lambda A: jnp.sum(agj.eigsh(A, 2, method="device")[0]))(A2)
    assert bool(jnp.isnan(jax.jit(jax.grad(lambda A: jnp.sum(agj.eigsh(A, 2, method="device")[0])))(A2)).all())


def test_constants_closed_over_by_jit_are_checked_at_trace_time():
    """A concrete array that ``jit`` closes over is checked when traced (its jax.numpy operations
    would be staged: ``bool`` of a tracer), and a bad one raises."""
    A = 2.0 * jnp.eye(3)
    close(jax.jit(lambda b: agj.solve(A, b))(jnp.ones(3)), 0.5 * jnp.ones(3))
    close(jax.jit(lambda X: agj.eigsh(X, 2, B4)[0])(H4), agj.eigsh(H4, 2, B4)[0])
    bad = A.at[0, 0].set(jnp.nan)
    with pytest.raises(ValueError, match="NaN"):
        jax.jit(lambda b: agj.solve(bad, b))(jnp.ones(3))
    with pytest.raises(ValueError, match="NaN"):
        jax.jit(lambda X: agj.eigsh(X, 2, bad)[0])(A)


def test_the_generic_basis_never_mixes_vectors_of_distinct_values():
    """As on the torch side: a float32 spectrum of 1024 values 8e-4 apart (relative) keeps its
    eigenvectors (the rounding tolerance was 16 n eps and rotated the whole spectrum)."""
    n = 1024
    Q, _ = np.linalg.qr(np.random.default_rng(3).standard_normal((n, n)))
    A = ((Q * (1.0 + 4e-3 * np.arange(n))) @ Q.T).astype(np.float32)
    A = jnp.asarray((A + A.T) / 2)
    w, V = agj.eigh(A)
    assert float(jnp.abs(A @ V - V * w).max()) < 1e-5 * float(jnp.abs(w).max())
    graded = jnp.array([1e-300, 1.0, 1e100, 1e300])  # far apart relative to each value
    w, V = agj.eigh(jnp.diag(graded))
    assert bool(jnp.all(jnp.abs(V) == jnp.eye(4))) and bool(jnp.all(w == jnp.linalg.eigvalsh(jnp.diag(graded))))

"""adjointgen.jax: the generated JAX functions against jax.numpy, the torch side, finite differences
and JAX's own gradient checker, at the edges (exact clusters, gauge-dependent losses, complex,
float32, empty batches, every transform)."""
import subprocess
import sys
import zlib

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import adjointgen.jax as agj  # noqa: E402
from adjointgen.generated.jax.cholesky import cholesky as generated_cholesky  # noqa: E402
from adjointgen.runtime.gauge import DegenerateSubspaceError, PhaseDependentLossError  # noqa: E402

RNG = np.random.default_rng(20261202)


def _real(*shape):
    return RNG.standard_normal(shape)


def _cplx(*shape):
    return RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)


def _herm(n, complex_=False):
    X = _cplx(n, n) if complex_ else _real(n, n)
    return jnp.asarray(X + X.conj().T)


def _spd(n, complex_=False):
    X = _cplx(n, n) if complex_ else _real(n, n)
    return jnp.asarray(X @ X.conj().T + n * np.eye(n))


def _separated(m, n, complex_=False):
    """An m x n matrix with singular values 3, 2, 1, ... (well separated: finite differences of its
    SVD are accurate)."""
    U = np.linalg.qr(_cplx(m, m) if complex_ else _real(m, m))[0][:, :min(m, n)]
    V = np.linalg.qr(_cplx(n, n) if complex_ else _real(n, n))[0][:, :min(m, n)]
    return jnp.asarray(U @ np.diag(np.arange(min(m, n), 0, -1.0)) @ V.conj().T)


def _clustered(values):
    Q, _ = np.linalg.qr(_real(len(values), len(values)))
    return jnp.asarray(Q @ np.diag(values) @ Q.T)


def _weights(n, dtype=float):
    return jnp.asarray(np.arange(n * n, dtype=float).reshape(n, n) / n ** 2 + 0.5, dtype=dtype)


def _projector_loss(k):
    """sum(W ∘ P) with P the projector onto the first k eigenvectors: invariant under rotations
    of any cluster inside the first k (or the last n - k) eigenvalues."""
    def loss(A):
        V = agj.eigh(A)[1][..., :, :k]
        P = V @ jnp.conj(jnp.swapaxes(V, -1, -2))
        return jnp.real(jnp.sum(P * _weights(A.shape[-1])))
    return loss


def _fd(f, A, E, h=1e-6):
    return float((f(A + h * E) - f(A - h * E)) / (2 * h))


# ------------------------------------------------------------------ JAX's own gradient checker
def _invariant_eigh(A):
    w, V = agj.eigh(A)
    return jnp.real(jnp.abs(V) ** 2 * w[..., None, :])  # V diag(w) V^H entries' moduli: no gauge


def _invariant_svd(A):
    U, S, Vh = agj.svd(A, full_matrices=False)
    return jnp.abs(U * S[..., None, :]) ** 2, jnp.abs(Vh) ** 2


_B = {False: _spd(4), True: _spd(4, True)}
CASES = {
    "eigh": (_invariant_eigh, lambda c: _herm(4, c)),
    "eigh_values": (lambda A: agj.eigh(A)[0], lambda c: _herm(4, c)),
    "eigh_generalized": (lambda A: agj.eigh_generalized(A, _B[jnp.iscomplexobj(A)])[0], lambda c: _herm(4, c)),
    "svd_tall": (_invariant_svd, lambda c: _separated(4, 2, c)),
    "svd_values": (lambda A: agj.svd(A)[1], lambda c: _separated(3, 4, c)),
    "pinv": (agj.pinv, lambda c: _separated(5, 3, c)),
    "cholesky": (agj.cholesky, lambda c: _spd(4, c)),
    "qr": (lambda A: agj.qr(A),
           lambda c: jnp.asarray(_cplx(5, 3) if c else _real(5, 3))),
    "inv": (agj.inv, lambda c: _spd(4, c) + jnp.asarray(_real(4, 4))),
    "solve": (lambda A: agj.solve(A, jnp.ones((4, 2), A.dtype)), lambda c: _spd(4, c) + jnp.asarray(_real(4, 4))),
    "slogdet": (lambda A: agj.slogdet(A)[1], lambda c: _spd(4, c) + jnp.asarray(_real(4, 4))),
}


@pytest.mark.slow  # heavy (JAX compiles or a whole-catalogue audit): CI's slow step
@pytest.mark.parametrize("complex_", [False, True], ids=["real", "complex"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_check_grads_second_order_both_modes(name, complex_):
    global RNG
    RNG = np.random.default_rng(zlib.crc32(f"{name}-{complex_}".encode()))
    f, make = CASES[name]
    check_grads(f, (make(complex_),), order=2, modes=("fwd", "rev"))


@pytest.mark.slow  # 20 s
def test_check_grads_at_an_exact_cluster_for_an_invariant_loss():
    """Reverse mode checks the loss and passes.  Forward mode cannot see the loss, so a direction that
    splits the cluster raises (the eigenvectors' tangent is not defined there), and so does a
    second derivative, which needs the first derivative's eigenvalue tangents inside the cluster:
    an error outside ``jit``, NaN under it, never the finite wrong Hessian of the masked rules."""
    A = _clustered([1.0, 1.0, 1.0, 3.0, 4.0])
    for loss in (_projector_loss(3), lambda A: jnp.sum(agj.eigh(A)[0] ** 2)):
        check_grads(loss, (A,), order=1, modes=("rev",))
        with pytest.raises(DegenerateSubspaceError):
            check_grads(loss, (A,), order=1, modes=("fwd",))
        with pytest.raises(DegenerateSubspaceError):
            jax.hessian(loss)(A)
        assert bool(jnp.isnan(jax.jit(jax.hessian(loss))(A)).any())
    B = _clustered([1.0, 1.5, 2.0, 3.0, 4.0])  # apart: the Hessian is exact
    f = lambda A: jnp.sum(agj.eigh(A)[0] ** 2)  # noqa: E731
    np.testing.assert_allclose(jax.hessian(f)(B), jax.hessian(lambda A: jnp.sum(((A + A.T) / 2) ** 2))(B), atol=1e-10)


@pytest.mark.slow  # 18 s
def test_reverse_over_reverse_at_a_cluster_cannot_be_determined_in_jax():
    """Why JAX's reverse over reverse raises at an exact cluster, where torch's double backward is
    exact: JAX's reverse mode of ``grad f`` is the transpose of its linearization, so every rule
    (eigh's, the loss's) sees, for each direction ``dA``, only what forward over reverse sees.  Two
    smooth invariant losses, ``trace(G (A - λ)^2)`` and ``trace(G' (A - λ)^2)`` (``G' = G - V_c O V_c^T``,
    ``O`` off-diagonal), written through ``(w, V)``, hand every rule the same numbers along a
    direction inside the cluster, for any tangent a rule could choose there; their Hessians along
    it differ.  So ``jacrev(jacrev(f))`` and ``hessian`` raise for both (NaN under ``jit``), never a
    finite value that is wrong for one of them.  (torch's double backward is exact because it reads
    the loss's curvature from the loss's own graph, which no JAX rule, ``custom_jvp``, ``custom_vjp``
    or primitive, is handed; a ``custom_vjp`` would also lose forward mode.)"""
    lam, n = 2.0, 5
    rng = np.random.default_rng(11)
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    A = jnp.asarray(Q @ np.diag([lam, lam, lam, 3.0, 5.0]) @ Q.T)
    w, V = jnp.asarray([lam, lam, lam, 3.0, 5.0]), jnp.asarray(Q)
    Vc = V[:, :3]
    G = jnp.asarray(rng.standard_normal((n, n)))
    G = G + G.T
    O = jnp.asarray(rng.standard_normal((3, 3)))
    O = O + O.T - 2 * jnp.diag(jnp.diag(O))
    G2 = G - Vc @ O @ Vc.T

    def through(Gm):
        return lambda w, V: jnp.sum((w - lam) ** 2 * jnp.einsum("ij,ik,kj->j", V, Gm, V))

    Bc = jnp.asarray(rng.standard_normal((3, 3)))
    dA = Vc @ (Bc + Bc.T) @ Vc.T  # splits the cluster
    for _ in range(3):  # any tangent of (w, V) inside the cluster
        dw = jnp.zeros(n).at[:3].set(jnp.asarray(rng.standard_normal(3)))
        K = jnp.asarray(rng.standard_normal((3, 3)))
        dV = jnp.zeros((n, n)).at[:, :3].set(Vc @ (K - K.T))
        (g1, t1), (g2, t2) = (jax.jvp(jax.grad(through(Gm), argnums=(0, 1)), (w, V), (dw, dV)) for Gm in (G, G2))
        for a, b in zip((*g1, *t1), (*g2, *t2)):
            assert float(jnp.max(jnp.abs(a - b))) < 1e-12
    I = jnp.eye(n)
    true = [jax.jvp(jax.grad(lambda X, Gm=Gm: jnp.trace(Gm @ (X - lam * I) @ (X - lam * I))), (A,), (dA,))[1]
            for Gm in (G, G2)]
    assert float(jnp.max(jnp.abs(Vc.T @ (true[0] - true[1]) @ Vc))) > 0.1  # O Bc + Bc O: they differ

    for Gm in (G, G2):
        def loss(X, Gm=Gm):
            w, V = agj.eigh(X)
            return through(Gm)(w, V)
        for second in (jax.hessian, lambda f: jax.jacrev(jax.jacrev(f))):
            with pytest.raises(DegenerateSubspaceError):
                second(loss)(A)
        assert bool(jnp.isnan(jax.jit(jax.jacrev(jax.jacrev(loss)))(A)).any())


# ------------------------------------------------------------------ values
def test_values_match_jax_numpy_and_the_torch_side():
    torch = pytest.importorskip("torch")
    import adjointgen.torch as agt

    def close(a, b, tol=1e-12):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape
        assert np.max(np.abs(a - b)) <= tol * max(1.0, np.max(np.abs(b)))

    for complex_ in (False, True):
        H, S = _herm(5, complex_), _spd(5, complex_)
        M = jnp.asarray(_cplx(6, 4) if complex_ else _real(6, 4))
        N = S + jnp.asarray(_real(5, 5))
        B = jnp.asarray(_cplx(5, 2) if complex_ else _real(5, 2))
        t = lambda x: torch.from_numpy(np.array(x))  # noqa: E731
        w, V = agj.eigh(H)
        close(w, jnp.linalg.eigh(H)[0])
        close(w, agt.eigh(t(H))[0].numpy())
        close(V @ jnp.diag(w) @ jnp.conj(V.T), H)
        close(agj.eigh_generalized(H, S)[0], agt.eigh(t(H), t(S))[0].numpy())
        U, s, Vh = agj.svd(M, full_matrices=False)
        close(s, jnp.linalg.svd(M, compute_uv=False))
        close(s, agt.svd(t(M), full_matrices=False)[1].numpy())
        close(agj.pinv(M), jnp.linalg.pinv(M))
        close(agj.pinv(M), agt.pinv(t(M)).numpy())
        close(agj.cholesky(S), jnp.linalg.cholesky(S))
        close(agj.cholesky(S), agt.cholesky(t(S)).numpy())
        close(agj.qr(M)[1], jnp.linalg.qr(M)[1])
        close(agj.inv(N), jnp.linalg.inv(N), 1e-11)
        close(agj.inv(N), agt.inv(t(N)).numpy(), 1e-11)
        close(agj.solve(N, B), jnp.linalg.solve(N, B), 1e-11)
        close(agj.solve(N, B), agt.solve(t(N), t(B)).numpy(), 1e-11)
        close(agj.slogdet(N)[1], jnp.linalg.slogdet(N)[1])
        close(agj.slogdet(N)[1], agt.slogdet(t(N))[1].numpy())


@pytest.mark.slow  # 20 s
def test_gradients_match_jax_numpy_where_both_are_defined():
    H = _herm(4)
    M = jnp.asarray(_real(5, 3))
    W = _weights(4)
    for ours, theirs, X in [
        (lambda A: jnp.sum(agj.eigh(A)[1] ** 2 * W), lambda A: jnp.sum(jnp.linalg.eigh(A)[1] ** 2 * W), H),
        (lambda A: jnp.sum(agj.svd(A)[1] ** 3), lambda A: jnp.sum(jnp.linalg.svd(A, compute_uv=False) ** 3), M),
        (lambda A: jnp.sum(agj.cholesky(A) * W), lambda A: jnp.sum(jnp.linalg.cholesky(A) * W), _spd(4)),
        (lambda A: agj.slogdet(A)[1], lambda A: jnp.linalg.slogdet(A)[1], _spd(4)),
    ]:
        np.testing.assert_allclose(jax.grad(ours)(X), jax.grad(theirs)(X), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(jax.jit(jax.hessian(ours))(X), jax.hessian(theirs)(X), rtol=1e-8, atol=1e-10)


# ------------------------------------------------------------------ degenerate spectra, side by side
def test_projector_loss_at_an_exact_repeated_eigenvalue_is_exact_where_jax_numpy_is_not():
    A = _clustered([1.0, 1.0, 2.0, 3.0])
    E = jnp.asarray(_real(4, 4))
    E = E + E.T
    loss = _projector_loss(2)

    def jnp_loss(A):
        V = jnp.linalg.eigh(A)[1][:, :2]
        return jnp.sum(V @ V.T * _weights(4))

    fd = _fd(loss, A, E)
    ours = float(jnp.sum(jax.grad(loss)(A) * E))
    theirs = float(jnp.sum(jax.grad(jnp_loss)(A) * E))
    assert abs(ours - fd) <= 1e-6 * max(1.0, abs(fd))
    assert not abs(theirs - fd) <= 1e-3 * max(1.0, abs(fd))  # NaN or wrong: jax.numpy's own rule
    assert abs(float(jnp.sum(jax.jit(jax.grad(loss))(A) * E)) - fd) <= 1e-6 * max(1.0, abs(fd))


def test_a_gauge_dependent_loss_raises_outside_jit_and_is_nan_exactly_where_undefined_under_jit():
    A = jnp.stack([_clustered([1.0, 1.0, 2.0, 3.0]), _clustered([1.0, 2.0, 3.0, 4.0])])

    def loss(A):
        return jnp.sum(agj.eigh(A)[1][..., :, 0] ** 3)

    with pytest.raises(DegenerateSubspaceError, match="cluster"):
        jax.grad(loss)(A)
    g = jax.jit(jax.grad(loss))(A)
    assert bool(jnp.isnan(g[0]).all()) and bool(jnp.isfinite(g[1]).all())
    single = jax.grad(lambda B: jnp.sum(agj.eigh(B)[1][:, 0] ** 3))(A[1])  # distinct: no check fires
    np.testing.assert_allclose(g[1], single, rtol=1e-12)
    with agj.errors_in_jit(), pytest.raises(Exception, match="basis chosen inside a cluster"):
        jax.jit(jax.grad(lambda A: 2.0 * loss(A)))(A).block_until_ready()


def test_the_individual_values_of_a_cluster_have_no_gradient():
    A = _clustered([1.0, 1.0, 2.0])
    with pytest.raises(DegenerateSubspaceError):
        jax.grad(lambda A: agj.eigh(A)[0][0])(A)
    g = jax.grad(lambda A: jnp.sum(agj.eigh(A)[0][:2]))(A)  # their sum has one
    np.testing.assert_allclose(g, jax.grad(lambda A: jnp.sum(jnp.linalg.eigh(A)[0][:2]))(A), atol=1e-8)


def test_a_phase_dependent_complex_loss_raises_and_an_invariant_one_does_not():
    H = _herm(3, complex_=True)
    with pytest.raises(PhaseDependentLossError):
        jax.grad(lambda A: jnp.real(jnp.sum(agj.eigh(A)[1])))(H)
    with pytest.raises(PhaseDependentLossError):
        jax.grad(lambda A: jnp.real(jnp.sum(agj.svd(A)[0])))(H)
    assert bool(jnp.isnan(jax.jit(jax.grad(lambda A: jnp.real(jnp.sum(agj.eigh(A)[1]))))(H)).all())
    assert bool(jnp.isfinite(jax.grad(lambda A: jnp.sum(jnp.abs(agj.eigh(A)[1]) ** 2 * jnp.arange(3.0)))(H)).all())


def test_forward_mode_along_a_direction_that_splits_a_cluster_raises():
    A = _clustered([1.0, 1.0, 2.0, 3.0])
    with pytest.raises(DegenerateSubspaceError, match="splits it"):
        jax.jvp(agj.eigh, (A,), (jnp.diag(jnp.arange(1.0, 5.0)),))
    (w, V), (dw, dV) = jax.jvp(agj.eigh, (A,), (jnp.eye(4),))  # moves the cluster as a whole
    np.testing.assert_allclose(dw, np.ones(4), atol=1e-12)


def test_broadening_gives_a_finite_surrogate_and_turns_the_check_off():
    A = _clustered([1.0, 1.0, 2.0])
    g = jax.grad(lambda A: jnp.sum(agj.eigh(A, broadening=1e-8)[1][:, 0] ** 3))(A)
    assert bool(jnp.isfinite(g).all())


# ------------------------------------------------------------------ transforms, dtypes, shapes
@pytest.mark.slow  # heavy (JAX compiles or a whole-catalogue audit): CI's slow step
def test_every_transform():
    H = _herm(4)
    f = lambda A: agj.eigh(A)[0]  # noqa: E731
    ref = lambda A: jnp.linalg.eigh(A)[0]  # noqa: E731
    batch = jnp.stack([_herm(4), _herm(4), _herm(4)])
    np.testing.assert_allclose(jax.jacfwd(f)(H), jax.jacfwd(ref)(H), atol=1e-10)
    np.testing.assert_allclose(jax.jacrev(f)(H), jax.jacrev(ref)(H), atol=1e-10)
    np.testing.assert_allclose(jax.jit(jax.jacrev(f))(H), jax.jacrev(ref)(H), atol=1e-10)
    np.testing.assert_allclose(jax.vmap(jax.jacrev(f))(batch), jax.vmap(jax.jacrev(ref))(batch), atol=1e-10)
    np.testing.assert_allclose(jax.vmap(f)(batch), f(batch), atol=1e-12)
    np.testing.assert_allclose(jax.hessian(lambda A: jnp.sum(f(A) ** 3))(H),
                               jax.hessian(lambda A: jnp.sum(ref(A) ** 3))(H), atol=1e-9)
    _, lin = jax.linearize(f, H)
    np.testing.assert_allclose(lin(jnp.eye(4)), np.ones(4), atol=1e-12)
    vals, vjp = jax.vjp(lambda A: agj.svd(A, full_matrices=False), jnp.asarray(_real(4, 3)))
    assert [v.shape for v in vals] == [(4, 3), (3,), (3, 3)]
    assert vjp(type(vals)(jnp.zeros((4, 3)), jnp.ones(3), jnp.zeros((3, 3))))[0].shape == (4, 3)  # SVDResult, as JAX's


@pytest.mark.parametrize("name", ["eigh", "svd", "cholesky", "inv", "slogdet", "pinv"])
def test_float32_keeps_its_dtype_and_agrees_with_float64(name):
    X = {"eigh": _herm(4), "svd": jnp.asarray(_real(5, 3)), "cholesky": _spd(4), "inv": _spd(4),
         "slogdet": _spd(4), "pinv": jnp.asarray(_real(5, 3))}[name]
    fn = getattr(agj, name)
    loss = lambda A: sum(jnp.sum(jnp.abs(o) ** 2) for o in (fn(A) if isinstance(fn(A), tuple) else (fn(A),)))  # noqa: E731
    if name == "eigh":
        loss = lambda A: jnp.sum(agj.eigh(A)[0] ** 2)  # noqa: E731
    if name == "svd":
        loss = lambda A: jnp.sum(agj.svd(A)[1] ** 2)  # noqa: E731
    if name == "slogdet":
        loss = lambda A: agj.slogdet(A)[1]  # noqa: E731
    g64 = jax.grad(loss)(X)
    g32 = jax.grad(loss)(X.astype(jnp.float32))
    assert g32.dtype == jnp.float32
    np.testing.assert_allclose(g32, g64, rtol=2e-3, atol=2e-3 * float(jnp.max(jnp.abs(g64))))


def test_empty_batches_and_empty_matrices():
    for shape in [(0, 3, 3), (2, 0, 0), (0, 0)]:
        A = jnp.zeros(shape)
        w, V = agj.eigh(A)
        assert w.shape == shape[:-1] and V.shape == shape
        assert jax.grad(lambda A: jnp.sum(agj.eigh(A)[0]))(A).shape == shape
        assert agj.cholesky(A + jnp.eye(shape[-1])).shape == shape
        assert agj.inv(A + jnp.eye(shape[-1])).shape == shape


def test_solve_broadcasts_batch_dimensions_like_jax_numpy():
    A = _spd(3)[None] + jnp.asarray(_real(2, 3, 3))
    B = jnp.asarray(_real(4, 1, 3, 2))
    X = agj.solve(A, B)
    assert X.shape == (4, 2, 3, 2)
    np.testing.assert_allclose(X, jnp.linalg.solve(A, B), rtol=1e-10)
    g = jax.grad(lambda A, B: jnp.sum(agj.solve(A, B) ** 2), argnums=(0, 1))(A, B)
    h = jax.grad(lambda A, B: jnp.sum(jnp.linalg.solve(A, B) ** 2), argnums=(0, 1))(A, B)
    for a, b in zip(g, h):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_clear_errors_for_bad_input():
    # integers are promoted as JAX promotes them (to float32 for int32), not an error
    assert agj.eigh(jnp.eye(3, dtype=jnp.int32)).eigenvalues.dtype == jnp.linalg.eigh(jnp.eye(3, dtype=jnp.int32))[0].dtype
    with pytest.raises(ValueError, match="matrix"):
        agj.eigh(jnp.ones(3))
    with pytest.raises(ValueError, match="square"):
        agj.eigh(jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="NaN or Inf"):
        agj.svd(jnp.full((2, 2), jnp.nan))
    with pytest.raises(ValueError, match="positive definite"):
        agj.cholesky(-jnp.eye(2))
    with pytest.raises(TypeError, match="one dtype"):
        agj.solve(jnp.eye(2), jnp.ones((2, 1), jnp.float32))
    with pytest.raises(TypeError, match="floating"):
        generated_cholesky(jnp.eye(2, dtype=jnp.int8))  # the generated function itself
    assert bool(jnp.isnan(jax.jit(agj.cholesky)(-jnp.eye(2))).any())  # under jit: NaN, as jax.numpy


@pytest.mark.slow  # two fresh interpreters
def test_the_torch_side_does_not_import_jax_and_the_jax_side_not_torch():
    code = ("import sys, adjointgen.torch, adjointgen.cupy; assert 'jax' not in sys.modules, 'jax imported'; "
            "print('ok')")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "ok"
    code = ("import sys, adjointgen.jax as agj, jax.numpy as jnp; agj.eigh(jnp.eye(2)); "
            "assert 'torch' not in sys.modules, 'torch imported'; print('ok')")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "ok"


@pytest.mark.slow  # 13-25 s: the default suite keeps its time; CI's slow step runs it
def test_matrix_function_aliases_match_scipy_and_check_grads():
    import scipy.linalg

    rng = np.random.default_rng(3)
    M = rng.standard_normal((4, 4))
    A = jnp.asarray(M @ M.T + 4 * np.eye(4))
    a = np.asarray(A)
    np.testing.assert_allclose(agj.expm(A), scipy.linalg.expm(a), rtol=1e-12)
    np.testing.assert_allclose(agj.logm(A), scipy.linalg.logm(a), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(agj.sqrtm(A), scipy.linalg.sqrtm(a), rtol=1e-12)
    np.testing.assert_allclose(agj.powm(A, 0.3), scipy.linalg.fractional_matrix_power(a, 0.3), rtol=1e-11)
    W = jnp.arange(16.0).reshape(4, 4)
    for f in (agj.expm, agj.logm, agj.sqrtm, lambda A: agj.powm(A, 0.3)):
        check_grads(lambda A: jnp.sum(f(A) * W), (A,), order=2, modes=("fwd", "rev"))
    # a repeated eigenvalue: no gauge in the general-matrix rules, the gradient is that of SciPy's function
    Q, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    B = Q @ np.diag([1.0, 1.0, 2.0, 3.0]) @ Q.T
    E = rng.standard_normal((4, 4))
    g = jax.grad(lambda A: jnp.sum(agj.logm(A) * W))(jnp.asarray(B))
    h = 1e-6
    fd = (np.sum(scipy.linalg.logm(B + h * E).real * np.asarray(W)) - np.sum(scipy.linalg.logm(B - h * E).real * np.asarray(W))) / (2 * h)
    assert abs(float(jnp.sum(g * E)) - fd) < 1e-6 * max(1.0, abs(fd))



@pytest.mark.slow  # heavy (JAX compiles or a whole-catalogue audit): CI's slow step
def test_eigsh_values_gradients_and_transforms():
    rng = np.random.default_rng(5)
    for complex_ in (False, True):
        M = rng.standard_normal((7, 7)) + (1j * rng.standard_normal((7, 7)) if complex_ else 0)
        A = jnp.asarray((M + np.conj(M.T)) / 2)
        W, U = jnp.linalg.eigh(A)
        for largest in (True, False):
            w, V = agj.eigsh(A, 3, largest=largest)
            order = np.argsort(-np.asarray(W))[:3] if largest else np.argsort(np.asarray(W))[:3]
            np.testing.assert_allclose(w, np.asarray(W)[order], rtol=0, atol=1e-12)
            np.testing.assert_allclose(np.abs(np.sum(np.conj(np.asarray(U)[:, order]) * np.asarray(V), axis=0)), 1, atol=1e-10)

            def f(A):
                w, V = agj.eigsh(A, 3, largest=largest)
                return jnp.sum(w ** 2) + jnp.sum(jnp.abs(V) ** 4)

            def f_full(A):
                W, U = jnp.linalg.eigh(A)
                return jnp.sum(W[order] ** 2) + jnp.sum(jnp.abs(U[:, order]) ** 4)

            np.testing.assert_allclose(jax.grad(f)(A), jax.grad(f_full)(A), rtol=1e-10, atol=1e-10)
            check_grads(f, (A,), order=2, modes=("fwd", "rev"))
            np.testing.assert_allclose(jax.jit(jax.grad(f))(A), jax.grad(f)(A), rtol=1e-12, atol=1e-12)
    B = jnp.stack([A, A + 2 * jnp.eye(7)])
    np.testing.assert_allclose(jax.vmap(lambda A: agj.eigsh(A, 2)[0])(B)[1], agj.eigsh(B[1], 2)[0], rtol=1e-12)
    with pytest.raises(ValueError, match="k must be"):
        agj.eigsh(A, 8)


def test_eigsh_clusters_and_cuts():
    rng = np.random.default_rng(6)
    Q, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    A = jnp.asarray(Q @ np.diag([0.5, 1.0, 2.0, 3.0, 3.0, 4.0]) @ Q.T)  # 3 twice, kept whole by k = 3
    W = jnp.asarray(rng.standard_normal((6, 6)))

    def projector_loss(A):  # the span of the pair: invariant
        V = agj.eigsh(A, 3)[1][:, 1:]
        return jnp.sum(V @ V.T * W)

    E = rng.standard_normal((6, 6))
    E = jnp.asarray(E + E.T)
    h = 1e-6
    fd = (projector_loss(A + h * E) - projector_loss(A - h * E)) / (2 * h)
    assert abs(float(jnp.sum(jax.grad(projector_loss)(A) * E)) - float(fd)) < 1e-6
    with pytest.raises(DegenerateSubspaceError):  # a vector of the pair: basis-dependent
        jax.grad(lambda A: jnp.sum(agj.eigsh(A, 3)[1][:, 1] ** 3))(A)
    assert bool(jnp.isnan(jax.jit(jax.grad(lambda A: jnp.sum(agj.eigsh(A, 3)[1][:, 1] ** 3)))(A)).all())
    with pytest.raises(DegenerateSubspaceError, match="cuts"):  # k = 2 keeps one of the pair
        jax.grad(lambda A: jnp.sum(agj.eigsh(A, 2)[0]))(A)
    assert bool(jnp.isnan(jax.jit(jax.grad(lambda A: jnp.sum(agj.eigsh(A, 2)[0])))(A)).all())


@pytest.mark.slow  # heavy (JAX compiles or a whole-catalogue audit): CI's slow step
def test_svds_values_gradients_and_cuts():
    rng = np.random.default_rng(7)
    W = jnp.asarray(rng.standard_normal((8, 5)))
    for A in (jnp.asarray(rng.standard_normal((8, 5))), jnp.asarray(rng.standard_normal((5, 8))).T):
        for largest in (True, False):
            U, S, Vh = agj.svds(A, 2, largest=largest)
            u, s, vh = jnp.linalg.svd(A, full_matrices=False)
            idx = np.arange(2) if largest else np.arange(5)[::-1][:2]
            np.testing.assert_allclose(S, s[idx], rtol=0, atol=1e-12)

            def f(A):
                U, S, Vh = agj.svds(A, 2, largest=largest)
                return jnp.sum(S ** 2) + jnp.sum((U * S) @ Vh * W)

            def f_full(A):
                u, s, vh = jnp.linalg.svd(A, full_matrices=False)
                return jnp.sum(s[idx] ** 2) + jnp.sum((u[:, idx] * s[idx]) @ vh[idx] * W)

            np.testing.assert_allclose(jax.grad(f)(A), jax.grad(f_full)(A), rtol=1e-10, atol=1e-10)
            check_grads(f, (A,), order=2, modes=("fwd", "rev"))
    np.testing.assert_allclose(jax.vmap(lambda A: agj.svds(A, 2)[1])(jnp.stack([A, 2 * A]))[1], 2 * agj.svds(A, 2)[1],
                               rtol=1e-12)
    Q1, _ = np.linalg.qr(rng.standard_normal((6, 4)))
    Q2, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    B = jnp.asarray(Q1 @ np.diag([4.0, 3.0, 3.0, 1.0]) @ Q2.T)  # 3 twice: k = 2 cuts it
    with pytest.raises(DegenerateSubspaceError, match="cuts"):
        jax.grad(lambda B: jnp.sum(agj.svds(B, 2)[1]))(B)
    assert bool(jnp.isnan(jax.jit(jax.grad(lambda B: jnp.sum(agj.svds(B, 2)[1])))(B)).all())
    g = jax.grad(lambda B: jnp.sum(agj.svds(B, 3)[1]))(B)  # kept whole: the sum is differentiable
    np.testing.assert_allclose(g, Q1[:, :3] @ Q2[:, :3].T, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="k must be"):
        agj.svds(B, 5)


@pytest.mark.parametrize("A", [np.zeros((3, 3)), 2 * np.eye(3), np.eye(3, dtype=complex)], ids=["zero", "2I", "I complex"])
def test_lapack_basis_of_exact_clusters_does_not_hide_basis_dependence(A):
    """LAPACK's eigenvectors (singular vectors) of the zero matrix and of multiples of I are I, at which
    the first-order test of these losses vanishes; the forwards return a generic basis instead."""
    A = jnp.asarray(A)
    losses = {"eigh": lambda A: jnp.abs(agj.eigh(A)[1][0, 0]) ** 2, "eig": lambda A: jnp.abs(agj.eig(A)[1][0, 0]),
              "svd": lambda A: jnp.abs(agj.svd(A)[0][0, 0])}
    for name, loss in losses.items():
        with pytest.raises(DegenerateSubspaceError):
            jax.grad(loss)(A)
    np.testing.assert_allclose(jax.grad(lambda A: jnp.sum(agj.eigh(A)[0]).real)(A), np.eye(3), atol=1e-12)
    w, V = agj.eigh(A)
    np.testing.assert_allclose(A @ V, V * w, atol=1e-12)
    np.testing.assert_allclose(jnp.conj(V.T) @ V, np.eye(3), atol=1e-12)

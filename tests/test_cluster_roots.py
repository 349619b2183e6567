"""Clusters where the loss's ``f`` vanishes: rank-deficient matrices and their kin.

``V diag(f(w)) V^H`` at a cluster of equal eigenvalues at a root of ``f`` -- the matrix itself, its
square or cube at a zero cluster (a rank-deficient or PSD matrix), ``(A - λ)^2`` at ``λ`` -- has
cotangents of the size of the cluster's rounding inside the cluster.  Measured against the
cluster alone they looked like a loss on the basis or on the individual eigenvalues, and every one
of these smooth losses raised, ``sum(w**2)`` (``|A|_F^2``) at a zero cluster among them.  The
cluster's block of the gradient is read off the rounding where the cotangents carry it
(``degeneracy._root_block``) and is rounding beside the gradient where they do not; a loss on an
individual eigenvalue, or on the basis, still raises.  References are independent: the same
function written with matrix products (``torch``'s own gradient), or Richardson central
differences.
"""
import itertools

import pytest
import torch

import adjointgen.torch as agt
from adjointgen.runtime.gauge import DegenerateSubspaceError

N = 7


def _herm(X):
    return (X + X.mH) / 2


def _matrix(lam, dtype, seed, generalized=False):
    """A Hermitian matrix with a triple eigenvalue ``lam`` (and for the pencil, ``B``), and a
    Hermitian weight ``G``."""
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(N, N, dtype=dtype, generator=g))
    d = torch.tensor([lam, lam, lam, 0.5, 4.0, -3.0, 6.0], dtype=torch.float64)
    A = Q @ torch.diag(d).to(dtype) @ Q.mH
    G = torch.randn(N, N, dtype=dtype, generator=g)
    G = G + G.mH
    B = None
    if generalized:  # B^{1/2} A B^{1/2}: the pencil has the same eigenvalues
        C = torch.randn(N, N, dtype=dtype, generator=g)
        B = C @ C.mH / N + torch.eye(N, dtype=dtype)
        wb, Vb = torch.linalg.eigh(B)
        Bh = (Vb * wb.sqrt().to(dtype)) @ Vb.mH
        A = Bh @ A @ Bh
    return A, G, B


def _power(M, p):
    out = torch.eye(M.shape[-1], dtype=M.dtype)
    for _ in range(p):
        out = out @ M
    return out


# f as a function of the eigenvalues, and the same matrix function written with matrix products
# of ``M = B^{-1} A`` (the pencil's ``V f(Λ) V^H = f(B^{-1} A) B^{-1}``)
FUNCTIONS = {
    "w": (lambda w, lam: w, lambda M, lam: M),
    "w**2": (lambda w, lam: w ** 2, lambda M, lam: _power(M, 2)),
    "w**3": (lambda w, lam: w ** 3, lambda M, lam: _power(M, 3)),
    "(w-lam)**2": (lambda w, lam: (w - lam) ** 2,
                   lambda M, lam: _power(M - lam * torch.eye(M.shape[-1], dtype=M.dtype), 2)),
}


def _losses(solver, fname, lam, G, B):
    f, F = FUNCTIONS[fname]

    def through_vectors(X):
        X = _herm(X)
        if solver == "eigh":
            w, V = agt.eigh(X)
        elif solver == "eigh(A, B)":
            w, V = agt.eigh(X, B)
        else:  # the five smallest: the cluster and the two below it
            w, V = agt.eigsh(X, 5, largest=False)
        return (((V * f(w, lam).to(V.dtype)) @ V.mH) * G.conj()).sum().real

    def reference(X):
        X = _herm(X)
        Binv = torch.eye(N, dtype=X.dtype) if B is None else torch.linalg.inv(B)
        return ((F(Binv @ X, lam) @ Binv) * G.conj()).sum().real

    if solver == "eigsh":  # the five kept pairs of the full decomposition (checked above against F)
        def reference(X):  # noqa: F811
            w, V = agt.eigh(_herm(X))
            w, V = w[..., :5], V[..., :5]
            return (((V * f(w, lam).to(V.dtype)) @ V.mH) * G.conj()).sum().real

    return through_vectors, reference


CASES = [(s, f, lam) for s, f, lam in itertools.product(("eigh", "eigh(A, B)", "eigsh"), FUNCTIONS, (0.0, 2.0))]


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=["real", "complex"])
@pytest.mark.parametrize("solver,fname,lam", CASES, ids=[f"{s}-{f}-at{lam:g}" for s, f, lam in CASES])
def test_matrix_function_at_a_cluster_at_a_root_of_f(solver, fname, lam, dtype):
    """The gradient of ``<G, V f(D) V^H>`` at a triple eigenvalue ``lam``, by ``torch.autograd``,
    ``torch.func.grad``, with ``create_graph=True`` and under ``vmap``, equals the gradient of
    the same function written with matrix products, for two seeds."""
    for seed in range(2):
        A, G, B = _matrix(lam, dtype, seed, generalized=solver == "eigh(A, B)")
        loss, reference = _losses(solver, fname, lam, G, B)
        want = _herm(torch.func.grad(reference)(A))
        scale = float(want.abs().max())
        X = A.clone().requires_grad_()
        got = {"autograd": torch.autograd.grad(loss(X), X)[0]}
        X = A.clone().requires_grad_()
        got["create_graph"] = torch.autograd.grad(loss(X), X, create_graph=True)[0].detach()
        got["func.grad"] = torch.func.grad(loss)(A)
        got["vmap(grad)"] = torch.func.vmap(torch.func.grad(loss))(torch.stack([A, A]))[1]
        for how, g in got.items():
            err = float((_herm(g) - want).abs().max()) / scale
            assert err < 1e-9, (solver, fname, lam, seed, how, err)


def _zero_cluster(dtype=torch.float64, seed=0):
    return _matrix(0.0, dtype, seed)


@pytest.mark.parametrize("which", ["w[1]", "w[1] + 2 w[2]", "w[1] + <G, A>", "V[0,1]**2", "w[1] V[0,2]",
                                   "zero matrix, V[0,0]", "diagonal, <G, A> through V diag(w) V^T"])
def test_basis_dependent_losses_at_a_zero_cluster_raise(which):
    """A loss on an individual eigenvalue of a zero cluster, or on its basis, has no gradient:
    ``DegenerateSubspaceError`` by ``torch.autograd`` and ``torch.func.grad`` (the cluster is at
    indices 1, 2, 3; ``w[1]`` alone fits the rounding form with ``λ = d_1``, which the fit
    refuses)."""
    A, G, _ = _zero_cluster()

    def loss(X):
        w, V = agt.eigh(_herm(X))
        if which == "w[1]":
            return w[1]
        if which == "w[1] + 2 w[2]":
            return w[1] + 2 * w[2]
        if which == "w[1] + <G, A>":
            return w[1] + (((V * w) @ V.mT) * G).sum()
        if which == "V[0,1]**2":
            return V[0, 1] ** 2
        if which == "w[1] V[0,2]":
            return w[1] * V[0, 2]
        if which == "zero matrix, V[0,0]":
            return V[0, 0]
        return (((V * w) @ V.mT) * G).sum()

    if which == "zero matrix, V[0,0]":
        A = torch.zeros(N, N, dtype=torch.float64)
    if which.startswith("diagonal"):  # LAPACK's exact zeros: the cotangents carry nothing of G's block
        A = torch.diag(torch.tensor([0.0, 0.0, 0.0, 0.5, 4.0, -3.0, 6.0], dtype=torch.float64))
    X = A.clone().requires_grad_()
    with pytest.raises(DegenerateSubspaceError):
        torch.autograd.grad(loss(X), X)
    with pytest.raises(DegenerateSubspaceError):
        torch.func.grad(loss)(A)


SPECTRAL = {
    "sum(w**2)": (lambda w, V: (w ** 2).sum(), lambda X: (X @ X).trace()),
    "sum(w**3)": (lambda w, V: (w ** 3).sum(), lambda X: (X @ X @ X).trace()),
    "sum(exp(w))": (lambda w, V: w.exp().sum(), lambda X: torch.linalg.matrix_exp(X).trace()),
}


@pytest.mark.parametrize("name", list(SPECTRAL))
@pytest.mark.parametrize("lam", [0.0, 2.0])
def test_hessian_of_a_spectral_function_at_a_cluster(name, lam):
    """Second derivatives of symmetric functions of the eigenvalues at a triple eigenvalue, zero
    cluster included (``|A|_F^2`` of a rank-deficient matrix raised at first order before): every
    reverse-over-reverse route against the function written with matrix products."""
    A, _, _ = _matrix(lam, torch.float64, 0)
    spectral, direct = SPECTRAL[name]

    def loss(X):
        return spectral(*agt.eigh(_herm(X)))

    want = torch.func.hessian(lambda X: direct(_herm(X)))(A)
    scale = float(want.abs().max())
    got = {"autograd.functional.hessian": torch.autograd.functional.hessian(loss, A),
           "jacrev(jacrev)": torch.func.jacrev(torch.func.jacrev(loss))(A)}
    v = torch.randn(N, N, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    _, pullback = torch.func.vjp(torch.func.grad(loss), A)
    hvp = pullback(v)[0]
    assert float((hvp - torch.einsum("ij,ijkl->kl", v, want)).abs().max()) < 1e-9 * scale
    for how, H in got.items():
        assert float((H - want).abs().max()) < 1e-9 * scale, (name, lam, how)


def test_first_derivative_built_for_a_second_is_right_and_the_second_raises():
    """``V diag(w**2) V^T`` at a cluster at 2: its first derivative with ``create_graph=True`` is
    exact (it raised there before, as if the second were being taken); the second derivative,
    which needs the divided differences of ``f`` (``adjointgen.torch.funm``), raises when taken."""
    A, G, _ = _matrix(2.0, torch.float64, 0)
    loss, reference = _losses("eigh", "w**2", 2.0, G, None)
    X = A.clone().requires_grad_()
    g, = torch.autograd.grad(loss(X), X, create_graph=True)
    want = _herm(torch.func.grad(reference)(A))
    assert float((_herm(g.detach()) - want).abs().max()) < 1e-9 * float(want.abs().max())
    with pytest.raises(DegenerateSubspaceError, match="symmetric function"):
        torch.autograd.grad((g * G).sum(), X)


def test_hessian_through_the_vectors_by_func_transforms_raises_not_wrong():
    """``trace(V diag(w**3) V^T)`` (``sum(w**3)`` through the vectors) at a cluster: by
    ``torch.autograd.functional.hessian`` exact; ``jacrev(jacrev)`` cannot see the loss's curvature
    inside the cluster from the first backward and was off by 3.1 (max abs): it raises now."""
    A, _, _ = _matrix(2.0, torch.float64, 0)

    def loss(X):
        w, V = agt.eigh(_herm(X))
        return ((V * w ** 3) @ V.mT).trace()

    want = torch.func.hessian(lambda X: _power(_herm(X), 3).trace())(A)
    H = torch.autograd.functional.hessian(loss, A)
    assert float((H - want).abs().max()) < 1e-9 * float(want.abs().max())
    with pytest.raises(DegenerateSubspaceError, match="torch.autograd"):
        torch.func.jacrev(torch.func.jacrev(loss))(A)


@pytest.mark.parametrize("shape,rank", [((6, 4), 2), ((4, 6), 2), ((5, 5), 3), ((5, 5), 4)])
def test_svd_of_a_rank_deficient_matrix(shape, rank):
    """``U S^3 V^H`` (``A A^H A``) of a rank-deficient matrix: exact.  The nuclear norm (a kink at
    each zero singular value) raises, for square matrices too (it returned ``U V^H`` there).  The
    reconstruction ``U S V^H`` of a square matrix with one zero singular value is exact (its
    cotangents show the odd ``f``); of a tall or wide one, or at a zero cluster, it raises."""
    g = torch.Generator().manual_seed(0)
    m, n = shape
    A = torch.randn(m, rank, dtype=torch.float64, generator=g) @ torch.randn(rank, n, dtype=torch.float64, generator=g)
    G = torch.randn(m, n, dtype=torch.float64, generator=g)

    def through(f):
        def loss(X):
            U, S, Vh = agt.svd(X, full_matrices=False)
            return (((U * f(S)) @ Vh) * G).sum()
        return loss

    want = torch.func.grad(lambda X: ((X @ X.mT @ X) * G).sum())(A)
    got = torch.func.grad(through(lambda s: s ** 3))(A)
    assert float((got - want).abs().max()) < 1e-9 * float(want.abs().max())
    with pytest.raises(DegenerateSubspaceError, match="zero singular value|individual singular values"):
        torch.func.grad(lambda X: agt.svd(X, full_matrices=False)[1].sum())(A)
    if m == n and n - rank == 1:
        got = torch.func.grad(through(lambda s: s))(A)
        assert float((got - G).abs().max()) < 1e-12 * float(G.abs().max())
    else:
        with pytest.raises(DegenerateSubspaceError):
            torch.func.grad(through(lambda s: s))(A)


@pytest.mark.parametrize("fname,lam", [("w**2", 0.0), ("w**3", 0.0), ("(w-lam)**2", 2.0)])
def test_jax_matrix_function_at_a_double_root_of_f(fname, lam):
    """JAX: ``V diag(f(w)) V^T`` with ``f(λ) = f'(λ) = 0`` at a cluster at ``λ`` (``A^2`` of a
    rank-deficient matrix): the cluster's block of the gradient is zero, its cotangents rounding
    beside the gradient; by ``jax.grad`` and ``jit(grad)`` exact (it raised).  Where ``f'(λ) != 0``
    the block is not zero and JAX's transposed JVP cannot carry it: that raises, as do losses on
    an eigenvalue or the basis of the cluster."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    import adjointgen.jax as agj

    A, G, _ = _matrix(lam, torch.float64, 0)
    A, G = jnp.asarray(A.numpy()), jnp.asarray(G.numpy())
    f, F = FUNCTIONS[fname]

    def sym(X):
        return (X + X.T) / 2

    def loss(X):
        w, V = agj.eigh(sym(X))
        return jnp.sum(((V * f(w, lam)) @ V.T) * G)

    def reference(X):
        M = sym(X)
        if fname == "(w-lam)**2":
            M = M - lam * jnp.eye(N)
        P = M @ M if fname != "w**3" else M @ M @ M
        return jnp.sum(P * G)

    want = jax.grad(reference)(A)
    for how, grad in (("grad", jax.grad(loss)), ("jit(grad)", jax.jit(jax.grad(loss)))):
        err = float(jnp.max(jnp.abs(grad(A) - want)) / jnp.max(jnp.abs(want)))
        assert err < 1e-9, (how, err)
    for bad in (lambda X: agj.eigh(sym(X))[0][1 if lam == 0 else 2],
                lambda X: agj.eigh(sym(X))[1][0, 2] ** 2,
                lambda X: jnp.sum(((lambda w, V: (V * w) @ V.T)(*agj.eigh(sym(X)))) * G)):
        with pytest.raises(DegenerateSubspaceError):
            jax.grad(bad)(A)


def test_forward_over_reverse_at_a_cluster_cannot_be_determined():
    """The README's argument for raising in forward over reverse along a splitting direction, on
    numbers: two smooth invariant losses, ``trace(G (A - λ)^2)`` and ``trace(G' (A - λ)^2)`` with
    ``G' = G - V_c O V_c^T`` (``O`` zero on its diagonal in the primal basis), written through
    ``(w, V)``.  For a direction inside the cluster's block, whatever tangent a forward rule
    chooses inside the cluster (values, rotation), the loss's first derivatives at ``(w, V)`` and
    their tangents are identical for both -- yet the Hessian-vector products differ."""
    lam = 2.0
    A, G, _ = _matrix(lam, torch.float64, 0)
    w, V = agt.eigh(A)
    c = [i for i in range(N) if abs(float(w[i]) - lam) < 1e-8]
    assert len(c) == 3
    w = w.clone()
    w[c] = lam  # the exact cluster
    Vc = V[:, c]
    g = torch.Generator().manual_seed(5)
    O = torch.randn(3, 3, dtype=torch.float64, generator=g)
    O = O + O.mT
    O = O - torch.diag_embed(O.diagonal())
    G2 = G - Vc @ O @ Vc.mT

    def through(Gm):
        return lambda w, V: ((w - lam) ** 2 * torch.einsum("ij,ik,kj->j", V, Gm, V)).sum()

    Bc = torch.randn(3, 3, dtype=torch.float64, generator=g)
    Bc = Bc + Bc.mT  # splits the cluster
    dA = Vc @ Bc @ Vc.mT
    for trial in range(3):  # any tangent inside the cluster: values, rotation
        dw = torch.zeros(N, dtype=torch.float64)
        dw[c] = torch.randn(3, dtype=torch.float64, generator=g)
        K = torch.randn(3, 3, dtype=torch.float64, generator=g)
        dV = torch.zeros(N, N, dtype=torch.float64)
        dV[:, c] = Vc @ (K - K.mT)
        first = [torch.func.jvp(torch.func.grad(through(Gm), argnums=(0, 1)), (w, V), (dw, dV)) for Gm in (G, G2)]
        (g1, t1), (g2, t2) = first
        for a, b in zip((*g1, *t1), (*g2, *t2)):
            assert float((a - b).abs().max()) < 1e-12
    I = torch.eye(N, dtype=torch.float64)
    hvp = [Gm @ dA + dA @ Gm for Gm in (G, G2)]  # d/dt of grad trace(G (A + t dA - λ)^2) at A
    want = [torch.func.jvp(torch.func.grad(lambda X, Gm=Gm: torch.trace(Gm @ (X - lam * I) @ (X - lam * I))), (A,),
                           (dA,))[1] for Gm in (G, G2)]
    for h, x in zip(hvp, want):
        assert float((h - x).abs().max()) < 1e-10
    block = Vc.mT @ (hvp[0] - hvp[1]) @ Vc
    assert float(block.abs().max()) > 0.1  # O Bc + Bc O
    assert float((block - (O @ Bc + Bc @ O)).abs().max()) < 1e-10


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=["real", "complex"])
@pytest.mark.parametrize("generalized", [False, True], ids=["eigh", "eigh(A, B)"])
@pytest.mark.parametrize("lam", [0.0, 2.0, -1e-3])
def test_losses_that_mix_in_individual_values_still_raise(lam, generalized, dtype):
    """The rounding form ``X = P diag(d - λ)`` must not let through a loss that is not a matrix
    function: individual values of the cluster, two different ``f`` (or ``G``) for its members, a
    vector entry -- each alone or added to ``<G, V diag(w) V^H>``, whose cotangents the form fits.
    Every one raises, for two seeds."""
    for seed in range(2):
        A, G, B = _matrix(lam, dtype, seed, generalized)
        H = torch.randn(N, N, dtype=dtype, generator=torch.Generator().manual_seed(seed + 50))
        H = H + H.mH
        c = torch.tensor([0.3, -1.2, 0.7], dtype=torch.float64)

        def eig(X):
            return agt.eigh(_herm(X)) if B is None else agt.eigh(_herm(X), B)

        w0, _ = eig(A)
        cl = [i for i in range(N) if abs(float(w0[i]) - lam) < 1e-6]
        assert len(cl) == 3

        def matrix(w, V, f, M):
            return (((V * f(w).to(V.dtype)) @ V.mH) * M.conj()).sum().real

        def quad(V, i, M):
            return (V[:, i].conj() @ M @ V[:, i]).real

        losses = {
            "c . w on the cluster": lambda w, V: (w[cl] * c).sum(),
            "w_c0 + <G, A>": lambda w, V: w[cl[0]] + matrix(w, V, lambda x: x, G),
            "a different f per member": lambda w, V: sum((w[i] - lam) * (1 + i) * quad(V, i, G) for i in range(N)),
            "a different G for one member": lambda w, V: sum((w[i] - lam) * quad(V, i, H if i == cl[0] else G)
                                                             for i in range(N)),
            "|V[0, c0]|^2": lambda w, V: V[0, cl[0]].abs() ** 2,
            "w_c0 |V[0, c1]|^2 + <G, A>": lambda w, V: w[cl[0]] * V[0, cl[1]].abs() ** 2 + matrix(w, V, lambda x: x, G),
        }
        for name, loss in losses.items():
            with pytest.raises(DegenerateSubspaceError):
                torch.func.grad(lambda X, loss=loss: loss(*eig(X)))(A)

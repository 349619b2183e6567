"""Second derivatives at clusters of equal eigenvalues (issue 18, "second order at degeneracy").

The Hessian of an invariant loss exists at an exactly repeated eigenvalue; reverse over reverse
must give it, real and complex, for ``eigh`` and the generalized ``eigh(A, B)`` (in ``A``), under
``torch.autograd``, ``torch.func`` and gradgradcheck.  The reference is a Richardson extrapolated
central difference of the first derivative, whose step (1e-4) keeps the cluster apart from the
rest of the spectrum (gap 1), so the loss is smooth along it.

What is not available raises (never a wrong number): second derivatives through the SVD's or
``B``'s values at a cluster, third derivatives at a cluster, and forward-mode derivatives along a
direction that splits a cluster.
"""
import pytest
import torch

import adjointgen.torch as agt
from adjointgen import DegenerateSubspaceError

f64, c128 = torch.float64, torch.complex128


def _herm(X):
    return (X + X.mH) / 2


def _orth(n, dtype, g):
    return torch.linalg.qr(torch.randn(n, n, dtype=dtype, generator=g))[0]


def _problem(dtype, gap, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = 5
    Q = _orth(n, dtype, g)
    values = torch.tensor([1.0, 2.0, 2.0 + gap, 3.0, 4.0], dtype=f64).to(dtype)
    A = _herm((Q * values) @ Q.mH)
    P2 = _herm(torch.randn(n, n, dtype=dtype, generator=g))
    L = torch.eye(n, dtype=dtype) + 0.3 * torch.tril(torch.randn(n, n, dtype=dtype, generator=g), -1)
    B = _herm(L @ L.mH)
    Ag = _herm(L @ ((Q * values) @ Q.mH) @ L.mH)  # eigenvalues of (Ag, B): the same spectrum
    E = torch.randn(n, n, dtype=dtype, generator=g)
    return A, Ag, B, P2, E


def _losses(P2):
    """Invariant losses at the cluster (indices 1, 2)."""
    def trace_form(w, V):  # tr(U^H P2 U), U spanning the cluster
        U = V[:, 1:3]
        return torch.einsum("ij,jk,ki->", U.mH, P2, U).real

    return {
        "projector": trace_form,
        "projector_and_cluster_sum": lambda w, V: trace_form(w, V) + w[1:3].sum() ** 2,
        "projector_past_the_cluster": lambda w, V: ((V[:, :3] @ V[:, :3].mH) * P2.conj()).sum().real,
        # the real case: the projector weighted by P2, plus sum(w**2) = |A|^2
        "projector_and_squares": lambda w, V: ((V[:, 1:3] @ V[:, 1:3].mH) * P2.conj()).sum().real + (w ** 2).sum(),
        "squares_and_cluster_cube": lambda w, V: (w ** 2).sum() + w[1:3].sum() ** 3,
        "projector_and_cubes": lambda w, V: trace_form(w, V) + (w ** 3).sum(),
    }


def _loss_fn(op, dtype, gap, name):
    A, Ag, B, P2, E = _problem(dtype, gap)
    loss = _losses(P2)[name]
    if op == "eigh":
        return A, E, lambda X: loss(*agt.eigh(_herm(X)))
    if op == "eigsh":  # the 4 smallest of 5: the cluster kept whole, one pair left out
        return A, E, lambda X: loss(*agt.eigsh(_herm(X), 4, largest=False))
    if op == "eigsh_generalized":
        return Ag, E, lambda X: loss(*agt.eigsh(_herm(X), 4, B, largest=False))
    if op == "eigh_generalized":
        return Ag, E, lambda X: loss(*agt.eigh(_herm(X), B))
    if op == "eigh_generalized_in_B":  # B = L L^H moves the cluster as well
        return B, E, lambda Y: loss(*agt.eigh(Ag, _herm(Y)))
    if op == "eigsh_generalized_in_B":
        return B, E, lambda Y: loss(*agt.eigsh(Ag, 4, _herm(Y), largest=False))
    # the SVD of A (singular values = eigenvalues), of W A (tall) and of A W^H (wide), W with
    # orthonormal columns: the cluster's singular vectors are A's eigenvectors; the loss reads them
    # (and the singular values) in ascending order
    g = torch.Generator().manual_seed(7)
    W = _orth(7, dtype, g)[:, :5]
    flip = lambda S, X: loss(S.flip(-1), X.flip(-1))  # noqa: E731
    if op == "svd":
        return A, E, lambda X: (lambda U, S, Vh: flip(S, U))(*agt.svd(X, full_matrices=False))
    if op == "svd_tall":
        return W @ A, W @ E, lambda X: (lambda U, S, Vh: flip(S, Vh.mH))(*agt.svd(X, full_matrices=False))
    assert op == "svd_wide"
    return A @ W.mH, E @ W.mH, lambda X: (lambda U, S, Vh: flip(S, U))(*agt.svd(X, full_matrices=False))


def _gradient(f, A):
    A = A.clone().requires_grad_()
    return torch.autograd.grad(f(A), A)[0]


def _richardson_hvp(f, A, E, h=1e-4):
    D = lambda s: (_gradient(f, A + s * E) - _gradient(f, A - s * E)) / (2 * s)  # noqa: E731
    return (4 * D(h / 2) - D(h)) / 3


def _autograd_hvp(f, A, E):
    X = A.clone().requires_grad_()
    (g,) = torch.autograd.grad(f(X), X, create_graph=True)
    return torch.autograd.grad((g * E.conj()).real.sum(), X)[0]


def _close(got, want, what):
    err = float((got - want).abs().max() / want.abs().max())
    assert err < 1e-6, f"{what}: relative error {err:.1e}"


# the exact cluster in the default suite; the gaps around it (a degeneracy sweep) in the slow step
@pytest.mark.parametrize("gap", [0.0] + [pytest.param(g, marks=pytest.mark.slow) for g in (1e-12, 1e-8, 1e-4)])
@pytest.mark.parametrize("name", ["projector", "projector_and_cluster_sum", "projector_past_the_cluster",
                                  "projector_and_squares", "projector_and_cubes"])
@pytest.mark.parametrize("dtype", [f64, c128], ids=["real", "complex"])
@pytest.mark.parametrize("op", ["eigh", "eigh_generalized", "eigh_generalized_in_B", "eigsh", "eigsh_generalized",
                                "eigsh_generalized_in_B", "svd", "svd_tall", "svd_wide"])
def test_hessian_vector_products_of_invariant_losses_at_a_cluster(op, dtype, name, gap):
    A, E, f = _loss_fn(op, dtype, gap, name)
    want = _richardson_hvp(f, A, E)
    _close(_autograd_hvp(f, A, E), want, "torch.autograd.grad of the gradient")
    # torch.func: the vjp of the gradient (E real: torch.func.grad of a complex input is its conj)
    if not dtype.is_complex:
        _, vjp = torch.func.vjp(torch.func.grad(f), A)
        _close(vjp(E)[0], want, "torch.func.vjp(torch.func.grad)")


@pytest.mark.parametrize("name", ["projector", "projector_and_cluster_sum", "projector_and_squares"])
@pytest.mark.parametrize("op", ["eigh", "eigh_generalized"])
def test_jacrev_of_jacrev_at_a_cluster(op, name):
    A, E, f = _loss_fn(op, f64, 0.0, name)
    if name == "projector_and_squares":
        # the loss's own Hessian in the cluster's values is read by a Hessian-vector product of its
        # graph, which jacrev's vmap over the first backward hides: a clear error, naming the routes
        with pytest.raises(DegenerateSubspaceError, match="torch.func.vjp"):
            torch.func.jacrev(torch.func.jacrev(f))(A)
        return
    H = torch.func.jacrev(torch.func.jacrev(f))(A)
    _close((H * E).sum((-2, -1)), _richardson_hvp(f, A, E), "jacrev(jacrev)")
    # and vmap over Hessian-vector products (several directions at once)
    Es = torch.stack([E, E.mT, E + E.mT])
    hv = torch.func.vmap(lambda e: torch.func.vjp(torch.func.grad(f), A)[1](e)[0])(Es)
    for e, h in zip(Es, hv):
        _close(h, (H * e).sum((-2, -1)), "vmap of vjp(grad)")


@pytest.mark.parametrize("name", ["projector_and_cluster_sum", "projector_and_squares"])
@pytest.mark.parametrize("dtype", [f64, c128], ids=["real", "complex"])
@pytest.mark.parametrize("op", ["eigh", "eigh_generalized", "eigh_generalized_in_B", "eigsh", "svd", "svd_tall"])
def test_gradgradcheck_at_a_cluster(op, dtype, name):
    # the step: gradgradcheck's numerical Jacobian differentiates the first derivative across a
    # cluster split by the step itself, where the first derivative carries rounding of the cluster's
    # within-block products times 1/step (about 1e-16/1e-6 at the default step: errors of 1e-3 in
    # the reference, not in the value checked); 1e-4 keeps the reference at 1e-8
    A, E, f = _loss_fn(op, dtype, 0.0, name)
    assert torch.autograd.gradgradcheck(f, (A.clone().requires_grad_(),), eps=1e-4, atol=1e-6, rtol=1e-5)


def test_what_is_not_available_raises():
    A, Ag, B, P2, E = _problem(f64, 0.0)
    proj = _losses(P2)["projector"]
    cases = {
        # a matrix function written with the eigenvalues (agt.funm is the exact route)
        "spectral": (A, lambda X: (lambda w, V: ((V * w.exp()) @ V.mT * P2).sum())(*agt.eigh(_herm(X)))),
    }
    for name, (X, f) in cases.items():
        with pytest.raises(DegenerateSubspaceError):
            _autograd_hvp(f, X, E)
    # a loss whose first derivative is equal on the cluster (w_1 = w_2 = 2) but whose second is not
    # that of a symmetric function of the cluster's values: (w_1 - w_2) (w_1 - 2)
    lopsided = (A, lambda X: (lambda w: (w[1] - w[2]) * (w[1] - 2))(agt.eigh(_herm(X))[0]))
    with pytest.raises(DegenerateSubspaceError, match="symmetric function"):
        _autograd_hvp(lopsided[1], lopsided[0], E)
    # a third derivative at a cluster
    f = lambda X: proj(*agt.eigh(_herm(X)))  # noqa: E731
    X = A.clone().requires_grad_()
    (g,) = torch.autograd.grad(f(X), X, create_graph=True)
    (h,) = torch.autograd.grad((g * E).sum(), X, create_graph=True)
    with pytest.raises(DegenerateSubspaceError, match="third derivative"):
        torch.autograd.grad((h * E).sum(), X)
    # forward over reverse along a direction that splits the cluster
    with pytest.raises(DegenerateSubspaceError):
        torch.func.jvp(torch.func.grad(f), (A,), (E + E.mT,))


def test_jacrev_of_jacrev_of_the_squares_is_not_zero_at_a_cluster():
    # jacrev's inner vmap went through the cluster completion, which dropped the derivative
    # (an all-zero Hessian of sum(w**2) = |A|^2 at a cluster); its Hessian is the identity map
    A, E, _ = _loss_fn("eigh", f64, 0.0, "projector")
    E = E + E.mT
    f = lambda X: (agt.eigh(X)[0] ** 2).sum()  # noqa: E731
    H = torch.func.jacrev(torch.func.jacrev(f))(A)
    torch.testing.assert_close((H * E).sum((-2, -1)), 2 * E, rtol=1e-10, atol=1e-10)


def test_autograd_functional_hessian_at_a_cluster():
    A, E, f = _loss_fn("eigh", f64, 0.0, "projector_and_squares")
    H = torch.autograd.functional.hessian(f, A)
    _close((H * E).sum((-2, -1)), _richardson_hvp(f, A, E), "torch.autograd.functional.hessian")


def test_no_change_away_from_clusters():
    A, E, f = _loss_fn("eigh", f64, 0.5, "projector_and_cluster_sum")
    _close(_autograd_hvp(f, A, E), _richardson_hvp(f, A, E), "separated spectrum")


@pytest.mark.parametrize("gap", [0.0, 1e-8])
@pytest.mark.parametrize("kind,dtype", [("svds_tall", f64), ("svds_wide", f64), ("full_tall", f64),
                                        ("full_wide", f64), ("full_tall", c128), ("full_wide", c128)])
def test_partial_and_full_svd_at_a_cluster(kind, dtype, gap):
    # singular values 5, 4, 4 + gap, 2, 1, 0.5 of a 9 x 6 (or 6 x 9) matrix; svds keeps the 4
    # largest (the cluster whole); the loss: the projector onto the cluster's left vectors, the
    # squares of the kept singular values and a cube of the largest
    g = torch.Generator().manual_seed(3)
    m, n = (9, 6) if kind.endswith("tall") else (6, 9)
    U, V = _orth(m, dtype, g)[:, :6], _orth(n, dtype, g)[:, :6]
    A = (U * torch.tensor([5.0, 4.0, 4.0 + gap, 2.0, 1.0, 0.5], dtype=f64).to(dtype)) @ V.mH
    G = _herm(torch.randn(m, m, dtype=dtype, generator=g))
    E = torch.randn(m, n, dtype=dtype, generator=g)

    def loss(U, S, Vh):
        P = U[:, 1:3] @ U[:, 1:3].mH
        return (P * G.conj()).sum().real + (S[:4] ** 2).sum() + S[0] ** 3

    if kind.startswith("svds"):
        f = lambda X: loss(*agt.svds(X, 4))  # noqa: E731
    else:
        f = lambda X: loss(*agt.svd(X, full_matrices=True))  # noqa: E731
    _close(_autograd_hvp(f, A, E), _richardson_hvp(f, A, E), kind)


@pytest.mark.parametrize("op", ["eigh", "svd"])
def test_float32_and_batched_at_a_cluster(op):
    # a batch of two matrices with the cluster (2, 2), in float32 against float64: the block's
    # entrywise derivatives are recognised at float32's rounding too
    g = torch.Generator().manual_seed(11)
    Q = torch.linalg.qr(torch.randn(2, 5, 5, dtype=f64, generator=g))[0]
    A = (Q * torch.tensor([1.0, 2.0, 2.0, 3.0, 4.0], dtype=f64)) @ Q.mT
    G = _herm(torch.randn(5, 5, dtype=f64, generator=g))
    E = _herm(torch.randn(2, 5, 5, dtype=f64, generator=g))
    if op == "eigh":  # ascending: the cluster is 1:3
        f = lambda X: (lambda w, V: ((V[..., 1:3] @ V[..., 1:3].mT) * G.to(X.dtype)).sum() + (w ** 2).sum())(  # noqa: E731
            *agt.eigh(X))
    else:  # descending: the cluster is 2:4
        f = lambda X: (lambda U, S, Vh: ((U[..., 2:4] @ U[..., 2:4].mT) * G.to(X.dtype)).sum() + (S ** 3).sum())(  # noqa: E731
            *agt.svd(X))
    want = _autograd_hvp(f, A, E)
    _close(want, _richardson_hvp(f, A, E), "float64")
    got = _autograd_hvp(f, A.float(), E.float()).double()
    err = float((got - want).abs().max() / want.abs().max())
    assert err < 1e-4, f"float32: relative error {err:.1e}"


@pytest.mark.parametrize("dtype", [f64, c128], ids=["real", "complex"])
@pytest.mark.parametrize("solver", ["eigh", "eigh(A, B)", "eigsh", "eigsh(A, B)"])
def test_no_false_gauge_errors_in_second_derivatives_of_an_invariant_loss(dtype, solver):
    # xitorch's degenerate tests: tr(U^H P2 U) over a degenerate pair is phase and rotation invariant
    # and its gradgradcheck raised (a phase error on a vector the loss does not use, a basis error on
    # a cluster it does not use): second-order cotangents that are zero in exact arithmetic are
    # rounding, with residuals of their own size
    g = torch.Generator().manual_seed(40)
    n = 5
    mat = torch.randn(n, n, dtype=dtype, generator=g).requires_grad_()
    P2 = torch.randn(n, n, dtype=dtype, generator=g).requires_grad_()
    B = None
    if "B" in solver:
        Q = torch.linalg.qr(torch.rand(n, n, dtype=dtype, generator=g))[0]
        B = Q.mH @ torch.diag(torch.linspace(1.0, 2.0, n, dtype=f64).to(dtype)) @ Q
    a = torch.tensor([1.0, 2.0, 3.0], dtype=f64, requires_grad=True)

    def loss(a, mat, P2):
        P, _ = torch.linalg.qr(mat)
        A = P.mH @ torch.diag_embed(torch.cat((a[:2], a[1:2], a[2:], a[2:])).to(dtype)) @ P
        if solver.startswith("eigsh"):
            _, V = agt.eigsh(A, 3, B, largest=False)
        else:
            _, V = agt.eigh(A, B)
        U = V[:, 1:3]  # the degenerate pair
        return torch.einsum("rc,rc->", P2 @ U, U.conj())

    assert torch.autograd.gradcheck(loss, (a, mat, P2))
    assert torch.autograd.gradgradcheck(loss, (a, mat, P2))

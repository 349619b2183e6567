"""Cholesky, QR, inverse, solve and slogdet: drop-ins for their torch.linalg namesakes, with the rules
the engine derived (derivations/cholesky.py, qr.py, inv.py, solve.py through the triangular
projections; slogdet.py through Jacobi's formula and the trace's adjoint)."""
import pytest
import torch

import adjointgen
import adjointgen.torch as agt

D = torch.float64


def gen(seed):
    return torch.Generator().manual_seed(seed)


def spd(*batch_n, seed=0, dtype=D):
    """``spd(*batch, n)``: SPD matrices ``(*batch, n, n)``."""
    n = batch_n[-1]
    X = torch.randn(*batch_n, n, dtype=D, generator=gen(seed))
    return (X @ X.mT / n + torch.eye(n, dtype=D)).to(dtype)


def general(*batch_n, seed=0, dtype=D):
    """``general(*batch, n)``: well-conditioned square matrices ``(*batch, n, n)``."""
    n = batch_n[-1]
    return (torch.randn(*batch_n, n, dtype=D, generator=gen(seed)) + 2 * n ** 0.5 * torch.eye(n, dtype=D)).to(dtype)


def sym(X):
    return 0.5 * (X + X.mT)


def rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def grads(f, inputs, cotangents):
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    out = f(*inputs)
    out = out if isinstance(out, tuple) else (out,)
    return torch.autograd.grad(out, inputs, cotangents)


# ------------------------------------------------------------------------------ agreement with torch
CASES = [
    ("cholesky", agt.cholesky, torch.linalg.cholesky, lambda: (spd(5, seed=1),)),
    ("cholesky batched", agt.cholesky, torch.linalg.cholesky, lambda: (spd(3, 4, seed=2),)),
    ("cholesky upper", lambda A: agt.cholesky(A, upper=True), lambda A: torch.linalg.cholesky(A, upper=True),
     lambda: (spd(4, seed=3),)),
    ("qr tall", agt.qr, torch.linalg.qr, lambda: (torch.randn(7, 3, dtype=D, generator=gen(4)),)),
    ("qr square batched", agt.qr, torch.linalg.qr, lambda: (torch.randn(2, 4, 4, dtype=D, generator=gen(5)),)),
    ("qr wide", agt.qr, torch.linalg.qr, lambda: (torch.randn(3, 6, dtype=D, generator=gen(6)),)),
    ("qr r", lambda A: agt.qr(A, "r")[1], lambda A: torch.linalg.qr(A)[1], lambda: (torch.randn(6, 4, dtype=D, generator=gen(7)),)),
    ("inv", agt.inv, torch.linalg.inv, lambda: (general(5, seed=8),)),
    ("inv batched", agt.inv, torch.linalg.inv, lambda: (general(2, 3, 4, seed=9),)),
    ("solve", agt.solve, torch.linalg.solve, lambda: (general(5, seed=10), torch.randn(5, 3, dtype=D, generator=gen(11)))),
    ("solve vector", agt.solve, torch.linalg.solve, lambda: (general(4, seed=12), torch.randn(4, dtype=D, generator=gen(13)))),
    ("solve broadcast", agt.solve, torch.linalg.solve,
     lambda: (general(2, 1, 4, seed=14), torch.randn(3, 4, 2, dtype=D, generator=gen(15)))),
    ("solve left=False", lambda A, B: agt.solve(A, B, left=False), lambda A, B: torch.linalg.solve(A, B, left=False),
     lambda: (general(4, seed=16), torch.randn(3, 4, dtype=D, generator=gen(17)))),
    ("slogdet", lambda A: agt.slogdet(A).logabsdet, lambda A: torch.linalg.slogdet(A).logabsdet,
     lambda: (torch.randn(5, 5, dtype=D, generator=gen(18)),)),
    ("slogdet batched", lambda A: agt.slogdet(A)[1], lambda A: torch.linalg.slogdet(A)[1],
     lambda: (torch.randn(2, 3, 4, 4, dtype=D, generator=gen(19)),)),
]


@pytest.mark.parametrize("name, ours, theirs, make", CASES, ids=[c[0] for c in CASES])
def test_values_and_gradients_match_torch(name, ours, theirs, make):
    inputs = make()
    if name.startswith("cholesky"):
        f_ours, f_theirs = (lambda A: ours(sym(A))), (lambda A: theirs(sym(A)))  # symmetric directions
    else:
        f_ours, f_theirs = ours, theirs
    a, b = f_ours(*inputs), f_theirs(*inputs)
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    assert all(x.shape == y.shape and rel(x, y) < 1e-12 for x, y in zip(a, b))
    cot = tuple(torch.randn(y.shape, dtype=D, generator=gen(99)) for y in b)
    for g1, g2 in zip(grads(f_ours, inputs, cot), grads(f_theirs, inputs, cot)):
        assert rel(g1, g2) < 1e-10
    # forward mode against torch's own
    tangents = tuple(torch.randn(x.shape, dtype=D, generator=gen(98)) for x in inputs)
    _, t1 = torch.func.jvp(f_ours, inputs, tangents)
    _, t2 = torch.func.jvp(f_theirs, inputs, tangents)
    t1, t2 = (t1 if isinstance(t1, tuple) else (t1,)), (t2 if isinstance(t2, tuple) else (t2,))
    assert all(rel(x, y) < 1e-10 for x, y in zip(t1, t2))


@pytest.mark.parametrize("name, f, make", [
    ("cholesky", lambda A: agt.cholesky(sym(A)), lambda: (spd(4, seed=20),)),
    ("qr tall", agt.qr, lambda: (torch.randn(5, 3, dtype=D, generator=gen(21)),)),
    ("qr wide", agt.qr, lambda: (torch.randn(2, 4, dtype=D, generator=gen(22)),)),
    ("inv", agt.inv, lambda: (general(3, seed=23),)),
    ("solve", agt.solve, lambda: (general(3, seed=24), torch.randn(3, 2, dtype=D, generator=gen(25)))),
    ("slogdet", lambda A: agt.slogdet(A).logabsdet, lambda: (torch.randn(2, 4, 4, dtype=D, generator=gen(26)),)),
])
def test_gradcheck_and_gradgradcheck(name, f, make):
    inputs = tuple(x.requires_grad_() for x in make())
    assert torch.autograd.gradcheck(f, inputs)
    assert torch.autograd.gradgradcheck(f, inputs)


def test_vmap_and_jacrev_agree_with_a_loop():
    A = spd(3, 4, seed=30)
    loss = lambda a: (agt.cholesky(sym(a)) ** 2).sum() + agt.inv(a).trace() + agt.qr(a)[1].diagonal().abs().sum()
    batched = torch.func.vmap(torch.func.grad(loss))(A)
    looped = torch.stack([torch.func.grad(loss)(a) for a in A])
    assert rel(batched, looped) < 1e-12
    J = torch.func.jacrev(agt.inv)(A[0])
    J_torch = torch.func.jacrev(torch.linalg.inv)(A[0])
    assert rel(J, J_torch) < 1e-10


def test_solve_backward_reuses_the_forward_factorization_and_stays_exact_twice():
    A, B = general(4, seed=40), torch.randn(4, 3, dtype=D, generator=gen(41))
    from adjointgen.generated.torch.solve import SolveFunction

    X, LU, pivots = SolveFunction.apply(A, B)
    LU_ref, piv_ref = torch.linalg.lu_factor(A)
    assert torch.equal(LU, LU_ref) and torch.equal(pivots, piv_ref)
    # second derivatives through the backward are exact (the solve is then done with A itself)
    Ar, Br = A.clone().requires_grad_(), B.clone().requires_grad_()
    g, = torch.autograd.grad((agt.solve(Ar, Br) ** 3).sum(), Ar, create_graph=True)
    h, = torch.autograd.grad(g.sum(), Ar)
    At = A.clone().requires_grad_()
    g2, = torch.autograd.grad((torch.linalg.solve(At, B) ** 3).sum(), At, create_graph=True)
    h2, = torch.autograd.grad(g2.sum(), At)
    assert rel(h, h2) < 1e-10


def test_float32():
    A = spd(6, seed=50, dtype=torch.float32)
    assert rel(agt.cholesky(A), torch.linalg.cholesky(A)) < 1e-6
    g1, = grads(lambda a: agt.cholesky(sym(a)), (A,), (torch.ones(6, 6),))
    g2, = grads(lambda a: torch.linalg.cholesky(sym(a)), (A,), (torch.ones(6, 6),))
    assert rel(g1, g2) < 1e-4


@pytest.mark.parametrize("f, shape", [
    (agt.cholesky, (0, 3, 3)), (agt.cholesky, (2, 0, 0)), (agt.inv, (0, 3, 3)), (agt.qr, (0, 4, 3)),
    (lambda A: agt.solve(A, A), (0, 3, 3)),
])
def test_empty_inputs_return_torch_shapes(f, shape):
    A = torch.zeros(shape, dtype=D, requires_grad=True)
    out = f(A)
    out = out if isinstance(out, tuple) else (out,)
    names = {agt.cholesky: torch.linalg.cholesky, agt.inv: torch.linalg.inv, agt.qr: torch.linalg.qr}
    ref = names.get(f, lambda A: torch.linalg.solve(A, A))(A.detach())
    ref = ref if isinstance(ref, tuple) else (ref,)
    assert [o.shape for o in out] == [r.shape for r in ref]
    sum(o.sum() for o in out).backward()
    assert A.grad.shape == A.shape


def test_errors_are_value_errors_and_linalg_errors():
    bad = torch.diag(torch.tensor([1.0, -1.0, 2.0], dtype=D))
    with pytest.raises(adjointgen.NotPositiveDefiniteError, match="leading minor of order 2"):
        agt.cholesky(bad)
    with pytest.raises(torch.linalg.LinAlgError):
        agt.cholesky(bad)
    singular = torch.zeros(3, 3, dtype=D)
    with pytest.raises(adjointgen.SingularMatrixError):
        agt.inv(singular)
    with pytest.raises(ValueError, match="singular"):
        agt.solve(singular, torch.ones(3, 1, dtype=D))
    with pytest.raises(ValueError, match="not symmetric"):
        agt.cholesky(torch.tensor([[2.0, 1.0], [0.0, 2.0]], dtype=D))
    with pytest.raises(ValueError, match="square"):
        agt.inv(torch.zeros(2, 3, dtype=D))
    with pytest.raises(ValueError, match="Incompatible shapes of A and B"):  # torch's message, also a RuntimeError
        agt.solve(torch.eye(3, dtype=D), torch.ones(4, 2, dtype=D))
    with pytest.raises(ValueError, match="NaN"):
        agt.qr(torch.full((3, 2), float("nan"), dtype=D))
    with pytest.raises(ValueError, match="mode"):
        agt.qr(torch.eye(2, dtype=D), mode="economic")


def test_complete_qr_refuses_a_loss_on_the_arbitrary_columns():
    A = torch.randn(5, 3, dtype=D, generator=gen(60), requires_grad=True)
    Q, R = agt.qr(A, mode="complete")
    assert Q.shape == (5, 5) and R.shape == (5, 3)
    (Q[:, :3].sum() + R.sum()).backward()  # the defined part has its gradient
    Q, R = agt.qr(A, mode="complete")
    with pytest.raises(RuntimeError, match="extra columns of Q"):
        Q[:, 4].sum().backward()


def test_slogdet_is_a_drop_in_with_a_constant_sign():
    A = torch.randn(3, 5, 5, dtype=D, generator=gen(70))
    A[0] = A[0][[1, 0, 2, 3, 4]]  # one row swap: the sign flips
    ours, theirs = agt.slogdet(A), torch.linalg.slogdet(A)
    assert type(ours) is type(theirs)
    assert torch.equal(ours.sign, theirs.sign) and rel(ours.logabsdet, theirs.logabsdet) < 1e-14
    Ar = A.clone().requires_grad_()
    sign, logabsdet = agt.slogdet(Ar)
    assert logabsdet.requires_grad
    (g,) = torch.autograd.grad(logabsdet.sum(), Ar)
    assert rel(g, torch.linalg.inv(A).mT) < 1e-12  # d log|det A| / dA = A^-T
    # forward mode: the sign has no tangent, logabsdet has tr(A^-1 dA)
    dA = torch.randn(A.shape, dtype=D, generator=gen(71))
    _, (dsign, dlog) = torch.func.jvp(lambda a: tuple(agt.slogdet(a)), (A,), (dA,))
    assert torch.equal(dsign, torch.zeros_like(dsign))
    assert rel(dlog, torch.linalg.solve(A, dA).diagonal(dim1=-2, dim2=-1).sum(-1)) < 1e-12
    # every transform, second derivatives against torch's own
    f, f_ref = (lambda a: agt.slogdet(a)[1]), (lambda a: torch.linalg.slogdet(a)[1])
    assert rel(torch.func.vmap(f)(A), f_ref(A)) < 1e-14
    assert rel(torch.func.jacfwd(f)(A[1]), torch.func.jacrev(f_ref)(A[1])) < 1e-12
    assert rel(torch.func.hessian(f)(A[1]), torch.func.hessian(f_ref)(A[1])) < 1e-10


def test_slogdet_float32_singular_empty_and_errors():
    A = torch.randn(6, 6, generator=gen(72))
    assert rel(agt.slogdet(A)[1], torch.linalg.slogdet(A)[1]) < 1e-5
    g1, = grads(lambda a: agt.slogdet(a)[1], (A,), (torch.ones(()),))
    g2, = grads(lambda a: torch.linalg.slogdet(a)[1], (A,), (torch.ones(()),))
    assert rel(g1, g2) < 1e-4
    singular = torch.zeros(2, 3, 3, dtype=D)
    assert [tuple(x.tolist()) for x in agt.slogdet(singular)] == [tuple(x.tolist()) for x in torch.linalg.slogdet(singular)]
    E = torch.zeros(0, 3, 3, dtype=D, requires_grad=True)
    sign, logabsdet = agt.slogdet(E)
    assert sign.shape == logabsdet.shape == (0,)
    logabsdet.sum().backward()
    assert E.grad.shape == E.shape
    assert agt.slogdet(torch.zeros(2, 0, 0, dtype=D))[1].tolist() == [0.0, 0.0]  # det of 0×0 is 1
    with pytest.raises(ValueError, match="square"):
        agt.slogdet(torch.zeros(2, 3, dtype=D))
    with pytest.raises(ValueError, match="NaN"):
        agt.slogdet(torch.full((2, 2), float("nan"), dtype=D))
    with pytest.raises(ValueError, match="float32/float64"):
        agt.slogdet(torch.eye(2, dtype=torch.int64))


def test_complex_slogdet_matches_torch_in_value_gradient_and_forward_mode():
    g = gen(73)
    A = torch.randn(2, 4, 4, dtype=torch.complex128, generator=g) + 2 * torch.eye(4, dtype=torch.complex128)
    ours, theirs = agt.slogdet(A), torch.linalg.slogdet(A)
    assert rel(ours.sign, theirs.sign) < 1e-14 and rel(ours.logabsdet, theirs.logabsdet) < 1e-14
    assert ours.logabsdet.dtype == torch.float64
    # a loss on both outputs: the phase enters through sign
    c = torch.randn(2, dtype=torch.complex128, generator=g)
    loss = lambda f: lambda a: (f(a)[0] * c).real.sum() + (f(a)[1] ** 2).sum()
    g1 = torch.func.grad(loss(agt.slogdet))(A)
    g2 = torch.func.grad(loss(torch.linalg.slogdet))(A)
    assert rel(g1, g2) < 1e-12
    dA = torch.randn(A.shape, dtype=torch.complex128, generator=g)
    _, t1 = torch.func.jvp(lambda a: tuple(agt.slogdet(a)), (A,), (dA,))
    _, t2 = torch.func.jvp(lambda a: tuple(torch.linalg.slogdet(a)), (A,), (dA,))
    assert all(rel(x, y) < 1e-12 for x, y in zip(t1, t2))
    Ar = A[0].clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda a: tuple(agt.slogdet(a)), (Ar,))
    assert torch.autograd.gradgradcheck(lambda a: tuple(agt.slogdet(a)), (Ar,))
    # a real matrix: the sign has zero derivative, as torch's
    R = torch.randn(4, 4, dtype=D, generator=g).requires_grad_()
    sign, logabsdet = agt.slogdet(R)
    (gs,) = torch.autograd.grad(sign, R)
    assert torch.equal(gs, torch.zeros_like(gs))


@pytest.mark.parametrize("name", ["inv", "solve", "solve vector", "solve left=False"])
def test_complex_inverse_and_solve_match_torch(name):
    g = gen(80)
    A = torch.randn(2, 4, 4, dtype=torch.complex128, generator=g) + 3 * torch.eye(4, dtype=torch.complex128)
    B = torch.randn(2, 4, 3, dtype=torch.complex128, generator=g)
    ours, theirs = {
        "inv": (agt.inv, torch.linalg.inv),
        "solve": (lambda a: agt.solve(a, B), lambda a: torch.linalg.solve(a, B)),
        "solve vector": (lambda a: agt.solve(a, B[..., 0]), lambda a: torch.linalg.solve(a, B[..., 0])),
        "solve left=False": (lambda a: agt.solve(a, B.mT, left=False), lambda a: torch.linalg.solve(a, B.mT, left=False)),
    }[name]
    assert rel(ours(A), theirs(A)) < 1e-13
    C = torch.randn(theirs(A).shape, dtype=torch.complex128, generator=g)
    g1 = torch.func.grad(lambda a: (ours(a) * C).real.sum())(A)
    g2 = torch.func.grad(lambda a: (theirs(a) * C).real.sum())(A)
    assert rel(g1, g2) < 1e-12
    dA = torch.randn(A.shape, dtype=A.dtype, generator=g)
    assert rel(torch.func.jvp(ours, (A,), (dA,))[1], torch.func.jvp(theirs, (A,), (dA,))[1]) < 1e-12
    Ar = A[0].clone().requires_grad_()
    f = (lambda a: ours(a.expand(2, 4, 4))[0]) if name != "inv" else agt.inv
    assert torch.autograd.gradcheck(f, (Ar,)) and torch.autograd.gradgradcheck(f, (Ar,))


def test_complex_cholesky_matches_torch():
    """The complex derivation needs the real diagonal of the factor (a convention, declared with
    ``real_diagonal=True``): the engine then shows that ``dC = L^-1 dL`` has a real diagonal too."""
    g = gen(81)
    X = torch.randn(2, 4, 4, dtype=torch.complex128, generator=g)
    A = X @ X.mH + torch.eye(4, dtype=torch.complex128)
    herm = lambda a: 0.5 * (a + a.mH)
    assert rel(agt.cholesky(A), torch.linalg.cholesky(A)) < 1e-14
    assert rel(agt.cholesky(A, upper=True), torch.linalg.cholesky(A, upper=True)) < 1e-14
    C = torch.randn(2, 4, 4, dtype=torch.complex128, generator=g)
    g1 = torch.func.grad(lambda a: (agt.cholesky(herm(a)) * C).real.sum())(A)
    g2 = torch.func.grad(lambda a: (torch.linalg.cholesky(herm(a)) * C).real.sum())(A)
    assert rel(g1, g2) < 1e-12
    dA = herm(torch.randn(A.shape, dtype=A.dtype, generator=g))
    assert rel(torch.func.jvp(agt.cholesky, (A,), (dA,))[1], torch.func.jvp(torch.linalg.cholesky, (A,), (dA,))[1]) < 1e-12
    Ar = A[0].clone().requires_grad_()
    f = lambda a: agt.cholesky(herm(a))
    assert torch.autograd.gradcheck(f, (Ar,)) and torch.autograd.gradgradcheck(f, (Ar,))
    with pytest.raises(adjointgen.NotPositiveDefiniteError):
        agt.cholesky(torch.diag(torch.tensor([1, -1, 2], dtype=torch.complex128)))
    with pytest.raises(ValueError, match="Hermitian"):
        agt.cholesky(torch.tensor([[2, 1j], [1j, 2]], dtype=torch.complex128))


@pytest.mark.parametrize("shape", [(2, 6, 3), (4, 4), (3, 5)])
def test_complex_qr_matches_torch(shape):
    """The complex derivation takes the diagonal of ``Q^H dA R^-1`` apart: the anti-Hermitian
    ``Q^H dQ`` has an imaginary diagonal, ``dR R^-1`` a real one (LAPACK's R has a real diagonal)."""
    g = gen(82)
    A = torch.randn(*shape, dtype=torch.complex128, generator=g)
    (Q1, R1), (Q2, R2) = agt.qr(A), torch.linalg.qr(A)
    assert rel(Q1, Q2) < 1e-13 and rel(R1, R2) < 1e-13
    CQ = torch.randn(Q2.shape, dtype=A.dtype, generator=g)
    CR = torch.randn(R2.shape, dtype=A.dtype, generator=g)
    loss = lambda f: lambda a: (lambda q, r: (q * CQ).real.sum() + (r * CR).real.sum())(*f(a))
    assert rel(torch.func.grad(loss(agt.qr))(A), torch.func.grad(loss(torch.linalg.qr))(A)) < 1e-12
    dA = torch.randn(A.shape, dtype=A.dtype, generator=g)
    t1, t2 = torch.func.jvp(agt.qr, (A,), (dA,))[1], torch.func.jvp(torch.linalg.qr, (A,), (dA,))[1]
    assert rel(t1[0], t2[0]) < 1e-12 and rel(t1[1], t2[1]) < 1e-12
    Ar = A.reshape(-1, *shape[-2:])[0].clone().requires_grad_()
    assert torch.autograd.gradcheck(agt.qr, (Ar,)) and torch.autograd.gradgradcheck(agt.qr, (Ar,))


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 4)])
def test_qr_of_a_numerically_rank_deficient_matrix_raises_in_a_derivative(shape):
    # R has rounding on its diagonal after the rank: the rules divide by it (a gradient of 2.7e15 for a
    # rank-1 5x3 matrix, NaN at the zero matrix); the value itself is torch's
    g = torch.Generator().manual_seed(13)
    m, n = shape
    for A in (torch.randn(m, 1, dtype=torch.float64, generator=g) @ torch.randn(1, n, dtype=torch.float64, generator=g),
              torch.zeros(m, n, dtype=torch.float64)):
        A = A.requires_grad_()
        Q, R = agt.qr(A)
        torch.testing.assert_close(R.detach().abs(), torch.linalg.qr(A.detach())[1].abs())
        with pytest.raises(adjointgen.SingularMatrixError, match="rounding.*condition estimate"):
            torch.autograd.grad((Q.sum() + R.sum()), A)
        with pytest.raises(adjointgen.SingularMatrixError):
            torch.func.jvp(lambda a: agt.qr(a)[1], (A.detach(),), (torch.ones_like(A),))
    # a graded but well-conditioned QR (columns of very different norms) is fine
    D = torch.diag(torch.tensor([1e-20, 1.0, 1e20], dtype=torch.float64))
    B = (torch.linalg.qr(torch.randn(3, 3, dtype=torch.float64, generator=g))[0] @ D).requires_grad_()
    gB, = torch.autograd.grad(agt.qr(B)[1].diagonal().abs().sum(), B)
    want, = torch.autograd.grad(torch.linalg.qr(B)[1].diagonal().abs().sum(), B)
    torch.testing.assert_close(gB, want)


def test_cholesky_of_a_numerically_singular_matrix_raises_in_a_derivative():
    v = torch.randn(4, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    A = (v @ v.mT + 5e-16 * torch.eye(4, dtype=torch.float64)).requires_grad_()  # rank 2 plus rounding
    L = agt.cholesky(A)
    with pytest.raises(adjointgen.SingularMatrixError, match="rounding"):
        torch.autograd.grad(L.sum(), A)

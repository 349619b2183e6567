"""Drop-in semantics: for every input torch.linalg accepts, the same shapes (and values); for every
input it rejects, an error (a RuntimeError, as torch's: adjointgen's shape errors are also
ValueErrors).  Over a grid of batch shapes with size-0 and size-1 dimensions, vectors and
``left=False`` for solve, on meta tensors and under torch.compile; forward mode of a complete QR;
the public eigensolver certificates."""
import itertools
import warnings

import pytest
import sympy as sp
import torch

import adjointgen.torch as agt
from adjointgen.runtime.checks import ShapeError
from adjointgen.runtime.eigsolvers import PartialEighInfo

D = torch.float64
BATCHES = [(), (0,), (1,), (2,), (1, 2), (2, 1), (0, 1), (3, 2)]


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def spd(shape, seed=0, dtype=D):
    n = shape[-1]
    X = torch.randn(*shape[:-1], n + 2, dtype=D, generator=gen(seed))
    return (X @ X.mT / (n + 2) + torch.eye(n, dtype=D)).to(dtype)


def outcome(f, *args):
    """``(list of output tensors, None)`` or ``(None, the exception)``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = f(*args)
    except Exception as exc:  # noqa: BLE001 - compared with torch's below
        return None, exc
    out = out if isinstance(out, tuple) else (out,)
    return [o for o in out if isinstance(o, torch.Tensor)], None


def compare(ours, theirs, *args, values=None):
    """'' when ``ours`` does what ``theirs`` does on ``args``, else what differs.  ``values``:
    indices of outputs whose values must agree (LAPACK's conventions are the same)."""
    mine, my_error = outcome(ours, *args)
    ref, error = outcome(theirs, *args)
    shapes = [tuple(a.shape) for a in args]
    if error is not None:
        if my_error is None:
            return f"{shapes}: torch raises {error!r}, ours returns {[tuple(o.shape) for o in mine]}"
        if not isinstance(my_error, RuntimeError):
            return f"{shapes}: torch raises a RuntimeError, ours {my_error!r}"
        return ""
    if my_error is not None:
        return f"{shapes}: torch returns {[tuple(o.shape) for o in ref]}, ours raises {my_error!r}"
    if [o.shape for o in mine] != [o.shape for o in ref]:
        return f"{shapes}: shapes {[tuple(o.shape) for o in mine]} != torch's {[tuple(o.shape) for o in ref]}"
    for i in values or ():
        if not torch.allclose(mine[i], ref[i], rtol=1e-9, atol=1e-9):
            return f"{shapes}: output {i} differs from torch's by {float((mine[i] - ref[i]).abs().max()):.2e}"
    return ""


SQUARE = [
    ("inv", agt.inv, torch.linalg.inv, (0,)),
    ("cholesky", agt.cholesky, torch.linalg.cholesky, (0,)),
    ("cholesky upper", lambda A: agt.cholesky(A, upper=True), lambda A: torch.linalg.cholesky(A, upper=True), (0,)),
    ("eigh", agt.eigh, torch.linalg.eigh, (0,)),
    ("slogdet", agt.slogdet, torch.linalg.slogdet, (0, 1)),
    ("expm", agt.expm, torch.linalg.matrix_exp, (0,)),
    ("funm exp", lambda A: agt.funm(A, "exp"), torch.linalg.matrix_exp, (0,)),
]
RECTANGULAR = [
    ("svd", agt.svd, torch.linalg.svd, (1,)),
    ("svd full", lambda A: agt.svd(A, full_matrices=True), lambda A: torch.linalg.svd(A, full_matrices=True), (1,)),
    ("svdvals", lambda A: agt.svd(A)[1], torch.linalg.svdvals, (0,)),
    ("qr", agt.qr, torch.linalg.qr, (0, 1)),
    ("qr complete", lambda A: agt.qr(A, "complete"), lambda A: torch.linalg.qr(A, "complete"), (1,)),
    ("qr r", lambda A: agt.qr(A, "r"), lambda A: torch.linalg.qr(A, "r"), (1,)),
    ("pinv", agt.pinv, torch.linalg.pinv, (0,)),
]


@pytest.mark.parametrize("name, ours, theirs, values", SQUARE, ids=[c[0] for c in SQUARE])
def test_square_functions_over_batch_shapes_like_torch(name, ours, theirs, values):
    problems = []
    for batch, n in itertools.product(BATCHES, (0, 1, 3)):
        problems.append(compare(ours, theirs, spd(batch + (n, n)), values=values))
    for shape in [(3,), (), (2, 3, 2), (0, 3, 2), (3, 2)]:  # not batches of square matrices
        problems.append(compare(ours, theirs, torch.randn(shape, dtype=D)))
    problems.append(compare(ours, theirs, torch.ones(3, 3, dtype=torch.int64)))  # not floating
    problems = [p for p in problems if p]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name, ours, theirs, values", RECTANGULAR, ids=[c[0] for c in RECTANGULAR])
def test_rectangular_functions_over_batch_shapes_like_torch(name, ours, theirs, values):
    problems = []
    for batch, (m, n) in itertools.product(BATCHES, [(3, 2), (2, 3), (3, 3), (0, 3), (3, 0), (0, 0), (1, 1)]):
        A = torch.randn(*batch, m, n, dtype=D, generator=gen(m + 7 * n))
        problems.append(compare(ours, theirs, A, values=values))
    for shape in [(3,), ()]:
        problems.append(compare(ours, theirs, torch.randn(shape, dtype=D)))
    problems = [p for p in problems if p]
    assert not problems, "\n".join(problems)


SOLVE_BATCHES = [(), (0,), (1,), (2,), (4,), (1, 2), (2, 1)]


@pytest.mark.parametrize("left", [True, False])
def test_solve_broadcasts_exactly_as_torch(left):
    """Every combination of A's and B's batch shapes, B a vector, a matrix (both orientations) or
    square: the same result as torch.linalg.solve, or an error where torch raises one (this covers
    A (1,3,3) with B (3,3), which once returned a (3,3) non-solution)."""
    problems = []
    for a_batch, b_batch, n in itertools.product(SOLVE_BATCHES, SOLVE_BATCHES, (3, 0)):
        A = torch.randn(*a_batch, n, n, dtype=D, generator=gen(1)) + 3 * torch.eye(n, dtype=D)
        for tail in [(n,), (n, 2), (2, n), (n, n)]:
            B = torch.randn(*b_batch, *tail, dtype=D, generator=gen(2))
            problems.append(compare(lambda a, b: agt.solve(a, b, left=left),
                                    lambda a, b: torch.linalg.solve(a, b, left=left), A, B, values=(0,)))
    problems = [p for p in problems if p]
    assert not problems, "\n".join(problems[:20])


def test_solve_reported_shapes_and_their_gradients():
    A1 = spd((1, 3, 3), seed=3).requires_grad_()
    B = torch.randn(3, 3, dtype=D, generator=gen(4), requires_grad=True)
    X = agt.solve(A1, B)
    assert X.shape == (1, 3, 3) and float((A1 @ X - B).abs().max()) < 1e-13
    for A in (spd((2, 3, 3), seed=5), spd((4, 3, 3), seed=6)):
        assert agt.solve(A, B).shape == torch.linalg.solve(A, B).shape
    Bv = torch.randn(4, 3, dtype=D, generator=gen(7))
    assert torch.allclose(agt.solve(spd((2, 3, 3)), Bv[:3, :], left=False),
                          torch.linalg.solve(spd((2, 3, 3)), Bv[:3, :], left=False))
    for A, Bbad in [(spd((2, 3, 3)), torch.ones(1, 3, dtype=D)), (spd((1, 3, 3)), torch.ones(2, 3, dtype=D))]:
        with pytest.raises(RuntimeError):
            torch.linalg.solve(A, Bbad)
        with pytest.raises(ShapeError):
            agt.solve(A, Bbad)
    # gradients through the broadcast match torch's
    A1t, Bt = A1.detach().clone().requires_grad_(), B.detach().clone().requires_grad_()
    g = torch.randn(1, 3, 3, dtype=D, generator=gen(8))
    ours = torch.autograd.grad(agt.solve(A1, B), (A1, B), g)
    theirs = torch.autograd.grad(torch.linalg.solve(A1t, Bt), (A1t, Bt), g)
    assert all(torch.allclose(a, b, rtol=1e-10, atol=1e-12) for a, b in zip(ours, theirs))


def test_generalized_eigh_broadcasts_its_batches():
    A, B = spd((2, 1, 3, 3), seed=9), spd((4, 3, 3), seed=10)
    w, V = agt.eigh(A, B)
    assert w.shape == (2, 4, 3) and V.shape == (2, 4, 3, 3)
    assert float((A @ V - B @ V * w[..., None, :]).abs().max()) < 1e-12
    with pytest.raises(RuntimeError):
        agt.eigh(spd((2, 3, 3)), spd((3, 3, 3)))


# -------------------------------------------------------------------- meta and torch.compile
x = sp.Symbol("x")


def _m(*shape):
    return torch.empty(*shape, dtype=D, device="meta")


PUBLIC = {
    "inv": (agt.inv, lambda: (spd((2, 3, 3)),)),
    "solve": (agt.solve, lambda: (spd((2, 3, 3)), torch.randn(3, 2, dtype=D, generator=gen(1)))),
    "solve vector": (agt.solve, lambda: (spd((2, 3, 3)), torch.randn(3, dtype=D, generator=gen(1)))),
    "cholesky": (agt.cholesky, lambda: (spd((2, 3, 3)),)),
    "qr": (agt.qr, lambda: (torch.randn(2, 5, 3, dtype=D, generator=gen(2)),)),
    "qr wide": (agt.qr, lambda: (torch.randn(2, 3, 5, dtype=D, generator=gen(3)),)),
    "slogdet": (agt.slogdet, lambda: (spd((2, 3, 3)),)),
    "eigh": (agt.eigh, lambda: (spd((2, 3, 3)),)),
    "eigh B": (agt.eigh, lambda: (spd((2, 3, 3), seed=4), spd((3, 3), seed=5))),
    "svd": (agt.svd, lambda: (torch.randn(2, 5, 3, dtype=D, generator=gen(6)),)),
    "svd full": (lambda A: agt.svd(A, full_matrices=True), lambda: (torch.randn(2, 3, 5, dtype=D, generator=gen(7)),)),
    "pinv": (agt.pinv, lambda: (torch.randn(2, 5, 3, dtype=D, generator=gen(8)),)),
    "pinv hermitian": (lambda A: agt.pinv(A, hermitian=True), lambda: (spd((2, 3, 3)),)),
    "expm": (agt.expm, lambda: (spd((2, 3, 3)),)),
    "logm": (agt.logm, lambda: (spd((2, 3, 3)),)),
    "sqrtm": (agt.sqrtm, lambda: (spd((2, 3, 3)),)),
    "powm": (lambda A: agt.powm(A, 0.5), lambda: (spd((2, 3, 3)),)),
    "funm": (lambda A: agt.funm(A, sp.cos(x)), lambda: (spd((2, 3, 3)),)),
    "eigsh": (lambda A: agt.eigsh(A, 2), lambda: (spd((6, 6)),)),
    "eigsh B": (lambda A, B: agt.eigsh(A, 2, B), lambda: (spd((6, 6), seed=11), spd((6, 6), seed=12))),
    "svds": (lambda A: agt.svds(A, 2), lambda: (torch.randn(6, 4, dtype=D, generator=gen(9)),)),
}


def _tensors(out):
    return [o for o in (out if isinstance(out, tuple) else (out,)) if isinstance(o, torch.Tensor)]


@pytest.mark.parametrize("name", list(PUBLIC))
def test_every_function_propagates_shapes_on_meta_tensors(name):
    f, make = PUBLIC[name]
    args = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real = _tensors(f(*args))
        meta = _tensors(f(*(torch.empty(a.shape, dtype=a.dtype, device="meta") for a in args)))
    assert all(m.device.type == "meta" for m in meta)
    assert [(m.shape, m.dtype) for m in meta] == [(r.shape, r.dtype) for r in real]


@pytest.mark.parametrize("name", list(PUBLIC))
def test_every_function_runs_under_torch_compile(name):
    f, make = PUBLIC[name]
    args = make()
    loss = lambda *a: sum((o * o).sum() for o in _tensors(f(*a)) if o.is_floating_point())  # noqa: E731
    compiled = torch.compile(loss, fullgraph=False, backend="aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a1 = [a.clone().requires_grad_() for a in args]
        a2 = [a.clone().requires_grad_() for a in args]
        v1, v2 = compiled(*a1), loss(*a2)
        g1 = torch.autograd.grad(v1, a1)
        g2 = torch.autograd.grad(v2, a2)
    assert torch.allclose(v1, v2, rtol=1e-10)
    assert all(torch.allclose(p, q, rtol=1e-8, atol=1e-10) for p, q in zip(g1, g2))


# ----------------------------------------------------------------------- the reported cases
def test_complete_qr_in_forward_mode_raises_as_torch_naming_the_mode():
    A = torch.randn(5, 3, dtype=D, generator=gen(20))
    with pytest.raises(RuntimeError, match="mode='complete'"):
        torch.func.jvp(lambda a: agt.qr(a, mode="complete"), (A,), (torch.ones_like(A),))
    with pytest.raises(RuntimeError):  # torch's own
        torch.func.jvp(lambda a: torch.linalg.qr(a, mode="complete"), (A,), (torch.ones_like(A),))
    # square and wide matrices: the complete factor is the reduced one, differentiable both ways
    for shape in [(3, 3), (3, 5)]:
        B = torch.randn(*shape, dtype=D, generator=gen(21))
        t = torch.randn(*shape, dtype=D, generator=gen(22))
        ours = torch.func.jvp(lambda a: agt.qr(a, mode="complete"), (B,), (t,))[1]
        theirs = torch.func.jvp(lambda a: torch.linalg.qr(a, mode="complete"), (B,), (t,))[1]
        assert all(torch.allclose(p, q, atol=1e-10) for p, q in zip(ours, theirs))


def test_complex_wide_qr_has_batched_forward_gradients():
    A = torch.randn(2, 3, 5, dtype=torch.complex128, generator=gen(23)).requires_grad_()
    assert torch.autograd.gradcheck(lambda a: agt.qr(a), (A,), check_forward_ad=True,
                                    check_batched_forward_grad=True, check_batched_grad=True)


def test_svds_of_a_zero_matrix_returns_orthonormal_vectors_and_a_zero_gradient():
    Z = torch.zeros(10, 5, dtype=D, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # k cuts through the (all-zero) spectrum: warned
        U, S, Vh = agt.svds(Z, 2)
    assert torch.isfinite(U).all() and torch.isfinite(Vh).all()
    assert torch.allclose(U.mT @ U, torch.eye(2, dtype=D), atol=1e-12)
    assert torch.allclose(Vh @ Vh.mT, torch.eye(2, dtype=D), atol=1e-12)
    assert torch.equal(S.detach(), torch.zeros(2, dtype=D))
    (g,) = torch.autograd.grad(S.square().sum(), Z)  # smooth at 0: gradient 2 U S Vh = 0
    assert torch.equal(g, torch.zeros_like(g))


def test_eigsh_and_svds_report_their_certificates():
    A = spd((30, 30), seed=30)
    w, V, info = agt.eigsh(A, 3, return_info=True)
    assert isinstance(info, PartialEighInfo) and info.certificate in ("direct", "inertia", "second-opinion", "repaired")
    assert info.gap > 0 and info.residual < 1e-8
    assert torch.allclose(w.sort().values, torch.linalg.eigvalsh(A)[-3:])
    wb, Vb, infos = agt.eigsh(spd((2, 30, 30), seed=31), 2, return_info=True)
    assert wb.shape == (2, 2) and len(infos) == 2 and all(isinstance(i, PartialEighInfo) for i in infos)
    M = torch.randn(20, 8, dtype=D, generator=gen(32))
    U, S, Vh, info = agt.svds(M, 2, return_info=True)
    assert isinstance(info, PartialEighInfo) and info.certificate
    assert torch.allclose(S, torch.linalg.svdvals(M)[:2])
    assert len(agt.svds(M.expand(3, 20, 8), 2, return_info=True)[3]) == 3
    # without it, the results are as before: no extra output
    assert len(agt.eigsh(A, 3)) == 2 and len(agt.svds(M, 2)) == 3

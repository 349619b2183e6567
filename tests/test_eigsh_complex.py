"""eigsh over complex Hermitian input: dense (batched), torch sparse CSR/COO, complex
LinearOperators, and the generalized problem with a Hermitian positive definite B.  Values against
torch.linalg.eigh / scipy; gradients of phase-invariant losses (w, |V|, the projector V V^H) by
finite differences along Hermitian directions (both modes) and against a dense reference; a loss
that depends on the eigenvector phases raises, as for full eigh."""
import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sps
import torch

import adjointgen
import adjointgen.testing as agtest
import adjointgen.torch as agt
from adjointgen.generated.torch import eigsh as rules
from adjointgen.runtime import gauge
from adjointgen.runtime.eigsolvers import partial_eigh
from adjointgen.runtime.linsolve import solve_projected_shifted, solve_projected_shifted_dense
from helpers import rel

C128 = torch.complex128


eigsh = agt.eigsh


def hermitian(*shape, seed=0, dtype=C128):
    g = torch.Generator().manual_seed(seed)
    X = torch.complex(torch.randn(*shape, dtype=torch.float64, generator=g),
                      torch.randn(*shape, dtype=torch.float64, generator=g))
    return ((X + X.mH) / 2).to(dtype)


def hpd(n, seed=1, dtype=C128):
    X = hermitian(n, n, seed=seed) + 1j * hermitian(n, n, seed=seed + 100)  # a general complex matrix
    return (X @ X.mH / n + torch.eye(n, dtype=C128)).to(dtype)


def sparse_hermitian(n, seed, shift=0.0, impurities=True):
    """A chain with complex hoppings to the first and third neighbour and a random potential with a
    few impurities far above and below the band (a tight-binding Hamiltonian with a magnetic flux):
    banded, so its LDL^T is cheap, and with well-separated extreme eigenvalues.  Without the
    impurities and with ``shift = 15`` it is positive definite (Gershgorin, up to a 1e-4 chance)."""
    rng = np.random.default_rng(seed)
    hop = lambda m: rng.standard_normal(m) * np.exp(2j * np.pi * rng.uniform(size=m))
    upper = sps.diags([hop(n - 1), 0.5 * hop(n - 3)], [1, 3])
    potential = rng.uniform(-2, 2, n)
    sites = rng.choice(n, 10, replace=False)
    if impurities:
        potential[sites] = np.r_[6.0 + np.arange(5), -6.0 - np.arange(5)]
    M = (upper + upper.conj().T + sps.diags(potential + shift)).tocsr()
    M.sort_indices()
    return M


def to_torch(M, layout):
    if layout == "csr":
        return torch.sparse_csr_tensor(torch.from_numpy(M.indptr.astype(np.int64)),
                                       torch.from_numpy(M.indices.astype(np.int64)), torch.from_numpy(M.data),
                                       M.shape, check_invariants=False)
    C = M.tocoo()
    return torch.sparse_coo_tensor(torch.from_numpy(np.vstack([C.row, C.col]).astype(np.int64)),
                                   torch.from_numpy(C.data), C.shape, check_invariants=False).coalesce()


def invariant_loss(w, V):
    """Invariant to the phase of each eigenvector: w, |V| and the projector V V^H."""
    n = V.shape[-2]
    weights = torch.linspace(-1, 1, n, dtype=torch.float64)
    P = V @ V.mH
    loss = (w ** 2).sum() + (V.abs() ** 2 * weights[:, None]).sum() + (P.real * weights).sum()
    return loss + P.imag[..., 0, :].sum() if P.is_complex() else loss


def reference(A, B, k, largest):
    """The k extreme pairs of the full decomposition (torch.linalg.eigh / agt.eigh), differentiable."""
    w, V = torch.linalg.eigh(A) if B is None else agt.eigh(A, B)
    n = A.shape[-1]
    keep = slice(n - k, n) if largest else slice(0, k)
    return w[..., keep], V[..., keep]


def reference_gradients(A, B, k, largest):
    A = A.clone().requires_grad_()
    B = None if B is None else B.clone().requires_grad_()
    inputs = [A] + ([] if B is None else [B])
    return torch.autograd.grad(invariant_loss(*reference(A, B, k, largest)), inputs)


# ---------------------------------------------------------------- dense
@pytest.mark.parametrize("batch", [(), (2,)])
@pytest.mark.parametrize("largest", [True, False])
def test_dense_values_vectors_and_gradients_match_eigh(batch, largest):
    n, k = 9, 3
    A = hermitian(*batch, n, n, seed=3)
    A1 = A.clone().requires_grad_()
    w, V = eigsh(A1, k, largest=largest)
    assert w.dtype == torch.float64 and V.dtype == C128 and V.shape == (*batch, n, k)
    wr, Vr = reference(A, None, k, largest)
    if largest:
        wr, Vr = wr.flip(-1), Vr.flip(-1)
    torch.testing.assert_close(w, wr, rtol=1e-12, atol=1e-12)
    agtest.assert_close_up_to_phase(V, Vr)
    torch.testing.assert_close(V.mH @ V, torch.eye(k, dtype=C128).expand(*batch, k, k), rtol=0, atol=1e-13)
    g, = torch.autograd.grad(invariant_loss(w, V), A1)
    ref, = reference_gradients(A, None, k, largest)
    assert rel(g, ref) <= 1e-10
    assert rel(g, g.mH) <= 1e-14  # Hermitian


def test_dense_gradcheck_both_modes_along_hermitian_directions():
    A = hermitian(6, 6, seed=4).requires_grad_()
    for f in (lambda A: eigsh(A, 2)[0], lambda A: eigsh(A, 2, largest=False)[1].abs(),
              lambda A: (lambda V: V @ V.mH)(eigsh(A, 2)[1])):
        assert agtest.gradcheck(f, (A,), symmetric=True, check_forward_ad=True)


def test_dense_second_derivatives():
    A = hermitian(5, 5, seed=5).requires_grad_()
    assert agtest.gradgradcheck(lambda A: eigsh(A, 2)[1].abs(), (A,), symmetric=True, atol=1e-6, rtol=1e-5)


def test_forward_mode_through_torch_func():
    A, dA = hermitian(8, 8, seed=6), hermitian(8, 8, seed=7)
    f = lambda A: invariant_loss(*eigsh(A, 3, largest=False))
    _, df = torch.func.jvp(f, (A,), (dA,))
    fd = float(agtest.central_difference(f, (A,), (dA,), eps=1e-5))
    assert abs(float(df) - fd) <= 1e-7 * max(1.0, abs(fd))
    _, (dw, dV) = torch.func.jvp(lambda A: eigsh(A, 3), (A,), (dA,))
    assert dw.dtype == torch.float64 and dV.dtype == C128


def test_generalized_with_hermitian_positive_definite_B():
    n, k = 7, 2
    A, B = hermitian(n, n, seed=8), hpd(n, seed=9)
    w, V = eigsh(A, k, B, largest=False)
    ref = scipy.linalg.eigh(A.numpy(), B.numpy(), eigvals_only=True)[:k]
    np.testing.assert_allclose(w.numpy(), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(V.mH @ B @ V, torch.eye(k, dtype=C128), rtol=0, atol=1e-12)
    Ar, Br = A.clone().requires_grad_(), B.clone().requires_grad_()
    assert agtest.gradcheck(lambda a, b: eigsh(a, k, b)[0], (Ar, Br), check_forward_ad=True)
    assert agtest.gradcheck(lambda a, b: (lambda V: V @ V.mH)(eigsh(a, k, b, largest=False)[1]), (Ar, Br),
                            check_forward_ad=True)


def test_complex64():
    n, k = 10, 3
    A = hermitian(n, n, seed=10)
    A32 = A.to(torch.complex64).requires_grad_()
    w, V = eigsh(A32, k)
    assert w.dtype == torch.float32 and V.dtype == torch.complex64
    torch.testing.assert_close(w.double(), torch.linalg.eigvalsh(A)[-k:].flip(0), rtol=1e-5, atol=1e-5)
    g, = torch.autograd.grad(invariant_loss(w, V), A32)
    ref, = reference_gradients(A, None, k, True)
    assert g.dtype == torch.complex64 and rel(g.to(C128), ref) <= 1e-4
    # the generalized problem and a sparse input in single precision too
    B = hpd(n, seed=11)
    w, _ = eigsh(A32.detach(), k, B.to(torch.complex64))
    torch.testing.assert_close(w.double(), torch.from_numpy(scipy.linalg.eigh(A.numpy(), B.numpy(), eigvals_only=True)[-k:][::-1].copy()),
                               rtol=1e-4, atol=1e-4)
    w, _ = agt.eigsh(A32.detach().to_sparse_coo(), k)
    torch.testing.assert_close(w.double(), torch.linalg.eigvalsh(A)[-k:].flip(0), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- sparse and matrix-free
@pytest.mark.parametrize("layout", ["csr", "coo"])
@pytest.mark.parametrize("n, generalized", [(40, False), (40, True), (650, False), (650, True)])
def test_sparse_values_and_gradient_on_the_pattern(layout, n, generalized):
    k, largest = 3, layout == "csr"
    MA = sparse_hermitian(n, seed=n)
    MB = sparse_hermitian(n, seed=n + 1, shift=15.0, impurities=False) if generalized else None
    As = to_torch(MA, layout).requires_grad_()
    Bs = None if MB is None else to_torch(MB, layout).requires_grad_()
    w, V = agt.eigsh(As, k, Bs, largest=largest, tol=1e-12)
    subset = [n - k, n - 1] if largest else [0, k - 1]
    wr = scipy.linalg.eigh(MA.toarray(), None if MB is None else MB.toarray(), eigvals_only=True, subset_by_index=subset)
    np.testing.assert_allclose(w.detach().numpy(), wr[::-1] if largest else wr, rtol=1e-10, atol=1e-10)
    inputs = [As] + ([] if Bs is None else [Bs])
    grads = torch.autograd.grad(invariant_loss(w, V), inputs)
    for g, X in zip(grads, inputs):
        assert g.layout == X.layout and g.dtype == C128 and g._nnz() == X._nnz()  # on the sparsity pattern
    if n <= 100:  # against the dense reference, entrywise on the pattern
        Ad = torch.from_numpy(MA.toarray())
        Bd = None if MB is None else torch.from_numpy(MB.toarray())
        for g, ref, dense in zip(grads, reference_gradients(Ad, Bd, k, largest), [Ad] + ([] if Bd is None else [Bd])):
            assert rel(g.to_dense(), ref * (dense != 0)) <= 1e-9
        return
    # large: the directional derivative along Hermitian perturbations on the pattern, by central differences
    directions = [sparse_hermitian(n, seed=n + 2)] + ([] if MB is None else [0.1 * sparse_hermitian(n, seed=n + 3)])
    directions = [D.multiply(abs(M) > 0) for D, M in zip(directions, [MA, MB])]  # on the patterns of A and B

    def f(*ts):
        mats = [M + t * D for M, D, t in zip([MA, MB], directions, ts)]
        return float(invariant_loss(*agt.eigsh(to_torch(mats[0], layout), k, to_torch(mats[1], layout) if MB is not None
                                               else None, largest=largest, tol=1e-12)))

    h = 1e-5
    fd = (f(*[h] * len(inputs)) - f(*[-h] * len(inputs))) / (2 * h)
    analytic = sum(float((g.to_dense().conj() * torch.from_numpy(D.toarray())).sum().real)
                   for g, D in zip(grads, directions))
    assert abs(analytic - fd) <= 1e-6 * max(1.0, abs(fd))


def test_sparse_route_is_certified_by_hermitian_inertia():
    M = to_torch(sparse_hermitian(650, seed=12), "csr")
    for largest in (True, False):
        w, _, info = partial_eigh(M, 4, largest=largest)
        assert info.method == "arpack" and info.certificate == "inertia"
        ref = torch.linalg.eigvalsh(M.to_dense())
        torch.testing.assert_close(w, ref.flip(0)[:4] if largest else ref[:4], rtol=1e-11, atol=1e-11)


def test_complex_linear_operator_gradient_reaches_its_parameters():
    n, k = 30, 3
    A, B = hermitian(n, n, seed=13), hpd(n, seed=14)
    for generalized in (False, True):
        M = A.clone().requires_grad_()
        N = B.clone().requires_grad_()
        op = adjointgen.LinearOperator(lambda X, M: M @ X, (n, n), params=(M,))
        assert op.dtype == C128
        opB = adjointgen.LinearOperator(lambda X, N: N @ X, (n, n), params=(N,)) if generalized else None
        w, V = agt.eigsh(op, k, opB, tol=1e-12)
        wanted = [M] + ([N] if generalized else [])
        grads = torch.autograd.grad(invariant_loss(w, V), wanted)
        refs = reference_gradients(A, B if generalized else None, k, True)
        for g, ref in zip(grads, refs):
            assert rel(g, ref) <= 1e-9
    # a closure without parameters: its complex dtype is found by a probe product
    probe = adjointgen.LinearOperator(lambda X: A @ X.to(C128), (n, n))
    assert probe.dtype == C128
    torch.testing.assert_close(agt.eigsh(probe, 2)[0], torch.linalg.eigvalsh(A)[-2:].flip(0))


@pytest.mark.parametrize("method", ["arpack", "lobpcg", "krylov"])
def test_iterative_routes_handle_complex_input(method):
    n, k = 90, 3
    A, B = hermitian(n, n, seed=15), hpd(n, seed=16)
    for Bi in (None, B):
        w, U, info = partial_eigh(A, k, Bi, largest=False, method=method, tol=1e-11)
        ref = torch.linalg.eigvalsh(A) if Bi is None else torch.from_numpy(
            scipy.linalg.eigh(A.numpy(), B.numpy(), eigvals_only=True))
        torch.testing.assert_close(w, ref[:k], rtol=1e-10, atol=1e-10)
        Bm = torch.eye(n, dtype=C128) if Bi is None else Bi
        torch.testing.assert_close(U.mH @ Bm @ U, torch.eye(k, dtype=C128), rtol=0, atol=1e-10)
        assert info.method != "krylov"  # block Lanczos is real-only: complex input is routed elsewhere
        assert bool((U.abs().argmax(0) >= 0).all()) and U.gather(0, U.abs().argmax(0, keepdim=True)).imag.abs().max() < 1e-12


def test_complex_projected_shifted_solve_agrees_with_the_bordered_solve():
    n, k = 60, 3
    A, B = hermitian(n, n, seed=17), hpd(n, seed=18)
    for Bi in (None, B):
        w, U, _ = partial_eigh(A, k, Bi, largest=True)
        BU = U if Bi is None else Bi @ U
        X = hermitian(n, n, seed=19)[:, :k]
        R = X - BU @ (U.mH @ X)
        exact = solve_projected_shifted_dense(A, Bi, U, w, R)
        x, info = solve_projected_shifted(A, Bi, U, BU, w, R, tol=1e-12, return_info=True)
        assert rel(x, exact) <= 1e-9 and info.signs == (-1,) * k and not info.minres_columns
        x = solve_projected_shifted(A, Bi, U, BU, w, R, tol=1e-12, definiteness="indefinite")  # MINRES
        assert rel(x, exact) <= 1e-9


# ---------------------------------------------------------------- the gauge
def test_phase_dependent_loss_raises_for_every_input_form():
    n, k = 8, 2
    A, B = hermitian(n, n, seed=20), hpd(n, seed=21)
    A1 = A.clone().requires_grad_()
    As = A.to_sparse().requires_grad_()
    cases = [(lambda: eigsh(A1, k), A1), (lambda: eigsh(A1, k, B), A1), (lambda: agt.eigsh(As, k), As),
             (lambda: agt.eigsh(adjointgen.LinearOperator(lambda X, M: M @ X, (n, n), params=(A1,)), k), A1)]
    for make, leaf in cases:
        _, V = make()
        with pytest.raises(gauge.PhaseDependentLossError, match="phase"):
            torch.autograd.grad(V[0].real.sum(), leaf)
    _, V = eigsh(A1, k)
    with pytest.raises(adjointgen.GaugeDependentLossError):
        torch.autograd.grad(V[1, 0].imag, A1)
    with gauge.disabled():  # the check off: the derived rule itself (the phase part dropped)
        _, V = eigsh(A1, k)
        torch.autograd.grad(V[0].real.sum(), A1)
    # a gauge-invariant loss of the same vectors passes
    _, V = eigsh(A1, k)
    torch.autograd.grad((V[0].abs() ** 2).sum(), A1)


def test_split_degenerate_eigenvalue_raises_only_where_used():
    n = 6
    Q, _ = torch.linalg.qr(hermitian(n, n, seed=22) + 1j * hermitian(n, n, seed=23))
    A = (Q * torch.tensor([0.0, 1.0, 2.0, 3.0, 5.0, 5.0], dtype=torch.float64)) @ Q.mH
    A = ((A + A.mH) / 2).requires_grad_()
    with pytest.warns(UserWarning, match="gap"):
        w, V = eigsh(A, 1)
    with pytest.raises(adjointgen.DegenerateSubspaceError if hasattr(adjointgen, "DegenerateSubspaceError")
                       else gauge.DegenerateSubspaceError, match="degenerate"):
        torch.autograd.grad(w.sum(), A)


def test_bad_input():
    A = hermitian(5, 5, seed=24)
    A[0, 1] += 0.5
    with pytest.raises(ValueError, match="Hermitian"):
        eigsh(A, 2)
    with pytest.raises(ValueError, match="positive definite"):
        eigsh(hermitian(5, 5, seed=25), 2, -hpd(5, seed=26))


def test_empty_batch_has_real_eigenvalues():
    A = torch.zeros(0, 4, 4, dtype=C128, requires_grad=True)
    w, V = eigsh(A, 2)
    assert w.shape == (0, 2) and w.dtype == torch.float64 and V.shape == (0, 4, 2) and V.dtype == C128


def test_real_input_still_uses_the_real_rules():
    A = torch.randn(6, 6, dtype=torch.float64)
    A = ((A + A.mT) / 2).requires_grad_()
    w, V = eigsh(A, 2)
    assert V.dtype == torch.float64
    g, = torch.autograd.grad(invariant_loss(w, V), A)
    w2, V2 = rules.eigsh_jvp(A.detach(), w.detach(), V.detach(), torch.eye(6, dtype=torch.float64))
    assert g.dtype == torch.float64 and w2.dtype == torch.float64


def test_public_entry_point_accepts_complex_dense():
    w, _ = agt.eigsh(hermitian(5, 5, seed=27), 2, hpd(5, seed=28))
    assert w.dtype == torch.float64

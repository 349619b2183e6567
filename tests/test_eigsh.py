"""eigsh: k of n eigenpairs with the derived rules (projected shifted solves), against a dense
reference (autograd through a Cholesky reduction and torch.linalg.eigh), for B = I and SPD B."""
import numpy as np
import pytest
import scipy.sparse as sps
import torch

import adjointgen
import adjointgen.torch as agt
from adjointgen.generated.cupy import eigsh as rules_xp
from adjointgen.generated.torch import eigsh as rules
from adjointgen.generated.torch import eigsh_generalized as rules_g
from helpers import reference_generalized_eigh, rel, spd, sym


def problem(n, seed):
    g = torch.Generator().manual_seed(seed)
    return sym(torch.randn(n, n, dtype=torch.float64, generator=g))


def loss(w, V, W):
    k = V.shape[-1]
    return (w ** 3).sum() + ((V @ V.mT)[:, : W.shape[1]] * W).sum()  # gauge-invariant


def reference(A, B, k, largest):
    w, V = (torch.linalg.eigh(A) if B is None else reference_generalized_eigh(A, B))
    if largest:
        return w[-k:].flip(0), V[:, -k:].flip(1)
    return w[:k], V[:, :k]


CASES = [(n, k, cond) for n in (50, 200) for k in (1, 4, 8) for cond in (None, 1e4)]
CASES += [(1000, 1, None), (1000, 8, None), (1000, 8, 1e4)]


@pytest.mark.parametrize("n, k, cond", CASES)
def test_gradients_match_dense_reference(n, k, cond):
    A = problem(n, seed=n + k)
    B = None if cond is None else spd(n, cond, seed=n + 1)
    W = torch.randn(n, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(k))
    largest = k != 4  # both ends
    A1 = A.clone().requires_grad_()
    B1 = None if B is None else B.clone().requires_grad_()
    w, V = agt.eigsh(A1, k, B1, largest=largest)
    inputs = [A1] + ([] if B is None else [B1])
    grads = torch.autograd.grad(loss(w, V, W), inputs)
    A2 = A.clone().requires_grad_()
    B2 = None if B is None else B.clone().requires_grad_()
    wr, Vr = reference(A2, B2, k, largest)
    refs = torch.autograd.grad(loss(wr, Vr, W), [A2] + ([] if B is None else [B2]))
    assert rel(w, wr) < 1e-10
    for g, r in zip(grads, refs):
        assert rel(g, sym(r)) <= 1e-8


@pytest.mark.parametrize("generalized", [False, True])
def test_jvp_along_symmetric_directions_and_dot_product(generalized):
    n, k = 30, 3
    A = problem(n, seed=5)
    B = spd(n, 50.0, seed=6) if generalized else None
    w, V = agt.eigsh(A, k, B)
    dA = sym(torch.randn(n, n, dtype=torch.float64))
    dB = sym(torch.randn(n, n, dtype=torch.float64)) if generalized else None
    if generalized:
        dw, dV = rules_g.eigsh_generalized_jvp(A, B, w, V, dA, dB)
    else:
        dw, dV = rules.eigsh_jvp(A, w, V, dA)
    h = 1e-6
    wp, Vp = agt.eigsh(A + h * dA, k, None if B is None else B + h * dB)
    wm, Vm = agt.eigsh(A - h * dA, k, None if B is None else B - h * dB)
    align = lambda X: X * torch.sign((X * V).sum(-2, keepdim=True))
    assert rel(dw, (wp - wm) / (2 * h)) < 1e-7
    assert rel(dV, (align(Vp) - align(Vm)) / (2 * h)) < 1e-6
    gw, gV = torch.randn(k, dtype=torch.float64), torch.randn(n, k, dtype=torch.float64)
    if generalized:
        gA, gB = rules_g.eigsh_generalized_vjp(A, B, w, V, gw, gV)
        lhs = float((gA * dA).sum() + (gB * dB).sum())
    else:
        gA = rules.eigsh_vjp(A, w, V, gw, gV)
        lhs = float((gA * dA).sum())
    rhs = float((gw * dw).sum() + (gV * dV).sum())
    assert abs(lhs - rhs) <= 1e-9 * (abs(lhs) + abs(rhs))


def test_forward_mode_through_torch_func():
    A = problem(20, seed=7)
    dA = sym(torch.randn(20, 20, dtype=torch.float64))
    (w, V), (dw, dV) = torch.func.jvp(lambda a: agt.eigsh(a, 2), (A,), (dA,))
    assert rel(dw, rules.eigsh_jvp(A, w, V, dA)[0]) < 1e-13


def test_numpy_backend_equals_torch_backend():
    A = problem(15, seed=8)
    w, V = agt.eigsh(A, 3)
    gw, gV = torch.randn(3, dtype=torch.float64), torch.randn(15, 3, dtype=torch.float64)
    np.testing.assert_allclose(rules_xp.eigsh_vjp(A.numpy(), w.numpy(), V.numpy(), gw.numpy(), gV.numpy()),
                               rules.eigsh_vjp(A, w, V, gw, gV).numpy(), rtol=1e-10, atol=1e-12)


def test_low_rank_factors_equal_dense_gradient():
    A = problem(25, seed=9)
    w, V = agt.eigsh(A, 4)
    gw, gV = torch.randn(4, dtype=torch.float64), torch.randn(25, 4, dtype=torch.float64)
    L, R = rules.eigsh_vjp_factors(A, w, V, gw, gV)
    assert L.shape == (25, 4) and R.shape == (25, 4)
    assert rel(0.5 * (L @ R.mT + R @ L.mT), rules.eigsh_vjp(A, w, V, gw, gV)) < 1e-12


def _to_torch_csr(M):
    M = sps.csr_matrix(M)
    M.sort_indices()
    return torch.sparse_csr_tensor(torch.from_numpy(M.indptr.astype(np.int64)), torch.from_numpy(M.indices.astype(np.int64)),
                                   torch.from_numpy(M.data), size=M.shape)


@pytest.mark.parametrize("layout", ["coo", "csr", "operator"])
def test_sparse_and_operator_inputs_agree_with_dense(layout):
    n, k = 60, 3
    rng = np.random.default_rng(10)
    M = sps.random(n, n, density=0.1, random_state=rng)
    M = (M + M.T) * 0.5 + sps.diags(np.arange(n, dtype=float) / 10)
    dense = torch.from_numpy(M.toarray())
    W = torch.randn(n, 3, dtype=torch.float64)
    Ad = dense.clone().requires_grad_()
    gd, = torch.autograd.grad(loss(*agt.eigsh(Ad, k), W), Ad)
    if layout == "operator":
        values = dense.clone().requires_grad_()
        op = adjointgen.LinearOperator(lambda X, M_: M_ @ X, (n, n), params=(values,))
        g_op, = torch.autograd.grad(loss(*agt.eigsh(op, k), W), values)
        assert rel(g_op, gd) < 1e-9  # <sym(L R^T), dM> through the matvec's own VJP
        return
    As = _to_torch_csr(M) if layout == "csr" else dense.to_sparse_coo().coalesce()
    As.requires_grad_()
    gs, = torch.autograd.grad(loss(*agt.eigsh(As, k), W), As)
    assert gs.layout == As.layout
    gs_dense = gs.to_dense()
    mask = dense != 0
    assert rel(gs_dense[mask], gd[mask]) < 1e-9
    assert float(gs_dense[~mask].abs().max()) == 0.0


def test_sparse_gradient_never_builds_a_dense_matrix():
    """n = 200,000: an n×n float64 tensor would need 320 GB, so any densification fails."""
    n, k = 200_000, 2
    rng = np.random.default_rng(11)
    d = rng.uniform(0, 1, n)
    d[-3:] = [1.5, 2.0, 3.0]  # the kept pair and the next one (which measures the gap) are separated
    off = rng.uniform(-1e-3, 1e-3, n - 1)
    M = sps.diags([off, d, off], [-1, 0, 1])
    A = _to_torch_csr(M).requires_grad_()
    w, V = agt.eigsh(A, k)
    g, = torch.autograd.grad((w ** 2).sum() + V[:5].sum(), A)
    assert g.layout == torch.sparse_csr and g.values().numel() == A.values().numel()
    assert abs(float(w[0]) - 3.0) < 1e-3


def test_gap_warning():
    A = torch.diag(torch.tensor([1.0, 2.0, 3.0, 3.0, 4.0], dtype=torch.float64))
    with pytest.warns(UserWarning, match="gap"):
        agt.eigsh(A, 2)  # splits the pair at 3


@pytest.mark.parametrize("kwargs, match", [
    (dict(k=0), "k"),
    (dict(k=31), "k"),
    (dict(k=2, B=-torch.eye(30, dtype=torch.float64)), "positive definite"),
    (dict(k=2, B=torch.eye(29, dtype=torch.float64)), "shape|B"),
])
def test_bad_input_raises(kwargs, match):
    A = problem(30, seed=12)
    k = kwargs.pop("k")
    with pytest.raises(ValueError, match=match):
        agt.eigsh(A, k, **kwargs)


def test_nan_raises():
    A = problem(10, seed=13)
    A[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        agt.eigsh(A, 2)


def test_non_convergence_reports_residual():
    n = 5000
    M = sps.diags([-np.ones(n - 1), 2 * np.ones(n), -np.ones(n - 1)], [-1, 0, 1])
    with pytest.raises(adjointgen.ConvergenceError, match="residual"):
        agt.eigsh(_to_torch_csr(M), 4, maxiter=2, tol=1e-14)


def test_sparse_backward_when_a_cotangent_lies_in_the_kept_span():
    # a path-graph Laplacian plus 0.1 I: its smallest eigenvector is constant, so the cotangent
    # 4 V^3 of sum(V**4) has a first column inside span(V).  Projected once, its rounding (eps
    # |gV|) along V was a right-hand side no projected solve can match: CG blew up, then MINRES
    # stalled at a 1e26 residual.  The sparse backward must agree with the dense one.
    n = 200
    g = torch.Generator().manual_seed(0)
    weights = torch.rand(n - 1, dtype=torch.float64, generator=g) + 1
    edges = torch.stack([torch.arange(n - 1), torch.arange(1, n)])

    def matrix(wts, sparse):
        rows = torch.cat([edges[0], edges[1], edges[0], edges[1], torch.arange(n)])
        cols = torch.cat([edges[1], edges[0], edges[0], edges[1], torch.arange(n)])
        vals = torch.cat([-wts, -wts, wts, wts, torch.full((n,), 0.1, dtype=torch.float64)])
        A = torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, (n, n)).coalesce()
        return A if sparse else A.to_dense()

    grads = []
    for sparse in (True, False):
        wts = weights.clone().requires_grad_()
        w, V = agt.eigsh(matrix(wts, sparse), 3, largest=False)
        (w.sum() + (V ** 4).sum()).backward()
        grads.append(wts.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-7, atol=1e-12)

"""Every public function on a CUDA device: the torch drop-ins against the same functions on the CPU
and against torch's own CUDA functions, the degeneracy guarantees and the torch.func transforms on
the GPU, the generated CuPy rules against NumPy on every derivation's audit instances, and the JAX
functions on a GPU.  Skipped where there is no CUDA device (CI); ``scripts/gpu-check.sh`` runs it."""
import inspect
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import sympy
import torch

import adjointgen
import adjointgen.torch as agt
from adjointgen.runtime import gauge, verdict

#: ADJOINTGEN_GPU_TESTS_ON=cpu runs this module's logic on the CPU (to check the tests themselves
#: where there is no GPU: every comparison is then CPU against CPU)
CUDA = os.environ.get("ADJOINTGEN_GPU_TESTS_ON", "cuda")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(CUDA == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device")]

ROOT = Path(__file__).resolve().parents[1]
f32, f64, c64, c128 = torch.float32, torch.float64, torch.complex64, torch.complex128


@pytest.fixture(autouse=True)
def _eager_checks():
    """The tests of the checks' verdicts and of the exact gradients at clusters run with the checks
    eager, as on the CPU (on a GPU the default defers them: tests of that mode name it)."""
    with verdict.checking("eager"):
        yield
    verdict.raise_deferred()


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(*shape, dtype=f64, seed=0):
    g = _gen(seed)
    x = torch.randn(shape, dtype=f64, generator=g)
    if dtype.is_complex:
        x = x + 1j * torch.randn(shape, dtype=f64, generator=g)
    return x.to(dtype)


def herm(*shape, dtype=f64, seed=0):
    X = randn(*shape, dtype=dtype, seed=seed)
    return 0.5 * (X + X.mH)


def hpd(*shape, dtype=f64, seed=0, shift=None):
    X = randn(*shape, dtype=dtype, seed=seed)
    n = shape[-1]
    return X @ X.mH / n + torch.eye(n, dtype=dtype) * (1.0 if shift is None else shift)


def well_conditioned(*shape, dtype=f64, seed=0):
    n = shape[-1]
    return randn(*shape, dtype=dtype, seed=seed) / n ** 0.5 + 2 * torch.eye(n, dtype=dtype)


def weights_like(x, seed=99):
    return randn(*x.shape, dtype=x.dtype, seed=seed)


def real_inner(x, W):
    return (x * W.conj()).real.sum() if x.is_complex() else (x * W).sum()


def projector(V, k=2):
    return V[..., :, :k] @ V[..., :, :k].mH


# Each case: name, builder(dtype, batch) -> inputs, call(*inputs) -> outputs, loss(outputs) (invariant
# under the decomposition's gauge, so LAPACK and cuSOLVER bases give one value), torch's own function
# (or None), dtypes.
REAL_COMPLEX = (f64, c128, f32)
REAL = (f64, f32)
CASES = [
    ("eigh", lambda d, b: (herm(*b, 6, 6, dtype=d, seed=1),), lambda A: agt.eigh(A),
     lambda o: real_inner(o[0], weights_like(o[0])) + real_inner(projector(o[1]), weights_like(projector(o[1]))),
     lambda A: torch.linalg.eigh(A), REAL_COMPLEX),
    ("eigvalsh", lambda d, b: (herm(*b, 5, 5, dtype=d, seed=2),), lambda A: agt.eigvalsh(A),
     lambda o: real_inner(o, weights_like(o)), lambda A: torch.linalg.eigvalsh(A), REAL_COMPLEX),
    ("eigh(A, B)", lambda d, b: (herm(*b, 5, 5, dtype=d, seed=3), hpd(*b, 5, 5, dtype=d, seed=4)),
     lambda A, B: agt.eigh(A, B),
     lambda o: real_inner(o[0], weights_like(o[0])) + real_inner(projector(o[1]), weights_like(projector(o[1]))),
     None, REAL_COMPLEX),
    ("eigsh", lambda d, b: (herm(*b, 30, 30, dtype=d, seed=5),), lambda A: agt.eigsh(A, 3),
     lambda o: real_inner(o[0], weights_like(o[0])) + real_inner(projector(o[1]), weights_like(projector(o[1]))),
     None, REAL_COMPLEX),
    ("eigsh(A, k, B)", lambda d, b: (herm(*b, 30, 30, dtype=d, seed=6), hpd(*b, 30, 30, dtype=d, seed=7)),
     lambda A, B: agt.eigsh(A, 3, B, largest=False),
     lambda o: real_inner(o[0], weights_like(o[0])) + real_inner(projector(o[1]), weights_like(projector(o[1]))),
     None, REAL),
    ("svd", lambda d, b: (randn(*b, 7, 5, dtype=d, seed=8),), lambda A: agt.svd(A, full_matrices=False),
     lambda o: real_inner(o[1], weights_like(o[1])) + real_inner(o[0][..., :2] @ o[2][..., :2, :],
                                                                 weights_like(o[0][..., :2] @ o[2][..., :2, :])),
     lambda A: torch.linalg.svd(A, full_matrices=False), REAL_COMPLEX),
    ("svdvals", lambda d, b: (randn(*b, 4, 6, dtype=d, seed=9),), lambda A: agt.svdvals(A),
     lambda o: real_inner(o, weights_like(o)), lambda A: torch.linalg.svdvals(A), REAL_COMPLEX),
    ("svds", lambda d, b: (randn(*b, 40, 25, dtype=d, seed=10),), lambda A: agt.svds(A, 3),
     lambda o: real_inner(o[1], weights_like(o[1])) + real_inner(o[0][..., :2] @ o[2][..., :2, :],
                                                                 weights_like(o[0][..., :2] @ o[2][..., :2, :])),
     None, REAL),
    ("pinv", lambda d, b: (randn(*b, 6, 4, dtype=d, seed=11),), lambda A: agt.pinv(A),
     lambda o: real_inner(o, weights_like(o)), lambda A: torch.linalg.pinv(A), REAL_COMPLEX),
    ("pinv hermitian", lambda d, b: (herm(*b, 5, 5, dtype=d, seed=12),), lambda A: agt.pinv(A, hermitian=True),
     lambda o: real_inner(o, weights_like(o)), lambda A: torch.linalg.pinv(A, hermitian=True), REAL_COMPLEX),
    ("eig", lambda d, b: (randn(*b, 5, 5, dtype=d, seed=13),), lambda A: agt.eig(A),
     lambda o: real_inner(o[0], weights_like(o[0])) + real_inner(o[1].abs() ** 2, weights_like(o[1].abs())),
     lambda A: torch.linalg.eig(A), REAL_COMPLEX),
    ("eigvals", lambda d, b: (randn(*b, 5, 5, dtype=d, seed=14),), lambda A: agt.eigvals(A),
     lambda o: real_inner(o, weights_like(o)), lambda A: torch.linalg.eigvals(A), REAL_COMPLEX),
    ("cholesky", lambda d, b: (hpd(*b, 5, 5, dtype=d, seed=15),), lambda A: agt.cholesky(A),
     lambda o: real_inner(o, weights_like(o)), lambda A: torch.linalg.cholesky(A), REAL_COMPLEX),
    ("qr", lambda d, b: (randn(*b, 6, 4, dtype=d, seed=16),), lambda A: agt.qr(A),
     lambda o: real_inner(o[0], weights_like(o[0])) + real_inner(o[1], weights_like(o[1])),
     lambda A: torch.linalg.qr(A), REAL_COMPLEX),
    ("inv", lambda d, b: (well_conditioned(*b, 5, 5, dtype=d, seed=17),), lambda A: agt.inv(A),
     lambda o: real_inner(o, weights_like(o)), lambda A: torch.linalg.inv(A), REAL_COMPLEX),
    ("solve", lambda d, b: (well_conditioned(*b, 5, 5, dtype=d, seed=18), randn(5, 3, dtype=d, seed=19)),
     lambda A, B: agt.solve(A, B), lambda o: real_inner(o, weights_like(o)),
     lambda A, B: torch.linalg.solve(A, B), REAL_COMPLEX),
    ("solve_triangular", lambda d, b: (torch.triu(well_conditioned(*b, 5, 5, dtype=d, seed=20)),
                                       randn(*b, 5, 2, dtype=d, seed=21)),
     lambda A, B: agt.solve_triangular(A, B, upper=True), lambda o: real_inner(o, weights_like(o)),
     lambda A, B: torch.linalg.solve_triangular(A, B, upper=True), REAL_COMPLEX),
    ("slogdet", lambda d, b: (well_conditioned(*b, 5, 5, dtype=d, seed=22),), lambda A: agt.slogdet(A),
     lambda o: o[1].sum() + real_inner(o[0], weights_like(o[0])),
     lambda A: torch.linalg.slogdet(A), REAL_COMPLEX),
    ("det", lambda d, b: (well_conditioned(*b, 5, 5, dtype=d, seed=23),), lambda A: agt.det(A),
     lambda o: real_inner(o, weights_like(o)), lambda A: torch.linalg.det(A), REAL_COMPLEX),
    ("logdet", lambda d, b: (hpd(*b, 5, 5, dtype=d, seed=24),), lambda A: agt.logdet(A),
     lambda o: real_inner(o, weights_like(o)), lambda A: torch.logdet(A), (f64, f32)),
    ("lstsq", lambda d, b: (randn(*b, 8, 4, dtype=d, seed=25), randn(*b, 8, 2, dtype=d, seed=26)),
     lambda A, B: agt.lstsq(A, B).solution, lambda o: real_inner(o, weights_like(o)),
     lambda A, B: torch.linalg.lstsq(A, B).solution, REAL_COMPLEX),
    ("lu", lambda d, b: (randn(*b, 5, 5, dtype=d, seed=27),), lambda A: agt.lu(A)[1:],
     lambda o: real_inner(o[0], weights_like(o[0])) + real_inner(o[1], weights_like(o[1])),
     lambda A: torch.linalg.lu(A)[1:], REAL_COMPLEX),
    ("lu_solve", lambda d, b: (well_conditioned(*b, 5, 5, dtype=d, seed=28), randn(*b, 5, 2, dtype=d, seed=29)),
     lambda A, B: agt.lu_solve(*agt.lu_factor(A), B), lambda o: real_inner(o, weights_like(o)),
     lambda A, B: torch.linalg.lu_solve(*torch.linalg.lu_factor(A), B), REAL_COMPLEX),
    ("matrix_exp", lambda d, b: (randn(*b, 5, 5, dtype=d, seed=30) / 2,), lambda A: agt.matrix_exp(A),
     lambda o: real_inner(o, weights_like(o)), lambda A: torch.linalg.matrix_exp(A), REAL_COMPLEX),
    ("expm", lambda d, b: (herm(*b, 5, 5, dtype=d, seed=31),), lambda A: agt.expm(A),
     lambda o: real_inner(o, weights_like(o)), lambda A: torch.linalg.matrix_exp(A), REAL_COMPLEX),
    ("logm", lambda d, b: (hpd(*b, 5, 5, dtype=d, seed=32),), lambda A: agt.logm(A),
     lambda o: real_inner(o, weights_like(o)), None, REAL_COMPLEX),
    ("sqrtm", lambda d, b: (hpd(*b, 5, 5, dtype=d, seed=33),), lambda A: agt.sqrtm(A),
     lambda o: real_inner(o, weights_like(o)), None, REAL_COMPLEX),
    ("powm", lambda d, b: (hpd(*b, 5, 5, dtype=d, seed=34),), lambda A: agt.powm(A, 0.3),
     lambda o: real_inner(o, weights_like(o)), None, REAL_COMPLEX),
    ("funm sin", lambda d, b: (herm(*b, 5, 5, dtype=d, seed=35),), lambda A: agt.funm(A, sympy.sin(sympy.Symbol("x"))),
     lambda o: real_inner(o, weights_like(o)), None, REAL_COMPLEX),
    ("logm general", lambda d, b: (well_conditioned(*b, 5, 5, dtype=d, seed=36),), lambda A: agt.logm(A),
     lambda o: real_inner(o, weights_like(o)), None, (f64, c128)),
    ("sqrtm general", lambda d, b: (well_conditioned(*b, 5, 5, dtype=d, seed=37),), lambda A: agt.sqrtm(A),
     lambda o: real_inner(o, weights_like(o)), None, (f64, c128)),
]
PARAMS = [pytest.param(c, dtype, batch, id=f"{c[0]}-{str(dtype)[6:]}-{'x'.join(map(str, batch)) or 'single'}")
          for c in CASES for dtype in c[5] for batch in ((), (2,))]


def _tol(dtype):
    return 2e-3 if dtype in (f32, c64) else 1e-8


def _loss_and_grads(call, loss, inputs):
    xs = [x.detach().clone().requires_grad_() for x in inputs]
    value = loss(call(*xs))
    return value.detach(), torch.autograd.grad(value, xs)


def _close(a, b, tol, what):
    a, b = a.detach().cpu(), b.detach().cpu()
    scale = max(float(b.abs().max()) if b.numel() else 0.0, 1.0)
    err = float((a - b).abs().max()) if b.numel() else 0.0
    assert err <= tol * scale, f"{what}: max error {err:.3g} (scale {scale:.3g})"


@pytest.mark.parametrize("case, dtype, batch", PARAMS)
def test_cuda_matches_cpu_and_torch(case, dtype, batch):
    """Loss and gradient on the GPU equal the CPU's (and torch's CUDA function's, where torch has
    one); outputs stay on the GPU, in the input's dtype family."""
    name, build, call, loss, reference, _ = case
    inputs = build(dtype, batch)
    cpu_value, cpu_grads = _loss_and_grads(call, lambda o: loss(_to(o, "cpu")), inputs)
    gpu_inputs = [x.to(CUDA) for x in inputs]
    out = call(*gpu_inputs)
    for o in (out if isinstance(out, tuple) else (out,)):
        assert o.device.type == CUDA, f"{name}: an output on {o.device}"
    gpu_value, gpu_grads = _loss_and_grads(call, lambda o: loss(_to(o, "cpu")), gpu_inputs)
    tol = _tol(dtype)
    _close(gpu_value, cpu_value, tol, f"{name} loss")
    for g, c in zip(gpu_grads, cpu_grads):
        assert g.device.type == CUDA and g.dtype == c.dtype
        _close(g, c, tol, f"{name} gradient")
    if reference is not None:
        ref_value, ref_grads = _loss_and_grads(reference, lambda o: loss(_to(o, "cpu")), gpu_inputs)
        _close(gpu_value, ref_value, tol, f"{name} loss against torch's CUDA function")
        for x, g, r in zip(gpu_inputs, gpu_grads, ref_grads):
            if x.shape[-1] == x.shape[-2] and torch.allclose(x, x.mH.resolve_conj()):
                # a Hermitian input: compare along Hermitian directions (torch's gradient of some
                # functions of a Hermitian matrix is not Hermitian; ours is its Hermitian part)
                g, r = 0.5 * (g + g.mH), 0.5 * (r + r.mH)
            _close(g, r, 10 * tol, f"{name} gradient against torch's CUDA function")


def _to(o, device):
    if isinstance(o, tuple):
        return tuple(_to(x, device) for x in o)
    return o.to(device)


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in ("eigh", "svd", "cholesky", "inv", "solve", "qr",
                                                                  "expm", "slogdet", "eig", "pinv")],
                         ids=lambda c: c[0])
def test_cuda_empty_batch(case):
    name, build, call, loss, reference, _ = case
    inputs = [x.to(CUDA) for x in build(f64, (0,))]
    xs = [x.detach().clone().requires_grad_() for x in inputs]
    out = call(*xs)
    outs = out if isinstance(out, tuple) else (out,)
    if reference is not None:
        ref = reference(*inputs)
        for o, r in zip(outs, ref if isinstance(ref, tuple) else (ref,)):
            assert o.shape == r.shape and o.device == r.device
    value = sum(o.abs().sum() for o in outs)
    grads = torch.autograd.grad(value, xs, allow_unused=True)
    for g, x in zip(grads, xs):
        assert g is None or (g.shape == x.shape and g.device == x.device)


@pytest.mark.skipif(CUDA != "cuda", reason="LU without pivoting runs on CUDA only")
@pytest.mark.parametrize("shape", [(5, 5), (2, 6, 4), (4, 6)])
def test_cuda_lu_without_pivoting_matches_torch(shape):
    A = (randn(*shape, seed=60) + 3 * torch.eye(*shape[-2:], dtype=f64)).to(CUDA)
    W = randn(*shape, seed=61).to(CUDA)
    ours, theirs = agt.lu(A, pivot=False), torch.linalg.lu(A, pivot=False)
    assert ours.P.numel() == 0 and ours.P.shape == theirs.P.shape
    _close(ours.L, theirs.L, 1e-12, "L")
    _close(ours.U, theirs.U, 1e-12, "U")
    LU, pivots = agt.lu_factor(A, pivot=False)
    LU_t, pivots_t = torch.linalg.lu_factor(A, pivot=False)
    _close(LU, LU_t, 1e-12, "packed LU")
    assert torch.equal(pivots.cpu(), pivots_t.cpu())

    def loss(lu):
        def g(A):
            _, L, U = lu(A)
            return (L.sum(-1) * W[..., :, :1].squeeze(-1)).sum() + (U * U).sum()
        return g
    g_ours = torch.func.grad(loss(lambda A: agt.lu(A, pivot=False)))(A)
    g_torch = torch.func.grad(loss(lambda A: torch.linalg.lu(A, pivot=False)))(A)
    _close(g_ours, g_torch, 1e-10, "gradient")
    t_ours = torch.func.jvp(loss(lambda A: agt.lu(A, pivot=False)), (A,), (W,))[1]
    t_torch = torch.func.jvp(loss(lambda A: torch.linalg.lu(A, pivot=False)), (A,), (W,))[1]
    _close(t_ours, t_torch, 1e-10, "forward mode")


# ------------------------------------------------------------------ torch.func on the GPU
FUNC_CASES = [
    ("eigh", lambda A: (lambda w, V: (w ** 2).sum() + (projector(V) * torch.arange(16.0, dtype=f64, device=A.device
                                                                                  ).reshape(4, 4)).sum())(
        *agt.eigh(A))),
    ("svd", lambda A: (lambda U, S, Vh: (S ** 3).sum() + (U[:, :1] @ Vh[:1]).square().sum())(
        *agt.svd(A, full_matrices=False))),
    ("expm", lambda A: agt.expm(A).square().sum()),
    ("sqrtm", lambda A: agt.sqrtm(A @ A.mT + torch.eye(4, dtype=A.dtype, device=A.device)).sum()),
    ("cholesky", lambda A: agt.cholesky(A @ A.mT + torch.eye(4, dtype=A.dtype, device=A.device)).square().sum()),
    ("solve", lambda A: agt.solve(A + 4 * torch.eye(4, dtype=A.dtype, device=A.device),
                                  torch.ones(4, 2, dtype=A.dtype, device=A.device)).sum()),
]


@pytest.mark.parametrize("name, f", FUNC_CASES, ids=[c[0] for c in FUNC_CASES])
def test_cuda_torch_func_transforms(name, f):
    A = herm(4, 4, seed=40)
    E = herm(4, 4, seed=41)
    results = {}
    for device in ("cpu", CUDA):
        a, e = A.to(device), E.to(device)
        results[device] = {
            "grad": torch.func.grad(f)(a),
            "vmap(grad)": torch.func.vmap(torch.func.grad(f))(torch.stack([a, a + 0.1 * e])),
            "jvp": torch.func.jvp(f, (a,), (e,))[1],
            "jacrev": torch.func.jacrev(f)(a),
            "jacfwd": torch.func.jacfwd(f)(a),
            "hessian": torch.func.hessian(f)(a),
        }
    for key, cpu in results["cpu"].items():
        gpu = results[CUDA][key]
        assert gpu.device.type == CUDA, key
        _close(gpu, cpu, 1e-8, f"{name} {key}")


# ------------------------------------------------------------------ degenerate spectra on the GPU
def test_cuda_degeneracy_sweep():
    """benchmarks/sweep_degeneracy.py on the GPU: every solver, loss, gap and transform."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import sweep_degeneracy

    rows, failures, passed, total = sweep_degeneracy.run(
        seeds=(0,), modes=("autograd", "vmap(grad)", "jvp", "hvp"), device=CUDA)
    assert total > 500
    assert not failures, "\n".join(failures[:20])


def test_cuda_basis_dependent_losses_raise_at_lapack_bases():
    for A in (torch.zeros(4, 4, dtype=f64), torch.eye(4, dtype=f64), torch.diag(torch.tensor([1.0, 2, 2, 3],
                                                                                           dtype=f64))):
        A = A.to(CUDA).requires_grad_()
        w, V = agt.eigh(A)
        with pytest.raises(adjointgen.DegenerateSubspaceError):
            torch.autograd.grad(V[1, 1] ** 2, A)  # column 1 lies in a cluster of each A
        # an invariant loss at the same point is exact: d/dA sum(w^2) = 2 A
        w, V = agt.eigh(A)
        g, = torch.autograd.grad((w ** 2).sum(), A)
        _close(g, 2 * A, 1e-12, "sum(w^2) at a cluster")


def test_cuda_spectral_function_through_the_outputs_is_exact_at_a_cluster():
    A = torch.diag(torch.tensor([1.0, 1.0, 2.0], dtype=f64)).to(CUDA).requires_grad_()
    w, V = agt.eigh(A)
    X = (V * w.exp()) @ V.mT
    g, = torch.autograd.grad(X[0, 1], A)
    want, = torch.autograd.grad(agt.expm(A)[0, 1], A)
    # (along symmetric directions: eigh's gradient is the symmetric one)
    _close(g, (want + want.mT) / 2, 1e-10, "exp through the eigendecomposition")


def test_cuda_defective_eig_raises():
    A = torch.tensor([[1.0, 1.0], [0.0, 1.0]], dtype=f64, device=CUDA, requires_grad=True)
    w, V = agt.eig(A)
    with pytest.raises(adjointgen.DefectiveMatrixError):
        torch.autograd.grad(V.abs().sum(), A)


def test_cuda_eigsh_cut_cluster_raises():
    Q = torch.linalg.qr(randn(20, 20, seed=42))[0]
    w = torch.linspace(1, 5, 20, dtype=f64)
    w[-3:] = torch.tensor([7.0, 8.0, 8.0], dtype=f64)
    A = ((Q * w) @ Q.mT).to(CUDA).requires_grad_()
    with pytest.raises(adjointgen.GaugeDependentLossError):
        wk, V = agt.eigsh(A, 1)  # one of the two eigenvalues 8
        torch.autograd.grad(wk.sum() + V.square().sum(), A)


@pytest.mark.skipif(CUDA != "cuda", reason="a CUDA property")
def test_cuda_gauge_checks_off_make_no_host_sync():
    A = herm(64, 64, seed=43).to(CUDA).requires_grad_()
    w, V = agt.eigh(A)
    loss = (w ** 2).sum() + projector(V, 8).square().sum()
    with gauge.disabled():
        torch.cuda.set_sync_debug_mode("error")
        try:
            g, = torch.autograd.grad(loss, A)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(g).all()


# ------------------------------------------------------------------ clear errors on the GPU
BAD = [
    ("eigh NaN", lambda dev: agt.eigh(torch.full((3, 3), float("nan"), dtype=f64, device=dev))),
    ("eigh non-symmetric", lambda dev: agt.eigh(torch.arange(9.0, dtype=f64, device=dev).reshape(3, 3))),
    ("eigh(A, B) indefinite B", lambda dev: agt.eigh(torch.eye(3, dtype=f64, device=dev),
                                                     torch.diag(torch.tensor([1.0, -1.0, 1.0], dtype=f64,
                                                                             device=dev)))),
    ("cholesky indefinite", lambda dev: agt.cholesky(torch.diag(torch.tensor([1.0, -1.0], dtype=f64, device=dev)))),
    ("solve shape", lambda dev: agt.solve(torch.eye(3, dtype=f64, device=dev), torch.ones(4, dtype=f64, device=dev))),
    ("svds k too large", lambda dev: agt.svds(torch.ones(4, 3, dtype=f64, device=dev), 5)),
    ("inv singular", lambda dev: agt.inv(torch.zeros(3, 3, dtype=f64, device=dev))),
]


@pytest.mark.parametrize("name, call", BAD, ids=[b[0] for b in BAD])
def test_cuda_bad_input_raises_the_cpu_error(name, call):
    """The same exception class on the GPU as on the CPU."""
    with pytest.raises(Exception) as on_cpu:
        call("cpu")
    with pytest.raises(Exception) as on_gpu:
        call(CUDA)
    assert type(on_gpu.value) is type(on_cpu.value), (on_gpu.value, on_cpu.value)


@pytest.mark.parametrize("name, call", BAD, ids=[b[0] for b in BAD])
def test_cuda_bad_input_raises_the_cpu_error_when_deferred(name, call):
    """Deferred (the GPU's default), a value check raises the CPU's error at raise_deferred (a shape
    error, which needs no value, at once)."""
    with pytest.raises(Exception) as on_cpu:
        call("cpu")
    with verdict.checking("deferred"):
        try:
            call(CUDA)
        except Exception as exc:  # an error that needs no value: at once
            assert type(exc) is type(on_cpu.value), (exc, on_cpu.value)
            return
        with pytest.raises(Exception) as late:
            verdict.raise_deferred()
    assert type(late.value) is type(on_cpu.value), (late.value, on_cpu.value)


@pytest.mark.skipif(CUDA != "cuda", reason="a CUDA property")
def test_cuda_deferred_checks_synchronise_no_more_than_torch():
    """Forward + backward of the dense operations on the GPU with the default (deferred) checks: no
    more synchronisations than torch's own function (counted by torch's sync debug mode)."""
    import warnings

    sys.path.insert(0, str(ROOT / "tests"))
    from host_reads import cases, step

    counts = {}
    for name, (get, A, loss) in cases(5).items():
        for label, namespace in (("torch", torch.linalg), ("ours", agt)):
            A_ = A.to(CUDA)
            with verdict.checking("auto"):
                step(get(namespace), A_, loss)  # warm
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    torch.cuda.set_sync_debug_mode("warn")
                    try:
                        step(get(namespace), A_, loss)
                    finally:
                        torch.cuda.set_sync_debug_mode("default")
            counts[name, label] = sum("synchroniz" in str(w.message) for w in caught)
        verdict.raise_deferred()
    worse = {name: (counts[name, "ours"], counts[name, "torch"]) for name, _ in counts
             if counts[name, "ours"] > counts[name, "torch"]}
    assert not worse, worse


# ------------------------------------------------------------------ the CuPy rules on the GPU
def _derivations():
    return sorted(p.stem for p in (ROOT / "derivations").glob("*.py") if not p.stem.startswith("_"))


@pytest.mark.parametrize("name", _derivations())
def test_cupy_rules_match_numpy_on_every_audit_instance(name):
    """Every generated CuPy rule function of ``derivations/<name>.py``, called with the audit's own
    numeric instances as NumPy and as CuPy arrays: the same result."""
    cp = pytest.importorskip("cupy")
    import importlib

    from adjointgen.audit.runner import instances
    from adjointgen.codegen import generate as gen

    try:
        module = importlib.import_module(f"adjointgen.generated.cupy.{name}")
    except ImportError:
        pytest.skip(f"{name} has no CuPy module")
    d = gen.load_derivation(ROOT, name)
    called = 0
    for ctx in instances(d):
        env = dict(ctx.env)
        for symbol, api in d.api_names.items():  # the rule functions' names (a diagonal as a vector)
            for prefix in ("", "g", "d"):
                if prefix + symbol in env:
                    value = env[prefix + symbol]
                    if symbol in d.structure.diagonal | d.structure.complex_diagonal:
                        value = np.diagonal(value, axis1=-2, axis2=-1).copy()
                    env[prefix + api] = value
        is_complex = any(np.iscomplexobj(v) for v in env.values() if isinstance(v, np.ndarray))
        for fname, fn in vars(module).items():
            if not callable(fn) or not fname.startswith(name + "_") or not fname.endswith(("_jvp", "_vjp",
                                                                                           "_jvp_complex",
                                                                                           "_vjp_complex")):
                continue
            complex_rule = fname.endswith("_complex") or not hasattr(module, fname + "_complex")
            if (complex_rule if is_complex else not fname.endswith("_complex")) is False:
                continue  # complex instances take the complex rules (an only set of rules is one)
            params = [p for p in inspect.signature(fn).parameters.values() if p.default is inspect.Parameter.empty]
            if not all(p.name in env and isinstance(env[p.name], np.ndarray) for p in params):
                continue
            args = [np.asarray(env[p.name]) for p in params]
            want = fn(*args)
            got = fn(*[cp.asarray(a) for a in args])
            for w, g in zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)):
                assert isinstance(g, cp.ndarray) or np.ndim(g) == 0, fname
                np.testing.assert_allclose(cp.asnumpy(g), w, rtol=1e-9, atol=1e-9 * max(1.0, float(np.abs(w).max())),
                                           err_msg=fname)
            called += 1
    if called == 0:
        pytest.skip(f"no rule of {name} takes only the audit's named arrays")


# ------------------------------------------------------------------ JAX on the GPU
@pytest.fixture
def jax_gpu():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    if CUDA == "cpu":
        return jax, jax.devices("cpu")[0]
    try:
        return jax, jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX has no GPU backend here")


JAX_CASES = [
    ("eigh", lambda agj, jnp, A: (lambda w, V: (w ** 2).sum() + ((V[:, :2] @ V[:, :2].T) ** 2).sum())(*agj.eigh(A))),
    ("eigh(A, B)", lambda agj, jnp, A: (lambda w, V: (w ** 2).sum())(
        *agj.eigh_generalized(A, A @ A.T + jnp.eye(A.shape[0])))),
    ("svd", lambda agj, jnp, A: (lambda U, S, Vh: (S ** 3).sum())(*agj.svd(A))),
    ("eigsh", lambda agj, jnp, A: (lambda w, V: (w ** 2).sum() + ((V @ V.T) ** 2).sum())(*agj.eigsh(A, 2))),
    ("expm", lambda agj, jnp, A: (agj.expm(A) ** 2).sum()),
    ("cholesky", lambda agj, jnp, A: (agj.cholesky(A @ A.T + jnp.eye(A.shape[0])) ** 2).sum()),
    ("pinv", lambda agj, jnp, A: (agj.pinv(A) ** 2).sum()),
]


@pytest.mark.parametrize("name, f", JAX_CASES, ids=[c[0] for c in JAX_CASES])
def test_jax_on_gpu_matches_cpu_under_jit(jax_gpu, name, f):
    jax, gpu = jax_gpu
    import jax.numpy as jnp

    import adjointgen.jax as agj

    A = np.asarray(herm(6, 6, seed=50))
    loss = lambda A: f(agj, jnp, A)  # noqa: E731
    cpu = jax.devices("cpu")[0]
    g_cpu = jax.jit(jax.grad(loss))(jax.device_put(A, cpu))
    g_gpu = jax.jit(jax.grad(loss))(jax.device_put(A, gpu))
    assert list(g_gpu.devices())[0] == gpu
    np.testing.assert_allclose(np.asarray(g_gpu), np.asarray(g_cpu), rtol=1e-8, atol=1e-9)

"""Matrix functions f(A) of symmetric (Hermitian) A: derivations/funm.py, its generated pieces
(torch, NumPy, CUDA host harness) and adjointgen.runtime.spectral."""
import subprocess

import mpmath as mp
import numpy as np
import pytest
import sympy as sp
import torch

import adjointgen.testing as agtest
import adjointgen.torch as agt
from adjointgen.codegen import generate as gen
from adjointgen.generated.cupy import funm as cfunm
from adjointgen.generated.torch import funm as tfunm
from toolchain import nvcc_path

mp.mp.dps = 50
x = sp.Symbol("x", real=True)
ROOT = gen.find_root(__file__)

#: (name of the generated function, options, mpmath f) -- the issue's list: exp, log, sqrt, p = 0.5, 1.5, -1
CASES = [("expm", (), mp.exp), ("logm", (), mp.log), ("sqrtm", (), mp.sqrt),
         ("powm", (0.5,), lambda t: t ** mp.mpf(0.5)), ("powm", (1.5,), lambda t: t ** mp.mpf(1.5)),
         ("powm", (-1.0,), lambda t: 1 / t)]
GAPS = [10.0 ** -k for k in range(16)] + [0.0]
BASES = [0.3, 1.0, 7.5, 40.0]


def reference_dd(f, a, b):
    a, b = mp.mpf(a), mp.mpf(b)
    return mp.diff(f, a) if a == b else (f(a) - f(b)) / (a - b)


def reference_dd2(f, a, b, c):
    a, b, c = sorted(mp.mpf(v) for v in (a, b, c))
    if a == c:
        return mp.diff(f, a, 2) / 2
    return (reference_dd(f, c, b) - reference_dd(f, b, a)) / (c - a)


def table():
    pairs = [(a, a * (1 + g)) for a in BASES for g in GAPS]
    return np.array([p for p, _ in pairs]), np.array([q for _, q in pairs])


def symmetric(n, *batch, dtype=torch.float64, seed=0, spectrum=None):
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(*batch, n, n, dtype=torch.float64, generator=g))
    w = spectrum if spectrum is not None else torch.linspace(0.5, 2.5, n, dtype=torch.float64)
    A = (Q * w.unsqueeze(-2)) @ Q.mT
    return ((A + A.mT) / 2).to(dtype)


def rel_err(got, want):
    return max(float(abs(mp.mpf(float(g)) - w) / abs(w)) for g, w in zip(got, want))


# ------------------------------------------------------------------ L against 50 digits
@pytest.mark.parametrize("name,opts,f", CASES, ids=[f"{n}{o}" for n, o, _ in CASES])
def test_divided_differences_match_mpmath_for_every_gap(name, opts, f):
    a, b = table()
    want = [reference_dd(f, p, q) for p, q in zip(a, b)]
    got_torch = getattr(tfunm, f"{name}_dd")(torch.from_numpy(a), torch.from_numpy(b), *opts).numpy()
    got_numpy = getattr(cfunm, f"{name}_dd")(np, a, b, *opts)
    assert rel_err(got_torch, want) <= 1e-13
    assert rel_err(got_numpy, want) <= 1e-13
    # the matrix of them, also at exactly equal eigenvalues (its diagonal is f')
    w = torch.tensor([a[0], a[0], b[5], 2.0], dtype=torch.float64)
    L = getattr(tfunm, f"{name}_L")(w, *opts)
    Lref = [[reference_dd(f, p, q) for q in w.tolist()] for p in w.tolist()]
    assert rel_err(L.flatten().tolist(), sum(Lref, [])) <= 1e-13


@pytest.mark.parametrize("name,opts,f", CASES, ids=[f"{n}{o}" for n, o, _ in CASES])
def test_second_divided_differences_match_mpmath(name, opts, f):
    rows = []
    for a in (0.3, 1.0, 7.5):
        for g in [10.0 ** -k for k in range(0, 16, 3)] + [0.0]:
            rows += [(a, a * (1 + g), a * (1 + 2 * g)), (a, a, a * (1 + g)), (a * (1 + g), a, a * (1 - g / 3))]
    rows = np.array(rows)
    want = [reference_dd2(f, *r) for r in rows]
    t = torch.from_numpy(rows)
    got = getattr(tfunm, f"{name}_dd2")(t[:, 0], t[:, 1], t[:, 2], *opts).numpy()
    # the second-order rule's accuracy: a few hundred ulps near the switch between the forms
    assert rel_err(got, want) <= 1e-11


def test_power_forms_near_zero_eigenvalues():
    # a ratio a/b in (0, 1] (the smaller argument over the larger): no NaN from log1p(s/b) at b = 0
    a, b = torch.tensor([0.0, 1e-300, 2.0]), torch.tensor([2.0, 3.0, 0.0])
    got = tfunm.powm_dd(a.double(), b.double(), 0.5)
    want = [reference_dd(lambda t: t ** mp.mpf(0.5), p, q) for p, q in zip(a.tolist(), b.tolist())]
    assert rel_err(got.tolist(), want) <= 1e-13


# ------------------------------------------------------------------ values and first derivatives
def test_expm_value_and_gradient_match_matrix_exp():
    A = symmetric(6, spectrum=torch.tensor([-2.0, -0.5, 0.1, 0.1, 1.0, 3.0], dtype=torch.float64))
    G = torch.randn(6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    A1, A2 = A.clone().requires_grad_(), A.clone().requires_grad_()
    X1, X2 = agt.expm(A1), torch.linalg.matrix_exp(A2)
    torch.testing.assert_close(X1, X2, rtol=0, atol=1e-12)
    (g1,), (g2,) = torch.autograd.grad(X1, A1, G), torch.autograd.grad(X2, A2, G)
    # expm is the general exponential: its gradient at a symmetric A is matrix_exp's, not projected
    assert (g1 - g2).abs().max() <= 1e-10 * g2.abs().max()


@pytest.mark.parametrize("fn", [agt.expm, agt.logm, agt.sqrtm, lambda A: agt.powm(A, 1.5),
                                lambda A: agt.powm(A, -1), lambda A: agt.funm(A, sp.atan(x))],
                         ids=["expm", "logm", "sqrtm", "powm1.5", "powm-1", "funm_atan"])
def test_gradients_against_finite_differences(fn):
    A = symmetric(4, seed=1).requires_grad_()
    assert agtest.gradcheck(fn, (A,), check_forward_ad=True)


def test_values_of_the_catalogue():
    A = symmetric(5, seed=2)
    w, V = torch.linalg.eigh(A)
    for fn, f in [(agt.logm, torch.log), (agt.sqrtm, torch.sqrt), (lambda a: agt.powm(a, 0.7), lambda t: t ** 0.7)]:
        torch.testing.assert_close(fn(A), (V * f(w)) @ V.mT, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(agt.sqrtm(A) @ agt.sqrtm(A), A, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(agt.expm(agt.logm(A)), A, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(agt.powm(A, -1), torch.linalg.inv(A), rtol=1e-12, atol=1e-12)
    M = symmetric(5, seed=3, spectrum=torch.tensor([-3.0, -1.0, 0.0, 1.0, 2.0], dtype=torch.float64))
    torch.testing.assert_close(agt.powm(M, 3), M @ M @ M, rtol=1e-12, atol=1e-12)  # integer p: any sign


# ------------------------------------------------------------------ repeated eigenvalues, second order
@pytest.mark.parametrize("name", ["expm", "logm", "sqrtm", "powm", "funm"])
def test_exactly_repeated_eigenvalues_gradcheck_and_gradgradcheck(name):
    A = symmetric(4, seed=4, spectrum=torch.tensor([1.0, 1.0, 1.0, 2.5], dtype=torch.float64))
    fn = {"expm": agt.expm, "logm": agt.logm, "sqrtm": agt.sqrtm, "powm": lambda a: agt.powm(a, 1.5),
          "funm": lambda a: agt.funm(a, sp.sin(x) ** 2)}[name]
    w = torch.linalg.eigvalsh(A)
    assert (w[1] - w[0]).abs() < 1e-14  # the test is at an exact repetition (to rounding)
    A = A.requires_grad_()
    assert agtest.gradcheck(fn, (A,), check_forward_ad=True)
    assert agtest.gradgradcheck(fn, (A,))
    assert torch.autograd.gradgradcheck(lambda a: fn(agtest.symmetrize(a)), (A,))
    B = torch.eye(3, dtype=torch.float64).requires_grad_()  # every eigenvalue equal
    assert agtest.gradgradcheck(fn, (B,))


def test_hessian_matches_matrix_exp_at_the_identity():
    A = torch.eye(3, dtype=torch.float64)
    H1 = torch.func.hessian(lambda a: agt.expm(agtest.symmetrize(a)).square().sum())(A)
    H2 = torch.func.hessian(lambda a: torch.linalg.matrix_exp(agtest.symmetrize(a)).square().sum())(A)
    torch.testing.assert_close(H1, H2, rtol=1e-10, atol=1e-10)
    H3 = torch.func.jacfwd(torch.func.jacrev(lambda a: agt.expm(agtest.symmetrize(a)).square().sum()))(A)
    torch.testing.assert_close(H3, H2, rtol=1e-10, atol=1e-10)


def test_third_derivatives_raise():
    A = symmetric(3).requires_grad_()
    (g,) = torch.autograd.grad(agt.expm(A).sum(), A, create_graph=True)
    (h,) = torch.autograd.grad(g.square().sum(), A, create_graph=True)
    with pytest.raises(NotImplementedError, match="third derivatives"):
        torch.autograd.grad(h.sum(), A)


# ------------------------------------------------------------------ dtypes, batches, transforms
def test_batches_float32_complex_empty_and_vmap():
    A = symmetric(4, 2, 3, seed=5)
    X = agt.expm(A)
    assert X.shape == (2, 3, 4, 4)
    torch.testing.assert_close(X, torch.linalg.matrix_exp(A), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.vmap(agt.expm)(A.flatten(0, 1)), X.flatten(0, 1))
    X32 = agt.sqrtm(A.float())
    assert X32.dtype == torch.float32
    torch.testing.assert_close(X32 @ X32, A.float(), rtol=1e-4, atol=1e-4)
    Z = torch.randn(4, 4, dtype=torch.complex128, generator=torch.Generator().manual_seed(6))
    Z = Z @ Z.mH + torch.eye(4)
    torch.testing.assert_close(agt.expm(Z), torch.linalg.matrix_exp(Z), rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(agt.sqrtm(Z) @ agt.sqrtm(Z), Z, rtol=1e-12, atol=1e-12)
    Zr = Z.clone().requires_grad_()
    assert agtest.gradcheck(agt.logm, (Zr,), check_forward_ad=True)
    assert agtest.gradgradcheck(agt.logm, (Zr,))
    assert agt.expm(torch.zeros(0, 3, 3, dtype=torch.float64)).shape == (0, 3, 3)
    assert agt.logm(torch.zeros(2, 0, 0)).shape == (2, 0, 0)
    gA = torch.func.grad(lambda a: agt.expm(a).trace())(A[0, 0])
    torch.testing.assert_close(gA, agt.expm(A[0, 0]))  # d tr exp(A) = exp(A)
    _, t = torch.func.jvp(agt.expm, (A[0, 0],), (torch.eye(4, dtype=torch.float64),))
    torch.testing.assert_close(t, X[0, 0])  # d exp(A)[I] = exp(A)


# ------------------------------------------------------------------ errors
def test_domain_errors_name_the_eigenvalue():
    A = symmetric(3, spectrum=torch.tensor([-0.25, 1.0, 2.0], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"logm: A has the eigenvalue -0.25 \(index 0\).*positive definite"):
        agt.logm(A)
    with pytest.raises(ValueError, match=r"sqrtm: A has the eigenvalue -0.25.*positive semidefinite"):
        agt.sqrtm(A)
    with pytest.raises(ValueError, match=r"eigenvalue -0.25.*x\*\*p"):
        agt.powm(A, 0.5)
    B = symmetric(3, 2, spectrum=torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64))
    agt.sqrtm(B)  # positive semidefinite: fine
    with pytest.raises(ValueError, match=r"sqrtm: A has the eigenvalue .*sqrt\(x\) is not differentiable"):
        torch.autograd.grad(agt.sqrtm(B.requires_grad_()).sum(), B)
    N = torch.randn(3, 3, dtype=torch.float64)  # not symmetric: the general exponential (matrix_exp)
    torch.testing.assert_close(agt.expm(N), torch.linalg.matrix_exp(N))
    with pytest.raises(ValueError):
        agt.expm(torch.full((3, 3), float("nan")))
    with pytest.raises(TypeError, match="p must be a real number"):
        agt.powm(symmetric(3), torch.tensor(0.5))
    with pytest.raises(ValueError, match="one variable"):
        agt.funm(symmetric(3), sp.Symbol("a") * sp.Symbol("b"))
    with pytest.raises(TypeError, match="unknown function name"):
        agt.funm(symmetric(3), "tanm")


def test_sqrtm_of_a_singular_psd_matrix_snaps_rounding_negatives():
    v = torch.randn(5, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    P = v @ v.mT  # rank 2: eigenvalues within rounding of 0 may come out negative
    R = agt.sqrtm(P)
    torch.testing.assert_close(R @ R, P, rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------------ NumPy backend and kernels
def test_numpy_functions_and_rules():
    A = symmetric(4, seed=8).numpy()
    w, V = np.linalg.eigh(A)
    np.testing.assert_allclose(cfunm.expm(A), torch.linalg.matrix_exp(torch.from_numpy(A)).numpy(), atol=1e-12)
    G = np.random.default_rng(0).standard_normal((4, 4))
    gA = cfunm.funm_vjp(V, G, cfunm.expm_L(np, w))
    At = torch.from_numpy(A).requires_grad_()
    (want,) = torch.autograd.grad(agt.funm(At, "exp"), At, torch.from_numpy(G))
    np.testing.assert_allclose(gA, want.numpy(), atol=1e-12)
    # along unstructured directions (the general exponential at a symmetric A): not projected
    gA = cfunm.funm_vjp_general(V, G, cfunm.expm_L(np, w))
    (want,) = torch.autograd.grad(agt.expm(At), At, torch.from_numpy(G))
    np.testing.assert_allclose(gA, want.numpy(), atol=1e-12)
    with pytest.raises(ValueError, match="eigenvalue"):
        cfunm.logm(-A)


def test_the_kernels_per_element_math_in_a_host_harness(tmp_path):
    nvcc = nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc not installed")
    cu = ROOT / "generated" / "cuda" / "funm.cu"
    cases = [(n, o) for n, o, _ in CASES]
    calls = "\n".join(
        f"    if (which == {i}) {{ d = {n}_dd<double>(a, b{''.join(f', {v}' for v in o)}); "
        f"f = (double){n}_dd<float>((float)a, (float)b{''.join(f', {v}f' for v in o)}); }}"
        for i, (n, o) in enumerate(cases))
    (tmp_path / "h.cu").write_text(f"""#include <cstdio>
#include <cstdlib>
#include <cmath>
#include "{cu}"
int main(int argc, char** argv) {{
    int which = atoi(argv[1]);
    double a, b, c;
    while (scanf("%lf %lf %lf", &a, &b, &c) == 3) {{
        double d = 0, f = 0, t = 0;
{calls}
        printf("%.17g %.17g %.17g\\n", d, f, t);
    }}
    return 0;
}}
""")
    exe = tmp_path / "h"
    from adjointgen.runtime.xp import cuda_include_dir

    r = subprocess.run([nvcc, "-x", "cu", f"-I{cuda_include_dir()}", str(tmp_path / "h.cu"), "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    a, b = table()
    c = a * (1 + 1e-3)
    stdin = "\n".join(f"{float(p)!r} {float(q)!r} {float(s)!r}" for p, q, s in zip(a, b, c))
    for i, (name, opts, f) in enumerate(CASES):
        out = subprocess.run([str(exe), str(i)], input=stdin, capture_output=True, text=True, check=True).stdout
        got = np.array([[float(v) for v in line.split()] for line in out.splitlines()])
        assert rel_err(got[:, 0], [reference_dd(f, p, q) for p, q in zip(a, b)]) <= 1e-13, name
        # float32: the same forms, a few float ulps (of float-rounded arguments)
        f32 = [reference_dd(f, float(np.float32(p)), float(np.float32(q))) for p, q in zip(a, b)]
        assert rel_err(got[:, 1], f32) <= 2e-6, name


# ------------------------------------------------------------------ the derivation
def test_the_derivation_is_generic_in_f_and_audited_on_several_functions():
    from adjointgen.audit import audit

    d = gen.load_derivation(ROOT, "funm")
    report = audit(d)
    assert report.passed, [(s.index, s.kind, s.label, s.residual, s.tolerance, s.symbolic, s.note)
                           for s in report.steps if not s.passed]
    assert {s.kind for s in report.steps} >= {"hadamard_split", "second_order", "transpose"}
    functions = {str(c.env["__functions__"]["f"]) for c in __import__("adjointgen.audit.runner", fromlist=["x"]).instances(d)}
    assert len(functions) >= 5
    assert sorted(d.instantiations) == ["expm", "logm", "powm", "sqrtm"]

"""Matrix functions of any f (issue 17): scalar programs, their divided differences against mpmath,
the reported wrong answers, every transform, errors, compile time and the disk cache."""
import math
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import sympy as sp
import torch

import adjointgen.torch as agt
from adjointgen import divided_reference as ref
from adjointgen.codegen.printers import program_cuda_dd
from adjointgen.codegen.scalar import compile_cached, compile_function
from adjointgen.runtime import divided
from adjointgen.runtime.divided import AccuracyWarning, ScalarProgram
from toolchain import nvcc_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import sweep_funm  # noqa: E402

x = sp.Symbol("x", real=True)
f64 = torch.float64


def diag(*v, dtype=f64):
    return torch.diag(torch.tensor(v, dtype=dtype))


def rotated(w, seed=0, dtype=f64):
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(len(w), len(w), dtype=f64, generator=g))
    A = (Q * torch.tensor(w, dtype=f64)) @ Q.mT
    return ((A + A.mT) / 2).to(dtype)


def grad(fn, A, G=None):
    A = A.clone().requires_grad_()
    out = fn(A)
    (g,) = torch.autograd.grad(out, A, torch.ones_like(out) if G is None else G)
    return g


def reference_grad(f, A, G):
    """``V (L ∘ (V^H sym(G) V)) V^H`` with ``L`` from 340-digit mpmath (Daleckii–Krein)."""
    w, V = torch.linalg.eigh(A)
    wl = w.tolist()
    L = torch.tensor([[float(ref.reference(f, (a, b))) for b in wl] for a in wl], dtype=f64)
    Gs = (G + G.mH) / 2
    return V @ (L.to(V.dtype) * (V.mH @ Gs @ V)) @ V.mH


# ------------------------------------------------------------------ the sweep (a quick pass; the
# full one is benchmarks/sweep_funm.py)
@pytest.mark.parametrize("row", sweep_funm.FUNCTIONS, ids=[r[1] for r in sweep_funm.FUNCTIONS])
def test_divided_differences_against_mpmath(row):
    _, name, f, pairs, triples = row
    for order, pts in ((1, sweep_funm.pairs(pairs, True)), (2, sweep_funm.triples(triples, True))):
        _, worst_norm, n, where, _ = sweep_funm.measure(f, pts, order)
        assert worst_norm <= 1, f"{name}, order {order}: {where}"
    _, worst_norm, n, where, _ = sweep_funm.measure(f, sweep_funm.pairs(pairs[:4], True), 1, torch.float32)
    assert worst_norm <= 1, f"{name} float32: {where}"


# ------------------------------------------------------------------ the reported wrong answers
def test_taylor_far_from_its_radius_cos_at_1000():
    G = torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=f64)
    g = grad(lambda A: agt.funm(A, sp.cos(x)), diag(1000, 1040), G)
    want = (math.cos(1000) - math.cos(1040)) / -40
    assert abs(float(g[0, 1] + g[1, 0]) - want) <= 1e-13 * abs(want)


@pytest.mark.parametrize("f,points", [
    (x * sp.log(x), (1e-3, 0.05)), (sp.log(x + 5), (-5 + 1e-3, -5 + 2e-3)), (sp.sqrt(x - 1), (1 + 1e-9, 1 + 3e-9)),
    ((x - 1) ** sp.Rational(1, 3), (1 + 1e-6, 1.01)), (sp.cos(x), (300.0, 306.0)), (sp.log(x - 1), (1 + 1e-9, 1 + 2e-9)),
])
def test_divided_differences_of_the_report(f, points):
    got = float(divided.first(compile_cached(f), torch.tensor(points[0], dtype=f64), torch.tensor(points[1], dtype=f64)))
    assert ref.relative_error(got, ref.reference(f, points)) <= 1e-13


@pytest.mark.parametrize("fn,A,want", [
    (lambda A: agt.powm(A, 1.5), diag(0, 1), [[0.0, 1.0], [1.0, 1.5]]),
    (lambda A: agt.powm(A, 2.5), torch.full((2, 2), 0.5, dtype=f64), [[2.5, 2.5], [2.5, 2.5]]),
    (lambda A: agt.funm(A, x ** sp.Rational(5, 2) + x), diag(0, 1), [[1.0, 2.0], [2.0, 3.5]]),
    (lambda A: agt.funm(A, x ** sp.Rational(3, 2) * sp.exp(x)), diag(0, 1), [[0.0, math.e], [math.e, 2.5 * math.e]]),
], ids=["powm1.5", "powm2.5-projector", "x^(5/2)+x", "x^(3/2)exp(x)"])
def test_powers_at_a_zero_eigenvalue_have_their_limits(fn, A, want):
    torch.testing.assert_close(grad(fn, A), torch.tensor(want, dtype=f64), rtol=1e-14, atol=1e-14)


def test_no_overflow_in_the_heat_kernel_and_large_values():
    G = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=f64)
    g = grad(agt.expm, diag(0, -2000), G)
    torch.testing.assert_close(g, -math.expm1(-2000) / 2000 * G, rtol=1e-15, atol=0)
    X = agt.expm(diag(800, 1))
    assert torch.equal(X, diag(math.inf, math.e).nan_to_num(nan=0.0, posinf=math.inf))  # as torch: [[inf, 0], [0, e]]
    assert torch.equal(torch.linalg.matrix_exp(diag(800, 1)).isinf(), X.isinf())
    # an infinite eigenvalue reaches only the entries its eigenvector touches, in the backward too
    g = grad(agt.expm, diag(800, 1), diag(0, 1))
    torch.testing.assert_close(g, diag(0, math.e), rtol=1e-15, atol=0)
    Y = agt.funm(diag(750, 1), sp.log(1 + sp.exp(x)))
    torch.testing.assert_close(Y.diagonal(), torch.tensor([750.0, math.log1p(math.e)], dtype=f64), rtol=1e-15, atol=0)
    g = grad(lambda A: agt.powm(A, 1.5), diag(1e-300, 1, 1e150), torch.eye(3, dtype=f64))
    torch.testing.assert_close(g.diagonal(), torch.tensor([1.5e-150, 1.5, 1.5e75], dtype=f64), rtol=1e-14, atol=0)
    # (with 1e200 LAPACK scales the matrix and 1e-300 comes out as 0: f' = 0 there, still finite)
    assert torch.isfinite(grad(lambda A: agt.powm(A, 1.5), diag(1e-300, 1, 1e200))).all()


@pytest.mark.parametrize("f", [sp.tan(x), sp.sec(x), sp.cot(x), sp.erf(x), sp.Abs(x), sp.sign(x), sp.Max(x, 0),
                               sp.Heaviside(x), sp.gamma(x), sp.loggamma(x), sp.besselj(0, x), sp.sin(x) / x,
                               sp.Piecewise((x ** 2, x < 0.5), (x, True)), sp.tanh(sp.tanh(sp.tanh(x))),
                               sp.atan(1000 * x), sp.log(1 + sp.exp(x)), x * sp.log(x), sp.Integer(3) + 0 * x],
                         ids=str)
@pytest.mark.parametrize("complex_", [False, True], ids=["real", "complex"])
def test_gradients_of_many_functions_against_mpmath(f, complex_):
    w = [0.2, 0.35, 0.35 + 1e-9, 0.7, 1.1]  # a near-repeated pair, away from every singularity
    A = rotated(w, seed=3)
    G = torch.randn(5, 5, dtype=f64, generator=torch.Generator().manual_seed(4))
    if complex_:
        U = torch.linalg.qr(torch.randn(5, 5, dtype=torch.complex128, generator=torch.Generator().manual_seed(5)))[0]
        A = U @ torch.diag(torch.tensor(w, dtype=torch.complex128)) @ U.mH
        A = (A + A.mH) / 2
        G = G.to(torch.complex128) + 1j * G.mT
    g = grad(lambda a: agt.funm(a, f), A, G)
    want = reference_grad(f, A, G)
    assert (g - want).abs().max() <= 1e-12 * max(1.0, want.abs().max())


def test_constant_and_linear_functions_and_integer_powers():
    A = rotated([-1.0, 0.5, 2.0])
    torch.testing.assert_close(agt.funm(A, sp.Integer(3)), 3 * torch.eye(3, dtype=f64))
    assert torch.equal(grad(lambda a: agt.funm(a, sp.Integer(3) + 0 * x), A), torch.zeros(3, 3, dtype=f64))
    torch.testing.assert_close(agt.powm(A, 0), torch.eye(3, dtype=f64), rtol=0, atol=1e-15)
    torch.testing.assert_close(agt.powm(A, 3), A @ A @ A, rtol=1e-13, atol=1e-13)  # negative eigenvalues: integer p
    for p in (20, 200):
        t = time.perf_counter()
        got = agt.powm(diag(0.5, 1.0, 1.001), p)
        assert time.perf_counter() - t < 2
        torch.testing.assert_close(got.diagonal(), torch.tensor([0.5, 1.0, 1.001], dtype=f64) ** p, rtol=1e-13, atol=0)
    assert torch.equal(agt.powm(diag(0.5, 1.0), 1e20), diag(0.0, 1.0))
    # second derivatives of f with constant divided differences (Python numbers before)
    S = torch.randn(3, 3, dtype=f64, generator=torch.Generator().manual_seed(1))
    H = (S + S.mT) / 2
    for f, h in [(x, lambda a: a.sum()), (x ** 2, lambda a: (a @ a).sum()), (2 * x + 1, lambda a: (2 * a).sum())]:
        sym = lambda a, h=h: h((a + a.mT) / 2)  # noqa: E731
        ours = torch.func.jvp(torch.func.grad(lambda a: agt.funm(a, f).sum()), (A,), (H,))[1]
        want = torch.func.jvp(torch.func.grad(sym), (A,), (H,))[1]
        torch.testing.assert_close(ours, want, rtol=1e-12, atol=1e-12)
    for p in (1, 2):
        assert torch.isfinite(torch.func.hessian(lambda a: agt.powm(a, p).square().sum())(A)).all()


def test_removable_singularity_and_exact_eigenvalues():
    g = grad(lambda A: agt.funm(A, sp.sin(x) / x), diag(0.0, 0.7), torch.eye(2, dtype=f64))
    torch.testing.assert_close(g.diagonal(), torch.tensor([0.0, float(ref.reference(sp.sinc(x), (0.7, 0.7)))],
                                                          dtype=f64), rtol=1e-14, atol=1e-15)
    # an exactly diagonal matrix has exact eigenvalues: no rounding margin for log's derivative
    g = grad(agt.logm, diag(1e-300, 1.0), torch.eye(2, dtype=f64))
    torch.testing.assert_close(g.diagonal(), torch.tensor([1e300, 1.0], dtype=f64), rtol=1e-15, atol=0)
    # the entropy of a rank-deficient density matrix: x log x is 0 at 0; its derivative is not finite there
    P = rotated([0.0, 0.25, 0.75])
    assert abs(float(agt.funm(P, -x * sp.log(x)).trace()) - (-0.25 * math.log(0.25) - 0.75 * math.log(0.75))) < 1e-14
    with pytest.raises(ValueError, match="is not differentiable"):
        grad(lambda a: agt.funm(a, x * sp.log(x)), P)
    # sqrt of a singular (rotated) PSD matrix: the zero eigenvalue is only zero to rounding
    with pytest.raises(ValueError, match=r"sqrt\(x\) is not differentiable \(to rounding\)"):
        grad(agt.sqrtm, rotated([0.0, 1.0, 2.0]))


# ------------------------------------------------------------------ every transform
@pytest.mark.parametrize("fn", [agt.logm, agt.sqrtm, lambda A: agt.powm(A, 0.5), lambda A: agt.funm(A, sp.log(x) ** 2)],
                         ids=["logm", "sqrtm", "powm", "funm"])
def test_transforms_with_domain_checks(fn):
    A = torch.stack([rotated([0.5, 1.0, 2.0], seed=s) for s in range(3)])
    looped = torch.stack([fn(a) for a in A])
    torch.testing.assert_close(torch.func.vmap(fn)(A), looped, rtol=1e-13, atol=1e-13)
    loss = lambda a: fn(a).square().sum()  # noqa: E731
    g = torch.func.vmap(torch.func.grad(loss))(A)
    torch.testing.assert_close(g, torch.stack([torch.func.grad(loss)(a) for a in A]), rtol=1e-12, atol=1e-12)
    J1 = torch.func.jacrev(fn)(A[0])
    J2 = torch.func.jacfwd(fn)(A[0])
    torch.testing.assert_close(J1, J2, rtol=1e-11, atol=1e-11)
    H = torch.func.hessian(loss)(A[0])
    assert H.shape == (3, 3, 3, 3) and torch.isfinite(H).all()
    with pytest.raises(ValueError, match="eigenvalue"):
        torch.func.vmap(fn)(-A)
    with pytest.raises(ValueError, match="eigenvalue"):
        torch.func.vmap(torch.func.grad(loss))(-A)


def test_float32_and_empty_batches():
    A = rotated([0.5, 1.0, 1.0 + 1e-4, 2.0], seed=2)
    for f in (sp.log(1 + sp.exp(x)), sp.erf(x), x * sp.log(x)):
        g32 = grad(lambda a: agt.funm(a, f), A.float())
        g64 = grad(lambda a: agt.funm(a, f), A)
        assert g32.dtype == torch.float32
        assert (g32.double() - g64).abs().max() <= 1e-5 * g64.abs().max()
    E = torch.empty(0, 3, 3, dtype=f64)
    assert agt.funm(E, sp.cos(x)).shape == (0, 3, 3)


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("f,match", [
    (sp.I * x, "complex-valued"), (sp.Matrix([x]), "scalar"), (x * sp.Symbol("y"), "one variable"),
    (sp.zeta(x), "zeta cannot be evaluated"), (sp.besselj(2, x), "besselj"), (sp.Derivative(sp.Function("g")(x), x),
                                                                              "closed form"),
])
def test_unsupported_functions_are_value_errors(f, match):
    with pytest.raises(ValueError, match=match):
        agt.funm(diag(1.0, 2.0), f)


def test_domains_name_the_primitive_and_the_eigenvalue():
    with pytest.raises(ValueError, match=r"eigenvalue 0.5 .*log\(x - 1\).* x - 1 > 0; here x - 1 = -0.5"):
        agt.funm(diag(0.5, 2.0), sp.log(x - 1))
    with pytest.raises(ValueError, match=r"eigenvalue 0 .*gamma"):
        agt.funm(diag(0.0, 2.0), sp.gamma(x))
    # Piecewise: a piece is checked only where it is selected
    safe = sp.Piecewise((sp.log(x), x > 0), (0, True))
    torch.testing.assert_close(agt.funm(diag(-1.0, math.e), safe).diagonal(), torch.tensor([0.0, 1.0], dtype=f64))
    # a domain the user states
    with pytest.raises(ValueError, match="outside the stated domain"):
        agt.funm(diag(-1.0, 2.0), x ** 3, domain=sp.Interval(0, sp.oo))
    torch.testing.assert_close(agt.funm(diag(1.0, 2.0), x ** 3, domain=x >= 0).diagonal(),
                               torch.tensor([1.0, 8.0], dtype=f64))
    # an intermediate that overflows into NaN is an error, never a silent NaN
    with pytest.raises(ValueError, match="not defined|not a number"):
        grad(lambda a: agt.funm(a, sp.exp(x) - sp.exp(x + 1)), diag(800.0, 801.0))


def test_accuracy_warning_names_f_and_the_eigenvalues():
    program = compile_function(sp.loggamma(x))
    stripped = ScalarProgram(program.text, program.ops, derivatives=(), texts=program.texts)
    a = torch.tensor([2.5, 3.0], dtype=f64)
    with pytest.warns(AccuracyWarning, match=r"loggamma\(x\).*eigenvalues \(2.5, 2.50000000000009"):
        divided.first(stripped, a, a + torch.tensor([1e-13, 0.5], dtype=f64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        divided.first(program, a, a + torch.tensor([1e-13, 0.5], dtype=f64))  # with its series: accurate


# ------------------------------------------------------------------ compile time and the disk cache
def test_first_compile_is_bounded_and_cached_on_disk(tmp_path):
    code = ("import time, sympy as sp; from adjointgen.codegen.scalar import compile_cached; x = sp.Symbol('x');"
            "fs = [sp.tanh(sp.tanh(sp.tanh(x))), x**200, x**1e20, sp.gamma(x) * sp.erf(x), sp.sin(x)/x];"
            "t = time.perf_counter(); [compile_cached(f) for f in fs]; print(time.perf_counter() - t)")
    env = dict(os.environ, ADJOINTGEN_CACHE=str(tmp_path))
    first = float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                 check=True).stdout)
    assert first < 2 * 5  # under 2 s per function, cold
    assert len(list((tmp_path / "scalar").glob("*.json"))) >= 5
    again = float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                 check=True).stdout)
    assert again < first


def test_programs_round_trip_as_data():
    p = compile_function(sp.Piecewise((sp.log(x), x > 1), (x - 1, True)) + sp.erf(x))
    assert ScalarProgram.from_data(p.to_data()) == p


# ------------------------------------------------------------------ CUDA: the same composition
def test_cuda_divided_differences_match_the_runtime(tmp_path):
    nvcc = nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc not installed")
    from adjointgen.runtime.xp import cuda_include_dir

    fs = [sp.log(1 + sp.exp(x)), sp.tanh(sp.tanh(sp.tanh(x))), x * sp.log(x), sp.erf(x), sp.atan(1000 * x),
          sp.Piecewise((x ** 2, x < 1), (2 * x - 1, True)), x ** sp.Rational(3, 2) * sp.exp(x)]
    src = ['#include <cstdio>\n#include <cstdlib>\n#include "adjointgen_divided.cuh"']
    for i, f in enumerate(fs):
        src.append(program_cuda_dd(compile_cached(f), f"f{i}"))
    cases = " ".join(f"if (which == {i}) d = f{i}_dd<double>(a, b);" for i in range(len(fs)))
    src.append("int main(int argc, char** argv) { int which = atoi(argv[1]); double a, b; "
               "while (scanf(\"%lf %lf\", &a, &b) == 2) { double d = 0; " + cases + " printf(\"%.17g\\n\", d); } }")
    (tmp_path / "h.cu").write_text("\n\n".join(src))
    exe = tmp_path / "h"
    r = subprocess.run([nvcc, "-x", "cu", f"-I{cuda_include_dir()}", str(tmp_path / "h.cu"), "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    a = np.array([0.3, 0.3, 1.0, 2.0, 5.0, 0.9])
    b = np.array([0.3, 0.3 + 1e-9, 1.0 + 1e-12, 0.5, 5.5, 1.2])
    for i, f in enumerate(fs):
        out = subprocess.run([str(exe), str(i)], input="\n".join(f"{p!r} {q!r}" for p, q in zip(a, b)),
                             capture_output=True, text=True, check=True).stdout
        got = [float(v) for v in out.split()]
        want = divided.first(compile_cached(f), torch.from_numpy(a), torch.from_numpy(b)).tolist()
        for g, w_, p, q in zip(got, want, a, b):
            assert abs(g - w_) <= 1e-13 * max(abs(w_), 1e-300), (str(f), p, q, g, w_)

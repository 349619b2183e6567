"""Stage 4: the generated CUDA sources compile with nvcc (PTX for sm_90), and the per-element
functions the kernels run give NumPy's numbers in a host harness built by nvcc.  GPU runs (CuPy)
happen where a GPU exists and skip elsewhere."""
import re
import functools
import subprocess

import numpy as np
import pytest
import sympy as sp

from adjointgen.calculus.nodes import DI, DJ
from adjointgen.codegen import generate as gen
from toolchain import nvcc_path

ROOT = gen.find_root(__file__)
CU_FILES = sorted((ROOT / "generated" / "cuda").glob("*.cu"))
#: the files with fused pairwise kernels (funm.cu's divided differences: tests/test_funm.py)
PAIRWISE_FILES = [cu for cu in CU_FILES if "_mul_" in cu.read_text()]
NVCC = nvcc_path()
# nvcc builds (about 30 s of compiling in all): CI's slow step
def needs_nvcc(test):
    return pytest.mark.slow(pytest.mark.skipif(NVCC is None, reason="nvcc not installed")(test))

ELEMENT = re.compile(r"inline T (\w+)_mul_(none|skew|sym)_element\(")
KERNEL = re.compile(r'extern "C" __global__ void (\w+)\(')

HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "{source}"

template <typename T>
static void run(int which, int n, long long batch, const std::vector<double>& w64, const std::vector<double>& X64, FILE* out) {{
    std::vector<T> w(w64.begin(), w64.end()), X(X64.begin(), X64.end());
    const long long total = batch * n * n;
    for (long long idx = 0; idx < total; ++idx) {{
        T v = T(0);
        switch (which) {{
{cases}
        }}
        double d = (double)v;
        fwrite(&d, sizeof(double), 1, out);
    }}
}}

int main(int argc, char** argv) {{
    int which = atoi(argv[1]);
    FILE* in = fopen(argv[2], "rb");
    FILE* out = fopen(argv[3], "wb");
    int n; long long batch;
    if (fread(&n, sizeof(int), 1, in) != 1 || fread(&batch, sizeof(long long), 1, in) != 1) return 2;
    std::vector<double> w(batch * n), X(batch * n * n);
    if (fread(w.data(), sizeof(double), w.size(), in) != w.size()) return 3;
    if (fread(X.data(), sizeof(double), X.size(), in) != X.size()) return 4;
    run<double>(which, n, batch, w, X, out);
    run<float>(which, n, batch, w, X, out);
    fclose(out);
    return 0;
}}
"""


def variants(cu):
    return ELEMENT.findall(cu.read_text())


@needs_nvcc
@pytest.mark.parametrize("cu", CU_FILES, ids=lambda p: p.name)
def test_compiles_to_ptx_for_sm90(cu, tmp_path):
    ptx = tmp_path / (cu.stem + ".ptx")
    from adjointgen.runtime.xp import cuda_include_dir

    r = subprocess.run([NVCC, "-arch=sm_90", "-ptx", f"-I{cuda_include_dir()}", str(cu), "-o", str(ptx)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = ptx.read_text()
    for kernel in KERNEL.findall(cu.read_text()):
        assert f".entry {kernel}(" in text


@pytest.fixture(scope="module")
def harnesses(tmp_path_factory):
    if NVCC is None:
        pytest.skip("nvcc not installed")
    built = {}
    for cu in PAIRWISE_FILES:
        vs = variants(cu)
        cases = "\n".join(
            f"            case {i}: v = {fn}_mul_{part}_element<T>(idx, n, w.data(), X.data()); break;"
            for i, (fn, part) in enumerate(vs)
        )
        d = tmp_path_factory.mktemp(cu.stem)
        src = d / "harness.cu"
        src.write_text(HARNESS.format(source=cu, cases=cases))
        exe = d / "harness"
        r = subprocess.run([NVCC, "-O2", "-o", str(exe), str(src)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        built[cu.stem] = (exe, vs)
    return built


@functools.lru_cache(maxsize=None)
def _spec(op_name):
    return gen.load_derivation(ROOT, op_name)


def _pairwise_oracle(op_name, fn_name):
    """The pairwise formula as the derivation produced it (SymPy), evaluated with NumPy."""
    d = _spec(op_name)
    symbol = fn_name[len(op_name) + 1:]
    pdef = d.pairwise[symbol]
    f = sp.lambdify((DI, DJ), pdef.expr, "numpy")

    def matrix(w):
        with np.errstate(divide="ignore", invalid="ignore"):
            F = f(w[..., :, None], w[..., None, :]) * np.ones(w.shape + w.shape[-1:])
        idx = np.arange(w.shape[-1])
        diagonal = sp.sympify(pdef.diagonal_value)  # a constant, or a function of d_i (1/(2 s_i))
        F[..., idx, idx] = sp.lambdify(DI, diagonal, "numpy")(w) if diagonal.free_symbols else float(diagonal)
        return F

    return matrix


@needs_nvcc
@pytest.mark.parametrize("cu", PAIRWISE_FILES, ids=lambda p: p.name)
def test_element_functions_match_numpy(cu, harnesses, tmp_path, rng):
    exe, vs = harnesses[cu.stem]
    assert vs, f"{cu.name} declares no element functions"
    n, batch = 7, 3
    w = np.sort(rng.uniform(0.5, 4.0, (batch, n)), axis=-1)  # distinct, positive (singular values too)
    X = rng.standard_normal((batch, n, n))
    inp = tmp_path / "in.bin"
    with open(inp, "wb") as f:
        f.write(np.int32(n).tobytes() + np.int64(batch).tobytes() + w.tobytes() + X.tobytes())
    for which, (fn, part) in enumerate(vs):
        out = tmp_path / f"out{which}.bin"
        subprocess.run([str(exe), str(which), str(inp), str(out)], check=True)
        res = np.fromfile(out, dtype=np.float64).reshape(2, batch, n, n)
        Xp = {"plain": X, "skew": 0.5 * (X - np.swapaxes(X, -1, -2)), "sym": 0.5 * (X + np.swapaxes(X, -1, -2))}[part]
        expected = _pairwise_oracle(cu.stem, fn)(w) * Xp
        np.testing.assert_allclose(res[0], expected, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(res[1], expected, rtol=2e-5, atol=2e-5)




@pytest.fixture
def cp():
    """CuPy with a CUDA device, or skip."""
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("no CUDA device")
    except Exception as exc:  # pragma: no cover - machine dependent
        pytest.skip(f"no CUDA device ({exc})")
    return cupy


@pytest.mark.gpu
def test_cupy_kernels_match_numpy_on_gpu(cp, rng):
    from adjointgen.generated.cupy import eigh as rules

    n = 64
    A = rng.standard_normal((2, n, n))
    A = A + np.swapaxes(A, -1, -2)
    w, V = np.linalg.eigh(A)
    gw, gV = rng.standard_normal((2, n)), rng.standard_normal((2, n, n))
    ref = rules.eigh_vjp(w, V, gw, gV)
    got = rules.eigh_vjp(*(cp.asarray(x) for x in (w, V, gw, gV)))
    assert isinstance(got, cp.ndarray)
    np.testing.assert_allclose(cp.asnumpy(got), ref, rtol=1e-10, atol=1e-10)


@pytest.mark.gpu
def test_cupy_complex_svd_rules_match_numpy_on_gpu(cp, rng):
    """Complex X runs the real kernels on Re X and Im X (F real)."""
    from adjointgen.generated.cupy import svd as rules

    A = rng.standard_normal((2, 40, 24)) + 1j * rng.standard_normal((2, 40, 24))
    U, s, Vh = np.linalg.svd(A, full_matrices=False)
    V = np.conj(np.swapaxes(Vh, -1, -2))
    gU = rng.standard_normal(U.shape) + 1j * rng.standard_normal(U.shape)
    gV = rng.standard_normal(V.shape) + 1j * rng.standard_normal(V.shape)
    gs = rng.standard_normal(s.shape)
    ref = rules.svd_vjp_complex(U, s, V, gU, gs, gV)
    got = rules.svd_vjp_complex(*(cp.asarray(x) for x in (U, s, V, gU, gs, gV)))
    np.testing.assert_allclose(cp.asnumpy(got), ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("part", ["plain", "skew", "sym"])
def test_complex_split_into_real_kernel_launches(part, rng):
    """The identity the CuPy path uses for complex X, checked with the NumPy path:
    F ∘ skew_H(X) = F ∘ skew(Re X) + i F ∘ sym(Im X) (and the mirror one for sym_H)."""
    from adjointgen.generated.cupy import svd as rules

    s = np.sort(rng.uniform(1, 5, 6))[::-1]
    X = rng.standard_normal((6, 6)) + 1j * rng.standard_normal((6, 6))
    flip = {"plain": "plain", "skew": "sym", "sym": "skew"}[part]
    whole = rules.svd_F_mul(np, s, X, part, hermitian=True)
    split = rules.svd_F_mul(np, s, X.real, part) + 1j * rules.svd_F_mul(np, s, X.imag, flip)
    Xt = np.conj(X.T)
    direct = rules.svd_F(np, s) * {"plain": X, "skew": (X - Xt) / 2, "sym": (X + Xt) / 2}[part]
    np.testing.assert_allclose(whole, direct, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(split, direct, rtol=1e-14, atol=1e-14)

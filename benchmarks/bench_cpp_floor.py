"""What a C++ autograd node would save: the fixed cost of cholesky's derived rule at n = 4.

The fixed cost of a forward + backward at n = 4 (``count_host_reads.py``) is the code around the
LAPACK calls.  This benchmark isolates the mechanism: the same derived VJP of ``cholesky``
(``gA = sym(L^-H Φ(L^H gL) L^-1)``, as ``adjointgen.generated.torch.cholesky.cholesky_vjp`` has
it), run three ways, each against ``torch.linalg.cholesky`` in the same run, one thread:

- the public ``adjointgen.torch.cholesky`` (checks, dispatch, forward mode, ``torch.func`` rules);
- a bare Python ``torch.autograd.Function`` with that rule (no checks, no dispatch);
- a C++ ``torch::autograd::Function`` with that rule, compiled here with
  ``torch.utils.cpp_extension.load_inline`` (about a minute, cached by torch afterwards).

    python benchmarks/bench_cpp_floor.py

It measures a mechanism, not a product path: adjointgen does not emit C++ autograd nodes (yet).
Without a C++ compiler the last row is skipped.
"""
from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _timing import table  # noqa: E402
from count_host_reads import _bare_cholesky as _bare, _time  # noqa: E402  (the same floor, timed the same way)
from host_reads import cases, step  # noqa: E402  (the suite's forward + backward)

import adjointgen.torch as agt  # noqa: E402

_SOURCE = r"""
#include <torch/extension.h>

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// cholesky with the VJP derived in derivations/cholesky.py, term by term as the generated Python rule
struct CholeskyRule : public torch::autograd::Function<CholeskyRule> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& A) {
    auto L = std::get<0>(at::linalg_cholesky_ex(A));
    ctx->save_for_backward({L});
    return L;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto L = ctx->get_saved_variables()[0];
    auto t0 = L.mT();
    auto t1 = at::matmul(t0, grads[0]);
    auto t2 = t1.tril(-1) + 0.5 * at::diag_embed(t1.diagonal(0, -2, -1));
    auto t3 = 0.5 * (t2 + t2.mT());
    auto t4 = at::linalg_solve_triangular(L, t3, /*upper=*/false, /*left=*/false);
    return {at::linalg_solve_triangular(t0, t4, /*upper=*/true)};
  }
};

at::Tensor cholesky(const at::Tensor& A) { return CholeskyRule::apply(A); }
"""


def _compiled():
    if shutil.which("c++") is None and shutil.which("g++") is None:
        return None
    from torch.utils.cpp_extension import load_inline

    try:
        return load_inline("adjointgen_cpp_floor", cpp_sources=_SOURCE, functions=["cholesky"],
                           extra_cflags=["-O2"], verbose=False).cholesky
    except Exception as exc:  # noqa: BLE001 - no working toolchain: the row is skipped, with the reason
        print(f"(the C++ row is skipped: the extension did not build: {str(exc).splitlines()[0][:200]})")
        return None


def main(argv=None):
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="fewer calls per timing")
    args = p.parse_args(argv)
    calls = 200 if args.quick else 2000
    get, A, loss = cases(4)["cholesky"]
    t0 = time.perf_counter()
    cpp = _compiled()
    built = time.perf_counter() - t0
    candidates = {"adjointgen.torch.cholesky": agt.cholesky, "derived rule, bare Python autograd.Function": _bare()}
    if cpp is not None:
        candidates["derived rule, C++ autograd::Function"] = cpp
        grads = [step(f, A, loss) for f in (torch.linalg.cholesky, cpp)]
        assert torch.allclose(grads[0], grads[1], rtol=1e-10, atol=1e-12), "the C++ rule's gradient differs from torch's"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows, results = [], []
    try:
        for label, fn in candidates.items():
            t_torch, t_ours = _time(torch.linalg.cholesky, A, loss, calls), _time(fn, A, loss, calls)
            rows.append((label, f"{t_torch * 1e6:.0f}", f"{t_ours * 1e6:.0f}", f"{t_ours / t_torch:.2f}"))
            results.append({"benchmark": "fixed cost", "case": f"cholesky n = 4, fwd+bwd: {label}",
                            "ratio": t_ours / t_torch, "anchor": "torch.linalg.cholesky", "target": ""})
    finally:
        torch.set_num_threads(threads)
    print(table(rows, ("cholesky at n = 4, forward + backward, one thread", "torch us", "ours us", "ours / torch")))
    if cpp is not None:
        print(f"(the C++ extension took {built:.1f} s to build or load)")
    return results


if __name__ == "__main__":
    main()

"""The degenerate-spectrum sweep: every solver, loss kind, gap and transform.

Solvers: ``eigh``, ``eigh(A, B)``, ``eigsh`` (dense and sparse), ``svd``, ``svds``; real, and complex
where the solver takes it.  Each gets matrices with a cluster of two eigenvalues (singular values)
apart by ``gap`` = 0, 1e-12, 1e-8 (inside the default cluster tolerance ``sqrt(eps)``) and 1e-4
(outside it), a few seeds each.  Losses:

* basis-dependent: an entry of a cluster vector (squared: sign-free; ``|.|^2``: phase-free), a
  product of two entries of one vector;
* invariant: the projector onto the cluster contracted with a matrix, a spectral function
  ``V diag(exp(w)) V^H`` (``U diag(S^3) Vh``) contracted with a matrix, the matrix itself
  ``V diag(w) V^H`` contracted with one (eigensolvers), the sum of the values, the sum of their
  squares.  ``eigh`` is also swept with its cluster at 0 (a rank-deficient matrix, where
  ``V diag(w) V^H``'s cotangents in the cluster are the size of its rounding).

Verdicts: inside the tolerance a basis-dependent loss must raise a
:class:`~adjointgen.GaugeDependentLossError`; every other loss must return a gradient whose
directional derivatives match Richardson-extrapolated central differences of the loss to 1e-7
(relative to the gradient's size), under ``torch.autograd.grad``, ``torch.func.grad``,
``vmap(grad)`` and ``jacrev``.

Forward mode (``jvp``, ``jacfwd``) and second derivatives (``hvp``: the gradient of ``<grad, d>``,
reverse over reverse; ``jvp(grad)``: forward over reverse) are swept too.  Inside the tolerance
they may raise for an invariant loss (counted as ``raised``: forward mode cannot see the loss, and
a second derivative needs the cluster's block, which the cotangents do not always carry), but
they must never return a wrong number: a value returned must match Richardson differences (of the
loss; for second derivatives, of the exact first-order gradient) to 1e-7 (1e-6 for second
derivatives).

    python benchmarks/sweep_degeneracy.py            # 3 seeds, every transform
    python benchmarks/sweep_degeneracy.py --quick    # 1 seed, four transforms

Prints one row per solver and loss kind; returns the pass rate for ``benchmarks/run_all.py``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import table  # noqa: E402

import adjointgen  # noqa: E402
import adjointgen.torch as agt  # noqa: E402

f64, c128 = torch.float64, torch.complex128
GAPS = (0.0, 1e-12, 1e-8, 1e-4)
INSIDE = 1.5e-8  # the default cluster tolerance of float64, relative (the spectra below are O(1..10))


def _orth(n, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    M = torch.randn(n, n, dtype=f64, generator=g)
    if dtype.is_complex:
        M = M + 1j * torch.randn(n, n, dtype=f64, generator=g)
    return torch.linalg.qr(M)[0].to(dtype)


def _herm(M):
    return 0.5 * (M + M.mH)


# ------------------------------------------------------------------ problems: (inputs, call, cluster columns)
def eigh_problem(seed, gap, dtype):
    Q = _orth(5, seed, dtype)
    w = torch.tensor([1.0, 2.0, 2.0 + gap, 3.0, 4.0], dtype=f64)
    return (_herm((Q * w.to(dtype)) @ Q.mH),), (lambda A: agt.eigh(A)), (1, 2)


def eigh_zero_problem(seed, gap, dtype):
    """A cluster at zero (a rank-deficient matrix): ``f(0) = 0`` for ``V diag(w) V^H``."""
    Q = _orth(5, seed, dtype)
    w = torch.tensor([-1.0, 0.0, gap, 3.0, 4.0], dtype=f64)
    return (_herm((Q * w.to(dtype)) @ Q.mH),), (lambda A: agt.eigh(A)), (1, 2)


def eigh_generalized_problem(seed, gap, dtype):
    Q = _orth(5, seed, dtype)
    C = _orth(5, seed + 100, dtype)
    B = _herm(C @ torch.diag(torch.tensor([1.0, 1.5, 2.0, 2.5, 3.0], dtype=f64).to(dtype)) @ C.mH)
    L = torch.linalg.cholesky(B)
    V0 = torch.linalg.solve_triangular(L.mH, Q, upper=True)  # B-orthonormal
    w = torch.tensor([1.0, 2.0, 2.0 + gap, 3.0, 4.0], dtype=f64)
    A = _herm(B @ (V0 * w.to(dtype)) @ V0.mH @ B)
    return (A, B), (lambda A, B: agt.eigh(A, B)), (1, 2)


def eigsh_problem(seed, gap, dtype, sparse=False):
    n = 24
    Q = _orth(n, seed, dtype)
    w = torch.linspace(1.0, 6.0, n, dtype=f64)
    w[-2], w[-1] = 8.0, 8.0 + gap
    A = _herm((Q * w.to(dtype)) @ Q.mH)
    if sparse:
        return (A.to_sparse_csr(),), (lambda A: agt.eigsh(A, 4)), (0, 1)
    return (A,), (lambda A: agt.eigsh(A, 4)), (0, 1)  # descending: the cluster is in front


def svd_problem(seed, gap, dtype):
    U = _orth(6, seed, dtype)[:, :4]
    V = _orth(4, seed + 50, dtype)
    s = torch.tensor([3.0, 2.0 + gap, 2.0, 1.0], dtype=f64)
    return ((U * s.to(dtype)) @ V.mH,), (lambda A: agt.svd(A, full_matrices=False)), (1, 2)


def svds_problem(seed, gap, dtype):
    U = _orth(30, seed, dtype)[:, :20]
    V = _orth(20, seed + 50, dtype)
    s = torch.linspace(6.0, 1.0, 20, dtype=f64)
    s[0], s[1], s[2] = 10.0, 9.0 + gap, 9.0
    return ((U * s.to(dtype)) @ V.mH,), (lambda A: agt.svds(A, 3)), (1, 2)


SOLVERS = [
    ("eigh", eigh_problem, (f64, c128), "eig"),
    ("eigh, cluster at 0", eigh_zero_problem, (f64, c128), "eig"),
    ("eigh(A, B)", eigh_generalized_problem, (f64, c128), "eig"),
    ("eigsh dense", eigsh_problem, (f64, c128), "eig"),
    ("eigsh sparse", lambda s, g, d: eigsh_problem(s, g, d, sparse=True), (f64,), "eig"),
    ("svd", svd_problem, (f64, c128), "svd"),
    ("svds", svds_problem, (f64,), "svd"),
]


# ------------------------------------------------------------------ losses of the outputs
def losses(kind, cluster, n_rows, dtype, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed + 7)
    m = n_rows if isinstance(n_rows, int) else n_rows[0]
    G = torch.randn(m, m, dtype=f64, generator=g).to(dtype=dtype, device=device)
    G = G + G.mH
    i, j = cluster
    if kind == "eig":
        return {
            "entry": (False, lambda w, V: V[0, i].abs() ** 2),
            "product": (False, lambda w, V: (V[0, i] * V[1, i].conj()).real),
            "projector": (True, lambda w, V: ((V[:, [i, j]] @ V[:, [i, j]].mH) * G.conj()).sum().real),
            "spectral": (True, lambda w, V: (((V * w.exp().to(V.dtype)) @ V.mH) * G.conj()).sum().real),
            "matrix": (True, lambda w, V: (((V * w.to(V.dtype)) @ V.mH) * G.conj()).sum().real),
            "sum": (True, lambda w, V: w.sum()),
            "squares": (True, lambda w, V: w.square().sum()),
        }
    Gm = torch.randn(*n_rows, dtype=f64, generator=g).to(dtype=dtype, device=device)
    return {
        "entry": (False, lambda U, S, Vh: U[0, i].abs() ** 2),
        "product": (False, lambda U, S, Vh: (U[0, i] * Vh[i, 0]).real),
        "projector": (True, lambda U, S, Vh: ((U[:, [i, j]] @ U[:, [i, j]].mH) * G.conj()).sum().real),
        "spectral": (True, lambda U, S, Vh: (((U * (S ** 3).to(U.dtype)) @ Vh) * Gm.conj()).sum().real),
        "sum": (True, lambda U, S, Vh: S.sum()),
        "squares": (True, lambda U, S, Vh: S.square().sum()),
    }


def richardson(loss_of_inputs, inputs, directions, h=1e-3):
    def D(step):
        plus = loss_of_inputs(*[x + step * d for x, d in zip(inputs, directions)])
        minus = loss_of_inputs(*[x - step * d for x, d in zip(inputs, directions)])
        return (float(plus) - float(minus)) / (2 * step)

    return (4 * D(h / 2) - D(h)) / 3


def _directions(inputs, seed):
    g = torch.Generator().manual_seed(seed + 13)
    out = []
    for x in inputs:
        if x.layout != torch.strided:
            d = x.to_dense()
        else:
            d = x
        r = torch.randn(d.shape, dtype=f64, generator=g)
        if d.is_complex():
            r = r + 1j * torch.randn(d.shape, dtype=f64, generator=g)
        r = r.to(dtype=d.dtype, device=d.device)
        if d.shape[-1] == d.shape[-2]:
            r = _herm(r)
        if x.layout != torch.strided:  # a direction on the sparsity pattern
            mask = (x.to_dense() != 0).to(r.dtype)
            r = _herm(r * mask)
        out.append(r)
    return out


def _grads(mode, f, inputs):
    """Gradients of the scalar ``f(*inputs)`` in one of the transforms (dense directions)."""
    if mode == "autograd":
        xs = [x.detach().clone().requires_grad_() for x in inputs]
        return torch.autograd.grad(f(*xs), xs)
    if mode == "func.grad":
        return torch.func.grad(f, argnums=tuple(range(len(inputs))))(*inputs)
    if mode == "vmap(grad)":
        batched = [torch.stack([x, x]) for x in inputs]
        out = torch.func.vmap(torch.func.grad(f, argnums=tuple(range(len(inputs)))))(*batched)
        return tuple(o[1] for o in out)
    if mode == "jacrev":
        return torch.func.jacrev(f, argnums=tuple(range(len(inputs))))(*inputs)
    raise ValueError(mode)


#: transforms that may raise for an invariant loss at a cluster (never return a wrong value)
FORWARD = ("jvp", "jacfwd")
SECOND = ("hvp", "jvp(grad)")


def _forward_derivative(mode, f, inputs, dirs):
    """The directional derivative of ``f`` along ``dirs`` in forward mode."""
    if mode == "jvp":
        return float(torch.func.jvp(f, tuple(inputs), tuple(dirs))[1])
    J = torch.func.jacfwd(f, argnums=tuple(range(len(inputs))))(*inputs)
    return sum(_inner(j, d) for j, d in zip(J, dirs))


def _second_derivative(mode, f, inputs, dirs, dirs2):
    """``<H dirs, dirs2>`` of ``f``: reverse over reverse, or forward over reverse."""
    argnums = tuple(range(len(inputs)))
    if mode == "hvp":
        xs = [x.detach().clone().requires_grad_() for x in inputs]
        gs = torch.autograd.grad(f(*xs), xs, create_graph=True)
        inner = sum((g * d.conj()).sum().real if g.is_complex() else (g * d).sum() for g, d in zip(gs, dirs))
        hs = torch.autograd.grad(inner, xs)
    else:
        hs = torch.func.jvp(torch.func.grad(f, argnums=argnums), tuple(inputs), tuple(dirs))[1]
    return sum(_inner(h, d) for h, d in zip(hs, dirs2))


def _first_gradient(f, xs):
    ys = [x.detach().clone().requires_grad_() for x in xs]
    return torch.autograd.grad(f(*ys), ys)


def _inner(g, d):
    if g.layout != torch.strided:
        g = g.to_dense()
    return float((g.conj() * d).sum().real) if g.is_complex() else float((g * d).sum())


def run(seeds=(0, 1, 2), modes=("autograd", "func.grad", "vmap(grad)", "jacrev"), device="cpu"):
    """The sweep on ``device`` (the problems are built in float64 on the CPU, then moved)."""
    rows, failures = [], []
    total = passed = 0
    for name, problem, dtypes, family in SOLVERS:
        for dtype in dtypes:
            counts = {}
            for seed in seeds:
                for gap in GAPS:
                    inputs, call, cluster = problem(seed, gap, dtype)
                    inputs = tuple(x.to(device) for x in inputs)
                    outs = call(*inputs)
                    rows_of = outs[1].shape[-2] if family == "eig" else (outs[0].shape[-2], outs[2].shape[-1])
                    for kind, (invariant, loss) in losses(family, cluster, rows_of, dtype, seed, device).items():
                        f = lambda *xs, loss=loss: loss(*call(*xs))  # noqa: E731
                        sparse = any(x.layout != torch.strided for x in inputs)
                        for mode in modes:
                            if sparse and mode != "autograd":
                                continue  # transforms of sparse inputs: not in torch (second derivatives
                                #           through the iterative solve: a clear error, not swept)
                            if mode in ("jacrev", "jacfwd") and dtype.is_complex:
                                continue  # torch's jacrev/jacfwd take real inputs only
                            if mode in SECOND and not invariant and gap > INSIDE:
                                continue  # second derivatives ~1/gap^2: beyond the differences' reach
                            total += 1
                            key = (kind, "inside" if gap <= INSIDE else "outside")
                            ok, why = _verdict(f, inputs, mode, invariant, gap, seed)
                            raised = ok == "raised"
                            ok = bool(ok)
                            passed += ok
                            counts.setdefault(key, [0, 0, 0])
                            counts[key][0] += ok
                            counts[key][1] += raised
                            counts[key][2] += 1
                            if not ok:
                                failures.append(f"{name} {dtype} seed {seed} gap {gap:g} {kind} {mode}: {why}")
            for (kind, where), (good, raised, n) in sorted(counts.items()):
                rows.append((name, "complex" if dtype.is_complex else "real", kind, where, f"{good}/{n}",
                             str(raised) if raised else ""))
    return rows, failures, passed, total


def _verdict(f, inputs, mode, invariant, gap, seed):
    """``True`` (right), ``"raised"`` (a clear error where one is allowed: truthy) or ``False``,
    with the reason."""
    if mode in FORWARD + SECOND:
        return _verdict_beyond(f, inputs, mode, invariant, gap, seed)
    expect_raise = (not invariant) and gap <= INSIDE
    try:
        grads = _grads(mode, f, inputs)
    except adjointgen.GaugeDependentLossError as exc:
        return (True, "") if expect_raise else (False, f"raised {type(exc).__name__}: {str(exc)[:80]}")
    except Exception as exc:  # noqa: BLE001 - any other failure is a failure of the sweep
        return False, f"{type(exc).__name__}: {str(exc)[:120]}"
    if expect_raise:
        return False, "a basis-dependent loss returned a gradient"
    dirs = _directions(inputs, seed)
    dense = [x.to_dense() if x.layout != torch.strided else x for x in inputs]
    # a basis-dependent loss outside the tolerance turns by ~h/gap radians over a step h: small steps
    h = 1e-3 if invariant else 1e-2 * gap
    want = richardson(lambda *xs: f(*[x.to_sparse_csr() if i.layout == torch.sparse_csr else x
                                      for x, i in zip(xs, inputs)]), dense, dirs, h)
    got = sum(_inner(g, d) for g, d in zip(grads, dirs))
    scale = max(abs(want), max(float(g.to_dense().abs().max() if g.layout != torch.strided else g.abs().max())
                               for g in grads), 1e-300)
    if not torch.isfinite(torch.tensor(got)):
        return False, f"non-finite gradient {got}"
    tol = 1e-7 if invariant else 1e-5  # basis-dependent at gap 1e-4: gradients ~1/gap, FD with h = 1e-3 is cruder
    if abs(got - want) > tol * scale:
        return False, f"directional derivative {got:.10g}, Richardson {want:.10g}"
    return True, ""


def _verdict_beyond(f, inputs, mode, invariant, gap, seed):
    """Forward mode and second derivatives: inside the tolerance a clear error is allowed for any
    loss (and required for a basis-dependent one); a value returned must be right."""
    inside = gap <= INSIDE
    dirs = _directions(inputs, seed)
    try:
        if mode in FORWARD:
            got = _forward_derivative(mode, f, inputs, dirs)
        else:
            dirs2 = _directions(inputs, seed + 1)
            got = _second_derivative(mode, f, inputs, dirs, dirs2)
    except adjointgen.GaugeDependentLossError as exc:
        return ("raised", "") if inside else (False, f"raised {type(exc).__name__}: {str(exc)[:80]}")
    except Exception as exc:  # noqa: BLE001
        return False, f"{type(exc).__name__}: {str(exc)[:120]}"
    if inside and not invariant:
        return False, "a basis-dependent loss returned a derivative"
    if mode in FORWARD:
        h = 1e-3 if invariant else 1e-2 * gap
        want = richardson(f, inputs, dirs, h)
        tol = 1e-7 if invariant else 1e-5
    else:
        def along(*xs):  # <grad f(xs), dirs2>, exact at first order for an invariant loss
            return sum(_inner(g, d) for g, d in zip(_first_gradient(f, xs), dirs2))

        want = richardson(along, inputs, dirs, 1e-3)
        tol = 1e-6
    scale = max(abs(want), abs(got), 1.0)
    if not torch.isfinite(torch.tensor(got)):
        return False, f"non-finite derivative {got}"
    if abs(got - want) > tol * scale:
        return False, f"{mode} {got:.10g}, Richardson {want:.10g}"
    return True, ""


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    start = time.perf_counter()
    seeds, modes = ((0,), ("autograd", "vmap(grad)", "jvp", "hvp")) if args.quick else \
        ((0, 1, 2), ("autograd", "func.grad", "vmap(grad)", "jacrev", "jvp", "jacfwd", "hvp", "jvp(grad)"))
    rows, failures, passed, total = run(seeds, modes, args.device)
    print(table(rows, ["solver", "field", "loss", "gap vs tolerance", "passed", "of which raised"]))
    print(f"\n{passed}/{total} passed in {time.perf_counter() - start:.0f} s")
    if failures:
        print("\nfailures:\n  " + "\n  ".join(failures[:40]))
    return [{"benchmark": "sweep_degeneracy", "case": "losses x solvers x gaps x transforms passing",
             "value": passed / max(total, 1), "format": ".3f", "target": ""}]


if __name__ == "__main__":
    main()

"""The accuracy sweep of matrix functions: ``f[a, b]`` and ``f[a, b, c]`` of many scalar functions
against 340-digit mpmath, and the first-call compile time of each ``f``.

For every function: base points across its domain (magnitudes from 1e-300 to 1e300 where ``f`` is
finite, branch points and poles approached to 1e-300, overflow regions), each paired with points at
relative gaps 1, 0.5, 0.1, ..., 1e-16 and 0 on both sides (pairs), and with two more points
(triples: equal, one apart, spread).  Results with ``|f[..]| < 1e-280`` (underflow) or above
``1e300`` are left out.  A point passes when its relative error is at most
``max(1e-12, 64 eps κ)``, ``κ`` the condition number of the divided difference in its arguments
(:func:`adjointgen.divided_reference.condition`): where rounding the arguments alone moves the value
by more than 1e-12 (``cos`` at 1e5: κ ~ 1e5), nothing computed in float64 can do better.

    python benchmarks/sweep_funm.py            # every function, every point (~2 minutes)
    python benchmarks/sweep_funm.py --quick    # a few points per function
    python benchmarks/sweep_funm.py --only cos,softplus

Prints one row per function (worst relative error, worst error over what is allowed, points), one
row per class (the worst of its functions), and the first-call compile times; returns the class
rows for ``benchmarks/run_all.py``.
"""
from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import sympy as sp
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import table  # noqa: E402

from adjointgen import divided_reference as ref  # noqa: E402
from adjointgen.codegen.scalar import compile_cached  # noqa: E402
from adjointgen.runtime import divided  # noqa: E402

x = sp.Symbol("x", real=True)
POS = [1e-300, 1e-100, 1e-20, 1e-8, 1e-3, 0.05, 0.5, 1.0, 3.0, 100.0, 1e8, 1e100, 1e300]
REAL = [-1e3, -30.0, -1.0, -1e-8, 0.0, 1e-8, 0.5, 1.0, 3.0, 30.0, 300.0, 1e5]
SMALL = [-30.0, -3.0, -1.0, -0.3, -1e-8, 0.0, 1e-8, 0.3, 1.0, 3.0, 30.0]


def near(c, scales=(1e-300, 1e-100, 1e-12, 1e-6, 1e-3, 0.1, 1.0)):
    return [c + s for s in scales]


#: (class, name, f, base points for pairs, base points for triples)
FUNCTIONS = [
    ("catalogue", "exp", sp.exp(x), [-2000, -700, -1, 0, 1e-10, 1, 10, 700], [-700, -1, 1e-10, 1, 10, 700]),
    ("catalogue", "log", sp.log(x), POS, POS),
    ("catalogue", "sqrt", sp.sqrt(x), POS, POS),
    ("catalogue", "x**0.5 (powm)", x ** 0.5, POS, POS),
    ("catalogue", "x**1.5 (powm)", x ** 1.5, POS[:-1], POS[:-1]),
    ("catalogue", "x**-1 (powm)", x ** -1, POS, POS),
    ("powers", "x**-0.5", x ** -0.5, POS, POS),
    ("powers", "x**3", x ** 3, REAL, REAL),
    ("powers", "x**20", x ** 20, REAL[:9], REAL[:9]),
    ("powers", "x**200", x ** 200, [0.01, 0.5, 1.0, 2.0, -1.0], [0.5, 1.0, 2.0]),
    ("powers", "(x-1)**(1/3)", (x - 1) ** sp.Rational(1, 3), near(1), near(1, (1e-12, 1e-6, 1e-3, 0.1, 1.0))),
    ("powers", "sqrt(x-1)", sp.sqrt(x - 1), near(1), near(1, (1e-12, 1e-6, 1e-3, 0.1, 1.0))),
    ("powers", "1/(1+x**2)", 1 / (1 + x ** 2), SMALL, SMALL),
    ("elementary", "exp(-x) (heat kernel)", sp.exp(-x), [-700, -1, 0, 1, 10, 700, 2000], [-1, 1, 10, 700]),
    ("elementary", "cos", sp.cos(x), REAL + [1020, 303], REAL),
    ("elementary", "sin", sp.sin(x), REAL, REAL),
    ("elementary", "tan", sp.tan(x), [-1.5, -1.0, -1e-8, 0.0, 1e-8, 0.5, 1.0, 1.5, 1.57], [-1.0, 0.0, 0.5, 1.0, 1.5]),
    ("elementary", "sec", sp.sec(x), [-1.5, -1.0, 0.0, 0.5, 1.0, 1.5], [-1.0, 0.0, 0.5, 1.0]),
    ("elementary", "cot", sp.cot(x), [-1.5, -1.0, -1e-8, 1e-8, 0.5, 1.0, 3.0], [-1.0, 0.5, 1.0, 3.0]),
    ("elementary", "sinh", sp.sinh(x), SMALL + [700], SMALL),
    ("elementary", "cosh", sp.cosh(x), SMALL + [700], SMALL),
    ("elementary", "tanh", sp.tanh(x), SMALL + [300.0], SMALL),
    ("elementary", "atan", sp.atan(x), SMALL + [1e8, 1e100], SMALL),
    ("elementary", "asinh", sp.asinh(x), SMALL + [1e8, 1e100], SMALL),
    ("elementary", "log(x+5)", sp.log(x + 5), near(-5), near(-5, (1e-12, 1e-6, 1e-3, 0.1, 1.0))),
    ("elementary", "log(x-1)", sp.log(x - 1), near(1), near(1, (1e-12, 1e-6, 1e-3, 0.1, 1.0))),
    ("elementary", "exp(x)-1", sp.exp(x) - 1, [-30.0, -1.0, -1e-8, 1e-8, 1.0, 30.0], [-1.0, 1e-8, 1.0]),
    ("compositions", "x*log(x) (entropy)", x * sp.log(x), [0.0] + POS[:-1], POS[4:-1]),
    ("compositions", "log(x)**2", sp.log(x) ** 2, POS, POS),
    ("compositions", "x**(5/2)+x", x ** sp.Rational(5, 2) + x, [0.0] + POS[:-2], POS[4:-2]),
    ("compositions", "x**(3/2)*exp(x)", x ** sp.Rational(3, 2) * sp.exp(x), [0.0, 1e-8, 0.5, 1, 3, 30, 300],
     [1e-8, 0.5, 1, 3, 30]),
    ("compositions", "softplus log(1+exp(x))", sp.log(1 + sp.exp(x)), [-800, -30, -1, -1e-8, 0, 1e-8, 1, 30, 750, 1e5],
     [-30, -1, 0, 1, 30, 100]),
    ("compositions", "sigmoid 1/(1+exp(-x))", 1 / (1 + sp.exp(-x)), [-800, -30, -1, 0, 1, 30, 800], [-30, -1, 0, 1, 30]),
    ("compositions", "tanh(tanh(tanh(x)))", sp.tanh(sp.tanh(sp.tanh(x))), SMALL, SMALL),
    ("compositions", "atan(1000x)", sp.atan(1000 * x), SMALL + [1e5], SMALL),
    ("compositions", "exp(-x**2)", sp.exp(-x ** 2), SMALL, SMALL),
    ("compositions", "x**3-x", x ** 3 - x, SMALL, SMALL),
    ("special", "erf", sp.erf(x), SMALL, SMALL),
    ("special", "erfc", sp.erfc(x), [-3.0, -1.0, 0.0, 1.0, 3.0, 10.0, 25.0], [-1.0, 0.0, 1.0, 3.0]),
    ("special", "gamma", sp.gamma(x), [1e-8, 0.5, 1, 2.5, 10, 100, -0.5, -2.5], [0.5, 1, 2.5, 10, -0.5]),
    ("special", "loggamma", sp.loggamma(x), [1e-8, 0.5, 1, 2, 10, 100, 1e5], [0.5, 1, 2, 10, 100]),
    ("special", "besselj(0,x)", sp.besselj(0, x), SMALL, SMALL),
    ("special", "sin(x)/x (sinc)", sp.sin(x) / x, SMALL, SMALL),
    ("piecewise", "Abs", sp.Abs(x), [-3.0, -1.0, 1.0, 3.0], [-3.0, -1.0, 1.0]),
    ("piecewise", "Max(x, 0)", sp.Max(x, 0), [-3.0, -1.0, 1.0, 3.0], [-3.0, -1.0, 1.0]),
    ("piecewise", "Piecewise", sp.Piecewise((x ** 2, x < 1), (2 * x - 1, True)), [-3.0, 0.5, 2.0, 3.0], [-3.0, 0.5, 2.0]),
    ("piecewise", "constant 3", sp.Integer(3) + 0 * x, SMALL, SMALL),
    ("piecewise", "2x+1", 2 * x + 1, SMALL, SMALL),
]


def pairs(bases, quick):
    gaps = [1.0, 0.5] + [10.0 ** -k for k in range(1, 17, 3 if quick else 1)] + [0.0]
    out = []
    for a in bases:
        for g in gaps:
            out += [(a, a * (1 + g)), (a, a - abs(a) * g / 2)]
    return out


def triples(bases, quick):
    out = []
    for a in bases:
        for g in [10.0 ** -k for k in range(0, 17, 4 if quick else 2)] + [0.0]:
            out += [(a, a * (1 + g), a * (1 + 2 * g)), (a, a, a * (1 + g)), (a * (1 + g), a, a * (1 - g / 3))]
    return out


#: points with a condition number above this are "ill-conditioned" in the tables
WELL_CONDITIONED = 1e3


def measure(f, points, order: int, dtype=torch.float64):
    """(worst relative error where κ <= WELL_CONDITIONED, worst error / allowed, points compared,
    where the worst ratio is, worst relative error anywhere) of one order."""
    program = compile_cached(f)
    F = ref._Function(f)
    t = torch.tensor(points, dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = divided.first(program, t[:, 0], t[:, 1]) if order == 1 else divided.second(program, *t.unbind(1))
    eps = torch.finfo(dtype).eps
    worst = worst_norm = worst_wc = 0.0
    n = 0
    where = None
    for pt, g in zip(t.double().tolist(), got.double().tolist()):
        try:
            want = ref.reference(F, pt)
        except (ValueError, ZeroDivisionError, TypeError):
            continue  # outside the domain (complex), or no closed-form derivative there
        big, small = (1e300, 1e-280) if dtype == torch.float64 else (1e37, 1e-30)
        if not ref.mp.isfinite(want) or abs(want) > big or abs(want) < small:
            continue
        n += 1
        err = ref.relative_error(g, want)
        rtol = 1e-12 if dtype == torch.float64 else 1e-5
        kappa = ref.condition(F, pt) if err > 64 * eps else 0.0
        allowed = max(rtol, 64 * eps * kappa)
        worst = max(worst, err)
        if kappa <= WELL_CONDITIONED:
            worst_wc = max(worst_wc, err)
        if err / allowed > worst_norm:
            worst_norm, where = err / allowed, (pt, g, float(want))
    return worst_wc, worst_norm, n, where, worst


def compile_times(names):
    """Seconds of the first compile of each function in a fresh process with an empty disk cache."""
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, ADJOINTGEN_CACHE=cache)
        for cls, name, f, *_ in FUNCTIONS:
            if names and name not in names:
                continue
            code = ("import time, sympy as sp; from adjointgen.codegen.scalar import compile_cached; "
                    f"x = sp.Symbol('x', real=True); f = sp.sympify({sp.sstr(f)!r}, locals={{'x': x}}); "
                    "t = time.perf_counter(); compile_cached(f); print(time.perf_counter() - t)")
            r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
            out[name] = float(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else math.nan
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", help="comma-separated function names")
    p.add_argument("--no-compile-times", action="store_true")
    args = p.parse_args(argv)
    names = set(args.only.split(",")) if args.only else None
    rows, by_class, failures = [], {}, []
    start = time.perf_counter()
    for cls, name, f, P, T in FUNCTIONS:
        if names and name not in names:
            continue
        r1 = measure(f, pairs(P, args.quick), 1)
        r2 = measure(f, triples(T, args.quick), 2)
        s1 = measure(f, pairs(P[: 4 if args.quick else None], True), 1, torch.float32)
        rows.append((cls, name, f"{r1[0]:.1e}", f"{r1[4]:.1e}", f"{r1[1]:.2f}", r1[2], f"{r2[0]:.1e}", f"{r2[4]:.1e}",
                     f"{r2[1]:.2f}", r2[2], f"{s1[1]:.2f}"))
        c = by_class.setdefault(cls, [0.0, 0.0, 0.0, 0.0, 0.0, 0, 0.0, 0.0])
        c[0], c[1] = max(c[0], r1[0]), max(c[1], r1[1])
        c[2], c[3] = max(c[2], r2[0]), max(c[3], r2[1])
        c[4], c[5] = max(c[4], s1[1]), c[5] + r1[2] + r2[2]
        c[6], c[7] = max(c[6], r1[4]), max(c[7], r2[4])
        for label, r in (("f[a, b]", r1), ("f[a, b, c]", r2), ("f[a, b] float32", s1)):
            if r[1] > 1:
                failures.append(f"{name} {label}: {r[3]}")
    print(table(rows, ["class", "f", "f[a,b] rel (κ<=1e3)", "anywhere", "/ allowed", "pts", "f[a,b,c] rel (κ<=1e3)",
                       "anywhere", "/ allowed", "pts", "float32 / allowed"]))
    print(f"\n{sum(1 for _ in rows)} functions, {time.perf_counter() - start:.0f} s")
    class_rows = [(cls, f"{c[0]:.1e}", f"{c[6]:.1e}", f"{c[1]:.2f}", f"{c[2]:.1e}", f"{c[7]:.1e}", f"{c[3]:.2f}",
                   f"{c[4]:.2f}", c[5]) for cls, c in by_class.items()]
    print(table(class_rows, ["class", "f[a,b] rel (κ<=1e3)", "anywhere", "/ allowed", "f[a,b,c] rel (κ<=1e3)", "anywhere",
                             "/ allowed", "float32 / allowed", "points"]))
    if failures:
        print("\npoints over the allowed error:\n  " + "\n  ".join(failures))
    results = [{"benchmark": "sweep_funm", "case": f"{cls}: worst error / allowed (f[a,b], f[a,b,c])",
                "value": max(c[1], c[3]), "format": ".2f", "target": "<= 1"} for cls, c in by_class.items()]
    if not args.no_compile_times:
        times = compile_times(names)
        failed = sorted(k for k, v in times.items() if not math.isfinite(v))
        if failed:
            print(f"\ncompile failed in a fresh process: {', '.join(failed)}")
        worst = max(times, key=lambda k: times[k] if math.isfinite(times[k]) else math.inf)
        print("\nfirst-call compile time (fresh process, empty cache): "
              + ", ".join(f"{k} {v:.2f} s" for k, v in sorted(times.items(), key=lambda kv: -kv[1])[:6]) + ", ...")
        results.append({"benchmark": "sweep_funm", "case": f"first-call compile, slowest ({worst})",
                        "seconds": times[worst], "target": "<= 2 s"})
    return results


if __name__ == "__main__":
    main()

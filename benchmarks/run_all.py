"""Every benchmark at its reported size, then one table of the ratios (ours / anchor, measured in
the same run; below 1: faster than the anchor) against their targets.

    python benchmarks/run_all.py            # the sizes the README reports (~10 minutes on 2 cores)
    python benchmarks/run_all.py --quick    # small sizes, a smoke run (CI runs it; targets not judged)
    python benchmarks/run_all.py --only eigh,svd

Each script also prints its own detailed table first.  Timings on a loaded machine swing several
fold: the load average is printed with the table.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import table  # noqa: E402

#: (module, extra arguments): each module's main(argv) returns a list of result dicts
BENCHMARKS = [
    ("bench_eigh", []),
    ("bench_svd", []),
    ("bench_funm", []),
    ("bench_factorizations", []),
    ("bench_pinv", []),
    ("bench_eigsh", []),
    ("bench_jax", []),
    ("bench_jax_rules", []),
    ("bench_new_ops", []),
    ("sweep_funm", []),
    ("count_host_reads", []),
    ("bench_cpp_floor", []),
]
#: --only names of the scripts not called bench_<name>
SHORT = {"sweep_funm": "sweep", "count_host_reads": "reads"}


def judged(result, quick: bool) -> str:
    """``met`` / ``MISSED`` against a target ``<= x`` (``--quick``: not judged)."""
    target = result.get("target") or ""
    value = result.get("ratio", result.get("seconds", result.get("value")))
    match = re.fullmatch(r"\s*<=\s*([0-9.]+)\s*s?\s*", target)
    if quick or not match or value is None:
        return "-"
    return "met" if value <= float(match.group(1)) else "MISSED"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run; targets not judged)")
    p.add_argument("--only", help="comma-separated benchmark names (eigh, svd, funm, factorizations, pinv, eigsh, jax, new_ops, "
                                  "sweep, reads, cpp_floor)")
    args = p.parse_args(argv)
    wanted = set(args.only.split(",")) if args.only else None
    results, failed = [], []
    start = time.perf_counter()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    for module_name, extra in BENCHMARKS:
        short = SHORT.get(module_name, module_name.removeprefix("bench_"))
        if wanted and short not in wanted:
            continue
        print(f"\n===== {module_name} {' '.join(extra + (['--quick'] if args.quick else []))}", flush=True)
        try:
            module = importlib.import_module(module_name)
            results += module.main(extra + (["--quick"] if args.quick else [])) or []
        except Exception:  # a broken benchmark fails the run, after the others ran
            traceback.print_exc()
            failed.append(module_name)
    rows = []
    for r in results:
        if "ratio" in r:
            value = f"{r['ratio']:.2f}"
        elif "seconds" in r:
            value = f"{r['seconds']:.1f} s" if r["seconds"] >= 10 else f"{r['seconds']:.2f} s"
        else:
            value = format(r["value"], r.get("format", ".3g"))
        rows.append((r["benchmark"], r["case"], value, r.get("anchor", ""), r.get("target", ""), judged(r, args.quick)))
    import torch

    print(f"\n===== summary ({'quick' if args.quick else 'reported sizes'}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; load average {load:.2f} at start, "
          f"{os.getloadavg()[0] if hasattr(os, 'getloadavg') else float('nan'):.2f} at end; "
          f"{time.perf_counter() - start:.0f} s)")
    print(table(rows, ["benchmark", "case", "ours/anchor", "anchor", "target", "verdict"]))
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

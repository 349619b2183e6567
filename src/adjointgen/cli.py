"""Command line: ``adjointgen generate|audit|list`` (also ``python -m adjointgen``)."""
from __future__ import annotations

import argparse
import html
import sys
import time
from pathlib import Path

from .audit import AuditError
from .calculus.algebra import DerivationError
from .codegen import generate as gen


def _root(args) -> Path:
    return gen.find_root(args.root)


def cmd_generate(args) -> int:
    root = _root(args)
    t0 = time.perf_counter()
    try:
        files = gen.render(root, args.names)
    except gen.GenerationFailed as exc:
        if exc.report_text:
            print(exc.report_text, file=sys.stderr)
        print(f"error: {exc}\nnothing was written.", file=sys.stderr)
        return 1
    remove = gen.stale(files, root) if not args.names else []
    if args.check:
        diff = gen.check(files, root, remove)
        if diff:
            sys.stdout.write(diff)
            print("\ngenerated/ is out of date: run `adjointgen generate` and commit the result.", file=sys.stderr)
            return 1
        print(f"generated/ is in sync ({len(files)} files, {time.perf_counter() - t0:.1f} s)")
        return 0
    written = gen.write(files, remove)
    for p in written:
        print(f"wrote {p.relative_to(root)}")
    print(f"{len(files)} files, {len(written)} changed, {time.perf_counter() - t0:.1f} s")
    return 0


def cmd_audit(args) -> int:
    root = _root(args)
    names = args.names or gen.derivation_names(root)
    ok = True
    for name in names:
        try:
            a = gen.audit_one(root, name, symbolic=not args.numeric_only)
        except DerivationError as exc:
            print(f"{name}: error: {exc}")
            ok = False
            continue
        print(a.report.to_text())
        if a.report.passed:
            for rule in (a.derivation.jvp, a.derivation.vjp):
                for out, expr in rule.code.items():
                    print(f"  {out} = {expr}")
        else:
            f = a.report.first_failure()
            print(f"  first failure: step {f.index} '{f.label}' ({a.report.path}"
                  f"{':' + str(f.line) if f.line else ''}): {f.failure}")
        ok &= a.report.passed
        if args.html:
            out = Path(args.html)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{name}.html").write_text(_html(a))
    return 0 if ok else 1


def _html(a) -> str:
    rows = []
    for s, r in zip(a.derivation.steps, a.report.steps):
        res = "" if r.residual is None else f"{r.residual:.2e}"
        cls = "pass" if r.passed else "fail"
        rows.append(
            f"<tr class='{cls}'><td>{r.index}</td><td>{html.escape(r.label)}</td><td>{r.kind}</td>"
            f"<td><code>{html.escape(str(s.equation) if s.equation is not None else '')}</code></td>"
            f"<td>{res}</td><td>{html.escape(r.symbolic)}</td></tr>"
        )
    return (
        "<!doctype html><meta charset='utf-8'><title>audit: " + html.escape(a.report.name) + "</title>"
        "<style>td{padding:2px 8px;border-bottom:1px solid #ddd}.fail{background:#fdd}</style>"
        f"<h1>{html.escape(a.report.name)}: {html.escape(a.report.title)}</h1>"
        "<table><tr><th>#</th><th>step</th><th>operation</th><th>equation</th><th>residual</th><th>symbolic</th></tr>"
        + "".join(rows) + "</table>"
    )


def cmd_list(args) -> int:
    root = _root(args)
    for name in gen.derivation_names(root):
        # the CUDA file exists only for operations with elementwise kernels
        outs = ", ".join(b.output.format(name=name) for b in gen.BACKENDS
                         if b.name != "cuda" or (root / "generated" / b.output.format(name=name)).is_file())
        print(f"{name:17s} derivations/{name}.py -> generated/{{{outs}}}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="adjointgen", description=__doc__)
    p.add_argument("--root", help="project tree (default: found from the current directory upward)")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="audit and regenerate generated/ (writes nothing if an audit fails)")
    g.add_argument("names", nargs="*", help="operations (default: all)")
    g.add_argument("--check", action="store_true", help="fail with a diff if generated/ is out of date")
    g.set_defaults(func=cmd_generate)
    a = sub.add_parser("audit", help="print every derivation step with its residual")
    a.add_argument("names", nargs="*")
    a.add_argument("--html", metavar="DIR", help="also write an HTML report per operation")
    a.add_argument("--numeric-only", action="store_true", help="skip the symbolic checks")
    a.set_defaults(func=cmd_audit)
    sub.add_parser("list", help="operations, backends and derivation files").set_defaults(func=cmd_list)
    args = p.parse_args(argv)
    try:
        return args.func(args)
    except gen.ProjectError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""adjointgen: derive, audit and generate JVP/VJP rules of matrix operations.

Commands act on the project found from the current directory upward (a pyproject.toml with a
[tool.adjointgen] table), or on --root DIR.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# Only the standard library at import time: `adjointgen --help`, `list` and `init` start without
# SymPy or torch.  The commands import what they need.


def _project(args):
    from .project import catalogue_project, load_project

    if getattr(args, "catalogue", False):
        if args.root:
            raise SystemExit("error: --root and --catalogue exclude each other")
        return catalogue_project()
    return load_project(args.root)


def cmd_generate(args) -> int:
    from .codegen import generate as gen

    gen._limit_threads()
    project = _project(args)
    t0 = time.perf_counter()
    names = args.names or project.derivation_names()
    width = max([len(n) for n in names] or [0])
    how: dict[str, int] = {}

    def on_result(result):
        how[result.how] = how.get(result.how, 0) + 1
        if not args.quiet and not args.check:
            print(result.line(width), flush=True)
            if args.verbose and result.report_text:
                print(result.report_text, flush=True)

    try:
        files = gen.render(project, args.names, jobs=args.jobs, reuse=not args.fresh, quiet=not args.verbose,
                           on_result=on_result)
    except gen.GenerationFailed as exc:
        if exc.report_text:
            print(exc.report_text, file=sys.stderr)
        print(f"error: {exc}\nnothing was written.", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: nothing was written.", file=sys.stderr)
        return 130
    done = ", ".join(f"{n} {k}" for k, n in sorted(how.items()))
    operations = f"{len(names)} operation{'' if len(names) == 1 else 's'}"
    full = not args.names
    manifest = project.output / gen.MANIFEST
    files[manifest] = gen.manifest_text(project, files, None if full else gen.read_manifest(project))
    plan = gen.plan(files, project, full=full, force=args.force)
    problems = plan.problems(project)
    out = project.relative(project.output) + "/"
    if args.check:
        diff = gen.check(files, project, plan.remove)
        if diff or problems:
            sys.stdout.write(diff)
            for line in problems:
                print(f"error: {line}", file=sys.stderr)
            print(f"\n{out} is out of date: run `adjointgen generate` and commit the result.", file=sys.stderr)
            return 1
        print(f"{out} is in sync ({len(files)} files; {operations}: {done}; "
              f"{time.perf_counter() - t0:.1f} s)")
        stale = gen.stale_keys(files, project)
        if stale:
            print(f"note: the recorded keys of {', '.join(stale)} are out of date ({out}{gen.KEYS}: the engine, "
                  "runtime, templates or a library changed, not the results): `adjointgen generate` refreshes them, "
                  "so that the next run reuses these results")
        return 0
    if problems:
        for line in problems:
            print(f"error: {line}", file=sys.stderr)
        print("nothing was written.", file=sys.stderr)
        return 1
    try:
        written = gen.write(files, plan.remove)
    except KeyboardInterrupt:
        print("interrupted while writing: the files listed above are complete, the others unchanged.",
              file=sys.stderr)
        return 130
    removed = set(plan.remove)
    for p in written:
        print(f"{'removed' if p in removed else 'wrote'} {project.relative(p)}")
    print(f"{len(files)} files, {len(written)} changed, {time.perf_counter() - t0:.1f} s "
          f"({operations}: {done})")
    return 0


def cmd_audit(args) -> int:
    from .calculus.algebra import DerivationError
    from .codegen import generate as gen

    project = _project(args)
    names = args.names or project.derivation_names()
    for name in names:
        project.derivation_path(name)
    ok = True
    audited = []
    for name in names:
        try:
            a = gen.audit_one(project, name, symbolic=not args.numeric_only)
        except DerivationError as exc:
            print(f"{name}: error: {exc}")
            ok = False
            continue
        print(a.report.to_text())
        missing = gen.missing_steps(a.derivation)
        if a.report.passed and missing:
            print(f"  INCOMPLETE: every step so far passes; still missing {'; '.join(missing)}")
            ok = False
        elif a.report.passed:
            for rule in (a.derivation.jvp, a.derivation.vjp):
                if rule is None:
                    continue
                for out, expr in rule.rewritten.items():
                    print(f"  {out} = {expr}")
        else:
            f = a.report.first_failure()
            print(f"  first failure: step {f.index} '{f.label}' ({a.report.path}"
                  f"{':' + str(f.line) if f.line else ''}): {f.failure}")
        ok &= a.report.passed
        audited.append(a)
    if args.html:
        from .codegen.html import write_site

        out = Path(args.html)
        for path in write_site(project, audited, out):
            print(f"wrote {path}")
    return 0 if ok else 1


def cmd_list(args) -> int:
    project = _project(args)
    names = project.derivation_names()
    if not names:
        print(f"no derivations in {project.relative(project.derivations)}/")
        return 0
    width = max(len(n) for n in names)
    for name in names:
        outs = []
        for backend in project.backends:
            path = project.output_file(backend, name)
            if backend == "cuda" and not path.is_file():
                continue  # CUDA files exist only for operations with elementwise kernels
            outs.append(project.relative(path))
        print(f"{name:{width}s}  {project.relative(project.derivation_path(name))} -> {', '.join(outs)}")
    return 0


def cmd_init(args) -> int:
    from .skeleton import write_project

    try:
        written = write_project(Path(args.dir), package=args.package, force=args.force, copy=args.copy)
    except (FileExistsError, KeyError) as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    for p in written:
        print(f"wrote {p}")
    print(f"next:\n"
          f"  cd {args.dir}\n"
          f"  pip install -e '.[test]'   # the project with what its tests need (torch, pytest); or: pip install torch pytest\n"
          f"  adjointgen generate        # audit derivations/*.py and write the generated package\n"
          f"  python -m pytest -q        # the project's gradient tests")
    return 0


def cmd_reference(args) -> int:
    from .reference import reference_markdown

    text = reference_markdown()
    if args.check:
        path = Path(args.check)
        if not path.is_file() or path.read_text() != text:
            print(f"{path} is out of date: run `adjointgen reference > {path}`", file=sys.stderr)
            return 1
        print(f"{path} is in sync")
        return 0
    sys.stdout.write(text)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="adjointgen", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", help="project folder (default: found from the current directory upward)")
    p.add_argument("--catalogue", action="store_true",
                   help="act on adjointgen's own catalogue as installed (audit, list, generate --check)")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="audit and regenerate the output package (writes nothing if an audit fails)")
    g.add_argument("names", nargs="*", help="operations (default: all)")
    g.add_argument("--check", action="store_true", help="fail with a diff if the output package is out of date")
    g.add_argument("--jobs", type=int, default=None, help="worker processes (default: the CPU count)")
    g.add_argument("-q", "--quiet", action="store_true", help="no line per operation (only what changed)")
    g.add_argument("-v", "--verbose", action="store_true",
                   help="also every step of each operation audited, with its verdict (after the operation's line)")
    g.add_argument("--force", action="store_true",
                   help="overwrite (or remove) generated files changed by hand since they were written")
    g.add_argument("--fresh", action="store_true",
                   help="recompute everything (by default a derivation whose record in the output package, "
                        "audit/<name>.json, has the keys of its current sources -- the derivation, the project "
                        "modules it imports, the engine, the audit, the code generator, the runtime, the templates, "
                        "the settings and the library versions -- and whose files are unchanged, is reused as it is)")
    g.set_defaults(func=cmd_generate)
    a = sub.add_parser("audit", help="print every derivation step with its residual")
    a.add_argument("names", nargs="*")
    a.add_argument("--html", metavar="DIR", help="also write self-contained HTML pages (MathML) to DIR")
    a.add_argument("--numeric-only", action="store_true", help="skip the symbolic checks")
    a.set_defaults(func=cmd_audit)
    sub.add_parser("list", help="operations, their derivation files and generated files").set_defaults(func=cmd_list)
    i = sub.add_parser("init", help="write a minimal project: configuration, an example derivation and its test")
    i.add_argument("dir", help="folder of the new project (created; must not hold a pyproject.toml)")
    i.add_argument("--package", help="the generated package (default: <dir name>._adjoint)")
    i.add_argument("--force", action="store_true", help="overwrite existing files")
    i.add_argument("--copy", action="append", default=[], metavar="NAME",
                   help="also copy the catalogue's derivation NAME (and its helpers) into the project, to edit "
                        "(e.g. funm, to instantiate matrix functions of your own); repeatable")
    i.set_defaults(func=cmd_init)
    r = sub.add_parser("reference", help="print the reference of derivation steps and the sampler contract (markdown)")
    r.add_argument("--check", metavar="FILE", help="fail if FILE differs from the reference")
    r.set_defaults(func=cmd_reference)
    args = p.parse_args(argv)
    from .project import ProjectError

    try:
        return args.func(args)
    except ProjectError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""Load derivations, audit them, render every backend's templates, verify what was rendered, write
or check the output package.

Nothing is written unless every requested derivation passes its audit and every generated function
reproduces the audited rule on the audit's own instances (:mod:`adjointgen.codegen.verify`).
Output is deterministic: sorted iteration, canonical value names, no timestamps; a file is rewritten
only when its content changes.
"""
from __future__ import annotations

import difflib
import hashlib
import json
import os
import runpy
import sys
from dataclasses import dataclass
from pathlib import Path

from ..project import BACKENDS as BACKEND_DIRS
from ..project import Project, ProjectError, find_project, load_project

__all__ = [
    "BACKENDS", "GenerationFailed", "ProjectError", "audit_one", "check", "derivation_names", "find_root",
    "load_derivation", "load_derivation_file", "render", "stale", "write",
]


@dataclass(frozen=True)
class Backend:
    """One target, described once: nothing in the generator branches on a backend's name.

    Attributes:
        name: the name a project's ``backends`` setting uses.
        template: the operation template (the project's own first, then the built-in one); the
            templates it includes are found while it renders and become sources of the file.
        printer: the printer of the rules' value DAG (:data:`adjointgen.codegen.printers.PRINTERS`),
            ``None`` when the backend prints no rule.
        comment: line-comment prefix of the header (``None``: an HTML comment).
        runtime: the helper modules its generated code may import (module prefixes); the
            numerical guards and algorithms live there, not in the template.
        package_init: the package ``__init__`` it needs under the output package, if any.
        kernels: it emits elementwise kernels: only for operations that have an elementwise part,
            and the other backends' code may launch them.
        verifier: how :mod:`adjointgen.codegen.verify` runs its generated module against the
            audited rules (``None``: the text is only compared).
    """

    name: str
    template: str
    printer: str | None
    comment: str | None
    runtime: tuple[str, ...] = ()
    package_init: str | None = None
    kernels: bool = False
    verifier: str | None = None

    @property
    def output(self) -> str:
        """The file of an operation, relative to the output package, with ``{name}``."""
        return BACKEND_DIRS[self.name]

    def emits(self, op) -> bool:
        """Whether the operation has a file of this backend."""
        return not self.kernels or bool(op.kernel_variants or op.instances)


BACKENDS = (
    Backend("torch", "torch/op.py.j2", "torch", "#", runtime=("adjointgen.runtime",),
            package_init="torch/__init__.py", verifier="torch"),
    Backend("cupy", "cupy/op.py.j2", "xp", "#", runtime=("adjointgen.runtime.xp", "adjointgen.runtime.divided",
                                                       "adjointgen.runtime.host"),
            package_init="cupy/__init__.py", verifier="array"),
    Backend("cuda", "cuda/op.cu.j2", None, "//", runtime=("adjointgen_divided.cuh",), kernels=True),
    Backend("jax", "jax/op.py.j2", "jax", "#", runtime=("adjointgen.runtime.jax", "adjointgen.runtime.rules",
                                                     "adjointgen.runtime.host"),
            package_init="jax/__init__.py", verifier="jax"),
    Backend("report", "report/audit.md.j2", None, None),
)

PACKAGE_TEMPLATE = "package/__init__.py.j2"


def _project(root) -> Project:
    return root if isinstance(root, Project) else load_project(root)


def find_root(start=None) -> Path:
    """The project folder at or above ``start`` (see :func:`adjointgen.project.find_project`)."""
    return find_project(start)


def derivation_names(root) -> list[str]:
    return _project(root).derivation_names()


def load_derivation(root, name: str, *, partial: bool = False) -> "OperationSpec":
    """Run ``<derivations>/<name>.py`` of the project and return its frozen spec
    (:class:`~adjointgen.calculus.spec.OperationSpec`)."""
    return load_derivation_file(_project(root).derivation_path(name), partial=partial)


def load_derivation_file(path: Path, *, partial: bool = False) -> "OperationSpec":
    """Run one derivation script and freeze its :class:`Derivation` into the spec every later stage
    reads (:class:`~adjointgen.calculus.spec.OperationSpec`).  Its folder is importable while it runs, so that scripts can
    share steps through helper modules (``derivations/_*.py``), as when run with ``python``.

    With ``partial``, a script stopped by a :class:`DerivationError` still returns the derivation
    with the steps recorded so far (the failed one last, ``error`` set) for the audit to report.
    Any other exception of the script is reported as a :class:`DerivationError` naming the file
    and the line of the script where it happened."""
    from ..calculus.algebra import DerivationError
    from ..calculus.derivation import Derivation

    path = Path(path).resolve()
    start = len(Derivation.created)
    folder = str(path.parent)
    helpers = {p.stem for p in path.parent.glob("_*.py")}
    for name in helpers:  # a helper of another project's derivations folder may be cached
        sys.modules.pop(name, None)
    sys.path.insert(0, folder)
    try:
        ns = runpy.run_path(str(path), run_name=f"adjointgen_derivation_{path.stem}")
    except DerivationError as exc:
        mine = [d for d in Derivation.created[start:] if d.path == str(path)]
        if partial and mine:
            d = mine[-1]
            if d.error is None:  # raised inside the engine rather than by a step
                d.stopped(str(exc))
            return d.freeze()
        raise
    except Exception as exc:
        raise DerivationError(f"{_where(path, exc)}: {type(exc).__name__}: {exc}") from exc
    finally:
        del Derivation.created[start:]
        sys.path.remove(folder)
        for name in helpers:
            sys.modules.pop(name, None)
    found = [v for v in ns.values() if isinstance(v, Derivation)]
    if len(found) != 1:
        raise DerivationError(f"{path}: a derivation file must define exactly one Derivation (found {len(found)})")
    return found[0].freeze()


def _where(path: Path, exc: BaseException) -> str:
    """``file:line`` of the innermost frame of ``exc`` inside the derivation script."""
    import traceback

    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename).resolve() == path:
            line = frame.lineno
    return f"{path}:{line}" if line else str(path)


def helper_modules(path: Path) -> list[Path]:
    """The ``derivations/_*.py`` helpers a derivation imports (they are sources of its output)."""
    import re

    names = re.findall(r"^\s*(?:import|from)\s+(_\w+)", path.read_text(), flags=re.M)
    return [path.parent / f"{name}.py" for name in sorted(set(names)) if (path.parent / f"{name}.py").is_file()]


# ------------------------------------------------------------------------------------- templates
class TemplateError(ProjectError):
    """A template is missing, malformed, or refers to something the generator does not provide."""


def _recording_loader_class():
    import jinja2

    class RecordingLoader(jinja2.ChoiceLoader):
        """The project's template folders, then the built-in ones; ``loaded`` lists the names of
        the templates loaded (the includes of a render: sources of the file it renders)."""

        def __init__(self, loaders):
            super().__init__(loaders)
            self.loaded: list[str] = []

        def load(self, environment, name, globals=None):
            if name not in self.loaded:
                self.loaded.append(name)
            return super().load(environment, name, globals)

    return RecordingLoader


def _RecordingLoader(loaders):
    return _recording_loader_class()(loaders)


def _environment(project: Project):
    import jinja2

    from .printers import scalar_c, scalar_python

    env = jinja2.Environment(
        loader=_RecordingLoader([jinja2.FileSystemLoader(str(d)) for d in project.template_dirs]),
        cache_size=0,  # every include is loaded, and so recorded, each time it renders
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["pyscalar"] = scalar_python
    env.filters["cscalar"] = scalar_c
    env.filters["at"] = lambda seq, i: seq[i]
    env.filters["mdcell"] = lambda x: ("`" + str(x).replace("|", "\\|") + "`") if x is not None else ""
    env.filters.update(_SPECTRAL_FILTERS)
    return env


def _program_source(program) -> str:
    """A scalar program as a Python literal (its ``to_data()``), deterministic and readable."""
    import pprint

    text = pprint.pformat(program.to_data(), width=110, sort_dicts=False, compact=True)
    return "\n    ".join(text.splitlines())


def _xreplace(expr, var, name):
    import sympy as sp

    return expr.xreplace({var: sp.Symbol(name, real=True)})


_SPECTRAL_FILTERS = {
    "prepend": lambda s, prefix: prefix + s,
    "pytuple": lambda xs: "(" + "".join(f"{x!r}, " for x in xs) + ")",
    "pyprogram": _program_source,
    "cuda_dd": lambda inst: __import__("adjointgen.codegen.printers", fromlist=["x"]).program_cuda_dd(
        inst.program, inst.name, inst.option_names),
    "of_matrix": lambda inst, name: __import__("sympy").sstr(_xreplace(inst.expr, inst.variable, name)),
}


def _template(env, project: Project, name: str):
    """The template ``name`` (the project's own first), with errors that say where it looked."""
    import jinja2

    try:
        return env.get_template(name)
    except jinja2.TemplateNotFound:
        where = ", ".join(str(d) for d in project.template_dirs)
        raise TemplateError(f"template {name!r} not found; looked in: {where}") from None
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"{exc.filename or name}:{exc.lineno}: template syntax error: {exc.message}") from None


def _render_template(template, **context) -> str:
    import jinja2

    try:
        return template.render(**context)
    except jinja2.UndefinedError as exc:
        raise TemplateError(f"{template.filename}: {exc} (the generator provides: "
                            f"{', '.join(sorted(context))})") from None
    except jinja2.TemplateError as exc:
        raise TemplateError(f"{template.filename}: {type(exc).__name__}: {exc}") from None


def _source_label(project: Project, path: Path) -> str:
    """How a header names a source: relative to the project (or by the project's aliases), or
    ``adjointgen/templates/...`` for the built-in templates of an installed adjointgen."""
    path = Path(path).resolve()
    if project.aliases:
        return project.label(path)
    try:
        return path.relative_to(project.root).as_posix()
    except ValueError:
        from ..project import builtin_templates

        try:
            return "adjointgen/templates/" + path.relative_to(builtin_templates().resolve()).as_posix()
        except ValueError:
            return path.as_posix()


def _header(comment: str | None, sources: list[Path], project: Project) -> str:
    digest = hashlib.sha256()
    labels = []
    for s in sources:
        label = _source_label(project, s)
        labels.append(label)
        digest.update(label.encode())
        digest.update(Path(s).read_bytes())
    text = [
        "generated by adjointgen — do not edit.",
        f"sources: {', '.join(labels)}",
        f"sha256 of sources: {digest.hexdigest()}",
        "edit the sources and run `adjointgen generate`.",
    ]
    if comment is None:
        return "<!-- " + " ".join(text) + " -->"
    return "\n".join(f"{comment} {t}" for t in text)


# ------------------------------------------------------------------------------------- audit
@dataclass
class Audited:
    derivation: Derivation
    report: object  # AuditReport
    op: object  # OperationIR or None


#: where a generation records the symbolic verdicts of each derivation, in the output package
SYMBOLIC_RECORD = "audit/{name}.symbolic.json"


def _engine_digest() -> str:
    """What the symbolic verdicts depend on besides the derivation: the engine's sources (the
    calculus and the audit) and SymPy's version."""
    import sympy

    digest = hashlib.sha256(sympy.__version__.encode())
    here = Path(__file__).resolve().parent.parent
    for sub in ("calculus", "audit"):
        for f in sorted((here / sub).glob("*.py")):
            digest.update(f"{sub}/{f.name}".encode())
            digest.update(f.read_bytes())
    return digest.hexdigest()


def symbolic_key(project: Project, derivation_path: Path) -> str:
    """The key of a derivation's symbolic verdicts: its file and helpers, the engine, SymPy."""
    digest = hashlib.sha256(_engine_digest().encode())
    for s in [derivation_path, *helper_modules(derivation_path)]:
        digest.update(_source_label(project, s).encode())
        digest.update(Path(s).read_bytes())
    return digest.hexdigest()


def _known_verdicts(project: Project, name: str, key: str) -> dict | None:
    """The verdicts the output package records for exactly these sources (``None``: none)."""
    path = project.output / SYMBOLIC_RECORD.format(name=name)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != key:
        return None
    return {(int(i), kind, label): verdict for i, kind, label, verdict in record.get("steps", [])}


def _symbolic_record(key: str, report) -> str:
    about = ("symbolic verdicts of the audit of these sources, reused by `adjointgen generate` while the key "
             "(sha256 of the derivation, its helpers, the engine and SymPy's version) matches; "
             "`adjointgen generate --fresh` and `adjointgen audit` recompute them")
    steps = ",\n".join("  " + json.dumps([r.index, r.kind, r.label, r.symbolic], ensure_ascii=False)
                       for r in report.steps)
    return (f'{{\n "about": {json.dumps(about)},\n "key": {json.dumps(key)},\n "steps": [\n{steps}\n ]\n}}\n')


def audit_one(root, name: str, *, symbolic: bool = True, reuse: bool = False, progress=None) -> Audited:
    """Audit one derivation and lower it.  ``reuse``: take the symbolic verdicts the output package
    records for these very sources instead of recomputing them (see :data:`SYMBOLIC_RECORD`)."""
    from ..audit import audit
    from .lower import lower_derivation

    project = _project(root)
    with project.importable():  # a forward the derivation declares may live in the project
        d = load_derivation(project, name, partial=True)
        known = None
        if reuse and symbolic:
            known = _known_verdicts(project, name, symbolic_key(project, Path(d.path)))
        report = audit(d, symbolic=symbolic, known=known, symbolic_timeout=project.symbolic_timeout,
                       progress=progress)
    complete = d.jvp is not None and d.vjp is not None
    op = (lower_derivation(d, str(project.root), project.package, label=project.label(d.path))
          if report.passed and d.error is None and complete else None)
    return Audited(d, report, op)


def missing_steps(d) -> list[str]:
    """What a derivation still lacks before rules can be generated from it (empty when finished)."""
    missing = []
    if d.jvp is None:
        missing.append("the JVP: d.set_jvp(d<output>=...) with a solved tangent for every output")
    if d.vjp is None:
        missing.append("the VJP: d.derive_vjp() (after set_jvp)")
    return missing


class GenerationFailed(Exception):
    """A derivation failed its audit (or could not be carried out, or its generated code does not
    reproduce the audited rule); carries the printed report."""

    def __init__(self, message: str, report_text: str = ""):
        super().__init__(message)
        self.report_text = report_text

    def __reduce__(self):
        return (GenerationFailed, (str(self), self.report_text))


def render(root, names: list[str] | None = None, *, jobs: int | None = None,
           verify: bool = True, reuse: bool = True, quiet: bool = True) -> dict[Path, str]:
    """Audit the named derivations (all by default) and render their files.

    Derivations are audited in parallel processes (``jobs``, default: the CPU count).  Raises
    :class:`GenerationFailed` at the first failed step or failed verification of the generated
    code; nothing is rendered then.  ``quiet=False``: each step is reported on stderr as it is
    checked, with its time, and each derivation with a summary.  A KeyboardInterrupt stops the
    workers and propagates (nothing has been written).
    """
    project = _project(root)
    all_names = project.derivation_names()
    names = all_names if not names else list(names)
    for nm in names:
        project.derivation_path(nm)  # a clear error for an unknown name
    jobs = min(len(names), jobs or os.cpu_count() or 1)
    if jobs > 1:
        import concurrent.futures
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        # longest first (file size as the proxy for audit time), so that no long one starts last
        order = sorted(names, key=lambda nm: -project.derivation_path(nm).stat().st_size)
        pool = concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx)
        try:
            futures = [pool.submit(_render_operation, project, nm, verify, reuse, quiet) for nm in order]
            by_name = dict(zip(order, [f.result() for f in futures]))
        except BaseException:  # Ctrl-C (or a worker's crash): stop the workers, write nothing
            for process in list(getattr(pool, "_processes", {}).values()):
                process.terminate()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        results = [by_name[nm] for nm in names]
    else:
        results = [_render_operation(project, name, verify, reuse, quiet) for name in names]
    files: dict[Path, str] = {}
    for result in results:
        if isinstance(result, (GenerationFailed, ProjectError)):
            raise result
        files.update(result)
    files.update(_package_files(project, all_names))
    return files


def _package_files(project: Project, names: list[str]) -> dict[Path, str]:
    env = _environment(project)
    package = _template(env, project, PACKAGE_TEMPLATE)
    header = _header("#", [Path(package.filename)], project)
    files = {}
    wanted = [b for b in BACKENDS if b.name in project.backends and b.package_init]
    for backend in wanted:
        files[project.output / backend.package_init] = _render_template(
            package, header=header, backend=backend.name, names=names, package=project.package)
    if wanted:
        files[project.output / "__init__.py"] = _render_template(
            package, header=header, backend=" and ".join(b.name for b in wanted), names=names,
            package=project.package)
    return files


class _Progress:
    """The live report of one derivation's audit on stderr: a line per step (its time, and its
    symbolic verdict where it is not "verified"), then a summary."""

    def __init__(self, name: str):
        import time

        self.name, self.start = name, time.perf_counter()
        self.counts = {"verified": 0, "numeric only": 0, "timed out": 0}

    def __call__(self, result, seconds, total):
        verdict = result.symbolic
        if verdict == "verified":
            self.counts["verified"] += 1
        elif verdict.startswith("numeric only (symbolic replay timed out"):
            self.counts["timed out"] += 1
        else:
            self.counts["numeric only"] += 1
        note = "" if verdict == "verified" else f"  [{verdict.split(':')[0]}]"
        print(f"  {self.name} {result.index:3d}/{total} {seconds:6.2f} s  {result.label}{note}", file=sys.stderr,
              flush=True)

    def summary(self):
        import time

        c = self.counts
        timed = f", {c['timed out']} symbolic replays timed out" if c["timed out"] else ""
        print(f"{self.name}: {sum(c.values())} steps, {c['verified']} verified symbolically{timed}, "
              f"{time.perf_counter() - self.start:.1f} s", file=sys.stderr, flush=True)


def _render_operation(project: Project, name: str, verify: bool = True, reuse: bool = False, quiet: bool = True):
    """Audit one derivation, render its files and verify them (run in a worker process)."""
    from ..audit import AuditError
    from ..calculus.algebra import DerivationError

    progress = None if quiet else _Progress(name)
    try:
        try:
            a = audit_one(project, name, reuse=reuse, progress=progress)
        except DerivationError as exc:
            return GenerationFailed(str(exc))
        failed = a.report.first_failure()
        if failed is not None:
            return GenerationFailed(str(AuditError(a.report, failed)), a.report.to_text())
        if a.derivation.error is not None:
            return GenerationFailed(a.derivation.error, a.report.to_text())
        missing = missing_steps(a.derivation)
        if missing:
            return GenerationFailed(f"{a.derivation.path}: derivation '{name}' is not finished: every step so far "
                                    f"passes its audit, and it still needs {'; '.join(missing)} "
                                    f"(adjointgen audit {name} shows the steps)", a.report.to_text())
        files, texts = _render_files(project, a)
        if verify:
            from .verify import VerificationFailed, verify_generated

            try:
                verify_generated(project, a.derivation, a.op, texts)
            except VerificationFailed as exc:
                return GenerationFailed(str(exc), a.report.to_text())
        if progress is not None:
            progress.summary()
        return files
    except ProjectError as exc:
        return exc


def _render_files(project: Project, a: Audited):
    from .printers import PRINTERS

    env = _environment(project)
    op = a.op
    files: dict[Path, str] = {}
    texts: dict[str, tuple[Path, str]] = {}
    derivation_path = Path(a.derivation.path)
    steps = [
        _StepRow(r.index, r.label, r.kind, str(s.equation) if s.equation is not None else None, r.passed, r.symbolic)
        for s, r in zip(a.derivation.steps, a.report.steps)
    ]
    selected = [b for b in BACKENDS if b.name in project.backends]
    has_kernels = any(b.kernels and b.emits(op) for b in selected)
    for backend in selected:
        if not backend.emits(op):
            continue  # a kernel backend, and no elementwise part: no kernels to emit
        template = _template(env, project, backend.template)
        lines = {}
        if backend.printer:
            printer = PRINTERS[backend.printer]
            lines = {r.name: printer.lines(r) for r in op.rules}
        path = project.output / backend.output.format(name=op.name)
        env.loader.loaded.clear()
        context = dict(
            op=op,
            package=project.package,
            has_kernels=has_kernels,
            cls="".join(part.capitalize() for part in op.name.split("_")) + "Function",
            lines=lines,
            pairwise_by_name={f.name: f for f in op.pairwise},
            report=a.report,
            steps=steps,
            tolerance=a.report.steps[0].tolerance if a.report.steps else 0,
        )
        _render_template(template, header="", **context)  # finds the templates it includes
        included = [Path(_template(env, project, name).filename) for name in env.loader.loaded if name != backend.template]
        sources = [derivation_path, *helper_modules(derivation_path), Path(template.filename), *included]
        text = _render_template(template, header=_header(backend.comment, sources, project), **context)
        files[path] = text
        texts[backend.name] = (path, text)
    files[project.output / SYMBOLIC_RECORD.format(name=op.name)] = _symbolic_record(
        symbolic_key(project, derivation_path), a.report)
    return files, texts


@dataclass(frozen=True)
class _StepRow:
    index: int
    label: str
    kind: str
    equation: str | None
    passed: bool
    symbolic: str


# ------------------------------------------------------------------------------------- files
#: the generator's record of what it wrote, in the output package: {relative path: sha256}
MANIFEST = ".adjointgen-manifest.json"
#: what every generated text file says at its top (the JSON symbolic records: their "about")
GENERATED_MARKS = ("generated by adjointgen — do not edit", '"about": "symbolic verdicts of the audit')


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def read_manifest(project: Project) -> dict[str, str] | None:
    """The manifest of the last generation (``None`` before the first one that kept one)."""
    path = project.output / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        return {str(k): str(v) for k, v in data.get("files", {}).items()}
    except (ValueError, AttributeError):
        return None


def manifest_text(project: Project, files: dict[Path, str], keep: dict[str, str] | None = None) -> str:
    """The manifest of ``files`` (plus entries ``keep`` of files not re-rendered), deterministic."""
    entries = dict(keep or {})
    for path, text in files.items():
        entries[path.relative_to(project.output).as_posix()] = _digest(text)
    entries.pop(MANIFEST, None)
    return json.dumps({"about": "files written by adjointgen generate, with their sha256: only these are ever "
                                "removed by it, and only while unchanged", "files": dict(sorted(entries.items()))},
                      indent=1, ensure_ascii=False) + "\n"


def _looks_generated(path: Path) -> bool:
    try:
        head = path.read_text(errors="replace")[:400]
    except OSError:
        return False
    return any(mark in head for mark in GENERATED_MARKS)


@dataclass
class Plan:
    """What a generation will do to the output package, decided before anything is written."""

    remove: list[Path]
    #: generated files changed by hand since they were written (not removed, not overwritten)
    edited: list[Path]
    #: files in the way that adjointgen did not write
    foreign: list[Path]

    def problems(self, project: Project) -> list[str]:
        out = [f"{project.relative(p)}: changed since adjointgen generated it (move the change into the derivation "
               "or a template, then delete the file or use --force)" for p in self.edited]
        out += [f"{project.relative(p)}: exists and was not written by adjointgen: not overwritten (move it, or "
                "choose another output folder)" for p in self.foreign]
        return out


def plan(files: dict[Path, str], root, *, full: bool = True, force: bool = False) -> Plan:
    """The files to remove (generated earlier, no longer produced, unchanged since), and the files
    that block the generation: hand-edited generated files, and files adjointgen did not write
    where it would write.  A generated file is one listed in the manifest (unchanged: its hash)
    or, before the first manifest, one that carries the generator's header."""
    project = _project(root)
    old = read_manifest(project)
    remove, edited, foreign = [], [], []
    for path, text in sorted(files.items()):
        if not path.is_file() or path.name == MANIFEST:
            continue
        current = path.read_text(errors="replace")
        if current == text:
            continue
        rel = path.relative_to(project.output).as_posix()
        if old is not None and rel in old:
            if _digest(current) != old[rel] and not force:
                edited.append(path)
        elif not _looks_generated(path):
            foreign.append(path)
    if full:
        produced = {p.relative_to(project.output).as_posix() for p in files}
        if old is not None:
            candidates = [project.output / rel for rel in sorted(old) if rel not in produced]
        else:  # the first generation with a manifest: the generator's files by their header
            candidates = []
            for pattern in (*BACKEND_DIRS.values(), SYMBOLIC_RECORD):
                folder, _, name = pattern.partition("/")
                candidates += [q for q in sorted((project.output / folder).glob(name.format(name="*")))
                               if q.relative_to(project.output).as_posix() not in produced]
        for q in candidates:
            if not q.is_file():
                continue
            rel = q.relative_to(project.output).as_posix()
            if old is not None:
                if _digest(q.read_text(errors="replace")) == old[rel] or force:
                    remove.append(q)
                else:
                    edited.append(q)
            elif _looks_generated(q):
                remove.append(q)
    return Plan(remove, edited, foreign)


def stale(files: dict[Path, str], root) -> list[Path]:
    """Generated files of the output package that a full generation no longer produces (a removed
    derivation's, a backend switched off), unchanged since they were written (:func:`plan`)."""
    return plan(files, root).remove


def write(files: dict[Path, str], remove: list[Path] = ()) -> list[Path]:
    """Write files whose content changed and remove ``remove``; returns the paths changed.  Every
    text is written to a temporary file first and moved into place, so an interrupted generation
    leaves whole files."""
    written = []
    for path in remove:
        path.unlink()
        written.append(path)
    for path, text in sorted(files.items()):
        if path.is_file() and path.read_text() == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        written.append(path)
    return written


def check(files: dict[Path, str], root, remove: list[Path] = ()) -> str:
    """Unified diff between the output package and freshly rendered files ('' when in sync)."""
    project = _project(root)
    out = []
    for path in remove:
        rel = project.relative(path)
        out.extend(difflib.unified_diff(path.read_text().splitlines(True), [], f"a/{rel}", "/dev/null"))
    for path, text in sorted(files.items()):
        old = path.read_text() if path.is_file() else ""
        if old != text:
            rel = project.relative(path)
            out.extend(difflib.unified_diff(old.splitlines(True), text.splitlines(True), f"a/{rel}", f"b/{rel}"))
    return "".join(out)

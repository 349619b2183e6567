"""Load derivations, audit them, render every backend's templates, verify what was rendered, write
or check the output package.

Nothing is written unless every requested derivation passes its audit and every generated function
reproduces the audited rule on the audit's own instances (:mod:`adjointgen.codegen.verify`).
Output is deterministic: sorted iteration, canonical value names, no timestamps; a file is rewritten
only when its content changes.
"""
from __future__ import annotations

import hashlib
import json
import os
import runpy
import sys
from dataclasses import dataclass
from pathlib import Path

from ..project import BACKENDS as BACKEND_DIRS
from ..project import Project, ProjectError, find_project
from .backends import BACKENDS, PACKAGE_TEMPLATE, Backend  # noqa: F401 (re-exported)
from .files import (GENERATED_MARKS, KEYS, MANIFEST, RECORD, Plan, _digest, _project, check,  # noqa: F401
                    manifest_text, plan, read_keys, read_manifest, stale, stale_keys, write)
from .imports import MARKER
from .templates import (TemplateError, _environment, _header, _render_template, _source_label,  # noqa: F401
                        _template, _with_imports)

__all__ = [
    "BACKENDS", "GenerationFailed", "ProjectError", "audit_one", "check", "derivation_names", "find_root",
    "load_derivation", "load_derivation_file", "render", "stale", "write",
]


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
    key = (str(path), partial, _sources_digest(path), _engine_state())
    if key in _LOADED:  # the spec is immutable: the same sources give the same spec
        return _LOADED[key]
    spec = _load_derivation_file(path, partial)
    if len(_LOADED) >= 64:
        _LOADED.pop(next(iter(_LOADED)))
    _LOADED[key] = spec
    return spec


#: (path, partial, digest of the file and its helpers) -> the frozen spec it gave (this process)
_LOADED: dict = {}


def _engine_state() -> int:
    """The engine's functions as they are now in this process (a test that replaces one -- a
    deliberately wrong rule -- gets its own specs, not those frozen before)."""
    from ..calculus import algebra, derivation, evaluate, nodes, spec
    from ..calculus.steps import checks, declarations, identities, projections, rules, solves

    modules = (algebra, derivation, evaluate, nodes, spec, checks, declarations, identities, projections, rules, solves)
    return hash(tuple((m.__name__, k, id(v)) for m in modules for k, v in vars(m).items() if callable(v)))


def _sources_digest(path: Path) -> str:
    digest = hashlib.sha256()
    for f in [path, *helper_modules(path)]:
        digest.update(str(f).encode())
        digest.update(Path(f).read_bytes())
    return digest.hexdigest()


def _load_derivation_file(path: Path, partial: bool):
    from ..calculus.algebra import DerivationError
    from ..calculus.derivation import Derivation

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


# ------------------------------------------------------------------------------------- audit
@dataclass
class Audited:
    derivation: Derivation
    report: object  # AuditReport
    op: object  # OperationIR or None
    #: the report was rebuilt from recorded verdicts (the audit's inputs unchanged)
    reused: bool = False


#: where a generation records the audit of each derivation, in the output package: its verdicts,
KEYS_ABOUT = ("the keys under which `adjointgen generate` recorded each derivation's audit (audit/<name>.json): "
              "sha256 of everything the verdicts and the generated files depend on; a record is reused while its "
              "keys match, and `generate` refreshes this file (`generate --check` does not compare it)")
#: what a record says it is (also how the file is recognised as generated)
RECORD_ABOUT = ("the audit of these sources, reused by `adjointgen generate` while the keys match (sha256 of the "
                "derivation, its helpers and the project modules it imports, the engine, the audit, the code "
                "generator, the runtime, the templates, the project's settings and the versions of Python, SymPy, "
                "NumPy, SciPy, torch and JAX); `adjointgen generate --fresh` and `adjointgen audit` recompute it")


def _package_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def _files_digest(digest, files, label) -> None:
    for f in files:
        digest.update(label(f).encode())
        digest.update(b"\0")
        digest.update(Path(f).read_bytes())
        digest.update(b"\0")


def _adjointgen_dir() -> Path:
    return Path(__file__).resolve().parent.parent


def _audit_digest() -> str:
    """What every audit verdict depends on besides the derivation: the engine (calculus), the audit,
    the names module, and the versions of Python, SymPy, NumPy and SciPy (the numeric instances)."""
    import hashlib

    here = _adjointgen_dir()
    digest = hashlib.sha256(b"adjointgen audit 2\0")
    digest.update(f"python {sys.version_info[0]}.{sys.version_info[1]}\0".encode())
    for package in ("sympy", "numpy", "scipy"):
        digest.update(f"{package} {_package_version(package)}\0".encode())
    files = [here / "names.py"] + sorted((here / "calculus").rglob("*.py")) + sorted((here / "audit").glob("*.py"))
    _files_digest(digest, files, lambda f: Path(f).relative_to(here).as_posix())
    return digest.hexdigest()


def _output_digest(project: Project) -> str:
    """What the generated files and their verification depend on besides the audit: the code
    generator, the runtime the generated code runs on, the templates, the project's settings and the
    versions of torch and JAX (the verification runs them)."""
    import hashlib

    here = _adjointgen_dir()
    digest = hashlib.sha256(b"adjointgen output 2\0")
    for package in sorted({lib for b in BACKENDS if b.name in project.backends for lib in b.libraries}):
        digest.update(f"{package} {_package_version(package)}\0".encode())
    files = [here / "project.py", *sorted((here / "codegen").rglob("*.py")), *sorted((here / "runtime").rglob("*.py")),
             *sorted((here / "runtime").rglob("*.cuh")), *sorted((here / "codegen").rglob("backend.toml"))]
    _files_digest(digest, files, lambda f: Path(f).relative_to(here).as_posix())
    for folder in project.template_dirs:
        templates = sorted(p for p in Path(folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts
                           and p.suffix != ".py")
        _files_digest(digest, templates, lambda f, folder=folder: Path(f).relative_to(folder).as_posix())
    settings = {"package": project.package, "output": project.relative(project.output),
                "backends": list(project.backends), "symbolic_timeout": project.symbolic_timeout}
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()


_DIGESTS: dict = {}


def _digest_of(kind: str, project: Project | None = None) -> str:
    key = (kind, None if project is None else (str(project.root), project.package, project.backends,
                                                 tuple(map(str, project.template_dirs))))
    if key not in _DIGESTS:
        _DIGESTS[key] = _audit_digest() if kind == "audit" else _output_digest(project)
    return _DIGESTS[key]


def record_keys(project: Project, derivation_path: Path, depends: list[str]) -> tuple[str, str]:
    """``(audit key, key)`` of a derivation: the audit key covers what its verdicts depend on
    (its file, helpers and the project modules it imports -- ``depends``, paths relative to the
    project -- the engine, the audit and the numeric libraries); the key adds what its generated
    files and their verification depend on (:func:`_output_digest`)."""
    digest = hashlib.sha256(_digest_of("audit").encode())
    sources = [derivation_path, *helper_modules(derivation_path)]
    sources += [project.root / rel for rel in depends if (project.root / rel).is_file()]
    _files_digest(digest, sources, lambda f: _source_label(project, f))
    for rel in depends:  # a dependency that disappeared changes the key too
        digest.update(f"depends {rel} {(project.root / rel).is_file()}\0".encode())
    audit_key = digest.hexdigest()
    return audit_key, hashlib.sha256((audit_key + _digest_of("output", project)).encode()).hexdigest()


def _dependencies(project: Project, d) -> list[str]:
    """The project's own modules a derivation imports or declares as its forward (relative to the
    project; adjointgen's own modules are covered by the keys' digests)."""
    import ast
    import importlib.util

    path = Path(d.path)
    modules = set()
    for source in [path, *helper_modules(path)]:
        try:
            tree = ast.parse(Path(source).read_text())
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules.add(node.module)
    spec = d.forward_spec
    for ref in (spec.torch, spec.numpy) if spec is not None else ():
        if ref is not None and not ref.xp:
            modules.add(ref.module)
    root, output, own = project.root.resolve(), project.output.resolve(), _adjointgen_dir()
    found = set()
    with project.importable():
        for name in sorted(modules):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                try:
                    found_spec = importlib.util.find_spec(".".join(parts[:i]))
                except (ImportError, ValueError):
                    break
                origin = getattr(found_spec, "origin", None) if found_spec is not None else None
                if not origin or not Path(origin).is_file():
                    continue
                f = Path(origin).resolve()
                if f.is_relative_to(root) and not f.is_relative_to(output) and not f.is_relative_to(own) \
                        and f.resolve() != path.resolve():
                    found.add(Path(os.path.relpath(f, root)).as_posix())
    return sorted(found)


def _read_record(project: Project, name: str) -> dict | None:
    path = project.output / RECORD.format(name=name)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("steps"), list) else None


def keys_text(keys: dict) -> str:
    return json.dumps({"about": KEYS_ABOUT, "keys": dict(sorted(keys.items()))}, indent=1) + "\n"


def _known_verdicts(record: dict | None) -> dict | None:
    if record is None:
        return None
    return {(int(s[0]), s[1], s[2]): s[3] for s in record.get("steps", []) if len(s) >= 4}


def _record_text(project: Project, name: str, operation: str, depends: list[str], report, files: dict[Path, str],
                 skipped: dict[str, str]) -> str:
    steps = ",\n".join("  " + json.dumps([r.index, r.kind, r.label, r.symbolic], ensure_ascii=False)
                       for r in report.steps)
    produced = {p.relative_to(project.output).as_posix(): _digest(t) for p, t in sorted(files.items())}
    return ("{\n"
            f' "about": {json.dumps(RECORD_ABOUT)},\n'
            f' "operation": {json.dumps(operation)},\n'
            f' "depends": {json.dumps(depends)},\n'
            f' "files": {json.dumps(produced, indent=1, sort_keys=True)},\n'
            f' "not_written": {json.dumps(skipped, sort_keys=True)},\n'
            f' "steps": [\n{steps}\n ]\n'
            "}\n")


def audit_one(root, name: str, *, symbolic: bool = True, known: dict | None = None, progress=None,
              reuse: bool = False) -> Audited:
    """Audit one derivation and lower it.  ``known``: verdicts of an earlier audit of these very
    sources (from its record), reused instead of recomputed (``reuse=True``: take them from the
    output package's record when its audit key matches)."""
    from ..audit import audit
    from .lower import lower_derivation

    project = _project(root)
    with project.importable():  # a forward the derivation declares may live in the project
        d = load_derivation(project, name, partial=True)
        if reuse and known is None:
            record = _read_record(project, name)
            recorded = read_keys(project).get(name, {})
            if record is not None and recorded.get("audit_key") == record_keys(project, Path(d.path),
                                                                               record.get("depends", []))[0]:
                known = _known_verdicts(record)
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


@dataclass
class OperationResult:
    """What generation did for one derivation (the parent process prints one line of it)."""

    #: the derivation file's name (``generate NAME``) and the operation it defines
    name: str
    operation: str
    files: dict
    #: "reused" (nothing recomputed: the record's keys and files match), "rendered" (the audit's
    #: verdicts reused, the files rendered and verified again) or "audited" (everything computed)
    how: str
    seconds: float
    summary: str
    #: what each backend wrote, or why it wrote nothing
    backends: str
    report_text: str = ""
    derivation: str = ""
    #: ``{"key": ..., "audit_key": ...}`` of its record
    keys: dict | None = None

    def line(self, width: int = 0) -> str:
        return f"{self.name:<{width}}  {self.how:<8} {self.seconds:5.1f} s  {self.summary}; {self.backends}"


def _backend_words(written: list[str], skipped: dict[str, str]) -> str:
    text = ", ".join(written) if written else "no files"
    if skipped:
        text += " (" + "; ".join(f"{b}: nothing, {why}" for b, why in sorted(skipped.items())) + ")"
    return text


def _reuse(project: Project, name: str, manifest: dict | None, recorded_keys: dict):
    """``(result, known verdicts)``: the recorded result when nothing it depends on changed (keys,
    files, record unchanged), else ``None`` and the recorded verdicts when only the audit's inputs
    are unchanged (``None`` when they changed too)."""
    import time

    t0 = time.perf_counter()
    record = _read_record(project, name)
    if record is None or not isinstance(record.get("depends"), list):
        return None, None
    path = project.derivation_path(name)
    record_path = project.output / RECORD.format(name=name)
    text = record_path.read_text()
    if manifest is not None and manifest.get(record_path.relative_to(project.output).as_posix()) != _digest(text):
        return None, None  # changed since it was written: not trusted
    audit_key, key = record_keys(project, path, record["depends"])
    recorded = recorded_keys.get(name) or {}
    if recorded.get("audit_key") != audit_key:
        return None, None
    known = _known_verdicts(record)
    if recorded.get("key") != key:
        return None, known
    files = {record_path: text}
    for rel, digest in sorted(record.get("files", {}).items()):
        p = project.output / rel
        try:
            content = p.read_text()
        except OSError:
            return None, known
        if _digest(content) != digest:
            return None, known
        files[p] = content
    counts = {}
    from ..audit.runner import verdict_kind

    for step in record["steps"]:
        k = verdict_kind(step[3])
        counts[k] = counts.get(k, 0) + 1
    summary = _counts_words(len(record["steps"]), counts)
    folders = {Path(r).parts[0] for r in record.get("files", {})}
    written = [b for b in project.backends if BACKEND_DIRS[b].split("/")[0] in folders]
    return OperationResult(name, record.get("operation", name), files, "reused", time.perf_counter() - t0, summary,
                           _backend_words(written, record.get("not_written", {})),
                           derivation=str(path), keys={"audit_key": audit_key, "key": key}), known


def _counts_words(total: int, counts: dict) -> str:
    parts = [f"{counts.get('exact', 0)} verified exactly"]
    if counts.get("symbolic"):
        parts.append(f"{counts['symbolic']} symbolically")
    parts.append(f"{counts.get('premise', 0)} premises")
    if counts.get("numeric only"):
        parts.append(f"{counts['numeric only']} NOT verified (numeric only)")
    return f"{total} steps: " + ", ".join(parts)


def _limit_threads() -> None:
    """One thread per worker for the numeric libraries: the audit's matrices are tiny, and thread
    pools of several workers on a few cores only contend."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def render(root, names: list[str] | None = None, *, jobs: int | None = None,
           verify: bool = True, reuse: bool = True, quiet: bool = True, on_result=None) -> dict[Path, str]:
    """Audit the named derivations (all by default) and render their files.

    With ``reuse`` (the default), a derivation whose record in the output package (``audit/<name>.json``)
    has the keys of its current sources, and whose generated files are those the record lists, is
    not recomputed: its files are the ones on disk (every input that could change a verdict or a
    file is in the keys: see :func:`record_keys`).  A derivation whose audit inputs are unchanged
    but whose code generator, runtime or templates changed reuses the audit's verdicts and is
    rendered and verified again.  ``reuse=False`` (``--fresh``) recomputes everything.

    The others are audited in parallel processes (``jobs``, default: the CPU count).  Raises
    :class:`GenerationFailed` at the first failed step or failed verification of the generated
    code; nothing is rendered then.  ``on_result(OperationResult)`` is called in this process as
    each derivation is done.  A KeyboardInterrupt stops the workers and propagates (nothing has
    been written).
    """
    project = _project(root)
    all_names = project.derivation_names()
    names = all_names if not names else list(names)
    for nm in names:
        project.derivation_path(nm)  # a clear error for an unknown name
    _refuse_declared_duplicates(project, all_names)
    _DIGESTS.clear()  # the sources as they are now (a process may generate again after an edit)
    results: dict[str, object] = {}
    known: dict[str, dict | None] = {}
    recorded_keys = read_keys(project)
    if reuse:
        manifest = read_manifest(project)
        for nm in names:
            result, known[nm] = _reuse(project, nm, manifest, recorded_keys)
            if result is not None:
                results[nm] = result
                if on_result is not None:
                    on_result(result)
    todo = [nm for nm in names if nm not in results]
    jobs = min(len(todo), jobs or os.cpu_count() or 1)
    if jobs > 1:
        import concurrent.futures
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        # longest first (file size as the proxy for audit time), so that no long one starts last
        order = sorted(todo, key=lambda nm: -project.derivation_path(nm).stat().st_size)
        pool = concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_limit_threads)
        try:
            futures = {pool.submit(_render_operation, project, nm, verify, known.get(nm), not quiet): nm
                       for nm in order}
            for future in concurrent.futures.as_completed(futures):
                results[futures[future]] = result = future.result()
                if on_result is not None and isinstance(result, OperationResult):
                    on_result(result)
        except BaseException:  # Ctrl-C (or a worker's crash): stop the workers, write nothing
            for process in list(getattr(pool, "_processes", {}).values()):
                process.terminate()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
    else:
        for nm in todo:
            results[nm] = result = _render_operation(project, nm, verify, known.get(nm), not quiet)
            if on_result is not None and isinstance(result, OperationResult):
                on_result(result)
    files: dict[Path, str] = {}
    for nm in names:
        result = results[nm]
        if isinstance(result, (GenerationFailed, ProjectError)):
            raise result
    _refuse_duplicates(project, [results[nm] for nm in names])
    keys = {nm: k for nm, k in recorded_keys.items() if nm in all_names and isinstance(k, dict)}
    for nm in names:
        files.update(results[nm].files)
        keys[nm] = results[nm].keys
    files[project.output / KEYS] = keys_text(keys)
    files.update(_package_files(project, all_names))
    return files


def declared_name(path: Path) -> str | None:
    """The name a derivation file gives its ``Derivation("name", ...)``, read without running it
    (``None`` when it is not a string literal)."""
    import ast

    try:
        tree = ast.parse(Path(path).read_text())
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Derivation"
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            return node.args[0].value
    return None


def _refuse_declared_duplicates(project: Project, names: list[str]) -> None:
    """Two derivation files whose ``Derivation("name")`` is the same literal: refused before any
    audit (:func:`_refuse_duplicates` catches the others once they have run)."""
    seen: dict[str, str] = {}
    for nm in names:
        declared = declared_name(project.derivation_path(nm))
        if declared is None:
            continue
        where = project.relative(project.derivation_path(nm))
        if declared in seen:
            raise GenerationFailed(
                f"two derivation files define the operation '{declared}': {seen[declared]} and {where} "
                f"(Derivation({declared!r}, ...) in both); their generated modules would overwrite each other: "
                "rename one of them")
        seen[declared] = where


def _refuse_duplicates(project: Project, results: list) -> None:
    """Two derivation files defining the same operation would write the same files."""
    seen: dict[str, str] = {}
    for r in results:
        if r.operation in seen:
            raise GenerationFailed(
                f"two derivation files define the operation '{r.operation}': {seen[r.operation]} and "
                f"{project.relative(project.derivation_path(r.name))} (Derivation({r.operation!r}, ...) in both); "
                "their generated modules would overwrite each other: rename one of them")
        seen[r.operation] = project.relative(project.derivation_path(r.name))


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


def _render_operation(project: Project, name: str, verify: bool = True, known: dict | None = None,
                      verbose: bool = False):
    """Audit one derivation (``known``: the verdicts of its unchanged audit, reused), render its
    files and verify them (run in a worker process).  Returns an :class:`OperationResult`, or the
    :class:`GenerationFailed` / :class:`ProjectError` to raise."""
    import time

    from ..audit import AuditError
    from ..calculus.algebra import DerivationError

    t0 = time.perf_counter()
    try:
        try:
            a = _audit_or_reuse(project, name, known)
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
        files, texts, skipped = _render_files(project, a)
        if verify:
            from .verify import VerificationFailed, verify_generated

            try:
                verify_generated(project, a.derivation, a.op, texts)
            except VerificationFailed as exc:
                return GenerationFailed(str(exc), a.report.to_text())
        depends = _dependencies(project, a.derivation)
        audit_key, key = record_keys(project, Path(a.derivation.path), depends)
        record_path = project.output / RECORD.format(name=name)
        files[record_path] = _record_text(project, name, a.op.name, depends, a.report, files, skipped)
        written = [b for b in project.backends if b in texts]
        return OperationResult(name, a.op.name, files, "rendered" if a.reused else "audited",
                               time.perf_counter() - t0, _counts_words(len(a.report.steps), a.report.counts()),
                               _backend_words(written, skipped), a.report.to_text() if verbose else "",
                               derivation=str(a.derivation.path), keys={"audit_key": audit_key, "key": key})
    except ProjectError as exc:
        return exc


def _audit_or_reuse(project: Project, name: str, known: dict | None) -> Audited:
    """The audit, or -- ``known`` holds the verdicts recorded for these very audit inputs -- its
    report rebuilt from them (the audit is deterministic: it would find the same)."""
    if known is None:
        return audit_one(project, name)
    from ..audit.runner import report_from_verdicts
    from .lower import lower_derivation

    with project.importable():
        d = load_derivation(project, name, partial=True)
    report = report_from_verdicts(d, known)
    if report is None:  # the recorded steps are not these: audit again
        return audit_one(project, name)
    complete = d.jvp is not None and d.vjp is not None
    op = (lower_derivation(d, str(project.root), project.package, label=project.label(d.path))
          if report.passed and d.error is None and complete else None)
    a = Audited(d, report, op)
    a.reused = True
    return a


def _render_files(project: Project, a: Audited):
    """``(files, texts by backend, backends that wrote nothing: why)``."""
    env = _environment(project)
    op = a.op
    files: dict[Path, str] = {}
    texts: dict[str, tuple[Path, str]] = {}
    skipped: dict[str, str] = {}
    derivation_path = Path(a.derivation.path)
    steps = [
        _StepRow(r.index, r.label, r.kind, str(s.equation) if s.equation is not None else None, r.passed, r.symbolic)
        for s, r in zip(a.derivation.steps, a.report.steps)
    ]
    selected = [b for b in BACKENDS if b.name in project.backends]
    has_kernels = any(b.kernels and b.emits(op) for b in selected)
    for backend in selected:
        if not backend.emits(op):
            # a kernel backend, and no elementwise part: no kernels to emit
            skipped[backend.name] = "no elementwise kernels"
            continue
        template = _template(env, project, backend.template)
        lines, statements = {}, {}
        if backend.printer:
            printer = backend.printer
            lines = {r.name: printer.lines(r) for r in op.rules}
            statements = {r.name: printer.statements(r) for r in op.rules}
        path = project.output / backend.output.format(name=op.name)
        env.loader.loaded.clear()
        context = dict(
            op=op,
            package=project.package,
            has_kernels=has_kernels,
            cls="".join(part.capitalize() for part in op.name.split("_")) + "Function",
            lines=lines,
            statements=statements,
            pairwise_by_name={f.name: f for f in op.pairwise},
            report=a.report,
            steps=steps,
            tolerance=a.report.steps[0].tolerance if a.report.steps else 0,
            imports=MARKER,
        )
        _render_template(template, header="", **context)  # finds the templates it includes
        included = [Path(_template(env, project, name).filename) for name in env.loader.loaded if name != backend.template]
        sources = [derivation_path, *helper_modules(derivation_path), Path(template.filename), *included]
        text = _render_template(template, header=_header(backend.comment, sources, project), **context)
        if backend.printer:
            text = _with_imports(text, backend.printer, template, op.public)
        files[path] = text
        texts[backend.name] = (path, text)
    return files, texts, skipped


@dataclass(frozen=True)
class _StepRow:
    index: int
    label: str
    kind: str
    equation: str | None
    passed: bool
    symbolic: str



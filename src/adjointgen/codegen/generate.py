"""Load derivations, audit them, render every backend's templates, write or check ``generated/``.

Nothing is written unless every requested derivation passes its audit.  Output is deterministic:
sorted iteration, canonical value names, no timestamps; a file is rewritten only when its content
changes.
"""
from __future__ import annotations

import difflib
import hashlib
import os
import runpy
from dataclasses import dataclass
from pathlib import Path

import jinja2

from ..audit import AuditError, AuditReport, audit
from ..calculus.algebra import DerivationError
from ..calculus.derivation import Derivation
from .ir import OperationIR
from .lower import lower_derivation
from .printers import PRINTERS, scalar_c, scalar_python


@dataclass(frozen=True)
class Backend:
    """One target: its template, where its files go, which array printer it uses."""

    name: str
    template: str  # relative to templates/
    output: str  # relative to generated/, with {name}
    printer: str | None
    comment: str  # line-comment prefix for the header


BACKENDS = (
    Backend("torch", "torch/op.py.j2", "torch/{name}.py", "torch", "#"),
    Backend("cupy", "cupy/op.py.j2", "cupy/{name}.py", "xp", "#"),
    Backend("cuda", "cuda/op.cu.j2", "cuda/{name}.cu", None, "//"),
    Backend("report", "report/audit.md.j2", "reports/{name}.md", None, None),
)

PACKAGES = (("torch", "torch/__init__.py"), ("cupy", "cupy/__init__.py"))


class ProjectError(Exception):
    pass


def find_root(start: str | os.PathLike | None = None) -> Path:
    """The project tree: the nearest directory upward holding ``derivations/`` and ``templates/``."""
    here = Path(start or os.getcwd()).resolve()
    for p in (here, *here.parents):
        if (p / "derivations").is_dir() and (p / "templates").is_dir():
            return p
    raise ProjectError(f"no adjointgen project (derivations/ and templates/) at or above {here}")


def derivation_names(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / "derivations").glob("*.py") if not p.stem.startswith("_"))


def load_derivation(root: Path, name: str, *, partial: bool = False) -> Derivation:
    """Run ``derivations/<name>.py`` and return its :class:`Derivation`.

    With ``partial``, a script stopped by a :class:`DerivationError` still returns the derivation
    with the steps recorded so far (the failed one last, ``d.error`` set) for the audit to report.
    """
    path = root / "derivations" / f"{name}.py"
    if not path.is_file():
        raise ProjectError(f"no derivation file {path} (known: {', '.join(derivation_names(root))})")
    return load_derivation_file(path, partial=partial)


def load_derivation_file(path: Path, *, partial: bool = False) -> Derivation:
    """Run one derivation script.  Its folder is importable while it runs, so that scripts can
    share steps through helper modules (``derivations/_*.py``), as when run with ``python``."""
    import sys

    start = len(Derivation.created)
    folder = str(Path(path).resolve().parent)
    sys.path.insert(0, folder)
    try:
        ns = runpy.run_path(str(path), run_name=f"adjointgen_derivation_{path.stem}")
    except DerivationError as exc:
        mine = [d for d in Derivation.created[start:] if d.path == str(Path(path).resolve())]
        if partial and mine:
            d = mine[-1]
            if d.error is None:  # raised inside the engine rather than by a step
                d.error = str(exc)
                d._record("error", "engine", None, note=str(exc))
            return d
        raise
    finally:
        del Derivation.created[start:]
        sys.path.remove(folder)
    found = [v for v in ns.values() if isinstance(v, Derivation)]
    if len(found) != 1:
        raise ProjectError(f"{path} must define exactly one Derivation (found {len(found)})")
    return found[0]


def helper_modules(path: Path) -> list[Path]:
    """The ``derivations/_*.py`` helpers a derivation imports (they are sources of its output)."""
    import re

    names = re.findall(r"^\s*(?:import|from)\s+(_\w+)", path.read_text(), flags=re.M)
    return [path.parent / f"{name}.py" for name in sorted(set(names)) if (path.parent / f"{name}.py").is_file()]


def _environment(root: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(root / "templates")),
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
    return env


def _header(comment: str | None, sources: list[Path], root: Path) -> str:
    digest = hashlib.sha256()
    for s in sources:
        digest.update(s.relative_to(root).as_posix().encode())
        digest.update(s.read_bytes())
    names = ", ".join(s.relative_to(root).as_posix() for s in sources)
    text = [
        "generated by adjointgen — do not edit.",
        f"sources: {names}",
        f"sha256 of sources: {digest.hexdigest()}",
        "edit the sources and run `adjointgen generate`.",
    ]
    if comment is None:
        return "<!-- " + " ".join(text) + " -->"
    return "\n".join(f"{comment} {t}" for t in text)


@dataclass
class Audited:
    derivation: Derivation
    report: AuditReport
    op: OperationIR


def audit_one(root: Path, name: str, *, symbolic: bool = True) -> Audited:
    d = load_derivation(root, name, partial=True)
    report = audit(d, symbolic=symbolic)
    op = lower_derivation(d, str(root)) if report.passed and d.error is None else None
    return Audited(d, report, op)


def render(root: Path, names: list[str] | None = None, *, jobs: int | None = None) -> dict[Path, str]:
    """Audit the named derivations (all by default) and render their files.

    Derivations are audited in parallel processes (``jobs``, default: the CPU count).  Raises
    :class:`GenerationFailed` at the first failed step; nothing is rendered then.
    """
    all_names = derivation_names(root)
    names = all_names if not names else list(names)
    jobs = min(len(names), jobs or os.cpu_count() or 1)
    if jobs > 1:
        import concurrent.futures
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        # longest first (file size as the proxy for audit time), so that no long one starts last
        order = sorted(names, key=lambda nm: -(root / "derivations" / f"{nm}.py").stat().st_size)
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
            by_name = dict(zip(order, pool.map(_render_operation, [str(root)] * len(order), order)))
        results = [by_name[nm] for nm in names]
    else:
        results = [_render_operation(str(root), name) for name in names]
    files: dict[Path, str] = {}
    for result in results:
        if isinstance(result, GenerationFailed):
            raise result
        files.update(result)
    env = _environment(root)
    package = env.get_template("package/__init__.py.j2")
    header = _header("#", [root / "templates" / "package/__init__.py.j2"], root)
    for backend, rel in PACKAGES:
        files[root / "generated" / rel] = package.render(header=header, backend=backend, names=all_names)
    files[root / "generated" / "__init__.py"] = package.render(
        header=header, backend="torch and CuPy/NumPy", names=all_names)
    return files


class GenerationFailed(Exception):
    """A derivation failed its audit (or could not be carried out); carries the printed report."""

    def __init__(self, message: str, report_text: str = ""):
        super().__init__(message)
        self.report_text = report_text

    def __reduce__(self):
        return (GenerationFailed, (str(self), self.report_text))


def _render_operation(root_str: str, name: str):
    """Audit one derivation and render all its files (run in a worker process)."""
    root = Path(root_str)
    try:
        a = audit_one(root, name)
    except DerivationError as exc:
        return GenerationFailed(str(exc))
    failed = a.report.first_failure()
    if failed is not None:
        return GenerationFailed(str(AuditError(a.report, failed)), a.report.to_text())
    if a.derivation.error is not None:
        return GenerationFailed(a.derivation.error, a.report.to_text())
    env = _environment(root)
    op = a.op
    files: dict[Path, str] = {}
    for backend in BACKENDS:
        if backend.name == "cuda" and not op.kernel_variants:
            continue  # no elementwise part: no kernels to emit
        template = env.get_template(backend.template)
        sources = [root / op.derivation, *helper_modules(root / op.derivation), root / "templates" / backend.template]
        lines = {}
        if backend.printer:
            printer = PRINTERS[backend.printer]
            lines = {r.name: printer.lines(r) for r in op.rules}
        steps = [
            _StepRow(r.index, r.label, r.kind, str(s.equation) if s.equation is not None else None, r.passed, r.symbolic)
            for s, r in zip(a.derivation.steps, a.report.steps)
        ]
        files[root / "generated" / backend.output.format(name=op.name)] = template.render(
            header=_header(backend.comment, sources, root),
            op=op,
            cls="".join(part.capitalize() for part in op.name.split("_")) + "Function",
            lines=lines,
            pairwise_by_name={f.name: f for f in op.pairwise},
            report=a.report,
            steps=steps,
            tolerance=a.report.steps[0].tolerance if a.report.steps else 0,
        )
    return files


@dataclass(frozen=True)
class _StepRow:
    index: int
    label: str
    kind: str
    equation: str | None
    passed: bool
    symbolic: str


def stale(files: dict[Path, str], root: Path) -> list[Path]:
    """Files in generated/ that a full generation does not produce (a removed derivation's)."""
    produced = set(files)
    out = []
    for sub, pattern in (("torch", "*.py"), ("cupy", "*.py"), ("cuda", "*.cu"), ("reports", "*.md")):
        for p in sorted((root / "generated" / sub).glob(pattern)):
            if p not in produced:
                out.append(p)
    return out


def write(files: dict[Path, str], remove: list[Path] = ()) -> list[Path]:
    """Write files whose content changed and remove stale ones; returns the paths changed."""
    written = []
    for path in remove:
        path.unlink()
        written.append(path)
    for path, text in sorted(files.items()):
        if path.is_file() and path.read_text() == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def check(files: dict[Path, str], root: Path, remove: list[Path] = ()) -> str:
    """Unified diff between ``generated/`` and freshly rendered files ('' when in sync)."""
    out = []
    for path in remove:
        rel = path.relative_to(root).as_posix()
        out.extend(difflib.unified_diff(path.read_text().splitlines(True), [], f"a/{rel}", "/dev/null"))
    for path, text in sorted(files.items()):
        old = path.read_text() if path.is_file() else ""
        if old != text:
            rel = path.relative_to(root).as_posix()
            out.extend(difflib.unified_diff(old.splitlines(True), text.splitlines(True), f"a/{rel}", f"b/{rel}"))
    return "".join(out)

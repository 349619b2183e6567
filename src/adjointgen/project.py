"""An adjointgen project: a folder whose ``pyproject.toml`` holds a ``[tool.adjointgen]`` table.

::

    [tool.adjointgen]
    derivations = "derivations"          # folder of derivation scripts (default "derivations")
    package = "mypkg._adjoint"            # the generated package, as it is imported
    output = "src/mypkg/_adjoint"         # its folder (default: from ``package``, src/ layout first)
    backends = ["torch", "cupy", "cuda", "report"]   # the default; "jax" adds JAX modules
    templates = "templates"               # optional: templates overriding the built-in ones
    symbolic_timeout = 20                 # optional: seconds per symbolic replay, the fallback where a value
                                          # has no rational form (0: no limit); past it: NOT verified

The command line finds the project from the current directory upward (or ``--root``).  Nothing
here imports SymPy or torch, so ``adjointgen list``/``init``/``--help`` start fast.
"""
from __future__ import annotations

from .names import RESERVED_NAMES, name_problem  # noqa: F401  (RESERVED_NAMES: re-exported)

import contextlib
import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["BACKENDS", "BackendDeclaration", "Project", "ProjectError", "backend_declarations", "builtin_templates",
           "catalogue_project", "check_name",
           "find_project", "load_project"]

#: the backend packages (``codegen/backends/<name>/``), each declaring itself in ``backend.toml``
BACKENDS_DIR = Path(__file__).parent / "codegen" / "backends"


@dataclass(frozen=True)
class BackendDeclaration:
    """What a project's settings need to know of a backend, read from its package's ``backend.toml``
    (data, so that loading a project imports no code generator)."""

    name: str
    #: the file of an operation, under the output package, with ``{name}``
    output: str
    #: a project whose table names no backends gets it
    default: bool
    #: the order the generator renders the backends in
    order: int
    #: backend name -> why this one needs it too
    requires: tuple[tuple[str, str], ...] = ()


@functools.cache
def backend_declarations() -> dict[str, BackendDeclaration]:
    """Every backend package's declaration, by name, in the generator's order."""
    found = []
    for path in sorted(BACKENDS_DIR.glob("*/backend.toml")):
        table = tomllib.loads(path.read_text())
        found.append(BackendDeclaration(path.parent.name, table["output"], bool(table.get("default", True)),
                                        int(table.get("order", 100)), tuple(table.get("requires", {}).items())))
    return {b.name: b for b in sorted(found, key=lambda b: (b.order, b.name))}


#: the backends a project can generate, with the file (under the output package) of each operation
#: (from the backend packages' declarations)
BACKENDS = {name: b.output for name, b in backend_declarations().items()}
#: the backends of a project whose table names none (JAX is asked for by name)
DEFAULT_BACKENDS = tuple(name for name, b in backend_declarations().items() if b.default)

_KEYS = {"derivations", "package", "output", "backends", "templates", "symbolic_timeout"}
#: seconds a step's symbolic replay may take before the audit keeps only its numeric verdict
DEFAULT_SYMBOLIC_TIMEOUT = 20.0
#: modules the generated code imports, or that a project's import path could shadow: not a name
#: for a derivation (its generated ``torch/<name>.py`` would be imported instead)
def check_name(name: str, where: str) -> None:
    """A :class:`ProjectError` if ``name`` cannot name a derivation (:mod:`adjointgen.names`)."""
    problem = name_problem(name)
    if problem:
        raise ProjectError(f"{where}: {problem}")


class ProjectError(Exception):
    """The project is missing or misconfigured (the message names the file and the key)."""


@dataclass(frozen=True)
class Project:
    """A loaded ``[tool.adjointgen]`` table, with every path resolved against the project root."""

    root: Path
    config_file: Path
    derivations: Path
    package: str
    output: Path
    backends: tuple[str, ...]
    #: the project's own templates (overriding the built-in ones of the same name), if any
    templates: Path | None
    #: (folder, name): files under the folder are named ``name/...`` in headers and docstrings
    #: (the installed catalogue names its files as the checkout does, so its output is the same)
    aliases: tuple[tuple[Path, str], ...] = ()
    #: seconds each step's symbolic replay may take (``symbolic_timeout``; 0: no limit)
    symbolic_timeout: float = DEFAULT_SYMBOLIC_TIMEOUT

    def label(self, path) -> str:
        """How generated headers and docstrings name ``path``: by an alias, else relative to the
        project root ('/'-separated)."""
        path = Path(path).resolve()
        for folder, name in self.aliases:
            try:
                return f"{name}/{path.relative_to(Path(folder).resolve()).as_posix()}"
            except ValueError:
                continue
        return self.relative(path)

    def derivation_names(self) -> list[str]:
        """Every ``<name>.py`` of the derivations folder except helpers (``_*.py``); a file whose name
        cannot name a module raises :class:`ProjectError`."""
        if not self.derivations.is_dir():
            return []
        names = sorted(p.stem for p in self.derivations.glob("*.py") if not p.stem.startswith("_"))
        for name in names:
            check_name(name, str(self.derivations / f"{name}.py"))
        return names

    def derivation_path(self, name: str) -> Path:
        path = self.derivations / f"{name}.py"
        if not path.is_file():
            known = ", ".join(self.derivation_names()) or "none"
            raise ProjectError(f"no derivation file {path} (known: {known})")
        return path

    def relative(self, path: Path) -> str:
        """``path`` relative to the project root, '/'-separated (as headers and reports show it)."""
        return Path(os.path.relpath(path, self.root)).as_posix()

    def output_file(self, backend: str, name: str) -> Path:
        """Where ``backend`` writes the file of operation ``name``."""
        return self.output / BACKENDS[backend].format(name=name)

    @contextlib.contextmanager
    def importable(self):
        """The project's own modules importable (its root and ``src/``), e.g. a forward computation
        in the user's package while the audit or the verification of generated code runs it."""
        # a folder that is itself a package (the installed catalogue's root, adjointgen/) is never
        # put on the path: its modules would shadow top-level ones (adjointgen/torch.py as torch)
        extra = [str(p) for p in (self.root / "src", self.root)
                 if p.is_dir() and str(p) not in sys.path and not (p / "__init__.py").is_file()]
        sys.path[:0] = extra
        before = set(sys.modules)
        try:
            yield
        finally:
            for p in extra:
                if p in sys.path:
                    sys.path.remove(p)
            # the project's modules imported meanwhile are forgotten again, so that another project
            # (or this one after an edit) in the same process imports its own
            # (adjointgen's own modules stay: a checkout's src/ holds them, and a second copy of
            # adjointgen.runtime would not share the first one's settings, gauge checks included)
            for p in extra:
                for name in [m for m in sys.modules if m not in before and m.partition(".")[0] != "adjointgen"]:
                    file = getattr(sys.modules.get(name), "__file__", None) or ""
                    if file.startswith(p + os.sep):
                        sys.modules.pop(name, None)

    @property
    def template_dirs(self) -> tuple[Path, ...]:
        """Where templates are looked up, first match wins: the project's, then the built-in ones."""
        dirs = [] if self.templates is None else [self.templates]
        builtin = builtin_templates()
        if not dirs or dirs[0].resolve() != builtin.resolve():
            dirs.append(builtin)
        return tuple(dirs)


def builtin_templates() -> Path:
    """The templates shipped inside the package (``adjointgen/templates``: one folder per backend,
    named by its row, and the shared ``common/`` and ``package/``)."""
    from importlib import resources

    return Path(str(resources.files("adjointgen.templates")))


def catalogue_project() -> Project:
    """adjointgen's own catalogue as installed (``adjointgen.catalogue`` derivations,
    ``adjointgen.generated`` output): what ``adjointgen --catalogue ...`` audits, lists or checks,
    from any folder, with no checkout."""
    from importlib import resources

    derivations = Path(str(resources.files("adjointgen.catalogue")))
    output = Path(str(resources.files("adjointgen.generated")))
    root = derivations.parent if (derivations.parent / output.name).is_dir() else output.parent
    return Project(root=root, config_file=root / "pyproject.toml", derivations=derivations,
                   package="adjointgen.generated", output=output, backends=tuple(BACKENDS), templates=None,
                   aliases=((derivations, "derivations"), (builtin_templates(), "templates")))


def find_project(start: str | os.PathLike | None = None) -> Path:
    """The nearest folder at or above ``start`` whose ``pyproject.toml`` has ``[tool.adjointgen]``."""
    here = Path(start or os.getcwd()).resolve()
    for p in (here, *here.parents):
        f = p / "pyproject.toml"
        if f.is_file() and "tool" in _read(f) and "adjointgen" in _read(f)["tool"]:
            return p
    raise ProjectError(
        f"no adjointgen project at or above {here}: no pyproject.toml with a [tool.adjointgen] table "
        "(`adjointgen init DIR` writes one; `adjointgen --catalogue ...` acts on the installed catalogue)")


def _read(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ProjectError(f"{path}: not valid TOML: {exc}") from None


def load_project(root: str | os.PathLike | None = None) -> Project:
    """Load the project at ``root`` (default: found from the current directory upward)."""
    root = find_project(root)
    config_file = root / "pyproject.toml"
    table = _read(config_file).get("tool", {}).get("adjointgen")
    if not isinstance(table, dict):
        raise ProjectError(f"{config_file}: [tool.adjointgen] must be a table")
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise ProjectError(f"{config_file}: unknown key(s) in [tool.adjointgen]: {', '.join(unknown)} "
                           f"(known: {', '.join(sorted(_KEYS))})")

    def string(key, default=None):
        value = table.get(key, default)
        if value is not None and not isinstance(value, str):
            raise ProjectError(f"{config_file}: [tool.adjointgen] {key} must be a string, got {value!r}")
        return value

    package = string("package")
    if not package:
        raise ProjectError(f"{config_file}: [tool.adjointgen] needs `package`, the dotted name of the "
                           "generated package (e.g. package = \"mypkg._adjoint\")")
    import keyword

    if not all(part.isidentifier() and not keyword.iskeyword(part) for part in package.split(".")):
        raise ProjectError(f"{config_file}: [tool.adjointgen] package = {package!r} is not a dotted Python name "
                           "(identifiers that are not keywords)")
    output = string("output")
    if output is None:
        parts = Path(*package.split("."))
        output = str(Path("src") / parts) if (root / "src" / package.split(".")[0]).is_dir() else str(parts)
    backends = table.get("backends", list(DEFAULT_BACKENDS))
    if not isinstance(backends, list) or not all(isinstance(b, str) for b in backends):
        raise ProjectError(f"{config_file}: [tool.adjointgen] backends must be a list of strings")
    bad = [b for b in backends if b not in BACKENDS]
    if bad:
        raise ProjectError(f"{config_file}: unknown backend(s) {', '.join(map(repr, bad))} "
                           f"(known: {', '.join(BACKENDS)})")
    for b in backends:
        for needed, why in backend_declarations()[b].requires:
            if needed not in backends:
                raise ProjectError(f"{config_file}: {why}: add \"{needed}\"")
    templates = string("templates")
    template_dir = None
    if templates is not None:
        template_dir = (root / templates).resolve()
        if not template_dir.is_dir():
            raise ProjectError(f"{config_file}: [tool.adjointgen] templates = {templates!r}: no folder {template_dir}")
    derivations_setting = string("derivations", "derivations")
    derivations = (root / derivations_setting).resolve()
    if not derivations.is_dir():
        raise ProjectError(f"{config_file}: [tool.adjointgen] derivations = {derivations_setting!r}: no folder "
                           f"{derivations}")
    resolved_root = root.resolve()
    out = (root / output).resolve()
    if not out.is_relative_to(resolved_root):
        raise ProjectError(f"{config_file}: [tool.adjointgen] output = {output!r} is {out}, outside the project "
                           f"folder {resolved_root}: generated files are written (and removed) only inside it")
    # a backend that writes a Python package (torch/, cupy/, jax/) at the project's top would
    # shadow the library of that name
    shadowing = [BACKENDS[b].split("/")[0] for b in backends if BACKENDS[b].endswith("/{name}.py")]
    if out == resolved_root and shadowing:
        raise ProjectError(f"{config_file}: [tool.adjointgen] output = {output!r} is the project folder itself: the "
                           f"generated {shadowing[0]}/ package would shadow the real {shadowing[0]} for anything run "
                           "from there; choose the generated package's own folder (e.g. the default from `package`)")
    timeout = table.get("symbolic_timeout", DEFAULT_SYMBOLIC_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise ProjectError(f"{config_file}: [tool.adjointgen] symbolic_timeout must be a number of seconds >= 0 "
                           f"(0: no limit), got {timeout!r}")
    return Project(
        root=root,
        config_file=config_file,
        derivations=derivations,
        package=package,
        output=out,
        backends=tuple(b for b in BACKENDS if b in backends),
        templates=template_dir,
        symbolic_timeout=float(timeout),
    )

"""Rendering: the Jinja2 environment of a project's template folders, its filters, the headers of
generated files, and the imports computed from the rendered code."""
from __future__ import annotations

import hashlib
from pathlib import Path

from ..project import BACKENDS_DIR, Project, ProjectError
from .imports import UnknownName
from .imports import resolve as resolve_imports



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


#: the templates the backends share (``common/``, ``package/``); each backend's own are in its
#: package, ``codegen/backends/<name>/templates/``, and named ``<name>/...``
SHARED_TEMPLATES = BACKENDS_DIR / "templates"


def builtin_template_dirs() -> dict[str, Path]:
    """The built-in template folders by the prefix of their templates' names (``""``: the shared
    ones): a project's template of the same name (``torch/op.py.j2``) overrides the built-in one."""
    return {"": SHARED_TEMPLATES, **{p.parent.name: p for p in sorted(BACKENDS_DIR.glob("*/templates"))
                                     if p.parent != BACKENDS_DIR}}


def builtin_template_name(path) -> str | None:
    """The name of a built-in template file (``torch/op.py.j2``), ``None`` for any other file."""
    path = Path(path).resolve()
    for prefix, folder in builtin_template_dirs().items():
        if path.is_relative_to(folder.resolve()):
            rest = path.relative_to(folder.resolve()).as_posix()
            return f"{prefix}/{rest}" if prefix else rest
    return None


def _environment(project: Project):
    import jinja2

    from .printers import scalar_c, scalar_python

    env = jinja2.Environment(
        loader=_RecordingLoader([*(jinja2.FileSystemLoader(str(d)) for d in project.template_dirs),
                                 jinja2.FileSystemLoader(str(SHARED_TEMPLATES)),
                                 jinja2.PrefixLoader({prefix: jinja2.FileSystemLoader(str(folder))
                                                      for prefix, folder in builtin_template_dirs().items() if prefix})]),
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
    env.filters["keyword"] = lambda name: f"{name}={name}"
    env.filters["mdcell"] = lambda x: ("`" + str(x).replace("|", "\\|") + "`") if x is not None else ""
    env.filters["verdict_cell"] = lambda v: str(v).replace("|", "\\|")
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
        where = ", ".join(str(d) for d in (*project.template_dirs, *builtin_template_dirs().values()))
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
    """How a header names a source: ``adjointgen/templates/<name>`` for a built-in template (the
    same in a checkout and an installed adjointgen), else relative to the project (or by the
    project's aliases)."""
    builtin = builtin_template_name(path)
    if builtin is not None:
        return "adjointgen/templates/" + builtin
    path = Path(path).resolve()
    if project.aliases:
        return project.label(path)
    try:
        return path.relative_to(project.root).as_posix()
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


def _with_imports(text: str, printer, template, public) -> str:
    """The rendered module with the imports its code reads (:mod:`adjointgen.codegen.imports`)."""
    try:
        return resolve_imports(text, {**(printer.imports or {}), **printer.forward_import(public)})
    except UnknownName as exc:
        raise TemplateError(f"{template.filename}: {exc}") from None
    except SyntaxError as exc:
        raise TemplateError(f"{template.filename}: the rendered module is not Python: {exc}") from None

"""The project skeleton ``adjointgen init`` writes: configuration, an example derivation, its
forward computation and a test."""
from __future__ import annotations

import keyword
import re
from pathlib import Path
from string import Template

__all__ = ["write_project"]

_HERE = Path(__file__).resolve().parent


def _identifier(name: str) -> str:
    ident = re.sub(r"\W", "_", name).strip("_").lower() or "ops"
    if ident[0].isdigit() or keyword.iskeyword(ident):
        ident = "ops_" + ident
    return ident


def catalogue_sources(name: str) -> dict[str, str]:
    """The catalogue's derivation ``name`` and the helpers it imports: ``{file name: text}``."""
    from ..codegen.generate import helper_modules
    from ..project import catalogue_project

    project = catalogue_project()
    if name not in project.derivation_names():
        raise KeyError(f"no derivation {name!r} in the catalogue (known: {', '.join(project.derivation_names())})")
    path = project.derivation_path(name)
    return {p.name: p.read_text() for p in [path, *helper_modules(path)]}


def write_project(folder: Path, *, package: str | None = None, force: bool = False, copy=()) -> list[Path]:
    """Write a minimal project into ``folder``: ``pyproject.toml`` with ``[tool.adjointgen]``,
    ``derivations/cayley.py``, ``src/<top>/ops.py`` (its forward), ``tests/test_cayley.py``; and
    for each name in ``copy`` the catalogue's derivation of that name with its helpers (to edit:
    ``funm.py``'s ``CATALOGUE`` instantiates the matrix functions of your own scalar functions).

    Raises:
        FileExistsError: a file would be overwritten (pass ``force=True`` to allow it).
        KeyError: a name in ``copy`` is not in the catalogue.
        ValueError: ``package`` is not a dotted Python name.
    """
    folder = Path(folder)
    top = _identifier(folder.resolve().name)
    package = package or f"{top}._adjoint"
    if not all(p.isidentifier() and not keyword.iskeyword(p) for p in package.split(".")):
        raise ValueError(f"--package {package!r} is not a dotted Python name")
    top = package.split(".")[0]
    values = {
        "dist": folder.resolve().name,
        "package": package,
        "package_path": package.replace(".", "/"),
        "top": top,
    }
    files = {
        "pyproject.toml": "pyproject.toml.tmpl",
        "README.md": "README.md.tmpl",
        "derivations/cayley.py": "cayley.py.tmpl",
        f"src/{top}/ops.py": "ops.py.tmpl",
        "tests/test_cayley.py": "test_cayley.py.tmpl",
    }
    copied = {}
    for name in copy:
        copied.update({f"derivations/{fname}": text for fname, text in catalogue_sources(name).items()})
    inits = [f"src/{'/'.join(package.split('.')[:i])}/__init__.py" for i in range(1, len(package.split(".")))]
    existing = [rel for rel in [*files, *copied] if (folder / rel).exists()]
    if existing and not force:
        raise FileExistsError(f"{folder} already holds {', '.join(existing)} (use --force to overwrite)")
    written = []
    for rel, template in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Template((_HERE / template).read_text()).substitute(values))
        written.append(path)
    for rel, text in copied.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    for rel in inits:
        path = folder / rel
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text('"""Package of the project; its generated part is written by `adjointgen generate`."""\n'
                            if rel.count("/") == 2 else "")
            written.append(path)
    return written

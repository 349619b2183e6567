"""The backends, one package each: ``codegen/backends/<name>/`` holds

- ``__init__.py``: the row (:class:`Backend`), which names its template (in ``templates/<name>/``,
  shipped as ``adjointgen.templates``: a project's template of the same name overrides one, and the
  templates the backends share are ``templates/common/``), carries its printer (the syntax of every
  IR operation, the imports of every runtime name, the module of its runtime's forwards) and its
  verifier, and lists the runtime modules its code may import;
- ``backend.toml``: where its files go and whether a project gets it by default, read by
  :mod:`adjointgen.project` without importing the generator.

Adding a backend is adding such a package and its template folder (and, where its code needs
helpers, a runtime module, which the row names: the runtime is a stage of its own, imported by
generated code without the generator); nothing in the generator branches on a backend's name."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...project import BACKENDS as BACKEND_DIRS
from ..printers import ArrayPrinter


@dataclass(frozen=True)
class Backend:
    """One target, described once: nothing in the generator branches on a backend's name.

    Attributes:
        name: the name a project's ``backends`` setting uses.
        template: the operation template (the project's own first, then the built-in one); the
            templates it includes are found while it renders and become sources of the file.
        printer: the printer of the rules' value DAG and of the imports of the generated module
            (:class:`~adjointgen.codegen.printers.ArrayPrinter`), ``None`` when the backend prints
            no rule.
        comment: line-comment prefix of the header (``None``: an HTML comment).
        runtime: the helper modules its generated code may import (module prefixes); the
            numerical guards and algorithms live there, not in the template.
        package_init: the package ``__init__`` it needs under the output package, if any.
        kernels: it emits elementwise kernels: only for operations that have an elementwise part,
            and the other backends' code may launch them.
        verifier: runs its generated module against the audited rules before anything is written
            (``(op, d, path, text, contexts, problems)``, :mod:`adjointgen.codegen.verify`;
            ``None``: the text is only compared).
        libraries: the distributions its verification runs (their versions are in the key of
            every record: :func:`adjointgen.codegen.generate.record_keys`).
    """

    name: str
    template: str
    printer: ArrayPrinter | None
    comment: str | None
    runtime: tuple[str, ...] = ()
    package_init: str | None = None
    kernels: bool = False
    verifier: Callable | None = None
    libraries: tuple[str, ...] = ()

    @property
    def output(self) -> str:
        """The file of an operation, relative to the output package, with ``{name}``."""
        return BACKEND_DIRS[self.name]

    def emits(self, op) -> bool:
        """Whether the operation has a file of this backend."""
        return not self.kernels or bool(op.kernel_variants or op.instances)


PACKAGE_TEMPLATE = "package/__init__.py.j2"

def _rows() -> tuple[Backend, ...]:
    import importlib

    from ...project import backend_declarations

    return tuple(importlib.import_module(f"{__name__}.{name}").BACKEND for name in backend_declarations())


#: every backend (a package here with its ``backend.toml``), in the order the generator renders them
BACKENDS = _rows()
#: the printers by name (a backend's ``printer.name``)
PRINTERS = {b.printer.name: b.printer for b in BACKENDS if b.printer is not None}

"""The backends: one row each (its template, printer, runtime helpers, package file, kernels and
verifier); nothing in the generator branches on a backend's name."""
from __future__ import annotations

from dataclasses import dataclass

from ..project import BACKENDS as BACKEND_DIRS



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
        libraries: the distributions its verification runs (their versions are in the key of
            every record: :func:`record_keys`).
    """

    name: str
    template: str
    printer: str | None
    comment: str | None
    runtime: tuple[str, ...] = ()
    package_init: str | None = None
    kernels: bool = False
    verifier: str | None = None
    libraries: tuple[str, ...] = ()

    @property
    def output(self) -> str:
        """The file of an operation, relative to the output package, with ``{name}``."""
        return BACKEND_DIRS[self.name]

    def emits(self, op) -> bool:
        """Whether the operation has a file of this backend."""
        return not self.kernels or bool(op.kernel_variants or op.instances)


BACKENDS = (
    Backend("torch", "torch/op.py.j2", "torch", "#", runtime=("adjointgen.runtime",),
            package_init="torch/__init__.py", verifier="torch", libraries=("torch",)),
    Backend("cupy", "cupy/op.py.j2", "xp", "#", runtime=("adjointgen.runtime.xp", "adjointgen.runtime.divided",
                                                       "adjointgen.runtime.host"),
            package_init="cupy/__init__.py", verifier="array"),
    Backend("cuda", "cuda/op.cu.j2", None, "//", runtime=("adjointgen_divided.cuh",), kernels=True),
    Backend("jax", "jax/op.py.j2", "jax", "#", runtime=("adjointgen.runtime.jax", "adjointgen.runtime.rules",
                                                     "adjointgen.runtime.host"),
            package_init="jax/__init__.py", verifier="jax", libraries=("jax", "jaxlib")),
    Backend("report", "report/audit.md.j2", None, None),
)

PACKAGE_TEMPLATE = "package/__init__.py.j2"

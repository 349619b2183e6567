"""What a derivation may be called.  A derivation's name becomes a module name
(``<output>/torch/<name>.py``), so it must be a Python identifier, not a keyword, and not a module
the generated code imports.  This module imports nothing of adjointgen: the derivation builder
(:mod:`adjointgen.calculus`) and the project loader (:mod:`adjointgen.project`) both ask it."""
from __future__ import annotations

import keyword

#: modules the generated code imports: a derivation of that name would shadow them
RESERVED_NAMES = frozenset({"torch", "numpy", "cupy", "cupyx", "jax", "jaxlib", "scipy", "sympy", "math", "adjointgen", "jinja2",
                            "typing", "functools", "os", "sys", "abc", "types", "collections", "warnings",
                            "contextlib", "dataclasses", "itertools", "operator", "re", "json", "pathlib"})


def name_problem(name) -> str | None:
    """Why ``name`` cannot name a derivation, or ``None`` if it can."""
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        return (f"the derivation name {name!r} is not a Python identifier (it names the generated modules "
                "<output>/torch/<name>.py, ...): use letters, digits and underscores, not a keyword")
    if name in RESERVED_NAMES:
        return f"the derivation name {name!r} would shadow the module {name} that generated code imports: choose another name"
    return None

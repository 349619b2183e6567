"""The imports of a generated Python module, computed from the code that was emitted.

A template marks where the imports go with ``{{ imports }}``; the generator renders the module with
a marker there, finds the module-level names ``_x`` the code reads and binds nowhere (its rule
lines, written by the backend's printer, and the template's own calls), and writes one import for
each, from the printer's table (:attr:`adjointgen.codegen.printers.ArrayPrinter.imports`).  So no
template decides its imports by matching operation names, and a module imports what it uses,
nothing more.  A name ``_x`` that the code reads and the table does not know is an error of the
template or the printer, reported as such.
"""
from __future__ import annotations

import ast

#: what the template writes where the imports go (``{{ imports }}``), replaced after rendering
MARKER = "# adjointgen:imports"


class UnknownName(Exception):
    """The emitted code reads ``_x``, which it does not bind and the printer's table does not know."""


def free_names(text: str) -> set[str]:
    """The names the module reads and binds nowhere (no assignment, parameter, definition or import)."""
    tree = ast.parse(text)
    bound: set[str] = set()
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update(a.asname or a.name.split(".")[0] for a in node.names)
    return used - bound


def statement(name: str, source: str) -> str:
    """``import m as _x`` for ``source = "m"``, ``from m import a as _x`` for ``"m:a"``."""
    if ":" not in source:
        return f"import {source} as {name}" if source != name else f"import {source}"
    module, attr = source.split(":")
    return f"from {module} import {attr} as {name}" if attr != name else f"from {module} import {attr}"


def resolve(text: str, table: dict[str, str]) -> str:
    """``text`` with its :data:`MARKER` line replaced by the imports its code uses: plain imports
    first, then a blank line and the ``from`` imports, each group in the table's order.  A text
    without the marker is returned as it is."""
    if MARKER not in text:
        return text
    free = free_names(text)
    unknown = sorted(n for n in free if n.startswith("_") and not n.startswith("__") and n not in table)
    if unknown:
        raise UnknownName(f"the generated code reads {', '.join(unknown)}, which it does not define and the "
                          f"printer's import table does not know (add them to ArrayPrinter.imports)")
    used = [(name, source) for name, source in table.items() if name in free]
    plain = [statement(n, s) for n, s in used if ":" not in s]
    froms = [statement(n, s) for n, s in used if ":" in s]
    block = "\n".join(plain + ([""] if plain and froms else []) + froms)
    return text.replace(MARKER, block, 1) if block else text.replace(MARKER + "\n", "", 1)

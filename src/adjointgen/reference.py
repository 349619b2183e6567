"""The derivation author's reference, built from the docstrings: ``adjointgen reference``.

Every public method of :class:`~adjointgen.calculus.Derivation` appears with its signature and
docstring (steps say what they record and how the audit checks them), followed by the sampler's
contract and the project configuration.  ``docs/reference.md`` is this output, kept in sync by a
test, so the reference cannot drift from the code.
"""
from __future__ import annotations

import inspect
import textwrap

__all__ = ["reference_markdown"]

DECLARATIONS = ("__init__", "dim", "input", "output", "api_outputs", "forward", "instances", "tangent",
                "parameter", "imaginary_diagonal", "diag")
RULES = ("set_jvp", "derive_vjp")


def _doc(obj) -> str:
    return textwrap.dedent("\n" + (inspect.getdoc(obj) or "(no docstring)")).strip()


def _method(cls, name: str) -> str:
    fn = getattr(cls, name)
    sig = str(inspect.signature(fn)).replace("(self, ", "(").replace("(self)", "()")
    shown = "Derivation" if name == "__init__" else f"d.{name}"
    return f"### `{shown}{sig}`\n\n{_doc(fn)}\n"


def reference_markdown() -> str:
    from .audit.runner import fd_tangents
    from .calculus import derivation, nodes
    from .project import __doc__ as project_doc

    D = derivation.Derivation
    # the steps of every family (calculus/steps), in the order of the builder's file and the families'
    steps = []
    for family in (D, *D.__mro__[1:-1]):
        public = [n for n, v in vars(family).items() if callable(v) and not n.startswith("_")
                  and n not in DECLARATIONS + RULES]
        steps += sorted(public, key=lambda n: inspect.getsourcelines(getattr(D, n))[1])
    parts = [
        "# Derivation reference\n",
        "Generated from the docstrings by `adjointgen reference`; do not edit.\n",
        "A derivation file declares symbols with their structure, a sampler of numeric instances and "
        "the forward computation, states the operation's identities, and applies named steps until "
        "`set_jvp` can state the JVP; `derive_vjp` transposes it.  Every step is recorded with the "
        "equation it produced; `adjointgen audit` checks each one numerically on the sampler's "
        "instances and verifies each derived step exactly, in rational arithmetic at random rational "
        "matrices with the declared structure (docs/derivations.md: how every step is verified).\n",
        "## Declarations\n",
        *[_method(D, n) for n in DECLARATIONS],
        "## The sampler's contract\n",
        _doc(D.instances) + "\n",
        "### `adjointgen.audit.fd_tangents" + str(inspect.signature(fd_tangents)) + "`\n\n" + _doc(fd_tangents) + "\n",
        "## Steps\n",
        *[_method(D, n) for n in steps],
        "## Rules\n",
        *[_method(D, n) for n in RULES],
        "## Matrix nodes\n",
        *[f"### `{name}`\n\n{_doc(getattr(nodes, name))}\n" for name in nodes.__all__
          if inspect.isclass(getattr(nodes, name)) and name not in ("PairwiseDef", "Structure")],
        "## Project configuration\n",
        _doc(type("P", (), {"__doc__": project_doc})) + "\n",
    ]
    return "\n".join(parts)

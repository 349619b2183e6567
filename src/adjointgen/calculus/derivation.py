"""A derivation: declared symbols and identities, then named steps that transform equations until
the JVP is found, then the VJP by transposition.  Every step is recorded with the equation it
produced and what it did (a :class:`Replay`), so that :mod:`adjointgen.audit` can check each one
numerically and verify it exactly, in rational arithmetic at random rational matrices.

A derivation file reads top to bottom like the derivation in a paper::

    d = Derivation("eigh", __file__, title="Symmetric eigendecomposition")
    n = d.dim("n")
    A = d.input("A", n, n, symmetric=True)
    U = d.output("U", n, n, orthonormal=True, api="V")
    D = d.output("D", n, n, diagonal=True, api="w")
    eig = d.identity("A U = U D", A * U, U * D)
    s = d.differentiate(eig)
    ...
"""
from __future__ import annotations

import os
from typing import Callable

import sympy as sp
from sympy.matrices.expressions import MatrixSymbol

from .algebra import DerivationError, normalize
from .nodes import PairwiseDef, Structure
from .records import Check, Equation, Extension, ForwardRef, ForwardSpec, Gauge, Replay, Rule, SecondOrder, Step, \
    ValueBlock, Variant  # noqa: F401  (the records, re-exported: derivation files and tests import them from here)
from .spec import OperationSpec, Source, freeze
from .steps.declarations import Declarations
from .steps.identities import Identities
from .steps.projections import Projections
from .steps.rules import RuleSteps
from .steps.solves import Solves


class Derivation(Declarations, Identities, Projections, Solves, RuleSteps):
    """Symbols, identities and named steps of one operation's derivation.

    The steps come in families, one module each under :mod:`adjointgen.calculus.steps`: the
    declarations, the identities and the steps that transform both sides alike, the projections,
    the solves, and the rules.  This class holds the state they share and the recording of steps."""

    #: every Derivation constructed, so a loader can recover a derivation whose script stopped
    created: list["Derivation"] = []

    def __init__(self, name: str, path: str, *, title: str, references: tuple[str, ...] = (),
                 field: str = "real"):
        """One operation's derivation: ``Derivation("inv", __file__, title="matrix inverse")``.

        ``name`` names the generated modules and functions (``<name>``, ``<name>_jvp``, ...);
        ``path`` is the derivation file (``__file__``: steps and errors point at its lines);
        ``title`` and ``references`` appear in the generated docstrings and audit reports.
        ``field="complex"``: the symbols are complex matrices and ``^T`` is the conjugate
        transpose (see :class:`~adjointgen.calculus.nodes.Structure`); the VJP is the adjoint under
        ``<X, Y> = Re tr(X^H Y)``, and the rules are also specialised to real data."""
        if field not in ("real", "complex"):
            raise ValueError(f"field must be 'real' or 'complex', not {field!r}")
        from ..names import name_problem

        if name_problem(name):
            raise DerivationError(f"{path}: Derivation({name!r}): {name_problem(name)}")
        self.name = name
        self.field = field
        self.path = os.path.abspath(path)
        self.title = title
        self.references = references
        self.structure = Structure(complex=field == "complex")
        #: the declared gauges (in order), and the derived residual of each, by gauge name
        self.gauges: list[Gauge] = []
        self.gauge_rules: dict[str, Rule] = {}
        self.cluster_meaning: dict[str, str] = {}
        #: cluster indicator -> the output whose spectral losses the backward completes there
        self.cluster_completion: dict[str, str] = {}
        #: scalar functions the derivation is generic in (``f`` of ``X = U f(D) U^T``), by name
        self.functions: dict[str, sp.FunctionClass] = {}
        #: outputs the forward returns for the rules only (see :meth:`output`)
        self.auxiliary_outputs: set[str] = set()
        self.hidden_outputs: set[str] = set()
        #: piecewise-constant outputs (see :meth:`output`): no tangent, no rule
        self.constant_outputs: set[str] = set()
        #: instantiations of the scalar functions: operation name -> {function name: Lambda}, options
        self.instantiations: dict[str, tuple[dict, tuple]] = {}
        self.real_jvp: Rule | None = None
        self.real_vjp: Rule | None = None
        #: the rules specialised to square orthonormal outputs (:meth:`square_variants`)
        self.variants: list[Variant] = []
        #: input name -> its cotangent before the projection onto symmetric matrices (``derive_vjp``)
        self.unprojected_vjp: dict[str, sp.MatrixExpr] = {}
        #: (m, n) of :meth:`either_orientation`
        self.orientations: tuple[str, str] | None = None
        self.dims: list[sp.Symbol] = []
        self.inputs: list[MatrixSymbol] = []
        self.outputs: list[MatrixSymbol] = []
        self.api_names: dict[str, str] = {}
        self.tangents: dict[str, MatrixSymbol] = {}
        self.cotangents: dict[str, MatrixSymbol] = {}
        self.introduced: list[tuple[MatrixSymbol, sp.MatrixExpr]] = []
        self.pairwise: dict[str, PairwiseDef] = {}
        #: pairwise name -> the line of the derivation file that defined it
        self.pairwise_lines: dict[str, int | None] = {}
        self.steps: list[Step] = []
        self.sampler: Callable | None = None
        self.audit_dims: list[dict[str, int]] = []
        self.jvp: Rule | None = None
        self.vjp: Rule | None = None
        self.symmetric_inputs: set[str] = set()
        self.api_output_order: list[str] | None = None
        self.forward_spec: ForwardSpec | None = None
        self.extension: Extension | None = None
        self.positive_definite_inputs: set[str] = set()
        #: output name -> (name in the public API, form): form "adjoint" means the public value
        #: (and the forward's) is the conjugate transpose of the symbol (``Vh`` for ``V``)
        self.public_forms: dict[str, tuple[str, str]] = {}
        self.instances_line: int | None = None
        self.partial_rules = False
        #: the second-order rule of a spectral function (:meth:`second_order`)
        self.second: SecondOrder | None = None
        #: input cotangent name -> (L, R) with ``g = L R^T`` (``derive_vjp(lowrank=k)``)
        self.vjp_factors: dict[str, tuple] = {}
        #: diagonal output name -> how its values move as a block at clusters (``derive_vjp``)
        self.value_blocks: dict[str, ValueBlock] = {}
        #: dimension name -> size of the explicit SymPy matrices of a symbolic replay, the fallback for
        #: values without a rational form (default 3 and 2; the exact replays take the instances' sizes)
        self.symbolic_sizes: dict[str, int] = {}
        self.error: str | None = None
        Derivation.created.append(self)

    def freeze(self) -> OperationSpec:
        """The immutable spec every later stage reads (:mod:`adjointgen.calculus.spec`)."""
        return freeze(self)

    def _source(self, eq=None, label: str = "") -> Source:
        """Where a rule output comes from: the step that produced ``eq`` (else the calling line)."""
        for step in reversed(self.steps):
            if eq is not None and step.equation is eq:
                return Source(self.path, step.line, step.index, step.label, step.helper)
        return Source(self.path, self._line(), None, label)

    # ------------------------------------------------------------------ recording
    def _line(self) -> int | None:
        """The line of the derivation file that (directly or through helpers) called the engine."""
        import sys

        frame = sys._getframe(2)
        while frame is not None:
            if os.path.abspath(frame.f_code.co_filename) == self.path:
                return frame.f_lineno
            frame = frame.f_back
        return None

    def _origin(self) -> tuple[str, int] | None:
        """``(file, line)`` of the innermost caller outside the engine: the derivation file, or the
        helper module (``derivations/_eigenspaces.py``) whose line recorded the step."""
        import sys

        engine = os.path.dirname(os.path.abspath(__file__))
        frame = sys._getframe(2)
        while frame is not None:
            path = os.path.abspath(frame.f_code.co_filename)
            if not path.startswith(engine + os.sep):  # the engine: calculus/ and its steps/
                return path, frame.f_lineno
            frame = frame.f_back
        return None

    def _record(self, kind, label, equation=None, *, check=None, replay=None, note=""):
        origin = self._origin()
        step = Step(len(self.steps) + 1, kind, label, equation, check, replay, self._line(), note,
                    origin if origin is not None and origin[0] != self.path else None)
        self.steps.append(step)
        return step

    def _norm(self, e):
        return normalize(e, self.structure)

    def _eq(self, lhs, rhs) -> Equation:
        return Equation(self._norm(lhs), self._norm(rhs))

    def _fail(self, label, message):
        """Record the failed step (so the audit can show everything up to it) and stop; the message
        names the derivation file's line that called the step."""
        line = self._line()
        self.error = f"{self.path}{':' + str(line) if line else ''}: step '{label}': {message}"
        self._record("error", label, None, note=message)
        raise DerivationError(self.error)

    def stopped(self, message: str) -> None:
        """Record that the derivation stopped outside a step (an error raised inside the engine),
        so that the audit reports it after the steps recorded so far."""
        self.error = message
        self._record("error", "engine", None, note=message)

    def _tangent_of(self, X):
        return self.tangents.get(X.name)


"""The frozen spec of a finished derivation: what every later stage reads.

A :class:`~adjointgen.calculus.Derivation` is a builder: its declarations and steps add to it while
the derivation file runs.  Once the file has run (``derive_vjp`` done, or a step failed), the
loader freezes it into an :class:`OperationSpec`: typed, immutable (frozen dataclasses, tuples,
read-only mappings, a frozen :class:`~adjointgen.calculus.nodes.Structure`).  The audit, the
lowering to the rule IR, the verification of generated code, the reports and every template read
the spec only; nothing writes into it, and every field that exists is declared here.

Data flows one way::

    derivation file -> Derivation (builder) -> OperationSpec -> audit -> rule IR -> backend -> files
"""
from __future__ import annotations

import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping

import sympy as sp
from sympy.matrices.expressions import MatrixSymbol

from .nodes import PairwiseDef, PairwiseMatrix, Structure

if TYPE_CHECKING:  # (records.py imports Source from here)
    from .records import Extension, ForwardSpec, Gauge, Rule, SecondOrder, Step, ValueBlock, Variant


def _frozen_map(m, value=lambda v: v) -> Mapping:
    return types.MappingProxyType({k: value(v) for k, v in dict(m).items()})


@dataclass(frozen=True)
class Source:
    """Where a rule comes from: the derivation file's line and the step recorded there."""

    path: str
    line: int | None
    step: int | None
    label: str
    #: ``(file, line)`` in the helper module that recorded the step, if a helper did
    helper: tuple[str, int] | None = None

    def comment(self, root=None) -> str:
        """``derivations/eigh.py:69 (step 17: solve for dD) in derivations/_eigenspaces.py:75``:
        paths relative to ``root`` (a folder), or as ``root(path)`` names them (a callable: the
        project's labels, so that the installed catalogue names its files as the checkout does)."""
        import os

        def rel(p):
            if callable(root):
                return root(p)
            return os.path.relpath(p, root).replace(os.sep, "/") if root else p

        where = f"{rel(self.path)}:{self.line}" if self.line else rel(self.path)
        label = self.label.split(": ")[0] if len(self.label) > 60 else self.label  # not the formula again
        text = f"{where} (step {self.step}: {label})" if self.step else where
        return text + (f" in {rel(self.helper[0])}:{self.helper[1]}" if self.helper else "")


@dataclass(frozen=True, eq=False)
class OperationSpec:
    """One operation, as its derivation left it.  Field names are those of
    :class:`~adjointgen.calculus.Derivation` (whose docstrings describe them)."""

    name: str
    field: str
    path: str
    title: str
    references: tuple[str, ...]
    structure: Structure
    dims: tuple[sp.Symbol, ...]
    inputs: tuple[MatrixSymbol, ...]
    outputs: tuple[MatrixSymbol, ...]
    #: output name -> its name in the generated rule functions (``w`` for ``D``)
    api_names: Mapping[str, str]
    #: output name -> (public name, form) for outputs returned in another form (``Vh`` for ``V``)
    public_forms: Mapping[str, tuple[str, str]]
    api_output_order: tuple[str, ...] | None
    tangents: Mapping[str, MatrixSymbol]
    cotangents: Mapping[str, MatrixSymbol]
    introduced: tuple[tuple[MatrixSymbol, sp.MatrixExpr], ...]
    pairwise: Mapping[str, PairwiseDef]
    pairwise_lines: Mapping[str, int | None]
    symmetric_inputs: frozenset[str]
    positive_definite_inputs: frozenset[str]
    auxiliary_outputs: frozenset[str]
    hidden_outputs: frozenset[str]
    constant_outputs: frozenset[str]
    functions: Mapping[str, sp.FunctionClass]
    instantiations: Mapping[str, tuple[dict, tuple]]
    forward_spec: ForwardSpec | None
    #: :meth:`Derivation.extend`: the public function beyond the derived domain (``Extension`` | None)
    extension: Extension | None
    gauges: tuple[Gauge, ...]  # in declaration order
    gauge_rules: Mapping[str, Rule]  # gauge name -> the rule of its residual
    cluster_meaning: Mapping[str, str]
    cluster_completion: Mapping[str, tuple[str, ...]]
    steps: tuple[Step, ...]  # in order
    jvp: Rule | None
    vjp: Rule | None
    real_jvp: Rule | None
    real_vjp: Rule | None
    #: the rules specialised to square orthonormal outputs (``Variant``, :meth:`Derivation.square_variants`)
    variants: tuple[Variant, ...]
    #: ``(m, n)``: the inputs may be tall or wide, products are ordered for both
    #: (:meth:`Derivation.either_orientation`); ``None``: one order
    orientations: tuple[str, str] | None
    #: input cotangent name -> (L, R) with ``g = L R^T`` (``derive_vjp(lowrank=k)``)
    vjp_factors: Mapping[str, tuple[sp.MatrixExpr, sp.MatrixExpr]]
    second: SecondOrder | None
    #: diagonal output name -> ``ValueBlock``: how its values move as a block at clusters
    value_blocks: Mapping[str, ValueBlock]
    partial_rules: bool
    sampler: Callable | None
    audit_dims: tuple[Mapping[str, int], ...]
    instances_line: int | None
    #: dimension name -> size of the explicit matrices of the symbolic replay (default 3)
    symbolic_sizes: Mapping[str, int]
    #: the first step that failed (``file: step 'label': message``), or None
    error: str | None

    # ------------------------------------------------------------------ derived views
    @property
    def gauge_parameters(self) -> tuple[MatrixSymbol, ...]:
        return tuple(g.parameter for g in self.gauges)

    @property
    def forward_options(self) -> tuple[str, ...]:
        return () if self.forward_spec is None else tuple(k for k, _ in self.forward_spec.options)

    @property
    def rule_outputs(self) -> tuple[MatrixSymbol, ...]:
        """The outputs that have JVP/VJP rules."""
        if self.jvp is None:
            return tuple(o for o in self.outputs if o.name not in self.constant_outputs)
        return tuple(o for o in self.outputs if o.name in self.tangents and self.tangents[o.name].name in self.jvp.raw)

    def pairwise_matrix(self, name: str) -> PairwiseMatrix:
        """The pairwise matrix ``name`` as a matrix symbol of the expressions."""
        from .algebra import DerivationError

        if name not in self.pairwise:
            raise DerivationError(f"{self.path}: no pairwise matrix {name!r}")
        return PairwiseMatrix(name, *next(s.shape for s in self.outputs if s.name == self.pairwise[name].diagonal_of))

    def tangents_by_name(self, name: str) -> MatrixSymbol:
        for t in self.tangents.values():
            if t.name == name:
                return t
        raise KeyError(name)

    def sources(self, rule: str) -> Mapping[str, Source]:
        """``"jvp"``/``"vjp"``/``"gauge"``: rule output name -> where it was derived."""
        found = {}
        for r in ((self.jvp, self.real_jvp) if rule == "jvp" else (self.vjp, self.real_vjp) if rule == "vjp"
                  else tuple(self.gauge_rules.values())):
            if r is not None:
                found.update(r.sources)
        return types.MappingProxyType(found)


def as_spec(d) -> OperationSpec:
    """``d`` itself if it is a spec, else the spec of a :class:`~adjointgen.calculus.Derivation`;
    its pairwise definitions made the ones its symbols read (a pairwise matrix is a symbol named
    ``E`` whose definition is looked up by name: another derivation loaded since, in the same
    process, may have defined an ``E`` of its own -- the SVD's on the singular values)."""
    spec = d if isinstance(d, OperationSpec) else freeze(d)
    PairwiseMatrix.activate(spec.pairwise)
    return spec


def freeze(d) -> OperationSpec:
    """The spec of a :class:`~adjointgen.calculus.Derivation` (see the module docstring)."""
    return OperationSpec(
        name=d.name, field=d.field, path=d.path, title=d.title, references=tuple(d.references),
        structure=d.structure.frozen(),
        dims=tuple(d.dims), inputs=tuple(d.inputs), outputs=tuple(d.outputs),
        api_names=_frozen_map(d.api_names), public_forms=_frozen_map(d.public_forms, tuple),
        api_output_order=None if d.api_output_order is None else tuple(d.api_output_order),
        tangents=_frozen_map(d.tangents), cotangents=_frozen_map(d.cotangents),
        introduced=tuple(d.introduced), pairwise=_frozen_map(d.pairwise), pairwise_lines=_frozen_map(d.pairwise_lines),
        symmetric_inputs=frozenset(d.symmetric_inputs), positive_definite_inputs=frozenset(d.positive_definite_inputs),
        auxiliary_outputs=frozenset(d.auxiliary_outputs), hidden_outputs=frozenset(d.hidden_outputs), constant_outputs=frozenset(d.constant_outputs),
        functions=_frozen_map(d.functions), instantiations=_frozen_map(d.instantiations),
        forward_spec=d.forward_spec, extension=d.extension, gauges=tuple(d.gauges), gauge_rules=_frozen_map(d.gauge_rules),
        cluster_meaning=_frozen_map(d.cluster_meaning),
        cluster_completion=_frozen_map(d.cluster_completion, lambda v: tuple(v) if not isinstance(v, str) else v),
        steps=tuple(d.steps), jvp=d.jvp, vjp=d.vjp, real_jvp=d.real_jvp, real_vjp=d.real_vjp, variants=tuple(d.variants),
        orientations=d.orientations,
        vjp_factors=_frozen_map(d.vjp_factors, tuple), second=d.second, value_blocks=_frozen_map(d.value_blocks, lambda v: v),
        partial_rules=bool(d.partial_rules),
        sampler=d.sampler, audit_dims=tuple(_frozen_map(x) for x in d.audit_dims), instances_line=d.instances_line,
        symbolic_sizes=_frozen_map(d.symbolic_sizes or {}), error=d.error,
    )

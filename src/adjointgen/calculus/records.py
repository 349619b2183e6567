"""The records of a derivation: its equations, recorded steps with their checks and replays, the
declared forward, the derived rules and their variants, value blocks, second derivatives and gauges.

Plain frozen data, built by :class:`adjointgen.calculus.derivation.Derivation` and read by the
audit, the lowering and :mod:`adjointgen.calculus.spec` (which types its fields with them).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp
from sympy.matrices.expressions import MatrixSymbol

from .algebra import DerivationError
from .spec import Source

__all__ = ["Check", "Equation", "Extension", "ForwardRef", "ForwardSpec", "Gauge", "Replay", "Rule", "SecondOrder",
           "Step", "ValueBlock", "Variant"]


@dataclass(frozen=True)
class Equation:
    """``lhs = rhs`` between matrix expressions."""

    lhs: sp.MatrixExpr
    rhs: sp.MatrixExpr

    @property
    def residual_expr(self):
        return self.lhs - self.rhs

    def __str__(self) -> str:
        return f"{self.lhs} = {self.rhs}"


@dataclass(frozen=True)
class Step:
    """One recorded step of a derivation.

    Attributes:
        index: 1-based position in the derivation.
        kind: the engine operation (``differentiate``, ``left_multiply``, ``substitute``, ...).
        label: what the derivation file called it.
        equation: the equation the step produced (``None`` for steps that check a property).
        check: what the numeric audit checks on every instance (:class:`Check`, interpreted by
            :mod:`adjointgen.audit.checks`), or ``None``.
        replay: what the audit replays exactly on explicit matrices (:class:`Replay`, interpreted
            by :mod:`adjointgen.audit.replays`; ``premise`` for an identity, a definition, the
            forward or a gauge choice: what the derivation assumes).
        line: line of the derivation file that called the step (directly or through a helper).
        helper: ``(file, line)`` inside the helper module, when a helper recorded the step.
    """

    index: int
    kind: str
    label: str
    equation: Equation | None
    check: "Check | None"
    replay: "Replay | None" = None
    line: int | None = None
    note: str = ""
    #: ``(file, line)`` of the helper module that recorded the step, when not the derivation file
    helper: tuple[str, int] | None = None


@dataclass(frozen=True)
class ForwardRef:
    """An importable function: ``module`` and ``attr`` (``xp`` set: ``attr`` is a dotted path on the
    array module of the inputs, NumPy or CuPy; ``runtime`` set: the function ``attr`` of each
    backend's runtime)."""

    module: str
    attr: str
    xp: bool = False
    #: a forward of adjointgen's runtime, declared once by name (``forward(runtime="eigh")``):
    #: ``module`` is this backend's default, and every backend imports ``attr`` from its own runtime
    runtime: bool = False

    @classmethod
    def parse(cls, value, backend: str, where: str) -> "ForwardRef":
        if callable(value) and not isinstance(value, str):
            module, name = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
            if (not module or module == "__main__" or module.startswith("adjointgen_derivation_")
                    or not name.isidentifier()):
                raise DerivationError(
                    f"{where}: the {backend} forward {name or value!r} must be importable by the generated "
                    "code: give its name as a string ('package.module:function') or pass a function defined at "
                    "the top level of an importable module (not in the derivation file, not a lambda)")
            return cls(module, name)
        if not isinstance(value, str):
            raise DerivationError(f"{where}: the {backend} forward must be a name or a function, got {value!r}")
        if backend == "numpy" and value.startswith("xp."):
            attr = value[3:]
            if not all(part.isidentifier() for part in attr.split(".")):
                raise DerivationError(f"{where}: {value!r} is not a dotted name")
            return cls("xp", attr, xp=True)
        module, sep, attr = value.partition(":") if ":" in value else value.rpartition(".")
        if not sep or not attr.isidentifier() or not all(p.isidentifier() for p in module.split(".")):
            raise DerivationError(f"{where}: the {backend} forward {value!r} is not an importable name "
                                  "('package.module.function' or 'package.module:function')")
        return cls(module, attr)

    @property
    def name(self) -> str:
        return f"xp.{self.attr}" if self.xp else f"{self.module}:{self.attr}"

    def resolve(self, xp=None):
        """The function (``xp``: the array module for ``xp.`` names)."""
        import functools
        import importlib

        if self.xp:
            return functools.reduce(getattr, self.attr.split("."), xp)
        try:
            module = importlib.import_module(self.module)
        except ImportError as exc:
            raise DerivationError(f"the forward {self.name} cannot be imported: {exc}") from None
        if not hasattr(module, self.attr):
            raise DerivationError(f"the forward {self.name}: module {self.module} has no attribute {self.attr!r}")
        return getattr(module, self.attr)


@dataclass(frozen=True)
class ForwardSpec:
    """What :meth:`Derivation.forward` declared."""

    torch: ForwardRef | None
    numpy: ForwardRef | None
    options: tuple[tuple[str, object], ...]
    checked: tuple[str, ...]
    line: int | None
    #: (input name, factorization kind) the torch forward also returns, for the rules to reuse
    saves: tuple[tuple[str, str], ...] = ()
    #: ``numpy`` is a host function (``forward(host=...)``): one NumPy function per matrix, which
    #: :mod:`adjointgen.runtime.host` adapts to every backend (``torch`` is then ``None``)
    host: bool = False


@dataclass(frozen=True)
class Extension:
    """What :meth:`Derivation.extend` declared: ``function(derived, *inputs, **options)`` and its
    keyword options ``(name, default)``."""

    function: ForwardRef
    options: tuple[tuple[str, object], ...]
    line: int | None


@dataclass(frozen=True, eq=False)
class Check:
    """What a step's numeric audit checks: ``kind`` and the expressions it needs (``args``).
    :func:`adjointgen.audit.checks.numeric` says what each kind means on an instance; ``real_only``:
    on the real instances only (a complex rule's specialisation to real data)."""

    kind: str  # equation, forward, dot_product, adjoint, gauge, second_order
    args: tuple = ()
    real_only: bool = False
    #: output names: the check applies to the instances where each of them is square only (the
    #: rules specialised to such shapes, :meth:`Derivation.square_variants`)
    square: tuple = ()


@dataclass(frozen=True)
class Replay:
    """What the audit replays of a step on explicit matrices (exactly, in rational arithmetic): ``kind`` and the
    expressions it needs (``args``).  :func:`adjointgen.audit.replays.residual` says what each kind
    means; most steps are ``equal``: the new residual is an expression of the old ones
    (``M R``, ``R^T``, ``diag(R)``, ``-F ∘ R``, ...), stated with the engine's own nodes."""

    kind: str  # equal, define, substitute, unstructured, constrained, insert, differentiate, real, degenerate,
    # invariant, divided, dot_product, adjoint, gauge, premise
    args: tuple = ()


@dataclass(frozen=True)
class Rule:
    """A derived rule: output name -> SymPy expression, ``raw`` as derived and ``rewritten`` for
    code generation (factored, projections pushed inward: the same value), and where each output's
    expression was derived (``sources``)."""

    raw: dict[str, sp.MatrixExpr]
    rewritten: dict[str, sp.MatrixExpr]
    sources: dict[str, Source] = field(default_factory=dict)


@dataclass(frozen=True)
class Variant:
    """The rules specialised to the shapes at which the orthonormal outputs ``square`` are square
    (``U U^H = I`` as well as ``U^H U = I``): the same values there, with the terms that vanish
    dropped (the complement projections ``(I - U U^H) X``).  ``name`` suffixes the generated
    functions (``square_U``); ``real_jvp``/``real_vjp``: a complex derivation's, read on real data
    (see :meth:`Derivation.square_variants`)."""

    name: str
    square: tuple[str, ...]
    jvp: Rule
    vjp: Rule
    real_jvp: Rule | None = None
    real_vjp: Rule | None = None
    #: symmetric inputs whose tangents are unstructured in these rules (:meth:`Derivation.general_directions`):
    #: the rules of the general-matrix function at a symmetric point, chosen by the caller, not by shape
    directions: tuple[str, ...] = ()


@dataclass(frozen=True)
class ValueBlock:
    """How the values of a diagonal output with clusters move as a block (see
    :meth:`Derivation.derive_vjp`): ``jvp`` gives the block ``X`` whose diagonal is the values'
    tangent (``dD = diag(X)``, ``X = sym(U^T dA U)`` for eigh), ``vjp`` its transposition from a
    block cotangent ``M`` to the input cotangents; ``real_*`` a complex derivation's on real data.
    At a cluster of equal values a second derivative moves them as the eigenvalues of the block
    (:mod:`adjointgen.runtime.value_blocks`), which a cotangent of the value vector cannot carry."""

    values: str
    cotangent: str
    jvp: "Rule"
    vjp: "Rule"
    real_jvp: "Rule | None" = None
    real_vjp: "Rule | None" = None


@dataclass(frozen=True)
class SecondOrder:
    """The second derivative of a spectral function's VJP (see :meth:`Derivation.second_order`).

    ``T(a, b, c)`` is the second divided difference of the scalar function, derived from the first
    (``L``); ``input``/``output``/``vectors``/``values`` name ``A``, ``X``, ``U`` and ``D``."""

    name: str
    T: sp.Lambda
    L: str
    input: str
    output: str
    vectors: str
    values: str


@dataclass(frozen=True)
class Gauge:
    """A continuous freedom of the outputs (see :meth:`Derivation.gauge`).

    Attributes:
        name: ``phase`` (the phase of complex vectors), ``clusters`` (rotations inside clusters of
            equal values) or the name the derivation gave; names the residual's generated function.
        label: the derivation's description.
        parameter: the generator ``Θ`` with its declared structure.
        directions: output name -> its tangent along the gauge (``U Θ``).
    """

    name: str
    label: str
    parameter: MatrixSymbol
    directions: dict[str, sp.MatrixExpr]

    @property
    def suffix(self) -> str:
        """What names its residual in code: empty for ``phase``, the gauge of complex vectors
        every complex derivation has (``R``, ``<op>_gauge``), else ``_<name>``."""
        return "" if self.name == "phase" else f"_{self.name}"

    @property
    def residual_name(self) -> str:
        return "R" + self.suffix

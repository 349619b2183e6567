"""The rule IR: what the templates render.

A derived rule becomes a :class:`RuleIR`: its parameters, its outputs and a topologically sorted
expression DAG of :class:`Value` nodes in which every common sub-expression appears once (the
lowering hash-conses structurally equal sub-trees) and names are canonical (``t0, t1, ...`` in
order of first use), so that output is byte-for-byte deterministic.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

#: operations of the DAG and what they compute (the printers map each to backend syntax)
OPS = {
    "matmul": "matrix product a @ b",
    "transpose": "transpose of the last two axes",
    "add": "sum of the arguments (same kind)",
    "scale": "scalar coefficient times a",
    "add_diag": "matrix a plus the diagonal matrix with diagonal b",
    "scale_rows": "diag(a) @ b, a a diagonal stored as a vector",
    "scale_cols": "a @ diag(b), b a diagonal stored as a vector",
    "diag_mul": "diag(a) @ diag(b) as vectors",
    "diagonal": "the diagonal of a matrix, as a vector",
    "reciprocal": "1/d for a diagonal stored as the vector d",
    "reciprocal_masked": "1/d, and 0 where d vanishes (singular values; relative tolerance cluster_rtol)",
    "skew": "(a - a^T)/2",
    "sym": "(a + a^T)/2",
    "pairwise_mul": "F(d) ∘ a for a pairwise matrix F of the vector d",
    "pairwise_mul_skew": "F(d) ∘ skew(a), fused",
    "pairwise_mul_sym": "F(d) ∘ sym(a), fused",
    "shifted_solve": "column i of X: w_i with P (A - d_i B) w_i = P x_i, U^T B w_i = 0 (runtime solver)",
    "sylvester_solve": "X with a X + X b = c, a and b Hermitian (runtime solver in their eigenbases)",
    "diag_matmul": "diag(a b) as a vector, without the product: sum_k a_jk b_kj",
    "diag_sym": "the real part of the diagonal of a (diag(sym(a)) of a complex matrix), as a real vector",
    "diag_skew": "i times the imaginary part of the diagonal of a (diag(skew(a))), as a vector",
    "add_eye": "a + coeff * I",
    "lower_half": "Φ(a): the lower triangle of a with its diagonal halved",
    "strictly_lower": "the strictly lower triangle of a",
    "solve": "a^-1 b (structure: lower/upper triangular or general)",
    "solve_right": "a b^-1 (structure of b: lower/upper triangular or general)",
    "solve_lu": "A^-1 b (A^-H b with adjoint) through the LU factors the forward saved (or A itself)",
    "solve_right_lu": "a A^-1 (a A^-H with adjoint) through the saved LU factors (or A itself)",
    "inverse": "a^-1 on its own (structure: lower/upper triangular or general)",
    "hadamard": "a ∘ b, a a pairwise matrix the rule takes as a parameter",
    "trace": "tr(a) of a matrix, as a scalar (a tensor of the batch shape)",
    "sum": "the sum of a vector (the trace of a diagonal), as a scalar",
    "scale_by": "a b for a scalar a (one per batch element) and a matrix b",
    "scale_by_vector": "a b for a scalar a (one per batch element) and a vector b",
    "inverse_lu": "A^-1 through the LU factors the forward saved (or A itself)",
    "conj": "the conjugate of a scalar (itself for real data)",
    "real_part": "the real part of a scalar, sym of a 1×1 value (itself for real data)",
    "imaginary_part": "i times the imaginary part of a scalar, skew of a 1×1 value (0 for real data)",
    "scalar_mul": "the product of two scalars",
    "zeros_like": "a zero value of the shape of a",
    "adjugate": "adj(a), the transposed cofactor matrix (runtime routine, finite at singular a)",
    "adjugate_lu": "adj(op(a)) with op(a) = a^H if adjoint, from the LU factors (lu, pivots) of a the forward saved "
                   "(None: from a itself)",
    "matrix_exp": "exp(a) of a general square matrix",
    "expm_frechet": "L_exp[a](b), the Fréchet derivative of exp at a along b (runtime, block exponential)",
    "expm_frechet_solve": "L_exp[a]^-1(b), the inverse Fréchet map of exp (runtime solver)",
    "triangular_sylvester_solve": "the strictly lower X with tril₋(X a - a X) = tril₋(b), a triangular (runtime solver)",
}


@dataclass(frozen=True)
class ResidualIR:
    """One gauge residual a checked backward evaluates and hands to a runtime check.

    ``gauge`` names the gauge.  A residual supported on clusters of equal values (``vector`` set)
    goes to :func:`adjointgen.runtime.degeneracy.check` with the cluster mask of ``vector``, the
    cotangent ``split`` of that vector's output, and ``what`` the vector holds; any other (the
    phases of complex vectors) to :func:`adjointgen.runtime.gauge.check`."""

    gauge: str
    output: str
    cotangents: tuple[str, ...]
    vector: str | None = None
    split: str | None = None
    what: str = "eigenvalues"
    #: the vectors (their cotangents are ``g`` + name) whose spectral losses are completed at
    #: clusters (:func:`adjointgen.runtime.completion.complete`); empty: none
    completes: tuple[str, ...] = ()
    #: the gauge function computing this residual alone (a backward without clusters checks the
    #: phases with it next to the plain VJP); ``None``: only the checked VJP has it
    rule: "RuleIR | None" = None
    #: a phase gauge's outputs whose columns it rotates, and forms of the outputs invariant to it
    #: (the error's wording, from the gauge's declaration)
    phases: tuple[str, ...] = ()
    invariant: str = ""

    @property
    def clustered(self) -> bool:
        """Supported on clusters of equal values (a cluster indicator masks it)."""
        return self.vector is not None


#: parameter roles that are keyword arguments with default ``None`` in generated rule functions
OPTIONAL_ROLES = ("factor", "mask", "option")
#: the role of a pairwise matrix the rules take as a value: it depends on a scalar function the
#: derivation is generic in (``L`` of a matrix function), and each instance computes its own
PAIRWISE_ROLE = "pairwise"


@dataclass(frozen=True)
class Param:
    """A rule argument: its name in generated code, the derivation symbol, and its storage kind
    (``matrix``, or ``diag`` for a diagonal matrix stored as the vector of its diagonal)."""

    name: str
    symbol: str
    kind: str
    role: str  # "primal", "tangent", "cotangent"


@dataclass(frozen=True)
class Value:
    """One node of the expression DAG: ``name = op(*args)``."""

    name: str
    op: str
    args: tuple[str, ...]
    kind: str
    #: data the printer needs beyond the arguments (``coeff``, ``structure``, ``fn``, ``options``:
    #: the keyword parameters passed on to a pairwise function); never source text
    attrs: tuple[tuple[str, object], ...] = ()

    def attr(self, key: str) -> str:
        return dict(self.attrs)[key]


@dataclass(frozen=True)
class PairwiseFn:
    """A pairwise matrix ``F_ij = f(d_i, d_j)`` (``i != j``), ``F_ii = diagonal``.

    ``numerator``/``denominator`` split ``f`` so that code can guard the diagonal (and degenerate
    pairs) without producing ``inf``; ``origin`` names the derivation step that produced it.
    """

    name: str  # function name in generated code, e.g. "eigh_F"
    symbol: str  # "F"
    vector: str  # parameter holding d, e.g. "w"
    expr: sp.Expr
    numerator: sp.Expr
    denominator: sp.Expr
    diagonal: sp.Expr
    antisymmetric: bool
    origin: str
    #: the entries are a cluster indicator (1 inside clusters of equal values), not a formula
    indicator: bool = False
    #: zero inside the clusters of equal values (a reciprocal gap the gauge leaves free)
    masked: bool = False
    #: the Lorentzian broadening of a masked matrix, ``num den / (den^2 + broadening)``
    broadened: sp.Expr | None = None
    #: ``(kind, factor)`` when ``F = c / (a d_i ± a d_j)``: ``scale F ∘ X = X / (v_i ± v_j)`` with
    #: ``v = d factor / scale`` (``factor = a / c``), one division instead of forming ``F``;
    #: ``kind`` is ``difference`` or ``sum`` (which pairs can vanish)
    fused: tuple | None = None
    #: where the step ``origin`` is in the derivation file (``derivations/eigh.py:41``)
    where: str = ""
    #: ``d`` is complex (the eigenvalues of a general matrix): no real CUDA kernel, and the
    #: broadening divides by ``|den|^2``
    complex_values: bool = False

    @property
    def needs_clusters(self) -> bool:
        return self.indicator or self.masked

    @property
    def kind(self) -> str:
        """How its entries are evaluated: ``indicator``, ``masked`` (0 at clusters) or ``quotient``
        (the backends' templates ``<backend>/pairwise/<kind>.py.j2``)."""
        return "indicator" if self.indicator else "masked" if self.masked else "quotient"


@dataclass(frozen=True)
class InstanceIR:
    """One concrete function of a derivation generic in a scalar ``f`` (``expm`` for ``exp``).

    The generated module gets, per instance, ``<NAME>_PROGRAM`` (``f`` as a scalar program over
    primitives, :mod:`adjointgen.codegen.scalar`), ``<name>_f`` (``f`` elementwise), ``<name>_dd``
    (``f[a, b]``, first divided differences, stable for every gap), ``<name>_L`` (the pairwise
    matrix of them), ``<name>_dd2`` (``f[a, b, c]``) and the public ``<name>(A, ...)``; the runtime
    (:mod:`adjointgen.runtime.divided`) evaluates them from the program.  ``options`` are the other
    symbols of ``f`` (``p`` of ``x**p``), keyword arguments in that order."""

    name: str
    function: str  # the derivation's function name, "f"
    expr: sp.Expr
    variable: sp.Symbol
    options: tuple[tuple[str, sp.Symbol], ...]
    program: object  # runtime.divided.ScalarProgram
    second: bool  # the derivation has second_order: <name>_dd2 is emitted

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.options)

    @property
    def description(self) -> str:
        return sp.sstr(self.expr)

    @property
    def constant(self) -> str:
        return f"{self.name.upper()}_PROGRAM"


@dataclass(frozen=True)
class RuleIR:
    """A JVP or VJP rule ready for rendering."""

    name: str  # "eigh_jvp"
    kind: str  # "jvp", "vjp", "vjp_factors" or "gauge"
    params: tuple[Param, ...]
    outputs: tuple[tuple[str, str, str], ...]  # (name in code, value name, kind)
    values: tuple[Value, ...]
    formulas: tuple[tuple[str, str], ...]  # (output, formula as derived) for comments
    #: (output name in code, the SymPy expression as derived): what the generated function must
    #: reproduce (checked when code is generated, :mod:`adjointgen.codegen.verify`)
    expressions: tuple[tuple[str, object], ...] = ()
    #: complex data: ``^T`` is printed as the conjugate transpose
    complex: bool = False
    #: (output name in code, where it was derived: ``derivations/inv.py:46 (step 7: solve for dX)``)
    sources: tuple[tuple[str, str], ...] = ()
    #: output symbols that are square wherever this rule applies (a variant's, ``U U^T = I``)
    square: tuple[str, ...] = ()

    @property
    def signature(self) -> str:
        """The parameter list.  Optional (default ``None``): the factorizations a forward saves
        (``None``: solve with the matrix itself), the cluster masks (``None``: detected with the
        default tolerance) and the broadening of reciprocal gaps (``None``: none)."""
        return ", ".join(p.name + ("=None" if p.role in OPTIONAL_ROLES else "") for p in self.params)

    @property
    def arguments(self) -> str:
        """The call of the rule from the autograd function (optional parameters by keyword)."""
        return ", ".join(f"{p.name}={p.name}" if p.role in OPTIONAL_ROLES else p.name for p in self.params)

    @property
    def required(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.role not in OPTIONAL_ROLES)

    @property
    def argument_names(self) -> tuple[str, ...]:
        """The names passed positionally (:class:`adjointgen.runtime.dispatch.Call`)."""
        return tuple(p.name for p in self.required)

    @property
    def keyword_names(self) -> tuple[str, ...]:
        """The optional parameters, passed by keyword."""
        return tuple(p.name for p in self.params if p.role in OPTIONAL_ROLES)

    @property
    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for v in self.values:
            counts[v.op] = counts.get(v.op, 0) + 1
        return dict(sorted(counts.items()))

    @property
    def op_summary(self) -> str:
        """``matmul 3, add 2``: how many of each operation the rule evaluates."""
        return ", ".join(f"{op} {count}" for op, count in self.op_counts.items())

    def title(self, op: str) -> str:
        """The first line of the rule's docstring, for the operation ``op``."""
        if self.kind == "gauge":
            return f"Gauge residual of {op} (zero when the loss does not depend on the gauge)"
        return f"{self.kind.upper()} of {op}" + (" for complex data" if self.complex else "")

    @property
    def kernels(self) -> tuple[Value, ...]:
        return tuple(v for v in self.values if v.op.startswith("pairwise"))


@dataclass(frozen=True)
class ForwardIR:
    """A forward function as generated code imports it: ``from module import attr``; ``xp`` set:
    ``attr`` is a dotted path on the array module of the inputs; ``host`` set: a NumPy function on
    the host, bound by :mod:`adjointgen.runtime.host` (``_host.torch_forward("module:attr")``)."""

    module: str
    attr: str
    xp: bool = False
    host: bool = False
    #: ``attr`` is a forward of every backend's runtime (``forward(runtime=...)``): each backend
    #: imports it from its own (:attr:`adjointgen.codegen.printers.ArrayPrinter.forwards`)
    runtime: bool = False


@dataclass(frozen=True)
class InputIR:
    """What the checked public function verifies about one input (from its declared structure)."""

    name: str  # name in the public function
    shape: tuple[str, str]  # dimension symbols, e.g. ("n", "n")
    square: bool
    symmetric: bool
    positive_definite: bool  # checked by the public function (False when the forward checks it)
    description: str  # "symmetric positive definite (..., n, n) matrices"
    triangle: str = ""  # "lower" / "upper": a triangular input, whose other triangle is not read


@dataclass(frozen=True)
class OutputIR:
    """One output as the forward and the public function return it."""

    name: str  # name in the rule functions (``V``, ``w``)
    public: str  # name in the public API (``Vh``)
    form: str  # "matrix", "vector" (a diagonal stored as its diagonal), "adjoint" (returned as ``X^H``),
    # "scalar" (a 1×1 output returned as a tensor of the batch shape)
    shape: tuple[str, ...]  # dimension symbols of the public value
    constant: bool = False  # piecewise constant: no rule, returned as not differentiable
    #: returned by the forward and the autograd function, with its rule (so that higher derivatives
    #: of the rules that read it are exact), but not by the public function: the pseudo-inverse of
    #: least squares
    hidden: bool = False
    #: returned by the forward for the rules to read, without a rule of its own: not returned by the
    #: public function, not differentiable through the autograd function (a derivative of the rules
    #: recomputes it with the forward, differentiably)
    auxiliary: bool = False

    @property
    def has_rule(self) -> bool:
        return not (self.constant or self.auxiliary)


@dataclass(frozen=True)
class PublicIR:
    """The generated autograd function's forward and the checked public function around it."""

    torch_forward: ForwardIR | None
    numpy_forward: ForwardIR | None
    options: tuple[tuple[str, str], ...]  # (name, default as Python source)
    inputs: tuple[InputIR, ...]
    outputs: tuple[OutputIR, ...]  # in API order
    #: dimension symbol -> the (input, axis) pairs that must agree in size
    dims: tuple[tuple[str, tuple[tuple[str, int], ...]], ...]
    complex: bool  # complex dtypes are accepted (a complex derivation)
    checked_by_forward: tuple[str, ...]
    #: ((LU, pivots) parameter names): what the torch forward returns after the outputs
    saved_factors: tuple[tuple[str, str], ...] = ()
    #: the operation has clusters of equal values: keyword options ``cluster_rtol``, ``broadening``
    degeneracy: bool = False
    degeneracy_options: tuple[tuple[str, str], ...] = (("cluster_rtol", "None"), ("broadening", "None"))
    #: :meth:`Derivation.extend`: the function that reaches beyond the derived domain, its keyword
    #: options (name, default as Python source) and its docstring
    extension: ForwardIR | None = None
    extension_options: tuple[tuple[str, str], ...] = ()
    extension_doc: str = ""

    @property
    def rule_shapes(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """The dimensions of the inputs and outputs as the rules read them (an output returned in
        adjoint form, ``Vh``, is read as ``V``; a diagonal as the vector of its diagonal)."""
        out = [(i.name, tuple(i.shape)) for i in self.inputs]
        for o in self.outputs:
            if o.form == "scalar":
                continue
            out.append((o.name, tuple(reversed(o.shape)) if o.form == "adjoint" else tuple(o.shape)))
        return tuple(out)

    @property
    def factor_names(self) -> tuple[str, ...]:
        return tuple(n for pair in self.saved_factors for n in pair)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs)

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.options)

    @property
    def signature_names(self) -> tuple[str, ...]:
        return self.input_names + tuple(name for name, _ in self.all_options)

    @property
    def forward_option_count(self) -> int:
        return len(self.options)

    @property
    def all_options(self) -> tuple[tuple[str, str], ...]:
        """The public function's keyword options: the forward's, then the degeneracy options."""
        return self.options + (self.degeneracy_options if self.degeneracy else ())

    @property
    def saved(self) -> tuple[str, ...]:
        """What the autograd function saves: the inputs, the outputs as returned, the factors."""
        return self.input_names + tuple(o.public for o in self.outputs) + self.factor_names

    @property
    def returned(self) -> tuple["OutputIR", ...]:
        """The outputs the public function returns (all but the hidden and auxiliary ones)."""
        return tuple(o for o in self.outputs if not (o.hidden or o.auxiliary))

    @property
    def returned_indices(self) -> tuple[int, ...]:
        return tuple(i for i, o in enumerate(self.outputs) if not (o.hidden or o.auxiliary))

    @property
    def kept(self) -> tuple["OutputIR", ...]:
        """The outputs with a rule or constant (all but the auxiliary ones): what JAX's custom-JVP
        function returns."""
        return tuple(o for o in self.outputs if not o.auxiliary)

    @property
    def returned_indices_of_kept(self) -> tuple[int, ...]:
        return tuple(i for i, o in enumerate(self.kept) if not o.hidden)

    @property
    def auxiliary(self) -> tuple["OutputIR", ...]:
        return tuple(o for o in self.outputs if o.auxiliary)

    @property
    def auxiliary_indices(self) -> tuple[int, ...]:
        return tuple(i for i, o in enumerate(self.outputs) if o.auxiliary)

    @property
    def returns_doc(self) -> str:
        return ", ".join(f"``{o.public}`` ``(..., {', '.join(o.shape)})``" for o in self.returned)

    @property
    def tangent_returns(self) -> tuple[str, ...]:
        """The output tangents in the forms of the outputs (``dV.mH`` for ``Vh``)."""
        return tuple("None" if not o.has_rule else (f"d{o.name}.mH.resolve_conj()" if o.form == "adjoint" else f"d{o.name}")
                     for o in self.outputs)


@dataclass(frozen=True)
class VariantIR:
    """The rules specialised to shapes at which the outputs ``square`` (their names in code) are
    square, or ordered for a wide input (``shorter``); the generated table dispatches to them
    (:class:`adjointgen.runtime.rules.Variant`)."""

    name: str
    square: tuple[str, ...]
    jvp: RuleIR | None
    vjp: RuleIR | None
    vjp_checked: RuleIR | None = None
    jvp_complex: RuleIR | None = None
    vjp_complex: RuleIR | None = None
    vjp_complex_checked: RuleIR | None = None
    #: symmetric inputs whose tangents are unstructured in these rules (the general-matrix
    #: function's rules at a symmetric point, ``Derivation.general_directions``): chosen by the caller
    directions: tuple[str, ...] = ()
    #: ``(m, n)``: the same rules with their products ordered for ``m < n`` (picked where it holds)
    shorter: tuple[str, ...] = ()

    @property
    def rules(self) -> tuple[RuleIR, ...]:
        return tuple(r for r in (self.jvp, self.vjp, self.jvp_complex, self.vjp_complex, self.vjp_checked,
                                 self.vjp_complex_checked) if r is not None)


@dataclass(frozen=True)
class BlockIR:
    """How a diagonal output's values move as a block at clusters (``Derivation.derive_vjp``):
    ``jvp`` maps the input tangents to the block, ``vjp`` a block cotangent to the input
    cotangents (:class:`adjointgen.runtime.rules.ValueBlock`)."""

    values: str
    cotangent: str
    inputs: tuple[str, ...]
    jvp: RuleIR
    vjp: RuleIR
    jvp_complex: RuleIR | None = None
    vjp_complex: RuleIR | None = None

    @property
    def rules(self) -> tuple[RuleIR, ...]:
        return tuple(r for r in (self.jvp, self.vjp, self.jvp_complex, self.vjp_complex) if r is not None)


@dataclass(frozen=True)
class OperationIR:
    """Everything the templates need for one operation."""

    name: str
    title: str
    derivation: str  # path relative to the project root
    references: tuple[str, ...]
    primal_inputs: tuple[Param, ...]
    primal_outputs: tuple[Param, ...]  # in API order
    symmetric_inputs: tuple[str, ...]
    jvp: RuleIR
    vjp: RuleIR
    pairwise: tuple[PairwiseFn, ...]
    #: ``sym(L R^T)`` factors of the input cotangents, for sparse and matrix-free inputs
    vjp_factors: RuleIR | None = None
    #: inputs the rules use as operators (in projected shifted solves); such operations get a
    #: hand-written autograd function in the runtime instead of the generic generated one
    operator_inputs: tuple[str, ...] = ()
    #: non-tensor arguments of the forward computation (``atol``, ``rtol``), passed through
    forward_options: tuple[str, ...] = ()
    #: rules for some outputs only (the others' rules live in another derivation): no autograd
    #: function is generated; the public API combines the rules
    partial_rules: bool = False
    #: a complex derivation: ``jvp``/``vjp`` are its specialisation to real data, these the rules
    #: for complex data, and ``gauge`` the residual a well-defined loss makes zero
    jvp_complex: RuleIR | None = None
    vjp_complex: RuleIR | None = None
    gauge: RuleIR | None = None
    #: the complex VJP and the gauge residual together (shared products), for a checked backward
    vjp_complex_checked: RuleIR | None = None
    #: the declared forward and the public function (``None``: no forward was declared)
    public: PublicIR | None = None
    #: every gauge residual function (``<op>_gauge`` for the phases, ``<op>_gauge_<name>``)
    gauge_rules: tuple["RuleIR", ...] = ()
    #: the real VJP and the residuals that apply to real data, in one function
    vjp_checked: "RuleIR | None" = None
    #: the residuals of the checked VJPs (real, complex), in their output order
    residuals_real: tuple[ResidualIR, ...] = ()
    residuals_complex: tuple[ResidualIR, ...] = ()
    #: vectors whose cluster masks the rules take (``w`` for eigh)
    cluster_vectors: tuple[str, ...] = ()
    #: the concrete functions of a derivation generic in a scalar function (``expm``, ``logm``)
    instances: tuple[InstanceIR, ...] = ()
    #: (pairwise symbol, vector param) of the function-dependent pairwise matrices the rules take
    pairwise_params: tuple[tuple[str, str], ...] = ()
    #: a spectral function's second-order rule exists (:meth:`Derivation.second_order`)
    second_order: bool = False
    #: the rules specialised to square orthonormal outputs, and to unstructured tangents
    variants: tuple[VariantIR, ...] = ()
    #: triangular outputs the rules invert, with their degree in the defining identity and their
    #: declared side, ``"upper"`` or ``"lower"`` (checked for pivots at rounding level before the rules run)
    invertible: tuple[tuple[str, int, str], ...] = ()
    #: how the values move as a block at clusters (second derivatives there), if they can
    value_block: BlockIR | None = None

    @property
    def general_directions(self) -> "VariantIR | None":
        """The variant along unstructured tangents of the symmetric inputs, if declared."""
        return next((v for v in self.variants if v.directions), None)

    @property
    def complex(self) -> bool:
        return self.vjp_complex is not None

    @property
    def complex_only(self) -> bool:
        """One set of rules, for complex data: the outputs are complex for real inputs too (the
        eigenvalues of a general matrix); the public function casts real input."""
        return self.jvp.complex

    @property
    def rules(self) -> tuple[RuleIR, ...]:
        extra = (self.vjp_factors, self.jvp_complex, self.vjp_complex, *self.gauge_rules, self.vjp_checked,
                 self.vjp_complex_checked)
        return (self.jvp, self.vjp) + tuple(r for r in extra if r is not None) + tuple(
            r for v in self.variants for r in v.rules) + (self.value_block.rules if self.value_block else ())

    @property
    def uses_clusters(self) -> bool:
        """The rules treat degenerate spectra (masked gaps, cluster residuals, masked 1/s)."""
        return any(p.name == "cluster_rtol" for r in self.rules for p in r.params)

    @property
    def uses_broadening(self) -> bool:
        return any(p.masked for p in self.pairwise)

    @property
    def context_options(self) -> tuple[str, ...]:
        """The options the autograd function keeps on its context for the rules: the cluster
        tolerance and the broadening, where the rules take them."""
        return (("cluster_rtol",) if self.uses_clusters else ()) + (("broadening",) if self.uses_broadening else ())

    def _env(self, extra: tuple[str, ...]) -> tuple[str, ...]:
        pub = self.public
        names = pub.saved + tuple(o.name for o in pub.outputs if o.form == "adjoint") + extra + self.context_options
        return tuple(dict.fromkeys(names))

    @property
    def backward_env(self) -> tuple[str, ...]:
        """The names the autograd function's backward hands the dispatch: what it saved, the
        outputs in the rules' forms, their cotangents and the options."""
        return self._env(tuple("g" + o.name for o in self.public.outputs if o.has_rule))

    @property
    def forward_env(self) -> tuple[str, ...]:
        """The names its forward-mode rule hands the dispatch (the input tangents)."""
        return self._env(tuple(p.name for p in self.jvp.params if p.role == "tangent"))

    @property
    def uses_lu_solve(self) -> bool:
        return any(v.op in ("solve_lu", "solve_right_lu") for r in self.rules for v in r.values)

    @property
    def uses_shifted_solve(self) -> bool:
        return any(v.op == "shifted_solve" for r in self.rules for v in r.values)

    def uses(self, *ops: str) -> bool:
        """Whether a rule uses one of the DAG operations ``ops`` (a runtime helper to import)."""
        return any(v.op in ops for r in self.rules for v in r.values)

    @property
    def uses_sylvester(self) -> bool:
        return any(v.op == "sylvester_solve" for r in self.rules for v in r.values)

    @property
    def kernel_variants(self) -> tuple[tuple[str, str], ...]:
        """(pairwise function name, fused part) for every fused elementwise kernel used."""
        seen = set()
        # a cluster indicator is a mask, not a formula; complex values have no real kernel
        indicators = {p.name for p in self.pairwise if p.indicator or p.complex_values}
        for rule in self.rules:
            for v in rule.kernels:
                if v.attr("fn") in indicators:
                    continue
                part = {"pairwise_mul": "plain", "pairwise_mul_skew": "skew", "pairwise_mul_sym": "sym"}[v.op]
                seen.add((v.attr("fn"), part))
                if rule.complex and part != "plain":
                    # a complex X runs as two real launches: skew_H(X) = skew(Re X) + i sym(Im X)
                    seen.add((v.attr("fn"), "sym" if part == "skew" else "skew"))
        return tuple(sorted(seen))

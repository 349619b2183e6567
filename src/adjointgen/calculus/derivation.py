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
from sympy.matrices.expressions import (
    HadamardProduct,
    Identity,
    Inverse,
    MatAdd,
    MatMul,
    MatrixSymbol,
    Transpose,
    ZeroMatrix,
)

from . import algebra
from .algebra import DerivationError, expand, normalize
from .spec import OperationSpec, Source, freeze
from .nodes import DI, DJ, DiagFunction, DiagPart, LowerHalf, OperatorSolve, PairwiseDef, PairwiseMatrix, SameCluster, ShiftedSolve, StrictlyLower, Structure, Sym, SylvesterSolve, TriangularSylvesterSolve


from .records import Check, Equation, Extension, ForwardRef, ForwardSpec, Gauge, Replay, Rule, SecondOrder, Step, \
    ValueBlock, Variant  # noqa: F401  (the records, re-exported: derivation files and tests import them from here)


def _forward_check(d: "Derivation") -> Check:
    return Check("forward")


def _premise(what: str) -> Replay:
    """The replay of a step that rests on nothing earlier: an identity, a definition, the forward,
    a gauge choice (what the derivation assumes; its numeric check compares it with the instances)."""
    return Replay("premise", (what,))


class Derivation:
    """Symbols, identities and named steps of one operation's derivation."""

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

    # ------------------------------------------------------------------ declarations
    def dim(self, name: str) -> sp.Symbol:
        """A dimension symbol (``n``, ``m``, ``k``); the instances give it values."""
        s = sp.Symbol(name, integer=True, positive=True)
        self.dims.append(s)
        return s

    def _tangent(self, sym: MatrixSymbol) -> MatrixSymbol:
        t = MatrixSymbol("d" + sym.name, *sym.shape)
        self.tangents[sym.name] = t
        return t

    def input(self, name, rows, cols, *, symmetric=False, positive_definite=False, lower=False, upper=False):
        """Declare an input (a tangent ``d<name>`` is created with the same structure).

        ``symmetric`` (Hermitian in a complex derivation): only symmetric perturbations are
        meaningful, the input cotangent is projected with ``sym``, and the generated public
        function checks the symmetry.  ``positive_definite`` implies ``symmetric``; the public
        function checks it (unless the forward declares that it does, see :meth:`forward`).
        ``lower``/``upper``: a triangular input (and tangent); its VJP is projected onto that
        triangle (a ``project`` step), and the generated public function reads only that triangle."""
        self._check_name(name)
        s = MatrixSymbol(name, rows, cols)
        self.inputs.append(s)
        self._triangular(name, lower, upper)
        if symmetric or positive_definite:
            self.structure.symmetric |= {name, "d" + name}
            self.symmetric_inputs.add(name)
        if positive_definite:
            self.positive_definite_inputs.add(name)
        self._tangent(s)
        return s

    def output(self, name, rows, cols, *, diagonal=False, orthonormal=False, lower=False, upper=False,
               unit_diagonal=False, real_diagonal=False, api=None, public=None, form=None, auxiliary=False,
               constant=False, symmetric=False, hidden=False, complex_diagonal=False):
        """Declare an output.

        ``api`` is its name in the generated rule functions (``w`` for ``D``); a diagonal output is
        stored there, and returned by the forward, as the vector of its diagonal.  ``public`` and
        ``form`` describe the value the forward and the public function return when it is not the
        symbol itself: ``form="adjoint"`` for the conjugate transpose (``public="Vh"`` for ``V``,
        as ``torch.linalg.svd`` returns it).

        ``lower``/``upper``: a triangular output (its tangent is triangular too);
        ``unit_diagonal``: its diagonal is one, so its tangent is strictly triangular;
        ``real_diagonal``: its diagonal is real (and so is its tangent's), a convention of the
        factorization in a complex derivation (the Cholesky factor's positive diagonal).
        ``auxiliary``: an intermediate the forward returns for the rules (the eigendecomposition of
        ``X = f(A)``), not returned by the public function and without a rule of its own.  The
        generated function saves it for a first derivative; where a derivative of the rules is taken
        (a second derivative, ``torch.func`` transforms, JAX's higher orders) it recomputes it
        differentiably by running the forward again, so the forward must then be differentiable
        (torch operations for torch, ``jax.numpy`` for JAX), or that derivative raises an error
        that says so.  An intermediate with a rule of its own: ``hidden``.
        ``symmetric`` (Hermitian in a complex derivation): the output and its tangent are, so the
        engine reads ``P^T`` as ``P`` (``P`` of the polar decomposition ``A = U P``), with no identity
        to state it.
        ``complex_diagonal``: a diagonal output with complex entries (the eigenvalues of a general
        matrix, ``field="complex"``): ``D^H = conj(D)``, not ``D``; the pairwise matrices of its
        values are complex, and the VJP transposes ``F ∘ X`` to ``conj(F) ∘ G``.
        ``hidden``: an output with its rule that the forward and the autograd function return but
        the public function does not: an intermediate the other rules read (the pseudo-inverse
        ``P`` of least squares), differentiable so that higher derivatives through those rules are
        exact.
        ``constant``: piecewise constant (the sign of ``det A``, a permutation): its derivative is
        zero wherever it is defined, so it has no tangent and no rule; the public function returns
        it, not differentiable.

        A ``1×1`` output is a scalar: the forward and the public function return it as a tensor of
        the batch shape ``(...)`` (as ``torch.linalg.slogdet`` returns ``logabsdet``)."""
        self._check_name(name)
        s = MatrixSymbol(name, rows, cols)
        self.outputs.append(s)
        self._triangular(name, lower, upper, unit_diagonal)
        if real_diagonal:
            if not (lower or upper):
                raise DerivationError(f"{self.path}:{self._line() or '?'}: real_diagonal needs lower=True or upper=True")
            self.structure.real_diagonal |= {name, "d" + name}
        if complex_diagonal:
            if not self.structure.complex:
                raise DerivationError(f"{self.path}:{self._line() or '?'}: {name}: complex_diagonal needs field='complex'")
            diagonal = True
            self.structure.complex_diagonal |= {name, "d" + name, "g" + name}
        if diagonal:
            self.structure.diagonal |= {name, "d" + name, "g" + name}
        if symmetric:
            if lower or upper or diagonal:
                raise DerivationError(f"{self.path}:{self._line() or '?'}: {name}: symmetric with a triangular or "
                                      "diagonal structure (declare it diagonal)")
            if rows != cols:
                raise DerivationError(f"{self.path}:{self._line() or '?'}: {name} is {rows}×{cols}: a symmetric "
                                      "output must be square")
            self.structure.symmetric |= {name, "d" + name}
        if orthonormal:
            self.structure.orthonormal[name] = None if orthonormal is True else orthonormal
        self.api_names[name] = api or name
        if auxiliary:
            self.auxiliary_outputs.add(name)
        if constant:
            self.constant_outputs.add(name)
        if hidden:
            self.hidden_outputs.add(name)
        if form is not None or public is not None:
            if form not in ("adjoint",):
                self._fail(f"output {name}", f"form must be 'adjoint', got {form!r}")
            self.public_forms[name] = (public or (api or name), form)
        if not constant:
            self._tangent(s)
        return s

    def _triangular(self, name, lower, upper, unit_diagonal=False):
        if lower and upper:
            raise DerivationError(f"{self.path}:{self._line() or '?'}: {name} cannot be lower and upper triangular "
                                  "(declare it diagonal)")
        if unit_diagonal and not (lower or upper):
            raise DerivationError(f"{self.path}:{self._line() or '?'}: unit_diagonal needs lower=True or upper=True")
        if lower or upper:
            (self.structure.lower if lower else self.structure.upper).update({name, "d" + name})
            if unit_diagonal:
                self.structure.unit.add(name)
                self.structure.strict.add("d" + name)

    def _check_name(self, name):
        if not isinstance(name, str) or not name.isidentifier():
            raise DerivationError(f"{self.path}:{self._line() or '?'}: symbol name {name!r} is not an identifier")
        taken = {s.name for s in self.inputs + self.outputs}
        if name in taken:
            raise DerivationError(f"{self.path}:{self._line() or '?'}: symbol {name!r} is declared twice")

    def forward(self, *, torch=None, numpy=None, host=None, options=None, checked=(), saves=None,
                label="the forward computation"):
        """Declare the forward computation: what computes the outputs from the inputs.

        Args:
            torch: the torch forward, as an importable name (``"torch.linalg.inv"``,
                ``"mypkg.ops:my_forward"``) or a function defined at the top level of an importable
                module.  The generated autograd function calls it.
            numpy: the NumPy/CuPy forward, likewise; a name starting with ``xp.`` is looked up on
                the array module of the inputs (``"xp.linalg.inv"`` runs ``numpy.linalg.inv`` or
                ``cupy.linalg.inv``).  The audit runs it on every instance and checks that its
                outputs satisfy every identity of the derivation (a wrong output order or
                convention fails there, at this line).
            host: instead of both: one NumPy function on the host, declared once for every backend
                (``"scipy.linalg:schur"``).  It takes one matrix (a 2-D array) per input and the
                options as keywords, and returns the outputs as ``numpy=`` does;
                :mod:`adjointgen.runtime.host` runs it on every matrix of a batch, for torch
                (any device: a host round trip, opaque to ``torch.compile``), NumPy, CuPy and JAX
                (``jax.pure_callback`` under ``jit`` and ``vmap``), in the inputs' precision.  It
                must accept identity matrices (the output shapes and dtypes are read from such a
                call where no values exist: an empty batch, meta tensors, JAX tracing).
            options: keyword options passed to both forwards, ``{name: default}``; they become
                keyword arguments of the generated public function (``{"atol": None}``).
            checked: input properties the forward verifies itself, raising ``ValueError``, so the
                generated public function does not check them twice (``"positive_definite"``).
            saves: factorizations of inputs that the torch forward computes anyway and returns
                after the outputs, ``{"A": "lu"}``: then it returns ``(*outputs, LU, pivots)``
                (as ``torch.linalg.lu_factor``), and every ``A^-1``/``A^-T`` in the rules becomes
                an LU solve with them in a first-order backward (a solve with ``A`` itself when a
                graph is recorded, so higher derivatives stay exact).  The NumPy forward returns
                the outputs only.

        Both forwards take the inputs in declaration order and return the outputs in the order of
        :meth:`api_outputs` (one output: the value itself), diagonal outputs as the vector of
        their diagonal, outputs with a ``form`` (see :meth:`output`) in that form.
        """
        line = self._line()
        where = f"{self.path}:{line or '?'}"
        refs = {}
        if host is not None:
            if torch is not None or numpy is not None or saves:
                raise DerivationError(f"{where}: forward(host=...) is the forward of every backend: no torch=, "
                                      "numpy= or saves= beside it")
            ref = ForwardRef.parse(host, "host", where)
            if ref.xp:
                raise DerivationError(f"{where}: the host forward {host!r} must be an importable name")
            refs = {"torch": None, "numpy": ref}
        else:
            for backend, value in (("torch", torch), ("numpy", numpy)):
                refs[backend] = None if value is None else ForwardRef.parse(value, backend, where)
        if torch is None and numpy is None and host is None:
            raise DerivationError(f"{where}: forward() needs torch= or numpy= (or both), or host=")
        opts = tuple((k, v) for k, v in (options or {}).items())
        for k, v in opts:
            if not k.isidentifier() or k in {s.name for s in self.inputs}:
                raise DerivationError(f"{where}: option name {k!r} is not an identifier or clashes with an input")
            if not isinstance(v, (type(None), bool, int, float, str)):
                raise DerivationError(f"{where}: option {k!r} default must be None, a bool, number or string")
        known = {"positive_definite", "symmetric", "finite"}
        bad = sorted(set(checked) - known)
        if bad:
            raise DerivationError(f"{where}: checked= accepts {sorted(known)}, not {bad}")
        saved = tuple(sorted((saves or {}).items()))
        for name, kind in saved:
            if name not in {s.name for s in self.inputs} or kind != "lu":
                raise DerivationError(f"{where}: saves= maps an input to 'lu', got {name!r}: {kind!r}")
        self.forward_spec = ForwardSpec(refs["torch"], refs["numpy"], opts, tuple(sorted(checked)), line, saved,
                                        host=host is not None)
        check = _forward_check(self)
        self._record("forward", label, None, check=check, replay=_premise("the declared forward computation"),
                     note=("the outputs of the declared host forward satisfy every identity" if host is not None
                           else "the outputs of the declared forwards (NumPy's, torch's) satisfy every identity"))

    def extend(self, function, *, options=None, label="the public function beyond the derived domain"):
        """Declare how the public function reaches inputs outside the domain the rules were derived on,
        by composing the derived function with differentiable array operations: the left polar
        decomposition ``A = P U`` is the right one of ``A^H`` transposed.

        ``function(derived, *inputs, **options)`` receives ``derived``, the generated public function
        of this derivation (checks, rules and all), and returns what the public function returns.  It
        must use only what every backend's arrays have (``.shape``, ``.conj()``, ``.swapaxes``,
        ``@``, arithmetic) and call ``derived`` within its domain: then every derivative, to every
        order, is the derived rules' composed by the backend's own differentiation.  ``options``
        (``{name: default}``) become keyword arguments of the generated public function, before the
        forward's; with their defaults, ``function`` must be ``derived`` itself (the audit checks
        that on every instance).  The cases beyond the domain rest on the composition, which no
        identity of the derivation states: test them against an independent reference.

        Records: a ``forward`` step (a premise).  Numeric check: on every instance, ``function``
        with its default options, composed with the NumPy forward, gives the forward's outputs."""
        line = self._line()
        where = f"{self.path}:{line or '?'}"
        if self.forward_spec is None:
            raise DerivationError(f"{where}: extend() composes the derived function: declare d.forward first")
        ref = ForwardRef.parse(function, "extension", where)
        opts = tuple((k, v) for k, v in (options or {}).items())
        taken = {s.name for s in self.inputs} | set(self.forward_options)
        for k, v in opts:
            if not k.isidentifier() or k in taken:
                raise DerivationError(f"{where}: option name {k!r} is not an identifier or clashes with an input "
                                      "or a forward option")
            if not isinstance(v, (type(None), bool, int, float, str)):
                raise DerivationError(f"{where}: option {k!r} default must be None, a bool, number or string")
        self.extension = Extension(ref, opts, line)
        self._record("forward", f"{label}: {ref.name}", None, check=Check("extension"),
                     replay=_premise("a composition of the derived function, outside the derivation"),
                     note="with its default options it is the derived function on every instance; "
                          "elsewhere it rests on the composition (tested against a reference)")

    @property
    def gauge_parameters(self) -> list[MatrixSymbol]:
        return [g.parameter for g in self.gauges]

    @property
    def forward_options(self) -> tuple[str, ...]:
        return () if self.forward_spec is None else tuple(k for k, _ in self.forward_spec.options)

    @property
    def rule_outputs(self) -> list:
        """The outputs that have JVP/VJP rules (all but the constant ones, unless
        ``set_jvp(partial=True)``)."""
        if self.jvp is None:
            return [o for o in self.outputs if o.name not in self.constant_outputs]
        return [o for o in self.outputs if o.name in self.tangents and self.tangents[o.name].name in self.jvp.raw]

    def api_outputs(self, *names: str):
        """Order of the outputs in the generated API (``("w", "V")`` as ``torch.linalg.eigh``)."""
        self.api_output_order = list(names)

    def imaginary_diagonal(self, name: str, n) -> MatrixSymbol:
        """An anti-Hermitian diagonal symbol (``i`` times a real diagonal): a phase parameter."""
        if not self.structure.complex:
            raise DerivationError(f"{self.path}: an imaginary diagonal needs field='complex'")
        return self.parameter(name, n, n, skew=True, diagonal=True)

    def parameter(self, name: str, rows, cols, *, skew: bool = False, diagonal: bool = False,
                  within: "PairwiseMatrix | None" = None) -> MatrixSymbol:
        """A gauge parameter with its structure (``skew``: anti-Hermitian, e.g. the generator of a
        rotation ``U2 -> U2 e^Ω`` of a basis; ``within=K``: supported on the pairs of a cluster
        indicator from :meth:`clusters`, ``Ω = K ∘ Ω``, the rotations inside clusters of equal
        eigenvalues)."""
        sym = MatrixSymbol(name, rows, cols)
        if skew:
            self.structure.skew.add(name)
        if diagonal:
            self.structure.diagonal.add(name)
        if within is not None:
            if not (isinstance(within, PairwiseMatrix) and within.definition.is_indicator):
                raise DerivationError(f"{self.path}:{self._line() or '?'}: within= needs a cluster indicator "
                                      "from d.clusters(D)")
            self.structure.clustered[name] = within.name
        return sym

    def clusters(self, D: MatrixSymbol, name: str = "K", what: str = "eigenvalues",
                 completes=None) -> "PairwiseMatrix":
        """The cluster indicator of a diagonal output ``D``: ``K_ij = 1`` when ``d_i`` and ``d_j``
        (``i != j``) belong to one cluster of equal values, else 0.  Rotations of the vectors
        inside a cluster leave the identities unchanged: a gauge (declare it with a parameter
        ``within=K``); where a step solves ``E ∘ X = R`` with ``E_ij = 0`` inside the clusters, pass
        ``clusters=K`` to :meth:`solve_offdiagonal`.  Generated code detects clusters with a relative
        tolerance (:mod:`adjointgen.runtime.degeneracy`).

        ``completes=U`` (the orthonormal output whose columns pair with ``D``; ``(U, V)`` for the
        two sides of an SVD): a loss through ``U f(D) U^H`` (``U f(S) V^H``; any smooth function of
        it) has a gradient at a cluster although its cotangents of ``D`` differ there; the generated
        backward recovers it from the cotangents (:func:`adjointgen.runtime.degeneracy.complete`)
        instead of refusing the loss."""
        if D.name not in self.structure.diagonal:
            raise DerivationError(f"{self.path}:{self._line() or '?'}: clusters() needs a diagonal symbol, not {D}")
        definition = self._pairwise_def(name, D.name, SameCluster(DI, DJ), sp.Integer(0),
                                 origin=f"clusters of equal entries of {D.name}",
                                 meaning=f"1 where d_i and d_j are in one cluster of equal values of {D.name}")
        K = PairwiseMatrix.define(definition, D.shape[0])
        self.pairwise[name] = definition
        self.pairwise_lines[name] = self._line()
        self.cluster_meaning[name] = what  # for error messages: "eigenvalues", "singular values"
        if completes is not None:
            targets = completes if isinstance(completes, (tuple, list)) else (completes,)
            self.cluster_completion[name] = tuple(t.name for t in targets)
        return K

    def function(self, name: str) -> sp.FunctionClass:
        """A scalar function the derivation is generic in (``f`` of ``X = U f(D) U^T``): the engine
        differentiates it with SymPy (``f'``, ``f''``); the sampler gives a concrete ``f`` per instance
        (a ``sympy.Lambda`` under the key ``name``), and the generator instantiates the rules for the
        functions of :meth:`instantiate`."""
        if not name.isidentifier() or name in self.functions:
            raise DerivationError(f"{self.path}:{self._line() or '?'}: function name {name!r} is invalid or taken")
        f = sp.Function(name, real=True)
        self.functions[name] = f
        return f

    def instantiate(self, f, catalogue: dict, *, options: dict | None = None):
        """The concrete functions the generator emits operations for: ``{name: expression in one
        symbol}`` (``{"expm": exp(x), "logm": log(x)}``); ``options`` maps the expressions' other
        symbols to options of the public functions (``{"p": p}`` for ``x**p``).  Each becomes a public
        function ``<name>(A, ...)`` of the derivation's generated module whose rules are this
        derivation's with ``f`` substituted, and whose divided differences are evaluated without
        cancellation (:mod:`adjointgen.runtime.divided`)."""
        if f.__name__ not in self.functions:
            raise DerivationError(f"{self.path}:{self._line() or '?'}: {f} is not a function of this derivation")
        options = dict(options or {})
        for name, expr in catalogue.items():
            expr = sp.sympify(expr)
            free = expr.free_symbols - set(options.values())
            if len(free) != 1:
                raise DerivationError(f"{self.path}:{self._line() or '?'}: {name} = {expr} must be an expression in "
                                      f"one symbol (and the options {sorted(map(str, options))})")
            (var,) = free
            used = tuple(sorted(k for k, sym in options.items() if sym in expr.free_symbols))
            self.instantiations[name] = ({f.__name__: sp.Lambda(var, expr)}, tuple((k, options[k]) for k in used))

    def _pairwise_def(self, name, diagonal_of, *args, **kwargs) -> PairwiseDef:
        """A pairwise matrix's definition; of complex values when ``diagonal_of`` is a complex diagonal."""
        return PairwiseDef(name, diagonal_of, *args, complex_values=diagonal_of in self.structure.complex_diagonal,
                           **kwargs)

    def pairwise_matrix(self, name: str) -> PairwiseMatrix:
        """A pairwise matrix an earlier step (or a helper) defined, by name."""
        if name not in self.pairwise:
            raise DerivationError(f"{self.path}:{self._line() or '?'}: no pairwise matrix {name!r} yet")
        return PairwiseMatrix(name, *next(s.shape for s in self.outputs if s.name == self.pairwise[name].diagonal_of))

    def apply(self, f, D: MatrixSymbol) -> DiagFunction:
        """``f(D)`` for a diagonal ``D``: ``f`` a function from :meth:`function`, or a ``Lambda``."""
        if D.name not in self.structure.diagonal:
            raise DerivationError(f"{self.path}:{self._line() or '?'}: {D} is not declared diagonal")
        x = sp.Symbol("x", real=True)  # one bound variable: equal functions are equal expressions
        fn = f if isinstance(f, sp.Lambda) else sp.Lambda(x, f(x))
        return DiagFunction(D, fn)

    @staticmethod
    def diag(X):
        """``diag(X)``, the atom for steps that solve for a diagonal part."""
        return DiagPart(X)

    def tangent(self, sym: MatrixSymbol) -> MatrixSymbol:
        """The tangent symbol ``d<name>`` of an input or output (it has the symbol's structure)."""
        return self.tangents[sym.name]

    def instances(self, sampler: Callable, dims: list[dict[str, int]]):
        """Register the numeric sampler used by the audit.

        ``sampler(rng, **dims)`` is called once per entry of ``dims`` (a dict of keyword arguments:
        every dimension symbol by name, plus any extra keys the sampler takes) with a
        ``numpy.random.Generator``.  It returns a dict of float64 (or complex128) arrays keyed by
        symbol name, holding:

        * every input ``X`` and every output ``Y`` (a valid point of the operation; diagonal
          outputs as diagonal matrices);
        * a random tangent ``dX`` for every input (with the input's structure: symmetric for a
          symmetric input);
        * the tangent ``dY`` of every output along those input tangents, measured by finite
          differences of a reference forward computation (:func:`adjointgen.audit.fd_tangents`),
          never by a derived formula.

        Cotangents and gauge parameters are drawn by the audit.  A missing key, an array of the
        wrong shape, or a non-finite entry is reported with the sampler's name and this line.
        """
        if not callable(sampler):
            raise DerivationError(f"{self.path}:{self._line() or '?'}: instances() needs a callable sampler")
        if not isinstance(dims, (list, tuple)) or not dims or not all(isinstance(x, dict) for x in dims):
            raise DerivationError(f"{self.path}:{self._line() or '?'}: instances() needs a non-empty list of "
                                  "dicts of dimensions, e.g. [{'n': 4}, {'n': 5}]")
        self.sampler = sampler
        self.audit_dims = list(dims)
        self.instances_line = self._line()

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
            if os.path.dirname(path) != engine:
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

    # ------------------------------------------------------------------ identities
    def identity(self, label: str, lhs, rhs) -> Equation:
        """A defining identity of the operation (checked numerically on every instance).

        Records: a ``identity`` step.  Numeric check: the residual of the identity on every instance
        (the sampler's values must satisfy it).  Exact check: none -- a premise (an identity of the
        operation is an assumption, not a consequence).
        """
        eq = self._eq(lhs, rhs)
        self._record("identity", label, eq, check=_equation_check(eq), replay=_premise(f"an identity of {self.name}"))
        return eq

    # ------------------------------------------------------------------ steps
    def differentiate(self, eq: Equation, label="differentiate") -> Equation:
        """``d(lhs) = d(rhs)`` with the product, transpose and inverse rules.

        Records: a ``differentiate`` step.  Numeric check: the residual of the new equation on every
        instance (output tangents from finite differences).  Exact check: the derivative of the
        old equation along ``X + ε dX`` (dual numbers) equals the new one.
        """
        dl = algebra.differential(eq.lhs, self._tangent_of)
        dr = algebra.differential(eq.rhs, self._tangent_of)
        new = self._eq(dl, dr)
        tangents = tuple((name, t.name) for name, t in self.tangents.items())
        replay = Replay("differentiate", (eq.residual_expr, new.residual_expr, tangents))
        self._record("differentiate", label, new, check=_equation_check(new), replay=replay)
        return new

    def left_multiply(self, eq: Equation, M, label="left-multiply") -> Equation:
        """``M lhs = M rhs`` (projections onto a basis, ``U^T``; inverses, ``(I + A)^-1``).

        Records: a ``left_multiply`` step.  Numeric check: the residual of the new equation.
        Exact check: ``M (lhs - rhs)`` equals the new residual on random rational matrices.
        """
        new = self._eq(MatMul(M, eq.lhs), MatMul(M, eq.rhs))

        self._record("left_multiply", label, new, check=_equation_check(new),
                     replay=_follows(MatMul(M, eq.residual_expr), new))
        return new

    def right_multiply(self, eq: Equation, M, label="right-multiply") -> Equation:
        """``lhs M = rhs M``.

        Records: a ``right_multiply`` step.  Numeric check: the residual of the new equation.
        Exact check: ``(lhs - rhs) M`` equals the new residual on random rational matrices.
        """
        new = self._eq(MatMul(eq.lhs, M), MatMul(eq.rhs, M))

        self._record("right_multiply", label, new, check=_equation_check(new),
                     replay=_follows(MatMul(eq.residual_expr, M), new))
        return new

    def transpose(self, eq: Equation, label="transpose") -> Equation:
        """``lhs^T = rhs^T`` with declared structure applied (``A^T = A`` for symmetric ``A``).

        Records: a ``transpose`` step.  Numeric check: the residual of the new equation.  Exact
        check: the (conjugate) transpose of the old residual equals the new one.
        """
        new = self._eq(Transpose(eq.lhs), Transpose(eq.rhs))

        self._record("transpose", label, new, check=_equation_check(new),
                     replay=_follows(Transpose(eq.residual_expr), new))
        return new

    def substitute(self, eq: Equation, identity: Equation, label="substitute", *, transposed: bool = False) -> Equation:
        """Replace every occurrence of the product ``identity.lhs`` by ``identity.rhs`` -- and, with
        ``transposed=True``, also of its transpose ``identity.lhs^T`` by ``identity.rhs^T`` (the
        identity's transpose holds too: ``A = B C`` then also replaces ``A^T`` by ``C^T B^T``, with no
        second identity).  Off by default, so that a later step can still substitute the transposed
        pattern itself.

        Records: a ``substitute`` step.  Numeric check: the residual of the new equation.  Exact
        check: the old residual with each occurrence of the pattern replaced by a fresh symbol is the
        old residual with that symbol set to the pattern, and the new one with it set to the
        replacement: the new equation holds wherever the old one and ``identity`` hold.
        """
        patterns = [(identity.lhs, identity.rhs)]
        if transposed:
            pattern, value = self._norm(Transpose(identity.lhs)), self._norm(Transpose(identity.rhs))
            if pattern != self._norm(identity.lhs):
                patterns.append((pattern, value))
        lhs, rhs, n = eq.lhs, eq.rhs, 0
        for pattern, value in patterns:
            lhs, n1 = self._substitute_product(label, lhs, pattern, value)
            rhs, n2 = self._substitute_product(label, rhs, pattern, value)
            n += n1 + n2
        if n == 0:
            self._fail(label, f"the pattern {identity.lhs} does not occur in {eq} (substitute replaces a product "
                              "of factors, as written after the engine's normal form: "
                              f"{self._norm(eq.lhs - eq.rhs)} = 0)")
        new = self._eq(lhs, rhs)
        self._record("substitute", label, new, check=_equation_check(new),
                     replay=self._substitution_replay(eq, new, patterns, self._equation_label(identity)),
                     note=f"by {identity.lhs} = {identity.rhs}")
        return new

    def _substitute_product(self, label, expr, pattern, value):
        """:func:`algebra.substitute_product`, its errors reported at the step's line."""
        try:
            return algebra.substitute_product(expr, pattern, value, self.structure)
        except DerivationError as exc:
            self._fail(label, f"{exc}: substitute replaces one product of factors (such as U^T A) by the "
                              "equation's other side; state the equation with that product alone on its left "
                              "(or use replace() for a symbol)")

    def _substitution_replay(self, eq, new, patterns, given: str, old_residual=None, new_residual=None) -> "Replay":
        """The replay of a substitution: the old residual with every occurrence of each pattern
        replaced by a fresh symbol is the old residual with the symbols set to the patterns, and the
        new residual with them set to the replacements."""
        old_res = eq.residual_expr if old_residual is None else old_residual
        template = old_res
        names = []
        for i, (pattern, _) in enumerate(patterns):
            z = MatrixSymbol(f"_sub{i}", *pattern.shape)
            names.append(z.name)
            template, _ = algebra.substitute_product(template, pattern, z, self.structure)
        return Replay("substitute", (template, tuple(names), tuple(p for p, _ in patterns),
                                     tuple(v for _, v in patterns), old_res,
                                     new.residual_expr if new_residual is None else new_residual, given))

    def _equation_label(self, eq: Equation) -> str:
        """The label of the step that stated or produced ``eq`` (for a verdict: what it rests on)."""
        for step in reversed(self.steps):
            if step.equation is not None and step.equation == eq:
                return f"step {step.index}: {step.label}"
        return str(eq)

    def introduce(self, name: str, definition, *, skew_by: Equation | None = None, lower: bool = False,
                  upper: bool = False, label=None) -> MatrixSymbol:
        """Name a sub-expression: ``name := definition``.

        With ``skew_by`` (the differentiated orthonormality identity, ``dU^T U + U^T dU = 0``),
        the new symbol is declared skew-symmetric after the engine shows that substituting the
        definition into ``skew_by`` gives ``X + X^T = 0``.  With ``lower`` (``upper``), it is declared
        lower (upper) triangular after the engine shows that the definition is a product of lower
        (upper) triangular factors (``L^-1 dL``); its diagonal is zero or one when the factors' are.

        Records: a ``define`` step (and a ``skew`` or ``triangular`` step).  Numeric check: the
        definition on every instance (and the structure).  Exact check: none for the definition (a
        premise); the structure with the symbol set to its definition (``skew_by``'s residual is
        ``±(X + X^T)``; the other triangle of a product of triangular factors vanishes).
        """
        label = label or f"introduce {name} = {definition}"
        sym = MatrixSymbol(name, *definition.shape)
        self.introduced.append((sym, definition))
        self._record("define", label, Equation(sym, self._norm(definition)),
                     check=_equation_check(Equation(sym, self._norm(definition))), replay=_premise("a definition"))
        if lower or upper:
            side = "lower" if lower else "upper"
            terms = expand(definition, self.structure)
            tri = algebra.triangle_of(terms[0][1], self.structure) if len(terms) == 1 else None
            if tri is None or tri[0] != side:
                self._fail(label, f"{definition} is not a product of {side} triangular factors")
            (self.structure.lower if lower else self.structure.upper).add(name)
            if tri[1] == "unit":
                self.structure.unit.add(name)
            elif tri[1] == "zero":
                self.structure.strict.add(name)
            eq = Equation(StrictlyLower(Transpose(sym)) if lower else StrictlyLower(sym), ZeroMatrix(*sym.shape))
            self._record("triangular", f"{name} is {side} triangular: a product of {side} triangular factors", eq,
                         check=_equation_check(eq), note="the part on the other side of the diagonal vanishes",
                         replay=Replay("define", (name, definition, ZeroMatrix(*sym.shape), eq.residual_expr)))
            if self.structure.complex and tri[1] == "general" and all(
                    _real_diagonal_factor(f, self.structure) for f in terms[0][1]):
                # the diagonal of a triangular product is the product of the diagonals
                self.structure.real_diagonal.add(name)
                eq = Equation(DiagPart(sym), DiagPart(Transpose(sym)))
                self._record("triangular", f"{name} has a real diagonal: the product of real diagonals", eq,
                             check=_equation_check(eq), note="diag(X) = diag(X^H)",
                             replay=Replay("define", (name, definition, ZeroMatrix(*sym.shape), eq.residual_expr)))
        if skew_by is not None:
            res = skew_by.residual_expr
            res, n = algebra.substitute_product(res, definition, sym, self.structure)
            res, n2 = algebra.substitute_product(res, Transpose(definition), Transpose(sym), self.structure)
            target = self._norm(sym + Transpose(sym))
            if n + n2 == 0 or self._norm(res - target) != ZeroMatrix(*sym.shape) and self._norm(res + target) != ZeroMatrix(*sym.shape):
                self._fail(label, f"{skew_by} does not reduce to {name} + {name}^T = 0 (got {res})")
            sign = 1 if self._norm(res - target) == ZeroMatrix(*sym.shape) else -1
            eq = Equation(self._norm(sym + Transpose(sym)), ZeroMatrix(*sym.shape))
            # with the symbol set to its definition, the new residual is (±) the residual of skew_by
            replay = Replay("define", (name, definition, MatMul(sign, skew_by.residual_expr), eq.residual_expr))
            self.structure.skew.add(name)
            self._record("skew", f"{name} is skew-symmetric, from {skew_by}", eq, check=_equation_check(eq),
                         replay=replay)
        return sym

    def declare_skew(self, eq: Equation, sym: MatrixSymbol, label=None) -> Equation:
        """Declare an introduced symbol skew-symmetric (anti-Hermitian) from an equation that reads
        ``X + X^T = 0`` once normalised (``dW + dW^T = 0`` after substituting ``dC = dW - M/2`` into
        ``dC + dC^T = -M``).

        Records: a ``skew`` step.  Numeric check: the residual of ``X + X^T = 0``.  Exact check: the
        equation's residual is ``±(X + X^T)`` for every ``X`` (taken free of the structure declared
        here).
        """
        label = label or f"{sym.name} is skew-symmetric, from {eq}"
        res = self._norm(eq.lhs - eq.rhs)
        target = self._norm(sym + Transpose(sym))
        if self._norm(res - target) != ZeroMatrix(*sym.shape) and self._norm(res + target) != ZeroMatrix(*sym.shape):
            self._fail(label, f"{eq} does not read {sym.name} + {sym.name}^T = 0")
        sign = 1 if self._norm(res - target) == ZeroMatrix(*sym.shape) else -1
        self.structure.skew.add(sym.name)
        new = Equation(target, ZeroMatrix(*sym.shape))
        # the equation reads X + X^T = 0 for every X: checked with X free of the structure declared here
        self._record("skew", label, new, check=_equation_check(new),
                     replay=Replay("unstructured", ((sym.name,), MatMul(sign, eq.residual_expr), new.residual_expr)))
        return new

    def use_definition(self, eq: Equation, sym: MatrixSymbol, label=None) -> Equation:
        """Replace the introduced symbol's definition (and its transpose) by the symbol.

        Records: a ``substitute`` step.  Numeric check: the residual of the new equation.  Exact
        check: the old and new residuals agree with the symbol replaced by its definition.
        """
        definition = dict((s.name, d) for s, d in self.introduced)[sym.name]
        label = label or f"substitute {sym.name} = {definition}"
        out = []
        transposed = 0
        for side in (eq.lhs, eq.rhs):
            side, _ = algebra.substitute_product(side, definition, sym, self.structure)
            side, count = algebra.substitute_product(side, Transpose(definition), Transpose(sym), self.structure)
            transposed += count
            out.append(side)
        new = self._eq(*out)

        # the step uses only the definition: with the symbol set to it, both residuals agree
        replay = Replay("define", (sym.name, definition, eq.residual_expr, new.residual_expr))
        if transposed and sym.name in self.structure.skew:
            # a transposed occurrence of a skew symbol becomes -X: that uses the skewness too (shown
            # where it was declared): the substitution of (definition, definition^T) by (X, X^T)
            patterns = [(definition, sym), (Transpose(definition), Transpose(sym))]
            replay = self._substitution_replay(eq, new, patterns, f"{sym.name} = {definition} and {sym.name} skew")
        self._record("substitute", label, new, check=_equation_check(new), replay=replay)
        return new

    def invert_definition(self, sym: MatrixSymbol, unknown, label=None) -> Equation:
        """Turn an introduced definition around: from ``X := c L u R + (terms without u)`` (``u``
        once, between square invertible factors ``L``, ``R``) the equation
        ``u = L^-1 (X - terms) R^-1 / c`` -- ``dX := V^T U^T dU V`` gives ``dU = U V dX V^T`` for square
        orthogonal ``U``, ``V`` (the engine writes their inverses as transposes).

        Records: a ``solve`` step.  Numeric check: the residual of the solution on every instance.
        Exact check: with the symbol set to its definition the solution is an identity (square
        orthonormal factors exactly orthogonal).
        """
        definitions = dict((s.name, d) for s, d in self.introduced)
        if sym.name not in definitions:
            self._fail(label or f"invert the definition of {sym}", f"{sym} was not introduced")
        definition = definitions[sym.name]
        label = label or f"invert the definition of {sym.name} for {unknown}"
        terms = expand(definition, self.structure)
        mine = [(c, fs) for c, fs in terms if unknown in fs]
        others = [(c, fs) for c, fs in terms if unknown not in fs]
        if len(mine) != 1 or mine[0][1].count(unknown) != 1:
            self._fail(label, f"{unknown} does not appear exactly once, in one term, of {sym.name} := {definition}")
        c, fs = mine[0]
        i = fs.index(unknown)
        left, right = fs[:i], fs[i + 1:]
        for f in (*left, *right):
            if f.shape[0] != f.shape[1]:
                self._fail(label, f"the factor {f} around {unknown} is not square, so it has no inverse: "
                                  f"project the definition first (left_multiply) or state the solution as an identity")
        def inverse(f):
            # a square matrix with orthonormal columns is orthogonal (unitary): its inverse is its transpose
            base = f.arg if isinstance(f, Transpose) else f
            if isinstance(base, MatrixSymbol) and base.name in self.structure.orthonormal and base.shape[0] == base.shape[1]:
                return base if isinstance(f, Transpose) else Transpose(base)
            return Inverse(f)

        solution = sym - algebra.build(others, sym.shape) if others else sym
        for f in left:  # (F1 F2)^-1 X = F2^-1 (F1^-1 X)
            solution = inverse(f) * solution
        for f in reversed(right):  # X (G1 G2)^-1 = (X G2^-1) G1^-1
            solution = solution * inverse(f)
        new = Equation(unknown, self._norm(MatMul(1 / c, solution)))
        # with the symbol set to its definition the solution is an identity (square orthonormal
        # factors are orthogonal: their inverse is their transpose)
        self._record("solve", label, new, check=_equation_check(new),
                     replay=Replay("define", (sym.name, definition, ZeroMatrix(*new.lhs.shape), new.residual_expr)))
        return new

    def hadamard_split(self, eq: Equation, D: MatrixSymbol, X: MatrixSymbol, name: str,
                       label=None) -> tuple[Equation, PairwiseMatrix]:
        """Write every term ``c D^a X D^b`` (``D`` diagonal) as one ``E ∘ X`` with ``E_ij`` derived:
        ``D X - X D`` gives ``E_ij = d_i - d_j``; ``X D^2 - D^2 X`` gives ``d_j^2 - d_i^2``.

        The entry formula is read off the expansion on explicit 3×3 matrices: the coefficient of
        ``X_01`` (with ``d_0, d_1 -> d_i, d_j``) and of ``X_11`` for the diagonal.

        Records: a ``hadamard_split`` step.  Numeric check: the residual of the new equation.
        Exact check: the old and new residuals agree on random rational matrices, with the pairwise
        matrix's entries.
        """
        label = label or f"Hadamard split of the terms D^a {X.name} D^b, D = {D.name}"
        res = expand(eq.lhs - eq.rhs, self.structure)

        def of_D(f):  # D, D^-1 or a function f(D) of it
            return f == D or (isinstance(f, Inverse) and f.arg == D) or (isinstance(f, DiagFunction) and f.arg == D)

        def powers(fs):
            if X not in fs or fs.count(X) != 1:
                return None
            j = fs.index(X)
            if all(of_D(f) for f in fs[:j] + fs[j + 1:]):
                return fs[:j], fs[j + 1:]
            return None

        mine = [(c, fs, powers(fs)) for c, fs in res if powers(fs) is not None]
        if len(mine) < 2:
            self._fail(label, f"no terms D^a {X.name} D^b with D = {D.name} in {eq}")
        d = sp.symbols("d0:3", real=True)
        x = sp.Matrix(3, 3, lambda i, j: sp.Symbol(f"x{i}{j}"))
        Dm = sp.diag(*d)

        def product(factors):
            out = sp.eye(3)
            for f in factors:
                out = out * _explicit(f, {D.name: Dm})
            return out

        explicit = sum((c * product(left) * x * product(right) for c, _, (left, right) in mine), sp.zeros(3, 3))
        entry = sp.factor(sp.expand(explicit[0, 1]).coeff(sp.Symbol("x01")).xreplace({d[0]: DI, d[1]: DJ}))
        diag_entry = sp.simplify(sp.expand(explicit[1, 1]).coeff(sp.Symbol("x11")).xreplace({d[1]: DI}))
        if diag_entry.free_symbols - {DI}:
            self._fail(label, f"{name}_ii = {diag_entry} is not a function of d_i")
        definition = self._pairwise_def(name, D.name, entry, sp.sympify(diag_entry), origin=label,
                                 meaning=f"entries of the terms D^a {X.name} D^b divided by {X.name}")
        E = PairwiseMatrix.define(definition, D.shape[0])
        self.pairwise[name] = definition
        self.pairwise_lines[name] = self._line()
        rest = [(cc, fs) for cc, fs in res if powers(fs) is None]
        new = self._eq(algebra.build(rest, eq.lhs.shape) + HadamardProduct(E, X), ZeroMatrix(*eq.lhs.shape))

        self._record("hadamard_split", label, new, check=_equation_check(new), replay=_follows(eq.residual_expr, new),
                     note=f"{name}_ij = {entry}, {name}_ii = {diag_entry}")
        return new, E

    def diagonal_part(self, eq: Equation, label="diagonal part") -> Equation:
        """``diag(lhs) = diag(rhs)``; diagonal symbols stay, skew symbols and ``E ∘ X`` with
        ``E_ii = 0`` vanish.

        Records: a ``diagonal_part`` step.  Numeric check: the residual of the new equation.
        Exact check: ``diag`` of the old residual equals the new one.
        """
        new = self._eq(DiagPart(eq.lhs), DiagPart(eq.rhs))

        self._record("diagonal_part", label, new, check=_equation_check(new),
                     replay=_follows(DiagPart(eq.residual_expr), new))
        return new

    def lower_half(self, eq: Equation, label="lower half: apply Φ") -> Equation:
        """``Φ(lhs) = Φ(rhs)``, ``Φ`` the lower triangle with the diagonal halved: for a lower
        triangular ``X``, ``Φ(X + X^T) = X`` (the Cholesky step ``Φ(L^-1 dA L^-T) = dC``).

        Records: a ``triangular`` step.  Numeric check: the residual of the new equation.
        Exact check: ``Φ`` of the old residual equals the new one on explicit matrices.
        """
        return self._projection(eq, LowerHalf, label)

    def strictly_lower_part(self, eq: Equation, label="strictly lower part") -> Equation:
        """``tril₋(lhs) = tril₋(rhs)``: upper triangular terms (``dR R^-1``) vanish, a skew
        ``X`` keeps ``tril₋(X)`` (the QR step).

        Records: a ``triangular`` step.  Numeric check: the residual of the new equation.
        Exact check: ``tril₋`` of the old residual equals the new one on explicit matrices.
        """
        return self._projection(eq, StrictlyLower, label)

    def _projection(self, eq, node, label):
        new = self._eq(node(eq.lhs), node(eq.rhs))
        self._record("triangular", label, new, check=_equation_check(new),
                     replay=_follows(node(eq.residual_expr), new))
        return new

    def skew_from_lower(self, eq: Equation, unknown: MatrixSymbol, label=None, *,
                        diagonal: Equation | None = None) -> Equation:
        """From ``tril₋(X) = R`` for a real skew-symmetric ``X`` (zero diagonal): ``X = R - R^T``.

        In a complex derivation ``X`` is anti-Hermitian, its diagonal imaginary and not seen by
        ``tril₋``: ``diagonal`` is the equation ``diag(X) = D`` the derivation found for it, and
        ``X = R - R^H + D``.

        Records: a ``solve`` step.  Numeric check: the residual of the solution.  Exact check:
        for an explicit skew ``X``, the new residual is the old one minus its transpose (plus the
        diagonal's residual).
        """
        label = label or f"solve for the skew {unknown.name} from its strictly lower part"
        if unknown.name not in self.structure.skew:
            self._fail(label, f"{unknown.name} must be a skew-symmetric (anti-Hermitian) symbol")
        if self.structure.complex and diagonal is None:
            self._fail(label, f"the anti-Hermitian {unknown.name} has an imaginary diagonal that tril₋ does not see: "
                              f"pass diagonal= (the equation diag({unknown.name}) = ...)")
        res = expand(eq.lhs - eq.rhs, self.structure)
        mine = [(c, fs) for c, fs in res if fs == (StrictlyLower(unknown),)]
        others = [(c, fs) for c, fs in res if fs != (StrictlyLower(unknown),)]
        if len(mine) != 1 or any(unknown.name in algebra.free_names(f) for _, fs in others for f in fs):
            self._fail(label, f"tril₋({unknown.name}) does not appear as a single bare term in {eq}")
        c = mine[0][0]
        R = self._norm(MatMul(-1 / c, algebra.build(others, unknown.shape)))
        value = R - Transpose(R)
        if diagonal is not None:
            if diagonal.lhs != DiagPart(unknown) or unknown.name in algebra.free_names(diagonal.rhs):
                self._fail(label, f"diagonal= must solve for diag({unknown.name}), got {diagonal}")
            value = value + diagonal.rhs
        new = Equation(unknown, self._norm(value))

        # for an explicit skew X, with r the old residual over c: the new one is r - r^H (plus the
        # diagonal equation's residual)
        r = MatMul(1 / c, eq.residual_expr)
        expected = MatAdd(r, MatMul(-1, Transpose(r)))
        if diagonal is not None:
            expected = MatAdd(expected, diagonal.residual_expr)

        self._record("solve", label, new, check=_equation_check(new), replay=_follows(expected, new),
                     note=f"a skew {unknown.name} is tril₋({unknown.name}) - tril₋({unknown.name})^T"
                          + (" + its diagonal" if diagonal is not None else ""))
        return new

    def hermitian_part(self, eq: Equation, label="Hermitian part") -> Equation:
        """``sym(lhs) = sym(rhs)``, ``sym(X) = (X + X^H)/2``: for a diagonal equation, its real
        part (``sym(S diag(Ω)) = 0`` for real ``S`` and anti-Hermitian ``Ω``).

        Records: a ``part`` step.  Numeric check: the residual of the new equation.  Exact check:
        the Hermitian part of the old residual equals the new one.
        """
        return self._part(eq, Sym, label)

    def antihermitian_part(self, eq: Equation, label="anti-Hermitian part") -> Equation:
        """``skew(lhs) = skew(rhs)``, ``skew(X) = (X - X^H)/2``: for a diagonal equation, ``i``
        times its imaginary part.

        Records: a ``part`` step.  Numeric check: the residual of the new equation.  Exact check:
        the anti-Hermitian part of the old residual equals the new one.
        """
        from .nodes import Skew

        return self._part(eq, Skew, label)

    def _part(self, eq, node, label):
        new = self._eq(node(eq.lhs), node(eq.rhs))
        self._record("part", label, new, check=_equation_check(new), replay=_follows(node(eq.residual_expr), new))
        return new

    def gauge(self, label: str, parameter: MatrixSymbol, directions: dict, fix: tuple,
              name: str | None = None) -> Equation:
        """A continuous gauge freedom of the outputs and the condition that fixes it.

        ``directions`` maps outputs to their tangent along the gauge (``U -> U Θ``, ``V -> V Θ``)
        for a ``parameter`` ``Θ`` declared with its structure (an imaginary diagonal for the phases
        of singular vectors); the inputs do not move.  The step checks numerically that every
        identity of the operation is unchanged to first order along it, and records ``fix``, a pair
        ``(lhs, rhs)`` (the gauge choice the sampler's reference forward is aligned to).  :meth:`derive_vjp` then also
        derives the gauge residual: the derivative of the loss along the gauge, which must vanish
        for the loss to be well defined.

        Records: a ``gauge`` step per identity (unchanged along the gauge) and one for the gauge
        choice; :meth:`derive_vjp` adds the gauge residual step.  Numeric check: every identity,
        differentiated along the gauge direction, vanishes; the sampler's path satisfies the fixing
        condition.  Exact check: the derivative of each identity along the gauge is a constant
        combination of ``R Θ``, ``Θ^T R``, ``Θ R``, ``R Θ^T`` (``R`` the identity's residual, ``Θ`` the
        parameter or a direction's multiplier ``X -> X M``): zero wherever the identity holds; for a
        parameter inside clusters (``within=K``) on an explicit degenerate ``D`` (the step that shows
        ``D Ω = Ω D`` too).  The gauge choice is a premise.

        ``name`` names the residual's generated function (default: ``phase`` for an imaginary
        diagonal parameter, ``clusters`` for one within a cluster indicator).
        """
        clustered = self.structure.clustered.get(parameter.name)
        if name is None:
            name = "clusters" if clustered else ("phase" if parameter.name in self.structure.diagonal else parameter.name.lower())
        if any(g.name == name for g in self.gauges):
            self._fail(label, f"a gauge named {name!r} is declared twice")
        self.gauges.append(Gauge(name, label, parameter, {out.name: expr for out, expr in directions.items()}))
        if clustered:
            self._commutes_inside_clusters(label, parameter, clustered)
            # the identities move along U (K ∘ Ω): zero on the (non-degenerate) instances
            inside = HadamardProduct(PairwiseMatrix(clustered, *parameter.shape), parameter)
            directions = {out: expr.xreplace({parameter: inside}) for out, expr in directions.items()}
        moved = {self.tangents[out.name].name: expr for out, expr in directions.items()}
        for s in self.inputs + self.outputs:  # the inputs, and the outputs not in the gauge, stay
            moved.setdefault(self.tangents[s.name].name, ZeroMatrix(*s.shape))
        for step in list(self.steps):
            if step.kind != "identity" or step.equation is None:
                continue
            eq = step.equation
            dl = algebra.differential(eq.lhs, self._tangent_of)
            dr = algebra.differential(eq.rhs, self._tangent_of)
            along = {self.tangents_by_name(k): v for k, v in moved.items()}
            inv = Equation(self._norm(dl.xreplace(along)), self._norm(dr.xreplace(along)))
            D = self.pairwise[clustered].diagonal_of if clustered else None
            self._record("gauge", f"{label}: leaves '{step.label}' unchanged", inv, check=_equation_check(inv),
                         replay=Replay("invariant", (eq.residual_expr, inv.residual_expr, parameter.name, D,
                                                       tuple((o.name, e) for o, e in directions.items()))),
                         note="the identity differentiated along the gauge direction")
        fixed = self._eq(*fix)
        self._record("gauge", f"gauge choice: {fixed}", fixed, check=_equation_check(fixed),
                     replay=_premise("a gauge choice"),
                     note="the reference forward of the audit is aligned to this gauge")
        return fixed

    def _commutes_inside_clusters(self, label, parameter, indicator):
        """The rotations inside clusters leave ``A U = U D`` unchanged because ``D Ω = Ω D`` for an
        ``Ω`` supported on the clusters of ``D``: checked on explicit 3×3 matrices with ``d_0 = d_1``
        and ``Ω`` supported on that pair (the audit's instances are not degenerate)."""
        D = MatrixSymbol(self.pairwise[indicator].diagonal_of, parameter.shape[0], parameter.shape[0])
        eq = Equation(self._norm(D * parameter - parameter * D), ZeroMatrix(*parameter.shape))

        self._record("gauge", f"{label}: D Ω = Ω D inside the clusters of {D.name}", eq, check=None,
                     replay=Replay("degenerate", (eq.lhs, eq.rhs, D.name, parameter.name)), note="shown on an explicit degenerate D; the instances are not degenerate")

    def solve_for(self, eq: Equation, unknown, label=None) -> Equation:
        """Solve a linear equation in which ``unknown`` (a symbol, or an atom such as
        ``diag(dC)``) appears as one bare term and nowhere else.

        Records: a ``solve`` step.  Numeric check: the residual of the solution.  Exact check:
        the old residual divided by the coefficient equals the new one.
        """
        label = label or f"solve for {unknown}"
        bare = isinstance(unknown, MatrixSymbol) or (isinstance(unknown, algebra.LINEAR_NODES)
                                                     and isinstance(unknown.arg, MatrixSymbol))
        if not bare:
            self._fail(label, f"solve_for solves for a symbol (or a projection of one: diag(X), tril₋(X)), and "
                              f"{unknown} is an expression: "
                              f"name it first -- X = d.introduce(\"X\", {unknown}) and d.use_definition(eq, X) -- "
                              "or solve for the symbol it holds (solve_sylvester for A X + X B, invert_definition, "
                              "isolate)")
        res = expand(eq.lhs - eq.rhs, self.structure)
        mine = [(c, fs) for c, fs in res if fs == (unknown,)]
        others = [(c, fs) for c, fs in res if fs != (unknown,)]
        if len(mine) != 1 or any(f == unknown for _, fs in others for f in fs):
            name = unknown.name if isinstance(unknown, MatrixSymbol) else unknown.arg.name
            where = [algebra._monomial(c, fs) for c, fs in res if unknown in fs or any(
                name in algebra.free_names(f) for f in fs)]
            self._fail(label, f"solve_for needs {unknown} as one term of its own, c {unknown} (the rule: the unknown "
                              f"a bare symbol, not inside a product or a solve); in {self._norm(eq.lhs - eq.rhs)} = 0 "
                              f"it appears in {', '.join(map(str, where)) or 'no term'}: "
                              "move the other terms (left_multiply/right_multiply by an inverse, solve_sylvester, "
                              "isolate) first")
        c = mine[0][0]
        sol = self._norm(MatMul(-1 / c, algebra.build(others, unknown.shape)))
        new = Equation(unknown, sol)

        self._record("solve", label, new, check=_equation_check(new),
                     replay=_follows(MatMul(1 / c, eq.residual_expr), new))
        return new

    def solve_offdiagonal(self, eq: Equation, unknown: MatrixSymbol, gaps: PairwiseMatrix,
                          name: str, *, diagonal: Equation | None = None, clusters: "PairwiseMatrix | None" = None,
                          label=None) -> tuple[Equation, PairwiseMatrix]:
        """Solve ``c E ∘ X + R = 0`` (plus diagonal terms) off the diagonal:
        ``X = F ∘ R + diag(X)`` with ``F_ij = -1/(c E_ij)`` off the diagonal, ``F_ii = 0``.

        ``diag(X)`` is zero for a skew ``X``; otherwise ``diagonal`` gives it
        (an equation ``diag(X) = ...``).  ``clusters=K``: inside the clusters of equal values
        ``E_ij = 0`` and the equation leaves ``X_ij`` free (a gauge declared ``within=K``); ``F`` is
        zero there, the gauge's fixing condition ``K ∘ X = 0``.

        Records: a ``solve_offdiagonal`` step.  Numeric check: the residual of the solution.
        Exact check: ``-F ∘ (old residual)`` (plus the diagonal) equals the new residual.
        """
        label = label or f"solve off the diagonal for {unknown.name}"
        if unknown.name not in self.structure.skew and diagonal is None:
            self._fail(label, f"{unknown.name} is not skew-symmetric: give its diagonal")
        if diagonal is not None and diagonal.lhs != DiagPart(unknown):
            self._fail(label, f"{diagonal} does not give diag({unknown.name})")
        res = expand(eq.lhs - eq.rhs, self.structure)
        had = [(c, fs) for c, fs in res if len(fs) == 1 and isinstance(fs[0], HadamardProduct)
               and gaps in fs[0].args and unknown in fs[0].args]
        if len(had) != 1:
            self._fail(label, f"no term {gaps.name} ∘ {unknown.name} in {eq}")
        c = had[0][0]
        rest = []
        for cc, fs in res:
            if (cc, fs) == had[0]:
                continue
            if unknown.name in set().union(*(algebra.free_names(f) for f in fs)):
                self._fail(label, f"{unknown.name} also appears outside {gaps.name} ∘ {unknown.name}")
            if all(isinstance(f, MatrixSymbol) and f.name in self.structure.diagonal for f in fs):
                continue  # diagonal terms vanish off the diagonal
            rest.append((cc, fs))
        gdef = gaps.definition
        if sp.simplify(gdef.diagonal_value) != 0:
            self._fail(label, f"{gaps.name}_ii = {gdef.diagonal_value} is not zero")
        expr = sp.simplify(-1 / (c * gdef.expr))
        zero_on = None
        if clusters is not None:
            if not (isinstance(clusters, PairwiseMatrix) and clusters.definition.is_indicator
                    and clusters.definition.diagonal_of == gdef.diagonal_of):
                self._fail(label, f"clusters= needs the cluster indicator of {gdef.diagonal_of} (d.clusters)")
            if sp.simplify(gdef.expr.xreplace({DJ: DI})) != 0:
                self._fail(label, f"{gaps.name}_ij = {gdef.expr} does not vanish for d_i = d_j: no gauge inside clusters")
            zero_on = clusters.name
        definition = self._pairwise_def(name, gdef.diagonal_of, expr, sp.Integer(0), origin=label,
                                 meaning=f"-1/({c}·{gaps.name}_ij) off the diagonal, 0 on it"
                                 + (f" and inside the clusters of {gdef.diagonal_of}" if zero_on else ""),
                                 zero_on=zero_on)
        F = PairwiseMatrix.define(definition, unknown.shape[0])
        self.pairwise[name] = definition
        self.pairwise_lines[name] = self._line()
        R = algebra.build(rest, unknown.shape)
        sol = HadamardProduct(F, R) if diagonal is None else HadamardProduct(F, R) + diagonal.rhs
        new = Equation(unknown, self._norm(sol))

        expected = MatMul(-1, HadamardProduct(F, eq.residual_expr))
        if diagonal is not None:  # X - F∘R - d = -F∘(old) + (diag(X) - d)
            expected = MatAdd(expected, diagonal.residual_expr)
        self._record("solve_offdiagonal", label, new, check=_equation_check(new), replay=_follows(expected, new),
                     note=f"{name}_ij = {expr}, {name}_ii = 0")
        return new, F

    def solve_hadamard(self, eq: Equation, unknown: MatrixSymbol, E: PairwiseMatrix, name: str, *,
                       label=None) -> tuple[Equation, PairwiseMatrix]:
        """Solve ``c E ∘ X + R = 0`` entrywise, the diagonal included: ``X = F ∘ R`` with
        ``F_ij = -1/(c E_ij)`` (``E_ij = s_i + s_j`` in the SVD).  ``F`` is zero where ``E_ij``
        vanishes (a pair of zero singular values): there the equation leaves ``X_ij`` free.

        Records: a ``solve_hadamard`` step.  Numeric check: the residual of the solution.
        Exact check: ``-F ∘ (old residual)`` equals the new residual on random rational matrices.
        """
        label = label or f"solve {E.name} ∘ {unknown.name} = ... entrywise"
        res = expand(eq.lhs - eq.rhs, self.structure)
        had = [(c, fs) for c, fs in res if len(fs) == 1 and isinstance(fs[0], HadamardProduct)
               and E in fs[0].args and unknown in fs[0].args]
        if len(had) != 1:
            self._fail(label, f"no term {E.name} ∘ {unknown.name} in {eq}")
        c = had[0][0]
        rest = [(cc, fs) for cc, fs in res if (cc, fs) != had[0]]
        if any(unknown.name in algebra.free_names(f) for _, fs in rest for f in fs):
            self._fail(label, f"{unknown.name} also appears outside {E.name} ∘ {unknown.name}")
        edef = E.definition
        if sp.simplify(edef.diagonal_value) == 0:
            self._fail(label, f"{E.name}_ii = 0: solve the diagonal separately (solve_offdiagonal)")
        expr = sp.simplify(-1 / (c * edef.expr))
        definition = self._pairwise_def(name, edef.diagonal_of, expr, sp.simplify(-1 / (c * edef.diagonal_value)),
                                 origin=label, meaning=f"-1/({c}·{E.name}_ij), the diagonal included",
                                 zero_on=edef.name)
        F = PairwiseMatrix.define(definition, unknown.shape[0])
        self.pairwise[name] = definition
        self.pairwise_lines[name] = self._line()
        sol = HadamardProduct(F, algebra.build(rest, unknown.shape))
        new = Equation(unknown, self._norm(sol))

        self._record("solve_hadamard", label, new, check=_equation_check(new),
                     replay=_follows(MatMul(-1, HadamardProduct(F, eq.residual_expr)), new),
                     note=f"{name}_ij = {expr}, {name}_ii = {definition.diagonal_value}")
        return new, F

    def combine_pairwise(self, eq: Equation, factors: tuple, name: str, *, diagonal=None,
                         label=None) -> tuple[Equation, PairwiseMatrix]:
        """Write ``c F1 ∘ F2 ∘ X`` as ``c L ∘ X`` with ``L_ij = F1_ij F2_ij`` (simplified by SymPy), and
        with ``diagonal = G`` (a diagonal factor, ``f'(D)``) also absorb the term ``c G diag(X)``
        into ``L``'s diagonal, after showing ``L_ii = lim_{d_j -> d_i} L_ij`` (so ``L`` is the
        divided-difference matrix, continuous across equal values: the Daleckii–Krein ``L``).

        Records: a ``combine_pairwise`` step.  Numeric check: the residual of the new equation.
        Exact check: the old and new residuals agree on explicit matrices (with the limit shown
        by SymPy when the diagonal is absorbed).
        """
        label = label or f"combine {' ∘ '.join(f.name for f in factors)} into {name}"
        defs = [f.definition for f in factors]
        if len({df.diagonal_of for df in defs}) != 1:
            self._fail(label, "the pairwise matrices belong to different diagonals")
        res = expand(eq.lhs - eq.rhs, self.structure)
        names = {f.name for f in factors}
        had = [(c, fs) for c, fs in res if len(fs) == 1 and isinstance(fs[0], HadamardProduct)
               and {a.name for a in fs[0].args if isinstance(a, PairwiseMatrix)} == names]
        if len(had) != 1:
            self._fail(label, f"no single term {' ∘ '.join(sorted(names))} ∘ X in {eq}")
        c, (hp,) = had[0]
        X = next(a for a in hp.args if not isinstance(a, PairwiseMatrix))
        expr = sp.simplify(sp.Mul(*[df.expr for df in defs]))
        diag_value = sp.simplify(sp.Mul(*[sp.sympify(df.diagonal_value) for df in defs]))
        rest = [t for t in res if t != had[0]]
        absorbed = None
        if diagonal is not None:
            hermitian = self._norm(Transpose(X)) == self._norm(X)  # diag(sym(X)) = diag(X) for a Hermitian X
            parts = [DiagPart(X)] + ([DiagPart(Sym(X))] if hermitian else [])
            target = [(cc, fs) for cc, fs in rest if any(fs in ((diagonal, q), (q, diagonal)) for q in parts)]
            if len(target) != 1:
                self._fail(label, f"no term c {diagonal} diag({X}) to absorb in {eq}")
            if diag_value != 0:
                self._fail(label, f"{name}_ii = {diag_value} is not zero before absorbing the diagonal")
            ratio = sp.nsimplify(target[0][0] / c)  # c L ∘ X + c' G diag(X): L_ii = (c'/c) g(d_i)
            if not isinstance(diagonal, DiagFunction):
                self._fail(label, f"diagonal= must be a function of {defs[0].diagonal_of} (d.apply(f, D) or its derivative)")
            g_expr = ratio * diagonal.function(DI).doit()
            h = sp.Symbol("h")  # lim_(d_j -> d_i) by the series in d_j = d_i + h (works for an undefined f)
            from .evaluate import real_derivatives

            at_diagonal = sp.series(expr.xreplace({DJ: DI + h}), h, 0, 1).removeO().doit()
            limit = sp.simplify(real_derivatives(at_diagonal) - real_derivatives(g_expr))
            if limit != 0:
                self._fail(label, f"lim_(d_j -> d_i) {expr} - {g_expr} = {limit}: not continuous on the diagonal")
            diag_value = sp.simplify(g_expr)
            absorbed = target[0]
            rest = [t for t in rest if t != absorbed]
            if ratio < 0:  # name the matrix whose diagonal is +g: L = -(Ef ∘ F), the divided differences
                expr, diag_value, c = sp.simplify(-expr), sp.simplify(-diag_value), -c
        definition = self._pairwise_def(name, defs[0].diagonal_of, expr, diag_value, origin=label,
                                 meaning=f"{' ∘ '.join(sorted(names))}" + (f", with {diagonal} on the diagonal" if absorbed else ""))
        L = PairwiseMatrix.define(definition, X.shape[0])
        self.pairwise[name] = definition
        self.pairwise_lines[name] = self._line()
        new = self._eq(algebra.build(rest, eq.lhs.shape) + MatMul(c, HadamardProduct(L, X)), ZeroMatrix(*eq.lhs.shape))

        self._record("combine_pairwise", label, new, check=_equation_check(new), replay=_follows(eq.residual_expr, new),
                     note=f"{name}_ij = {expr}, {name}_ii = {diag_value}" + (" (the limit, shown by SymPy)" if absorbed else ""))
        return new, L

    def second_order(self, L: PairwiseMatrix, name: str = "T", *, label=None) -> sp.Lambda:
        """The second derivative of ``gA = U (L ∘ (U^T sym(gX) U)) U^T``, the VJP of a spectral
        function ``X = U f(D) U^T`` with ``L`` its divided differences: the second-order
        Daleckii–Krein formula

            ``d(gA)[dA] = U S U^T``,  ``S_ij = Σ_k T(d_i, d_k, d_j) (G_ik H_kj + H_ik G_kj)``,

        with ``G = U^T sym(gX) U``, ``H = U^T dA U`` and ``T(a, b, c) = (L(a, b) - L(b, c)) / (a - c)``,
        the second divided difference, derived here from ``L`` by SymPy.  ``T`` is continuous
        across equal values (``T(a, a, a) = f''(a)/2``), so the second derivatives of ``f(A)`` need
        no gauge either.  The formula is trilinear and symmetric in ``(gX, dA, H)``: the same
        contraction is the VJP of the VJP (with ``H`` the cotangent of ``gA``) and its JVP.  It is
        a sum over three indices, outside the matrix algebra of the other steps: generated code
        evaluates ``T`` per function, the runtime contracts it
        (:func:`adjointgen.runtime.spectral.second_order`).

        Records: a ``second_order`` step.  Numeric check: ``U S U^T`` against the central
        difference of the derived VJP along the instance's tangents ``(dU, dD)``.  Exact
        check: ``T`` is symmetric in its three arguments and tends to ``f''(a)/2`` (series in
        ``h`` of ``T(a, a + h, a + 2h)``), for the generic ``f``.
        """
        label = label or f"the second divided differences {name} of {L.name}: the VJP's derivative"
        if self.vjp is None:
            self._fail(label, "derive_vjp must come first")
        sym_inputs = [s for s in self.inputs if s.name in self.symmetric_inputs]
        ruled = self.rule_outputs
        if len(sym_inputs) != 1 or len(self.inputs) != 1 or len(ruled) != 1:
            self._fail(label, "a spectral function has one symmetric input and one output with rules")
        A, X = sym_inputs[0], ruled[0]
        pdef = self.pairwise.get(L.name)
        if pdef is None:
            self._fail(label, f"{L.name} is not a pairwise matrix of this derivation")
        D = next(o for o in self.outputs if o.name == pdef.diagonal_of)
        Us = [o for o in self.outputs if o.name in self.structure.orthonormal]
        if len(Us) != 1:
            self._fail(label, "a spectral function has one orthonormal output (the eigenvectors)")
        U = Us[0]
        gX = self.cotangents[X.name]
        want = self._norm(U * HadamardProduct(L, U.T * Sym(gX) * U) * U.T)
        got = self.vjp.rewritten["g" + A.name]
        if self._norm(got) != want:
            self._fail(label, f"the VJP {got} is not U ({L.name} ∘ (U^T sym(gX) U)) U^T")
        a, b, c, h = sp.symbols("a b c h", real=True)
        Lab = pdef.expr.xreplace({DI: a, DJ: b})
        Lbc = pdef.expr.xreplace({DI: b, DJ: c})
        T = sp.Lambda((a, b, c), sp.simplify((Lab - Lbc) / (a - c)))

        # T symmetric in its arguments, T(a, a, a) = L_aa'/2 (L_ii = f'(d_i): f''/2)
        replay = Replay("divided", (T, pdef.diagonal_value.xreplace({DI: a}), h))
        check = Check("second_order")  # U S U^T against a central difference of the VJP

        self.second = SecondOrder(name, T, L.name, A.name, X.name, U.name, D.name)
        self._record("second_order", label, None, check=check, replay=replay,
                     note=f"{name}(a, b, c) = {T.expr}; d(g{A.name})[d{A.name}] = U S U^T, "
                          f"S_ij = Σ_k {name}(d_i, d_k, d_j) (G_ik H_kj + H_ik G_kj)")
        return T

    def subtract(self, first: Equation, second: Equation, label=None) -> Equation:
        """The difference of two equations.

        Records: a ``subtract`` step.  Numeric check: the residual of the difference.  Exact check:
        the difference of the old residuals equals the new one.
        """
        label = label or "subtract the equations"
        new = self._eq(first.lhs - second.lhs, first.rhs - second.rhs)

        self._record("subtract", label, new, check=_equation_check(new),
                     replay=_follows(MatAdd(first.residual_expr, MatMul(-1, second.residual_expr)), new))
        return new

    def replace(self, eq: Equation, solved: Equation, label=None) -> Equation:
        """Replace the symbol ``solved.lhs`` by ``solved.rhs`` in ``eq``.

        Records: a ``substitute`` step.  Numeric check: the residual of the new equation.  Exact
        check: the old residual with the solved value inserted equals the new one.
        """
        label = label or f"substitute {solved.lhs} = {solved.rhs}"
        new = self._eq(eq.lhs.xreplace({solved.lhs: solved.rhs}), eq.rhs.xreplace({solved.lhs: solved.rhs}))

        if not isinstance(solved.lhs, MatrixSymbol) and not (
                isinstance(solved.lhs, DiagPart) and isinstance(solved.lhs.arg, MatrixSymbol)):
            self._fail(label, f"can only replace a symbol or the diagonal of one, not {solved.lhs}")
        self._record("substitute", label, new, check=_equation_check(new),
                     replay=Replay("insert", (solved.lhs, solved.rhs, eq.residual_expr, new.residual_expr)))
        return new

    def _product_factors(self, e, label) -> tuple:
        """The factors of ``e``, which must be one product without a coefficient (an operator of a
        solve step: ``A``, ``A^T A``, ``S S``)."""
        terms = expand(e, self.structure)
        if len(terms) != 1 or terms[0][0] != 1:
            self._fail(label, f"{e} must be a product without a coefficient")
        return terms[0][1]

    def solve_shifted(self, eq: Equation, W: MatrixSymbol, A, B, D, U, label=None) -> Equation:
        """Solve ``c (A W - B W D) + R = 0`` for ``W`` with ``U^T B W = 0``, column by column:
        ``(A - d_i B) w_i = -r_i / c``, i.e. ``W = S(-R/c)`` with the projected shifted solve ``S``
        (``B = None`` for the identity).  The constraint must have been shown before; the step
        is checked numerically with a bordered dense solve.

        Records: a ``solve_shifted`` step.  Numeric check: the solution against a bordered dense
        solve of every shifted system.  Exact check: the shifted solve of the old residual (divided by
        ``c``) is the new residual, for every ``W`` with ``U^T B W = 0``.
        """
        label = label or f"solve the shifted systems for {W.name}"
        res = expand(eq.lhs - eq.rhs, self.structure)
        b_factors = () if B is None else (B,)

        # the operator A and the shifts D may be products (A^T A, S S)
        a_factors, d_factors = self._product_factors(A, label), self._product_factors(D, label)
        aw = [(c, fs) for c, fs in res if fs == (*a_factors, W)]
        bwd = [(c, fs) for c, fs in res if fs == (*b_factors, W, *d_factors)]
        if len(aw) != 1 or len(bwd) != 1 or aw[0][0] != -bwd[0][0]:
            self._fail(label, f"no terms c ({A} {W.name} - {'B ' if B is not None else ''}{W.name} {D}) in {eq}")
        c = aw[0][0]
        rest = [(cc, fs) for cc, fs in res if (cc, fs) not in (aw[0], bwd[0])]
        if any(W.name in algebra.free_names(f) for _, fs in rest for f in fs):
            self._fail(label, f"{W.name} appears outside the shifted operator in {eq}")
        R = algebra.build(rest, W.shape)
        Bop = Identity(A.shape[0]) if B is None else B
        new = Equation(W, self._norm(ShiftedSolve(MatMul(-1 / c, R), A, Bop, U, D)))
        # S(R_old / c) = W - S(-R/c) = the new residual, for every W with U^T B W = 0
        expected = ShiftedSolve(MatMul(1 / c, eq.residual_expr), A, Bop, U, D)
        self._record("solve_shifted", label, new, check=_equation_check(new),
                     replay=Replay("constrained", (W.name, U, B, expected, new.residual_expr)),
                     note="column i: (A - d_i B) w_i = -r_i/c, U^T B w_i = 0 (projected shifted solve)")
        return new

    def solve_sylvester(self, eq: Equation, X: MatrixSymbol, A, B=None, label=None) -> Equation:
        """Solve ``c (A X + X B) + R = 0`` for ``X``: ``X = Syl[A, B](-R/c)``, the solution of the
        Sylvester equation ``A X + X B = -R/c`` (``B = None``: ``B = A``: ``X dX + dX X = dA`` of a
        matrix square root, or the Lyapunov form ``P dO + dO P = U^T dA - dA^T U`` of the polar
        decomposition).  No eigenvalue of ``A`` may be the negative of one of ``B`` (then the
        solution is unique; true for positive definite ``A`` and ``B``, and for the principal square
        root, whose eigenvalues lie in the open right half plane); the generated code raises
        otherwise.  Where ``A`` and ``B`` are symmetric (Hermitian) in the derivation -- a symmetric
        input or output, or a product the engine reads as one -- the generated code solves in their
        eigenbases (torch on any device); otherwise by Bartels-Stewart (SciPy's ``solve_sylvester``,
        on the CPU: tensors on other devices make a host round trip).

        Records: a ``solve_sylvester`` step.  Numeric check: the residual of the solution, with the
        solve evaluated by SciPy's Bartels-Stewart solver, on every instance (a singular equation is
        named with the eigenvalues that collide).  Exact check: the Sylvester solve of the old
        residual (divided by ``c``) is the new residual.
        """
        B = A if B is None else B
        label = label or f"solve the Sylvester equation for {X.name}"
        hermitian = not any(expand(Transpose(M) - M, self.structure) for M in (A, B))
        res = expand(eq.lhs - eq.rhs, self.structure)

        a_factors, b_factors = self._product_factors(A, label), self._product_factors(B, label)
        ax = [(c, fs) for c, fs in res if fs == (*a_factors, X)]
        xb = [(c, fs) for c, fs in res if fs == (X, *b_factors)]
        if len(ax) != 1 or len(xb) != 1 or ax[0][0] != xb[0][0]:
            self._fail(label, f"no terms c ({A} {X.name} + {X.name} {B}) with one coefficient c in {eq}")
        c = ax[0][0]
        rest = [(cc, fs) for cc, fs in res if (cc, fs) not in (ax[0], xb[0])]
        if any(X.name in algebra.free_names(f) for _, fs in rest for f in fs):
            self._fail(label, f"{X.name} appears outside {A} {X.name} + {X.name} {B} in {eq}")
        R = algebra.build(rest, X.shape)
        new = Equation(X, self._norm(SylvesterSolve(MatMul(-1 / c, R), A, B, hermitian)))
        how = "in the eigenbases of" if hermitian else "by Bartels-Stewart (Schur forms of"
        # Syl(R_old / c) = X - Syl(-R/c): the new residual (the solve is linear)
        expected = SylvesterSolve(MatMul(1 / c, eq.residual_expr), A, B, hermitian)
        self._record("solve_sylvester", label, new, check=_equation_check(new),
                     replay=Replay("equal", (expected, new.residual_expr)),
                     note=f"{A} {X.name} + {X.name} {B} = C, solved {how} {A} and {B}{'' if hermitian else ')'}")
        return new

    def solve_strictly_lower(self, eq: Equation, X: MatrixSymbol, T: MatrixSymbol, label=None) -> Equation:
        """Solve ``c tril₋(T X - X T) + R = 0`` for ``tril₋(X)``, with ``X`` skew (anti-Hermitian) and
        ``T`` upper triangular: ``tril₋(X) = Syl₋[T](R/c)``, the strictly lower solution of
        ``tril₋(L T - T L) = R/c`` (:class:`~adjointgen.calculus.nodes.TriangularSylvesterSolve`).
        For such ``X`` and ``T`` the strictly lower part of ``X T - T X`` depends on ``tril₋(X)``
        alone: ``X = L - L^H + diag(X)``, and ``L^H T``, ``T L^H``, ``diag(X) T`` and ``T diag(X)``
        are upper triangular.  The Schur decomposition's ``Z^H dZ`` (``A = Z T Z^H``) is found so;
        the solution is unique where the diagonal entries of ``T`` (the eigenvalues) are distinct.

        Records: a ``solve_triangular_sylvester`` step.  Numeric check: the residual of the
        solution, the solve evaluated densely (the map on the strictly lower entries as a matrix)
        on every instance.  Symbolic check: for explicit skew ``X`` and upper triangular ``T``, the
        new residual is ``-Syl₋[T](r)/c`` of the old one ``r`` (the solve evaluated entry by entry).
        """
        label = label or f"solve for tril₋({X.name}) (T upper triangular, {X.name} skew)"
        if X.name not in self.structure.skew:
            self._fail(label, f"{X.name} must be a skew-symmetric (anti-Hermitian) symbol")
        if not isinstance(T, MatrixSymbol) or T.name not in self.structure.upper:
            self._fail(label, f"{T} must be a symbol declared upper triangular")
        res = expand(eq.lhs - eq.rhs, self.structure)
        tx = [(c, fs) for c, fs in res if fs == (StrictlyLower(T * X),)]
        xt = [(c, fs) for c, fs in res if fs == (StrictlyLower(X * T),)]
        if len(tx) != 1 or len(xt) != 1 or tx[0][0] != -xt[0][0]:
            self._fail(label, f"no terms c (tril₋({T.name} {X.name}) - tril₋({X.name} {T.name})) in {eq}")
        c = tx[0][0]
        rest = [(cc, fs) for cc, fs in res if (cc, fs) not in (tx[0], xt[0])]
        if any(X.name in algebra.free_names(f) for _, fs in rest for f in fs):
            self._fail(label, f"{X.name} appears outside tril₋({T.name} {X.name} - {X.name} {T.name}) in {eq}")
        R = algebra.build(rest, X.shape)
        new = Equation(StrictlyLower(X), self._norm(TriangularSylvesterSolve(MatMul(1 / c, R), T, True)))
        expected = MatMul(-1 / c, TriangularSylvesterSolve(eq.residual_expr, T, True))
        self._record("solve_triangular_sylvester", label, new, check=_equation_check(new),
                     replay=_follows(expected, new),
                     note=f"tril₋(L {T.name} - {T.name} L) = C solved for the strictly lower L = tril₋({X.name})")
        return new

    def invert_operator(self, eq: Equation, X: MatrixSymbol, label=None) -> Equation:
        """Solve ``c L(X) + R = 0`` for ``X``, ``L`` a linear operator node with a declared inverse
        (``L_exp[A]``, the Fréchet derivative of the matrix exponential, and its inverse
        ``L_exp[A]^-1``): ``X = L^-1(-R/c)``.  ``exp(X) = A`` differentiates to
        ``L_exp[X](dX) = dA``, which this turns into ``dX = L_exp[X]^-1(dA)`` (the logarithm's
        Fréchet derivative).  ``X`` must appear only as the argument of that one operator.

        Records: an ``invert_operator`` step.  Numeric check: the residual of the solution, with the
        inverse evaluated independently (a dense solve of the operator's matrix) on every instance.
        Exact check: the inverse operator applied to the old residual (divided by ``c``) is the new
        residual.
        """
        label = label or f"invert the operator applied to {X.name}"
        res = expand(eq.lhs - eq.rhs, self.structure)
        mine = [(c, fs) for c, fs in res if len(fs) == 1 and isinstance(fs[0], OperatorSolve)
                and fs[0].arg == X and hasattr(fs[0], "inverse_operator")]
        if len(mine) != 1:
            self._fail(label, f"no single term c L({X.name}) with an invertible operator L in {eq}")
        (c, (node,)), = mine
        rest = [(cc, fs) for cc, fs in res if (cc, fs) != mine[0]]
        if any(X.name in algebra.free_names(f) for _, fs in rest for f in fs):
            self._fail(label, f"{X.name} appears outside {node} in {eq}")
        new = Equation(X, self._norm(node.inverse_operator(MatMul(-1 / c, algebra.build(rest, X.shape)))))
        expected = node.inverse_operator(MatMul(1 / c, eq.residual_expr))  # L^-1(R_old / c): the new residual
        self._record("invert_operator", label, new, check=_equation_check(new),
                     replay=Replay("equal", (expected, new.residual_expr)),
                     note=f"{node} = C solved for {X.name}")
        return new

    def isolate(self, eq: Equation, tangent: MatrixSymbol, block, label=None) -> Equation:
        """Move the terms holding ``tangent`` to the left, the rest to the right, and scale so the
        left side is exactly ``block`` (a linear expression in ``tangent``, e.g. ``X A dX (I - A X)``).

        Records: a ``isolate`` step.  Numeric check: the residual of the new equation.  Exact
        check: the old residual divided by the ratio equals the new one.
        """
        label = label or f"isolate {block}"
        res = expand(eq.lhs - eq.rhs, self.structure)
        mine = [(c, fs) for c, fs in res if any(tangent.name in algebra.free_names(f) for f in fs)]
        rest = [(c, fs) for c, fs in res if (c, fs) not in mine]
        target = expand(block, self.structure)
        if not mine or not target or len(mine) != len(target):
            self._fail(label, f"the {tangent.name} terms of {eq} are not a multiple of {block}")
        ratio = sp.nsimplify(mine[0][0] / dict((fs, c) for c, fs in target).get(mine[0][1], sp.nan))
        if ratio.has(sp.nan) or expand(algebra.build(mine, eq.lhs.shape) - ratio * algebra.build(target, eq.lhs.shape), self.structure):
            self._fail(label, f"the {tangent.name} terms of {eq} are not a multiple of {block}")
        new = self._eq(block, MatMul(-1 / ratio, algebra.build(rest, eq.lhs.shape)))

        self._record("isolate", label, new, check=_equation_check(new),
                     replay=_follows(MatMul(1 / ratio, eq.residual_expr), new))
        return new

    def add(self, *equations: Equation, label=None) -> Equation:
        """The sum of equations (e.g. the blocks of a projector decomposition).

        Records: a ``add`` step.  Numeric check: the residual of the sum.  Exact check: the sum
        of the old residuals equals the new one.
        """
        label = label or "add the equations"
        new = self._eq(sp.MatAdd(*[e.lhs for e in equations]), sp.MatAdd(*[e.rhs for e in equations]))

        self._record("add", label, new, check=_equation_check(new),
                     replay=_follows(MatAdd(*[e.residual_expr for e in equations]), new))
        return new

    def same(self, first: Equation, second: Equation, label=None) -> Equation:
        """Two routes arrive at the same equation: their residuals are equal as expressions.

        Records: a ``same`` step.  Numeric check: both equations on every instance.  Exact check:
        the two residuals agree on explicit matrices.
        """
        label = label or "the two routes give the same equation"
        a = expand(first.lhs - first.rhs, self.structure)
        b = expand(second.lhs - second.rhs, self.structure)
        if a != b and expand(first.lhs - first.rhs + second.lhs - second.rhs, self.structure):
            self._fail(label, f"{first}  differs from  {second}")
        eq = Equation(self._norm(first.lhs - first.rhs), self._norm(second.lhs - second.rhs))
        self._record("same", label, eq, check=_equation_check(eq), replay=_same_value_symbolic(eq.lhs, eq.rhs),
                     note="normal forms are identical")
        return second

    # ------------------------------------------------------------------ rules
    def set_jvp(self, partial: bool = False, **solutions: Equation):
        """Declare the JVP: for each output tangent, an equation ``d<out> = expr(primals, d<in>)``.

        With ``partial``, only the outputs given get rules (the others are primal values the rules
        use, differentiated by another derivation).

        Records: a ``jvp`` and a ``rewrite`` step per output.  Numeric check: each JVP against the sampler's
        finite-difference output tangents; its form for code against the derived one.  Exact
        check: the form for code equals the derived one.
        """
        self.partial_rules = partial
        self._register_conjugates(eq.rhs for eq in solutions.values())
        raw, sources = {}, {}
        allowed = {s.name for s in self.inputs + self.outputs} | {t.name for n, t in self.tangents.items()
                                                                    if n in {s.name for s in self.inputs}}
        allowed |= set(self.pairwise)
        for out in self.outputs:
            if out.name in self.constant_outputs:
                continue
            t = self.tangents[out.name]
            if t.name not in solutions:
                if partial or out.name in self.auxiliary_outputs:  # an auxiliary output has no rule of its own
                    continue
                self._fail("JVP", f"no solution given for {t.name}")
            eq = solutions[t.name]
            if eq.lhs != t:
                self._fail("JVP", f"equation {eq} does not solve for {t.name}")
            extra = algebra.free_names(eq.rhs) - allowed
            if extra:
                self._fail("JVP", f"{t.name} still depends on {sorted(extra)}")
            raw[t.name] = eq.rhs
            sources[t.name] = self._source(eq, f"JVP {t.name}")
        code = {k: algebra.simplify_for_codegen(v, self.structure) for k, v in raw.items()}
        self.jvp = Rule(raw, code, sources)
        for k in raw:
            solved = solutions[k]
            jvp_eq = Equation(self.tangents_by_name(k), raw[k])
            self._record("jvp", f"JVP {k} = {raw[k]}", jvp_eq,
                         check=_equation_check(jvp_eq),
                         replay=Replay("equal", (solved.residual_expr, jvp_eq.residual_expr)),
                         note=f"the equation of {self._equation_label(solved)}; checked against the "
                              "finite-difference tangent of the reference forward")
            self._record("rewrite", f"JVP {k} rewritten for code: {code[k]}", Equation(code[k], raw[k]),
                         check=_equation_check(Equation(code[k], raw[k])),
                         replay=_same_value_symbolic(code[k], raw[k]))
        self.real_jvp = self._specialize("JVP", raw, sources)

    def _register_conjugates(self, exprs):
        """The conjugates ``conj(F)`` of complex pairwise matrices that the transposition (or a
        normalisation) wrote are pairwise matrices of the derivation too (of ``conj d``)."""
        for e in exprs:
            for p in e.atoms(PairwiseMatrix):
                base = p.definition.conjugate_of
                if p.name not in self.pairwise and base in self.pairwise:
                    self.pairwise[p.name] = p.definition
                    self.pairwise_lines[p.name] = self.pairwise_lines.get(base)

    def _specialize(self, what: str, raw: dict, sources: dict, square: tuple = ()) -> Rule | None:
        """A complex rule read on real data: renormalised with the real-only rules
        (``diag(X^T) = diag(X)``, zero diagonal of skew matrices), checked on the real instances
        (``square``: those at which these outputs are square, a variant's)."""
        if not self.structure.complex or self.structure.complex_diagonal:
            return None  # complex diagonal outputs (eigenvalues of a general matrix) are complex for real data too
        real = self.structure.real()
        spec = {k: normalize(v, real) for k, v in raw.items()}
        code = {k: algebra.simplify_for_codegen(v, real) for k, v in spec.items()}
        for k in raw:
            eq = Equation(code[k], raw[k])
            check = _real_only(_equation_check(eq))
            self._record("specialize", f"{what} {k} on real data: {code[k]}", eq,
                         check=Check(check.kind, check.args, real_only=True, square=square),
                         replay=_real_only_symbolic(code[k], raw[k]),
                         note="checked on the real instances" + (f" with {_and(square)} square" if square else ""))
        return Rule(spec, code, dict(sources))

    def either_orientation(self, rows: sp.Symbol, cols: sp.Symbol):
        """Declare that the inputs may be tall (``rows > cols``) or wide (``rows < cols``), far from
        square: besides the rules as derived (used for square input), the generated code gets
        the rules as sums of products, each chain ordered for a tall and for a wide input, and
        picks them by the shapes at run time (as JAX's own pseudo-inverse rule branches on
        ``m >= n``).  A chain such as ``P P^T dA^T A P`` forms an ``m×m`` or an ``n×n``
        intermediate whichever order is taken, and a collected form such as ``P (X P + Y)`` fixes
        one: 400000² entries for a 2×400000 ``A``.  No mathematics changes: each variant is the same
        expression (verified as such on every instance)."""
        for dim in (rows, cols):
            if dim not in self.dims:
                self._fail("either_orientation", f"{dim} is not a dimension of this derivation (d.dim)")
        self.orientations = (rows.name, cols.name)

    def square_variants(self, *outputs: MatrixSymbol):
        """Also derive the rules for the shapes at which these orthonormal outputs are square: for
        each nonempty set of them, the JVP and the VJP with ``U U^T = I`` substituted (``U^T U = I``
        holds always; ``U U^T = I`` too where ``U`` is square), so that the terms that vanish there
        (the complement projections ``(I - U U^T) dA V S^-1`` of the SVD, the thin QR's) are not
        computed.  The generated code picks the variant by the shapes at run time (the anchors'
        ``if m > n`` branches, derived instead of written).  Call after :meth:`derive_vjp`.

        Records: a ``square`` step per rule output and variant (and ``specialize`` steps for a
        complex derivation's real data).  Numeric check: the variant against the general rule on
        the instances where the outputs are square (at least one instance must be).  Exact
        check: the variant is the general rule with ``U U^T`` replaced by ``I`` (a substitution, given
        ``U U^T = I``, which holds for square ``U`` with orthonormal columns)."""
        from itertools import combinations

        label = "rules for square " + _and([getattr(X, "name", repr(X)) for X in outputs])
        if self.vjp is None:
            self._fail(label, "derive_vjp must come first")
        for X in outputs:
            if not isinstance(X, MatrixSymbol) or X not in self.outputs or X.name not in self.structure.orthonormal \
                    or self.structure.orthonormal[X.name] is not None:
                self._fail(label, f"{X} is not an output declared orthonormal=True")
        for r in range(1, len(outputs) + 1):
            for subset in combinations(outputs, r):
                self._square_variant(subset)

    def _square_variant(self, subset):
        names = tuple(X.name for X in subset)
        label = f"rules where {_and(names)} {'is' if len(names) == 1 else 'are'} square"
        def square_at(dims):
            env = {s: dims[s.name] for s in self.dims if s.name in dims}
            return all(sp.sympify(X.shape[0]).subs(env) == sp.sympify(X.shape[1]).subs(env) for X in subset)

        fields = {dims.get("field") for dims in self.audit_dims if square_at(dims)}
        if not fields:
            self._fail(label, f"no audit instance has {_and(names)} square: add one to d.instances")
        if self.real_jvp is not None and {"real", "complex"} & {dims.get("field") for dims in self.audit_dims} \
                and not {"real", "complex"} <= fields:  # the sampler's field: one instance of each
            self._fail(label, f"the audit instances with {_and(names)} square are all {fields.pop()}: add one of "
                       "the other field to d.instances, so that both sets of rules are checked")

        patterns = [(self._norm(X * X.T), Identity(X.shape[0])) for X in subset]

        def special(rule: Rule) -> dict:
            out = {}
            for k, e in rule.raw.items():
                for pattern, value in patterns:
                    e, _ = algebra.substitute_product(e, pattern, value, self.structure)
                out[k] = self._norm(e)
            return out

        jvp_raw, vjp_raw = special(self.jvp), special(self.vjp)
        if jvp_raw == dict(self.jvp.raw) and vjp_raw == dict(self.vjp.raw):
            self._fail(label, f"no term of the rules changes where {_and(names)} {'is' if len(names) == 1 else 'are'} square")
        rules = []
        for what, raw, general in (("JVP", jvp_raw, self.jvp), ("VJP", vjp_raw, self.vjp)):
            code = {k: algebra.simplify_for_codegen(v, self.structure) for k, v in raw.items()}
            for k in raw:
                eq = Equation(code[k], general.raw[k])
                given = _and([n + ' ' + n + '^T = I' for n in names])
                replay = self._substitution_replay(None, None, patterns, f"{given} (square with orthonormal columns)",
                                                   old_residual=general.raw[k], new_residual=code[k])
                self._record("square", f"{what} {k} where {_and(names)} {'is' if len(names) == 1 else 'are'} square "
                             f"({given}): {code[k]}", eq, replay=replay,
                             check=Check("equation", (eq,), square=names),
                             note=f"checked on the instances with {_and(names)} square")
            rules.append(Rule(raw, code, dict(general.sources)))
        real_jvp = self._specialize("JVP", jvp_raw, dict(self.jvp.sources), names) if self.real_jvp is not None else None
        real_vjp = self._specialize("VJP", vjp_raw, dict(self.vjp.sources), names) if self.real_vjp is not None else None
        self.variants.append(Variant("square_" + "_".join(names), names, rules[0], rules[1], real_jvp, real_vjp))

    def general_directions(self, *inputs: MatrixSymbol, label: str | None = None):
        """Also give the rules of the general-matrix function this one restricts: at a symmetric
        (Hermitian) value of these inputs, along tangents that are not symmetric.

        ``exp``, ``log`` and ``sqrt`` of a Hermitian matrix are the restrictions of functions of
        every square matrix; their derivative at a Hermitian point is wanted along every direction
        (a Lie-group parametrisation starts at ``A = 0`` or ``I``).  The JVP derived here with
        symmetric tangents is checked against the general function along unstructured ones, on
        every audit instance: the sampler returns ``"general"``, a NumPy forward of the general
        function taking the inputs by name and returning the outputs by name.  The VJP along
        unstructured tangents is the transposed JVP without the projection onto symmetric matrices
        (``derive_vjp``'s ``transpose`` step).  The generated code emits both as the variant
        ``general`` (``<op>_vjp_general``), which the caller picks for a general-matrix function's
        Hermitian route.

        Records: a ``directions`` step per input (numeric: the JVP along a random unstructured
        tangent against central differences of the general forward; a premise -- the derivation's
        steps assumed symmetric tangents, so only the general function can say) and a
        ``transpose`` step per input (the dot-product identity along unstructured tangents)."""
        names = tuple(X.name for X in inputs)
        label = label or f"the rules along unstructured tangents of {_and(names)}"
        if self.vjp is None:
            self._fail(label, "derive_vjp must come first")
        if not inputs:
            self._fail(label, "name the symmetric inputs whose tangents are unstructured")
        for X in inputs:
            if not isinstance(X, MatrixSymbol) or X not in self.inputs or X.name not in self.symmetric_inputs:
                self._fail(label, f"{X} is not an input declared symmetric=True")
        for X in inputs:
            self._record("directions", f"the JVP along an unstructured d{X.name} is the general function's "
                         f"derivative at symmetric {X.name}", None, check=Check("directions", (X.name,)),
                         replay=_premise("the general function's derivative (its sampler's general forward)"),
                         note="against central differences of the sampler's general forward")
        raw, sources = dict(self.vjp.raw), dict(self.vjp.sources)
        for X in inputs:
            total = self.unprojected_vjp[X.name]
            raw["g" + X.name] = total
            self._record("transpose", f"VJP g{X.name} along unstructured d{X.name} (not projected): {total}",
                         Equation(MatrixSymbol("g" + X.name, *X.shape), total),
                         check=Check("dot_product", (X.name, total, "unstructured")),
                         replay=_dot_product_symbolic(self, X.name, total),
                         note="<g_in, d_in> = sum <g_out, d_out> for unstructured tangents")
        code = {k: algebra.simplify_for_codegen(v, self.structure) for k, v in raw.items()}
        vjp = Rule(raw, code, sources)
        real_vjp = self._specialize("VJP", raw, sources) if self.real_vjp is not None else None
        self.variants.append(Variant("general", (), self.jvp, vjp, self.real_jvp, real_vjp, directions=names))

    def tangents_by_name(self, name):
        for t in self.tangents.values():
            if t.name == name:
                return t
        raise KeyError(name)

    def derive_vjp(self, *, lowrank: sp.Symbol | None = None):
        """Transpose the JVP under ``<X, Y> = tr(X^T Y)``; project symmetric inputs with ``sym``.

        With ``lowrank=k``, also write each input cotangent (before the projection) as one
        product ``L R^T`` with ``L``, ``R`` of ``k`` columns: the form sparse and matrix-free inputs
        need (``gA = sym(L R^T)``, gathered on a sparsity pattern or pushed through a matvec).

        Records: ``transpose``, ``project`` and ``rewrite`` steps (and ``lowrank``, ``specialize``,
        ``gauge``).  Numeric check: the dot-product identity ``<g_in, d_in> = Σ <g_out, d_out>``
        with random cotangents.  Exact check: the dot-product identity on explicit matrices.
        """
        if self.jvp is None:
            self._fail("VJP", "set_jvp must come first")
        self._adjoint_steps()
        in_tangents = {self.tangents[s.name].name for s in self.inputs}
        contrib: dict[str, list] = {}
        for out in self.rule_outputs:
            g = MatrixSymbol("g" + out.name, *out.shape)
            self.cotangents[out.name] = g
            t = self.tangents[out.name].name
            for name, parts in algebra.transpose_linear(self.jvp.raw[t], in_tangents, g, self.structure).items():
                contrib.setdefault(name, []).extend(parts)
        raw, sources = {}, {}
        for s in self.inputs:
            t = self.tangents[s.name].name
            parts = contrib.get(t, [])
            total = sp.MatAdd(*parts) if len(parts) > 1 else (parts[0] if parts else ZeroMatrix(*s.shape))
            total = self._norm(total)
            self._register_conjugates([total])
            unprojected = total
            self._record("transpose", f"VJP g{s.name} by transposing the JVP: {total}",
                         Equation(MatrixSymbol("g" + s.name, *s.shape), total),
                         check=_dot_product_check(self, s.name, total, symmetric=False),
                         replay=_dot_product_symbolic(self, s.name, total),
                         note="<g_in, d_in> = sum <g_out, d_out> for random tangents and cotangents")
            transposed = self.steps[-1]
            self.unprojected_vjp[s.name] = unprojected
            if s.name in self.symmetric_inputs:
                total = self._norm(Sym(total))
                self._record("project", f"g{s.name} projected onto symmetric matrices: {total}",
                             Equation(MatrixSymbol("g" + s.name, *s.shape), total),
                             check=_dot_product_check(self, s.name, total, symmetric=True),
                             replay=_dot_product_symbolic(self, s.name, total))
            triangle = "lower" if s.name in self.structure.lower else ("upper" if s.name in self.structure.upper else "")
            if triangle:
                # a triangular input's tangent is triangular: its gradient is the same triangle of the
                # transposed JVP (the other triangle is not an input), without the diagonal if unit
                mirrored = total if triangle == "lower" else Transpose(total)
                part = StrictlyLower(mirrored) if triangle == "lower" else Transpose(StrictlyLower(mirrored))
                total = self._norm(part if s.name in self.structure.unit else sp.MatAdd(part, DiagPart(total)))
                self._record("project", f"g{s.name} projected onto {triangle} triangular matrices: {total}",
                             Equation(MatrixSymbol("g" + s.name, *s.shape), total),
                             check=_dot_product_check(self, s.name, total, symmetric=False),
                             replay=_dot_product_symbolic(self, s.name, total))
            if lowrank is not None:
                self._lowrank(s, unprojected, lowrank, total)
            raw["g" + s.name] = total
            sources["g" + s.name] = Source(self.path, transposed.line, transposed.index, transposed.label, transposed.helper)
        code = {k: algebra.simplify_for_codegen(v, self.structure) for k, v in raw.items()}
        for k in raw:
            self._record("rewrite", f"VJP {k} rewritten for code: {code[k]}", Equation(code[k], raw[k]),
                         check=_equation_check(Equation(code[k], raw[k])),
                         replay=_same_value_symbolic(code[k], raw[k]))
        self.vjp = Rule(raw, code, sources)
        self.real_vjp = self._specialize("VJP", raw, sources)
        for g in self.gauges:
            if all(name in self.cotangents for name in g.directions):  # a gauge of outputs with rules
                self._gauge_residual(g)
        self._value_blocks()

    def _value_blocks(self):
        """For each diagonal output with declared clusters whose JVP reads a diagonal part
        (``dD = diag(X)``, ``dD = diag(X) - diag(Y) D``): the block that diagonal is taken of
        (``X - Y D``), and the transposition of that map to the input cotangents.  Inside a cluster
        of equal values ``Y D`` is ``d_c Y``, so the block is the matrix whose eigenvalues the
        cluster's values are to first order: a second derivative at the cluster moves them as it does
        (:mod:`adjointgen.runtime.value_blocks`), from rules derived here instead of typed there.

        Records: a ``value_block`` step per output (numeric: ``diag(X)`` against the JVP of ``D``, and
        the dot-product identity of the transposition with a random block cotangent; symbolic: the
        same two on explicit matrices)."""
        in_tangents = {self.tangents[s.name].name for s in self.inputs}
        for indicator in sorted(self.cluster_meaning):
            D_name = self.pairwise[indicator].diagonal_of
            t = self.tangents[D_name].name
            dD = self.jvp.raw.get(t) if self.jvp is not None else None
            if dD is None or not dD.has(DiagPart) or D_name in self.value_blocks:
                continue
            block = dD.replace(lambda e: isinstance(e, DiagPart), lambda e: e.arg)
            if block.has(DiagPart):
                continue
            block = self._norm(block)
            D = next(o for o in self.outputs if o.name == D_name)
            M = MatrixSymbol("g" + D_name + "_block", *D.shape)
            parts = algebra.transpose_linear(block, in_tangents, M, self.structure)
            vjp_raw = {}
            for s in self.inputs:
                terms = parts.get(self.tangents[s.name].name, [])
                total = sp.MatAdd(*terms) if len(terms) > 1 else (terms[0] if terms else ZeroMatrix(*s.shape))
                if s.name in self.symmetric_inputs:
                    total = Sym(total)
                vjp_raw["g" + s.name] = self._norm(total)
            label = f"the values of {D_name} as a block: d{D_name} = diag({block})"
            self._register_conjugates([block, *vjp_raw.values()])
            self._record("value_block", label, Equation(DiagPart(block), dD),
                         check=Check("value_block", (block, dict(vjp_raw), M.name, dD)),
                         replay=_same_value_symbolic(DiagPart(block), dD),
                         note="diag(X) against the JVP of the values; the transposition by the dot-product identity")
            jvp_rule = Rule({t: block}, {t: algebra.simplify_for_codegen(block, self.structure)}, {})
            vjp_rule = Rule(vjp_raw, {k: algebra.simplify_for_codegen(v, self.structure) for k, v in vjp_raw.items()}, {})
            real_jvp = real_vjp = None
            if self.structure.complex and not self.structure.complex_diagonal:
                real = self.structure.real()
                rj = {k: normalize(v, real) for k, v in jvp_rule.raw.items()}
                rv = {k: normalize(v, real) for k, v in vjp_rule.raw.items()}
                real_jvp = Rule(rj, {k: algebra.simplify_for_codegen(v, real) for k, v in rj.items()}, {})
                real_vjp = Rule(rv, {k: algebra.simplify_for_codegen(v, real) for k, v in rv.items()}, {})
            self.value_blocks[D_name] = ValueBlock(D_name, M.name, jvp_rule, vjp_rule, real_jvp, real_vjp)

    def _adjoint_steps(self):
        """The transposition treats the projections ``diag``, ``sym``, ``skew``, ``Φ``, ``tril₋`` as
        self-adjoint under ``<X, Y> = Re tr(X^H Y)``; show it for each one the JVP uses, numerically
        on random matrices and symbolically on explicit 3×3 ones, rather than assume it."""
        used = sorted({type(a).__name__: type(a) for e in self.jvp.raw.values()
                       for a in sp.preorder_traversal(e) if isinstance(a, algebra.LINEAR_NODES)}.items())
        for name, node in used:
            self._record("adjoint", f"{node._label} is self-adjoint: <G, {node._label}(X)> = <{node._label}(G), X>",
                         None, check=_adjoint_check(node, self.structure.complex),
                         replay=_adjoint_symbolic(node, self.structure.complex),
                         note="the transposition rule the VJP uses for this projection")

    def _gauge_residual(self, gauge: "Gauge"):
        """``R`` with ``<R, Θ> = Σ <g_out, direction_out(Θ)>`` for all ``Θ`` of the parameter's
        structure: the derivative of the loss along the gauge.  A well-defined loss has ``R = 0``."""
        T = gauge.parameter
        parts = []
        for out_name, direction in gauge.directions.items():
            g = self.cotangents[out_name]
            for _, ps in algebra.transpose_linear(direction, {T.name}, g, self.structure).items():
                parts.extend(ps)
        from .nodes import Skew

        total = sp.MatAdd(*parts) if len(parts) > 1 else parts[0]
        # the projection onto the parameter's structure (<R, Θ> only sees that part of R)
        projected = Skew(total) if T.name in self.structure.skew else total
        projected = DiagPart(projected) if T.name in self.structure.diagonal else projected
        if T.name in self.structure.clustered:
            K = PairwiseMatrix(self.structure.clustered[T.name], *T.shape)
            projected = HadamardProduct(K, projected)
        raw = self._norm(projected)
        self._register_conjugates([raw])
        name = gauge.residual_name
        eq = Equation(MatrixSymbol(name, *T.shape), raw)
        self._record("gauge", f"gauge residual {name} = {raw}: the loss's derivative along '{gauge.label}'", eq,
                     check=_gauge_check(self, gauge, raw), replay=_gauge_symbolic(self, gauge, raw),
                     note="<R, Θ> = Σ <g_out, d_out(Θ)> for a random Θ; a well-defined loss has R = 0")
        code = {name: algebra.simplify_for_codegen(raw, self.structure)}
        step = self.steps[-1]
        self.gauge_rules[gauge.name] = Rule({name: raw}, code, {name: Source(self.path, step.line, step.index, step.label, step.helper)})

    def _lowrank(self, s, unprojected, k, projected):
        """Split every monomial at its last inner dimension ``k``: ``c F1..Fj (Fj+1..Fp)`` with
        ``F1..Fj`` of ``k`` columns; group the monomials by their right part."""
        label = f"g{s.name} as a low-rank product L R^T"
        groups: dict[str, list] = {}
        rights: dict[str, sp.MatrixExpr] = {}
        for c, fs in expand(unprojected, self.structure):
            j = next((j for j in range(len(fs) - 1, 0, -1) if fs[j - 1].shape[1] == k), None)
            if j is None:
                self._fail(label, f"term {algebra._monomial(c, fs)} has no inner dimension {k}")
            right = self._norm(Transpose(MatMul(*fs[j:]) if len(fs[j:]) > 1 else fs[j]))
            key = sp.srepr(right)
            rights[key] = right
            groups.setdefault(key, []).append(algebra._monomial(c, fs[:j]))
        if len(groups) != 1:
            self._fail(label, f"the terms of g{s.name} have {len(groups)} different right factors")
        key = next(iter(groups))
        L = self._norm(sp.MatAdd(*groups[key]) if len(groups[key]) > 1 else groups[key][0])
        R = rights[key]
        value = Sym(L * R.T) if s.name in self.symmetric_inputs else L * R.T
        eq = Equation(MatrixSymbol("g" + s.name, *s.shape), self._norm(value))
        self._record("lowrank", f"{label}: L = {L}, R = {R}", eq,
                     check=_equation_check(Equation(self._norm(value), projected)),
                     replay=_same_value_symbolic(self._norm(value), projected))
        self.vjp_factors["g" + s.name] = (algebra.simplify_for_codegen(L, self.structure),
                                          algebra.simplify_for_codegen(R, self.structure))


def _and(names) -> str:
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _real_diagonal_factor(f, structure) -> bool:
    """A triangular factor (or its inverse) whose diagonal is real."""
    if isinstance(f, Inverse):
        f = f.arg
    return isinstance(f, MatrixSymbol) and f.name in structure.real_diagonal


# ---------------------------------------------------------------------- checks
def _equation_check(eq: Equation) -> Check:
    """The residual ``‖lhs - rhs‖`` against the sizes of the terms."""
    return Check("equation", (eq,))


def _dot_product_check(d: Derivation, name: str, gexpr, symmetric: bool) -> Check:
    """``<g_in, d_in> = Σ <g_out, d_out>`` with ``g_in = gexpr`` (projected when ``symmetric``)."""
    return Check("dot_product", (name, gexpr))


def _dot_product_symbolic(d: Derivation, name: str, gexpr) -> Replay:
    """``<g_in, d_in> - Σ <g_out, d_out>`` on explicit matrices (see :mod:`adjointgen.audit.replays`)."""
    return Replay("dot_product", (name, gexpr))


def _adjoint_check(node, complex_: bool) -> Check:
    return Check("adjoint", (node, complex_))


def _adjoint_symbolic(node, complex_: bool) -> Replay:
    return Replay("adjoint", (node, complex_))


def _real_only(check: Check) -> Check:
    """A check that applies to the real instances only (complex ones report a zero residual)."""
    return Check(check.kind, check.args, real_only=True)


def _real_only_symbolic(a, b) -> Replay:
    return Replay("real", (a, b))


def _gauge_check(d: Derivation, gauge: "Gauge", rexpr) -> Check:
    return Check("gauge", (gauge, rexpr))


def _gauge_symbolic(d: Derivation, gauge: "Gauge", rexpr) -> Replay:
    return Replay("gauge", (gauge, rexpr))


def _same_value_symbolic(a, b) -> Replay:
    return Replay("equal", (a, b))


def _follows(expected, new: Equation) -> Replay:
    """The new equation's residual equals ``expected``, an expression of the old residuals."""
    return Replay("equal", (expected, new.residual_expr))


def _explicit(expr, env):
    from .evaluate import SYMPY, evaluate

    return evaluate(expr, env, env.get("__dims__", {}), arith=SYMPY)

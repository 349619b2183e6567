"""The declarations: dimensions, inputs, outputs, the forward, parameters, clusters, scalar functions, instances (a part of :class:`~adjointgen.calculus.derivation.Derivation`)."""
from __future__ import annotations

import dataclasses

from typing import Callable

import sympy as sp
from sympy.matrices.expressions import (
    MatrixSymbol,
)

from ..algebra import DerivationError
from ..nodes import DI, DJ, DiagFunction, DiagPart, PairwiseDef, PairwiseMatrix, SameCluster
from ..records import Check, Extension, ForwardRef, ForwardSpec
from .checks import _forward_check, _premise


#: where the audit finds a ``forward(runtime=...)`` of each declared kind (each backend imports it
#: from its own runtime: :attr:`adjointgen.codegen.printers.ArrayPrinter.forwards`)
RUNTIME_FORWARDS = {"torch": "adjointgen.runtime.forward", "numpy": "adjointgen.runtime.xp"}


class Declarations:
    """The declarations: dimensions, inputs, outputs, the forward, parameters, clusters, scalar functions, instances."""

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

    def forward(self, *, torch=None, numpy=None, host=None, runtime=None, options=None, checked=(), saves=None,
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
            runtime: instead of both, for adjointgen's own catalogue: the name of a forward that
                every backend's runtime defines (``"eigh"``: ``adjointgen.runtime.forward.eigh``
                for torch, ``adjointgen.runtime.xp.eigh`` for NumPy/CuPy,
                ``adjointgen.runtime.jax.eigh`` for JAX), declared once.
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
            if torch is not None or numpy is not None or runtime is not None or saves:
                raise DerivationError(f"{where}: forward(host=...) is the forward of every backend: no torch=, "
                                      "numpy=, runtime= or saves= beside it")
            ref = ForwardRef.parse(host, "host", where)
            if ref.xp:
                raise DerivationError(f"{where}: the host forward {host!r} must be an importable name")
            refs = {"torch": None, "numpy": ref}
        elif runtime is not None:
            if torch is not None or numpy is not None:
                raise DerivationError(f"{where}: forward(runtime=...) names the forward of every backend: no torch= "
                                      "or numpy= beside it")
            if not isinstance(runtime, str) or not runtime.isidentifier():
                raise DerivationError(f"{where}: forward(runtime=...) takes the name of a runtime forward, got {runtime!r}")
            refs = {backend: ForwardRef(module, runtime, runtime=True) for backend, module in RUNTIME_FORWARDS.items()}
            for ref in refs.values():
                try:
                    ref.resolve()
                except DerivationError as exc:
                    raise DerivationError(f"{where}: {exc}") from None
        else:
            for backend, value in (("torch", torch), ("numpy", numpy)):
                ref = None if value is None else ForwardRef.parse(value, backend, where)
                if ref is not None and ref.module == RUNTIME_FORWARDS[backend]:  # a runtime forward by its module
                    ref = dataclasses.replace(ref, runtime=True)
                refs[backend] = ref
        if torch is None and numpy is None and host is None and runtime is None:
            raise DerivationError(f"{where}: forward() needs torch= or numpy= (or both), host= or runtime=")
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
        backward recovers it from the cotangents (:func:`adjointgen.runtime.completion.complete`)
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


"""The rules of a generated operation as data, for every backend's dispatch.

A generated module describes its rules as a :class:`Rules` value next to the rule functions: which
function is the VJP and the JVP for real and for complex data, which is the checked VJP, and what
each gauge residual it returns is checked against.  Each backend's dispatch
(:mod:`adjointgen.runtime.dispatch` for torch, :mod:`adjointgen.runtime.jax` for JAX) reads them;
this module imports no array library.
"""
from __future__ import annotations

import sys

import dataclasses
from dataclasses import dataclass
from typing import Callable

from .routes import taken

__all__ = ["Call", "Residual", "Rules", "ValueBlock", "Variant"]


@dataclass(frozen=True)
class Call:
    """A generated rule function and the names of its arguments: positional ones, then the optional
    ones passed by keyword (factors, ``cluster_rtol``, ``broadening``)."""

    fn: Callable
    args: tuple[str, ...]
    keywords: tuple[str, ...] = ()

    def __call__(self, env: dict) -> tuple:
        out = self.fn(*(env[a] for a in self.args), **{k: env[k] for k in self.keywords})
        return out if isinstance(out, tuple) else (out,)


@dataclass(frozen=True)
class Residual:
    """A gauge residual that a checked VJP returns (``output``), and the names its check reads.

    A residual supported on clusters of equal values (``vector`` set) goes to
    :func:`~adjointgen.runtime.degeneracy.check` with the cluster mask of ``vector`` and the
    cotangent ``split`` of that vector; any other to :func:`~adjointgen.runtime.gauge.check`.
    ``completes``: the vectors whose spectral losses are completed at clusters first (their
    cotangents are ``g`` + name).  ``what="basis"`` without ``vector``: a ``k x k`` residual of a
    change of basis of a complement (``ComplementBasisError``), not a phase per column."""

    output: str
    cotangents: tuple[str, ...]
    vector: str | None = None
    split: str | None = None
    what: str = "eigenvalues"
    completes: tuple[str, ...] = ()
    #: the gauge function computing this residual alone (checked next to the plain VJP where no
    #: cluster can make the others nonzero)
    call: "Call | None" = None
    #: a phase gauge's outputs whose columns it rotates, and the forms invariant to it (the
    #: error's wording, generated from the derivation's gauge)
    phases: tuple[str, ...] = ()
    invariant: str = ""


@dataclass(frozen=True)
class Variant:
    """The rules specialised to the shapes at which the outputs named in ``square`` are square
    (``U U^H = I``: the complement terms dropped; ``Derivation.square_variants``), or ordered for
    the shapes where ``shorter = (m, n)`` has ``m < n``.  Each call replaces the one of the same
    name of :class:`Rules` where it applies."""

    square: tuple[str, ...]
    jvp: Call | None = None
    vjp: Call | None = None
    vjp_checked: Call | None = None
    jvp_complex: Call | None = None
    vjp_complex: Call | None = None
    vjp_complex_checked: Call | None = None
    #: symmetric inputs whose tangents are unstructured in these rules (a general-matrix function's
    #: rules at a symmetric point): picked by :meth:`Rules.for_directions`, never by shape
    directions: tuple[str, ...] = ()
    #: ``(m, n)``: the same rules with their products ordered for ``m < n``, where it holds
    #: (``Derivation.either_orientation``)
    shorter: tuple[str, ...] = ()


_VARIANT_CALLS = ("jvp", "vjp", "vjp_checked", "jvp_complex", "vjp_complex", "vjp_complex_checked")


def _square(x) -> bool:
    shape = getattr(x, "shape", ())
    return len(shape) >= 2 and shape[-1] == shape[-2]


@dataclass(frozen=True)
class ValueBlock:
    """How an operation's values (``values``, the env name of the vector) move as a block at
    clusters: ``jvp`` maps the tangents of ``inputs`` to the block whose diagonal is the values'
    tangent, ``vjp`` a block cotangent (env name ``cotangent``) to the inputs' cotangents; both
    derived (``Derivation.derive_vjp``), for :mod:`adjointgen.runtime.value_blocks`."""

    values: str
    cotangent: str
    inputs: tuple[str, ...]
    jvp: Call
    vjp: Call
    jvp_complex: Call | None = None
    vjp_complex: Call | None = None

    def calls(self, complex_: bool) -> tuple[Call, Call]:
        if complex_ and self.jvp_complex is not None:
            return self.jvp_complex, self.vjp_complex
        return self.jvp, self.vjp


@dataclass(frozen=True)
class Rules:
    """An operation's rules as the autograd function dispatches them.  ``outputs``: the VJP's
    outputs (the input cotangents) in order; ``data``: the input whose dtype selects the complex
    rules; ``broadening``: whether the rules take a broadening (under which clusters are not
    checked)."""

    op: str
    outputs: tuple[str, ...]
    vjp: Call
    jvp: Call
    data: str
    vjp_checked: Call | None = None
    residuals: tuple[Residual, ...] = ()
    vjp_complex: Call | None = None
    jvp_complex: Call | None = None
    vjp_complex_checked: Call | None = None
    residuals_complex: tuple[Residual, ...] = ()
    broadening: bool = False
    #: one set of rules, for complex data, whose outputs are complex for real input too (``eig``):
    #: real data is cast for them, and the real input's cotangent is the real part
    complex_only: bool = False
    #: rules specialised to square shapes of orthonormal outputs (:class:`Variant`)
    variants: tuple[Variant, ...] = ()
    #: triangular outputs the rules invert, with their degree in the defining identity (``A = L L^H``:
    #: 2) and their declared side (``"upper"``, ``"lower"``): a pivot at rounding level leaves no correct digit
    invertible: tuple[tuple[str, int, str], ...] = ()
    #: how the values move as a block at clusters (:class:`ValueBlock`), if they can
    block: ValueBlock | None = None
    #: the derivation's dimensions of the arrays the rules read, by name (``("Q", ("m", "n"))``),
    #: where variants are picked by shape: a variant applies where its outputs' dimensions are equal
    shapes: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def __post_init__(self):
        #: nothing to decide for real data: no gauge residual, no variant, no broadening, no block of
        #: values (the dispatch calls the VJP at once); set here, where no compiler traces
        object.__setattr__(self, "plain", not (self.variants or self.complex_only or self.vjp_checked is not None
                                               or self.residuals or self.broadening or self.block is not None))

    def dims(self, env: dict) -> dict:
        """The size of each declared dimension in the arrays of ``env`` (their last axes); a
        ``ValueError`` where two arrays disagree (shapes the derivation does not cover, such as a
        wide matrix given to the rules of a tall factorization)."""
        found: dict = {}
        for name, dims in self.shapes:
            shape = getattr(env.get(name), "shape", None)
            if shape is None or len(shape) < len(dims):
                continue
            for dim, size in zip(dims, shape[len(shape) - len(dims):]):
                if found.setdefault(dim, size) != size:
                    declared = ", ".join(f"{n} ({', '.join(d)})" for n, d in self.shapes)
                    given = ", ".join(f"{n} {tuple(getattr(env.get(n), 'shape', ()))}" for n, _ in self.shapes
                                      if env.get(n) is not None)
                    raise ValueError(f"{self.op}: the rules are derived for {declared}, got {given} "
                                     f"({dim} is {found[dim]} and {size})")
        return found

    def for_shapes(self, env: dict) -> "Rules":
        """The rules for the arrays of ``env``: those of the variant with the most outputs that are
        all square there (the shapes are static under tracing), else these.  With declared
        :attr:`shapes`, "square" is the derivation's: both dimensions of the output equal (and the
        arrays must fit the declared dimensions, see :meth:`dims`).  The choice depends on the
        shapes only, and is remembered per shape signature (the route is recorded every time)."""
        if not self.variants:
            return self
        try:
            torch = sys.modules.get("torch")  # (this module is library-free: the JAX side reads it too)
            if torch is not None and torch.compiler.is_compiling():  # (symbolic shapes: no memo)
                raise TypeError
            key = tuple(tuple(getattr(env.get(name), "shape", ())) for name in self._shape_names())
            hash(key)
        except TypeError:
            return self._choose(env)[1]
        memo = self.__dict__.setdefault("_memo", {})
        found = memo.get(key)
        if found is None:
            if len(memo) > 64:
                memo.clear()
            found = memo[key] = self._choose(env)
        route, rules = found
        if route is not None:
            taken(self.op, route)
        return rules

    def _shape_names(self) -> tuple:
        """The arrays whose shapes decide :meth:`for_shapes`."""
        names = self.__dict__.get("_names")
        if names is None:
            names = tuple(dict.fromkeys([n for n, _ in self.shapes] + [n for v in self.variants for n in v.square]))
            object.__setattr__(self, "_names", names)
        return names

    def _choose(self, env: dict) -> tuple:
        """``(route or None, rules)`` of :meth:`for_shapes` (raises where the shapes do not fit)."""
        dims = self.dims(env) if self.shapes else {}
        if self.shapes:
            declared = dict(self.shapes)

            def square(name):
                d = declared.get(name)
                return d is not None and len(d) == 2 and d[0] in dims and dims.get(d[0]) == dims.get(d[1])
        else:
            def square(name):
                return _square(env.get(name))

        def applies(v):
            if v.shorter and not (v.shorter[0] in dims and v.shorter[1] in dims
                                  and dims[v.shorter[0]] < dims[v.shorter[1]]):
                return False
            return all(square(name) for name in v.square)

        best = None
        for v in self.variants:
            if v.directions:
                continue
            if applies(v) and (best is None or len(v.square) + bool(v.shorter) > len(best.square) + bool(best.shorter)):
                best = v
        if best is None:
            # a choice was made where there are variants for these directions: the general rules
            return ("rules" if any(not v.directions for v in self.variants) else None), self
        parts = (("square", *best.square) if best.square else ()) + (("shorter", *best.shorter) if best.shorter else ())
        return "rules_" + "_".join(parts), self._with(best)

    def for_directions(self) -> "Rules":
        """The rules along unstructured tangents of the symmetric inputs (the general-matrix
        function's at a symmetric point); a ``LookupError`` where the derivation declares none."""
        best = next((v for v in self.variants if v.directions), None)
        if best is None:
            raise LookupError(f"{self.op}: no rules along unstructured tangents (Derivation.general_directions)")
        return self._with(best)

    def _with(self, v: Variant) -> "Rules":
        return dataclasses.replace(self, variants=(), **{f: getattr(v, f) for f in _VARIANT_CALLS
                                                         if getattr(v, f) is not None})

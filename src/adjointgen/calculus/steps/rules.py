"""The rules: the JVP as solved, its specialisations and variants, and the VJP by transposition (a part of :class:`~adjointgen.calculus.derivation.Derivation`)."""
from __future__ import annotations

import sympy as sp
from sympy.matrices.expressions import (
    HadamardProduct,
    Identity,
    MatMul,
    MatrixSymbol,
    Transpose,
    ZeroMatrix,
)

from .. import algebra
from ..algebra import expand, normalize
from ..spec import Source
from ..nodes import DiagPart, PairwiseMatrix, StrictlyLower, Sym
from ..records import Check, Equation, Gauge, Replay, Rule, ValueBlock, Variant
from .checks import (
    _adjoint_check, _adjoint_symbolic, _and, _dot_product_check, _dot_product_symbolic, _equation_check,
    _gauge_check, _gauge_symbolic, _premise, _real_only, _real_only_symbolic, _same_value_symbolic,
)


class RuleSteps:
    """The rules: the JVP as solved, its specialisations and variants, and the VJP by transposition."""

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
        from ..nodes import Skew

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



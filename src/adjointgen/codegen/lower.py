"""Lower a derivation's rules (SymPy matrix expressions) to the rule IR: the parameters of each
rule in API order, its value DAG (built by :class:`~adjointgen.codegen.dag.DagBuilder`, common
sub-expressions eliminated, matrix chains ordered), each output's source, and the operation's
pairwise functions, variants, residuals, instances and public signature (:class:`OperationIR`).
"""
from __future__ import annotations

import dataclasses
import os
import posixpath

import sympy as sp
from sympy.matrices.expressions import (
    HadamardProduct,
    Inverse,
    MatAdd,
    MatMul,
    MatrixSymbol,
    Transpose,
    ZeroMatrix,
)

from sympy.printing.str import StrPrinter

from ..calculus import algebra
from ..calculus.spec import OperationSpec, Source, as_spec
from ..calculus.nodes import DI, DJ, OperatorSolve, PairwiseMatrix
from .ir import (PAIRWISE_ROLE, BlockIR, ForwardIR, InputIR, InstanceIR, OperationIR, OutputIR, PairwiseFn, Param, PublicIR,
                 ResidualIR, RuleIR, Value, VariantIR)
from .dag import CHAIN_SIZES, EXPANDED, ORIENTED_SIZE, DagBuilder, LoweringError


class _FormulaPrinter(StrPrinter):
    """Formulas for comments and docstrings: ``∘`` for Hadamard products, ``^T`` for transposes,
    symbols renamed to their names in generated code."""

    def __init__(self, rename, complex_=False):
        super().__init__()
        self.rename = rename
        self.mark = "^H" if complex_ else "^T"

    def _print_MatrixSymbol(self, expr):
        return self.rename.get(expr.name, expr.name)

    def _print_PairwiseMatrix(self, expr):
        return expr.name

    def _print_HadamardProduct(self, expr):
        return " ∘ ".join(self.parenthesize(a, 50) for a in expr.args)

    def _print_Inverse(self, expr):
        inner = self._print(expr.arg)
        return (inner if isinstance(expr.arg, MatrixSymbol) else f"({inner})") + "^-1"

    def _print_MatPow(self, expr):
        base, exp = expr.args
        if exp == -1:
            return self._print_Inverse(Inverse(base))
        return super()._print_MatPow(expr)

    def _print_Identity(self, expr):
        return "I"

    def _print_Transpose(self, expr):
        inner = self._print(expr.arg)
        return (inner if isinstance(expr.arg, MatrixSymbol) else f"({inner})") + self.mark

    def _print_MatMul(self, expr):
        c, mats = expr.as_coeff_matrices()
        parts = [f"({self._print(m)})" if isinstance(m, (MatAdd, HadamardProduct)) else self._print(m) for m in mats]
        text = " ".join(parts)
        if c == -1:
            return "-" + text
        return text if c == 1 else f"{self._print(c)} {text}"


def formula(expr, rename, complex_=False) -> str:
    return _FormulaPrinter(rename, complex_).doprint(expr)




def _pairwise_fn(d: OperationSpec, name: str, api: dict[str, str], root=None) -> PairwiseFn:
    pdef = d.pairwise[name]
    where = Source(d.path, d.pairwise_lines.get(name), None, "").comment(root)
    expr = sp.simplify(pdef.expr)
    num, den = sp.fraction(sp.together(expr))
    if pdef.zero_on is not None and sp.sympify(pdef.diagonal_value) != 0 and sp.simplify(den.xreplace({DJ: DI})) == 0:
        raise LoweringError(f"{d.path}: {name} is zero where its denominator vanishes, which includes its "
                            f"diagonal, but {name}_ii = {pdef.diagonal_value}")
    return PairwiseFn(
        name=f"{d.name}_{name}",
        symbol=name,
        vector=api[pdef.diagonal_of],
        expr=expr,
        numerator=num,
        denominator=den,
        diagonal=pdef.diagonal_value,
        antisymmetric=pdef.is_antisymmetric,
        origin=pdef.origin,
        indicator=pdef.is_indicator,
        masked=pdef.zero_on is not None,
        broadened=(None if not pdef.zero_on else
                   num * sp.conjugate(den) / (sp.Abs(den) ** 2 + sp.Symbol("broadening", positive=True))
                   if pdef.complex_values else num * den / (den ** 2 + sp.Symbol("broadening", positive=True))),
        fused=_fused_form(num, den, pdef) if pdef.zero_on is not None else None,
        where=where,
        complex_values=pdef.complex_values,
    )


def _fused_form(num, den, pdef):
    """``(kind, a / c)`` for ``F = c / (a d_i ± a d_j)`` whose diagonal is what the fused product
    gives (0 for a difference, whose diagonal is set to inf; the formula itself for a sum)."""
    if num.free_symbols:
        return None
    try:
        poly = sp.Poly(den, DI, DJ)
    except sp.PolynomialError:
        return None
    if not (poly.is_homogeneous and poly.total_degree() == 1):
        return None
    a, b = poly.coeff_monomial(DI), poly.coeff_monomial(DJ)
    if b == -a:
        kind = "difference"
        if sp.sympify(pdef.diagonal_value) != 0:
            return None
    elif b == a:
        kind = "sum"
        if sp.simplify(pdef.expr.xreplace({DJ: DI}) - sp.sympify(pdef.diagonal_value)) != 0:
            return None
    else:
        return None
    return kind, sp.nsimplify(a / num)


def lower_derivation(d: OperationSpec, root: str, package: str = "adjointgen.generated", *,
                     label: str | None = None, _other_orientation: bool = False) -> OperationIR:
    """Build the :class:`OperationIR` of an audited derivation (its spec).  A derivation declared
    :meth:`~adjointgen.calculus.derivation.Derivation.either_orientation` gets, where the order of
    its products differs, a variant lowered with the sizes of its two dimensions exchanged."""
    d = as_spec(d)
    if d.jvp is None or d.vjp is None:
        raise LoweringError(f"{d.path}: derivation '{d.name}' has no JVP/VJP (call set_jvp and derive_vjp)")

    def name_of(path):  # as the headers name the derivation file (and its helpers, beside it)
        if label and os.path.dirname(os.path.abspath(path)) == os.path.dirname(d.path):
            return posixpath.join(posixpath.dirname(label), os.path.basename(path))
        return os.path.relpath(path, root).replace(os.sep, "/")
    api = dict(d.api_names)
    for s in d.inputs:
        api.setdefault(s.name, s.name)

    shapes = {s.name: s.shape for s in d.inputs + d.outputs}

    def kind(sym_name):
        if shapes.get(sym_name) == (1, 1):
            return "scalar"  # a 1×1 output, stored as a tensor of the batch shape
        return "diag" if sym_name in d.structure.diagonal else "matrix"

    primal = {s.name: Param(api[s.name], s.name, kind(s.name), "primal") for s in d.inputs + d.outputs}
    saves = d.forward_spec.saves if d.forward_spec is not None else ()
    factorized = {sym: (f"{api.get(sym, sym)}_LU", f"{api.get(sym, sym)}_pivots") for sym, kind in saves}
    factor_exprs = [e for pair in d.vjp_factors.values() for e in pair]
    real_jvp = d.real_jvp or d.jvp  # a complex derivation's rules read on real data
    real_vjp = d.real_vjp or d.vjp
    # a derivation whose outputs are complex for real data too (a complex diagonal: the eigenvalues
    # of a general matrix) has one set of rules, for complex data; the public function casts
    complex_only = bool(d.structure.complex and d.real_jvp is None)
    if d.real_jvp is not None:
        factor_exprs += [*real_jvp.rewritten.values(), *real_vjp.rewritten.values()]
    residuals = _residuals(d)
    for _, _, (raw, code), real in residuals:
        factor_exprs += [code] + ([real[1]] if real is not None else [])
    function_pairwise = {name for name, pdef in d.pairwise.items() if _depends_on_functions(d, pdef)}
    used_pairwise = sorted({p.name for e in [*d.jvp.rewritten.values(), *d.vjp.rewritten.values(), *factor_exprs]
                            for p in e.atoms(PairwiseMatrix)} - function_pairwise)
    pairwise = tuple(_pairwise_fn(d, p, api, name_of) for p in used_pairwise)
    pw_names = {p.symbol: p.name for p in pairwise}
    vector_of = {p.symbol: p.vector for p in pairwise}
    pw_fns = {p.symbol: p for p in pairwise}

    derived_at = {**d.sources("jvp"), **d.sources("vjp"), **d.sources("gauge")}

    def rule(kind_, exprs: dict, params: dict[str, Param], out_names: dict[str, str], formulas: dict,
             complex_=False, suffix=""):
        if EXPANDED.get():  # an oriented variant: every term a product chain the sizes order
            exprs = {k: _expanded(formulas.get(k, e)) for k, e in exprs.items()}
        taken = sorted({p.name for e in exprs.values() for p in e.atoms(PairwiseMatrix)} & function_pairwise)
        params = {**params, **{name: Param(name, name, "matrix", PAIRWISE_ROLE) for name in taken}}
        if taken:  # outputs the rule does not read are not its parameters (the values of L's vector)
            read = {x.name for e in exprs.values() for x in e.atoms(MatrixSymbol)}
            read |= {p.definition.diagonal_of for e in exprs.values() for p in e.atoms(PairwiseMatrix)
                     if p.name not in function_pairwise}
            params = {k: v for k, v in params.items() if v.role != "primal" or k in read}
        b = DagBuilder(params, pw_names, vector_of, d.structure, factorized, pw_fns,
                     {api[o.name] for o in d.outputs if o.name in d.structure.diagonal},
                     d.name if kind_ == "jvp" else None)
        rename = {sym: (f"diag({p.name})" if p.kind == "diag" else p.name) for sym, p in params.items()}
        outs = []
        for key in sorted(exprs, key=lambda k: list(out_names).index(k)):
            if isinstance(exprs[key], ZeroMatrix):  # a tangent that vanishes (the sign of a real determinant)
                ref = params.get(key[1:]) if key[:1] in ("d", "g") else None
                if ref is None:
                    raise LoweringError(f"{d.path}: {key} is zero and has no value to take its shape from")
                v = b.emit("zeros_like", [ref.name], ref.kind)
            else:
                v = b.lower(exprs[key])
            outs.append((out_names[key], v, b.kind(v)))
        values, outs = _prune(*_diagonal_products(b.values, outs))
        factor_params = tuple(Param(name, sym, kind, "factor") for sym, names in sorted(factorized.items())
                              if params.get(sym) is not None and params[sym].name in b.factors_used
                              for name, kind in zip(names, ("lu", "pivots")))
        option_params = (Param("cluster_rtol", "__cluster_rtol", "option", "option"),) if b.masks_used else ()
        option_params += (Param("broadening", "__broadening", "option", "option"),) if b.broadening_used else ()
        return RuleIR(
            name=f"{d.name}_{kind_}{suffix}",
            kind=kind_,
            params=tuple(params.values()) + factor_params + option_params,
            outputs=tuple(outs),
            values=values,
            formulas=tuple((out_names[k], formula(formulas[k], rename, complex_)) for k in sorted(formulas, key=lambda k: list(out_names).index(k))),
            expressions=tuple((out_names[k], formulas[k]) for k in sorted(formulas, key=lambda k: list(out_names).index(k))),
            complex=complex_,
            sources=tuple((out_names[k], derived_at[k].comment(name_of)) for k in sorted(formulas, key=lambda k: list(out_names).index(k))
                          if k in derived_at),
        )

    output_order = [s for s in d.outputs]
    api_order = d.api_output_order or [api[s.name] for s in output_order]
    outputs_sorted = sorted(output_order, key=lambda s: api_order.index(api[s.name]))
    all_exprs = [*d.jvp.rewritten.values(), *d.vjp.rewritten.values(), *factor_exprs]
    in_solves = {x.name for e in all_exprs for node in e.atoms(OperatorSolve) for x in node.atoms(MatrixSymbol)}
    referenced = {x.name for e in all_exprs for x in e.atoms(MatrixSymbol)}
    operator_inputs = [s for s in d.inputs if s.name in in_solves]
    input_params = [s for s in d.inputs if s.name in referenced]
    # JVP: (operator inputs,) primal outputs, input tangents -> output tangents
    jvp_params = {}
    for s in input_params:
        jvp_params[s.name] = primal[s.name]
    for s in outputs_sorted:
        jvp_params[s.name] = primal[s.name]
    for s in d.inputs:
        t = d.tangents[s.name]
        jvp_params[t.name] = Param("d" + api[s.name], t.name, kind(s.name), "tangent")
    ruled = {o.name for o in d.rule_outputs}
    jvp_out = {d.tangents[s.name].name: "d" + api[s.name] for s in outputs_sorted if s.name in ruled}
    jvp = rule("jvp", real_jvp.rewritten, jvp_params, jvp_out, real_jvp.raw, complex_only)
    # VJP: primal outputs, output cotangents -> input cotangents
    vjp_params = {}
    for s in input_params:
        vjp_params[s.name] = primal[s.name]
    for s in outputs_sorted:
        vjp_params[s.name] = primal[s.name]
    for s in outputs_sorted:
        if s.name not in ruled:
            continue
        g = d.cotangents[s.name]
        vjp_params[g.name] = Param("g" + api[s.name], g.name, kind(s.name), "cotangent")
    vjp_out = {"g" + s.name: "g" + api[s.name] for s in d.inputs}
    vjp = rule("vjp", real_vjp.rewritten, vjp_params, vjp_out, real_vjp.raw, complex_only)
    jvp_complex = vjp_complex = gauge = checked = None
    if d.real_jvp is not None:
        jvp_complex = rule("jvp", d.jvp.rewritten, jvp_params, jvp_out, d.jvp.raw, True, "_complex")
        vjp_complex = rule("vjp", d.vjp.rewritten, vjp_params, vjp_out, d.vjp.raw, True, "_complex")
    gauge_rules = []
    checked_real = None
    residuals_real, residuals_complex = [], []
    real_codes, real_raws, complex_codes, complex_raws, out_real, out_complex = {}, {}, {}, {}, {}, {}
    for gauge, res_name, (raw, code), real in residuals:
        if complex_only:
            real = (raw, code)  # the one set of rules (complex), in the slots of the real ones
        out = "residual" + gauge.suffix
        exprs_ = [code] + ([real[1]] if real else [])
        symbols = {x.name for e in exprs_ for x in e.atoms(MatrixSymbol)}
        symbols |= {x.definition.diagonal_of for e in exprs_ for x in e.atoms(PairwiseMatrix)}  # their vectors
        gauge_params = {k: v for k, v in vjp_params.items() if k in symbols}
        indicators = [p for p in code.atoms(PairwiseMatrix) if p.definition.is_indicator]
        vector = split = None
        completes = ()
        what = "eigenvalues"
        if indicators:
            diag = indicators[0].definition.diagonal_of
            vector = api[diag]
            split = "g" + vector if ("g" + diag) in vjp_params else None
            what = d.cluster_meaning.get(indicators[0].name, "eigenvalues")
            targets = d.cluster_completion.get(indicators[0].name, ())
            if targets and split is not None and all(("g" + t) in vjp_params for t in targets):
                completes = tuple(api[t] for t in targets)
        phases, invariant = ((), "") if vector is not None else _phase_wording(d, gauge, api)
        info = ResidualIR(gauge.name, out, tuple(p.name for p in gauge_params.values() if p.role == "cotangent"),
                          vector, split, what, completes, phases=phases, invariant=invariant)
        suffix = gauge.suffix
        if d.structure.complex and not complex_only:
            gauge_rules.append(rule("gauge", {res_name: code}, gauge_params, {res_name: out}, {res_name: raw}, True,
                                    suffix + ("_complex" if real is not None else "")))
            complex_codes[res_name], complex_raws[res_name], out_complex[res_name] = code, raw, out
            residuals_complex.append(info)
        if real is not None:
            gauge_rules.append(rule("gauge", {res_name: real[1]}, gauge_params, {res_name: out}, {res_name: real[0]},
                                    complex_only, suffix))
            real_codes[res_name], real_raws[res_name], out_real[res_name] = real[1], real[0], out
            residuals_real.append(dataclasses.replace(info, rule=gauge_rules[-1]) if complex_only else info)
    if complex_codes:
        # the VJP and the residuals in one function: they share U^T gU, V^T gV
        checked = rule("vjp", {**d.vjp.rewritten, **complex_codes}, vjp_params, {**vjp_out, **out_complex},
                       {**d.vjp.raw, **complex_raws}, True, "_complex_checked")
    if real_codes:
        checked_real = rule("vjp", {**real_vjp.rewritten, **real_codes}, vjp_params, {**vjp_out, **out_real},
                            {**real_vjp.raw, **real_raws}, complex_only, "_checked")
    gauge = next((r for r in gauge_rules if r.name == f"{d.name}_gauge"), None)
    variants = []
    for v in d.variants:  # the same rules where some orthonormal outputs are square
        sfx, v_jvp, v_vjp = "_" + v.name, v.real_jvp or v.jvp, v.real_vjp or v.vjp

        def square(r, v=v):
            return None if r is None else dataclasses.replace(r, square=v.square)

        variants.append(VariantIR(
            name=v.name, square=tuple(api[n] for n in v.square), directions=tuple(api[n] for n in v.directions),
            jvp=square(rule("jvp", v_jvp.rewritten, jvp_params, jvp_out, v_jvp.raw, complex_only, sfx)),
            vjp=square(rule("vjp", v_vjp.rewritten, vjp_params, vjp_out, v_vjp.raw, complex_only, sfx)),
            jvp_complex=square(rule("jvp", v.jvp.rewritten, jvp_params, jvp_out, v.jvp.raw, True, "_complex" + sfx)
                               if d.real_jvp is not None else None),
            vjp_complex=square(rule("vjp", v.vjp.rewritten, vjp_params, vjp_out, v.vjp.raw, True, "_complex" + sfx)
                               if d.real_jvp is not None else None),
            vjp_complex_checked=square(rule("vjp", {**v.vjp.rewritten, **complex_codes}, vjp_params,
                                            {**vjp_out, **out_complex}, {**v.vjp.raw, **complex_raws}, True,
                                            "_complex_checked" + sfx) if complex_codes else None),
            vjp_checked=square(rule("vjp", {**v_vjp.rewritten, **real_codes}, vjp_params, {**vjp_out, **out_real},
                                    {**v_vjp.raw, **real_raws}, complex_only, "_checked" + sfx) if real_codes else None),
        ))
    value_block = None
    for D_name, vb in sorted(d.value_blocks.items())[:1]:  # one diagonal output with clusters per operation
        t = d.tangents[D_name].name
        M = MatrixSymbol(vb.cotangent, *shapes[D_name])
        block_params = {**{k: v for k, v in jvp_params.items() if v.role != "tangent"},
                        **{k: v for k, v in jvp_params.items() if v.role == "tangent"}}
        back_params = {**{k: v for k, v in vjp_params.items() if v.role != "cotangent"},
                       vb.cotangent: Param("g" + api[D_name] + "_block", vb.cotangent, "matrix", "cotangent")}
        block_out = {t: "block"}
        back_out = {"g" + s.name: "g" + api[s.name] for s in d.inputs}
        rj, rv = vb.real_jvp or vb.jvp, vb.real_vjp or vb.vjp
        value_block = BlockIR(
            values=api[D_name], cotangent="g" + api[D_name] + "_block", inputs=tuple(api[s.name] for s in d.inputs),
            jvp=rule("block_jvp", rj.rewritten, block_params, block_out, rj.raw, complex_only),
            vjp=rule("block_vjp", rv.rewritten, back_params, back_out, rv.raw, complex_only),
            jvp_complex=(rule("block_jvp", vb.jvp.rewritten, block_params, block_out, vb.jvp.raw, True, "_complex")
                         if vb.real_jvp is not None else None),
            vjp_complex=(rule("block_vjp", vb.vjp.rewritten, back_params, back_out, vb.vjp.raw, True, "_complex")
                         if vb.real_vjp is not None else None))
        del M
    if d.orientations is not None and not _other_orientation:
        base = (jvp, vjp, checked_real, jvp_complex, vjp_complex, checked)
        rows, cols = d.orientations
        variants += _oriented_variant(d, root, package, label, base, "tall", (cols, rows))
        variants += _oriented_variant(d, root, package, label, base, "wide", (rows, cols))
    vjp_factors = None
    if d.vjp_factors:
        exprs, names = {}, {}
        for s in d.inputs:
            L, R = d.vjp_factors["g" + s.name]
            exprs[f"g{s.name}_L"], exprs[f"g{s.name}_R"] = L, R
            names[f"g{s.name}_L"], names[f"g{s.name}_R"] = f"g{api[s.name]}_left", f"g{api[s.name]}_right"
        vjp_factors = rule("vjp_factors", exprs, vjp_params, names, exprs)
    degenerate = any(p.name == "cluster_rtol" for r in (jvp, vjp, jvp_complex, vjp_complex, checked, checked_real,
                                                         *gauge_rules) if r is not None for p in r.params)
    return OperationIR(
        value_block=value_block,
        invertible=_inverted_factors(d, api),
        name=d.name,
        title=d.title,
        derivation=label or os.path.relpath(d.path, root),
        references=tuple(d.references),
        primal_inputs=tuple(primal[s.name] for s in d.inputs),
        primal_outputs=tuple(primal[s.name] for s in outputs_sorted),
        symmetric_inputs=tuple(sorted(api[n] for n in d.symmetric_inputs)),
        jvp=jvp,
        vjp=vjp,
        pairwise=pairwise,
        vjp_factors=vjp_factors,
        operator_inputs=tuple(api[s.name] for s in operator_inputs),
        forward_options=tuple(d.forward_options),
        partial_rules=bool(d.partial_rules),
        jvp_complex=jvp_complex,
        vjp_complex=vjp_complex,
        gauge=gauge,
        vjp_complex_checked=checked,
        public=_public(d, api, outputs_sorted, degeneracy=degenerate),
        gauge_rules=tuple(gauge_rules),
        vjp_checked=checked_real,
        residuals_real=tuple(residuals_real),
        residuals_complex=tuple(residuals_complex),
        cluster_vectors=tuple(sorted({p.vector for p in pairwise if p.needs_clusters})),
        instances=_instances(d),
        pairwise_params=tuple((name, api[d.pairwise[name].diagonal_of]) for name in sorted(
            {p.symbol for r in (jvp, vjp) for p in r.params if p.role == PAIRWISE_ROLE})),
        second_order=d.second is not None,
        variants=tuple(variants),
    )


def _phase_wording(d, gauge, api) -> tuple[tuple[str, ...], str]:
    """What the error of a loss that depends on the phase gauge says, from the gauge's declaration:
    the outputs whose columns it rotates (``U -> U Θ``), by API name, and the forms invariant to it
    (``|X|`` of every output it moves, ``X X^H`` of a rotated one, ``X diag(D) Y^H`` between the
    first and last rotated ones for a diagonal output ``D`` it leaves alone)."""
    theta = gauge.parameter
    outputs = {o.name: o for o in d.outputs}
    rotated = tuple(name for name, expr in gauge.directions.items()
                    if name in outputs and expr == MatMul(outputs[name], theta))
    moved = tuple(name for name, expr in gauge.directions.items() if name in outputs and expr != 0)
    forms = [f"|{api.get(n, n)}|" for n in moved] + [f"{api.get(n, n)} {api.get(n, n)}^H" for n in rotated]
    diagonal = [o.name for o in d.outputs if o.name not in gauge.directions and o.name in d.structure.diagonal]
    if rotated and diagonal:
        first, last = api.get(rotated[0], rotated[0]), api.get(rotated[-1], rotated[-1])
        forms.append(f"{first} diag({api.get(diagonal[0], diagonal[0])}) {last}^H")
    invariant = ", ".join(forms[:-1]) + (" or " if len(forms) > 1 else "") + (forms[-1] if forms else "")
    return tuple(api.get(n, n) for n in rotated), invariant


def _inverted_factors(d, api) -> tuple[tuple[str, int, str], ...]:
    """The triangular outputs the rules invert (``R^-1`` of QR, ``L^-1`` of Cholesky), by API name,
    each with its declared side (``"upper"``, ``"lower"``) and its degree in the defining identity (``A = Q R``: 1; ``A = L L^T``: 2): where a pivot
    is at the level of rounding the rules' value has no correct digits, and the dispatch refuses it
    (:func:`adjointgen.runtime.checks.invertible_factor`; the degree sets the level: a pivot of a
    factor of degree 2 carries half the input's digits)."""
    outputs = {o.name for o in d.outputs}
    found = set()
    for rule in (d.jvp, d.vjp):
        for expr in rule.raw.values():
            for node in sp.preorder_traversal(expr):
                if isinstance(node, Inverse) or (isinstance(node, sp.MatPow) and node.args[1] == -1):
                    base = node.args[0]
                    base = base.arg if isinstance(base, Transpose) else base
                    if isinstance(base, MatrixSymbol) and base.name in outputs and d.structure.triangle(base.name):
                        found.add(base.name)
    primal = {s.name for s in (*d.inputs, *d.outputs)}

    def degree(name):
        best = 1
        for step in d.steps:
            eq = step.equation
            if step.kind != "identity" or eq is None or not algebra.free_names(eq.lhs - eq.rhs) <= primal:
                continue
            for side in (eq.lhs, eq.rhs):
                for term in sp.Add.make_args(sp.expand(side)):
                    factors = term.args if isinstance(term, sp.MatMul) else (term,)
                    count = sum(1 for f in factors if getattr(f, "name", None) == name
                                or (isinstance(f, Transpose) and getattr(f.arg, "name", None) == name))
                    best = max(best, count)
        return best

    return tuple(sorted((api.get(n, n), degree(n), d.structure.triangle(n)[0]) for n in found))


def _expanded(e):
    """``e`` as a sum of products (each a chain for the sizes to order)."""
    return e.expand() if isinstance(e, sp.MatrixExpr) else e


def _oriented_variant(d, root, package, label, base, name, shorter) -> list:
    """``[VariantIR]`` of the rules for an input far from square: the derived formulas expanded
    into sums of products, each ordered for ``shorter = (small, large)`` dimensions with
    ``large = 100 small`` (so no ``large × large`` product is formed where another order avoids
    it; the collected form of the base rules forms one for one orientation), picked where
    ``small < large``.  The fields (jvp, vjp, vjp_checked, jvp_complex, vjp_complex,
    vjp_complex_checked) whose values differ from ``base``'s; ``[]`` where none does."""
    small, large = shorter
    sizes = {**CHAIN_SIZES.get(), small: ORIENTED_SIZE, large: 100 * ORIENTED_SIZE}
    tokens = CHAIN_SIZES.set(sizes), EXPANDED.set(True)
    try:
        other = lower_derivation(d, root, package, label=label, _other_orientation=True)
    finally:
        EXPANDED.reset(tokens[1])
        CHAIN_SIZES.reset(tokens[0])
    fields = ("jvp", "vjp", "vjp_checked", "jvp_complex", "vjp_complex", "vjp_complex_checked")
    found = {}
    for field, mine in zip(fields, base):
        theirs = getattr(other, field)
        if mine is not None and theirs is not None and theirs.values != mine.values:
            found[field] = dataclasses.replace(theirs, name=f"{theirs.name}_{name}")
    if not found:
        return []
    return [VariantIR(name=name, square=(), shorter=shorter, **{f: found.get(f) for f in fields})]




def _diagonal_products(values: list[Value], outs: list) -> tuple[list[Value], list]:
    """A product read only through its diagonal (``diag(V^H gV)``: a gauge residual, a
    normalisation) becomes ``diag_matmul``, ``O(n^2)`` instead of a matrix product: its ``diag``
    readers become the vector itself, ``diag(sym(.))`` its real part, ``diag(skew(.))`` its
    imaginary part."""
    readers: dict[str, list[Value]] = {}
    for v in values:
        for a in v.args:
            readers.setdefault(a, []).append(v)
    returned = {name for _, name, _ in outs}
    fused = {v.name for v in values if v.op == "matmul" and v.name not in returned and readers.get(v.name)
             and all(r.op in ("diagonal", "diag_sym", "diag_skew") for r in readers[v.name])}
    if not fused:
        return values, outs
    alias: dict[str, str] = {}
    new = []
    for v in values:
        args = tuple(alias.get(a, a) for a in v.args)
        if v.name in fused:
            new.append(Value(v.name, "diag_matmul", args, "diag", v.attrs))
        elif v.args and v.args[0] in fused and v.op == "diagonal":
            alias[v.name] = args[0]
        elif v.args and v.args[0] in fused and v.op in ("diag_sym", "diag_skew"):
            new.append(Value(v.name, "real_part" if v.op == "diag_sym" else "imaginary_part", args, "diag", v.attrs))
        else:
            new.append(Value(v.name, v.op, args, v.kind, v.attrs))
    return new, [(o, alias.get(name, name), kind) for o, name, kind in outs]


def _prune(values: list[Value], outs: list) -> tuple[tuple[Value, ...], list]:
    """Drop the values no output reads (a transpose the lowering tried and then did not use) and
    number the rest ``t0, t1, ...`` again, in order."""
    needed = {name for _, name, _ in outs}
    for v in reversed(values):
        if v.name in needed:
            needed.update(v.args)
    kept = [v for v in values if v.name in needed]
    rename = {v.name: f"t{i}" for i, v in enumerate(kept)}
    new = tuple(Value(rename[v.name], v.op, tuple(rename.get(a, a) for a in v.args), v.kind, v.attrs) for v in kept)
    return new, [(o, rename.get(name, name), kind) for o, name, kind in outs]


def _depends_on_functions(d: OperationSpec, pdef) -> bool:
    """The pairwise matrix's entries involve a scalar function the derivation is generic in."""
    names = set(d.functions)
    exprs = (sp.sympify(pdef.expr), sp.sympify(pdef.diagonal_value))
    return any(isinstance(a, sp.core.function.AppliedUndef) and a.func.__name__ in names
               for e in exprs for a in e.atoms(sp.core.function.AppliedUndef))


def instance_ir(name: str, expr, var, options=(), *, function: str = "f", second: bool = True) -> InstanceIR:
    """The :class:`InstanceIR` of ``f = expr`` (in ``var``, with the option symbols ``options``):
    its scalar program (:mod:`adjointgen.codegen.scalar`)."""
    from .scalar import compile_function

    options = tuple(options)
    program = compile_function(expr, var, tuple(sym for _, sym in options), text=sp.sstr(expr))
    return InstanceIR(name=name, function=function, expr=expr, variable=var, options=options, program=program,
                      second=second)


def _instances(d: OperationSpec) -> tuple[InstanceIR, ...]:
    """The derivation's concrete functions (:meth:`Derivation.instantiate`)."""
    out = []
    for name, (functions, options) in sorted(d.instantiations.items()):
        (fname, fn), = functions.items()
        out.append(instance_ir(name, fn.expr, fn.variables[0], options, function=fname, second=d.second is not None))
    return tuple(out)


def _residuals(d: OperationSpec):
    """(gauge, residual name, (raw, code), (real raw, real code) or None) of every gauge; the
    real specialisation is ``None`` where the residual vanishes on real data (the phases)."""
    from ..calculus import algebra

    out = []
    for g in d.gauges:
        rule_ = d.gauge_rules.get(g.name)
        if rule_ is None:
            continue
        (name, raw), = rule_.raw.items()
        code = rule_.rewritten[name]
        real = None
        if d.structure.complex_diagonal:
            pass  # complex for real data too: no real specialisation
        elif d.structure.complex:
            structure = d.structure.real()
            real_raw = algebra.normalize(raw, structure)
            if algebra.expand(real_raw, structure):
                real = (real_raw, algebra.simplify_for_codegen(real_raw, structure))
        else:
            real = (raw, code)
        out.append((g, name, (raw, code), real))
    return out


def _public(d: OperationSpec, api: dict, outputs_sorted, degeneracy: bool = False) -> PublicIR | None:
    """The forward and the checked public function, from the declared forward and structure."""
    spec = d.forward_spec
    if spec is None:
        return None

    def ref(r):
        return None if r is None else ForwardIR(r.module, r.attr, r.xp, host=spec.host, runtime=r.runtime)

    def dims_of(sym):
        return tuple(sp.sstr(x) for x in sym.shape)

    inputs = []
    for s in d.inputs:
        rows, cols = dims_of(s)
        symmetric = s.name in d.symmetric_inputs
        pd = s.name in d.positive_definite_inputs
        what = ("symmetric (Hermitian) positive definite" if pd else "symmetric (Hermitian)") if d.field == "complex" and symmetric else (
            "symmetric positive definite" if pd else ("symmetric" if symmetric else ""))
        triangle = "lower" if s.name in d.structure.lower else ("upper" if s.name in d.structure.upper else "")
        if triangle:
            what = f"{triangle} triangular (the other triangle is not read)"
        inputs.append(InputIR(api[s.name], (rows, cols), rows == cols, symmetric,
                              pd and "positive_definite" not in spec.checked,
                              f"{what + ' ' if what else ''}``(..., {rows}, {cols})`` matrices".strip(), triangle))
    axes: dict[str, list] = {}
    for s in d.inputs:
        for axis, dim in zip((-2, -1), dims_of(s)):
            axes.setdefault(dim, []).append((api[s.name], axis))
    # sizes that must agree across inputs (square inputs are checked as such)
    dims = tuple((dim, tuple(pairs)) for dim, pairs in sorted(axes.items()) if len({n for n, _ in pairs}) > 1)
    outputs = []
    for s in outputs_sorted:
        public, form = d.public_forms.get(s.name, (api[s.name], None))
        flags = (s.name in d.constant_outputs, s.name in d.hidden_outputs, s.name in d.auxiliary_outputs)
        if s.shape == (1, 1):
            outputs.append(OutputIR(api[s.name], public, "scalar", (), *flags))
        elif s.name in d.structure.diagonal:
            outputs.append(OutputIR(api[s.name], public, "vector", (dims_of(s)[0],), *flags))
        elif form == "adjoint":
            outputs.append(OutputIR(api[s.name], public, "adjoint", tuple(reversed(dims_of(s))), *flags))
        else:
            outputs.append(OutputIR(api[s.name], public, "matrix", dims_of(s), *flags))
    ext = d.extension
    extension = {}
    if ext is not None:
        import inspect

        doc = inspect.getdoc(ext.function.resolve()) or ""
        extension = dict(extension=ForwardIR(ext.function.module, ext.function.attr),
                         extension_options=tuple((k, repr(v)) for k, v in ext.options), extension_doc=doc)
    return PublicIR(
        **extension,
        torch_forward=ref(spec.numpy if spec.host else spec.torch),
        numpy_forward=ref(spec.numpy),
        options=tuple((k, repr(v)) for k, v in spec.options),
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        dims=dims,
        complex=d.field == "complex",
        checked_by_forward=spec.checked,
        saved_factors=tuple((f"{api.get(sym, sym)}_LU", f"{api.get(sym, sym)}_pivots") for sym, _ in spec.saves),
        degeneracy=degeneracy,
    )

"""The steps that solve for an unknown: linear, off-diagonal, Hadamard, shifted, Sylvester, triangular and operator solves, and the second-order rule (a part of :class:`~adjointgen.calculus.derivation.Derivation`)."""
from __future__ import annotations

import sympy as sp
from sympy.matrices.expressions import (
    HadamardProduct,
    Identity,
    MatAdd,
    MatMul,
    MatrixSymbol,
    Transpose,
    ZeroMatrix,
)

from .. import algebra
from ..algebra import expand
from ..nodes import DI, DJ, DiagFunction, DiagPart, OperatorSolve, PairwiseMatrix, ShiftedSolve, StrictlyLower, Sym, SylvesterSolve, TriangularSylvesterSolve
from ..records import Check, Equation, Replay, SecondOrder
from .checks import _equation_check, _follows, _same_value_symbolic


class Solves:
    """The steps that solve for an unknown: linear, off-diagonal, Hadamard, shifted, Sylvester, triangular and operator solves, and the second-order rule."""

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
            from ..evaluate import real_derivatives

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


"""The steps that split an equation into parts: Hadamard splits, diagonal, triangular and (anti-)Hermitian parts, gauges (a part of :class:`~adjointgen.calculus.derivation.Derivation`)."""
from __future__ import annotations

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

from .. import algebra
from ..algebra import expand
from ..nodes import DI, DJ, DiagFunction, DiagPart, LowerHalf, PairwiseMatrix, StrictlyLower, Sym
from ..records import Equation, Gauge, Replay
from .checks import _equation_check, _explicit, _follows, _premise


class Projections:
    """The steps that split an equation into parts: Hadamard splits, diagonal, triangular and (anti-)Hermitian parts, gauges."""

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
        from ..nodes import Skew

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


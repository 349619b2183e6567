"""Identities and the steps that transform both sides alike: differentiate, multiply, transpose, substitute, introduce and use definitions (a part of :class:`~adjointgen.calculus.derivation.Derivation`)."""
from __future__ import annotations

from sympy.matrices.expressions import (
    Inverse,
    MatMul,
    MatrixSymbol,
    Transpose,
    ZeroMatrix,
)

from .. import algebra
from ..algebra import DerivationError, expand
from ..nodes import DiagPart, StrictlyLower
from ..records import Equation, Replay
from .checks import _equation_check, _follows, _premise, _real_diagonal_factor


class Identities:
    """Identities and the steps that transform both sides alike: differentiate, multiply, transpose, substitute, introduce and use definitions."""

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


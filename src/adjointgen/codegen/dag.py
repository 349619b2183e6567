"""The value DAG of one rule: :class:`DagBuilder` turns a derived SymPy matrix expression into
:class:`~adjointgen.codegen.ir.Value` nodes.

Common sub-expressions are eliminated by hash-consing: structurally equal sub-trees map to one
value.  Matrix chains are ordered by the classic dynamic program on representative sizes of the
dimension symbols, so ``A (U X)`` is preferred to ``(A U) X`` when ``U`` is tall.  A node of the
engine's own lowers by its ``lower_rule`` (:mod:`adjointgen.calculus.nodes`), SymPy's nodes here.
"""
from __future__ import annotations

import contextvars

import sympy as sp
from sympy.matrices.expressions import (
    HadamardProduct,
    Identity,
    Inverse,
    MatAdd,
    MatMul,
    MatrixSymbol,
    Transpose,
)


from ..calculus.nodes import EngineNode, PairwiseMatrix, ScalarIdentity, Skew, Sym
from .ir import (Param, Value)

#: sizes used only to choose the order of matrix chains
REPRESENTATIVE_SIZES = {"n": 1000, "m": 1200, "k": 16, "p": 16}
#: the smaller dimension of a derivation declared ``either_orientation`` (the larger: 100 times it)
ORIENTED_SIZE = 100
#: lower the derived formulas expanded (sums of products) rather than in their collected form
EXPANDED: contextvars.ContextVar = contextvars.ContextVar("adjointgen_expanded", default=False)
#: the sizes in force (the representative ones, or those of the other orientation while the
#: variant of ``Derivation.either_orientation`` is lowered)
CHAIN_SIZES: contextvars.ContextVar = contextvars.ContextVar("adjointgen_chain_sizes", default=REPRESENTATIVE_SIZES)



class LoweringError(Exception):
    pass


class _Inverse:
    """A factor ``M^-1`` of a product, kept unevaluated: the product applies it by a solve."""

    def __init__(self, value: str, structure: str, factor: tuple[str, str] | None = None, adjoint: bool = False):
        self.value = value  # the value holding M (for a saved factorization: A itself)
        self.structure = structure  # "lower", "upper", "unit_lower", ... (triangular solves) or "general"
        self.factor = factor  # (LU, pivots) parameter names of a factorization of A the forward saved
        self.adjoint = adjoint  # M = A^T (A^H): solve with the adjoint of the factorization


class DagBuilder:
    def __init__(self, params: dict[str, Param], pairwise_names: dict[str, str], vector_of: dict[str, str],
                 structure=None, factorized: dict | None = None, pairwise_fns: dict | None = None,
                 output_vectors: set | None = None, tangent_of: str | None = None):
        self.params = params  # symbol name -> Param
        #: a JVP rule's operation name: its masked quotients check that the tangent does not split a
        #: cluster (:func:`adjointgen.runtime.degeneracy.check_tangent`); None for other rules
        self.tangent_of = tangent_of
        self.pairwise_names = pairwise_names  # pairwise symbol -> function name
        self.vector_of = vector_of  # pairwise symbol -> param name of its diagonal vector
        self.structure = structure  # the derivation's declared structure (triangular factors)
        self.factorized = factorized or {}  # input symbol -> (LU, pivots) parameter names
        self.factors_used: set[str] = set()
        self.pairwise_fns = pairwise_fns or {}  # pairwise symbol -> PairwiseFn
        self.output_vectors = output_vectors or set()  # diagonal outputs, stored as vectors
        self.masks_used: set[str] = set()  # vectors whose cluster masks the rule takes
        self.broadening_used = False
        self.values: list[Value] = []
        self.by_key: dict[tuple, str] = {}

    def triangle(self, e) -> str:
        """``lower``/``upper`` for a declared triangular symbol (or its transpose), else ``general``."""
        st = self.structure
        if st is None:
            return "general"
        flip = isinstance(e, Transpose)
        sym = e.arg if flip else e
        if not isinstance(sym, MatrixSymbol) or st.triangle(sym.name) is None:
            return "general"
        side, diagonal = st.triangle(sym.name)
        if flip:
            side = {"lower": "upper", "upper": "lower"}[side]
        return ("unit_" if diagonal == "unit" else "") + side

    def emit(self, op, args, kind, attrs=()):
        key = (op, tuple(args), kind, tuple(attrs))
        if key in self.by_key:
            return self.by_key[key]
        name = f"t{len(self.values)}"
        self.values.append(Value(name, op, tuple(args), kind, tuple(attrs)))
        self.by_key[key] = name
        return name

    def is_output_vector(self, name) -> bool:
        """``name`` is a diagonal output of the operation (singular values, eigenvalues)."""
        return name in self.output_vectors

    def kind(self, name):
        if name == "None":
            return "none"
        for p in self.params.values():
            if p.name == name:
                return p.kind
        for v in self.values:
            if v.name == name:
                return v.kind
        raise KeyError(name)

    # -------------------------------------------------------------- expression -> value name
    def fail(self, message: str):
        """Stop the lowering (for the nodes' own ``_lower`` rules)."""
        raise LoweringError(message)

    def lower(self, e) -> str:
        if isinstance(e, PairwiseMatrix):
            raise LoweringError(f"pairwise matrix {e.name} must appear inside a Hadamard product")
        if isinstance(e, EngineNode):  # the engine's own nodes carry their rule (calculus/nodes/)
            return e.lower_rule(self)
        if isinstance(e, MatrixSymbol):
            if e.name not in self.params:
                raise LoweringError(f"symbol {e.name} is not a parameter of the rule")
            return self.params[e.name].name
        if isinstance(e, MatAdd):
            return self.lower_sum(e)
        if isinstance(e, MatMul):
            c, mats = e.as_coeff_matrices()
            mats = [m for m in mats if not isinstance(m, Identity)]
            mats = [_merged_scalar_identity(m) for m in mats]
            scalars = [m for m in mats if isinstance(m, ScalarIdentity)]  # g I: a multiplication by g
            mats = [m for m in mats if not isinstance(m, ScalarIdentity)]
            if not mats:
                raise LoweringError(f"a multiple of the identity alone has no shape to take: {e}")
            if c != 1 and len(mats) > 1:
                # the coefficient scales the smallest partial product (-(A^-T gX) X^T: n p entries,
                # not n^2), which stays shared with the other rules that use it unscaled
                out = self.chain(mats, coeff=c)
                c = sp.Integer(1)
            else:
                out = self.chain(mats)
            for m in scalars:
                g = self.lower(m.arg)
                if self.kind(g) != "scalar":
                    raise LoweringError(f"the factor {m.arg} of {m} is not a scalar")
                out = self.emit("scale_by" if self.kind(out) == "matrix" else "scale_by_vector", [g, out], self.kind(out))
            if c != 1:
                out = self.emit("scale", [out], self.kind(out), [("coeff", sp.sstr(c))])
            return out
        if isinstance(e, Transpose):
            inner = self.lower(e.arg)
            if self.kind(inner) == "diag":
                return inner
            if self.kind(inner) == "scalar":  # a 1×1 value: its conjugate (itself for real data)
                return self.emit("conj", [inner], "scalar")
            return self.emit("transpose", [inner], "matrix")
        if isinstance(e, HadamardProduct):
            pw = [a for a in e.args if isinstance(a, PairwiseMatrix)]
            other = [a for a in e.args if not isinstance(a, PairwiseMatrix)]
            if len(pw) != 1 or len(other) != 1:
                raise LoweringError(f"unsupported Hadamard product {e}")
            if pw[0].name in self.params:  # a pairwise matrix the rule takes as a value
                return self.emit("hadamard", [self.params[pw[0].name].name, self.lower(other[0])], "matrix")
            fn = self.pairwise_names[pw[0].name]
            vec = self.vector_of[pw[0].name]
            if pw[0].definition.conjugate_of is not None:  # conj(F) = F of conj(d)
                vec = self.emit("conj", [vec], "diag")
            x = other[0]
            options = []  # (keyword of the pairwise function, the rule's parameter passed to it)
            pf = self.pairwise_fns.get(pw[0].name)
            if pf is not None and pf.needs_clusters:
                self.masks_used.add(pf.vector)
                options.append(("rtol", "cluster_rtol"))
                if pf.masked:
                    self.broadening_used = True
                    options.append(("broadening", "broadening"))
                    if self.tangent_of is not None:
                        options.append(("tangent", repr(self.tangent_of)))
            attrs = [("fn", fn), ("options", tuple(options))]
            if isinstance(x, MatAdd):  # F ∘ (Σ c_i skew(X_i)) = F ∘ skew(Σ c_i X_i): one projection
                terms = [a.as_coeff_matrices() if isinstance(a, MatMul) else (sp.Integer(1), [a]) for a in x.args]
                for node in (Skew, Sym):
                    if all(len(ms) == 1 and isinstance(ms[0], node) for _, ms in terms):
                        x = node(MatAdd(*[MatMul(c, ms[0].arg) if c != 1 else ms[0].arg for c, ms in terms]))
                        break
            if isinstance(x, Skew):
                return self.emit("pairwise_mul_skew", [vec, self.lower(x.arg)], "matrix", attrs)
            if isinstance(x, Sym):
                return self.emit("pairwise_mul_sym", [vec, self.lower(x.arg)], "matrix", attrs)
            return self.emit("pairwise_mul", [vec, self.lower(x)], "matrix", attrs)
        if isinstance(e, Inverse) or (isinstance(e, sp.MatPow) and e.args[1] == -1):
            base = e.args[0]
            sym = base.arg if isinstance(base, Transpose) else base
            if isinstance(sym, MatrixSymbol) and sym.name in self.factorized:  # the inverse from the saved LU
                a = self.lower(sym)
                self.factors_used.add(a)
                inverse = self.emit("inverse_lu", [a, *self.factorized[sym.name]], "matrix")
                # A^-T = (A^-1)^T: a transposed view, and LAPACK's non-transposed solve is the faster
                return self.emit("transpose", [inverse], "matrix") if isinstance(base, Transpose) else inverse
            inner = self.lower(e.args[0])
            if self.kind(inner) == "diag":
                if self.is_output_vector(inner):  # singular values may vanish: 1/s is taken as 0 there
                    self.masks_used.add(inner)
                    return self.emit("reciprocal_masked", [inner], "diag")
                return self.emit("reciprocal", [inner], "diag")
            # an inverse on its own (not a factor of a product, where it becomes a solve)
            return self.emit("inverse", [inner], "matrix", [("structure", self.triangle(e.args[0]))])
        if isinstance(e, sp.MatPow) and e.args[1].is_Integer and e.args[1] > 0:
            return self.chain([e.args[0]] * int(e.args[1]))
        raise LoweringError(f"cannot lower {type(e).__name__}: {e}")

    def lower_sum(self, e) -> str:
        """A sum; identity terms ``c I`` become one ``+ c I`` (no identity matrix is formed)."""
        eye = sp.Integer(0)
        rest = []
        for a in e.args:
            c, mats = a.as_coeff_matrices() if isinstance(a, MatMul) else (sp.Integer(1), [a])
            if all(isinstance(m, Identity) for m in mats):
                eye += c
            else:
                rest.append(a)
        names = []
        for a in rest:
            c = a.as_coeff_matrices()[0] if isinstance(a, MatMul) else sp.Integer(1)
            if c.is_negative:  # subtracted, not negated first
                pos = self.lower(-a)
                names.append(self.emit("scale", [pos], self.kind(pos), [("coeff", "-1")]))
            else:
                names.append(self.lower(a))
        out = self.add(names) if rest else None
        if eye == 0:
            return out
        if out is None:
            raise LoweringError(f"a multiple of the identity alone has no shape to take: {e}")
        return self.emit("add_eye", [out], self.kind(out), [("coeff", sp.sstr(eye))])

    def add(self, names):
        scalars = sorted(n for n in names if self.kind(n) == "scalar")
        if scalars:
            if len(scalars) != len(names):
                raise LoweringError(f"a sum of scalars and matrices: {names}")
            return scalars[0] if len(scalars) == 1 else self.emit("add", scalars, "scalar")
        mats = sorted(n for n in names if self.kind(n) == "matrix")
        diags = sorted(n for n in names if self.kind(n) == "diag")
        out = None
        if mats:
            out = mats[0] if len(mats) == 1 else self.signed_sum(mats, "matrix")
        if diags:
            d = diags[0] if len(diags) == 1 else self.signed_sum(diags, "diag")
            out = d if out is None else self.emit("add_diag", [out, d], "matrix")
        return out

    def signed_sum(self, names, kind):
        """``a + b - c``: a negated term is subtracted, not negated first (one pass fewer each)."""
        terms = []
        for n in names:
            v = next((v for v in self.values if v.name == n), None)
            if v is not None and v.op == "scale" and v.attr("coeff") == "-1":
                terms.append((v.args[0], "-"))
            else:
                terms.append((n, "+"))
        if all(sign == "+" for _, sign in terms):
            return self.emit("add", names, kind)
        terms.sort(key=lambda t: t[1] == "-")  # a positive term first
        return self.emit("add", [n for n, _ in terms], kind, [("signs", "".join(sign for _, sign in terms))])

    def mul2(self, a, b):
        if isinstance(a, _Inverse) and isinstance(b, _Inverse):
            raise LoweringError("a product of two inverses should have been ordered around another factor")
        for inv in (a, b):
            if isinstance(inv, _Inverse) and inv.factor is not None:
                self.factors_used.add(inv.value)
        if isinstance(a, _Inverse) and a.factor is not None:  # A^-1 b through the saved LU factors
            return self.emit("solve_lu", [a.value, *a.factor, b], "matrix", [("adjoint", str(a.adjoint))])
        if isinstance(b, _Inverse) and b.factor is not None:  # a A^-1 = (A^-H a^H)^H
            return self.emit("solve_right_lu", [a, b.value, *b.factor], "matrix", [("adjoint", str(b.adjoint))])
        if isinstance(a, _Inverse):  # M^-1 b: a solve
            return self.emit("solve", [a.value, b], "matrix", [("structure", a.structure)])
        if isinstance(b, _Inverse):  # a M^-1: a solve from the right
            return self.emit("solve_right", [a, b.value], "matrix", [("structure", b.structure)])
        ka, kb = self.kind(a), self.kind(b)
        if ka == "scalar" and kb == "scalar":
            return self.emit("scalar_mul", [a, b], "scalar")
        if ka == "diag" and kb == "diag":
            return self.emit("diag_mul", [a, b], "diag")
        if ka == "diag":
            return self.emit("scale_rows", [a, b], "matrix")
        if kb == "diag":
            return self.emit("scale_cols", [a, b], "matrix")
        # (b^T a^T)^T: a product whose transpose is already computed is read transposed (Q^T gQ
        # and gQ^T Q in one rule cost one product)
        aT, bT = self.transpose_name(a), self.transpose_name(b)
        key = ("matmul", (bT, aT), "matrix", ())
        if aT is not None and bT is not None and key in self.by_key and ("matmul", (a, b), "matrix", ()) not in self.by_key:
            return self.emit("transpose", [self.by_key[key]], "matrix")
        return self.emit("matmul", [a, b], "matrix")

    def transpose_name(self, name):
        """The value (or parameter) holding ``name^T`` if one exists, else ``None``."""
        for v in self.values:
            if v.op == "transpose" and v.name == name:
                return v.args[0]
            if v.op == "transpose" and v.args[0] == name:
                return v.name
        return None

    def saved_factor(self, e):
        """``(value, (LU, pivots), adjoint)`` where ``e`` is an input the forward saved a
        factorization of (``d.forward(saves={"A": "lu"})``), or its (conjugate) transpose; else
        ``None``.  A node that can use the factorization (a solve, the adjugate) reads it from the
        rule's factor parameters."""
        flip = isinstance(e, Transpose)
        sym = e.arg if flip else e
        if not (isinstance(sym, MatrixSymbol) and sym.name in self.factorized):
            return None
        value = self.lower(sym)
        self.factors_used.add(value)
        return value, self.factorized[sym.name], flip

    def operand(self, m):
        """A factor of a product: its value, or an unevaluated inverse applied later by a solve."""
        if isinstance(m, Inverse) or (isinstance(m, sp.MatPow) and m.args[1] == -1):
            base = m.args[0]
            flip = isinstance(base, Transpose)
            sym = base.arg if flip else base
            if isinstance(sym, MatrixSymbol) and sym.name in self.factorized:
                return _Inverse(self.lower(sym), "lu", self.factorized[sym.name], adjoint=flip)
            inner = self.lower(m.args[0])
            if self.kind(inner) != "diag":
                return _Inverse(inner, self.triangle(m.args[0]))
        return self.lower(m)

    def chain(self, mats, coeff=1):
        """The product of ``mats`` in the cheapest order; a coefficient other than 1 multiplies the
        partial product with the fewest entries."""
        names = [self.operand(m) for m in mats]
        if len(names) == 1:
            return names[0] if not isinstance(names[0], _Inverse) else self.lower(mats[0])
        sizes = [_size(m.shape[0]) for m in mats] + [_size(mats[-1].shape[1])]
        kinds = ["inverse" if isinstance(n, _Inverse) else self.kind(n) for n in names]
        n = len(names)
        cost = [[0.0] * n for _ in range(n)]
        split = [[0] * n for _ in range(n)]
        for length in range(2, n + 1):
            for i in range(n - length + 1):
                j = i + length - 1
                best = None
                for k in range(i, j):
                    if (i == k and kinds[i] == "inverse") and (k + 1 == j and kinds[j] == "inverse"):
                        continue  # M^-1 N^-1 is applied to a third factor, never formed
                    # a diagonal factor costs an elementwise scaling, not a product
                    c = cost[i][k] + cost[k + 1][j]
                    left_diag = i == k and kinds[i] == "diag"
                    right_diag = k + 1 == j and kinds[j] == "diag"
                    c += sizes[i] * sizes[j + 1] if (left_diag or right_diag) else sizes[i] * sizes[k + 1] * sizes[j + 1]
                    if best is None or c < best[0]:
                        best = (c, k)
                cost[i][j], split[i][j] = best if best is not None else (float("inf"), i)

        def subtrees(i, j):
            yield i, j
            if i != j:
                k = split[i][j]
                yield from subtrees(i, k)
                yield from subtrees(k + 1, j)

        scaled = None
        if coeff != 1:
            def entries(i, j):
                rows, cols = sizes[i], sizes[j + 1]
                return rows if (i == j and kinds[i] == "diag") else rows * cols

            scaled = min((ij for ij in subtrees(0, n - 1) if not (ij[0] == ij[1] and kinds[ij[0]] == "inverse")),
                         key=lambda ij: (entries(*ij), ij))

        def build(i, j):
            out = names[i] if i == j else self.mul2(build(i, split[i][j]), build(split[i][j] + 1, j))
            if (i, j) == scaled:
                out = self.emit("scale", [out], self.kind(out), [("coeff", sp.sstr(coeff))])
            return out

        return build(0, n - 1)


def _size(dim) -> int:
    dim = sp.sympify(dim)
    sizes = CHAIN_SIZES.get()
    return int(dim.xreplace({s: sizes.get(s.name, 100) for s in dim.free_symbols}))


def _merged_scalar_identity(m):
    """``g I + h I`` (a factor the rewriting for code gathered) as ``(g + h) I``."""
    if not isinstance(m, MatAdd):
        return m
    parts = []
    for a in m.args:
        c, ms = a.as_coeff_matrices() if isinstance(a, MatMul) else (sp.Integer(1), [a])
        if len(ms) != 1 or not isinstance(ms[0], ScalarIdentity):
            return m
        parts.append(MatMul(c, ms[0].arg) if c != 1 else ms[0].arg)
    return ScalarIdentity(MatAdd(*parts), m.shape[0])

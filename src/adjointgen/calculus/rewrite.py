"""Rewrite rules for generated code: factor common outer factors, move projections inwards, merge
solves, Hadamard products and projections, and share one solve between a rule's terms.

They change the form of a rule, never its value (the lowering's verification checks the generated
functions against the audited expression)."""
from __future__ import annotations

from collections import Counter

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

from .algebra import ALGEBRA, LINEAR_NODES, Term, _key, _monomial, build, collect, expand, hermiticity, normalize
from .nodes import DiagPart, LowerHalf, OperatorSolve, PairwiseMatrix, Skew, StrictlyLower, Structure, Sym


def factor_common(terms: list[Term], shape, structure: Structure):
    """Pull shared leading/trailing factors out of a sum: ``L X1 R + L X2 R -> L (X1 + X2) R``.

    Greedy: the factor shared by the most terms first; deterministic tie-break by name.
    """
    terms = merge_projections(merge_hadamard(merge_solves(terms, structure), structure), structure)
    terms = absorb_into_right_inverse(terms)
    if len(terms) <= 1:
        return _factor_inside(build(terms, shape), structure)
    best = None
    for side in ("left", "right"):
        counts = Counter(
            _key(fs[0] if side == "left" else fs[-1]) for _, fs in terms if len(fs) >= 2
        )
        for k, cnt in sorted(counts.items()):
            if cnt >= 2 and (best is None or cnt > best[0]):
                best = (cnt, side, k)
    if best is None:
        parts = [_factor_inside(_monomial(c, fs), structure) for c, fs in terms]
        return MatAdd(*parts)
    _, side, k = best
    shared = [(c, fs) for c, fs in terms if len(fs) >= 2 and _key(fs[0] if side == "left" else fs[-1]) == k]
    rest = [t for t in terms if t not in shared]
    factor = shared[0][1][0] if side == "left" else shared[0][1][-1]
    inner_terms = [(c, fs[1:] if side == "left" else fs[:-1]) for c, fs in shared]
    inner_shape = (factor.shape[1], shape[1]) if side == "left" else (shape[0], factor.shape[0])
    inner = factor_common(inner_terms, inner_shape, structure)
    grouped = MatMul(factor, inner) if side == "left" else MatMul(inner, factor)
    if not rest:
        return grouped
    return MatAdd(grouped, factor_common(rest, shape, structure))


def absorb_into_right_inverse(terms: list[Term]) -> list[Term]:
    """``Σ_i X_i M^-1 + Y Z -> (Σ_i X_i + Y (Z M)) M^-1`` when ``Z M`` (or its transpose) is a product
    the sum computes anyway: one solve with ``M`` instead of two, and no new product (the reduced
    QR's VJP: ``Q gR + (...) R^-T`` becomes ``(Q gR R^T + ...) R^-T``, ``gR R^T`` being the transpose
    of the ``R gR^T`` inside it).  The trailing inverse shared by the most terms (at least two) is
    the one; a term is absorbed only when its product is found, so nothing costs more."""
    counts = Counter(_key(fs[-1]) for _, fs in terms if fs and isinstance(fs[-1], Inverse))
    if not counts:
        return terms
    key, count = max(sorted(counts.items()), key=lambda kv: kv[1])
    if count < 2 or count == len(terms):
        return terms
    inverse = next(fs[-1] for _, fs in terms if fs and _key(fs[-1]) == key)
    M = inverse.arg
    present = {_key(node) for _, fs in terms for f in fs for node in sp.preorder_traversal(f) if isinstance(node, MatMul)}
    out = []
    for c, fs in terms:
        if fs and _key(fs[-1]) != key and fs[-1].shape[1] == M.shape[0]:
            product = MatMul(fs[-1], M)
            transposed = MatMul(*(Transpose(a).doit() if not isinstance(a, Transpose) else a.arg
                                  for a in reversed(product.args)))
            if _key(product) in present or _key(transposed) in present:
                out.append((c, (*fs, M, inverse)))
                continue
        out.append((c, fs))
    return out


def _factor_inside(expr, structure):
    """Apply :func:`factor_common` inside linear nodes of a monomial."""
    if isinstance(expr, MatMul):
        c, mats = expr.as_coeff_matrices()
        return MatMul(c, *[_factor_inside(m, structure) for m in mats]) if c != 1 else MatMul(*[_factor_inside(m, structure) for m in mats])
    if isinstance(expr, LINEAR_NODES):
        return type(expr)(factor_common(expand(expr.arg, structure), expr.shape, structure))
    if isinstance(expr, OperatorSolve):
        return expr.with_arg(factor_common(expand(expr.arg, structure), expr.shape, structure))
    if isinstance(expr, HadamardProduct):
        consts = [a for a in expr.args if isinstance(a, PairwiseMatrix)]
        other = [a for a in expr.args if not isinstance(a, PairwiseMatrix)][0]
        return HadamardProduct(*consts, factor_common(expand(other, structure), other.shape, structure))
    return expr


def push_projection_inward(expr, structure: Structure):
    """Rewrite rules that move ``sym``/``skew`` towards the leaves:

    * ``sym(L X L^T) = L sym(X) L^T`` and ``skew(L X L^T) = L skew(X) L^T``;
    * ``sym(X + Y) = sym(X) + sym(Y)``; ``sym(c X) = c sym(X)``;
    * ``sym(F ∘ X) = F ∘ skew(X)`` for antisymmetric ``F`` (and ``F ∘ sym(X)`` for symmetric);
    * ``sym(X) = X`` for symmetric ``X`` (diagonal symbols, ``diag(.)``).
    """
    if isinstance(expr, MatAdd):
        return MatAdd(*[push_projection_inward(a, structure) for a in expr.args])
    if isinstance(expr, MatMul):
        c, mats = expr.as_coeff_matrices()
        args = [push_projection_inward(m, structure) for m in mats]
        return MatMul(c, *args) if c != 1 else MatMul(*args)
    if isinstance(expr, HadamardProduct):
        return HadamardProduct(*[push_projection_inward(a, structure) for a in expr.args])
    if isinstance(expr, (Sym, Skew)):
        node = type(expr)
        inner = expr.arg
        if isinstance(inner, MatAdd):
            return MatAdd(*[push_projection_inward(node(a), structure) for a in inner.args])
        if isinstance(inner, MatMul):
            c, mats = inner.as_coeff_matrices()
            if c != 1:
                return MatMul(c, push_projection_inward(node(MatMul(*mats) if len(mats) > 1 else mats[0]), structure))
            if len(mats) >= 3 and normalize(Transpose(mats[0]), structure) == normalize(mats[-1], structure):
                middle = MatMul(*mats[1:-1]) if len(mats) > 3 else mats[1]
                return MatMul(mats[0], push_projection_inward(node(middle), structure), mats[-1])
        if isinstance(inner, HadamardProduct):
            pw = [a for a in inner.args if isinstance(a, PairwiseMatrix)]
            other = [a for a in inner.args if not isinstance(a, PairwiseMatrix)]
            if len(pw) == 1 and len(other) == 1:
                d = pw[0].definition
                if d.is_antisymmetric:
                    flip = Skew if node is Sym else Sym
                    return HadamardProduct(pw[0], push_projection_inward(flip(other[0]), structure))
                if d.is_symmetric:
                    return HadamardProduct(pw[0], push_projection_inward(node(other[0]), structure))
        parity = hermiticity(inner, structure) if isinstance(inner, DiagPart) else (
            1 if isinstance(inner, MatrixSymbol) and structure.is_symmetric(inner.name) else None)
        if parity is not None:
            return inner if (parity == 1) == (node is Sym) else ZeroMatrix(*inner.shape)
        return node(push_projection_inward(inner, structure))
    if isinstance(expr, (DiagPart,)):
        if structure.complex and isinstance(expr.arg, (Sym, Skew)):
            # diag(sym(X)) is the real part of diag(X): kept, so code makes it a real vector
            return DiagPart(type(expr.arg)(push_projection_inward(expr.arg.arg, structure)))
        return DiagPart(push_projection_inward(expr.arg, structure))
    if isinstance(expr, OperatorSolve):
        return expr.with_arg(push_projection_inward(expr.arg, structure))
    return expr


def merge_solves(terms: list[Term], structure: Structure | None = None) -> list[Term]:
    """``c1 S(X) + c2 S(Y) = S(c1 X + c2 Y)`` for solves with the same operator: one solve."""
    groups: dict[str, list] = {}
    rest = []
    for c, fs in terms:
        if len(fs) == 1 and isinstance(fs[0], OperatorSolve):
            key = "N" + type(fs[0]).__name__ + _key(sp.Tuple(*fs[0].operator))
            groups.setdefault(key, []).append((c, fs[0]))
        elif len(fs) == 1 and isinstance(fs[0], Transpose) and isinstance(fs[0].arg, OperatorSolve):
            key = "T" + type(fs[0].arg).__name__ + _key(sp.Tuple(*fs[0].arg.operator))  # c1 S(X)^T + c2 S(Y)^T = S(c1 X + c2 Y)^T
            groups.setdefault(key, []).append((c, fs[0].arg))
        else:
            rest.append((c, fs))
    for key in sorted(groups):
        items = groups[key]
        node = items[0][1]
        wrap = Transpose if key.startswith("T") else (lambda x: x)
        if len(items) == 1:
            rest.append((items[0][0], (wrap(node),)))
            continue
        inner = MatAdd(*[MatMul(c, n.arg) for c, n in items])
        if structure is not None:  # one normal form, so that equal solves are shared
            inner = normalize(inner, structure)
        rest.append((sp.Integer(1), (wrap(node.with_arg(inner)),)))
    return rest


def merge_hadamard(terms: list[Term], structure: Structure) -> list[Term]:
    """``c1 F ∘ X + c2 F ∘ Y = F ∘ (c1 X + c2 Y)``; inside, ``Y - Y^T = 2 skew(Y)`` and
    ``Y + Y^T = 2 sym(Y)``, so the fused kernels see one projection."""
    groups: dict[str, list] = {}
    rest = []
    for c, fs in terms:
        if len(fs) == 1 and isinstance(fs[0], HadamardProduct):
            pw = [a for a in fs[0].args if isinstance(a, PairwiseMatrix)]
            other = [a for a in fs[0].args if not isinstance(a, PairwiseMatrix)]
            if len(pw) == 1 and len(other) == 1:
                groups.setdefault(pw[0].name, []).append((c, pw[0], other[0]))
                continue
        rest.append((c, fs))
    for name in sorted(groups):
        items = groups[name]
        if len(items) == 1:
            c, F, X = items[0]
            rest.append((c, (HadamardProduct(F, X),)))
            continue
        inner = collect([(c * c2, fs2) for c, _, X in items for c2, fs2 in expand(X, structure)])
        inner = _pair_transposes(inner, structure)
        rest.append((sp.Integer(1), (HadamardProduct(items[0][1], build(inner, items[0][2].shape)),)))
    return rest


def merge_projections(terms: list[Term], structure: Structure) -> list[Term]:
    """``c1 N(X) + c2 N(Y) = N(c1 X + c2 Y)`` for the triangular projections ``N`` (``Φ``,
    ``tril₋``): one projection of a sum, so generated code makes one pass."""
    groups: dict[str, list] = {}
    rest = []
    for c, fs in terms:
        if len(fs) == 1 and isinstance(fs[0], (LowerHalf, StrictlyLower)):
            groups.setdefault(type(fs[0]).__name__, []).append((c, fs[0]))
        else:
            rest.append((c, fs))
    for key in sorted(groups):
        items = groups[key]
        if len(items) == 1:
            rest.append((items[0][0], (items[0][1],)))
            continue
        node = type(items[0][1])
        inner = collect([(c * c2, fs2) for c, n in items for c2, fs2 in expand(n.arg, structure)])
        rest.append((sp.Integer(1), (node(build(inner, items[0][1].shape)),)))
    return rest


def _pair_transposes(terms: list[Term], structure: Structure) -> list[Term]:
    out, used = [], set()
    keys = ["*".join(_key(f) for f in fs) for _, fs in terms]
    for i, (c, fs) in enumerate(terms):
        if i in used:
            continue
        t = expand(Transpose(_monomial(sp.Integer(1), fs)), structure)
        match = None
        if len(t) == 1:
            tc, tfs = t[0]
            tk = "*".join(_key(f) for f in tfs)
            for j in range(i + 1, len(terms)):
                if j not in used and keys[j] == tk and terms[j][0] in (-c * tc, c * tc):
                    match = j
                    break
        if match is None:
            out.append((c, fs))
            continue
        used.add(match)
        node = Skew if terms[match][0] == -c * t[0][0] else Sym
        out.append((2 * c, (node(_monomial(sp.Integer(1), fs)),)))
    return out


def simplify_for_codegen(expr, structure: Structure):
    """Merge solves, factor shared outer factors, move projections inward, factor again; then give
    every solve its canonical argument (:func:`share_solves`)."""
    current = factor_common(merge_hadamard(merge_solves(expand(expr, structure), structure), structure), expr.shape, structure)
    for _ in range(8):
        nxt = push_projection_inward(current, structure)
        nxt = _drop_zero(nxt)
        if _key(nxt) == _key(current):
            break
        current = nxt
    return share_solves(factor_common(merge_hadamard(merge_solves(expand(current, structure), structure), structure),
                                      expr.shape, structure), structure)


def _self_transposed(node: OperatorSolve, structure: Structure) -> bool:
    """Whether the operator of ``node`` is its own transpose: ``S(X)^T = S(X^T)`` (the node's
    transpose rule gives the same operator: ``Syl[A, B]`` with ``B = A^T``, the Lyapunov operator
    and ``Syl[P, P]`` of a symmetric ``P``; ``L_exp[A]`` of a symmetric ``A``)."""
    try:
        (c, fs), = node.transpose_rule(ALGEBRA, structure)
    except ValueError:
        return False
    if c != 1 or len(fs) != 1 or type(fs[0]) is not type(node):
        return False
    mine = tuple(normalize(a, structure) if isinstance(a, sp.MatrixExpr) else a for a in node.operator)
    theirs = tuple(normalize(a, structure) if isinstance(a, sp.MatrixExpr) else a for a in fs[0].operator)
    return mine == theirs


def share_solves(expr, structure: Structure):
    """Every operator solve ``S(C)`` in its canonical form, so that solves of one operator whose
    arguments differ only by sign, or (an operator that is its own transpose) by transposition,
    become one solve the lowering shares: of ``S(C)``, ``-S(-C)``, ``S(C^T)^T`` and
    ``-S(-C^T)^T`` (all equal, ``S`` linear) the one whose argument leads with a positive
    coefficient and has the least normal form.  The Lyapunov VJP's ``Syl[A^H, A](gX)`` and
    ``Syl[A^H, A](gX^H)`` become one solve and its transpose, the polar JVP's
    ``Syl[P, P](U^H dA - dA^H U)`` and ``Syl[P, P](dA^H U - U^H dA)`` one solve and its negative."""
    if isinstance(expr, OperatorSolve):
        inner = share_solves(expr.arg, structure)
        options = [(expand(inner, structure), False)]
        if _self_transposed(expr, structure):
            options.append((expand(Transpose(inner), structure), True))
        best = None
        for terms, transposed in options:
            if not terms:
                return ZeroMatrix(*expr.shape)
            negative = terms[0][0].could_extract_minus_sign()
            terms = [(-c, fs) for c, fs in terms] if negative else terms
            key = (_key(build(terms, expr.arg.shape)), transposed)
            if best is None or key < best[0]:
                best = (key, terms, transposed, negative)
        _, terms, transposed, negative = best
        node = expr.with_arg(factor_common(terms, expr.arg.shape, structure))
        node = Transpose(node) if transposed else node
        return MatMul(-1, node) if negative else node
    if isinstance(expr, MatAdd):
        return MatAdd(*[share_solves(a, structure) for a in expr.args])
    if isinstance(expr, MatMul):
        c, mats = expr.as_coeff_matrices()
        mats = [share_solves(m, structure) for m in mats]
        return MatMul(c, *mats) if c != 1 else (MatMul(*mats) if len(mats) > 1 else mats[0])
    if isinstance(expr, Transpose):
        return Transpose(share_solves(expr.arg, structure))
    if isinstance(expr, LINEAR_NODES):
        return type(expr)(share_solves(expr.arg, structure))
    if isinstance(expr, HadamardProduct):
        return HadamardProduct(*[share_solves(a, structure) for a in expr.args])
    return expr


def _drop_zero(expr):
    if isinstance(expr, MatAdd):
        args = [_drop_zero(a) for a in expr.args if not isinstance(a, ZeroMatrix)]
        args = [a for a in args if not isinstance(a, ZeroMatrix)]
        if not args:
            return ZeroMatrix(*expr.shape)
        return args[0] if len(args) == 1 else MatAdd(*args)
    if isinstance(expr, MatMul):
        c, mats = expr.as_coeff_matrices()
        mats = [_drop_zero(m) for m in mats]
        if any(isinstance(m, ZeroMatrix) for m in mats):
            return ZeroMatrix(*expr.shape)
        return MatMul(c, *mats) if c != 1 else MatMul(*mats)
    if isinstance(expr, LINEAR_NODES):
        inner = _drop_zero(expr.arg)
        return ZeroMatrix(*expr.shape) if isinstance(inner, ZeroMatrix) else type(expr)(inner)
    if isinstance(expr, OperatorSolve):
        inner = _drop_zero(expr.arg)
        return ZeroMatrix(*expr.shape) if isinstance(inner, ZeroMatrix) else expr.with_arg(inner)
    if isinstance(expr, HadamardProduct):
        args = [_drop_zero(a) for a in expr.args]
        if any(isinstance(a, ZeroMatrix) for a in args):
            return ZeroMatrix(*expr.shape)
        return HadamardProduct(*args)
    return expr

"""Normal forms, the differential operator, substitution, transposition and rewrite rules.

Everything here works on SymPy matrix expressions.  The central normal form is a *term list*:
a sum of ``coefficient * F1 * F2 * ... * Fp`` where each factor is an *atom* -- a symbol, its
transpose, an inverse, or one of the linear nodes (``DiagPart``, ``Sym``, ``Skew``,
``HadamardProduct``) applied to an expression that is itself in normal form.  Declared structure
is applied while normalising: ``A^T -> A`` for symmetric ``A``, ``X^T -> -X`` for skew ``X``,
``diag(D) -> D`` for diagonal ``D``, ``diag(S) -> 0`` for skew ``S``.
"""
from __future__ import annotations

from itertools import product as cartesian
from types import SimpleNamespace
from typing import Callable, Iterable

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

from .nodes import (conjugate, DiagFunction, DiagPart, EngineNode, LowerHalf, PairwiseMatrix, ScalarIdentity, OperatorSolve, Skew, StrictlyLower,
                    Structure, Sym)

Term = tuple  # (coefficient: sp.Expr, factors: tuple[MatrixExpr, ...])

LINEAR_NODES = (DiagPart, Sym, Skew, LowerHalf, StrictlyLower)


class DerivationError(Exception):
    """A step could not be carried out (pattern not found, expression not linear, ...)."""


# --------------------------------------------------------------------------------------------
# normal form
# --------------------------------------------------------------------------------------------
def _key(expr) -> str:
    return sp.srepr(expr)


def _is_zero_matrix(expr) -> bool:
    return isinstance(expr, ZeroMatrix)


def transpose_atom(atom, structure: Structure) -> list[Term]:
    """Transpose of one atom, as a term list (a skew atom transposes to minus itself)."""
    if isinstance(atom, PairwiseMatrix) and atom.definition.complex_values:
        # F^H = conj(F^T): -conj(F) when F_ji = -F_ij, conj(F) when F_ji = F_ij
        d = atom.definition
        if d.is_antisymmetric or d.is_symmetric:
            return [(sp.Integer(-1 if d.is_antisymmetric else 1), (conjugate(atom),))]
        return [(sp.Integer(1), (Transpose(atom),))]
    if isinstance(atom, PairwiseMatrix):
        t = atom._eval_transpose()
        if t is None:
            return [(sp.Integer(1), (Transpose(atom),))]
        c, f = (sp.Integer(-1), -t) if t != atom else (sp.Integer(1), atom)
        return [(c, (f,))]
    if isinstance(atom, MatrixSymbol):
        if structure.is_symmetric(atom.name):
            return [(sp.Integer(1), (atom,))]
        if atom.name in structure.skew:
            return [(sp.Integer(-1), (atom,))]
        return [(sp.Integer(1), (Transpose(atom),))]
    if isinstance(atom, Transpose):
        return [(sp.Integer(1), (atom.arg,))]
    if isinstance(atom, EngineNode):  # the node's own rule
        return atom.transpose_rule(ALGEBRA, structure)
    if isinstance(atom, Identity):
        return [(sp.Integer(1), (atom,))]
    if isinstance(atom, Inverse):
        inner = normalize(Transpose(atom.arg), structure)
        return [(sp.Integer(1), (Inverse(inner),))]
    if isinstance(atom, HadamardProduct):
        coeff, args = sp.Integer(1), []
        for a in atom.args:
            if isinstance(a, PairwiseMatrix):
                (c, (t,)), = transpose_atom(a, structure)
                if isinstance(t, Transpose):
                    raise DerivationError(f"pairwise matrix {a.name} is neither symmetric nor antisymmetric")
                coeff, args = coeff * c, args + [t]
            else:
                args.append(Transpose(a))
        return [(coeff * c, fs) for c, fs in expand(HadamardProduct(*args), structure)]
    return [(sp.Integer(1), (Transpose(atom),))]


def is_diagonal_factor(f, structure: Structure) -> bool:
    """A factor known to be a diagonal matrix (diagonal matrices commute)."""
    if isinstance(f, (Identity, DiagPart, DiagFunction, ScalarIdentity)):
        return True
    if isinstance(f, Inverse):
        f = f.arg
    if isinstance(f, Transpose) and isinstance(f.arg, MatrixSymbol) and f.arg.name in structure.complex_diagonal:
        f = f.arg  # D^H = conj(D) of a complex diagonal D
    return isinstance(f, MatrixSymbol) and not isinstance(f, PairwiseMatrix) and f.name in structure.diagonal


def hermiticity(f, structure: Structure) -> int | None:
    """For a diagonal factor: ``+1`` if it is real (Hermitian), ``-1`` if imaginary
    (anti-Hermitian), ``None`` if unknown.  Every diagonal factor is real in a real derivation."""
    if isinstance(f, (Identity, DiagFunction)):
        return 1
    if isinstance(f, ScalarIdentity):  # g I is as Hermitian as the 1×1 g
        if not structure.complex:
            return 1
        g = f.arg
        if isinstance(g, Sym) or (isinstance(g, MatrixSymbol) and structure.is_symmetric(g.name)):
            return 1
        if isinstance(g, Skew) or (isinstance(g, MatrixSymbol) and g.name in structure.skew):
            return -1
        return None
    if isinstance(f, Inverse):
        f = f.arg
    if isinstance(f, Transpose) and isinstance(f.arg, MatrixSymbol) and f.arg.name in structure.diagonal:
        f = f.arg  # conj(D) is as Hermitian as D
    if isinstance(f, MatrixSymbol) and f.name in structure.complex_diagonal:
        return None
    if isinstance(f, MatrixSymbol) and f.name in structure.diagonal:
        return -1 if f.name in structure.skew else 1
    if isinstance(f, DiagPart):
        if not structure.complex:
            return 1
        a = f.arg
        if isinstance(a, Sym):
            return 1
        if isinstance(a, Skew):
            return -1
        if isinstance(a, MatrixSymbol):
            if structure.is_symmetric(a.name) or a.name in structure.real_diagonal:
                return 1
            if a.name in structure.skew:
                return -1
    return None


def _factor_triangle(f, structure: Structure):
    """``(side, diagonal)`` of one factor: side ``lower``/``upper``/``diag``, diagonal
    ``unit``/``zero``/``general``; ``None`` when the factor is not known to be triangular."""
    if isinstance(f, Identity):
        return ("diag", "unit")
    if is_diagonal_factor(f, structure):
        return ("diag", "general")
    if isinstance(f, Inverse):
        t = _factor_triangle(f.arg, structure)
        return t if t is not None and t[1] != "zero" else None  # the inverse keeps side and unit diagonal
    if isinstance(f, Transpose) and isinstance(f.arg, MatrixSymbol):
        t = structure.triangle(f.arg.name)
        return None if t is None else ({"lower": "upper", "upper": "lower"}[t[0]], t[1])
    if isinstance(f, MatrixSymbol) and not isinstance(f, PairwiseMatrix):
        return structure.triangle(f.name)
    return None


def triangle_of(fs, structure: Structure):
    """``(side, diagonal)`` of a product of triangular factors (lower times lower is lower, its
    diagonal the product of the diagonals), or ``None``."""
    if not (structure.lower or structure.upper):
        return None
    sides, diags = set(), []
    for f in fs:
        t = _factor_triangle(f, structure)
        if t is None:
            return None
        sides.add(t[0])
        diags.append(t[1])
    sides.discard("diag")
    if len(sides) > 1:
        return None
    side = sides.pop() if sides else "diag"
    diag = "zero" if "zero" in diags else ("unit" if all(x == "unit" for x in diags) else "general")
    return side, diag


def _diagonal_of_product(fs, structure: Structure) -> list[Term]:
    """``diag(F1 ... Fp) = diag(F1) ... diag(Fp)`` for a triangular product (one side)."""
    parts = []
    for f in fs:
        if isinstance(f, Identity) or is_diagonal_factor(f, structure):
            parts.append([(sp.Integer(1), (f,))])
        elif isinstance(f, Inverse):
            parts.append(expand(Inverse(build(_linear_node(DiagPart, expand(f.arg, structure), f.shape, structure),
                                              f.shape)), structure))
        else:
            parts.append(_linear_node(DiagPart, [(sp.Integer(1), (f,))], f.shape, structure))
    return [(c, _commute_diagonals(g, structure)) for c, g in _product(parts)]


def _product_hermiticity(fs, structure: Structure) -> int | None:
    """``±1`` when ``fs`` is a product of diagonal factors of known hermiticity."""
    sign = 1
    for f in fs:
        h = hermiticity(f, structure) if is_diagonal_factor(f, structure) else None
        if h is None:
            return None
        sign *= h
    return sign


def _commute_diagonals(fs: tuple, structure: Structure) -> tuple:
    """Complex derivations: sort each run of adjacent diagonal factors (they commute) and cancel
    ``M M^-1`` inside it, so that ``S diag(X)`` and ``diag(X) S`` have one normal form."""
    if not structure.complex or len(fs) < 2:
        return fs
    out: list = []
    run: list = []

    def flush():
        items = [f for f in run if not isinstance(f, Identity)]
        i = 0
        while i < len(items):
            partner = items[i].arg if isinstance(items[i], Inverse) else Inverse(items[i])
            j = next((j for j in range(i + 1, len(items)) if items[j] == partner), None)
            if j is None:
                i += 1
                continue
            items.pop(j)
            items.pop(i)
        out.extend(sorted(items, key=_key))
        run.clear()

    for f in fs:
        if is_diagonal_factor(f, structure):
            run.append(f)
        else:
            flush()
            out.append(f)
    flush()
    return tuple(out) if out else (Identity(fs[0].shape[0]),)


def _product(term_lists: list[list[Term]]) -> list[Term]:
    out: list[Term] = []
    for combo in cartesian(*term_lists):
        coeff = sp.Integer(1)
        factors: list = []
        for c, fs in combo:
            coeff = coeff * c
            factors.extend(fs)
        if len(factors) > 1:
            factors = [f for f in factors if not isinstance(f, Identity)] or [factors[0]]
        out.append((coeff, _cancel_inverses(tuple(factors))))
    return out


def _inverse_factors(f) -> tuple | None:
    """The factors ``(P1, ..., Pk)`` of ``M`` for ``f = M^-1`` with ``M`` a product (``(P,)`` for
    an atom), or ``None`` when ``f`` is not an inverse."""
    if not isinstance(f, Inverse):
        return None
    if isinstance(f.arg, MatMul):
        c, mats = f.arg.as_coeff_matrices()
        return tuple(mats) if c == 1 else None
    return (f.arg,)


def _cancel_inverses(factors: tuple) -> tuple:
    """``M M^-1 = M^-1 M = I`` for adjacent factors, also for a product ``M = P1 ... Pk`` next to
    its factors (``(A^T W A)^-1 A^T W A = I``)."""
    out: list = []
    for f in factors:
        out.append(f)
        while out:
            last = out[-1]
            done = False
            inv = _inverse_factors(last)
            if inv is not None and len(out) > len(inv) and tuple(out[-1 - len(inv):-1]) == inv:
                del out[-1 - len(inv):]  # P1 ... Pk (P1 ... Pk)^-1
                done = True
            else:
                for j in range(len(out) - 1, -1, -1):  # (P1 ... Pk)^-1 P1 ... Pk
                    inv = _inverse_factors(out[j])
                    if inv is not None and tuple(out[j + 1:]) == inv:
                        del out[j:]
                        done = True
                        break
            if not done:
                break
    return tuple(out) if out else (Identity(factors[0].shape[0]),)


def collect(terms: Iterable[Term]) -> list[Term]:
    """Merge equal monomials, drop zero coefficients, sort deterministically."""
    acc: dict[str, list] = {}
    for c, fs in terms:
        k = "*".join(_key(f) for f in fs)
        if k in acc:
            acc[k][0] = acc[k][0] + c
        else:
            acc[k] = [c, fs]
    out = [(sp.nsimplify(sp.expand(c)), fs) for c, fs in acc.values()]
    out = [(c, fs) for c, fs in out if c != 0]
    out.sort(key=lambda t: "*".join(str(f) for f in t[1]))
    return out


def _sum_inverse(f) -> bool:
    return isinstance(f, Inverse) and isinstance(f.arg, MatAdd)


def _cancel_sum_inverses(terms: list[Term], structure: Structure) -> list[Term]:
    """``S^-1 S R = R`` and ``L S S^-1 = L`` for a sum ``S``, after distribution.

    Products with a single matrix (``M^-1 M``) cancel while the factors are multiplied; the inverse
    of a sum meets the sum only term by term: ``S^-1 X1 R + S^-1 X2 R`` with ``S = X1 + X2``.  A
    group of terms that spells out ``c S^-1 S R`` exactly (every term of ``S``, the same ``c`` and
    ``R``) is replaced by ``c R``; nothing else changes."""
    if not any(fs and (_sum_inverse(fs[0]) or _sum_inverse(fs[-1])) for _, fs in terms):
        return terms
    for side in ("left", "right"):
        changed = True
        while changed:
            changed = False
            table = {tuple(_key(f) for f in fs): (c, fs) for c, fs in terms}
            for c, fs in terms:
                inv = fs[0] if side == "left" else fs[-1]
                if len(fs) < 2 or not _sum_inverse(inv):
                    continue
                rest = fs[1:] if side == "left" else fs[:-1]
                s_terms = [(cs, tuple(g for g in gs if not isinstance(g, Identity))) for cs, gs in
                           expand(inv.arg, structure)]
                found = None
                for cs, gs in s_terms:
                    n = len(gs)
                    if (rest[:n] if side == "left" else rest[len(rest) - n:]) != gs:
                        continue
                    R = rest[n:] if side == "left" else rest[:len(rest) - n]
                    k = c / cs
                    group = []
                    for cs2, gs2 in s_terms:
                        full = (inv, *gs2, *R) if side == "left" else (*R, *gs2, inv)
                        hit = table.get(tuple(_key(f) for f in full))
                        if hit is None or sp.simplify(hit[0] - k * cs2) != 0:
                            break
                        group.append(tuple(_key(f) for f in full))
                    else:
                        found = (k, R, set(group))
                        break
                if found is None:
                    continue
                k, R, group = found
                kept = [(c2, fs2) for c2, fs2 in terms if tuple(_key(f) for f in fs2) not in group]
                terms = collect(kept + [(k, R if R else (Identity(inv.shape[0]),))])
                changed = True
                break
    return terms


def _linear_node(node_type, inner_terms: list[Term], shape, structure: Structure) -> list[Term]:
    """Apply a linear node to a term list, distributing over the sum and pulling out scalars."""
    if tuple(shape) == (1, 1) and node_type in (Sym, Skew, DiagPart) and not structure.complex:
        # a real 1×1 value is its own transpose and diagonal: sym(x) = diag(x) = x, skew(x) = 0
        return [] if node_type is Skew else collect(inner_terms)
    out: list[Term] = []
    for c, fs in inner_terms:
        inner = _monomial(sp.Integer(1), fs)
        tri = triangle_of(fs, structure) if node_type in (DiagPart, LowerHalf, StrictlyLower) else None
        if tri is not None and tri[0] != "diag":
            side, diag = tri
            if node_type is DiagPart:
                if diag == "zero":
                    continue
                if diag == "unit":
                    out.append((c, (Identity(shape[0]),)))
                    continue
                if len(fs) > 1:
                    out.extend((c * c2, fs2) for c2, fs2 in _diagonal_of_product(fs, structure))
                    continue
            elif node_type is LowerHalf:  # Φ(X) = X - diag(X)/2 (lower X), diag(X)/2 (upper X)
                if side == "lower":
                    out.append((c, fs))
                    out.extend((-c * c2 / 2, fs2) for c2, fs2 in _linear_node(DiagPart, [(sp.Integer(1), fs)], shape, structure))
                else:
                    out.extend((c * c2 / 2, fs2) for c2, fs2 in _linear_node(DiagPart, [(sp.Integer(1), fs)], shape, structure))
                continue
            else:  # tril₋(X) = X - diag(X) (lower X), 0 (upper X)
                if side == "lower":
                    out.append((c, fs))
                    out.extend((-c * c2, fs2) for c2, fs2 in _linear_node(DiagPart, [(sp.Integer(1), fs)], shape, structure))
                continue
        if tri is not None and node_type in (LowerHalf, StrictlyLower):  # a diagonal product
            if node_type is LowerHalf:
                out.append((c / 2, fs))
            continue
        if node_type is DiagPart:
            if len(fs) == 1 and isinstance(fs[0], Transpose) and (
                    not structure.complex or (isinstance(fs[0].arg, MatrixSymbol)
                                              and fs[0].arg.name in structure.real_diagonal)):
                fs = (fs[0].arg,)  # diag(X^T) = diag(X) (real data, or a real diagonal)
                inner = fs[0]
            if len(fs) == 1 and isinstance(fs[0], MatrixSymbol):
                if fs[0].name in structure.diagonal:
                    out.append((c, fs))
                    continue
                if fs[0].name in structure.skew and not structure.complex:
                    continue
            if len(fs) == 1 and isinstance(fs[0], (Sym, Skew)) and not structure.complex:
                if isinstance(fs[0], Skew):
                    continue  # a real skew matrix has a zero diagonal
                out.extend((c * c2, fs2) for c2, fs2 in _linear_node(DiagPart, expand(fs[0].arg, structure), shape, structure))
                continue  # diag(sym(X)) = diag(X)
            if len(fs) == 1 and isinstance(fs[0], DiagPart):
                out.append((c, fs))
                continue
            if len(fs) == 1 and isinstance(fs[0], Identity):
                out.append((c, fs))
                continue
            is_diag = [isinstance(f, MatrixSymbol) and f.name in structure.diagonal or isinstance(f, DiagPart)
                       or (isinstance(f, Inverse) and isinstance(f.arg, MatrixSymbol) and f.arg.name in structure.diagonal)
                       for f in fs]
            if all(is_diag):
                out.append((c, fs))  # product of diagonal matrices is diagonal
                continue
            others = [f for f, dg in zip(fs, is_diag) if not dg]
            if (len(others) == 1 and isinstance(others[0], MatrixSymbol) and others[0].name in structure.skew
                    and not structure.complex):
                continue  # diag(D1 X D2) = D1 diag(X) D2 = 0 for skew X
            if structure.complex and (is_diag[0] or is_diag[-1]):
                # diag(D1 X D2) = D1 diag(X) D2
                i0 = is_diag.index(False)
                i1 = len(fs) - is_diag[::-1].index(False)
                middle = _linear_node(DiagPart, [(sp.Integer(1), fs[i0:i1])], shape, structure)
                out.extend((c * c2, _commute_diagonals(fs[:i0] + fs2 + fs[i1:], structure)) for c2, fs2 in middle)
                continue
            if len(fs) == 1 and isinstance(fs[0], HadamardProduct):
                pw = [a for a in fs[0].args if isinstance(a, PairwiseMatrix)]
                if pw and pw[0].definition.diagonal_value == 0:
                    continue
        if node_type in (Sym, Skew):
            parity = _product_hermiticity(fs, structure)
            if parity is not None:  # a real or an imaginary diagonal
                if (parity == 1) == (node_type is Sym):
                    out.append((c, fs))
                continue
            unknown = [i for i, f in enumerate(fs) if not is_diagonal_factor(f, structure)
                       or hermiticity(f, structure) is None]
            if len(unknown) == 1 and isinstance(fs[unknown[0]], DiagPart) and all(is_diagonal_factor(f, structure) for f in fs):
                # K diag(Y) with K real (p = 1) or imaginary (p = -1) diagonal:
                # sym(K diag(Y)) = K diag(sym(Y)) (p = 1) or K diag(skew(Y)) (p = -1); skew likewise
                j = unknown[0]
                p = _product_hermiticity(fs[:j] + fs[j + 1:], structure)
                inner_node = node_type if p == 1 else (Skew if node_type is Sym else Sym)
                inner_terms = _linear_node(inner_node, expand(fs[j].arg, structure), shape, structure)
                for c2, fs2 in _linear_node(DiagPart, inner_terms, shape, structure):
                    out.append((c * c2, _commute_diagonals(fs[:j] + fs2 + fs[j + 1:], structure)))
                continue
        if node_type is Sym and len(fs) == 1 and isinstance(fs[0], MatrixSymbol):
            if structure.is_symmetric(fs[0].name):
                out.append((c, fs))
                continue
            if fs[0].name in structure.skew:
                continue
        if node_type is Skew and len(fs) == 1 and isinstance(fs[0], MatrixSymbol):
            if fs[0].name in structure.skew:
                out.append((c, fs))
                continue
            if structure.is_symmetric(fs[0].name):
                continue
        if node_type in (Sym, Skew) and structure.complex:
            # sym(X^H) = sym(X), skew(X^H) = -skew(X): one orientation of the pair (the smaller key), so
            # that sym(X) and sym(X^H) collect
            t = expand(Transpose(inner), structure)

            def rank(factors):  # fewer transposes (and conjugates) first, then the key
                text = "*".join(_key(f) for f in factors)
                return text.count("Transpose") + text.count("conj"), text

            if len(t) == 1 and rank(t[0][1]) < rank(fs):
                c2, fs2 = t[0]
                c = c * c2 if node_type is Sym else -c * c2
                inner = _monomial(sp.Integer(1), fs2)
        out.append((c, (node_type(inner),)))
    return collect(out)


def _monomial(c, fs):
    if len(fs) == 1 and c == 1:
        return fs[0]
    return MatMul(c, *fs) if c != 1 else MatMul(*fs)


def expand(expr, structure: Structure) -> list[Term]:
    """The term list (normal form) of ``expr``."""
    if isinstance(expr, ZeroMatrix):
        return []
    if isinstance(expr, MatAdd):
        return _cancel_sum_inverses(collect([t for a in expr.args for t in expand(a, structure)]), structure)
    if isinstance(expr, MatMul):
        coeff, mats = expr.as_coeff_matrices()
        parts = [expand(m, structure) for m in mats]
        return _cancel_sum_inverses(
            collect((coeff * c, _commute_diagonals(fs, structure)) for c, fs in _product(parts)), structure)
    if isinstance(expr, sp.MatPow):
        base, exp = expr.args
        if exp == -1:
            return [(sp.Integer(1), (Inverse(build(expand(base, structure), base.shape)),))]
        if exp.is_Integer and exp > 0:
            return expand(MatMul(*([base] * int(exp))), structure)
        raise DerivationError(f"unsupported matrix power {expr}")
    if isinstance(expr, Transpose):
        inner = expand(expr.arg, structure)
        out = []
        for c, fs in inner:
            parts = [transpose_atom(f, structure) for f in reversed(fs)]
            out.extend((c * c2, _commute_diagonals(fs2, structure)) for c2, fs2 in _product(parts))
        return collect(out)
    if isinstance(expr, EngineNode):  # the node's own rule
        return expr.expand_rule(ALGEBRA, structure)
    if isinstance(expr, HadamardProduct):
        consts = [a for a in expr.args if isinstance(a, PairwiseMatrix)]
        others = [a for a in expr.args if not isinstance(a, PairwiseMatrix)]
        if len(others) != 1:
            raise DerivationError(
                f"Hadamard product {expr} must have exactly one non-pairwise factor"
            )
        out = []
        for c, fs in expand(others[0], structure):
            inner = _monomial(sp.Integer(1), fs)
            out.append((c, (HadamardProduct(*consts, inner),)))
        return collect(out)
    if isinstance(expr, Inverse):
        return [(sp.Integer(1), (Inverse(build(expand(expr.arg, structure), expr.shape)),))]
    if isinstance(expr, (MatrixSymbol, Identity)):
        return [(sp.Integer(1), (expr,))]
    raise DerivationError(f"cannot normalise {type(expr).__name__}: {expr}")


def build(terms: list[Term], shape) -> sp.MatrixExpr:
    """Matrix expression from a term list."""
    if not terms:
        return ZeroMatrix(*shape)
    parts = [_monomial(c, fs) for c, fs in terms]
    return parts[0] if len(parts) == 1 else MatAdd(*parts)


def normalize(expr, structure: Structure) -> sp.MatrixExpr:
    """``expr`` rebuilt from its term list."""
    return build(expand(expr, structure), expr.shape)


def is_zero(expr, structure: Structure) -> bool:
    return not expand(expr, structure)


def free_names(expr) -> set[str]:
    """Names of all matrix symbols in ``expr`` (pairwise matrices included)."""
    return {s.name for s in expr.atoms(MatrixSymbol)}


# --------------------------------------------------------------------------------------------
# differential
# --------------------------------------------------------------------------------------------
def differential(expr, tangent: Callable[[MatrixSymbol], sp.MatrixExpr | None]):
    """``d(expr)``: the product, transpose, inverse and Hadamard rules of SymPy's nodes here; the
    engine's own nodes (:mod:`adjointgen.calculus.nodes`) carry theirs (``_differential``).

    ``tangent(X)`` returns the tangent symbol of ``X`` or ``None`` when ``X`` is constant.
    """
    shape = expr.shape
    if isinstance(expr, (Identity, ZeroMatrix)):
        return ZeroMatrix(*shape)
    if isinstance(expr, PairwiseMatrix):
        raise DerivationError(f"differential of pairwise matrix {expr.name} is not derived")
    if isinstance(expr, EngineNode):  # the engine's own nodes carry their rule (calculus/nodes/)
        return expr.differential_rule(lambda e: differential(e, tangent))
    if isinstance(expr, MatrixSymbol):
        t = tangent(expr)
        return ZeroMatrix(*shape) if t is None else t
    if isinstance(expr, MatAdd):
        return MatAdd(*[differential(a, tangent) for a in expr.args]).doit()
    if isinstance(expr, MatMul):
        coeff, mats = expr.as_coeff_matrices()
        terms = []
        for i, m in enumerate(mats):
            dm = differential(m, tangent)
            if isinstance(dm, ZeroMatrix):
                continue
            terms.append(MatMul(coeff, *mats[:i], dm, *mats[i + 1:]))
        return MatAdd(*terms).doit() if terms else ZeroMatrix(*shape)
    if isinstance(expr, Transpose):
        return Transpose(differential(expr.arg, tangent))
    if isinstance(expr, (Inverse, sp.MatPow)) and (
        isinstance(expr, Inverse) or expr.args[1] == -1
    ):
        inv = expr
        dm = differential(expr.args[0], tangent)
        if isinstance(dm, ZeroMatrix):
            return ZeroMatrix(*shape)
        return MatMul(-1, inv, dm, inv)
    if isinstance(expr, HadamardProduct):
        terms = []
        for i, a in enumerate(expr.args):
            if isinstance(a, PairwiseMatrix):
                continue
            da = differential(a, tangent)
            if isinstance(da, ZeroMatrix):
                continue
            terms.append(HadamardProduct(*expr.args[:i], da, *expr.args[i + 1:]))
        return MatAdd(*terms) if terms else ZeroMatrix(*shape)
    raise DerivationError(f"no differential rule for {type(expr).__name__}")


# --------------------------------------------------------------------------------------------
# substitution of products
# --------------------------------------------------------------------------------------------
def _find(seq: tuple, pat: tuple) -> int:
    n, p = len(seq), len(pat)
    for i in range(n - p + 1):
        if all(seq[i + j] == pat[j] for j in range(p)):
            return i
    return -1


def substitute_product(expr, pattern, replacement, structure: Structure) -> tuple[sp.MatrixExpr, int]:
    """Replace every occurrence of the product ``pattern`` (as a contiguous run of factors, also
    inside linear nodes) by ``replacement``.  Returns the new expression and the count."""
    pat_terms = expand(pattern, structure)
    if len(pat_terms) != 1 or pat_terms[0][0] != 1:
        raise DerivationError(f"pattern {pattern} must be a single product")
    pat = pat_terms[0][1]
    rep_terms = expand(replacement, structure)
    count = 0

    def sub_terms(terms: list[Term]) -> list[Term]:
        nonlocal count
        out: list[Term] = []
        work = list(terms)
        while work:
            c, fs = work.pop()
            fs = tuple(_sub_inside(f) for f in fs)
            i = _find(fs, pat)
            if i < 0:
                out.append((c, fs))
                continue
            count += 1
            for c2, fs2 in rep_terms:
                new = fs[:i] + fs2 + fs[i + len(pat):]
                if len(new) > 1:
                    new = tuple(f for f in new if not isinstance(f, Identity)) or new[:1]
                work.append((c * c2, new))
        return collect(out)

    def _sub_inside(atom):
        if isinstance(atom, OperatorSolve):
            inner = sub_terms(expand(atom.arg, structure))
            return atom.with_arg(build(inner, atom.shape)) if inner else ZeroMatrix(*atom.shape)
        if isinstance(atom, LINEAR_NODES):
            inner = sub_terms(expand(atom.arg, structure))
            return type(atom)(build(inner, atom.shape)) if inner else ZeroMatrix(*atom.shape)
        if isinstance(atom, HadamardProduct):
            consts = [a for a in atom.args if isinstance(a, PairwiseMatrix)]
            other = [a for a in atom.args if not isinstance(a, PairwiseMatrix)][0]
            inner = sub_terms(expand(other, structure))
            return HadamardProduct(*consts, build(inner, atom.shape)) if inner else ZeroMatrix(*atom.shape)
        return atom

    terms = sub_terms(expand(expr, structure))
    # zero atoms created inside linear nodes vanish on renormalisation
    return normalize(build(terms, expr.shape), structure), count


def replace_symbol(expr, symbol: MatrixSymbol, value, structure: Structure):
    """Replace a symbol by an expression everywhere (a substitution of a solved unknown)."""
    return normalize(expr.xreplace({symbol: value}), structure)


# --------------------------------------------------------------------------------------------
# transposition: JVP -> VJP under <X, Y> = tr(X^T Y)
# --------------------------------------------------------------------------------------------
def transpose_linear(expr, tangents: set[str], cotangent, structure: Structure) -> dict[str, list]:
    """Adjoint of the linear map ``tangent -> expr`` applied to ``cotangent``.

    ``<cotangent, expr(dX)> = sum_X <result[X], dX>``.  Rules, for one monomial
    ``c L X R`` with the tangent-dependent factor ``X``:

    * ``<G, c L dX R>      = <c L^T G R^T, dX>``
    * ``<G, dX^T>          = <G^T, dX>``
    * ``<G, F ∘ Y>         = <F ∘ G, Y>``
    * ``<G, diag(Y)>       = <diag(G), Y>``; ``sym``/``skew`` likewise (self-adjoint projections);
    * ``<g, tr(Y)>         = <g I, Y>`` and ``<G, h I> = <tr(G), h>`` (``g``, ``h`` of size 1×1).
    """
    contributions: dict[str, list] = {}
    for c, fs in expand(expr, structure):
        idx = [i for i, f in enumerate(fs) if free_names(f) & tangents]
        if len(idx) != 1:
            raise DerivationError(
                f"term {_monomial(c, fs)} is not linear in the tangents {sorted(tangents)}"
            )
        j = idx[0]
        left = [Transpose(f) for f in reversed(fs[:j])]
        right = [Transpose(f) for f in reversed(fs[j + 1:])]
        g = MatMul(c, *left, cotangent, *right) if (left or right or c != 1) else cotangent
        _transpose_atom_linear(fs[j], tangents, g, structure, contributions)
    return contributions


def _transpose_atom_linear(atom, tangents, g, structure, contributions):
    if isinstance(atom, MatrixSymbol) and atom.name in tangents:
        contributions.setdefault(atom.name, []).append(g)
        return
    if isinstance(atom, Transpose) and isinstance(atom.arg, MatrixSymbol) and atom.arg.name in tangents:
        contributions.setdefault(atom.arg.name, []).append(Transpose(g))
        return
    if isinstance(atom, Transpose):  # <G, Y^T> = <G^T, Y>
        for name, parts in transpose_linear(atom.arg, tangents, Transpose(g), structure).items():
            contributions.setdefault(name, []).extend(parts)
        return
    rule = atom.adjoint_rule(g) if isinstance(atom, EngineNode) else None
    if rule is not None:  # a linear node's own rule: <g, node(Y)> = <g', Y>
        inner, g2 = rule
        for name, parts in transpose_linear(inner, tangents, g2, structure).items():
            contributions.setdefault(name, []).extend(parts)
        return
    if isinstance(atom, HadamardProduct):
        consts = [a for a in atom.args if isinstance(a, PairwiseMatrix)]
        other = [a for a in atom.args if not isinstance(a, PairwiseMatrix)][0]
        # <G, F ∘ Y> = Re Σ conj(G_ij) F_ij Y_ij = <conj(F) ∘ G, Y>
        consts = [conjugate(a) if a.definition.complex_values else a for a in consts]
        for name, parts in transpose_linear(other, tangents, HadamardProduct(*consts, g), structure).items():
            contributions.setdefault(name, []).extend(parts)
        return
    raise DerivationError(f"no transposition rule for factor {atom}")


#: what a node's algebra rules (:class:`~adjointgen.calculus.nodes.EngineNode`) may call: the normal
#: form of a subexpression, its rebuilt expression, term-list collection, a monomial's expression and
#: the projections' shared normal form
ALGEBRA = SimpleNamespace(expand=expand, normalize=normalize, collect=collect, monomial=_monomial,
                          linear_node=_linear_node)

# the rewrites for generated code live in calculus/rewrite.py; these two are the engine's and the derivations' entry points
from .rewrite import share_solves, simplify_for_codegen  # noqa: E402,F401

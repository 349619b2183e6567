"""Exact verification of derivation steps: each step's replay (:mod:`adjointgen.audit.replays`)
evaluated in rational arithmetic (Gaussian rationals for complex data) at random rational points.

A replay states an identity between rational functions of the entries of the derivation's
matrices (and of the coefficients of its scalar functions): its residual is ``N/D`` for polynomials
``N``, ``D`` in the random parameters.  If the step is wrong, ``N`` is not the zero polynomial, and
by the Schwartz–Zippel lemma it vanishes at a point drawn uniformly from ``S^m`` with probability at
most ``deg N / |S|``.  The parameters here are integers drawn uniformly from
``[-2^40, 2^40]`` (``|S| = 2^41 + 1``), and every value carries an upper bound on the degree of its
numerator and a record of its denominator (:class:`Ex`), so each verdict states its own bound:
``P(a wrong step passes) <= deg / (2^41 + 1)``.  The evaluation is exact: no tolerance, no simplification,
no timeout.

What the random points are:

- a matrix symbol with declared structure is built from free parameters with that structure:
  symmetric (Hermitian), skew, diagonal (real; complex for ``complex_diagonal``; imaginary for a
  diagonal skew one), triangular (unit, zero or real diagonal);
- an output with orthonormal columns is exactly orthonormal: the first columns of a Cayley
  transform ``(I - S)(I + S)^-1`` of a free skew (anti-Hermitian) ``S``; with ``orthonormal="B"``,
  ``U`` is free and ``B := (M M^H)^-1`` with ``M = [U W]`` (so ``U^H B U = I``);
- a derivation's scalar function ``f`` (``funm``) and the exponential (``matrix_exp``, ``logm``)
  are modelled by a polynomial with random integer coefficients of degree ``>= 3n``: an identity of
  values, first and second divided differences, or Fréchet derivatives at the spectrum of an
  ``n×n`` matrix that holds for every such polynomial holds for every function (it depends only on
  ``f``, ``f'``, ``f''`` at the ``<= n`` eigenvalues, which a polynomial of that degree interpolates);
- derivatives (``differentiate`` replays) are taken with dual numbers ``a + b ε``, ``ε^2 = 0``.

Values without a rational form (``log|det A|``, the phase of a complex determinant, a concrete
transcendental ``f``) raise :class:`NotExact`; the audit then replays the step symbolically.
"""
from __future__ import annotations

import itertools
import random
from fractions import Fraction

import numpy as np
import sympy as sp

from .scalars import Du, Ex, GQ, NotExact, _deg, _key, _lcm, _primitive, _value

__all__ = ["BITS", "EXACT", "Ex", "GQ", "NotExact", "SET_SIZE", "random_env", "verify"]

#: random parameters are integers in [-2^BITS, 2^BITS]
BITS = 40
SET_SIZE = 2 ** (BITS + 1) + 1


# ---------------------------------------------------------------------------------------- matrices
def matrix(rows, cols, entry) -> np.ndarray:
    out = np.empty((rows, cols), dtype=object)
    for i in range(rows):
        for j in range(cols):
            out[i, j] = entry(i, j)
    return out


def zeros(rows, cols) -> np.ndarray:
    return matrix(rows, cols, lambda i, j: Ex(Fraction(0), -1, ()))


def eye(n) -> np.ndarray:
    return matrix(n, n, lambda i, j: Ex.of(1 if i == j else 0))


def H(a):
    return np.conj(a.T)


def _is_dual(a) -> bool:
    return any(type(x) is Du for x in a.flat)


def _split(a):
    return (np.vectorize(lambda x: Du.of(x).a, otypes=[object])(a),
            np.vectorize(lambda x: Du.of(x).b, otypes=[object])(a))


def _join(a, b):
    out = np.empty(a.shape, dtype=object)
    for idx in np.ndindex(a.shape):
        out[idx] = Du(a[idx], b[idx])
    return out


def inv(a) -> np.ndarray:
    """The exact inverse (Gauss–Jordan on the values, with a degree bound from the adjugate
    formula: every entry shares the determinant as its denominator)."""
    n = a.shape[0]
    if a.shape != (n, n):
        raise ValueError(f"inverse of a {a.shape[0]}×{a.shape[1]} matrix")
    if _is_dual(a):
        a0, a1 = _split(a)
        i0 = inv(a0)
        return _join(i0, -(i0 @ a1 @ i0))
    entries = [Ex.of(x) for x in a.flat]
    q = ()
    for x in entries:
        q = _lcm(q, x.q)
    dq = _deg(q)
    g = max([x.n + dq - _deg(x.q) for x in entries if x.n >= 0] or [0])
    values = [[Ex.of(a[i, j]).v for j in range(n)] + [Fraction(int(i == j)) for j in range(n)] for i in range(n)]
    for col in range(n):
        pivot = next((r for r in range(col, n) if values[r][col]), None)
        if pivot is None:
            raise ZeroDivisionError("a singular matrix at the random point")
        values[col], values[pivot] = values[pivot], values[col]
        p = values[col][col]
        values[col] = [x / p for x in values[col]]
        for r in range(n):
            if r != col and values[r][col]:
                f = values[r][col]
                values[r] = [x - f * y for x, y in zip(values[r], values[col])]
    det = _primitive(n * g)
    num = (n - 1) * g + dq
    return matrix(n, n, lambda i, j: Ex(values[i][n + j], num, det))


def det(a):
    """``det a`` exactly, with the degree bound ``n g`` over ``q^n`` (``a = N / q``)."""
    n = a.shape[0]
    if _is_dual(a):  # d det = det tr(a^-1 da)
        a0, a1 = _split(a)
        d0 = det(a0)
        return Du(d0, d0 * np.trace(inv(a0) @ a1))
    entries = [Ex.of(x) for x in a.flat]
    q = ()
    for x in entries:
        q = _lcm(q, x.q)
    dq = _deg(q)
    g = max([x.n + dq - _deg(x.q) for x in entries if x.n >= 0] or [0])
    values = [[Ex.of(a[i, j]).v for j in range(n)] for i in range(n)]
    value = Fraction(1)
    for col in range(n):
        pivot = next((r for r in range(col, n) if values[r][col]), None)
        if pivot is None:
            return Ex(Fraction(0), n * g, tuple((i, m * n) for i, m in q))
        if pivot != col:
            values[col], values[pivot] = values[pivot], values[col]
            value = -value
        p = values[col][col]
        value = value * p
        for r in range(col + 1, n):
            if values[r][col]:
                f = values[r][col] / p
                values[r] = [x - f * y for x, y in zip(values[r], values[col])]
    return Ex(value, n * g, tuple((i, m * n) for i, m in q))


def charpoly(M):
    """Coefficients ``c_0 .. c_n`` (``c_n = 1``) of ``det(t I - M)`` (Faddeev–LeVerrier)."""
    n = M.shape[0]
    c = [Ex.of(0)] * n + [Ex.of(1)]
    Mk = zeros(n, n)
    for k in range(1, n + 1):
        Mk = M @ Mk + eye(n) * c[n - k + 1]
        c[n - k] = -(np.trace(M @ Mk)) / k
    return c


def sylvester(A, B, C, cache=None):
    """``X`` with ``A X + X B = C`` (see :meth:`_Exact.sylvester_solve`):
    ``X = q(A)^-1 Σ_i A^i C M_i`` with ``M_i = Σ_k c_(i+k+1) (-B)^k``, ``q`` the characteristic
    polynomial of ``-B`` (its coefficients ``c``); what depends on ``A`` and ``B`` alone is kept in
    ``cache`` (a dict) for the next solve with the same coefficients."""
    m, n = C.shape
    key = (_key(A), _key(B))
    if cache is None or key not in cache:
        Bn = -B
        c = charpoly(Bn)
        powers_B = [eye(n)]
        for _ in range(n - 1):
            powers_B.append(powers_B[-1] @ Bn)
        M = []
        for i in range(n):
            Mi = zeros(n, n)
            for k in range(n - i):
                Mi = Mi + powers_B[k] * c[i + k + 1]
            M.append(Mi)
        powers_A = [eye(m)]
        for _ in range(n - 1):
            powers_A.append(powers_A[-1] @ A)
        qA = zeros(m, m)
        for coefficient in reversed(c):
            qA = qA @ A + eye(m) * coefficient
        entry = (powers_A, M, inv(qA))
        if cache is None:
            cache = {}
        cache[key] = entry
    powers_A, M, qA_inv = cache[key]
    acc = zeros(m, n)
    for Ai, Mi in zip(powers_A, M):
        acc = acc + Ai @ C @ Mi
    return qA_inv @ acc


# ------------------------------------------------------------------------------- scalar functions
def polynomial_model(rng, degree: int):
    """Random integer coefficients of a polynomial of the given degree (constant term first)."""
    return [Ex(Fraction(_draw(rng)), 1, ()) for _ in range(degree + 1)]


def _poly(coefficients, x, order=0):
    """The ``order``-th derivative of the polynomial at ``x`` (Horner)."""
    cs = list(coefficients)
    for _ in range(order):
        cs = [c * k for k, c in enumerate(cs)][1:]
    out = Ex.of(0)
    for c in reversed(cs):
        out = out * x + c
    return out


def _matrix_poly(coefficients, a):
    n = a.shape[0]
    out = zeros(n, n)
    for c in reversed(coefficients):
        out = out @ a + eye(n) * c
    return out


def _draw(rng) -> int:
    return rng.randint(-2 ** BITS, 2 ** BITS)


def scalar(expr, values: dict, env) -> object:
    """The value of a SymPy scalar expression with symbols ``values`` (exact scalars); undefined
    functions (and their derivatives, and the ``f_k`` of :func:`real_derivatives`) are the env's
    polynomial models."""
    from sympy.core.function import AppliedUndef

    def ev(e):
        if e in values:
            return values[e]
        if e.is_Number or e is sp.I:
            return Ex.of(e)
        if isinstance(e, sp.Add):
            out = Ex.of(0)
            for a in e.args:
                out = out + ev(a)
            return out
        if isinstance(e, sp.Mul):
            out = Ex.of(1)
            for a in e.args:
                out = out * ev(a)
            return out
        if isinstance(e, sp.Pow) and e.exp.is_Integer:
            base, k = ev(e.base), int(e.exp)
            out = Ex.of(1)
            for _ in range(abs(k)):
                out = out * base
            return out if k >= 0 else Ex.of(1) / out
        if isinstance(e, sp.conjugate):
            return ev(e.args[0]).conjugate()
        if isinstance(e, AppliedUndef) and len(e.args) == 1:
            name, order = e.func.__name__, 0
            base, _, k = name.rpartition("_")
            if base and k.isdigit() and base in env.get("__models__", {}):
                name, order = base, int(k)
            return _poly(model(env, name), ev(e.args[0]), order)
        if isinstance(e, sp.Derivative) and isinstance(e.expr, AppliedUndef) and len(e.variable_count) == 1:
            (var, order), = e.variable_count
            if e.expr.args == (var,):
                return _poly(model(env, e.expr.func.__name__), ev(var), int(order))
        if isinstance(e, sp.Subs):
            return ev(e.doit())
        raise NotExact(f"no exact value for {e}")

    return ev(sp.sympify(expr))


def model(env, name: str):
    """The polynomial that models the function ``name`` in this evaluation (drawn once per env)."""
    models = env.setdefault("__models__", {})
    if name not in models:
        n = env.get("__size__", 3)
        # exp enters through values and Fréchet derivatives (f, f' at <= n eigenvalues: degree 2n - 1
        # interpolates any such data); a derivation's own f also through second divided differences
        models[name] = polynomial_model(env["__rng__"], 2 * n + 1 if name == "exp" else 3 * n + 2)
    return models[name]


# ------------------------------------------------------------------------------- the arithmetic
class _Exact:
    """The exact arithmetic of :func:`adjointgen.calculus.evaluate.evaluate` (object arrays of
    :class:`Ex` / :class:`Du`)."""

    env: dict = {}

    eye = staticmethod(eye)
    zeros = staticmethod(zeros)

    @staticmethod
    def coefficient(c):
        return Ex.of(c)

    @staticmethod
    def matmul(a, b):
        return a @ b

    @staticmethod
    def T(a):
        return H(a)

    inv = staticmethod(inv)

    @staticmethod
    def had(a, b):
        return a * b

    @staticmethod
    def diag(a):
        n = a.shape[0]
        return matrix(n, n, lambda i, j: a[i, i] if i == j else Ex.of(0))

    @staticmethod
    def diagonal(a):
        return [a[i, i] for i in range(a.shape[0])]

    @classmethod
    def diag_function(cls, fn, d):
        (x,), body = fn.variables, fn.expr
        return matrix(len(d), len(d), lambda i, j: scalar(body, {x: d[i]}, cls.env) if i == j else Ex.of(0))

    @staticmethod
    def trace(a):
        return matrix(1, 1, lambda i, j: np.trace(a) if a.shape[0] else Ex.of(0))

    @staticmethod
    def det(a):
        return matrix(1, 1, lambda i, j: det(a))

    @staticmethod
    def adjugate(a):
        return inv(a) * det(a)

    @classmethod
    def expm(cls, a):
        return _matrix_poly(model(cls.env, "exp"), a)

    @classmethod
    def _powers(cls, x):
        """``x^0 .. x^m`` for the exp model of degree ``m`` (cached by value in this evaluation)."""
        cache = cls.env.setdefault("__powers__", {})
        key = _key(x)
        if key not in cache:
            m = len(model(cls.env, "exp")) - 1
            powers = [eye(x.shape[0])]
            for _ in range(m):
                powers.append(powers[-1] @ x)
            cache[key] = powers
        return cache[key]

    @classmethod
    def expm_frechet(cls, a, e):
        """``L_p[a](e) = Σ_k c_k Σ_{i+j=k-1} a^i e a^j`` for the exp model ``p``: the Fréchet derivative
        of a polynomial (the corner of ``p([[a, e], [0, a]])``)."""
        c = model(cls.env, "exp")
        powers = cls._powers(a)
        out = zeros(*e.shape)
        for k in range(1, len(c)):
            inner = zeros(*e.shape)
            for i in range(k):
                inner = inner + powers[i] @ e @ powers[k - 1 - i]
            out = out + inner * c[k]
        return out

    @classmethod
    def expm_frechet_solve(cls, x, rhs):
        """``L_p[x]^-1(rhs)``: the ``n^2 × n^2`` matrix ``Σ_k c_k Σ_{i+j=k-1} (x^j)^T ⊗ x^i`` inverted (cached)."""
        n = x.shape[0]
        cache = cls.env.setdefault("__frechet_inverse__", {})
        key = _key(x)
        if key not in cache:
            c = model(cls.env, "exp")
            powers = cls._powers(x)
            op = zeros(n * n, n * n)
            for k in range(1, len(c)):
                for i in range(k):
                    op = op + np.kron(powers[k - 1 - i].T, powers[i]) * c[k]
            cache[key] = inv(op)
        vec = rhs.T.reshape(-1, 1)  # column-major
        return (cache[key] @ vec).reshape(n, n).T

    @staticmethod
    def logabsdet(a):
        raise NotExact("log|det A| has no rational value")

    @staticmethod
    def signdet(a):
        raise NotExact("the sign of a determinant has no rational form here")

    @staticmethod
    def scalar(g, n):
        return eye(n) * g[0, 0]

    @staticmethod
    def lower_half(a):
        return matrix(*a.shape, lambda i, j: a[i, j] if i > j else (a[i, j] / 2 if i == j else Ex.of(0)))

    @staticmethod
    def strictly_lower(a):
        return matrix(*a.shape, lambda i, j: a[i, j] if i > j else Ex.of(0))

    @classmethod
    def shifted_solve(cls, X, A, B, U, d):
        """Column i: the bordered system ``[[A - d_i B, B U], [(B U)^H, 0]] [w; l] = [x_i; 0]``
        (the inverses cached by value in this evaluation)."""
        n, k = U.shape
        BU = B @ U
        cache = cls.env.setdefault("__bordered__", {})
        base = (_key(A), _key(B), _key(U))
        out = np.empty(X.shape, dtype=object)
        for i in range(X.shape[1]):
            key = base + (_key(np.array([d[i]], dtype=object)),)
            if key not in cache:
                cache[key] = inv(np.block([[A - B * d[i], BU], [H(BU), zeros(k, k)]]))
            rhs = np.concatenate([X[:, i], [Ex.of(0)] * k]).reshape(-1, 1)
            out[:, i] = (cache[key] @ rhs)[:n, 0]
        return out

    @staticmethod
    def triangular_sylvester_solve(T, C, upper):
        """The strictly lower ``X`` with ``tril₋(X T - T X) = tril₋(C)``, entry by entry (upper ``T``:
        from the corner inwards, column by column; lower: from the diagonal outwards), each a
        division by ``T_jj - T_ii``; the entries not yet solved meet only the zeros of ``T``."""
        n = T.shape[0]
        X = zeros(n, n)
        order = [(i, j) for j in range(n) for i in range(n - 1, j, -1)] if upper else \
            [(i, j) for i in range(n) for j in range(i - 1, -1, -1)]
        for i, j in order:
            rest = Ex.of(0)
            for k in range(n):
                if k != i and k != j:
                    rest = rest + X[i, k] * T[k, j] - T[i, k] * X[k, j]
            X[i, j] = (C[i, j] - rest) / (T[j, j] - T[i, i])
        return X

    @classmethod
    def sylvester_solve(cls, A, B, C):
        """``X`` with ``A X + X B = C``, from the characteristic polynomial ``q`` of ``-B``
        (Faddeev–LeVerrier): ``q(A) X = Σ_j c_j Σ_{i<j} A^i C (-B)^(j-1-i)`` (``q(-B) = 0``), one
        ``m×m`` inverse instead of an ``mn × mn`` system: exact arithmetic has no rounding to fear."""
        return sylvester(A, B, C, cls.env.setdefault("__sylvester__", {}))

    @classmethod
    def pairwise(cls, definition, d, free=False, pattern=False, functions=None):
        env = cls.env
        n = len(d)
        if definition.is_indicator:
            if pattern:
                return matrix(n, n, lambda i, j: Ex.of(1 if i != j and {i, j} == {0, 1} else 0))
            return matrix(n, n, lambda i, j: Ex.of(1 if i != j and _value(d[i]) == _value(d[j]) else 0))
        cache = env.setdefault("__pairwise__", {})
        if free:
            base = definition.conjugate_of or definition.name
            key = ("free", base, n)
            if key not in cache:
                sign = -1 if definition.is_antisymmetric else (1 if definition.is_symmetric else None)
                complex_ = definition.complex_values
                diag = sp.sympify(definition.diagonal_value)
                rng = env["__rng__"]
                raw = {(i, j): _random_entry(rng, complex_) for i in range(n) for j in range(n)}

                def entry(i, j):
                    if i == j:
                        return raw[i, i] if diag.free_symbols else Ex.of(diag)
                    if sign is None or i < j:
                        return raw[i, j]
                    return raw[j, i] * sign

                cache[key] = matrix(n, n, entry)
            value = cache[key]
            return np.conj(value) if definition.conjugate_of is not None else value
        if definition.conjugate_of is not None:
            d = [x.conjugate() for x in d]
        from .. calculus.nodes import DI, DJ

        expr = definition.expr
        diag = sp.sympify(definition.diagonal_value)

        def entry(i, j):
            if i == j:
                return scalar(diag, {DI: d[i], DJ: d[i]}, env)
            return scalar(expr, {DI: d[i], DJ: d[j]}, env)

        out = matrix(n, n, entry)
        if definition.zero_on is not None:
            for i in range(n):
                for j in range(n):
                    if i != j and (pattern and {i, j} == {0, 1} or not pattern and _value(d[i]) == _value(d[j])):
                        out[i, j] = Ex.of(0)
        return out


def _random_entry(rng, complex_: bool):
    if complex_:
        return Ex(GQ(_draw(rng), _draw(rng)), 1, ())
    return Ex(Fraction(_draw(rng)), 1, ())


def arithmetic(env):
    """The exact arithmetic bound to one evaluation's env (its random models and caches)."""
    return type("ExactArith", (_Exact,), {"env": env})


EXACT = _Exact


# ------------------------------------------------------------------------------------- the env
def random_env(spec, dims_by_name: dict, seed, *, complex_: bool | None = None, degenerate=None) -> dict:
    """Explicit exact matrices with random entries and the declared structure (see the module
    docstring), for the instance dimensions ``dims_by_name``.  ``degenerate``: the name of a
    diagonal symbol whose first two entries are made equal (a cluster)."""
    rng = random.Random(f"{spec.name}/{seed}")
    st = spec.structure
    if complex_ is None:
        complex_ = st.complex and dims_by_name.get("field", "complex") != "real"
    dims = {s: int(dims_by_name[s.name]) for s in spec.dims}
    env = {"__dims__": dims, "__rng__": rng, "__complex__": complex_}
    env["__size__"] = max([2, *dims.values()])
    env["__arith__"] = arithmetic(env)

    def draw():
        return _random_entry(rng, complex_)

    def real():
        return _random_entry(rng, False)

    def imaginary():
        return Ex(GQ(0, _draw(rng)), 1, ()) if complex_ else Ex.of(0)

    symbols = []
    for s in (*spec.inputs, *spec.outputs):
        symbols += [(s.name, s), ("d" + s.name, s), ("g" + s.name, s)]
    symbols += [(s.name, s) for s, _ in spec.introduced]
    symbols += [(s.name, s) for s in spec.gauge_parameters]
    done = set()
    for name, s in symbols:
        if name in done:
            continue
        done.add(name)
        r, c = (int(sp.sympify(x).xreplace(dims)) for x in s.shape)
        env[name] = structured(name, r, c, st, draw, real, imaginary, rng, complex_)
    if degenerate is not None and degenerate in env:
        D = env[degenerate]
        if D.shape[0] > 1:
            D[1, 1] = D[0, 0]
    # orthonormal outputs are exactly orthonormal (the tangents and cotangents stay free)
    for name, metric in sorted(st.orthonormal.items()):
        if name not in env:
            continue
        r, c = env[name].shape
        if metric is None:
            env[name] = cayley(r, draw, imaginary, complex_)[:, :c]
        else:
            W = matrix(r, r - c, lambda i, j: draw())
            M = np.concatenate([env[name], W], axis=1)
            env[metric] = inv(M @ H(M))
    return env


def structured(name, r, c, st, draw, real, imaginary, rng, complex_):
    tri = st.triangle(name)
    if tri is not None:
        side, diagonal = tri

        def entry(i, j):
            if i == j:
                if diagonal == "unit":
                    return Ex.of(1)
                if diagonal == "zero":
                    return Ex.of(0)
                return real() if name in st.real_diagonal else draw()
            keep = i > j if side == "lower" else i < j
            return draw() if keep else Ex.of(0)

        return matrix(r, c, entry)
    if name in st.diagonal and name in st.skew:
        return matrix(r, c, lambda i, j: imaginary() if i == j else Ex.of(0))
    if name in st.complex_diagonal:
        return matrix(r, c, lambda i, j: draw() if i == j else Ex.of(0))
    if name in st.diagonal:
        return matrix(r, c, lambda i, j: real() if i == j else Ex.of(0))
    if name in st.symmetric:
        m = matrix(r, c, lambda i, j: real() if i == j else (draw() if i < j else None))
        for i in range(r):
            for j in range(i):
                m[i, j] = m[j, i].conjugate()
        return m
    if name in st.skew:
        m = matrix(r, c, lambda i, j: imaginary() if i == j else (draw() if i < j else None))
        for i in range(r):
            for j in range(i):
                m[i, j] = -m[j, i].conjugate()
        return m
    return matrix(r, c, lambda i, j: draw())


def cayley(n, draw, imaginary, complex_):
    """``(I - S)(I + S)^-1`` of a random skew (anti-Hermitian) ``S``: an exactly orthogonal (unitary)
    matrix, a rational function of ``S``."""
    S = matrix(n, n, lambda i, j: imaginary() if i == j else (draw() if i < j else None))
    for i in range(n):
        for j in range(i):
            S[i, j] = -S[j, i].conjugate()
    return (eye(n) - S) @ inv(eye(n) + S)


def is_zero(m) -> tuple[bool, int]:
    """``(all entries are exactly zero, the largest degree bound of their numerators)``."""
    ok, degree = True, 0
    for x in np.asarray(m, dtype=object).flat:
        x = Ex.of(x) if type(x) is not Du else x
        if type(x) is Du:
            raise TypeError("a dual residual")
        if x.v:
            ok = False
        degree = max(degree, x.n)
    return ok, degree


# ------------------------------------------------------------------------------ gauge invariance
def _solve_exact(rows, rhs):
    """A solution ``c`` of the (over-determined) exact system ``rows c = rhs`` (free unknowns 0), or
    ``None`` when it has none."""
    m = len(rows[0]) if rows else 0
    aug = [list(r) + [b] for r, b in zip(rows, rhs)]
    pivots, r = [], 0
    for col in range(m):
        p = next((i for i in range(r, len(aug)) if aug[i][col]), None)
        if p is None:
            continue
        aug[r], aug[p] = aug[p], aug[r]
        pv = aug[r][col]
        aug[r] = [x / pv for x in aug[r]]
        for i in range(len(aug)):
            if i != r and aug[i][col]:
                f = aug[i][col]
                aug[i] = [x - f * y for x, y in zip(aug[i], aug[r])]
        pivots.append(col)
        r += 1
    if any(row[-1] for row in aug[r:]):
        return None
    c = [Fraction(0)] * m
    for i, col in enumerate(pivots):
        c[col] = aug[i][-1]
    return c


def fit_invariance(spec, env, identity, new, parameter, D, directions, explicit):
    """The gauge step's residual ``new`` as ``Σ c_k M_k``, ``M_k`` in ``R Θ, Θ^H R, Θ R, R Θ^H``
    (``R``: the identity's residual): the ``c_k`` solved at this point, the difference returned at
    a second, independent point (zero there, exactly, when the fit is an identity)."""
    clustered = parameter in spec.structure.clustered

    def terms(e):
        if clustered:
            e["__cluster_pattern__"] = True
        R = explicit(identity, e)
        T = e[parameter]
        if clustered:
            T = T * matrix(*T.shape, lambda i, j: Ex.of(1 if (i, j) in ((0, 1), (1, 0)) else 0))
            e[parameter] = T
        N = explicit(new, e)
        multipliers = [T]
        for name, direction in directions:  # X -> X M: M = (X^H X)^-1 X^H dX where that is exact
            X, dX = e[name], explicit(direction, e)
            try:
                M = inv(H(X) @ X) @ H(X) @ dX
            except ZeroDivisionError:
                continue
            if is_zero(X @ M - dX)[0]:
                multipliers.append(M)
        cands = []
        r, c = R.shape
        for M in multipliers:
            p = M.shape[0]
            if c == p:
                cands += [R @ M, R @ H(M)]
            if r == p:
                cands += [H(M) @ R, M @ R]
        cands = [M for M in cands if M.shape == N.shape]
        return N, cands

    N1, c1 = terms(dict(env))
    rows = [[_value(M[idx]) for M in c1] for idx in np.ndindex(N1.shape)]
    rhs = [_value(N1[idx]) for idx in np.ndindex(N1.shape)]
    coefficients = _solve_exact(rows, rhs) if c1 else ([] if not any(rhs) else None)
    if coefficients is None:
        return N1  # not a combination of them: reported as a nonzero residual
    dims, seed = env["__instance__"]
    second = random_env(spec, dims, f"{seed}/second", degenerate=D)
    for k in ("__pairwise_free__",):
        if k in env:
            second[k] = env[k]
    N2, c2 = terms(second)
    out = N2
    for coefficient, M in zip(coefficients, c2):
        if coefficient:
            out = out - M * Ex.of(coefficient) if not isinstance(coefficient, GQ) else out - M * Ex(coefficient, 0, ())
    return out


# ------------------------------------------------------------------------------------ a verdict
def _instances(spec, step):
    """The audit instances' dimensions a step is checked at: the smallest of each shape class (the
    order relations between the dimensions), complex where the derivation is (it covers the real
    case), real for a real specialisation; the square ones for a square variant."""
    check = step.check
    real_only = step.replay.kind == "real" or (check is not None and check.real_only)
    names = [s.name for s in spec.dims]
    best = {}
    for dims in spec.audit_dims:
        field = dims.get("field", "complex" if spec.structure.complex else "real")
        if spec.structure.complex and real_only and field != "real":
            continue
        sizes = [int(dims[n]) for n in names]
        if check is not None and check.square:
            env = {s: int(dims[s.name]) for s in spec.dims}
            shapes = {o.name: tuple(int(sp.sympify(x).xreplace(env)) for x in o.shape) for o in spec.outputs}
            if any(shapes[name][0] != shapes[name][1] for name in check.square):
                continue
        order = tuple((a > b) - (a < b) for a, b in itertools.combinations(sizes, 2))
        key = (order, field if real_only else "")
        rank = (field != "complex" and spec.structure.complex, sum(sizes), sizes)
        if key not in best or rank < best[key][0]:
            best[key] = (rank, dims)
    return [dims for _, dims in sorted(best.values(), key=lambda x: x[0])][:3]


def verify(step, spec, free_pairwise: bool) -> tuple[bool, int, int]:
    """Replay ``step`` exactly at random rational points (one per distinct instance shape):
    ``(all residuals are zero, the largest numerator degree bound, the number of points)``.
    Raises :class:`NotExact` when a value has no exact form (the caller replays symbolically)."""
    from . import replays

    instances = _instances(spec, step)
    if not instances:
        raise NotExact("no audit instance to take the dimensions from")
    replay = step.replay
    degenerate = replay.args[3] if replay.kind == "invariant" else None
    worst, points = 0, 0
    for i, dims in enumerate(instances):
        for attempt in range(4):
            seed = f"{step.index}/{i}/{attempt}"
            env = random_env(spec, dims, seed, degenerate=degenerate)
            env["__pairwise_free__"] = free_pairwise
            env["__instance__"] = (dims, seed)
            try:
                res = replays.residual(replay, spec, env)
            except ZeroDivisionError:
                continue  # a pole at this point: draw another
            except (KeyError, ValueError, TypeError, IndexError) as exc:
                raise NotExact(f"{type(exc).__name__}: {exc}") from exc
            ok, degree = is_zero(res)
            if not ok:
                return False, degree, points + 1
            worst, points = max(worst, degree), points + 1
            break
        else:
            raise NotExact("every random point hit a pole")
    return True, worst, points

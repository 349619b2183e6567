"""The exact scalars of the audit's replays (:mod:`adjointgen.audit.exact`): Gaussian rationals
(:class:`GQ`), exact values with a bound on their degree as rational functions of the random
parameters (:class:`Ex`), and dual numbers of them for derivatives (:class:`Du`)."""
from __future__ import annotations

import itertools
from fractions import Fraction

import sympy as sp


class NotExact(Exception):
    """A value of the replay has no exact rational form here (a logarithm, a concrete transcendental
    function): the step is replayed symbolically instead."""


class GQ:
    """A Gaussian rational ``re + i im``."""

    __slots__ = ("re", "im")

    def __init__(self, re, im=0):
        self.re = re if type(re) is Fraction else Fraction(re)
        self.im = im if type(im) is Fraction else Fraction(im)

    def __add__(a, b):
        if type(b) is GQ:
            return GQ(a.re + b.re, a.im + b.im)
        return GQ(a.re + b, a.im)

    __radd__ = __add__

    def __sub__(a, b):
        if type(b) is GQ:
            return GQ(a.re - b.re, a.im - b.im)
        return GQ(a.re - b, a.im)

    def __rsub__(a, b):
        return GQ(b - a.re, -a.im)

    def __mul__(a, b):
        if type(b) is GQ:
            return GQ(a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re)
        return GQ(a.re * b, a.im * b)

    __rmul__ = __mul__

    def __truediv__(a, b):
        if type(b) is GQ:
            den = b.re * b.re + b.im * b.im
            return GQ((a.re * b.re + a.im * b.im) / den, (a.im * b.re - a.re * b.im) / den)
        return GQ(a.re / b, a.im / b)

    def __rtruediv__(a, b):
        return GQ(b) / a

    def __neg__(a):
        return GQ(-a.re, -a.im)

    def conjugate(a):
        return GQ(a.re, -a.im)

    def __eq__(a, b):
        if type(b) is GQ:
            return a.re == b.re and a.im == b.im
        return a.im == 0 and a.re == b

    def __hash__(self):
        return hash((self.re, self.im))

    def __bool__(self):
        return bool(self.re) or bool(self.im)

    def __repr__(self):
        return f"({self.re}{'+' if self.im >= 0 else '-'}{abs(self.im)}i)"


# a denominator is a product of "primitive" polynomials, each created by a division: a sorted
# tuple of (id, multiplicity); _PRIMITIVE[id] is the degree bound of that polynomial
_PRIMITIVE: dict[int, int] = {}
_ids = itertools.count(1)


def _deg(q) -> int:
    return sum(_PRIMITIVE[i] * m for i, m in q)


def _lcm(q1, q2):
    if q1 == q2 or not q2:
        return q1
    if not q1:
        return q2
    out = dict(q1)
    for i, m in q2:
        if out.get(i, 0) < m:
            out[i] = m
    return tuple(sorted(out.items()))


def _times(q1, q2):
    if not q1:
        return q2
    if not q2:
        return q1
    out = dict(q1)
    for i, m in q2:
        out[i] = out.get(i, 0) + m
    return tuple(sorted(out.items()))


def _primitive(degree: int):
    if degree <= 0:
        return ()
    i = next(_ids)
    _PRIMITIVE[i] = degree
    return ((i, 1),)


def _number(x):
    """A Python or SymPy number as an exact value (Fraction, or GQ if it has an imaginary part)."""
    if type(x) in (Fraction, GQ):
        return x
    if isinstance(x, bool):
        return Fraction(int(x))
    if isinstance(x, int):
        return Fraction(x)
    if isinstance(x, sp.Basic):
        x = sp.sympify(x)
        if x.is_Rational:
            return Fraction(int(x.p), int(x.q))
        re, im = x.as_real_imag()
        if re.is_Rational and im.is_Rational:
            return GQ(Fraction(int(re.p), int(re.q)), Fraction(int(im.p), int(im.q))) if im else \
                Fraction(int(re.p), int(re.q))
        raise NotExact(f"the number {x} is not rational")
    raise NotExact(f"the value {x!r} ({type(x).__name__}) is not exact")


class Ex:
    """An exact value (``Fraction`` or :class:`GQ`) at the random point, with an upper bound ``n`` on
    the degree of its numerator as a rational function of the random parameters (``-1``: the value
    is identically zero) and its denominator ``q`` (see :func:`_primitive`)."""

    __slots__ = ("v", "n", "q")

    def __init__(self, v, n=0, q=()):
        self.v, self.n, self.q = v, n, q

    @staticmethod
    def of(x) -> "Ex":
        if type(x) is Ex:
            return x
        v = _number(x)
        return Ex(v, 0 if v else -1, ())

    def __add__(a, b):
        if type(b) is not Ex:
            if type(b) is Du:
                return NotImplemented
            b = Ex.of(b)
        if a.n < 0:
            return b
        if b.n < 0:
            return a
        if a.q == b.q:
            return Ex(a.v + b.v, max(a.n, b.n), a.q)
        q = _lcm(a.q, b.q)
        dq = _deg(q)
        return Ex(a.v + b.v, max(a.n + dq - _deg(a.q), b.n + dq - _deg(b.q)), q)

    __radd__ = __add__

    def __neg__(a):
        return Ex(-a.v, a.n, a.q)

    def __sub__(a, b):
        if type(b) is Du:
            return NotImplemented
        return a + (-Ex.of(b))

    def __rsub__(a, b):
        return Ex.of(b) + (-a)

    def __mul__(a, b):
        if type(b) is not Ex:
            if type(b) is Du:
                return NotImplemented
            b = Ex.of(b)
        if a.n < 0 or b.n < 0:
            return Ex(Fraction(0), -1, ())
        return Ex(a.v * b.v, a.n + b.n, _times(a.q, b.q))

    __rmul__ = __mul__

    def __truediv__(a, b):
        if type(b) is not Ex:
            if type(b) is Du:
                return NotImplemented
            b = Ex.of(b)
        if not b.v:
            raise ZeroDivisionError("a denominator vanishes at the random point")
        if a.n < 0:
            return a
        return Ex(a.v / b.v, a.n + _deg(b.q), _times(a.q, _primitive(b.n)))

    def __rtruediv__(a, b):
        return Ex.of(b) / a

    def conjugate(a):
        return Ex(a.v.conjugate() if type(a.v) is GQ else a.v, a.n, a.q)

    def __bool__(self):
        return bool(self.v)

    @property
    def degree(self) -> int:
        return self.n

    def __repr__(self):
        return f"Ex({self.v}, deg<={self.n})"


class Du:
    """A dual number ``a + b ε`` (``ε^2 = 0``) of exact values: the derivative of a replay along
    ``X + ε dX``, exactly."""

    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a, self.b = Ex.of(a), Ex.of(b)

    @staticmethod
    def of(x):
        return x if type(x) is Du else Du(x, 0)

    def __add__(x, y):
        y = Du.of(y)
        return Du(x.a + y.a, x.b + y.b)

    __radd__ = __add__

    def __neg__(x):
        return Du(-x.a, -x.b)

    def __sub__(x, y):
        return x + (-Du.of(y))

    def __rsub__(x, y):
        return Du.of(y) + (-x)

    def __mul__(x, y):
        y = Du.of(y)
        return Du(x.a * y.a, x.a * y.b + x.b * y.a)

    __rmul__ = __mul__

    def __truediv__(x, y):
        y = Du.of(y)
        return Du(x.a / y.a, (x.b * y.a - x.a * y.b) / (y.a * y.a))

    def __rtruediv__(x, y):
        return Du.of(y) / x

    def conjugate(x):
        return Du(x.a.conjugate(), x.b.conjugate())

    def __bool__(self):
        return bool(self.a) or bool(self.b)


def _key(a):
    """A hashable key of a matrix's values (dual parts included)."""
    return (a.shape, tuple((_value(x), Du.of(x).b.v if type(x) is Du else None) for x in a.flat))


def _value(x):
    """The exact value of an entry (for pivoting and zero tests)."""
    return x.a.v if type(x) is Du else (x.v if type(x) is Ex else x)

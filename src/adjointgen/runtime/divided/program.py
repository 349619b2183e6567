"""Scalar programs: a scalar function ``f(x)`` as straight-line code over primitives.

:mod:`adjointgen.codegen.scalar` compiles a SymPy expression into a :class:`ScalarProgram`; the
generated modules hold their programs as literals, and :mod:`adjointgen.runtime.divided.evaluate`
evaluates ``f``, its first and second divided differences and its domain checks from them.  A
program is plain data (JSON-able), so a user's function compiled once is cached on disk.

Each :class:`Op` is one primitive applied to earlier ops (static single assignment):

* ``x``: the variable; ``const``: a number (``param``); ``option``: a run-time option (``param``
  its index, ``p`` of ``x**p``);
* ``add``, ``mul``: n-ary sums and products;
* ``pow``: ``u**c`` for a constant ``c`` (``param``: a number, or ``"option:<i>"``);
* unary primitives (``exp``, ``log``, ``sin``, ``tanh``, ``erf``, ``abs``, ``softplus``, ...): the
  table :data:`UNARY` with ``param`` their fixed parameter where they have one (``polygamma``'s
  order);
* ``lt``, ``le``, ``gt``, ``ge``, ``eq``, ``ne`` (comparisons), ``and``, ``or``, ``not``, and
  ``piecewise`` (``args = (cond_1, expr_1, ..., cond_k, expr_k, otherwise)``).

``derivatives`` holds, for each unary primitive the program uses, the programs of its derivatives
``g', g'', ...`` in their own variable (option 0: the primitive's parameter): the series of the
divided differences near equal arguments evaluate them.  They are derived by SymPy, not written
here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["BOOLEAN", "COMPARISONS", "Op", "ScalarProgram", "UNARY"]

#: unary primitives the evaluator implements (values, divided differences, domains)
UNARY = frozenset({
    "exp", "log", "sin", "cos", "tan", "sinh", "cosh", "tanh", "atan", "asin", "acos", "asinh", "acosh", "atanh",
    "erf", "erfc", "gamma", "loggamma", "polygamma", "besselj0", "besselj1", "sinc", "abs", "sign", "heaviside",
    "floor", "ceiling", "softplus", "sigmoid", "log1p", "expm1", "xlogx",
})
COMPARISONS = frozenset({"lt", "le", "gt", "ge", "eq", "ne"})
BOOLEAN = COMPARISONS | {"and", "or", "not"}


@dataclass(frozen=True)
class Op:
    """One step: ``kind`` applied to the ops ``args`` (indices of earlier steps), with ``param``."""

    kind: str
    args: tuple[int, ...] = ()
    param: object = None

    def to_data(self):
        return [self.kind, list(self.args), self.param]


@dataclass(frozen=True)
class ScalarProgram:
    """``f`` as straight-line code; the last op is ``f(x)``.

    Attributes:
        text: ``f`` as SymPy prints it (for messages).
        ops: the steps.
        options: names of the run-time options, in the order the evaluator takes their values.
        derivatives: ``((kind, (g', g'', ...)), ...)`` for the unary primitives of ``ops``.
        texts: the text of each op's subexpression (for messages naming where a domain fails).
    """

    text: str
    ops: tuple[Op, ...]
    options: tuple[str, ...] = ()
    derivatives: tuple = ()
    texts: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self):
        for i, op in enumerate(self.ops):
            if any(not 0 <= a < i for a in op.args):
                raise ValueError(f"scalar program {self.text!r}: op {i} ({op.kind}) refers to a later op")
            if op.kind not in UNARY | BOOLEAN | {"x", "const", "option", "add", "mul", "pow", "piecewise"}:
                raise ValueError(f"scalar program {self.text!r}: unknown primitive {op.kind!r}")

    def derivative_programs(self, kind: str) -> tuple:
        for k, progs in self.derivatives:
            if k == kind:
                return progs
        return ()

    @property
    def kinds(self) -> frozenset:
        return frozenset(op.kind for op in self.ops)

    def to_data(self):
        """A JSON-able nested list (:meth:`from_data` inverts it)."""
        data = {"text": self.text, "ops": [op.to_data() for op in self.ops]}
        if self.options:
            data["options"] = list(self.options)
        if self.derivatives:
            data["derivatives"] = [[k, [p.to_data() for p in progs]] for k, progs in self.derivatives]
        if self.texts:
            data["texts"] = list(self.texts)
        return data

    @classmethod
    def from_data(cls, data) -> "ScalarProgram":
        return cls(text=data["text"], ops=tuple(Op(k, tuple(a), p) for k, a, p in data["ops"]),
                   options=tuple(data.get("options", ())),
                   derivatives=tuple((k, tuple(cls.from_data(p) for p in progs))
                                     for k, progs in data.get("derivatives", ())),
                   texts=tuple(data.get("texts", ())))

"""The checks and replays the steps record (what the audit checks numerically and replays exactly),
and the helpers the step families share."""
from __future__ import annotations

from typing import TYPE_CHECKING

from sympy.matrices.expressions import Inverse, MatrixSymbol

from ..records import Check, Equation, Gauge, Replay

if TYPE_CHECKING:
    from ..derivation import Derivation


def _forward_check(d: "Derivation") -> Check:
    return Check("forward")


def _premise(what: str) -> Replay:
    """The replay of a step that rests on nothing earlier: an identity, a definition, the forward,
    a gauge choice (what the derivation assumes; its numeric check compares it with the instances)."""
    return Replay("premise", (what,))


def _and(names) -> str:
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _real_diagonal_factor(f, structure) -> bool:
    """A triangular factor (or its inverse) whose diagonal is real."""
    if isinstance(f, Inverse):
        f = f.arg
    return isinstance(f, MatrixSymbol) and f.name in structure.real_diagonal


# ---------------------------------------------------------------------- checks
def _equation_check(eq: Equation) -> Check:
    """The residual ``‖lhs - rhs‖`` against the sizes of the terms."""
    return Check("equation", (eq,))


def _dot_product_check(d: Derivation, name: str, gexpr, symmetric: bool) -> Check:
    """``<g_in, d_in> = Σ <g_out, d_out>`` with ``g_in = gexpr`` (projected when ``symmetric``)."""
    return Check("dot_product", (name, gexpr))


def _dot_product_symbolic(d: Derivation, name: str, gexpr) -> Replay:
    """``<g_in, d_in> - Σ <g_out, d_out>`` on explicit matrices (see :mod:`adjointgen.audit.replays`)."""
    return Replay("dot_product", (name, gexpr))


def _adjoint_check(node, complex_: bool) -> Check:
    return Check("adjoint", (node, complex_))


def _adjoint_symbolic(node, complex_: bool) -> Replay:
    return Replay("adjoint", (node, complex_))


def _real_only(check: Check) -> Check:
    """A check that applies to the real instances only (complex ones report a zero residual)."""
    return Check(check.kind, check.args, real_only=True)


def _real_only_symbolic(a, b) -> Replay:
    return Replay("real", (a, b))


def _gauge_check(d: Derivation, gauge: "Gauge", rexpr) -> Check:
    return Check("gauge", (gauge, rexpr))


def _gauge_symbolic(d: Derivation, gauge: "Gauge", rexpr) -> Replay:
    return Replay("gauge", (gauge, rexpr))


def _same_value_symbolic(a, b) -> Replay:
    return Replay("equal", (a, b))


def _follows(expected, new: Equation) -> Replay:
    """The new equation's residual equals ``expected``, an expression of the old residuals."""
    return Replay("equal", (expected, new.residual_expr))


def _explicit(expr, env):
    from ..evaluate import SYMPY, evaluate

    return evaluate(expr, env, env.get("__dims__", {}), arith=SYMPY)

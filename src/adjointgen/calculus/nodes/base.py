"""The base of the engine's own nodes: :class:`EngineNode` (where a node's rules live) and the
unary matrix node the projections share; ``DI``, ``DJ``: the arguments of every pairwise formula."""
from __future__ import annotations

import sympy as sp
from sympy import Basic
from sympy.matrices.expressions import MatrixExpr, Transpose


#: the two scalar arguments of every pairwise formula ``f(d_i, d_j)``
DI, DJ = sp.symbols("d_i d_j", real=True)


class EngineNode:
    """A node of the engine's own (SymPy's nodes, ``MatMul``, ``Transpose``, ..., are the core's):
    its rules live with its class, one section per node.

    - ``differential_rule(d)``: the node's differential, ``d`` giving a subexpression's;
    - ``evaluate_rule(ev, arith, size, env)``: its value, ``ev`` evaluating a subexpression with
      the arithmetic ``arith`` (NumPy or explicit SymPy matrices), ``size`` a dimension's value;
    - ``lower_rule(b)``: the value-DAG node it becomes (:class:`adjointgen.codegen.dag.DagBuilder`
      ``b``: ``b.lower(sub)``, ``b.emit(op, args, kind)``, ``b.kind(name)``, ``b.fail(message)``);
    - ``_eval_transpose``: its transpose, SymPy's hook.

    - ``expand_rule(alg, structure)``: its normal form, a term list (:mod:`adjointgen.calculus.algebra`;
      ``alg`` is :data:`~adjointgen.calculus.algebra.ALGEBRA`: ``expand``, ``normalize``,
      ``collect``, ``monomial`` and ``linear_node``, the normal form the projections share);
    - ``transpose_rule(alg, structure)``: its (conjugate) transpose as a term list (default: the
      unexpanded ``X^T``);
    - ``adjoint_rule(g)``: for a node linear in its argument ``X``, ``(X, G')`` with
      ``<g, node(X)> = <G', X>`` -- the transposition the VJP takes (default ``None``: not linear).

    A node without a rule raises where it is used (``no differential rule for ...``)."""

    def transpose_rule(self, alg, structure):
        return [(sp.Integer(1), (Transpose(self),))]

    def adjoint_rule(self, g):
        return None


class _UnaryMatrixNode(EngineNode, MatrixExpr):
    """A matrix-valued function of one square matrix with the argument's shape."""

    def __new__(cls, arg):
        arg = sp.sympify(arg)
        return Basic.__new__(cls, arg)

    @property
    def arg(self):
        return self.args[0]

    @property
    def shape(self):
        return self.arg.shape

    def doit(self, **hints):
        arg = self.arg.doit(**hints) if hints.get("deep", True) else self.arg
        return type(self)(arg)

    def _sympystr(self, printer):
        return f"{self._label}({printer._print(self.arg)})"

    def _latex(self, printer):
        return rf"\operatorname{{{self._label}}}\left({printer._print(self.arg)}\right)"

    # ---- the node's rules (each node class below is one section: its rules live with it)
    def differential_rule(self, d):
        """A linear projection: ``d P(X) = P(dX)`` (``d``: the differential of a subexpression)."""
        return type(self)(d(self.arg))

    def expand_rule(self, alg, structure):
        """The projections' shared normal form (distributed over sums, structure applied)."""
        return alg.linear_node(type(self), alg.expand(self.arg, structure), self.shape, structure)

    def adjoint_rule(self, g):
        """``<G, P(X)> = <P(G), X>``."""
        return self.arg, type(self)(g)

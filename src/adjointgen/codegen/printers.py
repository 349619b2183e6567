"""Printers: each backend's syntax for the IR operations, as data.

A printer turns one :class:`~adjointgen.codegen.ir.Value` into an expression string by looking up
its operation in a table of format strings (``{0}``, ``{1}`` are the arguments; ``{fn}``,
``{coeff}`` come from the node's attributes).  Scalar formulas of pairwise matrices are printed
with SymPy's own code printers.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy as sp
from sympy.printing.c import C99CodePrinter
from sympy.printing.pycode import PythonCodePrinter

from ..calculus.nodes import DI, DJ
from .ir import RuleIR, Value


@dataclass(frozen=True)
class ArrayPrinter:
    """Format strings for every IR operation of one array backend."""

    name: str
    table: dict
    #: statement forms that update a single-use temporary argument in place: ``{out}`` is the
    #: value's name; used only when the first argument is a temporary nothing else reads
    inplace: dict = None
    #: entries that differ for complex data (``^T`` is the conjugate transpose)
    complex_table: dict = None

    def value(self, v: Value, complex_: bool = False) -> str:
        table = {**self.table, **(self.complex_table or {})} if complex_ else self.table
        if v.op in ("solve", "solve_right", "inverse"):  # one entry per structure of the matrix
            key = f"{v.op}_{v.attr('structure')}"
            if key not in table:
                raise KeyError(f"printer '{self.name}' has no entry for operation '{key}'")
            return table[key].format(*v.args, **dict(v.attrs))
        if v.op not in table:
            raise KeyError(f"printer '{self.name}' has no entry for operation '{v.op}'"
                           + (" on complex data" if complex_ else ""))
        fmt = table[v.op]
        if v.op == "add":
            signs = dict(v.attrs).get("signs", "+" * len(v.args))
            text = ("-" if signs[0] == "-" else "") + v.args[0]
            return text + "".join(f" {sign} {a}" for sign, a in zip(signs[1:], v.args[1:]))
        if v.op == "scale" and v.attr("coeff") == "-1":
            return f"-{v.args[0]}"
        if v.op == "add_eye" and v.attr("coeff") in ("1", "-1"):
            fmt = fmt.replace("+ {coeff} * ", "+ " if v.attr("coeff") == "1" else "- ")
        return fmt.format(*v.args, **dict(v.attrs))

    def lines(self, rule: RuleIR) -> list[tuple[str, str]]:
        """``(name, expression)`` for every value of the rule, in order (``name`` is ``None`` for
        an in-place statement followed by an alias)."""
        uses: dict[str, int] = {}
        for v in rule.values:
            for a in v.args:
                uses[a] = uses.get(a, 0) + 1
        for _, name, _ in rule.outputs:
            uses[name] = uses.get(name, 0) + 1
        temps = {v.name for v in rule.values}
        out = []
        for v in rule.values:
            inplace = (self.inplace or {}).get(v.op)
            if inplace and v.args and v.args[0] in temps and uses.get(v.args[0], 0) == 1:
                out.append((None, inplace.format(*v.args, **dict(v.attrs))))
                out.append((v.name, v.args[0]))
            else:
                out.append((v.name, self.value(v, rule.complex)))
        return out


TORCH = ArrayPrinter(
    "torch",
    {
        "matmul": "{0} @ {1}",
        "transpose": "{0}.mT",
        "add": None,
        "scale": "{coeff} * {0}",
        # one copy of the matrix with the diagonal replaced; no n x n diagonal matrix is formed
        "add_diag": "torch.diagonal_scatter({0}, {0}.diagonal(dim1=-2, dim2=-1) + {1}, dim1=-2, dim2=-1)",
        "scale_rows": "{0}.unsqueeze(-1) * {1}",
        "scale_cols": "{0} * {1}.unsqueeze(-2)",
        "diag_mul": "{0} * {1}",
        "diagonal": "{0}.diagonal(dim1=-2, dim2=-1)",
        "reciprocal": "{0}.reciprocal()",
        "reciprocal_masked": "_degeneracy.reciprocal({0}, cluster_rtol)",
        "skew": "0.5 * ({0} - {0}.mT)",
        "sym": "0.5 * ({0} + {0}.mT)",
        "pairwise_mul": "{fn}_times({0}, {1}, 1{extra})",
        "hadamard": "{0} * {1}",
        "pairwise_mul_skew": "{fn}_times({0}, {1} - {1}.mT, 0.5{extra})",
        "pairwise_mul_sym": "{fn}_times({0}, {1} + {1}.mT, 0.5{extra})",
        "shifted_solve": "_solvers.shifted_solve({0}, {1}, {2}, {3}, {4})",
        "add_eye": "{0} + {coeff} * torch.eye({0}.shape[-1], dtype={0}.dtype, device={0}.device)",
        "lower_half": "{0}.tril(-1) + 0.5 * torch.diag_embed({0}.diagonal(dim1=-2, dim2=-1))",
        "strictly_lower": "{0}.tril(-1)",
        "solve_unit_lower": "torch.linalg.solve_triangular({0}, {1}, upper=False, unitriangular=True)",
        "solve_unit_upper": "torch.linalg.solve_triangular({0}, {1}, upper=True, unitriangular=True)",
        "solve_right_unit_lower": "torch.linalg.solve_triangular({1}, {0}, upper=False, left=False, unitriangular=True)",
        "solve_right_unit_upper": "torch.linalg.solve_triangular({1}, {0}, upper=True, left=False, unitriangular=True)",
        "inverse_unit_lower": "torch.linalg.inv({0})",
        "inverse_unit_upper": "torch.linalg.inv({0})",
        "solve_lu": "_linalg.lu_solve({0}, {1}, {2}, {3}, adjoint={adjoint})",
        "solve_right_lu": "_linalg.lu_solve({1}, {2}, {3}, {0}, adjoint={adjoint}, left=False)",
        "solve_general": "torch.linalg.solve({0}, {1})",
        "solve_lower": "torch.linalg.solve_triangular({0}, {1}, upper=False)",
        "solve_upper": "torch.linalg.solve_triangular({0}, {1}, upper=True)",
        "solve_right_general": "torch.linalg.solve({1}, {0}, left=False)",
        "solve_right_lower": "torch.linalg.solve_triangular({1}, {0}, upper=False, left=False)",
        "solve_right_upper": "torch.linalg.solve_triangular({1}, {0}, upper=True, left=False)",
        "inverse_general": "torch.linalg.inv({0})",
        "inverse_lower": "torch.linalg.inv({0})",
        "inverse_upper": "torch.linalg.inv({0})",
        "inverse_lu": "_linalg.lu_solve({0}, {1}, {2}, torch.eye({0}.shape[-1], dtype={0}.dtype, device={0}.device))",
        "trace": "{0}.diagonal(dim1=-2, dim2=-1).sum(-1)",
        "sum": "{0}.sum(-1)",
        "scale_by": "{0}[..., None, None] * {1}",
        "scale_by_vector": "{0}[..., None] * {1}",
        "conj": "{0}",
        "real_part": "{0}",
        "imaginary_part": "torch.zeros_like({0})",
        "scalar_mul": "{0} * {1}",
        "zeros_like": "torch.zeros_like({0})",
    },
    # no in-place statements: a backward may run under vmap with batched cotangents (jacrev,
    # is_grads_batched), where writing a batched value into an unbatched temporary fails
    complex_table={
        "transpose": "{0}.mH",
        "skew": "0.5 * ({0} - {0}.mH)",
        "sym": "0.5 * ({0} + {0}.mH)",
        "pairwise_mul_skew": "{fn}_times({0}, {1} - {1}.mH, 0.5{extra})",
        "pairwise_mul_sym": "{fn}_times({0}, {1} + {1}.mH, 0.5{extra})",
        "diag_sym": "{0}.diagonal(dim1=-2, dim2=-1).real",
        "diag_skew": "1j * {0}.diagonal(dim1=-2, dim2=-1).imag",
        "conj": "{0}.conj()",
        "real_part": "{0}.real",
        "imaginary_part": "1j * {0}.imag",
    },
)

XP = ArrayPrinter(
    "xp",
    {
        "matmul": "xp.matmul({0}, {1})",
        "transpose": "xp.swapaxes({0}, -1, -2)",
        "add": None,
        "scale": "{coeff} * {0}",
        "add_diag": "_add_diag(xp, {0}, {1})",
        "scale_rows": "{0}[..., :, None] * {1}",
        "scale_cols": "{0} * {1}[..., None, :]",
        "diag_mul": "{0} * {1}",
        "diagonal": "xp.diagonal({0}, axis1=-2, axis2=-1).copy()",
        "reciprocal": "1 / {0}",
        "reciprocal_masked": "_reciprocal(xp, {0}, cluster_rtol)",
        "skew": "0.5 * ({0} - xp.swapaxes({0}, -1, -2))",
        "sym": "0.5 * ({0} + xp.swapaxes({0}, -1, -2))",
        "pairwise_mul": "{fn}_mul(xp, {0}, {1}, part='none'{extra})",
        "hadamard": "{0} * {1}",
        "pairwise_mul_skew": "{fn}_mul(xp, {0}, {1}, part='skew'{extra})",
        "pairwise_mul_sym": "{fn}_mul(xp, {0}, {1}, part='sym'{extra})",
        "shifted_solve": "_shifted_solve(xp, {0}, {1}, {2}, {3}, {4})",
        "add_eye": "{0} + {coeff} * xp.eye({0}.shape[-1], dtype={0}.dtype)",
        "lower_half": "xp.tril({0}, -1) + 0.5 * ({0} * xp.eye({0}.shape[-1], dtype={0}.dtype))",
        "strictly_lower": "xp.tril({0}, -1)",
        "solve_unit_lower": "_solve_triangular(xp, {0}, {1}, lower=True, unit=True)",
        "solve_unit_upper": "_solve_triangular(xp, {0}, {1}, lower=False, unit=True)",
        "solve_right_unit_lower": "xp.swapaxes(_solve_triangular(xp, xp.swapaxes({1}, -1, -2), xp.swapaxes({0}, -1, -2), lower=False, unit=True), -1, -2)",
        "solve_right_unit_upper": "xp.swapaxes(_solve_triangular(xp, xp.swapaxes({1}, -1, -2), xp.swapaxes({0}, -1, -2), lower=True, unit=True), -1, -2)",
        "inverse_unit_lower": "xp.linalg.inv({0})",
        "inverse_unit_upper": "xp.linalg.inv({0})",
        "solve_lu": "_lu_solve(xp, {0}, {1}, {2}, {3}, adjoint={adjoint})",
        "solve_right_lu": "_lu_solve(xp, {1}, {2}, {3}, {0}, adjoint={adjoint}, left=False)",
        "solve_general": "xp.linalg.solve({0}, {1})",
        "solve_lower": "_solve_triangular(xp, {0}, {1}, lower=True)",
        "solve_upper": "_solve_triangular(xp, {0}, {1}, lower=False)",
        "solve_right_general": "xp.swapaxes(xp.linalg.solve(xp.swapaxes({1}, -1, -2), xp.swapaxes({0}, -1, -2)), -1, -2)",
        "solve_right_lower": "xp.swapaxes(_solve_triangular(xp, xp.swapaxes({1}, -1, -2), xp.swapaxes({0}, -1, -2), lower=False), -1, -2)",
        "solve_right_upper": "xp.swapaxes(_solve_triangular(xp, xp.swapaxes({1}, -1, -2), xp.swapaxes({0}, -1, -2), lower=True), -1, -2)",
        "inverse_general": "xp.linalg.inv({0})",
        "inverse_lower": "xp.linalg.inv({0})",
        "inverse_upper": "xp.linalg.inv({0})",
        "inverse_lu": "_lu_solve(xp, {0}, {1}, {2}, xp.eye({0}.shape[-1], dtype={0}.dtype))",
        "trace": "xp.trace({0}, axis1=-2, axis2=-1)",
        "sum": "{0}.sum(-1)",
        "scale_by": "xp.asarray({0})[..., None, None] * {1}",
        "scale_by_vector": "xp.asarray({0})[..., None] * {1}",
        "conj": "{0}",
        "real_part": "{0}",
        "imaginary_part": "0 * {0}",
        "scalar_mul": "{0} * {1}",
        "zeros_like": "xp.zeros_like({0})",
    },
    inplace={
        "add_diag": "_add_diag_(xp, {0}, {1})",
    },
    complex_table={
        "transpose": "xp.conj(xp.swapaxes({0}, -1, -2))",
        "skew": "0.5 * ({0} - xp.conj(xp.swapaxes({0}, -1, -2)))",
        "sym": "0.5 * ({0} + xp.conj(xp.swapaxes({0}, -1, -2)))",
        "pairwise_mul": "{fn}_mul(xp, {0}, {1}, part='none', hermitian=True{extra})",
        "pairwise_mul_skew": "{fn}_mul(xp, {0}, {1}, part='skew', hermitian=True{extra})",
        "pairwise_mul_sym": "{fn}_mul(xp, {0}, {1}, part='sym', hermitian=True{extra})",
        "diag_sym": "xp.diagonal({0}, axis1=-2, axis2=-1).real.copy()",
        "diag_skew": "1j * xp.diagonal({0}, axis1=-2, axis2=-1).imag",
        "conj": "xp.conj({0})",
        "real_part": "xp.real({0})",
        "imaginary_part": "1j * xp.imag({0})",
    },
)

PRINTERS = {"torch": TORCH, "xp": XP}


class _ScalarPython(PythonCodePrinter):
    """Python scalar printer for array operands (no ``math.`` prefix needed for +-*/)."""

    def _print_Symbol(self, expr):
        return {DI.name: "d_i", DJ.name: "d_j"}.get(expr.name, super()._print_Symbol(expr))

    def _print_Pow(self, expr, rational=False):
        base, exp = expr.args
        if exp == 2:  # x*x: one multiply, and no pow kernel on tensors (parenthesized: it may divide)
            b = self.parenthesize(base, 100)
            return f"({b}*{b})"
        return super()._print_Pow(expr, rational=rational)


class _ScalarC(C99CodePrinter):
    def _print_Symbol(self, expr):
        return {DI.name: "d_i", DJ.name: "d_j"}.get(expr.name, super()._print_Symbol(expr))

    def _print_Integer(self, expr):
        return f"T({int(expr)})"

    def _print_Pow(self, expr):
        base, exp = expr.args
        if exp.is_Integer and 2 <= int(exp) <= 4:  # products, not pow(): exact and cheaper
            b = self.parenthesize(base, 100)
            return "(" + "*".join([b] * int(exp)) + ")"
        return super()._print_Pow(expr)

    def _print_Rational(self, expr):
        return f"(T({expr.p}) / T({expr.q}))"


def scalar_python(expr: sp.Expr) -> str:
    return _ScalarPython({"strict": True}).doprint(expr)


def scalar_c(expr: sp.Expr) -> str:
    return _ScalarC({"strict": True}).doprint(expr)


class _ArrayPython(PythonCodePrinter):
    """Elementwise array expressions: SymPy's Python printer with ``math.`` functions taken from an
    array module (``torch.exp``, ``xp.log1p``); ``abs`` and ``**`` work on arrays as written."""

    def __init__(self, module: str, settings=None):
        super().__init__(settings or {})
        self.array_module = module

    def _module_format(self, fqn, register=True):
        if fqn.startswith("math."):
            return f"{self.array_module}.{fqn[5:]}"
        return super()._module_format(fqn, register)

    def _print_Pow(self, expr, rational=False):
        base, exp = expr.args
        if exp == 2:  # parenthesized: it may divide
            b = self.parenthesize(base, 100)
            return f"({b}*{b})"
        return super()._print_Pow(expr, rational=rational)


def array_python(expr: sp.Expr, module: str = "torch") -> str:
    """``expr`` as an elementwise expression on arrays of the module ``module`` (``torch``, ``xp``)."""
    return _ArrayPython(module, {"strict": True, "fully_qualified_modules": True}).doprint(sp.sympify(expr))

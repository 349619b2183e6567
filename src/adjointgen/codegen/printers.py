"""Printers: a backend's syntax for the IR operations, as data.

A printer turns one :class:`~adjointgen.codegen.ir.Value` into an expression string by looking up
its operation in a table of format strings (``{0}``, ``{1}`` are the arguments; ``{fn}``,
``{coeff}`` come from the node's attributes).  Each backend's table lives with its row, in
:mod:`adjointgen.codegen.backends`.  Scalar formulas of pairwise matrices are printed with SymPy's
own code printers.
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
    #: what each module-level name ``_x`` of the entries and of the backend's templates is bound
    #: to: ``"package.module:attr"`` or ``"module"``; a generated module imports the ones its code
    #: reads (:mod:`adjointgen.codegen.imports`)
    imports: dict = None
    #: which declared forward the backend's code calls (``"torch"`` or ``"numpy"``, the fields of
    #: :class:`~adjointgen.calculus.records.ForwardSpec`), and the module of its runtime's forwards
    #: (where ``forward(runtime="eigh")`` finds ``eigh``)
    forward: str = "numpy"
    forwards: str = ""

    def forward_import(self, public) -> dict:
        """The import of the operation's forward as ``_forward`` (none for a host forward, bound by
        the template, nor for ``xp.`` names, looked up on the array module)."""
        ref = getattr(public, f"{self.forward}_forward", None) if public is not None else None
        if ref is None or ref.host or ref.xp:
            return {}
        return {"_forward": f"{self.forwards if ref.runtime else ref.module}:{ref.attr}"}

    @staticmethod
    def _fields(v: Value) -> dict:
        """The value's attributes as the table's format fields (``options`` as keyword arguments)."""
        fields = dict(v.attrs)
        if "options" in fields:
            fields["options"] = "".join(f", {k}={arg}" for k, arg in fields["options"])
        return fields

    def value(self, v: Value, complex_: bool = False) -> str:
        table = {**self.table, **(self.complex_table or {})} if complex_ else self.table
        if v.op in ("solve", "solve_right", "inverse"):  # one entry per structure of the matrix
            key = f"{v.op}_{v.attr('structure')}"
            if key not in table:
                raise KeyError(f"printer '{self.name}' has no entry for operation '{key}'")
            return table[key].format(*v.args, **self._fields(v))
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
        return fmt.format(*v.args, **self._fields(v))

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
                out.append((None, inplace.format(*v.args, **self._fields(v))))
                out.append((v.name, v.args[0]))
            else:
                out.append((v.name, self.value(v, rule.complex)))
        return out

    def statements(self, rule: RuleIR) -> list[str]:
        """The rule's body, one statement per value (:meth:`lines`)."""
        return [expr if name is None else f"{name} = {expr}" for name, expr in self.lines(rule)]


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
        if exp == 2:  # x*x: one multiply, no pow kernel on tensors (parenthesized: it may divide)
            b = self.parenthesize(base, 100)
            return f"({b}*{b})"
        return super()._print_Pow(expr, rational=rational)


class _ScalarPython(_ArrayPython):
    """The elementwise printer of a pairwise matrix's formula in ``d_i``, ``d_j`` (array operands);
    functions (``exp`` of a user's pairwise matrix) come from the array module (``torch.exp``,
    ``xp.exp``)."""

    def _print_Symbol(self, expr):
        return {DI.name: "d_i", DJ.name: "d_j"}.get(expr.name, super()._print_Symbol(expr))

    def _print_conjugate(self, expr):  # arrays of torch, NumPy/CuPy and JAX all have .conj()
        return f"({self._print(expr.args[0])}).conj()"


def scalar_python(expr: sp.Expr, module: str = "torch") -> str:
    return _ScalarPython(module, {"strict": True, "fully_qualified_modules": True}).doprint(expr)


def array_python(expr: sp.Expr, module: str = "torch") -> str:
    """``expr`` as an elementwise expression on arrays of the module ``module`` (``torch``, ``xp``)."""
    return _ArrayPython(module, {"strict": True, "fully_qualified_modules": True}).doprint(sp.sympify(expr))


# ====================================================================================== scalar programs in CUDA
#: value of each unary primitive in CUDA C++ ({0}: the argument, {p}: the parameter)
CUDA_VALUES = {
    "exp": "exp({0})", "log": "log({0})", "log1p": "log1p({0})", "expm1": "expm1({0})", "sin": "sin({0})",
    "cos": "cos({0})", "tan": "tan({0})", "sinh": "sinh({0})", "cosh": "cosh({0})", "tanh": "tanh({0})",
    "atan": "atan({0})", "asin": "asin({0})", "acos": "acos({0})", "asinh": "asinh({0})", "acosh": "acosh({0})",
    "atanh": "atanh({0})", "erf": "erf({0})", "erfc": "erfc({0})", "gamma": "tgamma({0})",
    "loggamma": "lgamma({0})", "besselj0": "j0({0})", "besselj1": "j1({0})", "sinc": "ag::sinc({0})",
    "abs": "fabs({0})", "sign": "ag::sign_value({0})", "heaviside": "ag::heaviside_value({0}, T({p}))",
    "floor": "floor({0})", "ceiling": "ceil({0})", "softplus": "ag::softplus_value({0})",
    "sigmoid": "(T(1) / (T(1) + exp(-({0}))))", "xlogx": "ag::xlogx_value({0})",
}
#: primitives with an identity for the first divided difference: ag::<kind>_dd(p, q)
CUDA_IDENTITIES = {"exp", "log", "log1p", "expm1", "sin", "cos", "tan", "sinh", "cosh", "tanh", "sigmoid",
                   "softplus", "atan", "atanh", "asinh", "xlogx", "abs"}
CUDA_STEPS = {"sign", "heaviside", "floor", "ceiling"}
_CUDA_RELATIONS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def _c_number(v) -> str:
    import math

    v = float(v)
    if math.isnan(v):
        return "T(NAN)"
    if math.isinf(v):
        return "T(INFINITY)" if v > 0 else "T(-INFINITY)"
    return f"T({v!r})"


def _cuda_values(program, points, prefix, opts):
    """Statements computing every op's value at each of ``points`` (``{"a": "a", ...}``): lines, and
    per op the names ``{point: name}``."""
    lines, names = [], []
    for i, op in enumerate(program.ops):
        k, args = op.kind, op.args
        here = {}
        boolean = k in _CUDA_RELATIONS or k in ("and", "or", "not")
        for pt, var in points.items():
            n = f"{prefix}{pt}{i}"
            here[pt] = n
            arg = [names[j][pt] for j in args]
            if k == "x":
                e = var
            elif k == "const":
                e = _c_number(op.param)
            elif k == "option":
                e = opts[int(op.param)]
            elif k == "add":
                e = " + ".join(arg)
            elif k == "mul":
                e = " * ".join(arg)
            elif k == "pow":
                c = names[args[1]][pt] if len(args) == 2 else _c_number(op.param)
                e = f"ag::pow_value({arg[0]}, {c})"
            elif k in _CUDA_RELATIONS:
                e = f"({arg[0]} {_CUDA_RELATIONS[k]} {arg[1]})"
            elif k in ("and", "or"):
                e = "(" + (" && " if k == "and" else " || ").join(arg) + ")"
            elif k == "not":
                e = f"(!{arg[0]})"
            elif k == "piecewise":
                *pairs, otherwise = arg
                e = otherwise
                for c_, ex in reversed(list(zip(pairs[0::2], pairs[1::2]))):
                    e = f"({c_} ? {ex} : {e})"
            elif k in CUDA_VALUES:
                e = CUDA_VALUES[k].format(arg[0], p=op.param)
            else:
                raise ValueError(f"the CUDA backend cannot evaluate the primitive {k!r} of {program.text}")
            lines.append(f"const {'bool' if boolean else 'T'} {n} = {e};")
        names.append(here)
    return lines, names


def program_cuda_value(program, name: str) -> str:
    """A ``__host__ __device__`` function ``T name(T x, T opt...)``: the program's value."""
    opts = [f"o{i}" for i in range(len(program.options))]
    lines, names = _cuda_values(program, {"x": "x"}, "v", opts)
    params = "".join(f", T {o}" for o in opts)
    body = "\n    ".join(lines + [f"return {names[-1]['x']};"])
    return f"template <typename T>\nAG_FN T {name}(T x{params}) {{\n    {body}\n}}"


def program_cuda_dd(program, name: str, options=()) -> str:
    """CUDA source of ``T name_dd(T a, T b, T options...)``: ``f[a, b]`` of the program, composed from
    the primitives' divided differences of ``adjointgen_divided.cuh`` by the chain and Leibniz rules;
    primitives without an identity get their derivative programs as helper functions."""
    from ..runtime.divided.primitives import FIRST_TERMS

    opts = list(options)
    helpers = []
    lines, names = _cuda_values(program, {"a": "a", "b": "b"}, "v", opts)
    dd = []
    for i, op in enumerate(program.ops):
        k, args = op.kind, op.args
        n = f"d{i}"
        va, vb = names[i]["a"], names[i]["b"]
        if k == "x":
            e = "T(1)"
        elif k in ("const", "option") or k in _CUDA_RELATIONS or k in ("and", "or", "not"):
            dd.append(None)
            continue
        elif k == "add":
            parts = [dd[j] for j in args if dd[j] is not None]
            e = " + ".join(parts) if parts else "T(0)"
        elif k == "mul":
            j0 = args[0]
            ua, ub, d = names[j0]["a"], names[j0]["b"], dd[j0] or "T(0)"
            for j in args[1:]:
                d = (f"(({d}) * (T(0.5) * {names[j]['a']} + T(0.5) * {names[j]['b']}) + "
                     f"(T(0.5) * {ua} + T(0.5) * {ub}) * ({dd[j] or 'T(0)'}))")
                ua, ub = f"({ua} * {names[j]['a']})", f"({ub} * {names[j]['b']})"
            e = d
        elif k == "pow":
            u = args[0]
            c = names[args[1]]["a"] if len(args) == 2 else _c_number(op.param)
            e = f"ag::pow_dd({names[u]['a']}, {names[u]['b']}, {c}) * ({dd[u] or 'T(0)'})"
        elif k in CUDA_IDENTITIES:
            u = args[0]
            e = f"ag::{k}_dd({names[u]['a']}, {names[u]['b']}) * ({dd[u] or 'T(0)'})"
        elif k in CUDA_STEPS:
            u = args[0]
            e = f"ag::step_dd({va}, {vb}, {names[u]['a']}, {names[u]['b']}) * ({dd[u] or 'T(0)'})"
        elif k == "piecewise":
            conds, exprs = list(args[0:-1:2]), list(args[1:-1:2]) + [args[-1]]
            ia = " : ".join(f"{names[c_]['a']} ? {j}" for j, c_ in enumerate(conds)) + f" : {len(conds)}" \
                if conds else "0"
            ib = " : ".join(f"{names[c_]['b']} ? {j}" for j, c_ in enumerate(conds)) + f" : {len(conds)}" \
                if conds else "0"
            lines.append(f"const int ia{i} = {ia}, ib{i} = {ib};")
            same = "T(0)"
            for j in reversed(range(len(exprs))):
                same = f"(ia{i} == {j} ? ({dd[exprs[j]] or 'T(0)'}) : {same})"
            e = f"(ia{i} == ib{i} ? {same} : ({va} - {vb}) / ag::safe(a - b))"
        elif k in CUDA_VALUES:  # no identity: the quotient or the midpoint series
            u = args[0]
            key = f"polygamma:{op.param}" if k == "polygamma" else k
            derivs = program.derivative_programs(key)
            if not derivs:
                raise ValueError(f"the CUDA backend has no divided difference for {k} in {program.text}")
            stem = f"{name}_{k}{i}"
            for order, dp in enumerate(derivs, 1):
                helpers.append(program_cuda_value(dp, f"{stem}_d{order}"))
            cases = " ".join(f"case {o}: return {stem}_d{o}<T>(m{', T(0)' if derivs[o - 1].options else ''});"
                             for o in range(1, len(derivs) + 1))
            helpers.append(f"template <typename T>\nstruct {stem}_derivative {{\n    AG_FN T operator()(int k, T m) const "
                           f"{{\n        switch (k) {{ {cases} default: return T(NAN); }}\n    }}\n}};\n"
                           f"template <typename T>\nstruct {stem}_value {{\n    AG_FN T operator()(T y) const "
                           f"{{ return {CUDA_VALUES[k].format('y', p=op.param)}; }}\n}};")
            terms = min(FIRST_TERMS, (len(derivs) + 1) // 2)
            e = (f"ag::generic_dd({names[u]['a']}, {names[u]['b']}, {stem}_value<T>(), {stem}_derivative<T>(), "
                 f"{terms}) * ({dd[u] or 'T(0)'})")
        else:
            raise ValueError(f"the CUDA backend cannot differentiate the primitive {k!r} of {program.text}")
        lines.append(f"const T {n} = {e};")
        dd.append(n)
    last = dd[-1] or "T(0)"
    params = "".join(f", T {o}" for o in opts)
    body = "\n    ".join(lines + [f"(void)a; (void)b; return {last};"])
    fn = f"template <typename T>\nAG_FN T {name}_dd(T a, T b{params}) {{\n    {body}\n}}"
    return "\n\n".join(helpers + [fn])

"""Readable audit pages: ``adjointgen audit --html DIR``.

One self-contained HTML page per derivation (no scripts, no network, no CDN: equations are MathML,
which browsers render natively) and an index.  Each page has a summary (steps, passed, instances,
tolerances), the definition of every pairwise matrix, the final JVP and VJP rules, every step with
its equation, residual and symbolic verdict, and the derivation's source with a line anchor that
each step links to.  The layout lives in the templates ``report/audit.html.j2`` and
``report/index.html.j2`` (a project may override them).
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

import sympy as sp
from sympy.printing.mathml import MathMLPresentationPrinter

__all__ = ["MathML", "mathml", "write_site"]


class MathML(MathMLPresentationPrinter):
    """SymPy's presentation MathML printer, taught adjointgen's nodes: ``diag``, ``sym``, ``skew``,
    the projected shifted solve, pairwise matrices, triangular projections, traces and
    determinants; ``^T`` printed as
    ``^H`` for complex derivations."""

    def __init__(self, complex_: bool = False):
        super().__init__({"mul_symbol": None})
        self.complex = complex_

    def _function(self, name, arg):
        row = self.dom.createElement("mrow")
        mi = self.dom.createElement("mi")
        mi.setAttribute("mathvariant", "normal")
        mi.appendChild(self.dom.createTextNode(name))
        row.appendChild(mi)
        fenced = self.dom.createElement("mrow")
        for text, node in (("(", None), (None, arg), (")", None)):
            if node is None:
                mo = self.dom.createElement("mo")
                mo.appendChild(self.dom.createTextNode(text))
                fenced.appendChild(mo)
            else:
                fenced.appendChild(self._print(node))
        row.appendChild(fenced)
        return row

    def _print_DiagPart(self, e):
        return self._function("diag", e.arg)

    def _print_Sym(self, e):
        return self._function("sym", e.arg)

    def _print_Skew(self, e):
        return self._function("skew", e.arg)

    def _print_LowerHalf(self, e):
        return self._function("Φ", e.arg)

    def _print_StrictlyLower(self, e):
        return self._function("tril₋", e.arg)

    def _print_TriangularSylvesterSolve(self, e):
        """``Syl₋_T(C)``: the strictly lower solution of ``tril₋(X T - T X) = tril₋(C)``."""
        row = self.dom.createElement("mrow")
        sub = self.dom.createElement("msub")
        mi = self.dom.createElement("mi")
        mi.appendChild(self.dom.createTextNode("Syl₋"))
        sub.appendChild(mi)
        sub.appendChild(self._print(e.operator[0]))
        row.appendChild(sub)
        row.appendChild(self._function("", e.arg))
        return row

    def _print_Trace(self, e):
        return self._function("tr", e.arg)

    def _print_LogAbsDet(self, e):
        return self._function("log|det|", e.arg)

    def _print_SignDet(self, e):
        return self._function("sgn det", e.arg)

    def _print_Det(self, e):
        return self._function("det", e.arg)

    def _print_Adjugate(self, e):
        return self._function("adj", e.arg)

    def _print_ScalarIdentity(self, e):  # g I
        row = self.dom.createElement("mrow")
        row.appendChild(self._print(e.arg))
        row.appendChild(self._print_Identity(None))
        return row

    def _print_DiagFunction(self, e):
        """``f(D)``; a derivative of an undefined ``f`` as ``f′(D)`` (not ``Derivative(f(·), ·)``)."""
        (x,), body = e.function.variables, e.function.expr
        if isinstance(body, sp.Derivative) and isinstance(body.expr, sp.core.function.AppliedUndef):
            order = sum(count for var, count in body.variable_count if var == x)
            return self._function(body.expr.func.__name__ + "′" * order, e.arg)
        return self._function(e.label, e.arg)

    def _print_MatrixSymbol(self, e, style="plain"):
        """A tangent ``dU`` (cotangent ``gU``) as an upright ``d`` (``g``) before the italic name, so
        ``A dU`` does not read as ``AdU``; other symbols as SymPy prints them."""
        name = e.name
        if len(name) > 1 and name[0] in "dg" and (name[1].isupper() or name[1] in "ΩΘ"):
            row = self.dom.createElement("mrow")
            prefix = self.dom.createElement("mi")
            prefix.setAttribute("mathvariant", "normal")
            prefix.appendChild(self.dom.createTextNode(name[0]))
            row.appendChild(prefix)
            rest = self.dom.createElement("mi")
            rest.appendChild(self.dom.createTextNode(name[1:]))
            row.appendChild(rest)
            return row
        return super()._print_MatrixSymbol(e)

    def _print_MatMul(self, expr):
        """Factors separated by a thin space as well as the invisible product (``A dU``, ``dA U``)."""
        node = super()._print_MatMul(expr)
        for mo in list(node.getElementsByTagName("mo")):
            if mo.firstChild is not None and mo.firstChild.data in ("\u2062", "&InvisibleTimes;"):
                space = self.dom.createElement("mspace")
                space.setAttribute("width", "0.2em")
                mo.parentNode.insertBefore(space, mo.nextSibling)
        return node

    def _print_ShiftedSolve(self, e):
        A, B, U, D = e.operator
        row = self.dom.createElement("mrow")
        sub = self.dom.createElement("msub")
        mi = self.dom.createElement("mi")
        mi.appendChild(self.dom.createTextNode("S"))
        sub.appendChild(mi)
        sub.appendChild(self._print(U))
        row.appendChild(sub)
        fenced = self._function("", e.arg)
        row.appendChild(fenced)
        return row

    def _print_SylvesterSolve(self, e):
        """``Syl_{A,B}(C)``: the solution of ``A X + X B = C``."""
        A, B = e.operator[:2]
        row = self.dom.createElement("mrow")
        sub = self.dom.createElement("msub")
        mi = self.dom.createElement("mi")
        mi.appendChild(self.dom.createTextNode("Syl"))
        sub.appendChild(mi)
        pair = self.dom.createElement("mrow")
        pair.appendChild(self._print(A))
        comma = self.dom.createElement("mo")
        comma.appendChild(self.dom.createTextNode(","))
        pair.appendChild(comma)
        pair.appendChild(self._print(B))
        sub.appendChild(pair)
        row.appendChild(sub)
        row.appendChild(self._function("", e.arg))
        return row

    def _print_Identity(self, e):
        mi = self.dom.createElement("mi")
        mi.setAttribute("mathvariant", "normal")
        mi.appendChild(self.dom.createTextNode("I"))
        return mi

    def _print_ZeroMatrix(self, e):
        mn = self.dom.createElement("mn")
        mn.appendChild(self.dom.createTextNode("0"))
        return mn

    def _print_Transpose(self, e):
        node = super()._print_Transpose(e)
        if self.complex:  # the conjugate transpose in complex derivations
            for mo in node.getElementsByTagName("mo"):
                if mo.firstChild is not None and mo.firstChild.data == "T":
                    mo.firstChild.data = "H"
        return node


def mathml(expr, *, complex_: bool = False, display: str = "inline") -> str:
    """``<math>`` markup of a SymPy expression (or of an equation given as ``(lhs, rhs)``)."""
    printer = MathML(complex_)
    if isinstance(expr, tuple):
        lhs, rhs = expr
        body = printer._print(lhs).toxml() + "<mo>=</mo>" + printer._print(rhs).toxml()
    else:
        body = printer._print(expr).toxml()
    body = body.replace("&InvisibleTimes;", "&#x2062;")
    return f'<math display="{display}"><mrow>{body}</mrow></math>'


#: what each step kind does, as the pages say it
KINDS = {
    "forward": "declared forward", "identity": "identity", "differentiate": "differentiate",
    "left_multiply": "left-multiply", "right_multiply": "right-multiply", "transpose": "transpose",
    "substitute": "substitute", "define": "definition", "skew": "structure", "hadamard_split": "Hadamard split",
    "diagonal_part": "diagonal part", "part": "Hermitian part", "gauge": "gauge", "solve": "solve",
    "solve_offdiagonal": "solve off the diagonal", "solve_shifted": "projected shifted solve",
    "solve_sylvester": "Sylvester solve", "solve_triangular_sylvester": "triangular Sylvester solve",
    "solve_hadamard": "solve entrywise", "combine_pairwise": "combine pairwise factors", "subtract": "subtract",
    "second_order": "second-order rule", "adjoint": "self-adjoint projection",
    "isolate": "isolate", "add": "add", "same": "two routes meet", "jvp": "JVP", "rewrite": "rewrite for code",
    "specialize": "real specialisation", "square": "square shapes", "directions": "general directions", "value_block": "value block", "project": "project", "lowrank": "low-rank factors", "error": "error",
    "triangular": "triangular projection", "lower_part": "triangular projection",
}


def _verdict(step_kind: str, symbolic: str) -> tuple[str, str]:
    """(text, css class) of a step's verification column: how it was verified."""
    from ..audit.runner import verdict_kind

    kind = verdict_kind(symbolic)
    if kind in ("exact", "symbolic"):
        return symbolic, "ok"
    if kind == "failed":
        return symbolic, "fail"
    if kind == "skipped":
        return "skipped (numeric only)", "na"
    if kind == "premise":
        return symbolic + " (checked numerically)", "na"
    return symbolic, "fail"


def _label_math(label: str, d, complex_: bool) -> str:
    """A step label as HTML with the formulas in it as MathML: the engine writes labels such as
    ``JVP dX rewritten for code: -X*dA*X`` or ``introduce dO = U.T*dU`` with SymPy's text of an
    expression; the part after the first ``: `` or `` = `` that parses as one is set as math.  What
    does not parse keeps readable notation (``A⁻¹``, ``Uᵀ``), never SymPy's (``A**(-1)``, ``U.T``)."""
    for sep in (": ", " = "):
        start = 0
        while True:
            i = label.find(sep, start)
            if i < 0:
                break
            expr = _parse_label_expr(label[i + len(sep):], d)
            if expr is not None:
                return html.escape(_plain(label[:i], complex_)) + html.escape(sep) + mathml(expr, complex_=complex_)
            start = i + 1
    return html.escape(_plain(label, complex_))


def _plain(text: str, complex_: bool) -> str:
    """SymPy's operators in text as mathematical notation."""
    import re

    t = "ᴴ" if complex_ else "ᵀ"
    text = re.sub(r"\*\*\(-1\)|\*\*-1|\^-1", "⁻¹", text)
    text = re.sub(r"\*\*2\b|\^2\b", "²", text)
    text = re.sub(r"(?<=[\w)\]])\.T\b|\^T\b|\^H\b", t, text)
    text = re.sub(r"\bHadamardProduct\(([^(),]+), ", r"\1 ∘ (", text)
    return re.sub(r"(?<=[\w)⁻¹ᵀᴴ²])\*(?=[\w(])", " ", text)


def _parse_label_expr(text: str, d):
    """The SymPy expression a label's text spells, with the derivation's symbols, or ``None``."""
    import re

    from sympy.matrices.expressions import HadamardProduct, Identity, Inverse, MatrixSymbol, Transpose

    from ..calculus.nodes import DiagPart, Skew, Sym, SylvesterSolve

    text = text.strip()
    if not text or not re.fullmatch(r"[\w\s.*+\-/()\[\],]+", text) or not re.search(r"[*.(]", text):
        return None
    names = {}
    for s in (*d.inputs, *d.outputs, *d.tangents.values(), *d.cotangents.values(), *(s for s, _ in d.introduced),
              *d.gauge_parameters):
        names[s.name] = s
    for name in d.pairwise:
        size = next(iter(names.values())).shape[0] if names else 3
        names[name] = MatrixSymbol(name, size, size)

    text = re.sub(r"Syl\[([^\[\]]+), ([^\[\]]+)\]\(", r"__syl__(\1, \2, ", text)
    namespace = dict(names, HadamardProduct=HadamardProduct, Inverse=Inverse, Transpose=Transpose,
                     Identity=Identity, diag=DiagPart, sym=Sym, skew=Skew, __builtins__={},
                     __syl__=lambda A, B, *arg: SylvesterSolve(arg[0], A, B) if len(arg) == 1 else None)
    try:
        value = eval(compile(text, "<label>", "eval"), namespace)  # noqa: S307 - symbols and node classes only
    except Exception:  # noqa: BLE001 - not a formula: the label stays text
        return None
    return value if isinstance(value, sp.MatrixExpr) else None


@dataclass(frozen=True)
class _Row:
    index: int
    label: str
    kind: str
    equation: str
    residual: str
    passed: bool
    verdict: str
    verdict_class: str
    line: int | None
    note: str
    helper: tuple | None = None  # (file name, line, anchor) when a helper module recorded the step


def _page_data(project, a) -> dict:
    d, report = a.derivation, a.report
    complex_ = d.field == "complex"
    rows = []
    helpers: dict[str, str] = {}  # helper module path -> its anchor prefix
    for step, r in zip(d.steps, report.steps):
        eq = "" if step.equation is None else mathml((step.equation.lhs, step.equation.rhs), complex_=complex_)
        if step.kind == "second_order" and d.second is not None:  # the second divided difference
            T = d.second.T
            eq = mathml((sp.Function(d.second.name)(*T.variables), T.expr))
        helper = None
        if step.helper is not None:
            file, line = step.helper
            anchor = helpers.setdefault(str(file), f"H{len(helpers) + 1}")
            helper = (Path(file).name, line, f"{anchor}-L{line}")
        text, css = _verdict(r.kind, r.symbolic)
        label = _label_math(r.label, d, complex_)
        rows.append(_Row(r.index, label, KINDS.get(r.kind, r.kind), eq,
                         "" if r.residual is None else f"{r.residual:.1e}", r.passed, text, css, r.line,
                         _plain(r.note, complex_), helper))
    pairwise = []
    for name, p in sorted(d.pairwise.items()):
        entry = mathml((sp.Symbol(f"{name}_ij"), p.expr))
        diag = mathml((sp.Symbol(f"{name}_ii"), p.diagonal_value))
        pairwise.append({"name": name, "entry": entry, "diagonal": diag, "origin": p.origin,
                         "of": p.diagonal_of, "meaning": p.meaning})
    rules = []
    for kind, rule in (("JVP", d.jvp), ("VJP", d.vjp)):
        if rule is None:
            continue
        for out, expr in rule.rewritten.items():
            rules.append({"kind": kind, "math": mathml((sp.MatrixSymbol(out, *expr.shape), expr), complex_=complex_,
                                                       display="block")})
    for gauge in d.gauges:
        rule = d.gauge_rules.get(gauge.name)
        for out, expr in (rule.rewritten.items() if rule else ()):
            rules.append({"kind": f"gauge residual ({gauge.label})",
                          "math": mathml((sp.MatrixSymbol(out, *expr.shape), expr), complex_=complex_, display="block")})
    source = Path(d.path).read_text().splitlines()
    passed = sum(r.passed for r in report.steps)
    numeric = [r.residual for r in report.steps if r.residual is not None]
    return {
        "name": report.name,
        "title": report.title,
        "path": project.relative(Path(d.path)),
        "references": list(d.references),
        "field": d.field,
        "rows": rows,
        "pairwise": pairwise,
        "rules": rules,
        "source": [(i + 1, html.escape(line)) for i, line in enumerate(source)],
        "helpers": [{"path": project.relative(Path(file)), "anchor": anchor,
                     "source": [(i + 1, html.escape(line)) for i, line in enumerate(Path(file).read_text().splitlines())]}
                    for file, anchor in helpers.items()],
        "summary": {
            "steps": len(report.steps), "passed": passed, "failed": len(report.steps) - passed,
            "instances": report.instances,
            "tolerance": f"{report.steps[0].tolerance:.0e}" if report.steps else "",
            "worst": f"{max(numeric):.1e}" if numeric else "",
            "symbolic": sum(r.symbolic.startswith("verified") for r in report.steps),
        },
        "passed": report.passed,
    }


def write_site(project, audited: list, out: Path) -> list[Path]:
    """Write ``<name>.html`` for every audited derivation and ``index.html``; returns the paths."""
    from .generate import _environment, _render_template, _template

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    env = _environment(project)
    env.autoescape = False
    page = _template(env, project, "report/audit.html.j2")
    index = _template(env, project, "report/index.html.j2")
    written = []
    pages = []
    for a in audited:
        data = _page_data(project, a)
        path = out / f"{data['name']}.html"
        path.write_text(_render_template(page, page=data, esc=html.escape))
        written.append(path)
        pages.append(data)
    path = out / "index.html"
    path.write_text(_render_template(index, pages=pages, project=project.relative(project.root) or ".",
                                     esc=html.escape))
    written.append(path)
    return written

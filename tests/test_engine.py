"""Stage 1: each engine rule on small cases with known answers."""
import numpy as np
import pytest
import sympy as sp
from sympy.matrices.expressions import HadamardProduct, Identity, Inverse, MatrixSymbol, Transpose, ZeroMatrix

from adjointgen.calculus import algebra
from adjointgen.calculus.algebra import DerivationError, differential, expand, normalize, substitute_product, transpose_linear
from adjointgen.calculus.evaluate import evaluate
from adjointgen.calculus.nodes import DI, DJ, DiagPart, PairwiseDef, PairwiseMatrix, Skew, Structure, Sym

n = sp.Symbol("n", integer=True, positive=True)
A, B, U, X, G, dA, dB, dX, D = (MatrixSymbol(s, n, n) for s in ("A", "B", "U", "X", "G", "dA", "dB", "dX", "D"))
DIMS = {n: 4}


def tangent_of(mapping):
    return lambda s: mapping.get(s.name)


def same(a, b, structure=None):
    st = structure or Structure()
    return expand(a, st) == expand(b, st)


def test_product_rule():
    got = differential(A * B, tangent_of({"A": dA, "B": dB}))
    assert same(got, dA * B + A * dB)


def test_constant_factor_has_zero_differential():
    got = differential(A * B, tangent_of({"A": dA}))
    assert same(got, dA * B)


def test_transpose_rule():
    assert same(differential(Transpose(A) * B, tangent_of({"A": dA})), Transpose(dA) * B)


def test_inverse_rule():
    got = differential(Inverse(X), tangent_of({"X": dX}))
    assert same(got, -Inverse(X) * dX * Inverse(X))


def test_inverse_rule_numerically(rng):
    Xv = rng.standard_normal((4, 4)) + 4 * np.eye(4)
    dXv = rng.standard_normal((4, 4))
    got = evaluate(differential(Inverse(X), tangent_of({"X": dX})), {"X": Xv, "dX": dXv}, DIMS)
    h = 1e-6
    fd = (np.linalg.inv(Xv + h * dXv) - np.linalg.inv(Xv - h * dXv)) / (2 * h)
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8)


def test_structure_in_normal_form():
    st = Structure(symmetric={"A"}, diagonal={"D"}, skew={"X"})
    assert normalize(Transpose(A), st) == A
    assert normalize(Transpose(X), st) == -X
    assert normalize(DiagPart(D), st) == D
    assert normalize(DiagPart(X), st) == ZeroMatrix(n, n)
    assert normalize(Sym(A), st) == A
    # distribution over sums and scalars
    assert same(DiagPart(2 * A + U), 2 * DiagPart(A) + DiagPart(U), st)


def test_substitute_product_inside_longer_chain():
    st = Structure()
    out, count = substitute_product(Transpose(U) * A * U * X, Transpose(U) * A, D * Transpose(U), st)
    assert count == 1
    assert same(out, D * Transpose(U) * U * X)


def test_substitute_product_inside_linear_nodes():
    st = Structure()
    out, count = substitute_product(DiagPart(Transpose(U) * U * X), Transpose(U) * U, Identity(n), st)
    assert count == 1 and same(out, DiagPart(X))


def test_substitute_missing_pattern_counts_zero():
    _, count = substitute_product(A * B, U * X, D, Structure())
    assert count == 0


def _pairwise(name, expr):
    return PairwiseMatrix.define(PairwiseDef(name, "D", expr, sp.Integer(0), "test", "test"), n)


def test_pairwise_symmetry_detection():
    assert PairwiseDef("F", "D", 1 / (DJ - DI), sp.Integer(0), "", "").is_antisymmetric
    assert PairwiseDef("G", "D", DI + DJ, sp.Integer(0), "", "").is_symmetric


@pytest.mark.parametrize(
    "expr_fn, expected_fn",
    [
        # <G, L dX R> = <L^T G R^T, dX>
        (lambda F: U * dX * B, lambda F: Transpose(U) * G * Transpose(B)),
        # <G, dX^T> = <G^T, dX>
        (lambda F: Transpose(dX), lambda F: Transpose(G)),
        # <G, F ∘ dX> = <F ∘ G, dX>
        (lambda F: HadamardProduct(F, dX), lambda F: HadamardProduct(F, G)),
        # <G, diag(dX)> = <diag(G), dX>
        (lambda F: DiagPart(dX), lambda F: DiagPart(G)),
        # sym and skew are self-adjoint projections
        (lambda F: Sym(dX), lambda F: Sym(G)),
        (lambda F: Skew(dX), lambda F: Skew(G)),
        # sums and compositions
        (lambda F: U * HadamardProduct(F, Transpose(U) * dX * U) * Transpose(U) + 3 * DiagPart(dX),
         lambda F: U * HadamardProduct(F, Transpose(U) * G * U) * Transpose(U) + 3 * DiagPart(G)),
        # a solve: M^-1 dX -> M^-T G
        (lambda F: Inverse(B) * dX, lambda F: Transpose(Inverse(B)) * G),
    ],
)
def test_transposition_rules(expr_fn, expected_fn, rng):
    F = _pairwise("Ftest", 1 / (DJ - DI))
    st = Structure()
    got = transpose_linear(expr_fn(F), {"dX"}, G, st)
    total = sp.MatAdd(*got["dX"]) if len(got["dX"]) > 1 else got["dX"][0]
    assert same(total, expected_fn(F), st)
    # and the dot-product identity on numbers
    env = {k: rng.standard_normal((4, 4)) for k in ("U", "B", "G", "dX")}
    env["B"] += 4 * np.eye(4)
    env["D"] = np.diag(np.arange(4.0))
    lhs = np.sum(evaluate(total, env, DIMS) * env["dX"])
    rhs = np.sum(env["G"] * evaluate(expr_fn(F), env, DIMS))
    assert abs(lhs - rhs) <= 1e-12 * (abs(lhs) + abs(rhs))


def test_transposition_rejects_nonlinear_terms():
    with pytest.raises(DerivationError, match="not linear"):
        transpose_linear(dX * dX, {"dX"}, G, Structure())


def test_hadamard_split_derives_gap_formula():
    """The engine reads E_ij off the expanded commutator; the known answer is d_i - d_j."""
    from adjointgen.calculus import Derivation

    d = Derivation("t", __file__, title="t")
    m = d.dim("m")
    Dm = d.output("D", m, m, diagonal=True)
    Xm = MatrixSymbol("X", m, m)
    eq = d.identity("commutator", Dm * Xm - Xm * Dm, ZeroMatrix(m, m))
    new, E = d.hadamard_split(eq, Dm, Xm, "E")
    assert sp.simplify(E.definition.expr - (DI - DJ)) == 0
    assert E.definition.diagonal_value == 0
    assert same(new.lhs, HadamardProduct(E, Xm), d.structure)


def test_solve_offdiagonal_derives_reciprocal_gaps():
    from adjointgen.calculus import Derivation

    d = Derivation("t2", __file__, title="t")
    m = d.dim("m")
    Dm = d.output("D", m, m, diagonal=True)
    R = MatrixSymbol("R", m, m)
    C = d.introduce("C", MatrixSymbol("Y", m, m))
    d.structure.skew.add("C")
    eq = d.identity("commutator", Dm * C - C * Dm + R, ZeroMatrix(m, m))
    eq, E = d.hadamard_split(eq, Dm, C, "E")
    sol, F = d.solve_offdiagonal(eq, C, E, "F")
    assert sp.simplify(F.definition.expr - 1 / (DJ - DI)) == 0
    assert same(sol.rhs, HadamardProduct(F, R), d.structure)


def test_substitute_with_transposed_replaces_the_transpose_of_the_pattern_too():
    from adjointgen.calculus import Derivation

    d = Derivation("t3", __file__, title="t")
    m = d.dim("m")
    Am, Bm, Cm, Pm = (d.input(name, m, m) for name in ("A", "B", "C", "P"))
    rule = d.identity("A = B C", Am, Bm * Cm)
    eq = d.identity("an equation with A and A^T", Am + Transpose(Am) * Pm, Pm)
    plain = d.substitute(eq, rule, "only A")
    assert same(plain.lhs, Bm * Cm + Transpose(Am) * Pm, d.structure)
    both = d.substitute(eq, rule, "A and A^T", transposed=True)
    assert same(both.lhs, Bm * Cm + Transpose(Cm) * Transpose(Bm) * Pm, d.structure)
    with pytest.raises(DerivationError, match="does not occur"):
        d.substitute(d.identity("no A", Pm, Pm), rule, "nothing to replace", transposed=True)


def test_a_symmetric_output_is_its_own_transpose_and_must_be_square():
    from adjointgen.calculus import Derivation

    d = Derivation("t4", __file__, title="t")
    m, k = d.dim("m"), d.dim("k")
    Am = d.input("A", m, m)
    Pm = d.output("P", m, m, symmetric=True)
    eq = d.identity("with P^T", Transpose(Pm) * Am + Transpose(d.tangent(Pm)), Am)
    assert same(eq.lhs, Pm * Am + d.tangent(Pm), d.structure)
    with pytest.raises(DerivationError, match="square"):
        d.output("R", m, k, symmetric=True)


def test_codegen_rewrites_push_sym_inside_and_factor():
    st = Structure(diagonal={"D"})
    F = _pairwise("Fanti", 1 / (DJ - DI))
    expr = Sym(U * HadamardProduct(F, Transpose(U) * G) * Transpose(U)) + Sym(U * D * Transpose(U))
    out = algebra.simplify_for_codegen(expr, st)
    assert same(out, U * (HadamardProduct(F, Skew(Transpose(U) * G)) + D) * Transpose(U), st)
    assert str(out).count("U.T") == 2  # one in U^T G, one closing a single sandwich (not two)


# ---------------------------------------------------------------- complex derivations (^T = ^H)
def test_complex_structure_switches_off_real_only_rules():
    real = Structure(diagonal={"D"}, skew={"X"})
    cplx = Structure(diagonal={"D"}, skew={"X"}, complex=True)
    # diag(A^T) = diag(A) only for real A; a complex anti-Hermitian X has an imaginary diagonal
    assert normalize(DiagPart(Transpose(A)), real) == DiagPart(A)
    assert normalize(DiagPart(Transpose(A)), cplx) != DiagPart(A)
    assert normalize(DiagPart(X), real) == ZeroMatrix(n, n)
    assert normalize(DiagPart(X), cplx) == DiagPart(X)
    # the adjoint of diag(A) is diag(A^H)
    assert same(Transpose(DiagPart(A)), DiagPart(Transpose(A)), cplx)
    # a real diagonal times an imaginary one is imaginary: its Hermitian part vanishes
    assert normalize(Sym(D * DiagPart(X)), cplx) == ZeroMatrix(n, n)
    assert same(Skew(D * DiagPart(X)), D * DiagPart(X), cplx)
    # diagonal factors commute and cancel: S diag(Y) S^-1 = diag(Y)
    assert same(D * DiagPart(A) * Inverse(D), DiagPart(A), cplx)
    # sym(D diag(A)) = D diag(sym(A)) for real D
    assert same(Sym(D * DiagPart(A)), D * DiagPart(Sym(A)), cplx)


def test_complex_values_evaluate_with_the_conjugate_transpose(rng):
    a = rng.standard_normal((4, 4)) + 1j * rng.standard_normal((4, 4))
    np.testing.assert_allclose(evaluate(Transpose(A), {"A": a}, DIMS), a.conj().T)
    np.testing.assert_allclose(evaluate(Skew(A), {"A": a}, DIMS), (a - a.conj().T) / 2)


def test_complex_transposition_is_the_adjoint_under_the_real_inner_product(rng):
    """<G, L dX^H R> = <result, dX> with <X, Y> = Re tr(X^H Y)."""
    st = Structure(complex=True)
    expr = A * Transpose(dX) * B + DiagPart(Skew(U * dX))
    out = transpose_linear(expr, {"dX"}, G, st)["dX"]
    c = lambda: rng.standard_normal((4, 4)) + 1j * rng.standard_normal((4, 4))
    env = {k: c() for k in ("A", "B", "U", "G", "dX")}
    gx = evaluate(_total(out), env, DIMS)
    lhs = np.real(np.vdot(gx, env["dX"]))
    rhs = np.real(np.vdot(env["G"], evaluate(expr, env, DIMS)))
    assert abs(lhs - rhs) <= 1e-12 * (abs(lhs) + abs(rhs))


def _total(parts):
    return sp.MatAdd(*parts) if len(parts) > 1 else parts[0]


def test_trace_and_scalar_identity_are_adjoint_and_log_det_follows_jacobi(rng):
    """Scalar outputs: <g, tr(L dX R)> = <g L^T R^T, dX>, <G, h(dX) I> = <tr(G), h(dX)>, and
    d log|det A| = tr(A^-1 dA), each checked on numbers."""
    from adjointgen.calculus.nodes import LogAbsDet, ScalarIdentity, Trace

    g = MatrixSymbol("g", 1, 1)
    st = Structure()
    got = transpose_linear(Trace(U * dX * B), {"dX"}, g, st)["dX"]
    total = sp.MatAdd(*got) if len(got) > 1 else got[0]
    assert same(total, Transpose(U) * ScalarIdentity(g, n) * Transpose(B), st)
    env = {k: rng.standard_normal((4, 4)) for k in ("U", "B", "G", "dX", "A", "dA")}
    env["g"] = rng.standard_normal((1, 1))
    lhs = np.sum(evaluate(total, env, DIMS) * env["dX"])
    rhs = float(env["g"][0, 0] * np.trace(env["U"] @ env["dX"] @ env["B"]))
    assert abs(lhs - rhs) <= 1e-12 * (abs(lhs) + abs(rhs))
    # a scalar that depends on the tangent, times the identity: its adjoint is a trace
    h = Trace(U * dX)
    got = transpose_linear(ScalarIdentity(h, n) * B, {"dX"}, G, st)["dX"]
    total = sp.MatAdd(*got) if len(got) > 1 else got[0]
    lhs = np.sum(evaluate(total, env, DIMS) * env["dX"])
    rhs = np.sum(env["G"] * (np.trace(env["U"] @ env["dX"]) * env["B"]))
    assert abs(lhs - rhs) <= 1e-12 * (abs(lhs) + abs(rhs))
    # Jacobi's formula against a central difference
    dl = differential(LogAbsDet(A), tangent_of({"A": dA}))
    assert same(dl, Trace(Inverse(A) * dA), st)
    h_ = 1e-6
    fd = (np.linalg.slogdet(env["A"] + h_ * env["dA"])[1] - np.linalg.slogdet(env["A"] - h_ * env["dA"])[1]) / (2 * h_)
    assert abs(evaluate(dl, env, DIMS)[0, 0] - fd) <= 1e-7 * max(1.0, abs(fd))


INVERTED = '''
import numpy as np

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Identity


def forward(A):
    return {"X": np.linalg.inv(A)}


def sample(rng, n):
    A = rng.standard_normal((n, n)) + 2 * np.sqrt(n) * np.eye(n)
    dA = rng.standard_normal((n, n))
    base, tangents = fd_tangents(forward, {"A": A}, {"A": dA})
    return {"A": A, "dA": dA, "X": base["X"], "dX": tangents["X"]}


d = Derivation("inverted", __file__, title="X = A^-1 through a named tangent dZ := A^T A dX A")
n = d.dim("n")
A = d.input("A", n, n)
X = d.output("X", n, n)
dA, dX = d.tangent(A), d.tangent(X)
d.instances(sample, [{"n": 3}, {"n": 4}])
s = d.differentiate(d.identity("A X = I", A * X, Identity(n)), "differentiate")
s = d.left_multiply(d.right_multiply(s, A, "right-multiply by A"), A.T, "left-multiply by A^T")
dZ = d.introduce("dZ", A.T * A * dX * A)
s = d.use_definition(s, dZ)
z = d.solve_for(s, dZ)
back = d.invert_definition(dZ, dX)
d.set_jvp(dX=d.replace(back, z))
d.derive_vjp()
'''


def test_invert_definition_is_audited_in_a_derivation(tmp_path):
    from adjointgen.audit import audit
    from adjointgen.codegen import generate as gen

    path = tmp_path / "inverted.py"
    path.write_text(INVERTED)
    report = audit(gen.load_derivation_file(path), symbolic=False)
    assert report.passed, report.to_text()
    step = next(s for s in report.steps if s.label.startswith("invert the definition of dZ"))
    assert step.residual is not None and step.residual < 1e-10
    # the JVP it leads to is checked against finite differences: a wrong inversion would fail there
    assert all(s.residual < 1e-7 for s in report.steps if s.kind == "jvp")


def test_auxiliary_and_hidden_outputs_are_accepted_next_to_a_declared_forward():
    """Auxiliary outputs (no rule; recomputed by the forward where a derivative of the rules is taken,
    see tests/test_auxiliary_outputs.py) and hidden ones (with rules), in either order of
    declaration."""
    from adjointgen.calculus import Derivation

    for forward_first in (True, False):
        d = Derivation("aux", __file__, title="t")
        n = d.dim("n")
        d.input("A", n, n)
        d.output("X", n, n)
        if forward_first:
            d.forward(torch="adjointgen.runtime.forward:lstsq")
        d.output("P", n, n, auxiliary=True)
        d.output("Q", n, n, hidden=True)
        if not forward_first:
            d.forward(torch="adjointgen.runtime.forward:lstsq")
        assert d.auxiliary_outputs == {"P"} and d.hidden_outputs == {"Q"}


def test_a_runtime_forward_is_declared_once_and_found_in_every_backends_runtime():
    """``forward(runtime="eigh")`` names the forward every backend's runtime defines; each backend
    imports it from its own (the printer's ``forwards``); the old spelling by module is the same
    declaration; a name no runtime defines, or one beside torch=/numpy=/host=, is an error at its line."""
    from pathlib import Path
    from types import SimpleNamespace

    import adjointgen.codegen.generate as gen
    from adjointgen.calculus import Derivation
    from adjointgen.codegen.ir import ForwardIR
    from adjointgen.codegen.lower import lower_derivation
    from adjointgen.codegen.backends import PRINTERS

    def declared(**forward):
        d = Derivation("fwd", __file__, title="t")
        n = d.dim("n")
        d.input("A", n, n)
        d.output("X", n, n)
        d.forward(**forward)
        return d

    spec = declared(runtime="inv").forward_spec
    assert (spec.torch.module, spec.numpy.module) == ("adjointgen.runtime.forward", "adjointgen.runtime.xp")
    assert spec.torch.runtime and spec.numpy.runtime and spec.torch.attr == spec.numpy.attr == "inv"
    assert declared(torch="adjointgen.runtime.forward:inv", numpy="adjointgen.runtime.xp:inv").forward_spec == spec
    root = Path(__file__).resolve().parents[1]
    public = lower_derivation(gen.load_derivation(root, "inv"), str(root)).public  # the catalogue's: runtime="inv"
    assert {name: p.forward_import(public) for name, p in PRINTERS.items()} == {
        "torch": {"_forward": "adjointgen.runtime.forward:inv"}, "xp": {"_forward": "adjointgen.runtime.xp:inv"},
        "jax": {"_forward": "adjointgen.runtime.jax:inv"}}
    own = SimpleNamespace(torch_forward=ForwardIR("mypkg.ops", "inv"), numpy_forward=ForwardIR("mypkg.ops", "inv_numpy"))
    assert PRINTERS["jax"].forward_import(own) == {"_forward": "mypkg.ops:inv_numpy"}
    assert PRINTERS["torch"].forward_import(own) == {"_forward": "mypkg.ops:inv"}
    with pytest.raises(DerivationError, match=r"test_engine\.py:\d+: .*no attribute 'no_such_forward'"):
        declared(runtime="no_such_forward")
    with pytest.raises(DerivationError, match="runtime="):
        declared(runtime="inv", torch="adjointgen.runtime.forward:inv")
    with pytest.raises(DerivationError, match="runtime="):
        declared(runtime="inv", host="scipy.linalg:inv")


def _count(expr, kind):
    return sum(1 for a in sp.preorder_traversal(expr) if isinstance(a, kind))


def test_a_term_joins_a_shared_right_solve_when_its_product_is_computed_anyway(rng):
    """``Q gR + Q S(R gR^T) R^-T + gQ R^-T`` (the shape of the reduced QR's VJP): ``Q gR`` joins the
    solve as ``Q (gR R^T) R^-T``, since ``gR R^T`` is the transpose of ``R gR^T``: one inverse left,
    and the value unchanged; without that product elsewhere the term is left alone."""
    from adjointgen.calculus.nodes import StrictlyLower

    Q, R, gQ, gR = (MatrixSymbol(s, n, n) for s in ("Q", "R", "gQ", "gR"))
    st = Structure(upper={"R", "gR"})
    expr = Q * gR + Q * StrictlyLower(R * Transpose(gR)) * Inverse(Transpose(R)) + gQ * Inverse(Transpose(R))
    code = algebra.simplify_for_codegen(expr, st)
    assert _count(code, Inverse) == 1
    values = {s: rng.standard_normal((4, 4)) for s in ("Q", "gQ", "gR")}
    values["R"] = np.triu(rng.standard_normal((4, 4))) + 4 * np.eye(4)
    np.testing.assert_allclose(evaluate(code, values, DIMS), evaluate(expr, values, DIMS), rtol=1e-12, atol=1e-12)
    alone = Q * gR + Q * StrictlyLower(A * Transpose(gQ)) * Inverse(Transpose(R)) + gQ * Inverse(Transpose(R))
    assert _count(algebra.simplify_for_codegen(alone, st), Inverse) == 2  # gR R^T would be a new product


def _solves(expr):
    from adjointgen.calculus.nodes import OperatorSolve

    return {a for a in sp.preorder_traversal(expr) if isinstance(a, OperatorSolve)}


def test_solves_of_one_operator_up_to_sign_and_transposition_are_one_solve(rng):
    """The Lyapunov VJP's ``-S(gX) X^T - S(gX^T) X`` with ``S = Syl[A^T, A]``, an operator that is its
    own transpose (``S(Y)^T = S(Y^T)``): one solve, ``S(gX)``, and its transpose.  A sign is shared
    too (``S(-Y) = -S(Y)``), for any operator; a general Sylvester operator is not its own
    transpose, so its solves on ``Y`` and ``Y^T`` stay two.  The values are unchanged."""
    from adjointgen.calculus.nodes import SylvesterSolve

    st = Structure()
    S = lambda Y: SylvesterSolve(Y, Transpose(A), A, False)
    lyapunov = -S(G) * Transpose(X) - S(Transpose(G)) * X
    code = algebra.simplify_for_codegen(lyapunov, st)
    assert _solves(code) == {S(G)}
    general = lambda Y: SylvesterSolve(Y, A, B, False)
    # two outputs of one rule (the polar JVP's dU and dP): one solve, the second its negative
    first, second = general(G * X - Transpose(X) * G) * U, general(Transpose(X) * G - G * X) * B
    shared = algebra.simplify_for_codegen(first, st), algebra.simplify_for_codegen(second, st)
    assert len(_solves(shared[0]) | _solves(shared[1])) == 1
    assert len(_solves(algebra.simplify_for_codegen(general(G) * X + general(Transpose(G)) * U, st))) == 2
    values = {s: rng.standard_normal((4, 4)) for s in ("G", "X", "U", "B")}
    values["A"] = rng.standard_normal((4, 4)) + 4 * np.eye(4)
    for expr in (lyapunov, first, second):
        np.testing.assert_allclose(evaluate(algebra.simplify_for_codegen(expr, st), values, DIMS),
                                   evaluate(expr, values, DIMS), rtol=1e-12, atol=1e-12)


def test_a_spec_reads_its_own_pairwise_definitions_after_another_derivation_loaded():
    """Pairwise matrices are symbols looked up by name: the SVD's ``E`` (differences of singular
    values) loaded after funm's must not be what funm's spec evaluates with (its audit failed with
    KeyError 'S' in the suite, depending on the tests run before it)."""
    from adjointgen.audit import audit
    from adjointgen.codegen import generate as gen

    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    funm = gen.load_derivation(root, "funm")
    svd = gen.load_derivation_file(root / "derivations" / "svd.py")
    shared = set(funm.pairwise) & set(svd.pairwise)
    assert shared and any(funm.pairwise[n] != svd.pairwise[n] for n in shared)
    report = audit(funm, symbolic=False)
    assert report.passed, [(s.index, s.label, s.note) for s in report.steps if not s.passed]

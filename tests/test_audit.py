"""Stage 2: every derivation passes its audit; a corrupted step fails, naming file and step."""
import shutil
import subprocess
import sys

import pytest

from adjointgen.audit import AuditError, audit
from adjointgen.audit.runner import verdict_kind
from adjointgen.codegen import generate as gen


@pytest.mark.slow  # heavy (JAX compiles or a whole-catalogue audit): CI's slow step
@pytest.mark.parametrize("name", gen.derivation_names(gen.find_root(__file__)))
def test_every_derivation_passes_its_audit(root, name):
    d = gen.load_derivation(root, name)
    report = audit(d)
    assert report.passed, report.to_text()
    # the audit really measured something: JVP steps against finite differences
    jvp_steps = [s for s in report.steps if s.kind == "jvp"]
    assert jvp_steps and all(s.residual is not None and s.residual < 1e-7 for s in jvp_steps)
    # every step verified: exactly (or symbolically, where a value has no rational form), or a premise
    kinds = {s.index: verdict_kind(s.symbolic) for s in report.steps}
    assert set(kinds.values()) <= {"exact", "symbolic", "premise"}, report.to_text()
    assert sum(k == "exact" for k in kinds.values()) >= len(kinds) / 2
    premises = {s.kind for s in report.steps if kinds[s.index] == "premise"}
    # ("directions": general_directions' claim about the general-matrix function, checked numerically
    # against the sampler's general forward on every instance)
    assert premises <= {"forward", "identity", "define", "gauge", "directions"}, premises


def test_the_catalogue_has_no_step_numeric_only(root):
    """The recorded verdicts of every derivation (generated/audit/<name>.json, kept in sync by
    ``generate --check``): each derived step verified, none numeric only or timed out."""
    import json

    counts = {}
    for name in gen.derivation_names(root):
        record = json.loads((root / "generated" / "audit" / f"{name}.json").read_text())
        for _, kind, label, verdict in record["steps"]:
            counts[verdict_kind(verdict)] = counts.get(verdict_kind(verdict), 0) + 1
            assert verdict_kind(verdict) in ("exact", "symbolic", "premise"), (name, kind, label, verdict)
            assert "not applicable" not in verdict and "rests on an identity of the decomposition" not in verdict
    assert counts.get("numeric only", 0) == 0 and counts["exact"] > 750


def test_an_exact_verdict_states_its_bound_and_what_it_rests_on(root):
    import re

    report = audit(gen.load_derivation(root, "inv"))
    verdicts = {s.label: s.symbolic for s in report.steps}
    exact = [v for v in verdicts.values() if verdict_kind(v) == "exact"]
    assert exact and all(re.search(r"probability <= (\S+)\)", v) for v in exact)
    assert max(float(re.search(r"probability <= (\S+?)\)", v).group(1)) for v in exact) <= 1e-6
    substituted = next(v for label, v in verdicts.items() if label.startswith("substitute"))
    assert "given step" in substituted and "X A = I" in substituted  # what it rests on: the identity, by name
    identities = [v for label, v in verdicts.items() if label in ("A X = I", "X A = I")]
    assert identities and all(v == "premise: an identity of inv" for v in identities)


def test_every_replay_of_inv_rejects_a_wrong_claim(root):
    """The exact audit can fail: each of inv's replays with its claimed result off by a term."""
    import dataclasses

    from adjointgen.calculus.spec import as_spec

    spec = as_spec(gen.load_derivation(root, "inv"))
    wrong, steps = {}, []
    for step in spec.steps:
        replay = _wrong_replay(step.replay) if step.replay is not None else None
        if replay is not None:
            wrong[step.index] = step.replay.kind
            step = dataclasses.replace(step, replay=replay)
        steps.append(step)
    assert {"equal", "substitute", "differentiate", "dot_product"} <= set(wrong.values())
    report = audit(dataclasses.replace(spec, steps=tuple(steps)))
    verdicts = {s.index: s.symbolic for s in report.steps}
    missed = {i: (k, verdicts[i]) for i, k in wrong.items() if not verdicts[i].startswith("FAILED")}
    assert not missed


def _copy_project(root, tmp_path):
    shutil.copy(root / "pyproject.toml", tmp_path / "pyproject.toml")
    for sub in ("derivations", "templates", "generated"):
        shutil.copytree(root / sub, tmp_path / sub)
    return tmp_path


def test_corrupted_step_fails_audit_and_generate_writes_nothing(root, tmp_path):
    proj = _copy_project(root, tmp_path)
    path = proj / "derivations" / "eigh.py"
    helper = proj / "derivations" / "_eigenspaces.py"  # the eigh steps eigh and funm share
    src = helper.read_text()
    good = 'e["left_eig"] = d.transpose(e["eig"], "transpose, with A and D symmetric: U^T A = D U^T")'
    assert good in src
    # a plausible slip: U^T A = U^T D instead of D U^T
    helper.write_text(src.replace(good, 'e["left_eig"] = d.identity("left eigenvector identity (corrupted)", U.T * A, U.T * D)'))
    d = gen.load_derivation_file(path, partial=True)
    report = audit(d)
    assert not report.passed
    first = report.first_failure()
    assert first.label == "left eigenvector identity (corrupted)"
    assert first.residual > 1e-3
    with pytest.raises(gen.GenerationFailed) as err:
        gen.render(proj, ["eigh"])
    assert "left eigenvector identity (corrupted)" in str(err.value)
    assert str(path) in str(err.value)
    # the CLI exits non-zero and writes nothing
    for f in (proj / "generated").rglob("*"):
        if f.is_file():
            f.write_text("sentinel")
    before = {f: f.read_text() for f in (proj / "generated").rglob("*") if f.is_file()}
    r = subprocess.run([sys.executable, "-m", "adjointgen", "--root", str(proj), "generate", "eigh"],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert "corrupted" in r.stderr and "nothing was written" in r.stderr
    after = {f: f.read_text() for f in (proj / "generated").rglob("*") if f.is_file()}
    assert before == after


def test_corrupted_solution_step_is_caught_numerically(root, tmp_path):
    """A wrong replacement in a later step (dU = U^T dC instead of U dC) fails at that step."""
    proj = _copy_project(root, tmp_path)
    path = proj / "derivations" / "eigh.py"
    src = path.read_text()
    good = 'back = d.left_multiply(d.identity("definition of dC", dC, U.T * dU), U, "left-multiply dC = U^T dU by U")'
    assert good in src
    path.write_text(src.replace(good, good.replace("), U, ", "), U.T, ").replace("left-multiply dC = U^T dU by U", "corrupted multiply")))
    from adjointgen.calculus import DerivationError

    with pytest.raises(DerivationError, match="substitute U U\\^T = I"):
        gen.load_derivation_file(path)


@pytest.mark.slow  # mutation tests of the audit
@pytest.mark.parametrize("good, bad, failing", [
    # a wrong gauge choice: the reference forward is aligned to diag(dCU) + diag(dCV) = diag(dCP) = 0
    ("fix=(d.diag(dCP), ZeroMatrix(k, k))", "fix=(d.diag(dCM), ZeroMatrix(k, k))", "gauge choice"),
    # a direction that is not a gauge: (u, v) -> (u e^{iθ}, v e^{-iθ}) changes A
    ('{e["U"]: e["U"] * phases, e["V"]: e["V"] * phases}', '{e["U"]: e["U"] * phases, e["V"]: -e["V"] * phases}',
     "leaves 'right singular vectors"),
])
def test_corrupted_complex_gauge_fails_audit(root, tmp_path, good, bad, failing):
    """The SVD's gauges are declared in the helper derivations/_singular_spaces.py."""
    proj = _copy_project(root, tmp_path)
    helper = proj / "derivations" / "_singular_spaces.py"
    src = helper.read_text()
    assert good in src
    helper.write_text(src.replace(good, bad))
    path = proj / "derivations" / "svd.py"
    d = gen.load_derivation_file(path, partial=True)
    report = audit(d, symbolic=False)
    first = report.first_failure()
    assert first is not None and failing in first.label
    assert first.residual > 1e-3


def test_complex_symbolic_entries_see_conjugation():
    """In a complex derivation the explicit matrices have complex entries: a real-only identity
    such as diag(X^T) = diag(X) fails there, while true ones still simplify to zero."""
    import sympy as sp

    from adjointgen.audit.runner import _is_zero_matrix, _symbolic_env
    from adjointgen.calculus import Derivation
    from adjointgen.calculus.evaluate import SYMPY, evaluate
    from adjointgen.calculus.nodes import DiagPart, Skew

    d = Derivation("probe", __file__, title="probe", field="complex")
    n = d.dim("n")
    X = d.input("X", n, n)
    H = d.input("H", n, n, symmetric=True)
    env = _symbolic_env(d)
    dims = env["__dims__"]
    ev = lambda e: evaluate(e, env, dims, arith=SYMPY)
    x = env["X"]
    assert not _is_zero_matrix(ev(DiagPart(X.T)) - ev(DiagPart(X)))
    assert _is_zero_matrix(ev((X * H).T) - ev(H * X.T))  # (XH)^H = H X^H, H Hermitian
    assert not _is_zero_matrix(ev(DiagPart(Skew(X))))  # the diagonal of an anti-Hermitian part is imaginary
    assert _is_zero_matrix(ev(DiagPart(Skew(H))))
    assert x[0, 1] != sp.conjugate(x[0, 1])


def _bumped(e):
    """``e + I``: a claimed result off by a term; for a non-square one, off by a matrix of its
    shape that it holds (``U``), else by itself (``2 e``)."""
    from sympy.matrices.expressions import Identity, MatAdd, MatMul, MatrixSymbol

    if e.shape[0] == e.shape[1]:
        return MatAdd(e, Identity(e.shape[0]))
    same = sorted((m for m in e.atoms(MatrixSymbol) if m.shape == e.shape), key=str)
    return MatAdd(e, same[0]) if same else MatMul(2, e)


def _wrong_replay(replay):
    """The replay of a step whose claim is wrong, for every kind of :mod:`adjointgen.audit.replays`
    (``None`` where the claim has no square expression to bump)."""
    import dataclasses

    import sympy as sp
    from sympy.matrices.expressions import MatMul, Transpose

    from adjointgen.calculus.nodes import StrictlyLower

    args = list(replay.args)
    new_at = {"equal": 1, "define": 3, "insert": 3, "differentiate": 1, "real": 1, "degenerate": 1, "substitute": 5,
              "unstructured": 2, "constrained": 4, "invariant": 1}
    if replay.kind == "premise":
        return None  # nothing derived, nothing to get wrong
    if replay.kind in new_at:
        args[new_at[replay.kind]] = _bumped(args[new_at[replay.kind]])
        if args[new_at[replay.kind]] is None:
            return None
    elif replay.kind in ("dot_product", "gauge"):  # twice the cotangent, twice the residual
        args[1] = MatMul(2, args[1])
    elif replay.kind == "adjoint":  # X -> tril₋(X)^T is not self-adjoint
        args[0] = lambda x: Transpose(StrictlyLower(x))
    elif replay.kind == "divided":  # T(a, b, c) + a is not symmetric
        T = args[0]
        args[0] = sp.Lambda(T.variables, T.expr + T.variables[0])
    else:
        raise AssertionError(f"no wrong claim for the replay kind {replay.kind}")
    return dataclasses.replace(replay, args=tuple(args))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["eigh", "funm", "eigsh"])
def test_every_symbolic_replay_rejects_a_wrong_claim(root, name):
    """The exact audit can fail: each step's replay, with its claimed result off by a term (or
    its rule, projection or divided difference wrong), leaves a nonzero residual, for every replay
    kind the derivation uses."""
    import dataclasses

    from adjointgen.calculus.spec import as_spec

    spec = as_spec(gen.load_derivation(root, name))
    wrong, steps = {}, []
    for step in spec.steps:
        replay = _wrong_replay(step.replay) if step.replay is not None else None
        if replay is not None:
            wrong[step.index] = step.replay.kind
            step = dataclasses.replace(step, replay=replay)
        steps.append(step)
    kinds = set(wrong.values())
    common = {"equal", "define", "substitute", "differentiate", "real", "dot_product", "degenerate", "invariant"}
    assert common | {"divided" if name == "funm" else "adjoint"} <= kinds
    assert name != "eigsh" or "constrained" in kinds
    report = audit(dataclasses.replace(spec, steps=tuple(steps)))
    verdicts = {s.index: s.symbolic for s in report.steps}
    missed = {i: (k, verdicts[i]) for i, k in wrong.items() if not verdicts[i].startswith("FAILED")}
    assert not missed

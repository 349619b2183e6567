"""What a new user meets first (issue 47): `init` says what to install, a name used twice is
refused, errors state the rule and the derivation file's line, a singular Sylvester equation is
named as such, a wrong forward (NumPy's or torch's) is named with the identity it breaks, the
HTML report sets formulas as math, and the README shows how to start MPI ranks."""
import re
from pathlib import Path

import pytest

from adjointgen.codegen import generate as gen
from adjointgen.project import load_project

ROOT = Path(__file__).resolve().parents[1]


from inprocess import run  # noqa: E402  (the command line in this process)


def project(tmp_path, *names, edit=None):
    """The project of docs/derivations.md with the derivations ``names`` (``edit``: name -> function
    of the derivation's text)."""
    import docproject

    folder = docproject.build(tmp_path)
    for p in (folder / "derivations").glob("*.py"):
        if p.stem not in names:
            p.unlink()
    for name, fn in (edit or {}).items():
        p = folder / "derivations" / f"{name}.py"
        p.write_text(fn(p.read_text()))
    return folder


def audit(folder, name):
    return gen.audit_one(load_project(folder), name)


def test_init_says_what_to_install(tmp_path):
    r = run("init", str(tmp_path / "mine"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "pip install -e '.[test]'" in r.stdout and "pytest" in r.stdout and "torch" in r.stdout
    lines = r.stdout.splitlines()
    install = next(i for i, line in enumerate(lines) if "pip install" in line)
    assert install < next(i for i, line in enumerate(lines) if "python -m pytest" in line)
    assert "pip install -e '.[test]'" in (tmp_path / "mine" / "README.md").read_text()


def test_two_files_with_one_derivation_name_are_refused_naming_both(tmp_path):
    folder = project(tmp_path, "lyap")
    text = (folder / "derivations" / "lyap.py").read_text()
    (folder / "derivations" / "lyap_copy.py").write_text(text)
    r = run("generate", "--jobs", "1", cwd=folder)
    assert r.returncode == 1
    assert "derivations/lyap.py" in r.stderr and "derivations/lyap_copy.py" in r.stderr
    assert "define the operation 'lyap'" in r.stderr and "nothing was written" in r.stderr
    assert not (folder / "src" / "demo" / "_adjoint").exists()


def test_solve_for_an_expression_states_the_rule_with_the_line(tmp_path):
    folder = project(tmp_path, "signm", edit={"signm": lambda t: t.replace(
        'dS_sol = d.solve_sylvester(s, dS, A * S, label="solve (A S) dS + dS (A S) = dA - S dA S")',
        "dS_sol = d.solve_for(s, dS * S)")})
    line = next(i for i, text in enumerate((folder / "derivations" / "signm.py").read_text().splitlines(), 1)
                if "solve_for(s, dS * S)" in text)
    a = audit(folder, "signm")
    message = a.derivation.error
    assert f"signm.py:{line}:" in message
    assert "solves for a symbol" in message and "dS*S is an expression" in message and "introduce" in message


def test_solve_for_a_symbol_inside_products_states_the_rule(tmp_path):
    folder = project(tmp_path, "signm", edit={"signm": lambda t: t.replace(
        'dS_sol = d.solve_sylvester(s, dS, A * S, label="solve (A S) dS + dS (A S) = dA - S dA S")',
        "dS_sol = d.solve_for(s, dS)")})
    message = audit(folder, "signm").derivation.error
    assert re.search(r"signm\.py:\d+:", message)
    assert "the unknown a bare symbol" in message and "A*S*dS" in message and "solve_sylvester" in message


def test_substitute_of_a_sum_gives_the_line(tmp_path):
    folder = project(tmp_path, "signm", edit={"signm": lambda t: t.replace(
        's = d.subtract(s, q, "subtract: dA - A S dS = dS A S + S dA S")', 's = d.substitute(s, q, "the sum")')})
    line = next(i for i, text in enumerate((folder / "derivations" / "signm.py").read_text().splitlines(), 1)
                if 'substitute(s, q, "the sum")' in text)
    message = audit(folder, "signm").derivation.error
    assert f"signm.py:{line}:" in message and "must be a single product" in message


def test_a_singular_sylvester_equation_is_named_with_its_eigenvalues(tmp_path):
    # S dS + dS S = ... with S = sign(A): S's eigenvalues +1 and -1 add up to 0
    folder = project(tmp_path, "signm", edit={"signm": lambda t: t.replace(
        'dS_sol = d.solve_sylvester(s, dS, A * S, label="solve (A S) dS + dS (A S) = dA - S dA S")',
        'wrong = d.add(d.differentiate(square, "dS S + S dS = 0"), square, label="add S S = I")\n'
        'dS_sol = d.solve_sylvester(wrong, dS, S, label="solve S dS + dS S = I - S S")')})
    a = audit(folder, "signm")
    failure = a.report.first_failure()
    assert failure.label == "solve S dS + dS S = I - S S"
    message = failure.failure
    assert "Sylvester equation S X + X S = C is singular" in message
    assert "+1" in message and "-1" in message and "add up to 0" in message


@pytest.mark.parametrize("which, bad", [
    ("numpy", ("return half @ ((W * xp.sqrt(m)[..., None, :]) @ xp.conj(xp.swapaxes(W, -1, -2))) @ half",
               "return half @ ((W * xp.sqrt(m)[..., None, :]) @ xp.conj(xp.swapaxes(W, -1, -2)))")),
    ("torch", ("return half @ ((W * m.sqrt().unsqueeze(-2)) @ W.mH) @ half",
               "return half @ ((W * m.sqrt().unsqueeze(-2)) @ W.mH)")),
])
def test_a_wrong_forward_is_named_with_the_identity_it_breaks(tmp_path, which, bad):
    """The audit (not only generate) runs every declared forward against the identities."""
    folder = project(tmp_path, "gmean")
    ops = folder / "src" / "demo" / "ops.py"
    assert bad[0] in ops.read_text()
    ops.write_text(ops.read_text().replace(*bad))
    r = run("audit", "gmean", cwd=folder)
    assert r.returncode == 1
    assert f"the {which} forward demo.ops:gmean{'_numpy' if which == 'numpy' else ''}" in r.stdout
    assert "do not satisfy the identity 'G A^-1 G = B'" in r.stdout


def test_html_step_labels_are_math_not_sympy_syntax(tmp_path):
    folder = project(tmp_path, "gmean")
    r = run("audit", "gmean", "--html", str(tmp_path / "html"), cwd=folder)
    assert r.returncode == 0, r.stdout + r.stderr
    page = (tmp_path / "html" / "gmean.html").read_text()
    table = page.split('<pre class="source">')[0]  # the derivation's own source is shown as it is
    assert "**(-1)" not in table and not re.search(r"[A-Za-z]\.T\b", table)
    assert re.search(r"<td>JVP dG rewritten for code: <math", table)
    assert "A⁻¹" in table


def test_the_readme_shows_how_to_start_mpi_ranks():
    text = (ROOT / "README.md").read_text()
    assert re.search(r"mpirun -n 4 python \S+\.py", text)


def test_a_users_long_polar_derivation_has_every_step_verified(tmp_path):
    """A polar decomposition written as a user might (two routes, 43 steps, inverses and
    Sylvester solves): every derived step verified exactly, none numeric only or timed out (its
    symbolic replays used to time out)."""
    import shutil

    from adjointgen.audit.runner import verdict_kind

    (tmp_path / "derivations").mkdir()
    shutil.copy(ROOT / "tests" / "data" / "polar_routes" / "polar_routes.py", tmp_path / "derivations")
    shutil.copy(ROOT / "examples" / "polar" / "src" / "polar_layer" / "ops.py", tmp_path / "polar_ops.py")
    (tmp_path / "pyproject.toml").write_text('[tool.adjointgen]\npackage = "pr._adjoint"\nbackends = ["report"]\n')
    a = gen.audit_one(load_project(tmp_path), "polar_routes")
    assert a.report.passed, a.report.to_text()
    kinds = [verdict_kind(s.symbolic) for s in a.report.steps]
    assert 40 <= len(kinds) <= 70 and set(kinds) == {"exact", "premise"}, a.report.to_text()
    assert kinds.count("premise") == 6  # the forward, four identities, one definition

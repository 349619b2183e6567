"""`adjointgen generate` touches only what it wrote: a manifest of its files (with hashes) decides
what it may remove; users' files in the output folder, hand-edited generated files and anything
outside the project are never touched; bad settings and names are refused before anything is
written; one line is printed per operation; a slow symbolic replay runs out of its budget and is
not counted as a verification.

Every test runs in its own project folder and checks that the folder around it did not change."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from adjointgen.codegen import generate as gen
from adjointgen.project import ProjectError, load_project
from test_project import INVERSE

PLAIN = INVERSE.replace("SAMPLE", '{"A": A, "dA": dA, "X": base["X"], "dX": tan["X"]}').replace(
    "FORWARD", 'd.forward(numpy="xp.linalg.inv")')


def run_process(*args, cwd):
    """The command line in a process of its own (worker processes, signals)."""
    return subprocess.run([sys.executable, "-m", "adjointgen", *args], cwd=cwd, capture_output=True, text=True)


from inprocess import run as in_process  # noqa: E402


run = in_process  # the projects here use no module of their own: nothing is left behind in sys.modules


def tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with its content (the state a test must not change)."""
    return {p.relative_to(folder).as_posix(): p.read_text(errors="replace") for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.fixture
def sandbox(tmp_path):
    """``(project folder, sibling folder)`` inside a fresh temporary folder; afterwards, everything
    outside the project folder is as it was (a sibling with a file in it, to be a target)."""
    outer = tmp_path / "outer"
    project = outer / "proj"
    project.mkdir(parents=True)
    (outer / "sibling").mkdir()
    (outer / "sibling" / "keep.md").write_text("not the project's\n")
    before = {k: v for k, v in tree(outer).items() if not k.startswith("proj/")}
    yield project, outer
    after = {k: v for k, v in tree(outer).items() if not k.startswith("proj/")}
    assert after == before, "generation wrote or removed files outside the project folder"
    assert set(tree(tmp_path)) == {f"outer/{k}" for k in tree(outer)}


def project_files(folder: Path, *, settings: str, derivations: dict[str, str] | None = None) -> None:
    (folder / "pyproject.toml").write_text("[tool.adjointgen]\n" + textwrap.dedent(settings))
    (folder / "derivations").mkdir(exist_ok=True)
    for name, body in (derivations if derivations is not None else {"inv": PLAIN}).items():
        (folder / "derivations" / f"{name}.py").write_text(body)


# ------------------------------------------------------------------------- the manifest
def _users_files_survive(folder, output, backends, mine):
    project_files(folder, settings=f'package = "pkg"\noutput = "{output}"\nbackends = {backends!r}\n'.replace("'", '"'))
    out = folder / output
    for rel, text in mine.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    r = run("generate", "--jobs", "1", "-q", cwd=folder)
    assert r.returncode == 0, r.stderr
    assert (out / "reports" / "inv.md").is_file()
    assert all((out / rel).read_text() == text for rel, text in mine.items())
    assert not any(rel in r.stdout for rel in mine), r.stdout  # "wrote" only what it wrote
    manifest = json.loads((out / gen.MANIFEST).read_text())["files"]
    assert "reports/inv.md" in manifest and not set(mine) & set(manifest)
    assert run("generate", "--check", "--jobs", "1", cwd=folder).returncode == 0

    # the derivation goes away: its files go, the user's stay
    (folder / "derivations" / "inv.py").unlink()
    (folder / "derivations" / "other.py").write_text(PLAIN.replace('Derivation("inv"', 'Derivation("other"'))
    r = run("generate", "--jobs", "1", "-q", cwd=folder)
    assert r.returncode == 0, r.stderr
    prefix = "" if output == "." else f"{output}/"
    assert f"removed {prefix}reports/inv.md" in r.stdout
    assert not (out / "reports" / "inv.md").exists() and (out / "reports" / "other.md").is_file()
    assert all((out / rel).read_text() == text for rel, text in mine.items())
    return out


def test_output_dot_keeps_users_files_and_removes_only_its_own(sandbox):
    folder, _ = sandbox
    mine = {"reports/notes.md": "# my notes\n", "audit/mydata.symbolic.json": '{"mine": true}\n',
            "cuda/helper.cu": "// mine\n", "README.md": "# my project\n"}
    _users_files_survive(folder, ".", ["report"], mine)


def test_users_files_beside_generated_modules_survive(sandbox):
    folder, _ = sandbox
    mine = {"torch/helper.py": "def helper():\n    return 1\n", "reports/notes.md": "# my notes\n",
            "audit/mydata.symbolic.json": '{"mine": true}\n', "__init__.py.orig": "x\n"}
    out = _users_files_survive(folder, "gen", ["torch", "report"], mine)
    assert "removed gen/torch/inv.py" not in mine and not (out / "torch" / "inv.py").exists()
    assert (out / "torch" / "other.py").is_file()


def test_output_at_the_project_root_with_a_torch_package_is_refused(sandbox):
    folder, _ = sandbox
    project_files(folder, settings='package = "pkg"\noutput = "."\nbackends = ["torch"]\n')
    r = run("generate", "--jobs", "1", cwd=folder)
    assert r.returncode == 2 and "would shadow the real torch" in r.stderr and "pyproject.toml" in r.stderr
    assert not (folder / "torch").exists()


def test_a_hand_edited_generated_file_is_reported_not_overwritten_or_removed(sandbox):
    folder, _ = sandbox
    project_files(folder, settings='package = "pkg._adjoint"\nbackends = ["torch", "report"]\n')
    assert run("generate", "--jobs", "1", "-q", cwd=folder).returncode == 0
    generated = folder / "pkg" / "_adjoint" / "torch" / "inv.py"
    edited = generated.read_text() + "\n# my fix\n"
    generated.write_text(edited)

    check = run("generate", "--check", "--jobs", "1", cwd=folder)
    assert check.returncode == 1 and "pkg/_adjoint/torch/inv.py: changed since adjointgen generated it" in check.stderr
    r = run("generate", "--jobs", "1", "-q", cwd=folder)
    assert r.returncode == 1 and "changed since adjointgen generated it" in r.stderr and "nothing was written" in r.stderr
    assert generated.read_text() == edited
    # removing its derivation does not remove the edited file either
    report = folder / "pkg" / "_adjoint" / "reports" / "inv.md"
    (folder / "derivations" / "inv.py").unlink()
    (folder / "derivations" / "other.py").write_text(PLAIN.replace('Derivation("inv"', 'Derivation("other"'))
    r = run("generate", "--jobs", "1", "-q", cwd=folder)
    assert r.returncode == 1 and generated.read_text() == edited and report.is_file()
    # --force: the user asks for it
    r = run("generate", "--jobs", "1", "-q", "--force", cwd=folder)
    assert r.returncode == 0, r.stderr
    assert not generated.exists() and not report.exists()
    assert run("generate", "--check", "--jobs", "1", cwd=folder).returncode == 0


def test_a_file_adjointgen_did_not_write_is_never_overwritten(sandbox):
    folder, _ = sandbox
    project_files(folder, settings='package = "pkg._adjoint"\nbackends = ["report"]\n')
    theirs = folder / "pkg" / "_adjoint" / "reports" / "inv.md"
    theirs.parent.mkdir(parents=True)
    theirs.write_text("# my own inverse notes\n")
    r = run("generate", "--jobs", "1", "-q", cwd=folder)
    assert r.returncode == 1 and "was not written by adjointgen" in r.stderr
    assert theirs.read_text() == "# my own inverse notes\n"
    assert not (folder / "pkg" / "_adjoint" / gen.MANIFEST).exists()


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("setting, message", [
    ('derivations = "derivatons"', "derivations = 'derivatons': no folder"),
    ('output = "../sibling"', "outside the project folder"),
    ('output = "/tmp"', "outside the project folder"),
    ('package = "class._adjoint"', "not a dotted Python name"),
    ('symbolic_timeout = "soon"', "symbolic_timeout must be a number"),
])
def test_bad_settings_are_refused_before_anything_is_written(sandbox, setting, message):
    folder, outer = sandbox
    key = setting.split(" ")[0]
    defaults = {"package": 'package = "pkg._adjoint"', "backends": 'backends = ["report"]'}
    defaults[key] = setting
    project_files(folder, settings="\n".join(defaults.values()) + "\n")
    if key == "derivations":  # a typo after a generation: the generated files stay
        project_files(folder, settings='package = "pkg._adjoint"\nbackends = ["report"]\n')
        assert run("generate", "--jobs", "1", "-q", cwd=folder).returncode == 0
        project_files(folder, settings="\n".join(defaults.values()) + "\n")
    before = tree(folder)
    with pytest.raises(ProjectError, match=message):
        load_project(folder)
    r = run("generate", "--jobs", "1", cwd=folder)
    assert r.returncode == 2 and message in r.stderr and "pyproject.toml" in r.stderr
    assert tree(folder) == before


@pytest.mark.parametrize("file, message", [
    ("class", "not a Python identifier"),
    ("1abc", "not a Python identifier"),
    ("my-op", "not a Python identifier"),
    ("torch", "would shadow the module torch"),
    ("numpy", "would shadow the module numpy"),
])
def test_a_derivation_file_that_cannot_name_a_module_is_refused(sandbox, file, message):
    folder, _ = sandbox
    project_files(folder, settings='package = "pkg._adjoint"\nbackends = ["report"]\n',
                  derivations={file: PLAIN.replace('Derivation("inv"', f'Derivation("{file}"')})
    r = run("generate", "--jobs", "1", cwd=folder)
    assert r.returncode == 2 and message in r.stderr and f"{file}.py" in r.stderr, r.stderr
    assert not (folder / "pkg").exists()


@pytest.mark.parametrize("name", ["../../../../../escaped_x", "other name", "class", "torch"])
def test_a_derivation_name_that_cannot_name_a_module_is_refused(sandbox, name):
    folder, _ = sandbox
    project_files(folder, settings='package = "pkg._adjoint"\nbackends = ["report"]\n',
                  derivations={"inv": PLAIN.replace('Derivation("inv"', f'Derivation("{name}"')})
    r = run("generate", "--jobs", "1", cwd=folder)
    assert r.returncode == 1 and f"Derivation({name!r})" in r.stderr and "inv.py" in r.stderr, r.stderr
    assert "nothing was written" in r.stderr and not (folder / "pkg").exists()


# ------------------------------------------------------------------- progress and budgets
def test_generate_prints_a_line_per_operation_v_the_steps_and_q_nothing(sandbox):
    folder, _ = sandbox
    project_files(folder, settings='package = "pkg._adjoint"\nbackends = ["cupy", "cuda", "report"]\n',
                  derivations={"inv": PLAIN, "other": PLAIN.replace('Derivation("inv"', 'Derivation("other"')})
    r = run_process("generate", "--jobs", "2", cwd=folder)  # two worker processes
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # no worker's progress, interleaved or not
    lines = {line.split()[0]: line for line in r.stdout.splitlines() if line.split()[0] in ("inv", "other")}
    assert set(lines) == {"inv", "other"}
    for line in lines.values():  # how, time, steps and their verdicts, and what each backend wrote
        assert line.split()[1] == "audited" and " steps: " in line and "verified exactly" in line
        assert "cupy, report" in line and "cuda: nothing, no elementwise kernels" in line
    assert r.stdout.strip().splitlines()[-1].endswith("(2 operations: 2 audited)")
    again = in_process("generate", "--jobs", "1", cwd=folder)  # nothing changed: reused, nothing written
    assert [line.split()[1] for line in again.stdout.splitlines()[:2]] == ["reused", "reused"]
    assert "0 changed" in again.stdout
    verbose = in_process("generate", "--jobs", "1", "-v", "--fresh", "inv", cwd=folder)
    steps = [line for line in verbose.stdout.splitlines() if line.startswith("   ") and "[pass]" in line]
    assert len(steps) > 5 and all(("exact" in line) or ("premise" in line) for line in steps), verbose.stdout
    quiet = in_process("generate", "--jobs", "1", "-q", "--fresh", cwd=folder)
    assert quiet.returncode == 0 and quiet.stderr == "" and "inv " not in quiet.stdout


# a derivation whose symbolic replay is slow: the explicit 3x3 (2x2) check of X = inverse of a
# matrix power, (A^4)^-1, expands rational functions of 9 symbols of high degree; in exact
# arithmetic it takes milliseconds
SLOW = PLAIN.replace('return {"X": np.linalg.inv(A)}', 'return {"X": np.linalg.inv(A @ A @ A @ A)}').replace(
    'A = rng.standard_normal((n, n)) + n * np.eye(n)', 'A = 0.1 * rng.standard_normal((n, n)) + np.eye(n)').replace(
    'eq = d.identity("A X = I", A * X, Identity(n))', 'eq = d.identity("A^4 X = I", A * A * A * A * X, Identity(n))').replace(
    's = d.left_multiply(d.differentiate(eq), X)\ns = d.substitute(s, d.identity("X A = I", X * A, Identity(n)))',
    's = d.left_multiply(d.differentiate(eq), X)\ns = d.substitute(s, d.identity("X A^4 = I", X * A * A * A * A, Identity(n)))').replace(
    'd.forward(numpy="xp.linalg.inv")', 'd.forward(torch="inv4ops:inv4_torch", numpy="inv4ops:inv4_numpy")')
SLOW_OPS = '''\
import numpy as np
import torch


def inv4_numpy(A):
    return np.linalg.inv(A @ A @ A @ A)


def inv4_torch(A):
    return torch.linalg.inv(torch.linalg.matrix_power(A, 4))
'''


def test_a_replay_too_slow_for_sympy_is_verified_exactly(sandbox, monkeypatch):
    folder, _ = sandbox
    project_files(folder, settings='package = "pkg._adjoint"\nbackends = ["torch", "report"]\nsymbolic_timeout = 0.5\n',
                  derivations={"inv4": SLOW.replace('Derivation("inv"', 'Derivation("inv4"')})
    (folder / "inv4ops.py").write_text(SLOW_OPS)
    r = run("generate", "--jobs", "1", cwd=folder)
    assert r.returncode == 0, r.stderr
    assert "NOT verified" not in r.stdout and "verified exactly" in r.stdout
    report = (folder / "pkg" / "_adjoint" / "reports" / "inv4.md").read_text()
    assert "timed out" not in report and "verified exactly: rational arithmetic" in report
    # the numeric audit and the emitted code's check ran: the module differentiates (A^4)^-1
    import importlib.util

    import torch

    monkeypatch.syspath_prepend(str(folder))

    spec = importlib.util.spec_from_file_location("inv4_generated", folder / "pkg" / "_adjoint" / "torch" / "inv4.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    A = (torch.eye(3, dtype=torch.float64) + 0.1 * torch.randn(3, 3, dtype=torch.float64)).requires_grad_()
    assert torch.allclose(module.inv4(A), torch.linalg.inv(torch.linalg.matrix_power(A, 4)))
    assert torch.autograd.gradcheck(module.inv4, (A,))


def test_a_symbolic_fallback_runs_out_of_its_budget_and_is_not_a_verification(sandbox, monkeypatch):
    """Where a value has no rational form the step is replayed symbolically, under the budget: a
    replay that runs out of it is reported as NOT verified, never as verified."""
    from adjointgen.audit import exact, runner

    folder, _ = sandbox
    project_files(folder, settings='package = "pkg._adjoint"\nbackends = ["report"]\n',
                  derivations={"inv4": SLOW.replace('Derivation("inv"', 'Derivation("inv4"')})

    def no_rational_form(step, spec, free):
        raise exact.NotExact("pretend it has none")

    monkeypatch.setattr(exact, "verify", no_rational_form)
    spec = gen.load_derivation(load_project(folder), "inv4")
    step = next(s for s in spec.steps if s.kind == "substitute")  # (A^4)^-1: slow for SymPy
    from sympy.core.cache import clear_cache

    clear_cache()  # (an earlier test in this process may have left the replay's expressions in SymPy's cache)
    verdict = runner._verify(spec, step, 0.3)
    assert verdict.startswith("NOT verified") and "timed out after 0.3 s" in verdict, verdict
    assert runner.verdict_kind(verdict) == "numeric only"
    result = runner.StepResult(step.index, step.kind, step.label, step.line, 0.0, 1e-7, verdict, "")
    report = runner.AuditReport(spec.name, spec.path, spec.title, 1, (result,))
    assert report.passed and "1 NOT verified (numeric only)" in report.summary()
    assert "NOT verified (numeric only): steps" in report.to_text()


# the ctrl-c test's slow derivation: its sampler says when the audit is under way, then takes long
SLOW_SAMPLER = PLAIN.replace("def sample(rng, n):", """def sample(rng, n):
    import pathlib, time
    pathlib.Path(__file__).with_name("started").touch()
    time.sleep(60)""", 1)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_ctrl_c_stops_generation_and_writes_nothing(sandbox, jobs):
    import signal
    import time

    folder, _ = sandbox
    # the slow one first (in name order with one process, by file size with two)
    project_files(folder, settings='package = "pkg._adjoint"\nbackends = ["report"]\n',
                  derivations={"aslow": SLOW_SAMPLER.replace('Derivation("inv"', 'Derivation("aslow"'), "inv": PLAIN})
    started = folder / "derivations" / "started"
    before = tree(folder)
    # SIGINT as a terminal delivers it: a pytest-xdist worker ignores it, and a child inherits that
    process = subprocess.Popen([sys.executable, "-m", "adjointgen", "generate", "--jobs", jobs], cwd=folder,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not started.exists():  # the slow audit is under way
        time.sleep(0.1)
    assert started.exists()
    process.send_signal(signal.SIGINT)  # the parent only: it must stop its workers itself
    out, err = process.communicate(timeout=120)  # at once on a quiet machine; a loaded one is slow to wake
    started.unlink()
    assert process.returncode == 130, out + err
    assert "interrupted: nothing was written" in err
    assert tree(folder) == before

"""User projects: `adjointgen init`, generation into the project's own package, template overrides,
and the errors a derivation author gets for their mistakes."""
import importlib
import shutil
import subprocess
import sys
import textwrap

import pytest

from adjointgen.codegen import generate as gen
from adjointgen.project import ProjectError, load_project


from inprocess import run  # noqa: E402  (the command line in this process)


@pytest.fixture(scope="module")
def initialised(tmp_path_factory):
    folder = tmp_path_factory.mktemp("proj") / "myops"
    r = run("init", str(folder), cwd=folder.parent)
    assert r.returncode == 0, r.stderr
    r = run("generate", "--jobs", "1", cwd=folder)
    assert r.returncode == 0, r.stdout + r.stderr
    return folder


def test_init_writes_a_configured_project(initialised):
    project = load_project(initialised)
    assert project.package == "myops._adjoint"
    assert project.output == (initialised / "src" / "myops" / "_adjoint").resolve()
    assert project.derivation_names() == ["cayley"]
    assert (initialised / "tests" / "test_cayley.py").is_file()
    assert run("init", str(initialised), cwd=initialised.parent).returncode == 2  # no silent overwrite


def test_generated_package_imports_and_differentiates(initialised, monkeypatch):
    import torch

    monkeypatch.syspath_prepend(str(initialised / "src"))
    for name in [m for m in sys.modules if m == "myops" or m.startswith("myops.")]:
        del sys.modules[name]
    module = importlib.import_module("myops._adjoint.torch.cayley")
    text = (initialised / "src" / "myops" / "_adjoint" / "torch" / "cayley.py").read_text()
    assert "sources: derivations/cayley.py, adjointgen/templates/torch/op.py.j2" in text
    A = (0.3 * torch.randn(4, 4, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(module.cayley, (A,))
    with pytest.raises(ValueError, match="square"):
        module.cayley(torch.zeros(3, 4, dtype=torch.float64))


def test_check_list_and_the_project_test(initialised):
    assert run("generate", "--check", "--jobs", "1", cwd=initialised).returncode == 0
    listed = run("list", cwd=initialised)
    assert "cayley" in listed.stdout and "src/myops/_adjoint/torch/cayley.py" in listed.stdout
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=initialised,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_project_template_overrides_the_builtin_one(initialised, tmp_path):
    folder = tmp_path / "override"
    shutil.copytree(initialised, folder)
    (folder / "templates" / "report").mkdir(parents=True)
    (folder / "templates" / "report" / "audit.md.j2").write_text("{{ header }}\nCUSTOM REPORT {{ op.name }}\n")
    config = folder / "pyproject.toml"
    config.write_text(config.read_text().replace('[tool.adjointgen]\n', '[tool.adjointgen]\ntemplates = "templates"\n'))
    r = run("generate", "--jobs", "1", cwd=folder)
    assert r.returncode == 0, r.stderr
    report = (folder / "src" / "myops" / "_adjoint" / "reports" / "cayley.md").read_text()
    assert "CUSTOM REPORT cayley" in report and "sources: derivations/cayley.py, templates/report/audit.md.j2" in report
    # the torch module still comes from the built-in template
    assert "adjointgen/templates/torch/op.py.j2" in (folder / "src/myops/_adjoint/torch/cayley.py").read_text()


def test_template_errors_name_the_template(initialised, tmp_path):
    folder = tmp_path / "broken"
    shutil.copytree(initialised, folder)
    (folder / "templates" / "torch").mkdir(parents=True)
    (folder / "templates" / "torch" / "op.py.j2").write_text("{{ header }}\n{% for x in %}\n")
    config = folder / "pyproject.toml"
    config.write_text(config.read_text().replace('[tool.adjointgen]\n', '[tool.adjointgen]\ntemplates = "templates"\n'))
    r = run("generate", "--jobs", "1", cwd=folder)
    assert r.returncode == 2
    assert "templates/torch/op.py.j2:2: template syntax error" in r.stderr
    assert "Traceback" not in r.stderr


def test_missing_project_is_a_clear_error(tmp_path):
    r = run("list", cwd=tmp_path)
    assert r.returncode == 2 and "no adjointgen project" in r.stderr and "adjointgen init" in r.stderr
    (tmp_path / "pyproject.toml").write_text("[tool.adjointgen]\nbackends = ['torch']\n")
    with pytest.raises(ProjectError, match="needs `package`"):
        load_project(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[tool.adjointgen]\npackage = 'x'\nbackends = ['fortran']\n")
    with pytest.raises(ProjectError, match="unknown backend"):
        load_project(tmp_path)


def _derivation_project(tmp_path, body):
    (tmp_path / "derivations").mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.adjointgen]\npackage = "pkg._adjoint"\n')
    (tmp_path / "derivations" / "inv.py").write_text(textwrap.dedent(body))
    return load_project(tmp_path)


INVERSE = '''\
import numpy as np
from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Identity

def forward(A):
    return {"X": np.linalg.inv(A)}

def sample(rng, n):
    A = rng.standard_normal((n, n)) + n * np.eye(n)
    dA = rng.standard_normal((n, n))
    base, tan = fd_tangents(forward, {"A": A}, {"A": dA})
    return SAMPLE

d = Derivation("inv", __file__, title="inverse")
n = d.dim("n")
A = d.input("A", n, n)
X = d.output("X", n, n)
FORWARD
d.instances(sample, [{"n": 3}])
eq = d.identity("A X = I", A * X, Identity(n))
s = d.left_multiply(d.differentiate(eq), X)
s = d.substitute(s, d.identity("X A = I", X * A, Identity(n)))
d.set_jvp(dX=d.solve_for(s, d.tangent(X)))
d.derive_vjp()
'''


def _inverse(sample='{"A": A, "dA": dA, "X": base["X"], "dX": tan["X"]}', forward='d.forward(numpy="xp.linalg.inv")'):
    return INVERSE.replace("SAMPLE", sample).replace("FORWARD", forward)


def test_a_sampler_that_omits_a_key_is_named(tmp_path):
    project = _derivation_project(tmp_path, _inverse(sample='{"A": A, "dA": dA, "X": base["X"]}'))
    with pytest.raises(gen.GenerationFailed) as err:
        gen.render(project, jobs=1)
    message = str(err.value)
    assert "inv.py:" in message and "returned no dX (output tangent" in message and "fd_tangents" in message


def test_a_forward_that_cannot_be_imported_is_named_with_its_line(tmp_path):
    project = _derivation_project(tmp_path, _inverse(forward="d.forward(torch=lambda A: A)"))
    with pytest.raises(gen.GenerationFailed) as err:
        gen.render(project, jobs=1)
    assert "inv.py:18" in str(err.value) and "must be importable" in str(err.value)


def test_a_forward_with_the_wrong_convention_fails_the_audit_at_its_line(tmp_path):
    project = _derivation_project(tmp_path, _inverse(forward='d.forward(numpy="xp.transpose")'))
    with pytest.raises(gen.GenerationFailed) as err:
        gen.render(project, jobs=1)
    assert "the forward computation" in str(err.value) and "inv.py:18" in str(err.value)


def test_an_error_inside_a_derivation_script_names_file_and_line(tmp_path):
    project = _derivation_project(tmp_path, _inverse().replace("d.derive_vjp()", "d.derive_vjp(undefined_name)"))
    with pytest.raises(gen.GenerationFailed) as err:
        gen.render(project, jobs=1)
    assert "inv.py:24: NameError" in str(err.value)


def test_the_command_line_starts_without_torch_or_sympy(tmp_path):
    code = ("import sys, contextlib, io\n"
            "from adjointgen import cli\n"
            "for argv in (['--help'], ['init', sys.argv[1]], ['--root', sys.argv[1], 'list']):\n"
            "    with contextlib.redirect_stdout(io.StringIO()):\n"
            "        try:\n"
            "            cli.main(argv)\n"
            "        except SystemExit:\n"
            "            pass\n"
            "print(sorted(m for m in ('torch', 'sympy', 'jinja2', 'numpy') if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "fresh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_matrix_functions_of_your_own_through_a_copied_catalogue_derivation(tmp_path, monkeypatch):
    """`init --copy funm`: the catalogue's generic derivation, edited to instantiate the user's f."""
    import re

    import torch

    import adjointgen.testing as agtest

    folder = tmp_path / "spectral"
    r = run("init", str(folder), "--package", "spectral_ops._adjoint", "--copy", "funm", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (folder / "derivations" / "_eigenspaces.py").is_file()  # the helper it imports
    path = folder / "derivations" / "funm.py"
    text, count = re.subn(r"^CATALOGUE = .*$", 'CATALOGUE = {"coshm": sp.cosh(x)}', path.read_text(), flags=re.M)
    assert count == 1
    path.write_text(text)
    r = run("generate", "funm", cwd=folder)
    assert r.returncode == 0, r.stdout + r.stderr
    monkeypatch.syspath_prepend(str(folder / "src"))
    module = importlib.import_module("spectral_ops._adjoint.torch.funm")
    A = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    A = (A + A.mT) / 2
    torch.testing.assert_close(module.coshm(A), (torch.linalg.matrix_exp(A) + torch.linalg.matrix_exp(-A)) / 2)
    assert agtest.gradgradcheck(module.coshm, (A.requires_grad_(),))
    assert not hasattr(module, "expm")
    assert run("init", str(tmp_path / "other"), "--copy", "nonesuch", cwd=tmp_path).returncode == 2


def test_the_catalogue_is_audited_from_anywhere(tmp_path):
    r = run("--catalogue", "list", cwd=tmp_path)
    assert r.returncode == 0 and "eigh" in r.stdout and "funm" in r.stdout
    r = run("--catalogue", "audit", "inv", "--numeric-only", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "PASSED" in r.stdout


SIGNED_LOGDET = '''\
import numpy as np
from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, LogAbsDet

def forward(A):
    sign, logabsdet = np.linalg.slogdet(A)
    return {"sign": np.array([[sign]]), "logabsdet": np.array([[logabsdet]])}

def sample(rng, n):
    A = rng.standard_normal((n, n)) + n * np.eye(n)
    dA = rng.standard_normal((n, n))
    base, tan = fd_tangents(forward, {"A": A}, {"A": dA})
    return {"A": A, "dA": dA, "sign": base["sign"], "logabsdet": base["logabsdet"], "dlogabsdet": tan["logabsdet"]}

d = Derivation("signed_logdet", __file__, title="sign and log|det| of a real matrix")
n = d.dim("n")
A = d.input("A", n, n)
sign = d.output("sign", 1, 1, constant=True)
logabsdet = d.output("logabsdet", 1, 1)
d.api_outputs("sign", "logabsdet")
d.forward(torch="torch.linalg.slogdet", numpy="xp.linalg.slogdet")
d.instances(sample, [{"n": 3}, {"n": 4}])
s = d.differentiate(d.identity("logabsdet = log|det A|", logabsdet, LogAbsDet(A)))
d.set_jvp(dlogabsdet=d.solve_for(s, d.tangent(logabsdet)))
d.derive_vjp()
'''


def test_scalar_and_piecewise_constant_outputs_of_your_own(tmp_path, monkeypatch):
    """A derivation with a scalar output (``1×1``, returned with the batch shape) and a piecewise
    constant one (no tangent, no rule, returned not differentiable)."""
    import torch

    (tmp_path / "derivations").mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.adjointgen]\npackage = "sld._adjoint"\noutput = "sld/_adjoint"\n')
    (tmp_path / "derivations" / "signed_logdet.py").write_text(SIGNED_LOGDET)
    project = load_project(tmp_path)
    gen.write(gen.render(project, jobs=1))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("sld._adjoint.torch.signed_logdet")
    A = torch.randn(3, 4, 4, dtype=torch.float64).requires_grad_()
    sign, logabsdet = module.signed_logdet(A)
    assert sign.shape == logabsdet.shape == (3,) and not sign.requires_grad and logabsdet.requires_grad
    assert torch.equal(sign, torch.linalg.slogdet(A.detach()).sign)
    (g,) = torch.autograd.grad(logabsdet.sum(), A)
    assert torch.allclose(g, torch.linalg.inv(A.detach()).mT, rtol=1e-12, atol=1e-12)
    dA = torch.randn(A.shape, dtype=torch.float64)
    _, (dsign, dlog) = torch.func.jvp(module.signed_logdet, (A.detach(),), (dA,))
    assert torch.equal(dsign, torch.zeros_like(dsign))
    assert torch.allclose(dlog, torch.linalg.solve(A.detach(), dA).diagonal(dim1=-2, dim2=-1).sum(-1), rtol=1e-12)


def test_a_package_folder_is_never_put_on_the_import_path(tmp_path):
    """The installed catalogue's root is the adjointgen package itself; putting it on sys.path
    would let adjointgen/torch.py shadow torch in the generation's workers."""
    from adjointgen.project import Project

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    project = Project(root=pkg, config_file=pkg / "pyproject.toml", derivations=pkg, package="pkg.generated",
                      output=pkg / "generated", backends=("torch",), templates=None)
    before = list(sys.path)
    with project.importable():
        assert str(pkg) not in sys.path and sys.path == before


@pytest.mark.parametrize("removed", [("set_jvp", "derive_vjp"), ("derive_vjp",)], ids=["no rules", "no VJP"])
def test_a_half_written_derivation_is_audited_step_by_step_and_says_what_is_missing(tmp_path, removed):
    folder = tmp_path / "half"
    assert run("init", str(folder), cwd=tmp_path).returncode == 0
    path = folder / "derivations" / "cayley.py"
    path.write_text("\n".join(line for line in path.read_text().splitlines()
                              if not any(word in line for word in removed)) + "\n")
    r = run("audit", "cayley", "--numeric-only", cwd=folder)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "differentiate" in r.stdout and "[pass]" in r.stdout
    assert "INCOMPLETE" in r.stdout and "derive_vjp" in r.stdout
    assert ("the JVP: d.set_jvp" in r.stdout) == ("set_jvp" in removed)
    r = run("generate", "cayley", cwd=folder)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "is not finished" in r.stdout + r.stderr and str(path) in r.stdout + r.stderr
    assert not (folder / "src" / "half" / "_adjoint" / "torch").exists()


def test_an_override_copied_before_the_imports_were_computed_still_renders(initialised, tmp_path):
    """A copy of the cupy template that includes ``common/array_imports.py.j2`` (where the older
    templates listed their imports) gets the computed imports there: the same module as the
    built-in template's."""
    from adjointgen.project import builtin_templates

    folder = tmp_path / "old_override"
    shutil.copytree(initialised, folder)
    built_in = (initialised / "src" / "myops" / "_adjoint" / "cupy" / "cayley.py").read_text()
    text = (builtin_templates() / "cupy" / "op.py.j2").read_text()
    assert "{{ imports }}\n" in text
    (folder / "templates" / "cupy").mkdir(parents=True)
    (folder / "templates" / "cupy" / "op.py.j2").write_text(
        text.replace("{{ imports }}\n", '{% include "common/array_imports.py.j2" %}\n'))
    config = folder / "pyproject.toml"
    config.write_text(config.read_text().replace('[tool.adjointgen]\n', '[tool.adjointgen]\ntemplates = "templates"\n'))
    r = run("generate", "--jobs", "1", cwd=folder)
    assert r.returncode == 0, r.stderr
    made = (folder / "src" / "myops" / "_adjoint" / "cupy" / "cayley.py").read_text()
    body = lambda s: [line for line in s.splitlines() if not line.startswith("# ")]  # noqa: E731 (headers differ)
    assert "import" in "".join(body(made)) and body(made) == body(built_in)

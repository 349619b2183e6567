"""docs/derivations.md ("Writing a derivation") runs as written: three operations of one project
made by ``adjointgen init`` (a Lyapunov solve, the matrix sign function with an eliminated term,
the geometric mean), each audited with every step verified exactly, generated, and tested against
SciPy and finite differences.  The whole page runs in the slow step (``-m slow``) and, from a plain
``pip install``, in ``scripts/check-install.sh``; the default suite audits the derivations."""
import pytest

import docproject
from adjointgen.audit.runner import verdict_kind
from adjointgen.codegen import generate as gen
from adjointgen.project import load_project


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return docproject.build(tmp_path_factory.mktemp("doc"))


@pytest.mark.parametrize("name", ["lyap", "signm", "gmean"])
def test_every_step_of_the_pages_derivations_is_verified(demo, name):
    a = gen.audit_one(load_project(demo), name)
    assert a.report.passed, a.report.to_text()
    kinds = [verdict_kind(s.symbolic) for s in a.report.steps]
    assert set(kinds) == {"exact", "premise"}, a.report.to_text()
    assert gen.missing_steps(a.derivation) == []


def test_the_page_names_what_it_documents():
    text = docproject.PAGE.read_text()
    for needle in ("solve_sylvester(s, dS, A * S", "eliminate", "adjointgen.runtime.linalg.sylvester",
                   "adjointgen.runtime.xp.sylvester", "torch forward", "NumPy's", "mpirun -n 4 python",
                   "Schwartz–Zippel", "is singular"):
        assert needle in text, needle
    readme = (docproject.ROOT / "README.md").read_text()
    assert "docs/derivations.md" in readme


@pytest.mark.slow
def test_the_page_runs_as_written(tmp_path):
    ran = docproject.run_page(tmp_path)
    assert ran >= 5
    assert (tmp_path / "demo" / "src" / "demo" / "_adjoint" / "torch" / "signm.py").is_file()
    assert not (tmp_path / "demo" / "src" / "demo" / "_adjoint" / "cuda").exists()  # no kernels to emit

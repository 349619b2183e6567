"""``Derivation.extend``: the public function beyond the derived domain, a declared composition of
the derived function (``derivations/polar.py``'s ``side="left"`` and wide ``A``; their values and
derivatives are tested in ``tests/test_polar.py``).  Here: the declaration's errors, and the audit's
check that with its default options the extension is the derived function."""
import shutil
import textwrap

import pytest

from adjointgen.audit import audit
from adjointgen.calculus import Derivation, DerivationError
from adjointgen.codegen import generate as gen


def _derivation(tmp_path):
    d = Derivation("ext_probe", str(tmp_path / "ext_probe.py"), title="a probe")
    n = d.dim("n")
    d.input("A", n, n)
    d.output("X", n, n)
    return d


def test_extend_needs_the_forward_and_its_own_option_names(tmp_path):
    d = _derivation(tmp_path)
    with pytest.raises(DerivationError, match="declare d.forward first"):
        d.extend("adjointgen.catalogue._extensions:polar")
    d.forward(numpy="xp.linalg.inv", options={"mode": None})
    for name in ("A", "mode", "not an identifier"):
        with pytest.raises(DerivationError, match="is not an identifier or clashes"):
            d.extend("adjointgen.catalogue._extensions:polar", options={name: "x"})
    with pytest.raises(DerivationError, match="is not an importable name"):
        d.extend("not a name")
    with pytest.raises(DerivationError, match="default must be None, a bool, number or string"):
        d.extend("adjointgen.catalogue._extensions:polar", options={"side": ["right"]})


def test_an_extension_that_is_not_the_derived_function_at_its_defaults_fails_the_audit(root, tmp_path, monkeypatch):
    (tmp_path / "wrong_extension.py").write_text(textwrap.dedent('''
        def swapped(derived, a, side="right"):
            u, p = derived(a)
            return p, u
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "derivations").mkdir()
    for name in ("polar.py", "_forwards.py", "__init__.py"):
        if (root / "derivations" / name).exists():
            shutil.copy(root / "derivations" / name, tmp_path / "derivations" / name)
    path = tmp_path / "derivations" / "polar.py"
    src = path.read_text()
    good = 'd.extend("adjointgen.catalogue._extensions:polar", options={"side": "right"})'
    assert good in src
    assert audit(gen.load_derivation_file(path, partial=True)).passed  # the copy as shipped
    path.write_text(src.replace(good, good.replace("adjointgen.catalogue._extensions:polar", "wrong_extension:swapped")))
    report = audit(gen.load_derivation_file(path, partial=True))
    assert not report.passed
    first = report.first_failure()
    assert "beyond the derived domain: wrong_extension:swapped" in first.label

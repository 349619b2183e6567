"""JAX's own derivative tests of its linear algebra, run on JAX's functions or with ``adjointgen.jax``
swapped in, under JAX's own test configuration.

The tests are JAX's ``tests/linalg_test.py`` and ``tests/eigh_test.py`` at the tag of the pinned
JAX version, vendored verbatim under ``tests/data/jax-v<version>/`` (with JAX's license): JAX's
PyPI source distribution does not ship its tests, and CI reaches PyPI only.  Another copy (a JAX
checkout's ``tests/``, for another JAX version) is taken from ``$ADJOINTGEN_JAX_TESTS``.

Each test module runs as JAX runs it: its ``JaxTestCase`` configuration (strict dtype promotion,
``jax_numpy_rank_promotion='raise'``, ``jax_enable_checks``), x64 from ``JAX_ENABLE_X64``, the
sampled cases from ``JAX_NUM_GENERATED_CASES``.  With ``--agj`` the modules' own names ``jnp``,
``jsp``, ``lax`` and ``jax`` are replaced, inside the test modules only, by views whose ``linalg``
resolves the functions adjointgen provides to ``adjointgen.jax`` (``jnp.linalg``),
``adjointgen.jax.scipy`` (``jax.scipy.linalg``) and ``adjointgen.jax.lax`` (``lax.linalg``); every
other name is JAX's.  So a test that differentiates ``jnp.linalg.eigh`` differentiates ``agj.eigh``.

The selected tests (:data:`SELECTED`) are those that differentiate one of the functions adjointgen
provides (``check_grads``, ``check_jvp``, ``jvp``, ``grad``, ``jacobian``, ``jacfwd`` or a dot
precision check on a JVP).

    python tests/jax_upstream.py                 # JAX's functions, x64 as the environment has it
    python tests/jax_upstream.py --agj --x64     # adjointgen swapped in, x64 on
    python tests/jax_upstream.py --agj --no-x64 --cases 5 --json

prints the pass/fail/skip counts (``--json``: one JSON object, with each failure's first lines).
``tests/test_jax_upstream.py`` (slow) runs both and compares.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import time
import types
import unittest
from pathlib import Path

#: the JAX version whose tests are vendored, and where
VENDORED_VERSION = "0.10.2"
VENDORED = Path(__file__).resolve().parent / "data" / f"jax-v{VENDORED_VERSION}"
FILES = ("linalg_test.py", "eigh_test.py")

#: the test methods (of any class in the two files) that differentiate a function adjointgen provides
SELECTED = (
    # eigh
    "testEighGrad", "testEighGradPrecision", "testEighGradRankPromotion", "testIssue669", "testIssue1383",
    # eig, eigvals
    "testEigvalsGrad", "testEigGradComplexInputs", "testEigGradRealInputs",
    # svd
    "testSVD", "testSVDGrad",
    # qr
    "testQr", "testScipyQrModes",
    # cholesky
    "testCholesky", "testCholeskyGradPrecision",
    # det, slogdet
    "testDetGrad", "testDetGradIssue6121", "testDetGradOfSingularMatrixCorank1",
    "testDetGradOfSingularMatrixCorank2", "testSlogdetGrad",
    # pinv
    "testPinv", "testPinvGradIssue2792",
    # lu
    "testLuGrad",
    # solve, triangular solve
    "testIssue1151", "testTriangularSolveGrad", "testTriangularSolveGradPrecision",
    # expm
    "testExpmGrad",
)

#: the functions swapped in with ``--agj``: (JAX module, name) -> attribute path in adjointgen.jax
SWAPPED = {
    **{("jnp", name): name for name in (
        "cholesky", "det", "eig", "eigh", "eigvals", "eigvalsh", "inv", "lstsq", "pinv", "qr", "slogdet",
        "solve", "svd", "svdvals")},
    **{("jsp", name): "scipy." + name for name in (
        "cholesky", "det", "eigh", "expm", "inv", "lu", "qr", "solve", "solve_triangular", "sqrtm", "svd")},
    **{("lax", name): "lax." + name for name in (
        "cholesky", "eig", "eigh", "lu", "qr", "svd", "triangular_solve")},
}


def test_files() -> tuple[Path | None, str]:
    """The directory holding the two test files, and why it is ``None`` where there is none that
    matches the installed JAX."""
    if importlib.util.find_spec("absl") is None:
        return None, "absl-py is not installed (JAX's test utilities need it: pip install absl-py)"
    import jax

    override = os.environ.get("ADJOINTGEN_JAX_TESTS")
    if override:
        where = Path(override)
        missing = [f for f in FILES if not (where / f).is_file()]
        return (None, f"$ADJOINTGEN_JAX_TESTS={override} lacks {', '.join(missing)}") if missing else (where, "")
    if jax.__version__ != VENDORED_VERSION:
        return None, (f"the vendored tests are JAX {VENDORED_VERSION}'s and JAX {jax.__version__} is installed: "
                      "set ADJOINTGEN_JAX_TESTS to the tests/ folder of a JAX checkout at that version")
    missing = [f for f in FILES if not (VENDORED / f).is_file()]
    return (None, f"{VENDORED} lacks {', '.join(missing)}") if missing else (VENDORED, "")


class _Linalg(types.ModuleType):
    """A module's ``linalg`` with the swapped functions replaced."""

    def __init__(self, real, swapped: dict):
        super().__init__(real.__name__)
        self._real, self._swapped = real, swapped

    def __getattr__(self, name):
        if name in self._swapped:
            return self._swapped[name]
        return getattr(self._real, name)


class _View(types.ModuleType):
    """A module whose ``linalg`` (and, for ``jax``, whose ``numpy``, ``scipy`` and ``lax``) are
    replaced; every other name is the real module's."""

    def __init__(self, real, replaced: dict):
        super().__init__(real.__name__)
        self._real, self._replaced = real, replaced

    def __getattr__(self, name):
        if name in self._replaced:
            return self._replaced[name]
        return getattr(self._real, name)


def _resolve(path: str):
    obj = importlib.import_module("adjointgen.jax")
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def swapped_views() -> dict:
    """The names ``jnp``, ``jsp``, ``lax`` and ``jax`` as the test modules see them with ``--agj``."""
    import jax
    import jax.numpy as jnp
    import jax.scipy as jsp
    from jax import lax

    by_module = {"jnp": {}, "jsp": {}, "lax": {}}
    for (module, name), path in SWAPPED.items():
        by_module[module][name] = _resolve(path)
    jnp_view = _View(jnp, {"linalg": _Linalg(jnp.linalg, by_module["jnp"])})
    jsp_view = _View(jsp, {"linalg": _Linalg(jsp.linalg, by_module["jsp"])})
    lax_view = _View(lax, {"linalg": _Linalg(lax.linalg, by_module["lax"])})
    jax_view = _View(jax, {"numpy": jnp_view, "scipy": jsp_view, "lax": lax_view})
    return {"jnp": jnp_view, "jsp": jsp_view, "lax": lax_view, "jax": jax_view}


def _load(path: Path, agj: bool):
    spec = importlib.util.spec_from_file_location(f"jax_upstream_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if agj:  # looked up when a test runs: the swap reaches the tests and the module's helpers
        for name, view in swapped_views().items():
            if name in vars(module):
                setattr(module, name, view)
    return module


def _selected(name: str, only=()) -> bool:
    """Whether a test method (``testEighGrad3``: a parameterized case of ``testEighGrad``) is one of
    :data:`SELECTED`, and contains one of ``only`` (where given)."""
    for base in SELECTED:
        if name == base or (name.startswith(base) and not name[len(base)].isalpha()):
            return not only or any(k in name for k in only)
    return False


def suite(folder: Path, agj: bool, only=()) -> unittest.TestSuite:
    out = unittest.TestSuite()
    loader = unittest.TestLoader()
    for f in FILES:
        module = _load(folder / f, agj)
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, unittest.TestCase) and value.__module__ == module.__name__:
                for name in loader.getTestCaseNames(value):
                    if _selected(name, only):
                        out.addTest(value(name))
    return out


class _Result(unittest.TestResult):
    def __init__(self, verbose: bool):
        super().__init__()
        self.passed, self.verbose, self.started = [], verbose, 0.0

    def startTest(self, test):
        super().startTest(test)
        self.started = time.perf_counter()

    def addSuccess(self, test):
        super().addSuccess(test)
        self.passed.append(test)
        self._say("ok", test)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._say("FAIL", test)

    def addError(self, test, err):
        super().addError(test, err)
        self._say("ERROR", test)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._say("skip", test)

    def _say(self, what, test):
        if self.verbose:
            print(f"{what:5s} {time.perf_counter() - self.started:6.1f}s {test.id()}", file=sys.stderr, flush=True)


def run(folder: Path, agj: bool, verbose: bool = False, only=()) -> dict:
    """Run the selected tests; the counts and, per failure or error, its test and last lines."""
    result = _Result(verbose)
    suite(folder, agj, only).run(result)
    failed = [(t.id(), text) for t, text in (*result.failures, *result.errors)]
    import jax

    return {
        "jax": jax.__version__, "functions": "adjointgen.jax" if agj else "jax",
        "x64": bool(jax.config.jax_enable_x64), "cases": int(os.environ.get("JAX_NUM_GENERATED_CASES", "10")),
        "passed": len(result.passed), "failed": len(failed), "skipped": len(result.skipped),
        "failures": [{"test": name, "error": "\n".join(text.strip().splitlines()[-6:])} for name, text in failed],
        "skips": sorted({reason for _, reason in result.skipped}),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agj", action="store_true", help="swap adjointgen.jax in")
    x64 = parser.add_mutually_exclusive_group()
    x64.add_argument("--x64", dest="x64", action="store_true", default=None)
    x64.add_argument("--no-x64", dest="x64", action="store_false")
    parser.add_argument("--cases", type=int, default=None, help="JAX_NUM_GENERATED_CASES (default: JAX's, 10)")
    parser.add_argument("-k", action="append", default=[], help="only the selected tests whose name contains this")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.x64 is not None:
        os.environ["JAX_ENABLE_X64"] = "1" if args.x64 else "0"
    if args.cases is not None:
        os.environ["JAX_NUM_GENERATED_CASES"] = str(args.cases)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.argv = sys.argv[:1]  # the test modules parse --jax* flags with absl
    folder, why = test_files()
    if folder is None:
        print(f"JAX's tests unavailable: {why}", file=sys.stderr)
        return 2
    out = run(folder, args.agj, args.verbose, tuple(args.k))
    if args.json:
        print(json.dumps(out))
    else:
        print(f"JAX {out['jax']}, {out['functions']}, x64 {'on' if out['x64'] else 'off'}, "
              f"JAX_NUM_GENERATED_CASES={out['cases']}: {out['passed']} passed, {out['failed']} failed, "
              f"{out['skipped']} skipped")
        for f in out["failures"]:
            print(f"--- {f['test']}\n{f['error']}")
    return 0 if out["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""The contracts of docs/architecture.md, checked on the code itself.

- Data flows one way: derivation -> spec -> audit -> IR -> backend -> files; the runtime imports
  nothing of the generator, the generated code imports the runtime only, and no stage reaches into
  another's private names.
- A finished derivation is a frozen spec: nothing writes into it, not even the audit or the lowering.
- Generated rules name the derivation step each comes from (file:line).
"""
from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

import adjointgen.codegen.generate as gen

ROOT = Path(__file__).resolve().parents[1]
#: the built-in templates: a folder per backend (named by its row) and the shared common/, package/
TEMPLATES = ROOT / "templates"

#: stage -> the stages it may import (module ``adjointgen.<stage>...``; ``(root)`` is the package
#: itself).  Reading down the table is reading down the pipeline.
ALLOWED = {
    "names": set(),
    "runtime": set(),
    "calculus": {"names"},
    "audit": {"calculus", "names"},
    "project": {"names"},
    "codegen": {"calculus", "audit", "project", "runtime", "names"},
    "generated": {"runtime"},
    "composite": {"generated", "runtime"},
    "torch": {"composite", "generated", "runtime", "codegen"},  # codegen: funm compiles a user's f
    "cupy": {"(root)", "generated"},
    "jax": {"(root)", "composite", "generated", "runtime", "codegen"},  # codegen: funm compiles a user's f
    "petsc": {"generated", "runtime"},  # distributed eigsh: SLEPc forward, the generated eigsh rules on PETSc
    "testing": {"runtime", "torch"},
    "divided_reference": {"runtime", "codegen"},
    "reference": {"calculus", "audit", "project"},
    "skeleton": {"codegen", "project"},
    "cli": {"calculus", "codegen", "project", "reference", "skeleton", "audit"},
    "__main__": {"cli"},
    "(root)": set(),
}


def _modules():
    """(module name, path) of every module of the package, the generated code included."""
    for base, prefix in ((ROOT / "src" / "adjointgen", "adjointgen"), (ROOT / "generated", "adjointgen.generated")):
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join([prefix, *parts]), path


def _imports(module: str, path: Path):
    """(imported module, imported names) of every ``import``/``from`` of a module, also inside functions."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield target, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []


def _stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(root)"


def _edges():
    for module, path in _modules():
        for target, names in _imports(module, path):
            if target.startswith("adjointgen"):
                yield module, target, names


def test_every_stage_imports_only_the_stages_before_it():
    stages = {_stage(m) for m, _ in _modules()}
    assert stages <= set(ALLOWED), f"a new stage needs its row in ALLOWED: {sorted(stages - set(ALLOWED))}"
    bad = sorted({f"{m} imports {t}" for m, t, _ in _edges()
                  if _stage(m) != _stage(t) and _stage(t) not in ALLOWED[_stage(m)]})
    assert not bad, "\n".join(bad)


def test_the_stage_graph_has_no_cycle():
    graph = {s: set() for s in ALLOWED}
    for m, t, _ in _edges():
        if _stage(m) != _stage(t):
            graph[_stage(m)].add(_stage(t))
    state: dict[str, int] = {}

    def visit(s, path):
        if state.get(s) == 1:
            raise AssertionError("import cycle: " + " -> ".join([*path, s]))
        if state.get(s) == 2:
            return
        state[s] = 1
        for t in sorted(graph[s]):
            visit(t, [*path, s])
        state[s] = 2

    for s in sorted(graph):
        visit(s, [])


def test_no_stage_reaches_into_another_stages_private_names():
    bad = sorted(f"{m} imports {t}.{n}" for m, t, names in _edges() for n in names
                 if _stage(m) != _stage(t) and n.startswith("_") and not n.startswith("__"))
    assert not bad, "\n".join(bad)


def test_the_runtime_never_renders_or_compiles_templates():
    for module, path in _modules():
        if _stage(module) in ("runtime", "generated", "composite"):
            targets = {t for t, _ in _imports(module, path)}
            assert "jinja2" not in targets and "sympy" not in targets, f"{module} imports {targets & {'jinja2', 'sympy'}}"


# ---------------------------------------------------------------------------------- frozen spec
def _fingerprint(spec) -> str:
    """Everything a spec holds, as text (rules, steps, structure, mappings)."""
    parts = []
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if f.name == "steps":
            value = [(s.index, s.kind, s.label, str(s.equation), s.line, s.note, s.check and s.check.kind) for s in value]
        elif f.name == "structure":
            value = sorted((k, sorted(v) if isinstance(v, (set, frozenset)) else repr(dict(v)) if hasattr(v, "items") else v)
                           for k, v in vars(value).items())
        elif hasattr(value, "items"):
            value = sorted((k, repr(v)) for k, v in value.items())
        parts.append(f"{f.name}={value!r}")
    return "\n".join(parts)


@pytest.mark.parametrize("name", ["eigh", "svds", "qr"])
def test_a_finished_derivation_is_a_frozen_spec_that_no_stage_writes(name):
    from adjointgen.audit import audit
    from adjointgen.calculus.spec import OperationSpec
    from adjointgen.codegen.lower import lower_derivation

    spec = gen.load_derivation(ROOT, name)
    assert isinstance(spec, OperationSpec)
    before = _fingerprint(spec)
    report = audit(spec, symbolic=False)
    assert report.passed
    lower_derivation(spec, str(ROOT))
    assert _fingerprint(spec) == before  # neither the audit nor the lowering changed it

    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.error = "x"
    with pytest.raises(TypeError):
        spec.pairwise["X"] = None
    with pytest.raises(TypeError):
        spec.api_names["A"] = "B"
    with pytest.raises(AttributeError):
        spec.structure.symmetric.add("Z")
    with pytest.raises(AttributeError):
        spec.structure.complex = True
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.steps[0].note = "edited"
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.jvp.rewritten = {}


#: the derivations the default suite loads for the whole-catalogue checks below (one of each kind of
#: step and replay); the slow step (``-m slow``) loads every one
REPRESENTATIVE = {"inv", "eigh", "eigsh", "qr", "funm", "matrix_exp", "slogdet"}


def _catalogue(names):
    return [pytest.param(n, marks=() if n in REPRESENTATIVE else pytest.mark.slow) for n in names]


@pytest.mark.parametrize("name", _catalogue(gen.derivation_names(ROOT)))
def test_a_steps_checks_are_data_the_audit_interprets(name):
    """Every step's numeric check and symbolic replay is a record (kind and expressions) that
    ``audit/checks.py`` and ``audit/replays.py`` interpret, never code carried by the step; the
    spec pickles, closures would not."""
    import pickle

    from adjointgen.audit import checks, replays
    from adjointgen.calculus.derivation import Check, Replay

    spec = gen.load_derivation(ROOT, name)
    for step in spec.steps:
        assert step.check is None or (isinstance(step.check, Check) and step.check.kind in checks._KINDS)
        assert step.replay is None or (isinstance(step.replay, Replay) and step.replay.kind in replays._KINDS)
    pickle.dumps(spec.steps)
    builder = [ROOT / "src/adjointgen/calculus/derivation.py", *sorted((ROOT / "src/adjointgen/calculus/steps").glob("*.py"))]
    for path in builder:
        source = path.read_text()
        assert "def symbolic" not in source and "def check" not in source, path.name


#: the most lines a source file of the package may have (the generated modules excepted)
LINE_BUDGET = 800


def test_the_builder_is_split_by_step_family():
    """``Derivation`` is the shared state and the recording; each family of steps is a module of
    ``calculus/steps`` (declarations, identities, projections, solves, rules), none over the budget."""
    from adjointgen.calculus import derivation, steps  # noqa: F401

    families = [c.__module__ for c in derivation.Derivation.__mro__[1:-1]]
    assert families == [f"adjointgen.calculus.steps.{m}" for m in ("declarations", "identities", "projections", "solves",
                                                                   "rules")]
    for path in [ROOT / "src/adjointgen/calculus/derivation.py", *(ROOT / "src/adjointgen/calculus/steps").glob("*.py")]:
        assert len(path.read_text().splitlines()) <= LINE_BUDGET, path.name


def test_source_files_keep_to_the_line_budget():
    """No source file over the budget: a module that grows past it is split by what it does (the
    builder by step family, the engine's nodes by node family, the lowering and its value DAG, the
    array runtime and its host Schur solvers)."""
    lengths = {p.relative_to(ROOT / "src" / "adjointgen").as_posix(): len(p.read_text().splitlines())
               for p in (ROOT / "src" / "adjointgen").rglob("*.py")}
    assert len(lengths) > 80
    over = {name: n for name, n in lengths.items() if n > LINE_BUDGET}
    assert not over, f"over {LINE_BUDGET} lines (split the module by what it does): {over}"


def test_the_spec_is_typed_with_the_records():
    """Every field of the frozen spec has a type: the records of ``calculus/records.py``, not
    ``object`` (the builder and its records are separate modules)."""
    import typing

    from adjointgen.calculus import records, spec

    hints = typing.get_type_hints(spec.OperationSpec, {**vars(records), **vars(spec)})
    untyped = sorted(name for name, hint in hints.items() if hint is object or "object" in str(hint))
    assert not untyped, untyped
    assert hints["jvp"] == typing.Optional[records.Rule] and hints["steps"] == tuple[records.Step, ...]


def test_the_audit_and_the_lowering_read_no_undeclared_field():
    """Consumers read the spec's declared fields: no ``getattr(d, ...)`` with a default, no
    ``d.__dict__``, no attribute set on a derivation from outside the builder."""
    for rel in ("src/adjointgen/audit", "src/adjointgen/codegen"):
        for path in (ROOT / rel).glob("*.py"):
            text = path.read_text()
            assert not re.search(r"getattr\(d, ", text), path
            assert not re.search(r"\bd\.__dict__", text), path
            assert not re.search(r"^\s*d\.[a-z_]+ = ", text, re.M), path


# ---------------------------------------------------------------------------------- provenance
def test_generated_rules_name_the_derivation_step_they_come_from():
    found = 0
    for path in sorted((ROOT / "generated" / "torch").glob("*.py")):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        lines = path.read_text().splitlines()
        rules = [f for f in tree.body if isinstance(f, ast.FunctionDef) and re.search(r"_(jvp|vjp|gauge)(_|$)", f.name)
                 and not f.name.endswith("_vjp_factors")]
        assert rules, path
        for f in rules:
            body = "\n".join(lines[f.lineno - 1:f.end_lineno])
            refs = re.findall(r"# (\w+): derived at (derivations/\w+\.py):(\d+) \(step (\d+): [^)]*\)"
                              r"(?: in (derivations/_\w+\.py):(\d+))?", body)
            assert refs, f"{path.name}:{f.lineno} {f.name} names no derivation step"
            for _, file, line, step, helper, helper_line in refs:
                for file_, line_ in ((file, line), (helper, helper_line)) if helper else ((file, line),):
                    source = (ROOT / file_).read_text().splitlines()
                    assert 1 <= int(line_) <= len(source), (path.name, f.name, file_, line_)
                # the line names the step's call: d.<step>(...) or a helper given d
                called = (ROOT / (helper or file)).read_text().splitlines()[int(helper_line or line) - 1]
                assert re.search(r"\bd\.\w+\(|\(d\b", called), (path.name, f.name, called)
                found += 1
    assert found > 50


def test_a_source_comment_points_at_the_step_the_audit_reports():
    from adjointgen.audit import audit

    spec = gen.load_derivation(ROOT, "inv")
    report = audit(spec, symbolic=False)
    source = spec.jvp.sources["dX"]
    step = next(s for s in report.steps if s.index == source.step)
    assert (step.line, step.label) == (source.line, source.label)
    assert source.comment(str(ROOT)).startswith(f"derivations/inv.py:{source.line} (step {source.step}: ")


# ---------------------------------------------------------------------------------- backends
def test_no_code_branches_on_a_backend_or_a_gauge_name():
    """A backend is one ``Backend`` row (template, printer, runtime helpers, package file,
    kernels, verifier); a gauge's checks follow from its structure, not its name."""
    backend_names = "|".join(b.name for b in gen.BACKENDS)
    pattern = re.compile(rf"""(==|!=|\bin)\s*\(?\s*["']({backend_names})["']|["']({backend_names})["']\s*(==|!=|\bin\b)""")
    for path in sorted((ROOT / "src" / "adjointgen" / "codegen").rglob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            assert not pattern.search(line), f"{path.name}:{i}: {line.strip()}"
    for path in sorted(TEMPLATES.rglob("*.j2")):
        text = path.read_text()
        assert not re.search(r"gauge\s*==", text), path
    lower = (ROOT / "src" / "adjointgen" / "codegen" / "lower.py").read_text()
    assert not re.search(r"""==\s*["']phase["']""", lower)


def test_a_backend_is_one_package():
    """Each backend is a package of ``codegen/backends``: its row carries its printer (the syntax of
    every IR operation, the imports of every runtime name, where its forwards come from) and its
    verifier and names its templates (``templates/<backend>/``), and its ``backend.toml`` declares
    its output layout, which the project stage reads as data.  No other module holds a backend's
    table: ``printers.py`` holds the printers' machinery, ``project.py`` and the generator find the
    packages."""
    import importlib
    import tomllib

    from adjointgen import project
    from adjointgen.codegen import printers
    from adjointgen.codegen.backends import BACKENDS, PRINTERS

    packages = ROOT / "src" / "adjointgen" / "codegen" / "backends"
    assert [b.name for b in BACKENDS] == list(project.backend_declarations()) == list(project.BACKENDS)
    for backend in BACKENDS:
        module = importlib.import_module(f"adjointgen.codegen.backends.{backend.name}")
        assert module.BACKEND is backend
        assert (packages / backend.name / "__init__.py").is_file(), backend.name
        prefix, _, rest = backend.template.partition("/")
        assert prefix == backend.name and (TEMPLATES / backend.template).is_file(), backend.template
        assert backend.output == tomllib.loads((packages / backend.name / "backend.toml").read_text())["output"]
        assert backend.printer is None or (backend.printer.imports and backend.printer.forwards), backend.name
        assert backend.printer is None or callable(backend.verifier), backend.name
    assert not [n for n, v in vars(printers).items() if isinstance(v, printers.ArrayPrinter)]
    assert set(PRINTERS) == {b.printer.name for b in BACKENDS if b.printer}
    # no backend's name is a key or a literal of the project stage or the generator's modules
    for path in [ROOT / "src/adjointgen/project.py", *(ROOT / "src/adjointgen/codegen").glob("*.py")]:
        text = path.read_text()
        for backend in BACKENDS:
            assert not re.search(rf"""["']{backend.name}(/[^"']*)?["']\s*:""", text), (path.name, backend.name)
    # the template folders are the backends' (and the shared ones)
    assert {p.name for p in TEMPLATES.iterdir() if p.is_dir() and p.name != "__pycache__"} == \
        {b.name for b in BACKENDS} | {"common", "package"}


def test_generated_code_imports_only_its_backends_runtime_helpers():
    for backend in gen.BACKENDS:
        if not backend.printer:
            continue
        folder = ROOT / "generated" / backend.output.split("/")[0]
        for path in sorted(folder.glob("*.py")):
            for target, names in _imports(f"adjointgen.generated.{folder.name}.{path.stem}", path):
                if target.startswith("adjointgen") and not target.startswith("adjointgen.generated"):
                    # ``from adjointgen.runtime import divided``: the module is adjointgen.runtime.divided
                    modules = [f"{target}.{n}" for n in names] if names else [target]
                    for module in modules:
                        assert module.startswith(backend.runtime), (backend.name, path.name, module)


#: the most ``{%`` tags a template may hold: templates lay code out; what to emit is decided by the
#: generator (the IR's properties, the printer's statements and imports) and the runtime
TAG_BUDGET = 40


def test_templates_keep_to_the_tag_budget():
    counts = {p.relative_to(ROOT).as_posix(): p.read_text().count("{%") for p in TEMPLATES.rglob("*.j2")}
    over = {name: n for name, n in counts.items() if n > TAG_BUDGET}
    assert not over, f"templates over {TAG_BUDGET} tags (move the decision into the IR or the runtime): {over}"
    assert len(counts) > 10


def test_templates_write_no_imports_of_the_runtime():
    """A generated module's imports are computed from the names its code reads
    (adjointgen.codegen.imports): no template lists runtime helpers."""
    for path in sorted(TEMPLATES.rglob("*.py.j2")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            assert not re.match(r"\s*(from adjointgen|import adjointgen|import functools|import jax|from .* as _forward)",
                                line), \
                f"{path.relative_to(ROOT)}:{i}: {line.strip()}"


@pytest.mark.parametrize("backend", [b for b in gen.BACKENDS if b.printer], ids=lambda b: b.name)
def test_generated_modules_import_exactly_what_they_read(backend):
    from adjointgen.codegen.imports import free_names

    folder = ROOT / "generated" / backend.output.split("/")[0]
    paths = sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")
    assert paths
    for path in paths:
        tree = ast.parse(path.read_text())
        imported = {a.asname or a.name.split(".")[0] for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
                    for a in node.names}
        read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        read |= {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
        assert imported <= read, (path.name, sorted(imported - read))
        assert not {n for n in free_names(path.read_text()) if n.startswith("_") and not n.startswith("__")}, path.name


def test_the_imports_are_computed_from_the_emitted_code():
    from adjointgen.codegen.imports import MARKER, UnknownName, resolve

    table = {"_jnp": "jax.numpy", "_linalg": "adjointgen.runtime:linalg", "_checks": "adjointgen.runtime:checks"}
    text = f"import torch\n{MARKER}\n\ndef f(x):\n    _y = 1\n    return _linalg.adjugate(x) + _jnp.ones(1) + _y\n"
    out = resolve(text, table)
    assert out.splitlines()[1:4] == ["import jax.numpy as _jnp", "", "from adjointgen.runtime import linalg as _linalg"]
    assert "_checks" not in out and MARKER not in out
    with pytest.raises(UnknownName, match="_solvers"):
        resolve(text.replace("_linalg.adjugate", "_solvers.shifted"), table)
    assert resolve("x = 1\n", table) == "x = 1\n"


def test_a_file_names_the_templates_it_includes_among_its_sources():
    text = (ROOT / "generated" / "torch" / "funm.py").read_text()
    assert "templates/common/spectral.py.j2" in text.splitlines()[1]  # funm includes it
    assert "common/spectral" not in (ROOT / "generated" / "torch" / "inv.py").read_text().splitlines()[1]


def test_templates_hold_layout_and_formulas_not_numerical_guards():
    """The guards of pairwise quotients (diagonal, clusters, broadening, fused gaps) and the choice
    between the fused and the masked product live once per backend in its runtime helpers
    (adjointgen.runtime.pairwise, adjointgen.runtime.xp)."""
    guards = re.compile(r"torch\.where|torch\.inf|xp\.where|\.fill_\(|\.eye\(|\.unsqueeze\(|swapaxes|pairs_apart|"
                        r"divided_by_gaps")
    for path in sorted(TEMPLATES.rglob("*.py.j2")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            assert not guards.search(line), f"{path.relative_to(ROOT)}:{i}: {line.strip()}"


def test_the_autograd_functions_dispatch_in_the_runtime_not_in_the_template():
    """Complex or real rules, checked or not, completion at clusters and which check a residual
    goes to: decided once, in adjointgen.runtime.dispatch, from the rules the template lays out as
    data; the generated backward and jvp hand it their names."""
    template = "".join(p.read_text() for p in sorted((TEMPLATES / "torch").rglob("*.j2")))
    for decision in ("is_complex()", "_gauge.", "_degeneracy.check(", "_degeneracy.complete(", "_completion.complete(", "has_clusters("):
        assert decision not in template, decision
    import adjointgen.generated.torch.eigh as eigh
    import adjointgen.generated.torch.solve as solve
    from adjointgen.runtime import dispatch

    assert isinstance(eigh.RULES, dispatch.Rules) and eigh.RULES.vjp.fn is eigh.eigh_vjp
    assert [r.vector for r in eigh.RULES.residuals] == ["w"] and eigh.RULES.residuals[0].completes == ("V",)
    assert solve.RULES.vjp_checked is None and solve.RULES.outputs == ("gA", "gB")


# ---------------------------------------------------------------------------------- nodes
def test_the_engines_nodes_carry_their_differential_evaluation_and_lowering():
    """A node of the engine's own is one section of calculus/nodes/ (the module of its family): the core's differential, evaluation
    and lowering dispatch on SymPy's nodes only, and call the node's rule for the engine's."""
    import inspect

    from adjointgen.calculus import algebra, evaluate, nodes
    from adjointgen.codegen import dag

    own = sorted(name for name, cls in vars(nodes).items()
                 if isinstance(cls, type) and issubclass(cls, nodes.EngineNode) and cls is not nodes.EngineNode)
    assert {"DiagPart", "Sym", "Skew", "Trace", "ShiftedSolve", "DiagFunction", "LogAbsDet"} <= set(own)
    families = {getattr(nodes, name).__module__.rpartition(".")[2] for name in own if not name.startswith("_")}
    assert families == {"projections", "solves", "functions", "scalars"}, families
    cores = {"differential": inspect.getsource(algebra.differential), "evaluate": inspect.getsource(evaluate.evaluate),
             "lower": inspect.getsource(dag.DagBuilder.lower), "expand": inspect.getsource(algebra.expand),
             "transpose": inspect.getsource(algebra.transpose_atom),
             "adjoint": inspect.getsource(algebra._transpose_atom_linear)}
    for where, source in cores.items():
        for name in own + ["LINEAR_NODES"]:
            # the dispatch on the expression itself (a product's rule may still look at its factors)
            assert not re.search(rf"isinstance\((e|expr|atom), [^)]*\b{name}\b", source), f"{where} branches on {name}"
    # and the rules are there, on the classes
    for name in ("DiagPart", "Sym", "Skew", "LowerHalf", "StrictlyLower", "Trace", "ScalarIdentity"):
        cls = getattr(nodes, name)
        assert {"differential_rule", "evaluate_rule", "lower_rule", "expand_rule", "transpose_rule",
                "adjoint_rule"} <= set(dir(cls)), name
    for name in ("ShiftedSolve", "DiagFunction", "LogAbsDet", "SignDet"):
        assert "expand_rule" in vars(getattr(nodes, name)), name


#: strings of the runtime that name one of its own routes, not a catalogue operation: the pinv
#: decision's methods (``lu``: LU with partial pivoting), which ARCHITECTURE.md leaves hand-written
ROUTE_NAMES = {("pinv/common.py", "lu")}


def test_the_runtime_keys_nothing_by_an_operation_name():
    """No branch, table or lookup in ``src/adjointgen/runtime`` is keyed by a catalogue operation's
    name (a comparison with it, a dictionary key, a subscript): what differs between operations is
    declared in their derivations and reaches the runtime as data from the generated caller."""
    operations = {p.stem for p in (ROOT / "derivations").glob("*.py") if not p.stem.startswith("_")}
    assert {"eigh", "svd", "lu", "inv"} <= operations
    runtime = ROOT / "src" / "adjointgen" / "runtime"
    found = []
    for path in sorted(runtime.rglob("*.py")):
        where = str(path.relative_to(runtime))
        for node in ast.walk(ast.parse(path.read_text())):
            keys = []
            if isinstance(node, ast.Compare):
                for side in (node.left, *node.comparators):
                    items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                    keys += [e.value for e in items if isinstance(e, ast.Constant)]
            elif isinstance(node, ast.Dict):
                keys += [k.value for k in node.keys if isinstance(k, ast.Constant)]
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                keys.append(node.slice.value)
            found += [f"{where}:{node.lineno}: {k!r}" for k in keys
                      if isinstance(k, str) and k in operations and (where, k) not in ROUTE_NAMES]
    assert not found, found

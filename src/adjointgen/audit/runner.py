"""Run a derivation's recorded steps on random valid instances.

Numeric audit: every step's equation is evaluated (float64) on several instances drawn by the
derivation's sampler; the residual ``‖lhs − rhs‖ / Σ‖term‖`` of each step is recorded and must stay
below the tolerance.  Output tangents in the sampler come from Richardson-extrapolated central
differences of a reference forward computation, so the JVP is checked against something the engine
did not produce.  The VJP steps are checked by the dot-product identity.

Exact audit: every derived step is replayed (:mod:`adjointgen.audit.replays`) in exact rational
arithmetic at random rational points of the declared structure (:mod:`adjointgen.audit.exact`): a
polynomial identity test whose verdict states its own bound on the chance that a wrong step passes
(Schwartz–Zippel).  A step that substitutes an equation is replayed as a substitution (the old and
new residuals agree wherever the equation holds); a gauge step by writing the identity's
derivative along the gauge as a multiple of the identity's residual.  A value without a rational
form (``log|det A|``) sends the step to a symbolic replay on explicit small SymPy matrices.  What a
derivation assumes -- its identities, definitions, forward and gauge choices -- is a premise: its
numeric check compares it with the instances, there is nothing to derive it from.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import sympy as sp
from sympy.matrices.expressions import MatrixSymbol

from ..calculus.algebra import DerivationError
from ..calculus.evaluate import NotExplicit, evaluate
from ..calculus.spec import OperationSpec, as_spec
from . import checks, replays


class AuditError(Exception):
    """A derivation step failed its audit."""

    def __init__(self, report: "AuditReport", step: "StepResult"):
        self.report = report
        self.step = step
        where = f"{report.path}" + (f":{step.line}" if step.line else "")
        super().__init__(
            f"audit of '{report.name}' failed at step {step.index} ({step.kind}) '{step.label}' "
            f"in {where}: {step.failure}"
        )


@dataclass(frozen=True)
class StepResult:
    index: int
    kind: str
    label: str
    line: int | None
    residual: float | None  # max over instances
    tolerance: float
    symbolic: str  # "verified ...", "premise: ...", "FAILED: ...", "NOT verified: ..." (see verdict_kind)
    note: str

    @property
    def passed(self) -> bool:
        ok_num = self.residual is None or self.residual <= self.tolerance
        return ok_num and not self.symbolic.startswith("FAILED")

    @property
    def failure(self) -> str:
        if self.residual is not None and not self.residual <= self.tolerance:
            if "(evaluation error: " in self.note:  # it could not be evaluated: say why, not "inf"
                return "the step cannot be evaluated on the audit's instances: " + \
                    self.note.split("(evaluation error: ", 1)[1].removesuffix(")")
            if self.kind == "identity":
                return (f"numeric residual {self.residual:.3e} > tolerance {self.tolerance:.1e}: the sampler's "
                        "instances do not satisfy this identity (check the identity, and the reference values "
                        "the sampler computes)")
            return f"numeric residual {self.residual:.3e} > tolerance {self.tolerance:.1e}" + (
                f": {self.note}" if self.kind == "forward" and " forward " in self.note else "")
        return self.symbolic


@dataclass(frozen=True)
class AuditReport:
    name: str
    path: str
    title: str
    instances: int
    steps: tuple[StepResult, ...]
    jvp: dict = field(default_factory=dict)
    vjp: dict = field(default_factory=dict)
    pairwise: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(s.passed for s in self.steps)

    def first_failure(self) -> StepResult | None:
        return next((s for s in self.steps if not s.passed), None)

    def counts(self) -> dict:
        """How many steps are ``exact``, ``symbolic``, ``premise``, ``failed``, ``numeric only``."""
        out = {k: 0 for k in VERDICT_KINDS}
        for s in self.steps:
            out[verdict_kind(s.symbolic)] += 1
        return out

    def to_text(self, steps: bool = True) -> str:
        lines = [f"{self.name}: {self.title}  ({self.path})"]
        for s in self.steps if steps else ():
            res = "      -     " if s.residual is None else f"{s.residual:10.2e}"
            status = "pass" if s.passed else "FAIL"
            lines.append(f"  {s.index:2d}. [{status}] {res}  {SHORT[verdict_kind(s.symbolic)]:8s} {s.kind:17s} {s.label}")
        lines.append(f"  {'PASSED' if self.passed else 'FAILED'}: {self.summary()}")
        unverified = [s for s in self.steps if verdict_kind(s.symbolic) == "numeric only"]
        if unverified:
            lines.append(f"  NOT verified (numeric only): steps {', '.join(str(s.index) for s in unverified)}: "
                         f"{unverified[0].symbolic}")
        return "\n".join(lines)

    def summary(self) -> str:
        c = self.counts()
        parts = [f"{len(self.steps)} steps", f"{c['exact']} verified exactly"]
        if c["symbolic"]:
            parts.append(f"{c['symbolic']} symbolically")
        parts.append(f"{c['premise']} premises")
        if c["numeric only"]:
            parts.append(f"{c['numeric only']} NOT verified (numeric only)")
        failed = sum(not s.passed for s in self.steps)
        if failed:
            parts.append(f"{failed} failed")
        return ", ".join(parts) + f"; {self.instances} numeric instances each"


#: the kinds of verdict a step's ``symbolic`` field holds
VERDICT_KINDS = ("exact", "symbolic", "premise", "numeric only", "failed", "skipped")
SHORT = {"exact": "exact", "symbolic": "sym ok", "premise": "premise", "numeric only": "NUMERIC",
         "failed": "FAIL", "skipped": "--"}


def verdict_kind(verdict: str) -> str:
    """``exact``, ``symbolic``, ``premise``, ``numeric only`` (not verified), ``failed`` or ``skipped``."""
    if verdict.startswith("verified exactly"):
        return "exact"
    if verdict.startswith("verified"):
        return "symbolic"
    if verdict.startswith("premise"):
        return "premise"
    if verdict.startswith("FAILED"):
        return "failed"
    if verdict == "skipped":
        return "skipped"
    return "numeric only"


def exact_verdict(degree: int, points: int, replay) -> str:
    """The text of an exact verdict: the method, and what it rests on."""
    from .exact import SET_SIZE

    bound = max(degree, 1) / SET_SIZE
    text = (f"verified exactly: rational arithmetic at {points} random point{'s' if points > 1 else ''} "
            f"(a wrong step passes with probability <= {bound:.0e})")
    if replay.kind == "substitute" and replay.args[-1]:
        text += f", given {replay.args[-1]}"
    elif replay.kind == "constrained":
        text += f", for every {replay.args[0]} with {replay.args[1]}^T{' ' + str(replay.args[2]) if replay.args[2] is not None else ''} {replay.args[0]} = 0"
    elif replay.kind == "invariant":
        text += ", as a multiple of the identity's residual"
    elif replay.kind == "define":
        text += f", with {replay.args[0]} set to its definition"
    return text


class _Context:
    def __init__(self, env, dims, structure, cotangents):
        self.env = env
        self.dims = dims
        self.structure = structure
        self.cotangents = cotangents


def _random_structured(rng, shape, name, structure, complex_=False):
    """A random matrix with the declared structure; complex (Hermitian, anti-Hermitian) for the
    complex instances of a complex derivation, where diagonal symbols stay real (``S``, ``D``)
    and a skew diagonal symbol is imaginary (a phase)."""
    x = rng.standard_normal(shape)
    if complex_:
        x = x + 1j * rng.standard_normal(shape)
    if name in structure.clustered:  # supported on a cluster pattern: the pair (0, 1)
        mask = np.zeros(shape)
        if min(shape) > 1:
            mask[0, 1] = mask[1, 0] = 1
        x = (x - x.conj().T) / 2 if name in structure.skew else x
        return x * mask
    if name in structure.diagonal and name in structure.skew:
        return np.diag(1j * np.diag(x).imag) if complex_ else np.zeros(shape)
    if name in structure.complex_diagonal:
        return np.diag(np.diag(x))
    if name in structure.diagonal:
        return np.diag(np.diag(x).real)
    if name in structure.symmetric:
        return (x + x.conj().T) / 2
    if name in structure.skew:
        return (x - x.conj().T) / 2
    return x


#: spec -> {seed: instances}; the spec itself is immutable, so the samples are kept beside it
_INSTANCES: "weakref.WeakKeyDictionary[OperationSpec, dict]" = weakref.WeakKeyDictionary()


def instances(d: OperationSpec, seed: int = 0) -> list:
    """The audit's numeric instances of ``d`` (sampled once per spec and seed)."""
    d = as_spec(d)
    cache = _INSTANCES.setdefault(d, {})
    if seed not in cache:
        cache[seed] = list(_instances(d, seed))
    return cache[seed]


def _instances(d: OperationSpec, seed: int):
    rng = np.random.default_rng(seed)
    for dims_by_name in d.audit_dims:
        missing_dims = [s.name for s in d.dims if s.name not in dims_by_name]
        where = f"{d.path}:{d.instances_line}" if d.instances_line else d.path
        if missing_dims:
            raise DerivationError(f"{where}: instances() entry {dims_by_name} gives no value for the "
                                  f"dimension(s) {', '.join(missing_dims)}")
        dims = {s: dims_by_name[s.name] for s in d.dims}
        try:
            sample = d.sampler(rng, **dims_by_name)
        except Exception as exc:
            raise DerivationError(f"{where}: the sampler {_name(d.sampler)}(rng, **{dims_by_name}) raised "
                                  f"{type(exc).__name__}: {exc}") from exc
        env = dict(_checked_sample(d, sample, dims, dims_by_name, where))
        for sym, definition in d.introduced:
            env[sym.name] = evaluate(definition, env, dims)
        complex_ = any(np.iscomplexobj(v) for v in env.values())
        cot = {}
        for out in d.outputs:
            shape = tuple(int(x.xreplace(dims)) for x in out.shape)
            cot["g" + out.name] = _random_structured(rng, shape, "g" + out.name, d.structure, complex_)
        env.update(cot)
        for T in d.gauge_parameters:
            shape = tuple(int(x.xreplace(dims)) for x in T.shape)
            env[T.name] = _random_structured(rng, shape, T.name, d.structure, complex_)
        for name, block in d.value_blocks.items():  # a block cotangent (its own stream)
            import zlib

            D = next(o for o in d.outputs if o.name == name)
            shape = tuple(int(x.xreplace(dims)) for x in D.shape)
            brng = np.random.default_rng(zlib.crc32(block.cotangent.encode()) + len(cot))
            M = brng.standard_normal(shape) + (1j * brng.standard_normal(shape) if complex_ else 0)
            env[block.cotangent] = (M + M.conj().T) / 2
        ctx = _Context(env, dims, d.structure, cot)
        ctx.definitions = {sym.name: definition for sym, definition in d.introduced}
        yield ctx


def _name(f) -> str:
    return getattr(f, "__name__", repr(f))


def _checked_sample(d: OperationSpec, sample, dims, dims_by_name, where) -> dict:
    """The sampler's result, checked against its contract (see :meth:`Derivation.instances`)."""
    call = f"the sampler {_name(d.sampler)}(rng, **{dims_by_name})"
    if not isinstance(sample, dict):
        raise DerivationError(f"{where}: {call} must return a dict of arrays keyed by symbol name, "
                              f"got {type(sample).__name__}")
    ruled = {o.name for o in d.rule_outputs}
    required = {}
    for s in d.inputs:
        required[s.name] = (s, "input")
        required["d" + s.name] = (s, "input tangent (a random direction)")
    for s in d.outputs:
        required[s.name] = (s, "output")
        if s.name in ruled:
            required["d" + s.name] = (s, "output tangent (finite differences along the input tangents)")
    for fname in d.functions:
        required[fname] = (None, "the concrete scalar function of this instance (a sympy.Lambda)")
    missing = [k for k in required if k not in sample]
    if missing:
        described = "; ".join(f"{k} ({required[k][1]})" for k in missing)
        raise DerivationError(
            f"{where}: {call} returned no {described}. A sampler returns every input and output, a "
            "random tangent d<input> per input and the output tangents d<output> measured by finite "
            "differences (adjointgen.audit.fd_tangents); it returned: " + ", ".join(sorted(sample)))
    functions = {}
    for fname in d.functions:
        fn = sample[fname]
        if not isinstance(fn, sp.Lambda):
            raise DerivationError(f"{where}: {call}: {fname} must be a sympy.Lambda of one variable, got {fn!r}")
        functions[fname] = fn
    sample = {k: v for k, v in sample.items() if k not in d.functions}
    if functions:
        sample["__functions__"] = functions
    for key, (sym, role) in required.items():
        if sym is None:
            continue
        value = sample[key]
        if not isinstance(value, np.ndarray):
            raise DerivationError(f"{where}: {call}: {key} ({role}) must be a numpy array, got {type(value).__name__}")
        shape = tuple(int(sp.sympify(x).xreplace(dims)) for x in sym.shape)
        if value.shape != shape:
            raise DerivationError(f"{where}: {call}: {key} ({role}) has shape {value.shape}, the derivation "
                                  f"declares {sym.name} as {sym.shape[0]}×{sym.shape[1]} = {shape}")
        if not np.all(np.isfinite(value)):
            raise DerivationError(f"{where}: {call}: {key} ({role}) has NaN or Inf entries")
    return sample


def _symbolic_env(d: OperationSpec, size: int = 3):
    """Explicit matrices with symbolic entries; a derivation may set ``symbolic_sizes`` (by
    dimension name) to keep long products of generic matrices affordable."""
    sizes = d.symbolic_sizes
    dims = {s: min(size, sizes.get(s.name, size)) for s in d.dims}
    env = {"__dims__": dims}
    names = set()
    for s in d.inputs + d.outputs:
        names |= {s.name, "d" + s.name, "g" + s.name}
    names |= {s.name for s, _ in d.introduced}
    extra = list(d.gauge_parameters)
    names |= {s.name for s in extra}

    def shape_of(name):
        for s in (*d.inputs, *d.outputs, *(s for s, _ in d.introduced), *extra):
            if name in (s.name, "d" + s.name, "g" + s.name):
                return tuple(int(x.xreplace(dims)) for x in s.shape)
        raise KeyError(name)

    st = d.structure

    def z(name, i, j):
        """Entry symbol: real, or complex in a complex derivation, where ``z`` and ``conj(z)`` are
        independent atoms of the polynomials (a polynomial in them vanishes for every complex
        value only if it is zero), which keeps expansions as small as in the real case."""
        return sp.Symbol(f"{name}_{i}{j}", complex=True) if st.complex else sp.Symbol(f"{name}_{i}{j}", real=True)

    for name in sorted(names):
        r, c = shape_of(name)
        tri = st.triangle(name)
        if tri is not None:
            side, diagonal = tri

            def entry(i, j, name=name, side=side, diagonal=diagonal):
                if i == j:
                    real = name in st.real_diagonal
                    value = sp.Symbol(f"{name}_{i}{j}", real=True) if real else z(name, i, j)
                    return {"unit": sp.Integer(1), "zero": sp.Integer(0)}.get(diagonal, value)
                keep = i > j if side == "lower" else i < j
                return z(name, i, j) if keep else sp.Integer(0)

            env[name] = sp.Matrix(r, c, entry)
            continue
        if name in st.diagonal and name in st.skew:
            m = sp.diag(*[sp.I * sp.Symbol(f"{name}_{i}_im", real=True) if st.complex else 0 for i in range(r)])
        elif name in st.complex_diagonal:
            m = sp.diag(*[z(name, i, i) for i in range(r)])
        elif name in st.diagonal:
            m = sp.diag(*[sp.Symbol(f"{name}_{i}", real=True) for i in range(r)])
        elif name in st.symmetric:
            m = sp.Matrix(r, c, lambda i, j: sp.Symbol(f"{name}_{i}{i}", real=True) if i == j
                          else (z(name, i, j) if i < j else sp.conjugate(z(name, j, i))))
        elif name in st.skew:
            m = sp.Matrix(r, c, lambda i, j: (sp.I * sp.Symbol(f"{name}_{i}{i}_im", real=True) if st.complex else 0)
                          if i == j else (z(name, i, j) if i < j else -sp.conjugate(z(name, j, i))))
        else:
            m = sp.Matrix(r, c, lambda i, j: z(name, i, j))
        env[name] = m
    return env


#: steps whose symbolic check holds for any pairwise matrix of the same (anti)symmetry: they are
#: checked with its entries as free symbols (polynomial, so cheap to simplify)
FREE_PAIRWISE_STEPS = {"rewrite", "transpose", "project", "lowrank", "same", "specialize", "left_multiply",
                       "right_multiply"}


def _is_zero(x) -> bool:
    x = sp.expand(x)
    if x == 0:
        return True
    num, _ = sp.fraction(sp.together(x))
    return sp.expand(num) == 0 or sp.simplify(x) == 0


def _is_zero_matrix(m) -> bool:
    return all(_is_zero(x) for x in m)


def _has_inverse(step) -> bool:
    from sympy.matrices.expressions import Inverse

    eq = step.equation
    return eq is not None and bool(eq.lhs.atoms(Inverse) | eq.rhs.atoms(Inverse))


def _reusable_verdict(verdict) -> bool:
    return isinstance(verdict, str) and verdict_kind(verdict) in ("exact", "symbolic", "premise")


class _SymbolicTimeout(BaseException):  # not an Exception: SymPy's own handlers must not swallow it
    pass


def _timeout_verdict(seconds: float) -> str:
    return f"NOT verified: the symbolic replay timed out after {seconds:g} s"


def _with_budget(seconds: float, fn):
    """``fn()``, stopped with :class:`_SymbolicTimeout` after ``seconds`` (0: no limit) by a timer
    signal -- where one is available: the main thread of a Unix process (generation workers are)."""
    import signal
    import threading

    if not seconds or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        return fn()

    def expire(signum, frame):
        raise _SymbolicTimeout()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _verify(d: OperationSpec, step, symbolic_timeout: float) -> str:
    """The verdict of one derived step: exact, else (a value without a rational form) symbolic."""
    from .exact import NotExact, verify

    free = step.kind in FREE_PAIRWISE_STEPS
    try:
        ok, degree, points = verify(step, d, free)
        if ok:
            return exact_verdict(degree, points, step.replay)
        return ("FAILED: the exact residual is not zero at a random rational point "
                f"({_replay_what(step.replay)})")
    except NotExact as exc:
        reason = str(exc)
    except Exception as exc:  # noqa: BLE001 - a replay that cannot be evaluated fails the step
        return f"FAILED: {type(exc).__name__}: {exc}"
    try:
        small = _has_inverse(step) or (step.index > 1 and d.steps[step.index - 2].equation is not None
                                       and _has_inverse(d.steps[step.index - 2]))
        env = dict(_symbolic_env(d, 2 if small else 3))
        env["__pairwise_free__"] = free
        size = "2×2" if small else "3×3"
        zero = _with_budget(symbolic_timeout, lambda: _is_zero_matrix(replays.residual(step.replay, d, env)))
        if zero:
            return f"verified symbolically on explicit {size} matrices ({reason})"
        return f"FAILED: the explicit {size} residual is not zero"
    except _SymbolicTimeout:
        return _timeout_verdict(symbolic_timeout) + f" ({reason})"
    except NotExplicit as exc:
        return f"NOT verified: {exc} ({reason})"
    except Exception as exc:  # noqa: BLE001
        return f"FAILED: {type(exc).__name__}: {exc}"


def _replay_what(replay) -> str:
    return {"substitute": "the substitution does not give the new equation",
            "invariant": "the identity's derivative along the gauge is not a multiple of its residual",
            "dot_product": "the dot-product identity <g_in, d_in> = sum <g_out, d_out> fails",
            "differentiate": "the derivative of the old equation is not the new one"}.get(
        replay.kind, "the new equation does not follow from the old one")


def audit(d: OperationSpec, *, tolerance: float = 1e-7, symbolic: bool = True, seed: int = 0,
          known: dict | None = None, symbolic_timeout: float = 0.0, progress=None) -> AuditReport:
    """Audit every step of ``d``; returns the report (``report.passed`` tells the verdict).

    ``known``: symbolic verdicts of an earlier audit of the very same sources (derivation, helpers,
    engine, SymPy version), ``{(index, kind, label): verdict}``; a step found there with a passing
    verdict is not re-evaluated symbolically (the symbolic checks are deterministic).  Numeric
    checks always run.

    ``symbolic_timeout``: seconds a step's symbolic replay may take (0: no limit); a step that takes
    longer keeps its numeric verdict and is reported "numeric only (symbolic replay timed out after
    N s)".  ``progress(result, seconds, total)``: called after each step (for a live report)."""
    import time

    d = as_spec(d)
    if d.sampler is None and d.error is None:
        raise DerivationError(f"{d.path}: derivation '{d.name}' registers no instance sampler "
                              "(call d.instances(sampler, [dims, ...]) before the first step; see "
                              "Derivation.instances for the sampler's contract)")
    contexts = instances(d, seed) if d.sampler is not None else []  # a script stopped early: its error
    results = []
    for step in d.steps:
        started = time.perf_counter()
        residual, note = None, step.note
        if step.check is not None:
            residual = 0.0
            for ctx in contexts:
                try:
                    value, scale = checks.numeric(step.check, d, ctx)
                    r = value / scale
                except Exception as exc:  # a step that cannot even be evaluated fails
                    r = float("inf")
                    if "(evaluation error: " not in note:
                        note = f"{note} (evaluation error: {exc})".strip()
                residual = max(residual, r) if np.isfinite(r) else float("inf")
            if step.kind == "forward" and not residual <= tolerance and "(evaluation error: " not in note:
                found = checks.forward_failures(d, contexts, tolerance)  # name the identity it gets wrong
                if found:
                    note = "; ".join(found)
        if step.kind == "error":
            sym = f"FAILED: {step.note}"
        elif not symbolic:
            sym = "skipped"
        elif step.replay is None:
            sym = "NOT verified: the step records no replay"
        elif step.replay.kind == replays.PREMISE:
            sym = f"premise: {step.replay.args[0]}"
        elif known is not None and _reusable_verdict(known.get((step.index, step.kind, step.label))):
            sym = known[(step.index, step.kind, step.label)]
        else:
            sym = _verify(d, step, symbolic_timeout)
        result = StepResult(step.index, step.kind, step.label, step.line, residual, tolerance, sym, note)
        results.append(result)
        if progress is not None:
            progress(result, time.perf_counter() - started, len(d.steps))
    return AuditReport(
        d.name, d.path, d.title, len(contexts), tuple(results),
        jvp={k: str(v) for k, v in (d.jvp.rewritten.items() if d.jvp else [])},
        vjp={k: str(v) for k, v in (d.vjp.rewritten.items() if d.vjp else [])},
        pairwise={k: f"{v.expr} (i != j), {v.diagonal_value} (i == j)" for k, v in d.pairwise.items()},
    )


def fd_tangents(forward: Callable, inputs: dict, directions: dict, *, h: float = 1e-3, align: Callable | None = None):
    """Output tangents of ``forward`` along ``directions`` by Richardson-extrapolated central
    differences (error O(h^4)).  ``align(base, perturbed)`` fixes gauges (signs of eigenvectors)."""

    def at(t):
        out = forward(**{k: v + t * directions.get(k, 0) for k, v in inputs.items()})
        return out if align is None else align(base, out)

    base = forward(**inputs)
    def central(hh):
        p, m = at(hh), at(-hh)
        return {k: (p[k] - m[k]) / (2 * hh) for k in base}

    d1, d2 = central(h), central(h / 2)
    return base, {k: (4 * d2[k] - d1[k]) / 3 for k in base}


def report_from_verdicts(d: OperationSpec, known: dict) -> AuditReport | None:
    """The report of an audit of ``d`` rebuilt from the verdicts recorded for the very same audit
    inputs (``{(index, kind, label): verdict}``), without running it: ``None`` unless every step
    has a recorded verdict that did not fail."""
    d = as_spec(d)
    if d.error is not None or len(known) != len(d.steps):
        return None
    results = []
    for step in d.steps:
        verdict = known.get((step.index, step.kind, step.label))
        if not isinstance(verdict, str) or verdict_kind(verdict) in ("failed", "skipped"):
            return None
        results.append(StepResult(step.index, step.kind, step.label, step.line, None, 1e-7, verdict, step.note))
    return AuditReport(
        d.name, d.path, d.title, len(d.audit_dims), tuple(results),
        jvp={k: str(v) for k, v in (d.jvp.rewritten.items() if d.jvp else [])},
        vjp={k: str(v) for k, v in (d.vjp.rewritten.items() if d.vjp else [])},
        pairwise={k: f"{v.expr} (i != j), {v.diagonal_value} (i == j)" for k, v in d.pairwise.items()},
    )

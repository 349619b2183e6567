"""Run a derivation's recorded steps on random valid instances.

Numeric audit: every step's equation is evaluated (float64) on several instances drawn by the
derivation's sampler; the residual ``‖lhs − rhs‖ / Σ‖term‖`` of each step is recorded and must stay
below the tolerance.  Output tangents in the sampler come from Richardson-extrapolated central
differences of a reference forward computation, so the JVP is checked against something the engine
did not produce.  The VJP steps are checked by the dot-product identity.

Symbolic audit: a step whose validity rests only on algebra and declared structure (differentiate,
multiply, Hadamard split, diagonal part, solve, transposition, rewrites) is replayed on explicit
3×3 SymPy matrices with symbolic entries that carry the structure (symmetric, diagonal, skew); the
difference must simplify to zero.  Steps that use an identity of the decomposition itself
(``U^T A = D U^T``) are numeric only, and the report says so.
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
    symbolic: str  # "verified", "not applicable (uses an identity)", "FAILED: ..."
    note: str

    @property
    def passed(self) -> bool:
        ok_num = self.residual is None or self.residual <= self.tolerance
        return ok_num and not self.symbolic.startswith("FAILED")

    @property
    def failure(self) -> str:
        if self.residual is not None and not self.residual <= self.tolerance:
            return f"numeric residual {self.residual:.3e} > tolerance {self.tolerance:.1e}"
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

    def to_text(self) -> str:
        lines = [f"{self.name}: {self.title}  ({self.path})"]
        for s in self.steps:
            res = "      -     " if s.residual is None else f"{s.residual:10.2e}"
            status = "pass" if s.passed else "FAIL"
            sym = ("sym ok" if s.symbolic == "verified" else "sym FAIL" if s.symbolic.startswith("FAILED")
                   else "sym time" if s.symbolic.startswith("numeric only (symbolic replay timed out") else "sym --")
            lines.append(f"  {s.index:2d}. [{status}] {res}  {sym:8s} {s.kind:17s} {s.label}")
        lines.append(f"  {'PASSED' if self.passed else 'FAILED'}: {len(self.steps)} steps, "
                     f"{self.instances} numeric instances each")
        timed = [s for s in self.steps if s.symbolic.startswith("numeric only (symbolic replay timed out")]
        if timed:
            lines.append(f"  steps {', '.join(str(s.index) for s in timed)}: {timed[0].symbolic} "
                         "(symbolic_timeout in [tool.adjointgen])")
        return "\n".join(lines)


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
        for name, block in getattr(d, "value_blocks", {}).items():  # a block cotangent (its own stream)
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
    return isinstance(verdict, str) and (verdict == "verified" or verdict.startswith("not applicable"))


class _SymbolicTimeout(BaseException):  # not an Exception: SymPy's own handlers must not swallow it
    pass


def _timeout_verdict(seconds: float) -> str:
    return f"numeric only (symbolic replay timed out after {seconds:g} s)"


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
    sym_env = _symbolic_env(d) if symbolic else None
    # explicit inverses of 3x3 symbolic matrices are slow to simplify: steps with B^-1 use 2x2
    sym_env_small = _symbolic_env(d, 2) if symbolic else None
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
                    note = f"{note} (evaluation error: {exc})".strip()
                residual = max(residual, r) if np.isfinite(r) else float("inf")
        if step.kind == "error":
            sym = f"FAILED: {step.note}"
        elif step.symbolic is None or not symbolic:
            sym = "not applicable (rests on an identity of the decomposition)" if step.symbolic is None else "skipped"
        elif known is not None and _reusable_verdict(known.get((step.index, step.kind, step.label))):
            sym = known[(step.index, step.kind, step.label)]
        else:
            try:
                small = _has_inverse(step) or (d.steps[step.index - 2].equation is not None and step.index > 1
                                               and _has_inverse(d.steps[step.index - 2]))
                env = dict(sym_env_small if small else sym_env)
                env["__pairwise_free__"] = step.kind in FREE_PAIRWISE_STEPS
                size = "2x2" if small else "3x3"
                zero = _with_budget(symbolic_timeout, lambda: _is_zero_matrix(replays.residual(step.symbolic, d, env)))
                sym = "verified" if zero else f"FAILED: explicit {size} residual is not zero"
            except _SymbolicTimeout:
                sym = _timeout_verdict(symbolic_timeout)
            except NotExplicit:
                sym = "not applicable (implicit solve)"
            except Exception as exc:
                sym = f"FAILED: {type(exc).__name__}: {exc}"
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

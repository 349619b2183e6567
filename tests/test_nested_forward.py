"""Forward mode over forward mode (``torch.func.jvp`` of ``torch.func.jvp``, ``jacfwd(jacfwd(f))``).

torch runs a custom autograd function's ``jvp`` with forward-mode AD off at every level, so an
outer ``jvp`` silently drops the inner one's second-order terms (pytorch/pytorch#197867; before
:func:`adjointgen.runtime.function.nested_forward`, ``jvp(jvp(agt.inv))`` was off by 0.14 and
``eigh``'s by 36).  Every function here is checked against central differences of torch's own
first-order ``jvp`` (torch's nested forward mode is itself wrong for ``solve``, ``det`` and
``slogdet``, so it is not the reference), and ``jacfwd(jacfwd)`` against ``jacfwd(jacrev)``."""
import importlib
import pkgutil

import pytest
import sympy
import torch

import adjointgen
import adjointgen.torch as agt

D = torch.float64


def _sqrt_sym(X):
    w, V = torch.linalg.eigh(X)
    return (V * w.sqrt().unsqueeze(-2)) @ V.mH


def _sym(f):
    return lambda X: f((X + X.mH) / 2)


def _cases(dtype):
    g = torch.Generator().manual_seed(0)
    n = 3
    A = 3 * torch.eye(n, dtype=dtype) + 0.3 * torch.randn(n, n, dtype=dtype, generator=g)
    b = torch.randn(n, 2, dtype=dtype, generator=g)
    B = torch.eye(n, dtype=dtype) + 0.1 * (lambda M: M @ M.mH)(torch.randn(n, n, dtype=dtype, generator=g))
    T = torch.randn(5, n, dtype=dtype, generator=g)
    cases = {
        "inv": (agt.inv, torch.linalg.inv, A),
        "solve": (lambda X: agt.solve(X, b), lambda X: torch.linalg.solve(X, b), A),
        "cholesky": (_sym(agt.cholesky), _sym(torch.linalg.cholesky), (A + A.mH) / 2),
        "qr": (lambda X: agt.qr(X), lambda X: torch.linalg.qr(X), A),
        "det": (agt.det, torch.linalg.det, A),
        "eigh values": (_sym(lambda X: agt.eigh(X)[0]), _sym(lambda X: torch.linalg.eigh(X)[0]), A),
        "eigh projector": (_sym(lambda X: (lambda V: V[:, :1] @ V[:, :1].mH)(agt.eigh(X)[1])),
                           _sym(lambda X: (lambda V: V[:, :1] @ V[:, :1].mH)(torch.linalg.eigh(X)[1])), A),
        "generalized eigh": (_sym(lambda X: agt.eigh(X, B)[0]),
                             _sym(lambda X: torch.linalg.eigvalsh(torch.linalg.solve(torch.linalg.cholesky(B), torch.linalg.solve(torch.linalg.cholesky(B), X).mH))), A),
        "svd values": (lambda X: agt.svd(X, full_matrices=False)[1], lambda X: torch.linalg.svdvals(X), A),
        "expm": (_sym(agt.expm), _sym(torch.linalg.matrix_exp), A),
        "sqrtm": (_sym(agt.sqrtm), _sym(_sqrt_sym), A),
        "pinv": (agt.pinv, torch.linalg.pinv, T),
        "lstsq": (lambda X: agt.lstsq(X, T[:, :2]).solution, lambda X: torch.linalg.pinv(X) @ T[:, :2], T),
        "solve_triangular": (lambda X: agt.solve_triangular(X.tril(), b, upper=False),
                             lambda X: torch.linalg.solve_triangular(X.tril(), b, upper=False), A),
        # no torch reference: central differences of the function's own first-order jvp
        "sqrtm general": (agt.sqrtm, agt.sqrtm, A),
        "logm general": (agt.logm, agt.logm, A),
        "funm sin": (_sym(lambda X: agt.funm(X, sympy.sin(sympy.Symbol("x")))),
                     _sym(lambda X: agt.funm(X, sympy.sin(sympy.Symbol("x")))), A),
    }
    if not dtype.is_complex:
        cases.update({
            "slogdet": (lambda X: agt.slogdet(X)[1], lambda X: torch.linalg.slogdet(X)[1], A),
            "matrix_exp": (agt.matrix_exp, torch.linalg.matrix_exp, A),
            "lu": (lambda X: agt.lu(X)[1:], lambda X: torch.linalg.lu(X)[1:], A),
            "eigsh": (_sym(lambda X: agt.eigsh(X, 2)[0]), _sym(lambda X: torch.linalg.eigh(X)[0][1:].flip(-1)), A),
            "eigsh projector": (_sym(lambda X: (lambda V: V @ V.mH)(agt.eigsh(X, 2)[1])),
                                _sym(lambda X: (lambda V: V @ V.mH)(torch.linalg.eigh(X)[1][:, 1:])), A),
            "svds": (lambda X: agt.svds(X, 2)[1], lambda X: torch.linalg.svdvals(X)[:2], T),
        })
    return cases


def _second(f, X, u, v):
    inner = lambda X: torch.func.jvp(f, (X,), (u,))[1]  # noqa: E731
    return torch.func.jvp(inner, (X,), (v,))[1]


def _central(f, X, u, v, h=1e-5):
    inner = lambda X: torch.func.jvp(f, (X,), (u,))[1]  # noqa: E731
    plus, minus = inner(X + h * v), inner(X - h * v)
    return tuple((p - m) / (2 * h) for p, m in zip(plus, minus)) if isinstance(plus, tuple) else (plus - minus) / (2 * h)


def _flat(x):
    return torch.cat([t.reshape(-1) for t in x]) if isinstance(x, tuple) else x.reshape(-1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=["real", "complex"])
def test_forward_over_forward_is_exact(dtype):
    bad = []
    for name, (ours, theirs, X) in _cases(dtype).items():
        g = torch.Generator().manual_seed(1)
        u, v = (torch.randn(X.shape, dtype=dtype, generator=g) for _ in range(2))
        got, want = _flat(_second(ours, X, u, v)), _flat(_central(theirs, X, u, v))
        err = ((got - want).abs().max() / want.abs().max().clamp_min(1)).item()
        if not err < 1e-6:
            bad.append(f"{name}: {err:.1e}")
    assert not bad, bad


TRANSFORMS = {
    "hessian": torch.func.hessian,
    "jacrev(jacrev)": lambda f: torch.func.jacrev(torch.func.jacrev(f)),
    "jacfwd(jacfwd)": lambda f: torch.func.jacfwd(torch.func.jacfwd(f)),
}


def test_every_second_order_transform_is_exact():
    """``hessian`` (forward over reverse), ``jacrev(jacrev)`` (reverse over a vmapped reverse: the
    partial solvers' per-element backward once dropped its derivative here, silently) and
    ``jacfwd(jacfwd)``, of a weighted sum of each function's outputs, against torch's reverse over
    reverse of the reference."""
    bad = []
    for name, (ours, theirs, X) in _cases(D).items():
        G = torch.randn(_flat(theirs(X)).shape, dtype=D, generator=torch.Generator().manual_seed(2))
        want = torch.func.jacrev(torch.func.jacrev(lambda X: (_flat(theirs(X)) * G).sum()))(X)  # noqa: B023
        loss = lambda X: (_flat(ours(X)) * G).sum()  # noqa: E731, B023
        for transform, T in TRANSFORMS.items():
            err = ((T(loss)(X) - want).abs().max() / want.abs().max().clamp_min(1)).item()
            if not err < 1e-8:
                bad.append(f"{name} {transform}: {err:.1e}")
    assert not bad, bad


def _functions():
    """Every torch autograd function class defined by adjointgen (runtime, composites and the
    generated catalogue)."""
    for info in pkgutil.walk_packages(adjointgen.__path__, "adjointgen."):
        if info.name.endswith(("__main__", ".cli")) or ".jax" in info.name or "jax_" in info.name or info.name.endswith((".cupy", ".cuda")) or ".cupy." in info.name:
            continue
        try:
            importlib.import_module(info.name)
        except ImportError:
            continue

    def walk(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from walk(sub)

    # (not the twins without jvp that compilers trace: adjointgen.runtime.function.Function)
    return [c for c in walk(torch.autograd.Function) if c.__module__.startswith("adjointgen") and "jvp" in vars(c)
            and not vars(c).get("_twin", False)]


def test_every_autograd_function_of_the_package_runs_its_jvp_for_nested_forward_mode():
    """The mechanism, not a list: a new autograd function whose ``jvp`` lacks the decorator fails here."""
    functions = _functions()
    assert len(functions) > 20
    missing = [f"{c.__module__}.{c.__qualname__}" for c in functions
               if getattr(vars(c)["jvp"], "__func__", vars(c)["jvp"]).__dict__.get("__wrapped__") is None]
    assert not missing, missing


@pytest.mark.slow  # 13-25 s: the default suite keeps its time; CI's slow step runs it
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128], ids=["real", "complex"])
def test_linearize_is_right_or_a_clear_error(dtype):
    """``torch.func.linearize`` traces the ``jvp`` with ``make_fx`` and replays the graph for other
    tangents: a host computation (SciPy) on the tangent was recorded as a constant (``logm`` and
    ``sqrtm`` of a general matrix were off by 0.17 and 0.07, silently), and a value check would not
    replay.  Each function's linearization, and that of its gradient, equals ``jvp`` or raises."""
    wrong, raised = [], []
    for name, (ours, _, X) in _cases(dtype).items():
        g = torch.Generator().manual_seed(3)
        u = torch.randn(X.shape, dtype=dtype, generator=g)
        # |x|^2 as x conj(x): abs's autograd derivative at an exact 0 is 0, so (x.abs() ** 2)'s second
        # derivative there is 0, not 2 -- a rounding-dependent loss (lstsq returns exact zeros on some machines)
        loss = lambda X: (lambda y: (y * y.conj()).real.sum())(_flat(ours(X)))  # noqa: E731, B023
        for what, f in ((name, ours), (f"grad of {name}", torch.func.grad(loss))):
            want = _flat(torch.func.jvp(f, (X,), (u,))[1])
            try:
                got = _flat(torch.func.linearize(f, X)[1](u))
            except RuntimeError as exc:
                assert "torch.func.jvp" in str(exc), (what, str(exc))
                raised.append(what)
                continue
            err = ((got - want).abs().max() / want.abs().max().clamp_min(1)).item()
            if not err < 1e-10:
                wrong.append(f"{what}: {err:.1e}")
    assert not wrong, wrong
    assert "inv" not in raised and "grad of cholesky" not in raised  # the plain rules do linearize


def test_complex_second_order_transforms():
    """Complex inputs through a real parametrization ``A = R[0] + i R[1]``: ``hessian``,
    ``jacrev(jacrev)`` and ``jacfwd(jacfwd)`` of a real loss, contracted with a direction, against
    central differences of the gradient.  (A complex ``det``'s ``jacrev(jacrev)`` raised: a rule
    reading ``A`` only as ``A^H`` handed torch's ``ComplexBackward`` a conjugate view under ``vmap``.)"""
    bad = []
    for name, (ours, _, X) in _cases(torch.complex128).items():
        R = torch.stack([X.real, X.imag])
        g = torch.Generator().manual_seed(5)
        G = torch.randn(_flat(ours(X)).shape, dtype=torch.complex128, generator=g)
        v = torch.randn(R.shape, dtype=D, generator=g)
        loss = lambda R: (_flat(ours(torch.complex(R[0], R[1]))) * G).sum().real  # noqa: E731, B023
        grad = torch.func.grad(loss)
        h = 1e-5
        want = (grad(R + h * v) - grad(R - h * v)) / (2 * h)
        for transform, T in TRANSFORMS.items():
            try:
                got = (T(loss)(R) * v).sum(tuple(range(-R.dim(), 0)))
            except RuntimeError as exc:
                bad.append(f"{name} {transform}: {type(exc).__name__}: {str(exc)[:80]}")
                continue
            err = ((got - want).abs().max() / want.abs().max().clamp_min(1)).item()
            if not err < 1e-6:
                bad.append(f"{name} {transform}: {err:.1e}")
    assert not bad, bad

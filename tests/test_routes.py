"""Every route of every public function gives the general function's value and derivatives.

A public function has routes chosen by hand: a Hermitian shortcut, full or thin factors, a
values-only routine where no derivative follows, a rules variant for square factors, a cheaper
factorization where it is safe, a forward for inputs whose values cannot be read (``vmap``,
``torch.compile``).  Each branch records itself (:func:`adjointgen.runtime.routes.taken`); ``ROUTES``
below lists every route of every function with inputs that trigger it and the general function it
must agree with.  For each route:

* the route is taken (recorded) at its inputs;
* the value, a VJP and a JVP along an unstructured tangent (structured only where the function's
  domain is: symmetric inputs of ``eigvalsh``, triangles of ``solve_triangular``) agree with the
  reference, which is torch's own function (differentiated by torch) or adjointgen's general route;

and the list is complete both ways: a route recorded that the list lacks fails, and so does a
``taken("function", "route")`` call in the sources that the list does not name.

Inputs that trigger the shortcuts are the ones users meet: exactly symmetric, zero, identity,
orthogonal, rank deficient.
"""
from __future__ import annotations

import pathlib
import re
import warnings

import pytest
import torch

import adjointgen.torch as agt
from adjointgen.runtime import routes

D = torch.float64
ROOT = pathlib.Path(__file__).resolve().parents[1]


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0, dtype=D):
    return torch.randn(shape, dtype=dtype, generator=gen(seed))


def spd(n, seed=0, dtype=D):
    X = randn(n, n, seed=seed, dtype=dtype)
    return X @ X.mH / n + torch.eye(n, dtype=dtype)


def sym(n, seed=0, dtype=D):
    X = randn(n, n, seed=seed, dtype=dtype)
    return (X + X.mH) / 2


def orthogonal(n, seed=0):
    return torch.linalg.qr(randn(n, n, seed=seed))[0]


def rank_deficient(m, n, r, seed=0):
    return randn(m, r, seed=seed) @ randn(r, n, seed=seed + 1)


def nonsymmetric_positive(n, seed=0):
    """A non-normal matrix with real positive eigenvalues (logm, sqrtm of the general route)."""
    T = torch.triu(randn(n, n, seed=seed), 1) * 0.3 + torch.diag(torch.linspace(1.0, 2.0, n, dtype=D))
    Q = orthogonal(n, seed + 1)
    return Q @ T @ Q.mT


def _general(name):
    import importlib

    module = importlib.import_module(f"adjointgen.generated.torch.{name}")
    return getattr(module, name)


def _first(f):
    return lambda *a: f(*a)[0]


def _projector(k):
    """``U[:, :k] U[:, :k]^H`` of the first output: invariant to every gauge of the factors."""
    return lambda out: out[0][..., :k] @ out[0][..., :k].mH


def _svd_invariants(out, k=None):
    U, S, Vh = out
    k = S.shape[-1] if k is None else k
    return torch.cat([(U[..., :k] * S[..., None, :k]) @ Vh[..., :k, :], U[..., :k] @ U[..., :k].mH], -1), S


def _complement_projector(out):
    U, S, Vh = out
    k = S.shape[-1]
    return U[..., k:] @ U[..., k:].mH, Vh[..., k:, :].mH @ Vh[..., k:, :]


def _triangular(kind):
    def make(*shape, seed=0):
        X = randn(*shape, seed=seed)
        n = shape[-1]
        X = X + 3 * torch.eye(n, dtype=D)
        return X.triu() if kind == "upper" else X.tril()
    return make


class Route:
    """One route of a public function.

    ``f(*args)``: what is differentiated (outputs through a gauge-invariant map where the factors
    have a gauge); ``ref(*args)``: the general function's same quantity; ``args()``: inputs that
    trigger the route; ``tangents(args)``: a tangent per differentiable input (unstructured unless
    the function's domain is structured); ``expect``: the routes recorded, ``(function, route)``."""

    def __init__(self, f, ref, args, expect, tangents=None, grad=(0,), atol=1e-9, forward_mode=True, fallback=None):
        self.f, self.ref, self.args, self.expect = f, ref, args, set(expect)
        self.forward_mode = forward_mode
        #: the routes recorded where the route gives up by design (the Krylov route's time budget on a loaded
        #: machine: the dense solver takes over)
        self.fallback = set(fallback or ())
        self.tangents = tangents or (lambda args: [randn(*args[i].shape, seed=40 + i, dtype=args[i].dtype)
                                                   for i in grad])
        self.grad, self.atol = grad, atol


def _eigsh_sparse(n, k, seed):
    X = spd(n, seed)
    return X


ROUTES: dict[str, dict[str, Route]] = {
    "expm": {
        "hermitian": Route(agt.expm, torch.linalg.matrix_exp, lambda: (torch.zeros(3, 3, dtype=D),), {("expm", "hermitian")}),
        "hermitian at I": Route(agt.expm, torch.linalg.matrix_exp, lambda: (torch.eye(3, dtype=D),), {("expm", "hermitian")}),
        "hermitian random": Route(agt.expm, torch.linalg.matrix_exp, lambda: (sym(4, 1),), {("expm", "hermitian")}),
        "hermitian complex": Route(agt.expm, torch.linalg.matrix_exp, lambda: (sym(3, 2, torch.complex128),),
                                   {("expm", "hermitian")}),
        "general": Route(agt.expm, torch.linalg.matrix_exp, lambda: (randn(4, 4, seed=3),), {("expm", "general")}),
    },
    "logm": {
        "hermitian": Route(agt.logm, _general("logm_general"), lambda: (torch.eye(3, dtype=D),), {("logm", "hermitian")}),
        "hermitian spd": Route(agt.logm, _general("logm_general"), lambda: (spd(4, 4),), {("logm", "hermitian")}),
        "hermitian complex": Route(agt.logm, _general("logm_general"), lambda: (spd(3, 5, torch.complex128),),
                                   {("logm", "hermitian")}),
        "general": Route(agt.logm, _general("logm_general"), lambda: (nonsymmetric_positive(4, 6),), {("logm", "general")}),
    },
    "sqrtm": {
        "hermitian": Route(agt.sqrtm, _general("sqrtm_general"), lambda: (torch.eye(3, dtype=D),), {("sqrtm", "hermitian")}),
        "hermitian spd": Route(agt.sqrtm, _general("sqrtm_general"), lambda: (spd(4, 7),), {("sqrtm", "hermitian")}),
        "general": Route(agt.sqrtm, _general("sqrtm_general"), lambda: (nonsymmetric_positive(4, 8),),
                         {("sqrtm", "general")}),
    },
    "svd": {
        "thin square": Route(lambda A: _svd_invariants(agt.svd(A)), lambda A: _svd_invariants(torch.linalg.svd(A)),
                             lambda: (randn(4, 4, seed=9),), {("svd", "thin"), ("svd", "rules_square_U_V")}),
        # all four values equal: reverse mode is exact for their sum; forward mode along a direction that
        # splits the cluster raises (tests/test_cluster_roots.py: it cannot be determined)
        "thin orthogonal": Route(lambda A: agt.svd(A)[1].sum(), lambda A: torch.linalg.svdvals(A).sum(),
                                 lambda: (orthogonal(4, 10) * 2,), {("svd", "thin"), ("svd", "rules_square_U_V")},
                                 forward_mode=False),
        "thin tall": Route(lambda A: _svd_invariants(agt.svd(A, full_matrices=False)),
                           lambda A: _svd_invariants(torch.linalg.svd(A, full_matrices=False)),
                           lambda: (randn(6, 4, seed=11),), {("svd", "thin"), ("svd", "rules_square_V")}),
        "thin wide": Route(lambda A: _svd_invariants(agt.svd(A, full_matrices=False)),
                           lambda A: _svd_invariants(torch.linalg.svd(A, full_matrices=False)),
                           lambda: (randn(3, 5, seed=12),), {("svd", "thin"), ("svd", "rules_square_U")}),
        "full tall": Route(lambda A: (*_svd_invariants(agt.svd(A)), *_complement_projector(agt.svd(A))),
                           lambda A: (*_svd_invariants(torch.linalg.svd(A, full_matrices=False)),
                                      torch.eye(A.shape[-2], dtype=A.dtype) - (lambda U: U @ U.mH)(
                                          torch.linalg.svd(A, full_matrices=False)[0]),
                                      torch.zeros(A.shape[-1], A.shape[-1], dtype=A.dtype)),
                           lambda: (randn(6, 4, seed=13),), {("svd", "full")}),
        "full wide": Route(lambda A: (*_svd_invariants(agt.svd(A)), *_complement_projector(agt.svd(A))),
                           lambda A: (*_svd_invariants(torch.linalg.svd(A, full_matrices=False)),
                                      torch.zeros(A.shape[-2], A.shape[-2], dtype=A.dtype),
                                      torch.eye(A.shape[-1], dtype=A.dtype) - (lambda V: V.mH @ V)(
                                          torch.linalg.svd(A, full_matrices=False)[2])),
                           lambda: (randn(3, 5, seed=14),), {("svd", "full")}),
    },
    "svdvals": {
        "values": Route(agt.svdvals, torch.linalg.svdvals, lambda: (randn(5, 3, seed=15),), {("svdvals", "values")},
                        grad=()),
        "decomposition": Route(agt.svdvals, torch.linalg.svdvals, lambda: (randn(5, 3, seed=15),),
                               {("svdvals", "decomposition"), ("svd", "thin"), ("svd", "rules_square_V")}),
    },
    "eigvalsh": {
        "values": Route(agt.eigvalsh, torch.linalg.eigvalsh, lambda: (sym(4, 16),), {("eigvalsh", "values")}, grad=()),
        "decomposition": Route(agt.eigvalsh, torch.linalg.eigvalsh, lambda: (sym(4, 16),), {("eigvalsh", "decomposition")},
                               tangents=lambda args: [sym(4, 41)]),
    },
    "eigvals": {
        "values": Route(agt.eigvals, torch.linalg.eigvals, lambda: (randn(4, 4, seed=17),), {("eigvals", "values")},
                        grad=()),
        "decomposition": Route(lambda A: agt.eigvals(A).real.sort().values + agt.eigvals(A).imag.abs().sort().values,
                               lambda A: torch.linalg.eigvals(A).real.sort().values
                               + torch.linalg.eigvals(A).imag.abs().sort().values,
                               lambda: (randn(4, 4, seed=17),), {("eigvals", "decomposition")}),
    },
    "qr": {
        "tall": Route(lambda A: agt.qr(A), lambda A: torch.linalg.qr(A), lambda: (randn(6, 4, seed=18),),
                      {("qr", "tall"), ("qr", "rules")}),
        "square": Route(lambda A: agt.qr(A), lambda A: torch.linalg.qr(A), lambda: (randn(4, 4, seed=19),),
                        {("qr", "tall"), ("qr", "rules_square_Q")}),
        "square orthogonal": Route(lambda A: agt.qr(A), lambda A: torch.linalg.qr(A), lambda: (orthogonal(4, 20),),
                                   {("qr", "tall"), ("qr", "rules_square_Q")}),
        "wide": Route(lambda A: agt.qr(A), lambda A: torch.linalg.qr(A), lambda: (randn(3, 5, seed=21),),
                      {("qr", "wide"), ("qr", "rules_square_Q")}),
        # R of the complete factorization is the reduced one's with zero rows (torch refuses to differentiate
        # it; the reference is its reduced R); forward mode refuses: Q's extra columns are any basis
        "complete": Route(lambda A: agt.qr(A, mode="complete")[1],
                          lambda A: torch.cat([torch.linalg.qr(A)[1], A.new_zeros(A.shape[-2] - A.shape[-1], A.shape[-1])]),
                          lambda: (randn(5, 3, seed=22),), {("qr", "tall"), ("qr", "rules"), ("qr", "complete")},
                          forward_mode=False),
    },
    "solve": {
        f"{side}_{kind}": Route(lambda A, B, side=side: agt.solve(A, B, left=side == "left"),
                                lambda A, B, side=side: torch.linalg.solve(A, B, left=side == "left"),
                                (lambda kind=kind: (randn(4, 4, seed=23) + 4 * torch.eye(4, dtype=D),
                                                    randn(4, seed=24) if kind == "vector" else randn(4, 2, seed=24)))
                                if side == "left" else
                                (lambda kind=kind: (randn(4, 4, seed=23) + 4 * torch.eye(4, dtype=D),
                                                    randn(4, seed=24) if kind == "vector" else randn(2, 4, seed=24))),
                                {("solve", f"{side}_{kind}")}, grad=(0, 1))
        for side in ("left", "right") for kind in ("vector", "matrix") if (side, kind) != ("right", "vector")
    },
    "solve_triangular": {
        "lower": Route(lambda A, B: agt.solve_triangular(A, B, upper=False),
                       lambda A, B: torch.linalg.solve_triangular(A, B, upper=False),
                       lambda: (_triangular("lower")(4, 4, seed=25), randn(4, 2, seed=26)),
                       {("solve_triangular", "lower")}, grad=(0, 1),
                       tangents=lambda args: [randn(4, 4, seed=42).tril(), randn(4, 2, seed=43)]),
        "upper": Route(lambda A, B: agt.solve_triangular(A, B, upper=True),
                       lambda A, B: torch.linalg.solve_triangular(A, B, upper=True),
                       lambda: (_triangular("upper")(4, 4, seed=27), randn(4, 2, seed=28)),
                       {("solve_triangular", "upper")}, grad=(0, 1),
                       tangents=lambda args: [randn(4, 4, seed=44).triu(), randn(4, 2, seed=45)]),
        "right": Route(lambda A, B: agt.solve_triangular(A, B, upper=True, left=False),
                       lambda A, B: torch.linalg.solve_triangular(A, B, upper=True, left=False),
                       lambda: (_triangular("upper")(4, 4, seed=29), randn(2, 4, seed=30)),
                       {("solve_triangular", "right"), ("solve_triangular", "lower")}, grad=(0, 1),
                       tangents=lambda args: [randn(4, 4, seed=46).triu(), randn(2, 4, seed=47)]),
        "unitriangular": Route(lambda A, B: agt.solve_triangular(A, B, upper=False, unitriangular=True),
                               lambda A, B: torch.linalg.solve_triangular(A, B, upper=False, unitriangular=True),
                               lambda: (_triangular("lower")(4, 4, seed=31), randn(4, 2, seed=32)),
                               {("solve_triangular", "unitriangular"), ("solve_triangular", "lower")}, grad=(0, 1),
                               tangents=lambda args: [randn(4, 4, seed=48).tril(-1), randn(4, 2, seed=49)]),
    },
    "lu": {
        shape: Route(lambda A: agt.lu(A)[1:], lambda A: torch.linalg.lu(A)[1:], lambda m=m, n=n: (randn(m, n, seed=33),),
                     {("lu", shape)})
        for shape, (m, n) in {"square": (4, 4), "tall": (5, 3), "wide": (3, 5)}.items()
    },
    "adjugate": {
        # det's gradient is conj(g) adj(A)^H; its Hessian differentiates adj
        "lu": Route(lambda A: torch.func.grad(agt.det)(A), lambda A: torch.func.grad(torch.linalg.det)(A),
                    lambda: (randn(4, 4, seed=34),), {("adjugate", "lu")}),
        "svd": Route(lambda A: torch.func.grad(agt.det)(A), None, lambda: (rank_deficient(4, 4, 2, seed=35),),
                     {("adjugate", "svd")}),
        "svd at zero": Route(lambda A: torch.func.grad(agt.det)(A), None, lambda: (torch.zeros(3, 3, dtype=D),),
                             {("adjugate", "svd")}),
    },
    "pinv": {
        "lu": Route(agt.pinv, torch.linalg.pinv, lambda: (randn(4, 4, seed=36) + 4 * torch.eye(4, dtype=D),),
                    {("pinv", "lu"), ("pinv", "rules")}),
        "cholesky": Route(lambda A: agt.pinv(A, hermitian=True), lambda A: torch.linalg.pinv(A, hermitian=True),
                          lambda: (spd(4, 37),), {("pinv", "cholesky"), ("pinv", "rules")},
                          tangents=lambda args: [sym(4, 50)]),
        # the rules with their products ordered for a tall or a wide input (Derivation.either_orientation)
        "gram": Route(agt.pinv, torch.linalg.pinv, lambda: (randn(6, 3, seed=38),),
                      {("pinv", "cholesky"), ("pinv", "rules_shorter_n_m")}),
        "gram wide": Route(agt.pinv, torch.linalg.pinv, lambda: (randn(3, 6, seed=41),),
                           {("pinv", "cholesky"), ("pinv", "rules_shorter_m_n")}),
        "svd": Route(agt.pinv, torch.linalg.pinv, lambda: (rank_deficient(5, 4, 2, seed=39),), {("pinv", "svd")}),
        "eigh": Route(lambda A: agt.pinv(A, hermitian=True), lambda A: torch.linalg.pinv(A, hermitian=True),
                      lambda: ((lambda X: X @ X.mT)(randn(4, 2, seed=40)),), {("pinv", "eigh")},
                      tangents=lambda args: [(lambda X: X @ args[0] + args[0] @ X.mT)(randn(4, 4, seed=51))]),
    },
    "cholesky_ex": {
        "derived": Route(lambda A: agt.cholesky_ex(A)[0], lambda A: torch.linalg.cholesky_ex(A)[0], lambda: (spd(4, 52),),
                         {("cholesky_ex", "derived")}, tangents=lambda args: [sym(4, 53)]),
        "torch": Route(lambda A: agt.cholesky_ex(A)[1], lambda A: torch.linalg.cholesky_ex(A)[1],
                       lambda: (-spd(4, 54),), {("cholesky_ex", "torch")}, grad=()),
    },
    "inv_ex": {
        "derived": Route(lambda A: agt.inv_ex(A)[0], lambda A: torch.linalg.inv_ex(A)[0],
                         lambda: (randn(4, 4, seed=55) + 4 * torch.eye(4, dtype=D),), {("inv_ex", "derived")}),
        "torch": Route(lambda A: agt.inv_ex(A)[1], lambda A: torch.linalg.inv_ex(A)[1],
                       lambda: (torch.zeros(3, 3, dtype=D),), {("inv_ex", "torch")}, grad=()),
    },
    "solve_ex": {
        "derived": Route(lambda A, B: agt.solve_ex(A, B)[0], lambda A, B: torch.linalg.solve_ex(A, B)[0],
                         lambda: (randn(4, 4, seed=59) + 4 * torch.eye(4, dtype=D), randn(4, 2, seed=60)),
                         {("solve_ex", "derived"), ("solve", "left_matrix")}, grad=(0, 1)),
        "torch": Route(lambda A, B: agt.solve_ex(A, B)[1], lambda A, B: torch.linalg.solve_ex(A, B)[1],
                       lambda: (torch.zeros(3, 3, dtype=D), randn(3, 1, seed=61)),
                       {("solve_ex", "torch"), ("solve", "left_matrix")}, grad=()),
    },
    "lu_factor_ex": {
        "derived": Route(lambda A: agt.lu_factor_ex(A)[0], lambda A: torch.linalg.lu_factor_ex(A)[0],
                         lambda: (randn(4, 4, seed=62) + 4 * torch.eye(4, dtype=D),), {("lu_factor_ex", "derived")}),
        "torch": Route(lambda A: agt.lu_factor_ex(A)[2], lambda A: torch.linalg.lu_factor_ex(A)[2],
                       lambda: (torch.zeros(3, 3, dtype=D),), {("lu_factor_ex", "torch")}, grad=()),
    },
    "partial_eigh": {
        # the partial solvers' routes: the derivative is the same rule; each against the full eigh
        "dense": Route(lambda A: (lambda w, V: (w, V @ V.mH))(*agt.eigsh(A, 2)),
                       lambda A: (lambda w, V: (w.flip(-1)[:2], V[:, -2:] @ V[:, -2:].mH))(*torch.linalg.eigh(A)),
                       lambda: (sym(6, 56),), {("partial_eigh", "dense")},
                       tangents=lambda args: [sym(6, 57)]),
        "krylov": Route(lambda A: (lambda w, V: (w, V @ V.mH))(*agt.eigsh(A, 2)),
                        lambda A: (lambda w, V: (w.flip(-1)[:2], V[:, -2:] @ V[:, -2:].mH))(*torch.linalg.eigh(A)),
                        lambda: (torch.diag(torch.cat([torch.tensor([9.0, 8.0], dtype=D),
                                                       torch.linspace(0.0, 1.0, 1008, dtype=D)]))
                                 + 1e-3 * sym(1010, 58),), {("partial_eigh", "krylov")},
                        fallback={("partial_eigh", "dense")},
                        tangents=lambda args: [sym(1010, 59)], atol=1e-7),
        "arpack": Route(lambda A: (lambda w, V: (w, V @ V.mH))(*agt.eigsh(A.to_sparse(), 2)),
                        lambda A: (lambda w, V: (w.flip(-1)[:2], V[:, -2:] @ V[:, -2:].mH))(*torch.linalg.eigh(A)),
                        lambda: (torch.diag(torch.cat([torch.tensor([9.0, 8.0], dtype=D),
                                                       torch.linspace(0.0, 1.0, 608, dtype=D)]))
                                 + torch.diag(torch.full((609,), 0.01, dtype=D), 1)
                                 + torch.diag(torch.full((609,), 0.01, dtype=D), -1),),
                        {("partial_eigh", "arpack")}, grad=(), atol=1e-7),
    },
}


def _tensors(out):
    out = out if isinstance(out, tuple) else (out,)
    return [o for o in out if isinstance(o, torch.Tensor)]


def _dot(xs, ys):
    return sum(float(torch.real((x.conj() * y).sum())) for x, y in zip(xs, ys))


CASES = [(f, r) for f in ROUTES for r in ROUTES[f]]


@pytest.mark.parametrize("function,route", CASES, ids=[f"{f}-{r}" for f, r in CASES])
def test_each_route_is_the_general_function(function, route):
    case = ROUTES[function][route]
    args = case.args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grad_args = [a.clone().requires_grad_() if i in case.grad else a for i, a in enumerate(args)]
        with routes.recording() as log:
            out = _tensors(case.f(*grad_args))
            cotangents = [randn(*o.shape, seed=60 + i, dtype=o.dtype) if o.is_floating_point() or o.is_complex()
                          else None for i, o in enumerate(out)]
            pairs = [(o, c) for o, c in zip(out, cotangents) if c is not None and o.requires_grad]
            vjp = torch.autograd.grad([o for o, _ in pairs], [grad_args[i] for i in case.grad],
                                      [c for _, c in pairs], allow_unused=True) if case.grad and pairs else ()
            tangents = case.tangents(args) if case.grad else []
            jvp = ()
            if case.grad and case.forward_mode:
                full = list(args)

                def restricted(*xs):
                    for i, x in zip(case.grad, xs):
                        full[i] = x
                    return tuple(_tensors(case.f(*full)))
                _, jvp = torch.func.jvp(restricted, tuple(args[i] for i in case.grad), tuple(tangents))
    recorded = set(log)
    assert case.expect <= recorded or (case.fallback and case.fallback <= recorded), \
        f"{function}: route {route} expected {case.expect}, recorded {recorded}"
    listed = {(f, r) for f in ROUTES for r in _route_names(f)} | {(f, r) for f, rs in EXTRA.items() for r in rs}
    assert recorded <= listed, f"routes taken that no list names: {recorded - listed}"
    if case.ref is None:
        return _polynomial_check(case, args, out, vjp, tangents, jvp)
    ref_args = [a.clone().requires_grad_() if i in case.grad else a for i, a in enumerate(args)]
    ref_out = _tensors(case.ref(*ref_args))
    assert len(ref_out) == len(out)
    for o, r in zip(out, ref_out):
        torch.testing.assert_close(o.detach(), r.detach(), rtol=1e-8, atol=case.atol)
    if not case.grad:
        return
    ref_pairs = [(o, c) for o, c in zip(ref_out, cotangents) if c is not None and o.requires_grad]
    ref_vjp = torch.autograd.grad([o for o, _ in ref_pairs], [ref_args[i] for i in case.grad],
                                  [c for _, c in ref_pairs], allow_unused=True)
    for g, r in zip(vjp, ref_vjp):
        g = torch.zeros_like(r) if g is None else g
        r = torch.zeros_like(g) if r is None else r
        if function in STRUCTURED_VJP:  # gradients differ off the domain: compare along the domain's tangents
            continue
        torch.testing.assert_close(g, r, rtol=1e-7, atol=case.atol)
    # the VJP along the tangents (a structured domain's gradients may differ off it: the dot product does not)
    assert _dot(vjp, tangents) == pytest.approx(_dot(ref_vjp, tangents), rel=1e-7, abs=case.atol)
    full = list(args)

    def ref_restricted(*xs):
        for i, x in zip(case.grad, xs):
            full[i] = x
        return tuple(_tensors(case.ref(*full)))
    if not case.forward_mode:
        return
    _, ref_jvp = torch.func.jvp(ref_restricted, tuple(args[i] for i in case.grad), tuple(tangents))
    for t, r in zip(jvp, ref_jvp):
        torch.testing.assert_close(t, r, rtol=1e-7, atol=case.atol)


#: functions whose domain is structured (symmetric, triangular): their gradients are compared along it
STRUCTURED_VJP = {"eigvalsh", "cholesky_ex", "solve_triangular", "partial_eigh", "pinv"}

#: routes recorded on the way that belong to another function's list (inner calls)
EXTRA = {"svd": ("rules", "rules_square_U", "rules_square_V", "rules_square_U_V"),
         "qr": ("rules", "rules_square_Q")}


def _route_names(function):
    return {r for case in ROUTES[function].values() for (f, r) in case.expect if f == function}


def _polynomial_check(case, args, out, vjp, tangents, jvp):
    """det's gradient is adj(A)^T: a polynomial, whose derivative along E is the second central
    difference of det (exact for a polynomial of degree n up to rounding, with Richardson)."""
    A, = args
    E, = tangents

    def grad_det(X):
        n = X.shape[-1]
        # cofactors from their definition (independent of adjointgen and of torch's det backward)
        C = torch.empty_like(X)
        for i in range(n):
            for j in range(n):
                minor = torch.cat([torch.cat([X[:i, :j], X[:i, j + 1:]], 1), torch.cat([X[i + 1:, :j], X[i + 1:, j + 1:]], 1)])
                C[i, j] = (-1) ** (i + j) * torch.linalg.det(minor) if n > 1 else 1.0
        return C

    torch.testing.assert_close(out[0].detach(), grad_det(A), rtol=1e-9, atol=1e-10)
    h = 1e-3
    central = lambda h: (grad_det(A + h * E) - grad_det(A - h * E)) / (2 * h)  # noqa: E731
    want = (4 * central(h / 2) - central(h)) / 3
    torch.testing.assert_close(jvp[0], want, rtol=1e-7, atol=1e-8)


def test_every_route_in_the_sources_is_listed():
    """A ``taken("function", "route")`` in the sources that the list does not name fails here (a new
    route must come with its check); dynamic names (the rules variants, pinv's and the partial
    solvers' methods) are listed by the function's cases."""
    found = set()
    for path in (ROOT / "src" / "adjointgen").rglob("*.py"):
        for m in re.finditer(r'taken\(\s*"([a-z_]+)"\s*,\s*"([a-z_]+)"\s*\)', path.read_text()):
            found.add((m.group(1), m.group(2)))
        for m in re.finditer(r'taken\(\s*"([a-z_]+)"\s*,\s*"([a-z_]+)" if [^)]*else "([a-z_]+)"\s*\)', path.read_text()):
            found |= {(m.group(1), m.group(2)), (m.group(1), m.group(3))}
    listed = {(f, r) for f in ROUTES for r in _route_names(f)}
    assert found <= listed, f"routes in the sources without a case in ROUTES: {sorted(found - listed)}"
    assert len(found) >= 20


# ------------------------------------------------------------------ values that cannot be read
GENERAL_INPUTS = {
    "expm": (agt.expm, lambda: randn(3, 3, seed=70), torch.linalg.matrix_exp),
    "expm symmetric": (agt.expm, lambda: sym(3, 71), torch.linalg.matrix_exp),
    "logm": (agt.logm, lambda: nonsymmetric_positive(3, 72), _general("logm_general")),
    "sqrtm": (agt.sqrtm, lambda: nonsymmetric_positive(3, 73), _general("sqrtm_general")),
}


COMPILED = [pytest.param(name, backend, marks=[pytest.mark.slow] if name in ("logm", "sqrtm") else [])
            for name in GENERAL_INPUTS for backend in ("eager", "aot_eager")]


@pytest.mark.parametrize("name,backend", COMPILED)  # logm, sqrtm: 5-40 s of tracing each, in the slow step
def test_compiled_routes_give_the_general_function(name, backend):
    # under torch.compile the values cannot be read: the general function runs (it returned the
    # symmetric path's value for a non-symmetric A: expm([[3, 1], [-2, 4]]) was off by 148)
    f, make, ref = GENERAL_INPUTS[name]
    A = make()
    torch._dynamo.reset()
    compiled = torch.compile(lambda a: f(a), backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a1, a2 = A.clone().requires_grad_(), A.clone().requires_grad_()
        X1, X2 = compiled(a1), ref(a2)
        G = randn(3, 3, seed=74)
        g1, = torch.autograd.grad(X1, a1, G)
        g2, = torch.autograd.grad(X2, a2, G)
    torch.testing.assert_close(X1, X2, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(g1, g2, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("name", list(GENERAL_INPUTS))
def test_vmap_and_eager_routes_agree(name):
    # vmap takes the general route, eager the Hermitian one where A is symmetric: the same numbers
    f, make, _ = GENERAL_INPUTS[name]
    A = torch.stack([make(), sym(3, 75) + 3 * torch.eye(3, dtype=D)])
    G = randn(2, 3, 3, seed=76)
    loss = lambda a, g: (f(a) * g).sum()  # noqa: E731
    batched = torch.func.vmap(torch.func.grad(loss))(A, G)
    looped = torch.stack([torch.func.grad(loss)(a, g) for a, g in zip(A, G)])
    torch.testing.assert_close(batched, looped, rtol=1e-9, atol=1e-10)
    tangent = randn(2, 3, 3, seed=77)
    jb = torch.func.vmap(lambda a, t: torch.func.jvp(f, (a,), (t,))[1])(A, tangent)
    jl = torch.stack([torch.func.jvp(f, (a,), (t,))[1] for a, t in zip(A, tangent)])
    torch.testing.assert_close(jb, jl, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("f", [agt.expm, agt.logm, agt.sqrtm], ids=["expm", "logm", "sqrtm"])
def test_second_derivatives_at_a_symmetric_point_are_the_general_functions(f):
    # the Hermitian route's second-order rule along unstructured directions (hessian, forward over
    # reverse, reverse over reverse) against the general route's, which holds for every A
    general = {agt.expm: torch.linalg.matrix_exp, agt.logm: _general("logm_general"),
               agt.sqrtm: _general("sqrtm_general")}[f]
    A = spd(3, 78)
    W = randn(3, 3, seed=79)
    loss, ref = (lambda a: (f(a) * W).sum() ** 2), (lambda a: (general(a) * W).sum() ** 2)
    torch.testing.assert_close(torch.func.hessian(loss)(A), torch.func.hessian(ref)(A), rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(torch.autograd.functional.hessian(loss, A),
                               torch.autograd.functional.hessian(ref, A), rtol=1e-7, atol=1e-8)


COMPILED_EQUAL = {
    # what a compiler traces must be the function, not a stand-in for shapes: eigsh(A, k, B) returned
    # eigh(A + B)'s values under torch.compile (4.33, 4.40 for 1.95, 1.58), torch's pinv compiles
    # wrongly for complex input (off by 0.71), and the partial solvers' order and signs differed
    "eigsh B": (lambda A, B: agt.eigsh(A, 2, B), lambda: (spd(6, 80), spd(6, 81))),
    "eigsh smallest": (lambda A: agt.eigsh(A, 3, largest=False), lambda: (spd(8, 82),)),
    "svds": (lambda A: agt.svds(A, 2), lambda: (randn(6, 4, seed=83),)),
    "svds smallest": (lambda A: agt.svds(A, 2, largest=False), lambda: (randn(6, 4, seed=84),)),
    "pinv complex": (agt.pinv, lambda: (randn(5, 3, seed=85, dtype=torch.complex128),)),
    "pinv hermitian complex": (lambda A: agt.pinv(A, hermitian=True), lambda: (spd(4, 86, torch.complex128),)),
    "pinv rtol tensor": (lambda A: agt.pinv(A, rtol=torch.tensor([0.1, 1e-12], dtype=D)),
                         lambda: (randn(2, 5, 3, seed=87),)),
}


@pytest.mark.parametrize("name", list(COMPILED_EQUAL))
def test_compiled_paths_equal_eager(name):
    f, make = COMPILED_EQUAL[name]
    args = make()
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = torch.compile(f, backend="aot_eager")(*args)
        eager = f(*args)
    for c, e in zip(_tensors(compiled), _tensors(eager)):
        torch.testing.assert_close(c, e, rtol=1e-9, atol=1e-10)

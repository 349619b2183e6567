"""Adversarial sweep of every public torch function: the inputs users meet, every transform.

For each function, a scalar loss of its outputs that is invariant to their gauges (projectors,
values, reconstructions), and for each family of inputs in the function's domain (random,
symmetric, zero, identity, orthogonal, rank deficient, clustered, graded from 1e-300 to 1e300,
batched with sizes 0 and 1, float32, complex), each transform is compared with an independent
reference:

* ``value``: the loss against the same loss of torch's / SciPy's function;
* ``grad``, ``jvp``: against central differences (Richardson) of the reference along a random
  direction of the domain -- or, at graded inputs where differences lose every digit, against
  torch's own derivative of the reference (where torch's rule is right: distinct values);
* ``vmap``: ``vmap(grad)`` of a batch against the gradient of each member;
* ``hessian``: a Hessian-vector product (reverse over reverse) against central differences of the
  reference's gradient;
* ``compile``: ``torch.compile(backend="aot_eager")`` value and gradient against eager.

Every case ends as ``held`` (within the tolerance), ``raised`` (an adjointgen error or a
``ValueError`` naming the problem: a clear error), or ``WRONG`` / ``CRASH`` (a number off the
reference, or an exception that is not a clear error).  ``python benchmarks/sweep_routes.py``
prints the counts per function and lists every WRONG and CRASH case; exit status 1 if any.
``--quick`` runs float64 only, without compile.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
import traceback
import warnings

import mpmath
import numpy as np
import scipy.linalg
import torch

import adjointgen
import adjointgen.torch as agt

D, C = torch.float64, torch.complex128


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0, dtype=D):
    return torch.randn(shape, dtype=dtype, generator=gen(seed))


def herm(X):
    return (X + X.mH) / 2


def orth(n, seed=0, dtype=D):
    return torch.linalg.qr(randn(n, n, seed=seed, dtype=dtype))[0]


def with_spectrum(w, seed=0, dtype=D):
    Q = orth(len(w), seed, dtype)
    return herm(Q @ torch.diag(torch.as_tensor(w, dtype=D).to(dtype)) @ Q.mH)


def with_singular_values(s, m, n, seed=0, dtype=D):
    U = torch.linalg.qr(randn(m, len(s), seed=seed, dtype=dtype))[0]
    V = torch.linalg.qr(randn(n, len(s), seed=seed + 1, dtype=dtype))[0]
    return (U * torch.as_tensor(s, dtype=D).to(dtype)) @ V.mH


_WEIGHTS: dict = {}


def weights_like(name, dtype, make):
    key = (name, dtype)
    if key not in _WEIGHTS:
        _WEIGHTS[key] = make()
    return _WEIGHTS[key]


def weights(shape, seed, dtype=D):
    """Fixed random weights (memoized: drawn once, outside any transform -- vmap refuses random draws)."""
    key = (tuple(shape), seed, dtype)
    if key not in _WEIGHTS:
        _WEIGHTS[key] = randn(*shape, seed=seed, dtype=dtype)
    return _WEIGHTS[key]


# ------------------------------------------------------------------ input families by domain
def families(domain, dtype):
    """``name -> A`` (or a tuple of inputs) for a domain: ``general`` square, ``rect`` m x n,
    ``hermitian``, ``spd``, ``psd`` (positive semidefinite), ``nonsingular``, ``positive`` (no
    eigenvalue on the closed negative real axis)."""
    n = 4
    cplx = dtype.is_complex
    out = {}
    if domain in ("general", "nonsingular", "positive"):
        out["random"] = randn(n, n, seed=1, dtype=dtype) + (3 * torch.eye(n, dtype=dtype) if domain != "general" else 0)
        out["symmetric"] = with_spectrum([0.5, 1.0, 2.0, 3.5], 2, dtype)
        out["identity"] = torch.eye(n, dtype=dtype)
        out["orthogonal"] = orth(n, 3, dtype) if domain != "positive" else with_spectrum([1.0, 1.0, 2.0, 2.0], 3, dtype)
        if domain == "general":
            out["zero"] = torch.zeros(n, n, dtype=dtype)
            out["rank 2"] = randn(n, 2, seed=4, dtype=dtype) @ randn(2, n, seed=5, dtype=dtype)
        out["clustered"] = with_spectrum([1.0, 2.0, 2.0, 3.0], 6, dtype)
        out["nonnormal"] = (torch.triu(randn(n, n, seed=7, dtype=dtype), 1)
                            + torch.diag(torch.tensor([1.0, 1.5, 2.5, 4.0], dtype=D).to(dtype)))
        out["graded"] = torch.diag(torch.tensor([1e-30, 1e-3, 1.0, 1e30], dtype=D).to(dtype))
    elif domain in ("hermitian", "spd", "psd"):
        lo = {"hermitian": -2.0, "spd": 0.5, "psd": 0.0}[domain]
        out["random"] = with_spectrum([lo, lo + 1.0, lo + 2.5, lo + 4.0], 8, dtype)
        out["identity"] = torch.eye(n, dtype=dtype)
        out["clustered"] = with_spectrum([lo + 1.0, lo + 2.0, lo + 2.0, lo + 3.0], 9, dtype)
        out["graded"] = with_spectrum([1e-300, 1e-100, 1.0, 1e300], 10, dtype) if domain != "hermitian" \
            else with_spectrum([-1e300, -1e-100, 1.0, 1e300], 10, dtype)
        if domain == "hermitian":
            out["zero"] = torch.zeros(n, n, dtype=dtype)
            out["rank 2"] = with_spectrum([0.0, 0.0, 1.0, 2.0], 11, dtype)
        if domain == "psd":
            out["rank 2"] = with_spectrum([0.0, 0.0, 1.0, 2.0], 11, dtype)
        out["diagonal"] = torch.diag(torch.tensor([lo + 3.0, lo + 1.0, lo + 2.0, lo + 4.0], dtype=D).to(dtype))
    elif domain == "rect":
        for m_, n_ in ((5, 3), (3, 5)):
            tag = "tall" if m_ > n_ else "wide"
            out[f"{tag} random"] = randn(m_, n_, seed=12, dtype=dtype)
            out[f"{tag} rank 1"] = randn(m_, 1, seed=13, dtype=dtype) @ randn(1, n_, seed=14, dtype=dtype)
            out[f"{tag} clustered"] = with_singular_values([3.0, 2.0, 2.0], m_, n_, 15, dtype)
            out[f"{tag} graded"] = with_singular_values([1e150, 1.0, 1e-150], m_, n_, 16, dtype)
        out["square orthogonal"] = orth(4, 17, dtype) * 2
        out["square zero"] = torch.zeros(4, 4, dtype=dtype)
    if cplx:
        out = {k: v for k, v in out.items() if "graded" not in k}  # one scale sweep suffices (real)
    return out


def domain_tangent(domain, A, seed):
    E = randn(*A.shape, seed=seed, dtype=A.dtype)
    if domain in ("hermitian", "spd", "psd"):
        E = herm(E)
    return E * (A.abs().max() if A.abs().max() > 0 else 1.0)


# ------------------------------------------------------------------ functions: loss, reference
def proj(V, k):
    return V[..., :k] @ V[..., :k].mH


def spectral(U, d, Vh=None):
    """``U diag(sin d) U^H`` (``U diag(sin d) Vh`` for the SVD: ``sin`` is odd, so it is a function of
    ``A`` also where singular values are zero): invariant to every gauge of the factors."""
    f = torch.sin(d).to(U.dtype)
    return (U * f[..., None, :]) @ (U.mH if Vh is None else Vh)


def sym_values(w):
    """A symmetric function of the values (``sum(w^2) + sum(w^3) / 7``): differentiable at clusters."""
    return (w ** 2).sum() + (w ** 3).sum() / 7


def fixed_B(dtype):
    return weights_like("B", dtype, lambda: with_spectrum([1.0, 2.0, 3.0, 4.0], 30, dtype))


def funcs(dtype):
    """``name -> (domain, loss(agt), reference(torch/SciPy), complex ok)``; losses are scalar, real
    and invariant to the outputs' gauges."""
    W = lambda shape, s=90: weights(shape, s, D)  # noqa: E731
    eps = torch.finfo(torch.float32 if dtype in (torch.float32, torch.complex64) else D).eps

    def real(x):
        return x.real if x.is_complex() else x

    def wsum(X, s=91):
        Wt = weights(X.shape[-2:], s, X.dtype)
        return real((Wt.conj() * X).sum())

    def eig_loss(w, V):
        return (w.real ** 2).sum() + (w.imag ** 2).sum() * 0.5

    def scipy_fn(f):
        def apply(A):
            a = A.detach().numpy()
            return torch.from_numpy(np.asarray(f(a))).to(A.dtype)
        return apply

    F = {
        # V diag(sin w) V^H: a function of A (invariant at clusters too), through the vectors
        # symmetric functions of the values and V diag(sin w) V^H: functions of A, at clusters too
        "eigh": ("hermitian", lambda A: (lambda w, V: sym_values(w) + wsum(spectral(V, w)))(*agt.eigh(A)),
                 lambda A: (lambda w, V: sym_values(w) + wsum(spectral(V, w)))(*torch.linalg.eigh(A))),
        "eigvalsh": ("hermitian", lambda A: sym_values(agt.eigvalsh(A)), lambda A: sym_values(torch.linalg.eigvalsh(A))),
        "eigh(A, B)": ("spd", lambda A: (lambda w, V: sym_values(w) + wsum(spectral(V, w)))(
            *agt.eigh(A, fixed_B(A.dtype))), lambda A: _generalized_ref(A, fixed_B(A.dtype), wsum)),
        "eig": ("general", lambda A: eig_loss(*agt.eig(A)), lambda A: eig_loss(*torch.linalg.eig(A))),
        "eigvals": ("general", lambda A: (agt.eigvals(A).real ** 2).sum(), lambda A: (torch.linalg.eigvals(A).real ** 2).sum()),
        "svd": ("rect", lambda A: (lambda U, S, Vh: sym_values(S ** 2) + wsum(spectral(U, S, Vh)))(
            *agt.svd(A, full_matrices=False)),
            lambda A: (lambda U, S, Vh: sym_values(S ** 2) + wsum(spectral(U, S, Vh)))(
                *torch.linalg.svd(A, full_matrices=False))),
        "svd full": ("rect", lambda A: (lambda U, S, Vh: wsum(U[..., S.shape[-1]:] @ U[..., S.shape[-1]:].mH)
                                        + wsum(Vh[..., S.shape[-1]:, :].mH @ Vh[..., S.shape[-1]:, :], 92))(*agt.svd(A)),
                     lambda A: (lambda U, S, Vh: wsum(torch.eye(U.shape[-2], dtype=U.dtype) - U @ U.mH)
                                + wsum(torch.eye(Vh.shape[-1], dtype=Vh.dtype) - Vh.mH @ Vh, 92))(
                         *torch.linalg.svd(A, full_matrices=False))),
        "svdvals": ("rect", lambda A: sym_values(agt.svdvals(A) ** 2), lambda A: sym_values(torch.linalg.svdvals(A) ** 2)),
        "qr": ("rect", lambda A: (lambda Q, R: wsum(Q) + wsum(R, 93))(*agt.qr(A)),
               lambda A: (lambda Q, R: wsum(Q) + wsum(R, 93))(*torch.linalg.qr(A))),
        "cholesky": ("spd", lambda A: wsum(agt.cholesky(A)), lambda A: wsum(torch.linalg.cholesky(A))),
        "solve": ("nonsingular", lambda A: wsum(agt.solve(A, weights((4, 2), 94, A.dtype))),
                  lambda A: wsum(torch.linalg.solve(A, weights((4, 2), 94, A.dtype)))),
        "solve_triangular": ("nonsingular", lambda A: wsum(agt.solve_triangular(A.triu(), weights((4, 2), 95, A.dtype), upper=True)),
                             lambda A: wsum(torch.linalg.solve_triangular(A.triu(), weights((4, 2), 95, A.dtype), upper=True))),
        "lu": ("nonsingular", lambda A: (lambda P, L, U: wsum(L) + wsum(U, 96))(*agt.lu(A)),
               lambda A: (lambda P, L, U: wsum(L) + wsum(U, 96))(*torch.linalg.lu(A))),
        "det": ("general", lambda A: real(agt.det(A)), lambda A: real(torch.linalg.det(A)), ("scalar", mpmath.det)),
        "slogdet": ("nonsingular", lambda A: agt.slogdet(A)[1], lambda A: torch.linalg.slogdet(A)[1],
                    ("scalar", lambda M: mpmath.log(abs(mpmath.det(M))))),
        "pinv": ("rect", lambda A: wsum(agt.pinv(A)), lambda A: wsum(torch.linalg.pinv(A)),
                 ("matrix", lambda M: mp_pinv(M, eps))),
        "lstsq": ("rect", lambda A: wsum(agt.lstsq(A, weights((A.shape[-2], 2), 97, A.dtype)).solution),
                  lambda A: wsum(torch.linalg.pinv(A) @ weights((A.shape[-2], 2), 97, A.dtype)),
                  ("matrix", lambda M: mp_pinv(M, eps) * _mp(weights((M.rows, 2), 97, dtype)))),
        "expm": ("general", lambda A: wsum(agt.expm(A)), lambda A: wsum(torch.linalg.matrix_exp(A)), ("matrix", mpmath.expm)),
        "matrix_exp": ("general", lambda A: wsum(agt.matrix_exp(A)), lambda A: wsum(torch.linalg.matrix_exp(A)),
                       ("matrix", mpmath.expm)),
        "logm": ("positive", lambda A: wsum(agt.logm(A)), lambda A: wsum(scipy_fn(scipy.linalg.logm)(A)),
                 ("matrix", mpmath.logm)),
        "sqrtm": ("positive", lambda A: wsum(agt.sqrtm(A)), lambda A: wsum(scipy_fn(scipy.linalg.sqrtm)(A)),
                  ("matrix", mpmath.sqrtm)),
        "logm spd": ("spd", lambda A: wsum(agt.logm(A)), lambda A: wsum(scipy_fn(scipy.linalg.logm)(A)),
                     ("matrix", mpmath.logm)),
        "sqrtm psd": ("psd", lambda A: wsum(agt.sqrtm(A)), lambda A: wsum(scipy_fn(scipy.linalg.sqrtm)(A)),
                      ("matrix", mpmath.sqrtm)),
        "powm": ("spd", lambda A: wsum(agt.powm(A, 0.7)),
                 lambda A: wsum(scipy_fn(lambda a: scipy.linalg.fractional_matrix_power(a, 0.7))(A)),
                 ("matrix", lambda M: mpmath.powm(M, mpmath.mpf(7) / 10))),
        "inv": ("nonsingular", lambda A: wsum(agt.inv(A)), lambda A: wsum(torch.linalg.inv(A)), ("matrix", mpmath.inverse)),
    }
    return F


def mp_pinv(M, eps=2.0 ** -52):
    """The pseudo-inverse in mpmath's precision with ``torch.linalg.pinv``'s cutoff (singular values
    at most ``eps max(m, n)`` of the largest are zero): the function adjointgen's ``pinv`` is."""
    if M.rows < M.cols:
        return mp_pinv(M.H, eps).H
    U, S, V = (mpmath.svd_c if any(isinstance(x, mpmath.mpc) and x.imag for x in M) else mpmath.svd_r)(M)
    smax = max(abs(x) for x in S) if len(S) else 0
    inv = mpmath.matrix(len(S), len(S))
    cutoff = smax * mpmath.mpf(eps) * max(M.rows, M.cols)  # torch.linalg.pinv's default rtol
    for i in range(len(S)):
        if abs(S[i]) > cutoff:
            inv[i, i] = 1 / S[i]
    return V.H * inv * U.H


def _generalized_ref(A, B, wsum):
    L = torch.linalg.cholesky(B)
    Li = torch.linalg.inv(L)
    w, Y = torch.linalg.eigh(herm(Li @ A @ Li.mH))
    V = Li.mH @ Y
    return sym_values(w) + wsum(spectral(V, w))


# ------------------------------------------------------------------ the checks
CLEAR = (ValueError, adjointgen.SingularMatrixError, adjointgen.GaugeDependentLossError)


def _clear(exc) -> bool:
    """An adjointgen error, a ``ValueError``, or torch's own ``LinAlgError`` (LAPACK refusing an
    input it cannot factor: a named error too)."""
    return isinstance(exc, CLEAR + (torch.linalg.LinAlgError,)) or (
        isinstance(exc, (RuntimeError, NotImplementedError)) and type(exc).__module__.startswith("adjointgen"))


def fd(f, A, E, h=None):
    """Richardson central difference of ``f`` at ``A`` along ``E`` (``f`` on plain tensors)."""
    scale = float(A.abs().max()) or 1.0
    h = h or 1e-3 / max(1.0, float(E.abs().max()) / scale)
    with torch.no_grad():
        d1 = (f(A + h * E) - f(A - h * E)) / (2 * h)
        d2 = (f(A + h / 2 * E) - f(A - h / 2 * E)) / h
    return (4 * d2 - d1) / 3


def close(got, want, rtol, what, atol=0.0):
    got, want = torch.as_tensor(got, dtype=torch.float64), torch.as_tensor(want, dtype=torch.float64)
    if not bool(torch.isfinite(got).all()):
        if bool(torch.isfinite(want).all()):
            raise _Wrong(f"{what}: not finite ({got.flatten()[:4].tolist()})")
        return
    err = float((got - want).abs().max())
    size = float(want.abs().max())
    if not err <= rtol * max(size, 1e-300) + atol + 1e-300:
        raise _Wrong(f"{what}: {got.flatten()[:3].tolist()} vs {want.flatten()[:3].tolist()} (error {err:.2e}, size {size:.2e})")


class _Wrong(Exception):
    pass


class _Unverified(Exception):
    """No reference value at this input (the reference overflows or is NaN)."""


def _mp(A):
    return mpmath.matrix([[mpmath.mpc(complex(x)) if A.is_complex() else mpmath.mpf(float(x)) for x in row]
                          for row in A.tolist()])


def mp_directional(mp_ref, A, E, F=None, W=None):
    """``d loss(A)[E]`` (``d^2 loss(A)[E, F]``) with the loss evaluated in 200-digit arithmetic by
    mpmath (``mp_ref = ("matrix", f)``: ``Re <W, f(A)>``; ``("scalar", f)``: ``Re f(A)``), by a central
    difference of step ``1e-60`` of ``A``'s smallest nonzero entry: exact to double precision for the
    graded inputs too."""
    kind, f = mp_ref
    with mpmath.workdps(200):
        Am, Em = _mp(A), _mp(E)
        Fm = _mp(F) if F is not None else None
        Wm = _mp(W) if W is not None else None
        nonzero = A[A != 0].abs()
        scale = float(nonzero.min()) if nonzero.numel() else 1.0  # the smallest entry sets the step
        size = max(float(E.abs().max()), float(F.abs().max()) if F is not None else 0.0, 1e-300)
        h = mpmath.mpf(scale) * mpmath.mpf("1e-60") / mpmath.mpf(size)

        def value(X):
            v = f(X)
            if kind == "scalar":
                return mpmath.re(v)
            w = _mp(weights((v.rows, v.cols), 91, W.dtype))  # wsum's weights for the output's shape
            return mpmath.re(sum(mpmath.conj(w[i, j]) * v[i, j] for i in range(v.rows) for j in range(v.cols)))

        if F is None:
            return float((value(Am + h * Em) - value(Am - h * Em)) / (2 * h))
        return float((value(Am + h * Em + h * Fm) - value(Am + h * Em - h * Fm) - value(Am - h * Em + h * Fm)
                      + value(Am - h * Em - h * Fm)) / (4 * h * h))


def transforms(name, domain, loss, ref, mp_ref, A, dtype, quick, fam):
    real_dtype = torch.float32 if dtype in (torch.float32, torch.complex64) else D
    rtol = 1e-3 if real_dtype == torch.float32 else 1e-6
    nonzero = A[A != 0].abs()
    graded = bool(nonzero.numel()) and float(nonzero.max()) > 1e12 * float(nonzero.min())
    E = domain_tangent(domain, A, 100)
    rank_deficient = "rank" in fam or "zero" in fam
    if name in ("pinv", "lstsq") and rank_deficient:  # constant rank: the derivative pinv is defined by
        X, Y = randn(A.shape[-2], A.shape[-2], seed=102, dtype=A.dtype), randn(A.shape[-1], A.shape[-1], seed=103, dtype=A.dtype)
        E = X @ A + A @ Y
    Wm = weights(A.shape[-2:], 91, A.dtype) if mp_ref is not None and mp_ref[0] == "matrix" else None
    if mp_ref is not None and mp_ref[0] == "matrix" and name in ("expm", "matrix_exp", "logm", "sqrtm", "logm spd",
                                                                   "sqrtm psd", "powm", "inv"):
        pass

    def reference_derivative(E):
        if mp_ref is not None:
            return mp_directional(mp_ref, A, E, W=Wm)
        if graded:  # differences lose every digit: torch's derivative of the reference (distinct values)
            return float(torch.func.jvp(ref, (A,), (E,))[1])
        return float(fd(ref, A, E))

    def finite(x):
        if not math.isfinite(x):
            raise _Unverified("the reference is not finite")
        return x

    def t_value():
        got = loss(A)
        try:
            want = ref(A)
        except Exception as exc:  # noqa: BLE001 - the reference refuses the input (torch's cholesky of a graded A)
            raise _Unverified(f"the reference raised {type(exc).__name__}") from None
        if not bool(torch.isfinite(torch.as_tensor(want)).all()):
            raise _Unverified("the reference is not finite")
        close(got, want, rtol, "value")

    def floor():
        """What a derivative of zero comes out as: rounding of the function's size over a unit step."""
        with torch.no_grad():
            try:
                eps = torch.finfo(real_dtype).eps
                return 1e6 * eps * max(abs(float(ref(A + E))), abs(float(ref(A - E))), abs(float(ref(A))))
            except Exception:  # noqa: BLE001
                return 0.0

    def t_grad():
        g = torch.func.grad(loss)(A)
        got = float(torch.real((g.conj() * E).sum()))
        close(got, finite(reference_derivative(E)), rtol * 10, "grad", floor())

    def t_jvp():
        got = float(torch.func.jvp(loss, (A,), (E,))[1])
        close(got, finite(reference_derivative(E)), rtol * 10, "jvp", floor())

    def t_vmap():
        B = torch.stack([A, A + 0.01 * E])
        got = torch.func.vmap(torch.func.grad(loss))(B)
        want = torch.stack([torch.func.grad(loss)(b) for b in B])
        close(torch.view_as_real(got) if got.is_complex() else got,
              torch.view_as_real(want) if want.is_complex() else want, rtol, "vmap(grad)")

    def t_hessian():
        F = domain_tangent(domain, A, 101)
        if name in ("pinv", "lstsq") and rank_deficient:
            F = randn(A.shape[-2], A.shape[-2], seed=104, dtype=A.dtype) @ A
        got = torch.func.vjp(torch.func.grad(loss), A)[1](F)[0]  # reverse over reverse
        got = float(torch.real((got.conj() * E).sum()))
        if mp_ref is not None:
            want = mp_directional(mp_ref, A, E, F, W=Wm)
        else:  # the second central difference of the reference's values along E and F
            h = 1e-3 * (float(A.abs().max()) or 1.0) / max(float(E.abs().max()), float(F.abs().max()))

            def second(h):
                with torch.no_grad():
                    return float((ref(A + h * E + h * F) - ref(A + h * E - h * F) - ref(A - h * E + h * F)
                                  + ref(A - h * E - h * F)) / (4 * h * h))
            want = (4 * second(h / 2) - second(h)) / 3
        close(got, finite(want), 1e-4 if mp_ref is None else 1e-8, "hessian", floor())

    def t_compile():
        torch._dynamo.reset()
        compiled = torch.compile(loss, backend="aot_eager")
        a1, a2 = A.clone().requires_grad_(), A.clone().requires_grad_()
        v1, v2 = compiled(a1), loss(a2)
        g1, = torch.autograd.grad(v1, a1)
        g2, = torch.autograd.grad(v2, a2)
        close(v1.detach(), v2.detach(), rtol, "compile value")
        close(torch.view_as_real(g1) if g1.is_complex() else g1, torch.view_as_real(g2) if g2.is_complex() else g2,
              rtol * 10, "compile grad")

    tests = {"value": t_value, "grad": t_grad, "jvp": t_jvp, "vmap": t_vmap}
    if real_dtype == D and (not graded or mp_ref is not None):
        tests["hessian"] = t_hessian
    if not quick:
        tests["compile"] = t_compile
    return tests


#: every clear error the sweep met: ``(function, family, dtype, transform, message)`` (``--raised`` prints them)
RAISED: list = []


def run(quick=False, only=None):
    counts: dict[str, dict[str, int]] = {}
    problems = []
    raised = RAISED
    dtypes = [D] if quick else [D, torch.float32, C]
    for dtype in dtypes:
        for name, (domain, loss, ref, *mp) in funcs(dtype).items():
            if only and name not in only:
                continue
            if dtype.is_complex and name in ("eigvals", "eig", "det", "slogdet"):
                pass
            for fam, A in families(domain, dtype).items():
                if dtype == torch.float32 and "graded" in fam:
                    continue
                if name in ("svd full",) and "square" in fam:
                    continue
                for tname, test in transforms(name, domain, loss, ref, mp[0] if mp else None, A, dtype, quick,
                                              fam).items():
                    c = counts.setdefault(name, {"tried": 0, "held": 0, "raised": 0, "unverified": 0, "WRONG": 0,
                                                 "CRASH": 0})
                    c["tried"] += 1
                    try:
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            test()
                        c["held"] += 1
                    except _Unverified:
                        c["unverified"] += 1
                    except _Wrong as exc:
                        c["WRONG"] += 1
                        problems.append(("WRONG", name, fam, str(dtype).split(".")[-1], tname, str(exc)[:200]))
                    except Exception as exc:  # noqa: BLE001 - the sweep classifies every outcome
                        if _clear(exc):
                            c["raised"] += 1
                            raised.append((name, fam, str(dtype).split(".")[-1], tname, f"{type(exc).__name__}: {str(exc)[:150]}"))
                        else:
                            c["CRASH"] += 1
                            problems.append(("CRASH", name, fam, str(dtype).split(".")[-1], tname,
                                             f"{type(exc).__name__}: {str(exc)[:200]}"))
    return counts, problems


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", nargs="*")
    p.add_argument("--raised", action="store_true", help="also list every clear error")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    counts, problems = run(args.quick, args.only)
    keys = ("tried", "held", "raised", "unverified", "WRONG", "CRASH")
    total = {k: sum(c[k] for c in counts.values()) for k in keys}
    print(f"{'function':18s}" + "".join(f" {k:>10s}" for k in keys))
    for name, c in [*counts.items(), ("total", total)]:
        print(f"{name:18s}" + "".join(f" {c[k]:10d}" for k in keys))
    print(f"({time.perf_counter() - t0:.0f} s)")
    for prob in problems:
        print(" | ".join(prob))
    if args.raised:
        for r in RAISED:
            print("raised | " + " | ".join(r))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""The adversarial sweep of ``benchmarks/sweep_routes.py`` for ``adjointgen.jax``.

The same input families and gauge-invariant losses, on ``jax.numpy`` arrays (float64 with x64 on),
through ``grad``, ``jvp``, ``vmap(grad)``, ``jit(grad)`` and reverse over reverse
(``jax.hessian``-vector products), against ``jax.numpy.linalg`` / ``jax.scipy.linalg``, central
differences, or 200-digit mpmath where the function has one.  Each case is held, raised (a
``ValueError`` naming the problem, or NaN under ``jit`` where the concrete call raises), or
WRONG/CRASH.  ``python benchmarks/sweep_routes_jax.py`` prints the counts and every WRONG/CRASH.
"""
from __future__ import annotations

import math
import os
import sys
import time
import warnings

os.environ.setdefault("JAX_ENABLE_X64", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import mpmath  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import adjointgen  # noqa: E402
import adjointgen.jax as agj  # noqa: E402
from sweep_routes import families, mp_directional, weights, _Unverified, _Wrong  # noqa: E402

jax.config.update("jax_enable_x64", True)


def J(x):
    return jnp.asarray(x.numpy() if isinstance(x, torch.Tensor) else x)


def W(shape, seed=91):
    return J(weights(shape, seed, torch.float64))


def wsum(X, seed=91):
    return jnp.real(jnp.sum(jnp.conj(W(X.shape[-2:], seed).astype(X.dtype)) * X))


def sym_values(w):
    return jnp.sum(w ** 2) + jnp.sum(w ** 3) / 7


def spectral(U, d, Vh=None):
    f = jnp.sin(d).astype(U.dtype)
    return (U * f[..., None, :]) @ (jnp.conj(jnp.swapaxes(U, -1, -2)) if Vh is None else Vh)


F = {
    "eigh": ("hermitian", lambda A: (lambda w, V: sym_values(w) + wsum(spectral(V, w)))(*agj.eigh(A)),
             lambda A: (lambda w, V: sym_values(w) + wsum(spectral(V, w)))(*jnp.linalg.eigh(A)), None),
    "eigvalsh": ("hermitian", lambda A: sym_values(agj.eigvalsh(A)), lambda A: sym_values(jnp.linalg.eigvalsh(A)), None),
    "svd": ("rect", lambda A: (lambda U, S, Vh: sym_values(S ** 2) + wsum(spectral(U, S, Vh)))(
        *agj.svd(A, full_matrices=False)),
        lambda A: (lambda U, S, Vh: sym_values(S ** 2) + wsum(spectral(U, S, Vh)))(*jnp.linalg.svd(A, full_matrices=False)),
        None),
    "qr": ("rect", lambda A: (lambda Q, R: wsum(Q) + wsum(R, 93))(*agj.qr(A)),
           lambda A: (lambda Q, R: wsum(Q) + wsum(R, 93))(*jnp.linalg.qr(A)), None),
    "cholesky": ("spd", lambda A: wsum(agj.cholesky(A)), lambda A: wsum(jnp.linalg.cholesky(A)), None),
    "inv": ("nonsingular", lambda A: wsum(agj.inv(A)), lambda A: wsum(jnp.linalg.inv(A)), ("matrix", mpmath.inverse)),
    "solve": ("nonsingular", lambda A: wsum(agj.solve(A, W((4, 2), 94))), lambda A: wsum(jnp.linalg.solve(A, W((4, 2), 94))),
              None),
    "det": ("general", lambda A: jnp.real(agj.det(A)), lambda A: jnp.real(jnp.linalg.det(A)), ("scalar", mpmath.det)),
    "slogdet": ("nonsingular", lambda A: agj.slogdet(A)[1], lambda A: jnp.linalg.slogdet(A)[1],
                ("scalar", lambda M: mpmath.log(abs(mpmath.det(M))))),
    "pinv": ("rect", lambda A: wsum(agj.pinv(A)), lambda A: wsum(jnp.linalg.pinv(A)), None),
    "expm": ("general", lambda A: wsum(agj.expm(A)), lambda A: wsum(jax.scipy.linalg.expm(A)), ("matrix", mpmath.expm)),
    "logm": ("positive", lambda A: wsum(agj.logm(A)), None, ("matrix", mpmath.logm)),
    "sqrtm": ("positive", lambda A: wsum(agj.sqrtm(A)), None, ("matrix", mpmath.sqrtm)),
    "eigvals": ("general", lambda A: jnp.sum(jnp.real(agj.eigvals(A)) ** 2), None,
                ("scalar", lambda M: sum(mpmath.re(x) ** 2 for x in mpmath.eig(M)[0]))),
}


def close(got, want, rtol, what, atol=0.0):
    got, want = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
    if not np.all(np.isfinite(want)):
        raise _Unverified(f"{what}: the reference is not finite")
    if not np.all(np.isfinite(got)):
        if np.all(np.isfinite(want)):
            raise _Wrong(f"{what}: not finite")
        return
    err = float(np.max(np.abs(got - want)))
    size = float(np.max(np.abs(want)))
    if not err <= rtol * max(size, 1e-300) + atol + 1e-300:
        raise _Wrong(f"{what}: {got.ravel()[:3]} vs {want.ravel()[:3]} (error {err:.2e}, size {size:.2e})")


def fd(f, A, E, h=None):
    scale = float(jnp.max(jnp.abs(A))) or 1.0
    h = h or 1e-3 * scale / max(float(jnp.max(jnp.abs(E))), 1e-300)
    d1 = (f(A + h * E) - f(A - h * E)) / (2 * h)
    d2 = (f(A + h / 2 * E) - f(A - h / 2 * E)) / h
    return (4 * d2 - d1) / 3


def cases(name, domain, loss, ref, mp_ref, At):
    A = J(At)
    nonzero = np.abs(np.asarray(A))[np.asarray(A) != 0]
    graded = bool(nonzero.size) and nonzero.max() / 1e12 > nonzero.min()
    E = J(torch.randn(At.shape, dtype=At.dtype, generator=torch.Generator().manual_seed(100)))
    if domain in ("hermitian", "spd", "psd"):
        E = (E + jnp.conj(E.T)) / 2
    E = E * (float(jnp.max(jnp.abs(A))) or 1.0)

    def derivative(E):
        if mp_ref is not None:
            return mp_directional(mp_ref, At, torch.from_numpy(np.asarray(E)), W=torch.from_numpy(np.asarray(W(At.shape))))
        if graded or ref is None:
            raise _Unverified("no reference at this input")
        return float(fd(ref, A, E))

    def floor():
        try:
            return 1e-10 * max(abs(float(loss(A + E))), abs(float(loss(A - E))), abs(float(loss(A))))
        except Exception:  # noqa: BLE001
            return 0.0

    def t_value():
        got = loss(A)
        if ref is None:
            raise _Unverified("no reference value")
        close(got, ref(A), 1e-6, "value")

    def t_grad():
        g = jax.grad(loss)(A)
        got = float(jnp.real(jnp.sum(jnp.conj(g) * E)))
        close(got, derivative(E), 1e-5, "grad", floor())

    def t_jit_grad():
        g = jax.jit(jax.grad(loss))(A)
        want = jax.grad(loss)(A)
        close(np.abs(np.asarray(g)), np.abs(np.asarray(want)), 1e-9, "jit(grad)", floor())

    def t_jvp():
        got = float(jax.jvp(loss, (A,), (E,))[1])
        close(got, derivative(E), 1e-5, "jvp", floor())

    def t_vmap():
        B = jnp.stack([A, A + 0.01 * E])
        got = jax.vmap(jax.grad(loss))(B)
        want = jnp.stack([jax.grad(loss)(b) for b in B])
        close(np.abs(np.asarray(got)), np.abs(np.asarray(want)), 1e-9, "vmap(grad)")

    def t_hessian():
        Fd = E * 0.5 + jnp.flip(E, -1)
        if domain in ("hermitian", "spd", "psd"):
            Fd = (Fd + jnp.conj(Fd.T)) / 2
        _, hvp = jax.jvp(jax.grad(loss), (A,), (Fd,))  # forward over reverse (JAX's only second order)
        got = float(jnp.real(jnp.sum(jnp.conj(hvp) * E)))
        if mp_ref is not None:
            want = mp_directional(mp_ref, At, torch.from_numpy(np.asarray(E)), torch.from_numpy(np.asarray(Fd)),
                                  W=torch.from_numpy(np.asarray(W(At.shape))))
        elif ref is not None and not graded:
            gref = lambda X: jnp.real(jnp.sum(jnp.conj(jax.grad(ref)(X)) * Fd))  # noqa: E731
            want = float(fd(gref, A, E, h=1e-4 * (float(jnp.max(jnp.abs(A))) or 1.0) / float(jnp.max(jnp.abs(E)))))
        else:
            raise _Unverified("no reference")
        close(got, want, 1e-4, "hessian", floor())

    out = {"value": t_value, "grad": t_grad, "jit(grad)": t_jit_grad, "jvp": t_jvp, "vmap": t_vmap}
    if not graded or mp_ref is not None:
        out["hessian"] = t_hessian
    return out


def run():
    counts, problems = {}, []
    for name, (domain, loss, ref, mp_ref) in F.items():
        for fam, At in families(domain, torch.float64).items():
            for tname, test in cases(name, domain, loss, ref, mp_ref, At).items():
                c = counts.setdefault(name, dict.fromkeys(("tried", "held", "raised", "unverified", "WRONG", "CRASH"), 0))
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
                    problems.append(("WRONG", name, fam, tname, str(exc)[:200]))
                except (ValueError, adjointgen.GaugeDependentLossError, adjointgen.SingularMatrixError):
                    c["raised"] += 1
                except Exception as exc:  # noqa: BLE001 - classified
                    c["CRASH"] += 1
                    problems.append(("CRASH", name, fam, tname, f"{type(exc).__name__}: {str(exc)[:200]}"))
    return counts, problems


def main():
    t0 = time.perf_counter()
    counts, problems = run()
    keys = ("tried", "held", "raised", "unverified", "WRONG", "CRASH")
    total = {k: sum(c[k] for c in counts.values()) for k in keys}
    print(f"{'function':14s}" + "".join(f" {k:>10s}" for k in keys))
    for name, c in [*counts.items(), ("total", total)]:
        print(f"{name:14s}" + "".join(f" {c[k]:10d}" for k in keys))
    print(f"({time.perf_counter() - t0:.0f} s)")
    for p in problems:
        print(" | ".join(p))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

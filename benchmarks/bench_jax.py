"""The generated JAX functions vs their jax.numpy / jax.scipy / jax.lax namesakes: jitted forward +
backward (``jax.grad`` of a loss that uses every output), float64; the fastest of alternating runs of
each (robust to a shared machine's load); ratios in one run, below 1.0: faster.

    python benchmarks/bench_jax.py [--quick] [--only eigh,svd,...]

Every function agj provides as a drop-in: ``eigh``, ``svd``, ``cholesky``, ``expm``, ``qr``, ``lu``
(``jax.scipy.linalg.lu``), ``det``, ``slogdet``, ``inv``, ``solve`` (8 right-hand sides),
``solve_triangular``, ``pinv``, ``lstsq`` (tall, 8 right-hand sides), ``eigvals`` and ``eig``
(``jax.lax.linalg.eig`` with ``enable_eigvec_derivs``, a loss of ``|V|``).  Skipped (no rows) where
JAX is not installed.  ``expm`` is the general-matrix exponential (``derivations/matrix_exp.py``)
against ``jax.scipy.linalg.expm``, of a matrix with spectral radius about 1.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _timing import table  # noqa: E402


def interleaved(ours, theirs, repeats):
    """The fastest of ``repeats`` runs of each, alternating (after a warm-up of each): on a shared
    machine the minimum is the run least disturbed, and alternating exposes both to the same load."""
    import time

    ours(), theirs()
    best = [float("inf"), float("inf")]
    for _ in range(repeats):
        for i, fn in enumerate((ours, theirs)):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", default="", help="comma-separated functions (default: all)")
    args = p.parse_args(argv)
    only = {x for x in args.only.split(",") if x}
    try:
        import jax
    except ImportError:
        print("jax is not installed: no JAX benchmark")
        return []
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import jax.scipy.linalg as jsl
    import numpy as np

    import adjointgen.jax as agj

    sizes = [64] if args.quick else [256, 512]
    rows, results = [], []
    for n in sizes:
        rng = np.random.default_rng(n)
        M = rng.standard_normal((n, n))
        H = jnp.asarray(M + M.T)
        S = jnp.asarray(M @ M.T / n + np.eye(n))
        W = jnp.asarray(rng.standard_normal((n, n)))
        cases = {
            "eigh": (lambda A: sum(jnp.sum(o * w) for o, w in zip(agj.eigh(A), (W[0], W))),
                     lambda A: sum(jnp.sum(o * w) for o, w in zip(jnp.linalg.eigh(A), (W[0], W))), H),
            "svd": (lambda A: sum(jnp.sum(o * w) for o, w in zip(agj.svd(A), (W, W[0], W))),
                    lambda A: sum(jnp.sum(o * w) for o, w in zip(jnp.linalg.svd(A, full_matrices=False), (W, W[0], W))),
                    jnp.asarray(M)),
            "cholesky": (lambda A: jnp.sum(agj.cholesky(A) * W), lambda A: jnp.sum(jnp.linalg.cholesky(A) * W), S),
            "expm": (lambda A: jnp.sum(agj.expm(A) * W), lambda A: jnp.sum(jsl.expm(A) * W), jnp.asarray(M / n ** 0.5)),
            "qr": (lambda A: sum(jnp.sum(o * w) for o, w in zip(agj.qr(A), (W[:, :n // 2], W[:n // 2, :n // 2]))),
                   lambda A: sum(jnp.sum(o * w) for o, w in zip(jnp.linalg.qr(A), (W[:, :n // 2], W[:n // 2, :n // 2]))),
                   jnp.asarray(M[:, :n // 2])),
            "lu": (lambda A: sum(jnp.sum(o * W) for o in agj.lu(A)[1:]), lambda A: sum(jnp.sum(o * W) for o in jsl.lu(A)[1:]),
                   jnp.asarray(M)),
            "det": (lambda A: agj.det(A), lambda A: jnp.linalg.det(A), jnp.asarray(M / n ** 0.5 + np.eye(n))),
            "slogdet": (lambda A: agj.slogdet(A)[1], lambda A: jnp.linalg.slogdet(A)[1], jnp.asarray(M)),
            "inv": (lambda A: jnp.sum(agj.inv(A) * W), lambda A: jnp.sum(jnp.linalg.inv(A) * W), jnp.asarray(M)),
            "solve": (lambda A: jnp.sum(agj.solve(A, W[:, :8]) * W[:, 8:16]),
                      lambda A: jnp.sum(jnp.linalg.solve(A, W[:, :8]) * W[:, 8:16]), jnp.asarray(M)),
            "solve_triangular": (lambda A: jnp.sum(agj.solve_triangular(A, W[:, :8], lower=True) * W[:, 8:16]),
                                 lambda A: jnp.sum(jsl.solve_triangular(A, W[:, :8], lower=True) * W[:, 8:16]),
                                 jnp.asarray(np.tril(M) + n * np.eye(n))),
            "pinv": (lambda A: jnp.sum(agj.pinv(A) * W[:n // 2]), lambda A: jnp.sum(jnp.linalg.pinv(A) * W[:n // 2]),
                     jnp.asarray(M[:, :n // 2])),
            "lstsq": (lambda A: jnp.sum(agj.lstsq(A, W[:, :8])[0] * W[:n // 2, 8:16]),
                      lambda A: jnp.sum(jnp.linalg.lstsq(A, W[:, :8])[0] * W[:n // 2, 8:16]), jnp.asarray(M[:, :n // 2])),
            "eigvals": (lambda A: jnp.sum(jnp.abs(agj.eigvals(A)) ** 2), lambda A: jnp.sum(jnp.abs(jnp.linalg.eigvals(A)) ** 2),
                        jnp.asarray(M)),
            "eig": (lambda A: jnp.sum(jnp.abs(agj.lax.eig(A, compute_left_eigenvectors=False, enable_eigvec_derivs=True)[1]) * W),
                    lambda A: jnp.sum(jnp.abs(jax.lax.linalg.eig(A, compute_left_eigenvectors=False,
                                                                  enable_eigvec_derivs=True)[1]) * W), jnp.asarray(M)),
        }
        for name, (ours, theirs, X) in cases.items():
            if only and name not in only:
                continue
            f_ours, f_theirs = jax.jit(jax.grad(ours)), jax.jit(jax.grad(theirs))
            t_gen, t_ref = interleaved(lambda: f_ours(X).block_until_ready(), lambda: f_theirs(X).block_until_ready(),
                                       repeats=5 if args.quick else 15)
            rows.append((name, n, f"{t_gen * 1e3:.2f}", f"{t_ref * 1e3:.2f}", f"{t_gen / t_ref:.2f}"))
            results.append({"benchmark": "jax", "case": f"{name} jit fwd+bwd n={n} float64", "ratio": t_gen / t_ref,
                            "anchor": "jax.numpy.linalg", "target": "<= 1.0"})
    print(f"JAX {jax.__version__} on {jax.devices()[0].platform}, ms of jit(grad(loss)): the fastest of alternating runs")
    print(table(rows, ["op", "n", "adjointgen", "jnp", "ratio"]))
    return results


if __name__ == "__main__":
    main()

"""The generated JAX functions vs their jax.numpy namesakes: jitted forward + backward (``jax.grad``
of a loss that uses every output), float64; ratios in one run, below 1.0: faster.

    python benchmarks/bench_jax.py [--quick]

Skipped (no rows) where JAX is not installed.  ``expm`` is the general-matrix exponential
(``derivations/matrix_exp.py``) against ``jax.scipy.linalg.expm``, of a matrix with spectral radius
about 1.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _timing import median_time, table  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
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
        }
        for name, (ours, theirs, X) in cases.items():
            f_ours, f_theirs = jax.jit(jax.grad(ours)), jax.jit(jax.grad(theirs))
            t_ref = median_time(lambda: f_theirs(X).block_until_ready())
            t_gen = median_time(lambda: f_ours(X).block_until_ready())
            rows.append((name, n, f"{t_gen * 1e3:.2f}", f"{t_ref * 1e3:.2f}", f"{t_gen / t_ref:.2f}"))
            results.append({"benchmark": "jax", "case": f"{name} jit fwd+bwd n={n} float64", "ratio": t_gen / t_ref,
                            "anchor": "jax.numpy.linalg", "target": "<= 1.0"})
    print(f"JAX {jax.__version__} on {jax.devices()[0].platform}, median ms of jit(grad(loss))")
    print(table(rows, ["op", "n", "adjointgen", "jnp", "ratio"]))
    return results


if __name__ == "__main__":
    main()

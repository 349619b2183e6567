"""Reverse mode of the generated JAX functions: the derived VJP (the JVP as a linear primitive whose
transpose is the VJP: what adjointgen.jax ships) vs JAX's transposition of the derived JVP's
operations, for eigh, svd, cholesky and expm: jit(grad) of one loss, same forward, ratios in one run.

    python benchmarks/bench_jax_rules.py [--quick]
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
    import numpy as np

    import adjointgen.jax as agj
    from adjointgen.runtime.jax import transposition

    rows, results = [], []
    for n in ([64] if args.quick else [256, 512]):
        rng = np.random.default_rng(n)
        M = rng.standard_normal((n, n))
        W = jnp.asarray(rng.standard_normal((n, n)))
        cases = {
            "eigh": (lambda A: sum(jnp.sum(o * w) for o, w in zip(agj.eigh(A), (W[0], W))), jnp.asarray(M + M.T)),
            "svd": (lambda A: sum(jnp.sum(o * w) for o, w in zip(agj.svd(A), (W, W[0], W))), jnp.asarray(M)),
            "cholesky": (lambda A: jnp.sum(agj.cholesky(A) * W), jnp.asarray(M @ M.T / n + np.eye(n))),
            "expm": (lambda A: jnp.sum(agj.expm(A) * W), jnp.asarray(M / n ** 0.5)),
        }
        for name, (loss, X) in cases.items():
            with transposition("derived"):
                derived = jax.jit(jax.grad(loss))
                derived(X).block_until_ready()
            with transposition("jax"):
                transposed = jax.jit(jax.grad(loss))
                transposed(X).block_until_ready()
            t_jax = median_time(lambda: transposed(X).block_until_ready())
            t_derived = median_time(lambda: derived(X).block_until_ready())
            rows.append((name, n, f"{t_derived * 1e3:.2f}", f"{t_jax * 1e3:.2f}", f"{t_derived / t_jax:.2f}"))
            results.append({"benchmark": "jax_rules", "case": f"{name} jit grad n={n} float64", "ratio": t_derived / t_jax,
                            "anchor": "JAX's transposition of the derived JVP", "target": "<= 1.0"})
    print(f"JAX {jax.__version__} on {jax.devices()[0].platform}, median ms of jit(grad(loss))")
    print(table(rows, ["op", "n", "derived VJP", "transposed JVP", "ratio"]))
    return results


if __name__ == "__main__":
    main()

"""custom_jvp (JAX transposes the derived JVP, what adjointgen.jax ships) vs custom_vjp (the derived
VJP) for eigh and cholesky: jit(grad) time, same loss, same forward (python benchmarks/bench_jax_rules.py)."""
import statistics
import time
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
import adjointgen.jax as agj
from adjointgen.generated.jax import eigh as E, cholesky as C

@jax.custom_vjp
def eigh_v(A):
    return tuple(jnp.linalg.eigh(A))
eigh_v.defvjp(lambda A: (eigh_v(A), eigh_v(A)), lambda res, g: (E.eigh_vjp(res[0], res[1], g[0], g[1]),))
@jax.custom_vjp
def chol_v(A):
    return jnp.linalg.cholesky(A)
chol_v.defvjp(lambda A: (chol_v(A), chol_v(A)), lambda L, g: (C.cholesky_vjp(L, g),))

def t(f, X):
    f(X).block_until_ready()
    ts = []
    for _ in range(7):
        t0 = time.perf_counter(); f(X).block_until_ready(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts)
for n in (256, 512):
    rng = np.random.default_rng(n); M = rng.standard_normal((n, n)); W = jnp.asarray(rng.standard_normal((n, n)))
    H = jnp.asarray(M + M.T); S = jnp.asarray(M @ M.T / n + np.eye(n))
    le = lambda eigh: jax.jit(jax.grad(lambda A: jnp.sum(eigh(A)[0] * W[0]) + jnp.sum(eigh(A)[1] * W)))
    lc = lambda ch: jax.jit(jax.grad(lambda A: jnp.sum(ch(A) * W)))
    with agj.errors_in_jit(False):
        a, b = t(le(agj.eigh), H), t(le(eigh_v), H)
        c, d = t(lc(agj.cholesky), S), t(lc(chol_v), S)
    print(f"n={n} eigh custom_jvp {a*1e3:.1f} ms, custom_vjp {b*1e3:.1f} ms, ratio {a/b:.2f};  cholesky custom_jvp {c*1e3:.1f} ms, custom_vjp {d*1e3:.1f} ms, ratio {c/d:.2f}")

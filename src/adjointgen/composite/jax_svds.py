"""``agj.svds``: the ``k`` largest (or smallest) singular triplets of a dense real matrix in JAX,
differentiated by the partial rules derived in ``derivations/svds.py`` (generated into
``adjointgen.generated.jax.svds``: the part of ``dU``, ``dV`` outside the kept singular subspaces from
projected shifted solves with ``A^T A``).

The forward is LAPACK's thin SVD on the host (``jax.pure_callback`` under ``jit``), of which the
``k`` wanted triplets and the next singular value (whether ``k`` cuts a cluster) are kept.
``method="device"`` runs ``jax.numpy.linalg.svd`` on the array's device instead (jittable, no host
round trip).  The
derivative is ``jax.custom_jvp`` with the derived JVP and the generated operations' gauge checks.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy

from ..generated.jax import svds as _g
from ..runtime import jax as _rt
from ..runtime.rules import Call, Residual, Rules
from ._jax_partial import check_k, cut, on_host, through_cut

_ARGS, _OPTS = ("A", "U", "S", "V"), ("cluster_rtol", "broadening")
RULES = Rules(
    op="svds",
    outputs=("gA",),
    vjp=Call(_g.svds_vjp, (*_ARGS, "gU", "gS", "gV"), _OPTS),
    jvp=Call(_g.svds_jvp, (*_ARGS, "dA"), _OPTS),
    data="A",
    vjp_checked=Call(_g.svds_vjp_checked, (*_ARGS, "gU", "gS", "gV"), _OPTS),
    residuals=(Residual("residual_clusters", ("gU", "gV"), "S", "gS", "singular values", ()),),
    broadening=True,
)


def _host(A, k: int, largest: bool):
    """``(U, S, V, next)`` per matrix of the batch: the ``k`` largest singular values descending (or
    smallest ascending), their vectors (``V`` as columns), and the next singular value (``nan`` if none)."""
    import scipy.linalg

    A = numpy.asarray(A)
    m, n = A.shape[-2:]
    r = min(m, n)
    flat = A.reshape(-1, m, n)
    U = numpy.empty((flat.shape[0], m, k), A.dtype)
    S = numpy.empty((flat.shape[0], k), A.dtype)
    V = numpy.empty((flat.shape[0], n, k), A.dtype)
    nxt = numpy.full((flat.shape[0],), numpy.nan, A.dtype)
    for b, a in enumerate(flat):
        u, s, vh = scipy.linalg.svd(a, full_matrices=False)
        order = numpy.arange(r) if largest else numpy.arange(r)[::-1]
        U[b], S[b], V[b] = u[:, order[:k]], s[order[:k]], vh[order[:k]].T
        if r > k:
            nxt[b] = s[order[k]]
    shape = A.shape[:-2]
    return U.reshape(*shape, m, k), S.reshape(*shape, k), V.reshape(*shape, n, k), nxt.reshape(shape)


def _forward(A, k, largest):
    m, n = A.shape[-2:]
    b = A.shape[:-2]
    shapes = (jax.ShapeDtypeStruct((*b, m, k), A.dtype), jax.ShapeDtypeStruct((*b, k), A.dtype),
              jax.ShapeDtypeStruct((*b, n, k), A.dtype), jax.ShapeDtypeStruct(b, A.dtype))
    return on_host(_host, shapes, A, k=k, largest=largest)


def _device(A, k, largest):
    """``(U, S, V, next)`` as :func:`_host` returns them, from the thin SVD by
    ``jax.numpy.linalg.svd`` on the array's own device: jittable, no host round trip, at the cost of
    the full thin SVD."""
    U, S, Vh = _rt.svd(A)
    V = jnp.swapaxes(Vh, -1, -2)
    if not largest:
        U, S, V = U[..., ::-1], S[..., ::-1], V[..., ::-1]
    r = S.shape[-1]
    nxt = S[..., k] if r > k else jnp.full(A.shape[:-2], jnp.nan, S.dtype)
    return U[..., :k], S[..., :k], V[..., :k], nxt


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3, 4, 5))
def _svds(A, k, largest, cluster_rtol, broadening, method="lapack"):
    if method == "device":
        return _device(A, k, largest)
    return _forward(A, k, largest)


@_svds.defjvp
def _svds_jvp(k, largest, cluster_rtol, broadening, method, primals, tangents):
    A, = primals
    dA, = tangents
    U, S, V, nxt = outputs = _svds(A, k, largest, cluster_rtol, broadening, method)
    env = dict(A=A, U=U, S=S, V=V, dA=dA, cluster_rtol=cluster_rtol, broadening=broadening)
    dU, dS, dV = through_cut("svds", k, largest, "singular value", cut(S, nxt, cluster_rtol),
                             _rt.jvp(RULES, env, ("gU", "gS", "gV")))
    return outputs, (dU, dS, dV, jnp.zeros_like(nxt))


def svds(A, k: int, *, largest: bool = True, method: str = "lapack", cluster_rtol=None, broadening=None):
    """The ``k`` largest (or smallest) singular triplets ``A ≈ U diag(S) Vh`` of real ``A``, as
    :func:`adjointgen.torch.svds` for dense ``A``.

    Args:
        A: ``(..., m, n)``, float32 or float64.
        k: ``1 <= k <= min(m, n)``.
        largest: the ``k`` largest singular values, descending; else the smallest, ascending (meant
            for well-conditioned ``A``: the rule solves with ``A^T A`` shifted by them).
        method: ``"lapack"`` (the default: LAPACK's thin SVD on the host) or ``"device"`` (the thin
            SVD by ``jax.numpy.linalg.svd`` on the array's device, the ``k`` wanted triplets kept:
            jittable with no host round trip).
        cluster_rtol, broadening: as :func:`adjointgen.jax.svd`.

    Returns:
        ``(U, S, Vh)``: ``(..., m, k)``, ``(..., k)``, ``(..., k, n)``.

    The default forward is LAPACK's thin SVD on the host (``jax.pure_callback`` under ``jit``;
    ``method="device"`` keeps it on the device); the derivatives
    are the derived partial rules, under ``jit``, ``vmap``, ``grad``, ``jvp``, ``jacfwd``, ``jacrev``,
    ``hessian``.  A loss that depends on the basis inside a kept cluster raises
    ``DegenerateSubspaceError`` (NaN under ``jit``); where ``k`` cuts a cluster every derivative does.

    Raises:
        TypeError: not a real floating array.
        ValueError: not a matrix, NaN/Inf, ``k`` out of range.
    """
    A, = _rt.inputs("svds", (("A", A),), square=(False,), complex_ok=False)
    k = check_k("svds", k, min(A.shape[-2:]), "min(m, n)")
    if method not in ("lapack", "device"):
        raise ValueError(f"svds: method must be 'lapack' or 'device', got {method!r}")
    U, S, V, _ = _svds(A, k, bool(largest), cluster_rtol, broadening, method)
    return U, S, jnp.swapaxes(V, -1, -2)

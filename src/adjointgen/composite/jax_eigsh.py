"""``agj.eigsh``: the ``k`` extreme eigenpairs of a dense Hermitian matrix in JAX, differentiated by
the partial rules derived in ``derivations/eigsh.py`` (generated into ``adjointgen.generated.jax.eigsh``).

The forward is LAPACK's subset solver (``scipy.linalg.eigh(subset_by_index=...)``, the route torch's
``agt.eigsh`` falls back to) on the host, through ``jax.pure_callback`` under ``jit``: it computes the
``k`` wanted pairs and one more eigenvalue, which tells whether ``k`` cuts a cluster of equal
eigenvalues.  ``method="device"`` computes the whole decomposition with ``jax.numpy.linalg.eigh`` on
the array's device instead (jittable, no host round trip), ``method="lobpcg"`` JAX's LOBPCG.  The
derivative is ``jax.custom_jvp`` with the derived JVP -- the part of ``dV``
outside the kept eigenspace from projected shifted solves -- and reverse mode is its transposition,
with the same gauge checks as the generated operations (:func:`adjointgen.runtime.jax.jvp`).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy

from ..generated.jax import eigsh as _g
from ..generated.jax import eigsh_generalized as _gg
from ..runtime import jax as _rt
from ..runtime.rules import Call, Residual, Rules
from ._jax_partial import check_k, cut, on_host, through_cut

_ARGS, _OPTS = ("A", "w", "V"), ("cluster_rtol", "broadening")
RULES = Rules(
    op="eigsh",
    outputs=("gA",),
    vjp=Call(_g.eigsh_vjp, (*_ARGS, "gw", "gV"), _OPTS),
    jvp=Call(_g.eigsh_jvp, (*_ARGS, "dA"), _OPTS),
    data="A",
    vjp_checked=Call(_g.eigsh_vjp_checked, (*_ARGS, "gw", "gV"), _OPTS),
    residuals=(Residual("residual_clusters", ("gV",), "w", "gw", "eigenvalues", ()),),
    vjp_complex=Call(_g.eigsh_vjp_complex, (*_ARGS, "gw", "gV"), _OPTS),
    jvp_complex=Call(_g.eigsh_jvp_complex, (*_ARGS, "dA"), _OPTS),
    vjp_complex_checked=Call(_g.eigsh_vjp_complex_checked, (*_ARGS, "gw", "gV"), _OPTS),
    residuals_complex=(Residual("residual", ("gV",)), Residual("residual_clusters", ("gV",), "w", "gw", "eigenvalues", ())),
    broadening=True,
)


_GARGS = ("A", "B", "w", "V")
RULES_GENERALIZED = Rules(
    op="eigsh",
    outputs=("gA", "gB"),
    vjp=Call(_gg.eigsh_generalized_vjp, (*_GARGS, "gw", "gV"), _OPTS),
    jvp=Call(_gg.eigsh_generalized_jvp, (*_GARGS, "dA", "dB"), _OPTS),
    data="A",
    vjp_checked=Call(_gg.eigsh_generalized_vjp_checked, (*_GARGS, "gw", "gV"), _OPTS),
    residuals=(Residual("residual_clusters", ("gV",), "w", "gw", "eigenvalues", ()),),
    vjp_complex=Call(_gg.eigsh_generalized_vjp_complex, (*_GARGS, "gw", "gV"), _OPTS),
    jvp_complex=Call(_gg.eigsh_generalized_jvp_complex, (*_GARGS, "dA", "dB"), _OPTS),
    vjp_complex_checked=Call(_gg.eigsh_generalized_vjp_complex_checked, (*_GARGS, "gw", "gV"), _OPTS),
    residuals_complex=(Residual("residual", ("gV",)), Residual("residual_clusters", ("gV",), "w", "gw", "eigenvalues", ())),
    broadening=True,
)


def _host(A, k: int, largest: bool, B=None):
    """``(w, V, next)`` for each matrix of the batch: the ``k`` largest eigenvalues descending (or
    smallest ascending), their eigenvectors, and the next eigenvalue beyond them (``nan`` if none)."""
    import scipy.linalg

    A = numpy.asarray(A)
    n = A.shape[-1]
    flat = A.reshape(-1, n, n)
    flat_b = None if B is None else numpy.broadcast_to(numpy.asarray(B), A.shape).reshape(-1, n, n)
    real = numpy.empty((), A.dtype).real.dtype
    w = numpy.empty((flat.shape[0], k), real)
    V = numpy.empty((flat.shape[0], n, k), A.dtype)
    nxt = numpy.full((flat.shape[0],), numpy.nan, real)
    m = min(k + 1, n)
    for b, a in enumerate(flat):
        lo, hi = (n - m, n - 1) if largest else (0, m - 1)
        try:
            vals, vecs = scipy.linalg.eigh(a, None if flat_b is None else flat_b[b], subset_by_index=[lo, hi]) \
                if n else (numpy.zeros(0), numpy.zeros((0, 0)))
        except numpy.linalg.LinAlgError as exc:  # B not positive definite (a Cholesky factorization failed)
            raise ValueError(f"eigsh: B is not positive definite (batch element {b}): {exc}") from None
        if largest:
            vals, vecs = vals[::-1], vecs[:, ::-1]
        w[b], V[b] = vals[:k], vecs[:, :k]
        if m > k:
            nxt[b] = vals[k]
    shape = A.shape[:-2]
    return w.reshape(*shape, k), V.reshape(*shape, n, k), nxt.reshape(shape)


def _forward(A, k, largest, B=None):
    n = A.shape[-1]
    real = jnp.finfo(A.dtype).dtype
    shapes = (jax.ShapeDtypeStruct((*A.shape[:-2], k), real), jax.ShapeDtypeStruct((*A.shape[:-2], n, k), A.dtype),
              jax.ShapeDtypeStruct(A.shape[:-2], real))
    if B is None:
        return on_host(_host, shapes, A, k=k, largest=largest)
    # one array to the host: A and B stacked (pure_callback's vmap expands both alike)
    out = on_host(lambda AB, k, largest: _host(AB[..., 0, :, :], k, largest, AB[..., 1, :, :]), shapes,
                  jnp.stack([A, B], axis=-3), k=k, largest=largest)
    return out


def _device(A, k, largest, B=None):
    """``(w, V, next)`` as :func:`_host` returns them, from the whole decomposition by
    ``jax.numpy.linalg.eigh`` (with ``B``: through its Cholesky factor) on the array's own device:
    jittable, no host round trip, at the cost of the full decomposition.  A ``B`` that is not
    positive definite gives NaN (a ``ValueError`` where the values are concrete)."""
    w, V = _rt.eigh(A) if B is None else _rt.eigh_generalized(A, B)
    if B is not None:
        _rt.check_finite_outputs("eigsh", "B is not positive definite (its Cholesky factorization failed)", w)
    if largest:
        w, V = w[..., ::-1], V[..., ::-1]
    n = A.shape[-1]
    nxt = w[..., k] if n > k else jnp.full(A.shape[:-2], jnp.nan, w.dtype)
    return w[..., :k], V[..., :k], nxt


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4, 5, 6))
def _eigsh_generalized(A, B, k, largest, cluster_rtol, broadening, method="lapack"):
    if method == "device":
        return _device(A, k, largest, B)
    return _forward(A, k, largest, B)


@_eigsh_generalized.defjvp
def _eigsh_generalized_jvp(k, largest, cluster_rtol, broadening, method, primals, tangents):
    A, B = primals
    dA, dB = tangents
    w, V, nxt = outputs = _eigsh_generalized(A, B, k, largest, cluster_rtol, broadening, method)
    env = dict(A=A, B=B, w=w, V=V, dA=dA, dB=dB, cluster_rtol=cluster_rtol, broadening=broadening)
    dw, dV = through_cut("eigsh", k, largest, "eigenvalue", cut(w, nxt, cluster_rtol),
                         _rt.jvp(RULES_GENERALIZED, env, ("gw", "gV")))
    return outputs, (dw, dV, jnp.zeros_like(nxt))


def _lobpcg(A, k, largest, maxiter):
    """``(w, V, next)`` as :func:`_host` returns them, by ``jax.experimental.sparse.linalg.lobpcg_standard``
    on the device, jittable (``k + 1`` pairs: the last tells whether ``k`` cuts a cluster).  Pairs
    whose residual ``|A v - w v|`` exceeds LOBPCG's own criterion ``10 n eps (|w| + |A v|)`` after
    ``maxiter`` iterations: a :class:`~adjointgen.runtime.errors.ConvergenceError` where the values are
    concrete, NaN in that batch element's outputs where they are traced."""
    from jax.experimental.sparse.linalg import lobpcg_standard

    from ..runtime.errors import ConvergenceError

    n = A.shape[-1]
    m = k + 1
    if 5 * m >= n:
        raise ValueError(f"eigsh: method='lobpcg' needs 5 (k + 1) < n (JAX's LOBPCG), got k = {k}, n = {n}; "
                         "use method='lapack'")
    if jnp.iscomplexobj(A):
        raise TypeError("eigsh: method='lobpcg' takes real A (JAX's LOBPCG fails on complex input); use "
                        "method='lapack'")
    X0 = jax.random.normal(jax.random.PRNGKey(0), (n, m), dtype=A.dtype)
    eps = float(jnp.finfo(A.dtype).eps)

    def one(a):
        theta, U, _ = lobpcg_standard(a if largest else -a, X0, m=maxiter)
        theta = theta if largest else -theta
        AU = a @ U
        residual = jnp.linalg.norm(AU - U * theta, axis=0)
        bound = 10 * n * eps * (jnp.abs(theta) + jnp.linalg.norm(AU, axis=0))
        return theta[:k], U[:, :k], theta[k], jnp.max((residual / bound)[:k])

    flat = A.reshape(-1, n, n)
    w, V, nxt, excess = jax.vmap(one)(flat)
    batch = A.shape[:-2]
    w, V, nxt, excess = w.reshape(*batch, k), V.reshape(*batch, n, k), nxt.reshape(batch), excess.reshape(batch)
    if _rt.is_concrete(excess):
        if excess.size and not bool(jnp.all(excess <= 1)):
            raise ConvergenceError("eigsh: LOBPCG did not converge within maxiter iterations "
                                   f"(residual {float(jnp.max(excess)):.3g} times its bound); raise maxiter= or use "
                                   "method='lapack'", method="lobpcg", residual=float(jnp.max(excess)), tol=1.0,
                                   iterations=maxiter)
        return w, V, nxt
    bad = ~(excess <= 1)
    return jnp.where(bad[..., None], jnp.nan, w), jnp.where(bad[..., None, None], jnp.nan, V), nxt


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3, 4, 5, 6))
def _eigsh(A, k, largest, cluster_rtol, broadening, method="lapack", maxiter=None):
    if method == "lobpcg":
        return _lobpcg(A, k, largest, 500 if maxiter is None else int(maxiter))
    if method == "device":
        return _device(A, k, largest)
    return _forward(A, k, largest)


@_eigsh.defjvp
def _eigsh_jvp(k, largest, cluster_rtol, broadening, method, maxiter, primals, tangents):
    A, = primals
    dA, = tangents
    w, V, nxt = outputs = _eigsh(A, k, largest, cluster_rtol, broadening, method, maxiter)
    env = dict(A=A, w=w, V=V, dA=dA, cluster_rtol=cluster_rtol, broadening=broadening)
    dw, dV = through_cut("eigsh", k, largest, "eigenvalue", cut(w, nxt, cluster_rtol),
                         _rt.jvp(RULES, env, ("gw", "gV")))
    return outputs, (dw, dV, jnp.zeros_like(nxt))


def eigsh(A, k: int, B=None, *, largest: bool = True, method: str = "lapack", maxiter=None, cluster_rtol=None,
          broadening=None):
    """The ``k`` largest (or smallest) eigenpairs of Hermitian ``A`` (with ``B``: of ``A v = w B v``,
    ``V^H B V = I``), as :func:`adjointgen.torch.eigsh` for dense ``A``.

    Args:
        A: symmetric (Hermitian) ``(..., n, n)``, float32/float64 or complex64/complex128; its Hermitian
            part is used, as ``jax.numpy.linalg.eigh`` does.
        k: ``1 <= k <= n``.
        B: optional Hermitian positive definite ``(..., n, n)`` (the generalized problem, differentiated
            in ``A`` and ``B`` by ``derivations/eigsh_generalized.py``).
        largest: the ``k`` largest eigenvalues, descending; else the smallest, ascending.
        method: ``"lapack"`` (the default: LAPACK's subset solver on the host, any ``k``, real or
            complex, with or without ``B``); ``"device"`` (the whole decomposition by
            ``jax.numpy.linalg.eigh`` on the array's device, the ``k`` wanted pairs kept: jittable
            with no host round trip, any ``k``, real or complex, with or without ``B``, at the cost
            of the full ``eigh``); or ``"lobpcg"`` (``jax.experimental.sparse.linalg.lobpcg_standard``
            on the device: jittable with no host round trip, cheaper than the full ``eigh`` for
            small ``k``; real ``A`` without ``B``, ``5 (k + 1) < n``; unconverged pairs raise
            ``ConvergenceError``, NaN under ``jit``).
        maxiter: LOBPCG's iteration limit (default 500).
        cluster_rtol, broadening: as :func:`adjointgen.jax.eigh`.

    Returns:
        ``(w, V)``: ``(..., k)`` and ``(..., n, k)``.

    The default forward runs LAPACK's subset solver on the host (``jax.pure_callback`` under ``jit``;
    on a GPU the matrix makes a round trip; ``method="device"`` keeps it on the device); the derivatives are the derived partial rules, in ``jit``,
    ``vmap``, ``grad``, ``jvp``, ``jacfwd``, ``jacrev``, ``hessian``.  A loss that depends on the basis
    inside a kept cluster raises ``DegenerateSubspaceError`` (NaN under ``jit``), as in :func:`eigh`;
    where ``k`` cuts a cluster every derivative raises (NaN under ``jit``).

    Raises:
        TypeError: not a floating or complex array.
        ValueError: wrong shape, NaN/Inf, ``k`` out of range, ``B`` not positive definite (outside
            ``jit``).
    """
    if method not in ("lapack", "lobpcg", "device"):
        raise ValueError(f"eigsh: method must be 'lapack', 'device' or 'lobpcg', got {method!r}")
    if B is not None:
        if method == "lobpcg":
            raise ValueError("eigsh: the generalized problem (B) takes method='lapack' or 'device'")
        A, B = _rt.inputs("eigsh", (("A", A), ("B", B)), square=(True, True), complex_ok=True)
        if A.shape[-1] != B.shape[-1]:
            raise ValueError(f"eigsh: A and B must have one size, got {A.shape} and {B.shape}")
        A, B = _rt.broadcast_batch(_rt.symmetrized(A), _rt.symmetrized(B))
        k = check_k("eigsh", k, A.shape[-1], "n")
        w, V, _ = _eigsh_generalized(A, B, k, bool(largest), cluster_rtol, broadening, method)
        return w, V
    A, = _rt.inputs("eigsh", (("A", A),), square=(True,), complex_ok=True)
    k = check_k("eigsh", k, A.shape[-1], "n")
    w, V, _ = _eigsh(_rt.symmetrized(A), k, bool(largest), cluster_rtol, broadening, method, maxiter)
    return w, V

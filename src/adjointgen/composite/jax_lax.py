"""``agj.lax``: the functions of ``jax.lax.linalg`` that adjointgen differentiates, with their
keyword-only signatures and results (``eigh`` returns ``(v, w)``, ``eig`` a list ``[w, vl?, vr?]``,
``lu`` the packed ``(lu, pivots, permutation)``), over the same derived rules as
:mod:`adjointgen.jax`, so ``agj.lax.eig`` replaces ``jax.lax.linalg.eig``.

Keywords that choose an algorithm or a device implementation (``implementation``, ``algorithm``,
``use_magma``, ``sort_eigenvalues``) are accepted; the forward is JAX's default one.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from . import jax_dropins as _d

__all__ = ["cholesky", "eig", "eigh", "lu", "qr", "svd", "triangular_solve"]


def cholesky(x, *, symmetrize_input=True):
    """The lower Cholesky factor ``L`` (``x = L L^H``), as ``jax.lax.linalg.cholesky``: of the
    Hermitian part of ``x``, or of its lower triangle with ``symmetrize_input=False``."""
    return _d.cholesky(x, symmetrize_input=symmetrize_input)


def eig(x, *, compute_left_eigenvectors=True, compute_right_eigenvectors=True, enable_eigvec_derivs=False,
        implementation=None, use_magma=None):
    """Eigendecomposition of a general square ``x``, as ``jax.lax.linalg.eig``: ``[w, vl, vr]``
    (``vl``, ``vr`` as requested), LAPACK ``geev``'s eigenvectors (unit 2-norm, largest-magnitude
    component real)."""
    del implementation, use_magma
    return _d.eig_lapack(x, left=compute_left_eigenvectors, right=compute_right_eigenvectors,
                         fixed_phase=enable_eigvec_derivs)


def eigh(x, *, lower=True, symmetrize_input=True, sort_eigenvalues=True, subset_by_index=None,
         implementation=None):
    """Hermitian eigendecomposition ``(v, w)`` (eigenvectors first), as ``jax.lax.linalg.eigh``:
    of the Hermitian part of ``x``, or of the triangle ``lower`` names with
    ``symmetrize_input=False``; eigenvalues ascending."""
    del sort_eigenvalues, implementation
    n = jnp.shape(x)[-1]
    if subset_by_index is not None and tuple(subset_by_index) != (0, n):
        raise NotImplementedError("eigh: subset_by_index is not supported (use agj.eigsh for a few eigenpairs)")
    w, v = _d.eigh(x, UPLO="L" if lower else "U", symmetrize_input=symmetrize_input)
    return v, w


def lu(x):
    """``(lu, pivots, permutation)``, as ``jax.lax.linalg.lu``: the packed factors of
    ``x[permutation] = L U`` (``L``'s strictly lower part and ``U`` in one array, differentiable),
    LAPACK's row interchanges ``pivots`` and the permutation (int32, not differentiable)."""
    x = _d.as_inexact(x)
    _, pivots, permutation = lax.linalg.lu(lax.stop_gradient(x))
    _, L, U = _d.lu(x)
    m, n = x.shape[-2:]
    k = min(m, n)
    packed = jnp.zeros(x.shape, x.dtype)
    packed = packed.at[..., :, :k].add(jnp.tril(L, -1))
    packed = packed.at[..., :k, :].add(jnp.triu(U))
    return packed, pivots, permutation


def qr(x, *, pivoting=False, full_matrices=True, use_magma=None):
    """``(q, r)`` with ``x = q r``, as ``jax.lax.linalg.qr`` (``full_matrices``: ``q`` square);
    with ``pivoting``, ``(q, r, p)`` with ``x[..., :, p] = q r`` (the permutation from LAPACK's
    column-pivoted QR, piecewise constant)."""
    del use_magma
    x = _d.as_inexact(x)
    mode = "complete" if full_matrices else "reduced"
    if not pivoting:
        return tuple(_d.qr(x, mode=mode))
    _, _, p = lax.linalg.qr(lax.stop_gradient(x), pivoting=True, full_matrices=False)
    permuted = jnp.take_along_axis(x, jnp.broadcast_to(p[..., None, :], x.shape[:-1] + p.shape[-1:]), axis=-1)
    q, r = _d.qr(permuted, mode=mode)
    return q, r, p


def svd(x, *, full_matrices=True, compute_uv=True, subset_by_index=None, algorithm=None):
    """``(u, s, vh)`` (``s`` alone without ``compute_uv``), as ``jax.lax.linalg.svd``."""
    del algorithm
    k = min(jnp.shape(x)[-2:])
    if subset_by_index is not None and tuple(subset_by_index) != (0, k):
        raise NotImplementedError("svd: subset_by_index is not supported (use agj.svds for a few triplets)")
    out = _d.svd(x, full_matrices=full_matrices, compute_uv=compute_uv)
    return tuple(out) if compute_uv else out


def triangular_solve(a, b, *, left_side=False, lower=False, transpose_a=False, conjugate_a=False,
                     unit_diagonal=False):
    """``x`` with ``op(a) x = b`` (``left_side``) or ``x op(a) = b``, as
    ``jax.lax.linalg.triangular_solve``: ``op(a)`` is ``a`` transposed (``transpose_a``) and/or
    conjugated (``conjugate_a``), ``a`` read from its ``lower`` (else upper) triangle, with ones on
    the diagonal for ``unit_diagonal``.  A 1-d ``b`` is one right-hand side."""
    a, b = _d.as_inexact(a), _d.as_inexact(b)
    vector = b.ndim == a.ndim - 1
    if vector:
        b = b[..., :, None] if left_side else b[..., None, :]
    T = jnp.tril(a) if lower else jnp.triu(a)
    if conjugate_a:
        T = jnp.conj(T)
    if transpose_a:
        T, lower = jnp.swapaxes(T, -1, -2), not lower
    if left_side:
        x = _d.solve_triangular(T, b, lower=lower, unit_diagonal=unit_diagonal)
    else:  # x T = b  <=>  T^T x^T = b^T
        x = jnp.swapaxes(_d.solve_triangular(jnp.swapaxes(T, -1, -2), jnp.swapaxes(b, -1, -2), lower=not lower,
                                             unit_diagonal=unit_diagonal), -1, -2)
    if vector:
        x = x[..., :, 0] if left_side else x[..., 0, :]
    return x


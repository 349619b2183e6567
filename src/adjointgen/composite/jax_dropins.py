"""``agj``'s public functions with the signatures and results of ``jax.numpy.linalg`` and
``jax.scipy.linalg``, over the generated operations (``adjointgen.generated.jax.<op>``), whose
rules and checks they keep: what a user swaps in for ``jnp.linalg.svd`` takes the same arguments
and returns the same named tuple.

What the generated operations take in one form only, the wrappers map onto it: the triangle of
``eigh``/``cholesky`` (``UPLO``, ``symmetrize_input``), the thin SVD (``full_matrices=True`` adds
the complement, whose basis is a gauge: derived in ``derivations/svd_complement.py``), the modes of
``qr``, a right-hand side given as a vector, ``solve_triangular``'s ``lower``/``trans``/
``unit_diagonal`` (the generated solve is lower triangular), ``lstsq``'s four results.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from ..generated.jax import cholesky as _cholesky
from ..generated.jax import eig as _eig
from ..generated.jax import eigh as _eigh
from ..generated.jax import eigh_generalized as _eigh_generalized
from ..generated.jax import lstsq as _lstsq
from ..generated.jax import lu as _lu
from ..generated.jax import pinv as _pinv
from ..generated.jax import qr as _qr
from ..generated.jax import slogdet as _slogdet
from ..generated.jax import solve as _solve
from ..generated.jax import solve_triangular as _solve_triangular
from ..generated.jax import svd as _svd
from ..generated.jax import svd_complement as _complement
from ..runtime import jax as _rt
from ..runtime.rules import Call, Residual, Rules


class EighResult(NamedTuple):
    eigenvalues: jax.Array
    eigenvectors: jax.Array


class EigResult(NamedTuple):
    eigenvalues: jax.Array
    eigenvectors: jax.Array


class SVDResult(NamedTuple):
    U: jax.Array
    S: jax.Array
    Vh: jax.Array


class QRResult(NamedTuple):
    Q: jax.Array
    R: jax.Array


class SlogdetResult(NamedTuple):
    sign: jax.Array
    logabsdet: jax.Array


def _H(x):
    return jnp.conj(jnp.swapaxes(x, -1, -2))


def _hermitian_from(a, UPLO, symmetrize_input):
    """The Hermitian matrix the decomposition reads: ``(a + a^H)/2`` (the default, as JAX), or the
    triangle ``UPLO`` mirrored (``symmetrize_input=False``, as LAPACK)."""
    a = jnp.asarray(a)
    if symmetrize_input:
        return a  # the generated functions take the Hermitian part
    if UPLO not in (None, "L", "U"):
        raise ValueError(f"UPLO must be 'L' or 'U', got {UPLO!r}")
    low = jnp.tril(a) if UPLO in (None, "L") else _H(jnp.triu(a))  # the triangle holding the data
    strict = jnp.tril(low, -1)
    d = jnp.diagonal(low, axis1=-2, axis2=-1)
    return strict + _H(strict) + _diag(d.real.astype(a.dtype) if jnp.iscomplexobj(a) else d)


def _diag(d):
    return d[..., :, None] * jnp.eye(d.shape[-1], dtype=d.dtype)


# ---------------------------------------------------------------- eigendecompositions
def eigh(a, b=None, UPLO=None, symmetrize_input=True, *, lower=True, eigvals_only=False,
         cluster_rtol=None, broadening=None):
    """Hermitian eigendecomposition, as ``jax.numpy.linalg.eigh(a, UPLO, symmetrize_input)`` and
    ``jax.scipy.linalg.eigh(a, b, lower, eigvals_only)``: ``EighResult(eigenvalues, eigenvectors)``
    (ascending), or the eigenvalues alone with ``eigvals_only``.  With ``b`` (Hermitian positive
    definite) the generalized problem ``a v = w b v``, ``V^H b V = I``
    (``derivations/eigh_generalized.py``); else ``derivations/eigh.py``.  Exact gradients for
    invariant losses at repeated eigenvalues; basis-dependent ones raise (NaN under ``jit``).

    A second positional argument that is a string is ``UPLO`` (``jnp.linalg.eigh(a, "U")``).
    ``lower`` (SciPy's name) is ``UPLO="L"``/``"U"`` when ``symmetrize_input=False``."""
    if isinstance(b, str):
        UPLO, b = b, None
    if UPLO is None and not lower:
        UPLO = "U"
    a = _hermitian_from(a, UPLO, symmetrize_input)
    if b is None:
        w, V = _eigh.eigh(a, cluster_rtol=cluster_rtol, broadening=broadening)
    else:
        w, V = _eigh_generalized.eigh_generalized(a, _hermitian_from(b, UPLO, symmetrize_input),
                                                  cluster_rtol=cluster_rtol, broadening=broadening)
    return w if eigvals_only else EighResult(w, V)


def eigvalsh(a, UPLO="L", *, symmetrize_input=True):
    """The eigenvalues of Hermitian ``a``, ascending, as ``jax.numpy.linalg.eigvalsh``."""
    return eigh(a, UPLO=UPLO, symmetrize_input=symmetrize_input, eigvals_only=True)


def eig(a, *, cluster_rtol=None, broadening=None):
    """Eigendecomposition of a general square ``a``, as ``jax.numpy.linalg.eig``:
    ``EigResult(eigenvalues, eigenvectors)``, complex (``derivations/eig.py``)."""
    return EigResult(*_eig.eig(a, cluster_rtol=cluster_rtol, broadening=broadening))


def eigvals(a):
    """The eigenvalues of a general square ``a``, as ``jax.numpy.linalg.eigvals``."""
    return eig(a).eigenvalues


# ---------------------------------------------------------------- SVD
_COMPLEMENT_ARGS = ("U", "S", "V", "U2")
_COMPLEMENT_RULES = Rules(
    op="svd",
    outputs=("gA",),
    vjp=Call(_complement.svd_complement_vjp, (*_COMPLEMENT_ARGS, "gU2"), ("cluster_rtol",)),
    jvp=Call(_complement.svd_complement_jvp, (*_COMPLEMENT_ARGS, "dA"), ("cluster_rtol",)),
    data="A",
    vjp_checked=Call(_complement.svd_complement_vjp_checked, (*_COMPLEMENT_ARGS, "gU2"), ("cluster_rtol",)),
    residuals=(Residual("residual_basis", ("gU2",), what="basis"),),
    vjp_complex=Call(_complement.svd_complement_vjp_complex, (*_COMPLEMENT_ARGS, "gU2"), ("cluster_rtol",)),
    jvp_complex=Call(_complement.svd_complement_jvp_complex, (*_COMPLEMENT_ARGS, "dA"), ("cluster_rtol",)),
    vjp_complex_checked=Call(_complement.svd_complement_vjp_complex_checked, (*_COMPLEMENT_ARGS, "gU2"),
                             ("cluster_rtol",)),
    residuals_complex=(Residual("residual_basis", ("gU2",), what="basis"),),
)


def _complement_basis(U):
    """An orthonormal basis of the complement of span(U) (``U`` ``(..., m, k)``, orthonormal)."""
    m, k = U.shape[-2:]
    Q, _ = jnp.linalg.qr(U, mode="complete")
    return Q[..., :, k:] if m > k else Q[..., :, :0]


@functools.partial(jax.custom_jvp, nondiff_argnums=(4,))
def _complement_of(A, U, S, Vh, cluster_rtol):
    return _complement_basis(jax.lax.stop_gradient(U))


@_complement_of.defjvp
def _complement_of_jvp(cluster_rtol, primals, tangents):
    """``dU2`` from ``dA`` alone (``derivations/svd_complement.py``): the tangents of ``U, S, Vh``
    are those of the same ``A``, already counted through it."""
    A, U, S, Vh = primals
    dA = tangents[0]
    U2 = _complement_of(A, U, S, Vh, cluster_rtol)
    env = dict(A=A, U=U, S=S, V=_H(Vh), U2=U2, dA=dA, cluster_rtol=cluster_rtol)
    dU2, = _rt.jvp(_COMPLEMENT_RULES, env, ("gU2",))
    return U2, dU2


def svd(a, full_matrices=True, compute_uv=True, hermitian=False, *, cluster_rtol=None, broadening=None):
    """Singular value decomposition, as ``jax.numpy.linalg.svd``: ``SVDResult(U, S, Vh)``, or ``S``
    alone with ``compute_uv=False``.  ``full_matrices=True`` (the default, as JAX) with m != n
    completes ``U`` (tall) or ``Vh`` (wide) with an orthonormal basis of the complement, defined only
    through its span: a loss of the span (``U2 U2^H``) gets its exact gradient
    (``derivations/svd_complement.py``), one of the basis raises ``ComplementBasisError`` (NaN under
    ``jit``).  ``hermitian`` is accepted and ignored (the general SVD serves Hermitian input too)."""
    del hermitian
    a = jnp.asarray(a)
    U, S, Vh = _svd.svd(a, cluster_rtol=cluster_rtol, broadening=broadening)
    if not compute_uv:
        return S
    m, n = a.shape[-2:]
    if not full_matrices or m == n:
        return SVDResult(U, S, Vh)
    if m > n:
        U2 = _complement_of(a, U, S, Vh, cluster_rtol)
        return SVDResult(jnp.concatenate([U, U2], axis=-1), S, Vh)
    # wide: A^H = V S U^H is tall, and its complement completes V
    V2 = _complement_of(_H(a), _H(Vh), S, _H(U), cluster_rtol)
    return SVDResult(U, S, jnp.concatenate([Vh, _H(V2)], axis=-2))


def svdvals(x, /):
    """The singular values, descending, as ``jax.numpy.linalg.svdvals``."""
    return svd(x, compute_uv=False)


# ---------------------------------------------------------------- factorizations and solves
def qr(a, mode="reduced"):
    """QR factorization, as ``jax.numpy.linalg.qr``: ``QRResult(Q, R)`` for ``mode="reduced"`` (and
    ``"complete"`` where m <= n, the same factors), ``R`` alone for ``mode="r"``
    (``derivations/qr.py``).  ``"complete"`` for a tall ``a`` needs a basis of the complement, a
    gauge no loss can depend on, and ``"raw"`` LAPACK's Householder form: both raise."""
    a = jnp.asarray(a)
    if mode not in ("reduced", "complete", "r", "raw"):
        raise ValueError(f"qr: unsupported mode {mode!r} (reduced, complete, r, raw)")
    if mode == "raw" or (mode == "complete" and a.shape[-2] > a.shape[-1]):
        raise NotImplementedError(f"qr: mode={mode!r} of a tall matrix is not differentiable here: use mode='reduced'")
    Q, R = _qr.qr(a)
    return R if mode == "r" else QRResult(Q, R)


def cholesky(a, *, upper=False, symmetrize_input=True):
    """Cholesky factor of a Hermitian positive definite ``a``, as ``jax.numpy.linalg.cholesky``:
    lower ``L`` with ``a = L L^H`` (``upper=True``: ``L^H``).  A matrix that is not positive definite
    raises outside ``jit`` (NaN under it, as JAX)."""
    a, = _rt.inputs("cholesky", (("A", a),), square=(True,), complex_ok=True)
    if symmetrize_input:
        a = 0.5 * (a + _H(a))
    else:
        a = _hermitian_from(a, "L", False)
    L = _cholesky.cholesky(a)
    return _H(L) if upper else L


def _as_matrix_rhs(a, b):
    """``(b as (..., n, k), whether it was a vector)``: a 1-d ``b`` is one right-hand side, as
    ``jax.numpy.linalg.solve`` has it (NumPy 2 semantics)."""
    b = jnp.asarray(b)
    if b.ndim == 1:
        return jnp.broadcast_to(b[:, None], (*jnp.shape(a)[:-2], b.shape[0], 1)), True
    return b, False


def solve(a, b):
    """``x`` with ``a x = b``, as ``jax.numpy.linalg.solve``: ``b`` of shape ``(..., n, k)``, or
    ``(n,)`` for one right-hand side (batch dimensions broadcast; ``derivations/solve.py``)."""
    a = jnp.asarray(a)
    B, vector = _as_matrix_rhs(a, b)
    X = _solve.solve(a, B)
    return X[..., 0] if vector else X


def solve_triangular(a, b, trans=0, lower=False, unit_diagonal=False, overwrite_b=False, debug=None,
                     check_finite=True):
    """``x`` with ``op(a) x = b`` for triangular ``a``, as ``jax.scipy.linalg.solve_triangular``
    (``lower=False`` by default, as SciPy; ``trans`` 0/'N', 1/'T', 2/'C'; ``unit_diagonal``):
    every case is the derived lower-triangular solve (``derivations/solve_triangular.py``) of the
    triangle ``a`` names, transposed or flipped (``J a J`` of an upper ``a`` is lower)."""
    del overwrite_b, debug, check_finite
    a = jnp.asarray(a)
    trans = {"N": 0, "T": 1, "C": 2}.get(trans, trans)
    if trans not in (0, 1, 2):
        raise ValueError(f"solve_triangular: trans must be 0, 1, 2, 'N', 'T' or 'C', got {trans!r}")
    T = jnp.tril(a) if lower else jnp.triu(a)
    if unit_diagonal:
        n = a.shape[-1]
        T = T - _diag(jnp.diagonal(T, axis1=-2, axis2=-1)) + jnp.eye(n, dtype=a.dtype)
    if trans:
        T = jnp.swapaxes(T, -1, -2)
        T = jnp.conj(T) if trans == 2 else T
        lower = not lower
    B, vector = _as_matrix_rhs(a, b)
    if lower:
        X = _solve_triangular.solve_triangular(T, B)
    else:  # J T J is lower triangular: (J T J)(J x) = J b
        X = jnp.flip(_solve_triangular.solve_triangular(jnp.flip(T, (-2, -1)), jnp.flip(B, -2)), -2)
    return X[..., 0] if vector else X


def lstsq(a, b, rcond=None, *, numpy_resid=False):
    """Least squares, as ``jax.numpy.linalg.lstsq``: ``(x, resid, rank, s)``; ``x`` differentiable by
    ``derivations/lstsq.py`` (the minimum-norm solution, ``pinv(a) b``), ``s`` the singular values
    (:func:`svdvals`), ``rank`` their count above ``rcond * s[0]`` (default ``eps * max(m, n)``),
    ``resid`` the squared residual norms (``numpy_resid=True``: NumPy's, empty unless ``a`` is
    tall and of full rank)."""
    a = jnp.asarray(a)
    B, vector = _as_matrix_rhs(a, b)
    m, n = a.shape[-2:]
    s = svdvals(a)
    cutoff = (jnp.finfo(s.dtype).eps * max(m, n)) if rcond is None else rcond
    rank = jnp.sum(jax.lax.stop_gradient(s) > cutoff * jax.lax.stop_gradient(s[..., :1]), axis=-1)
    X = _lstsq.lstsq(a, B, rcond=None if rcond is None else float(rcond))
    r = jnp.sum(jnp.abs(B - a @ X) ** 2, axis=-2)
    if numpy_resid:
        full = bool((rank == n).all()) if _rt.is_concrete(rank) else False
        r = r if (m > n and full) else jnp.zeros((0,), dtype=s.dtype)
    return (X[..., 0] if vector else X), r, rank, s  # a vector b: resid of shape (1,), as NumPy


def lu(a, permute_l=False, overwrite_a=False, check_finite=True):
    """LU factorization with partial pivoting of a square ``a``, as ``jax.scipy.linalg.lu``:
    ``(p, l, u)`` with ``a = p l u``, or ``(p l, u)`` with ``permute_l`` (``derivations/lu.py``)."""
    del overwrite_a, check_finite
    P, L, U = _lu.lu(a)
    return (P @ L, U) if permute_l else (P, L, U)


def slogdet(a, *, method=None):
    """``SlogdetResult(sign, logabsdet)``, as ``jax.numpy.linalg.slogdet`` (``method`` is accepted;
    the forward is one LU factorization; ``derivations/slogdet.py``)."""
    if method not in (None, "lu", "qr"):
        raise ValueError(f"slogdet: unknown method {method!r}")
    return SlogdetResult(*_slogdet.slogdet(a))


def pinv(a, rtol=None, hermitian=False, *, rcond=None, atol=None):
    """Pseudo-inverse, as ``jax.numpy.linalg.pinv(a, rtol, hermitian, rcond=)``: singular values at
    or below ``max(atol, rtol * s[0])`` count as zero (``derivations/pinv.py``)."""
    if rcond is not None:
        if rtol is not None:
            raise ValueError("pinv: pass rtol or rcond, not both")
        rtol = rcond
    return _pinv.pinv(a, atol=atol, rtol=rtol, hermitian=hermitian)

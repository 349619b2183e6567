"""``agj``'s public functions with the signatures and results of ``jax.numpy.linalg`` and
``jax.scipy.linalg``, over the generated operations (``adjointgen.generated.jax.<op>``), whose
rules and checks they keep: what a user swaps in for ``jnp.linalg.svd`` takes the same arguments
and returns the same named tuple.

What the generated operations take in one form only, the wrappers map onto it: the triangle of
``eigh``/``cholesky`` (``UPLO``, ``symmetrize_input``), the thin SVD and QR (``full_matrices=True``
and ``mode="complete"`` add the complement, whose basis is a gauge: derived in
``derivations/svd_complement.py`` and ``derivations/qr_complement.py``), a wide ``qr`` (split), a
tall or wide ``lu`` (the square rule on a completion of the factors), a right-hand side given as a
vector, ``solve_triangular``'s ``lower``/``trans``/``unit_diagonal`` (the generated solve is lower
triangular), ``lstsq``'s four results, ``lax.linalg.eig``'s left eigenvectors and ``geev``'s
normalization (:func:`eig_lapack`), integer input (promoted as JAX promotes it).  The public
functions run under :func:`adjointgen.runtime.jax.library_semantics`.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from ..generated.jax import cholesky as _cholesky
from ..generated.jax import det as _det
from ..generated.jax import eig as _eig
from ..generated.jax import eigh as _eigh
from ..generated.jax import eigh_generalized as _eigh_generalized
from ..generated.jax import inv as _inv
from ..generated.jax import lstsq as _lstsq
from ..generated.jax import lu as _lu
from ..generated.jax import pinv as _pinv
from ..generated.jax import qr as _qr
from ..generated.jax import qr_complement as _qr_complement
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


def as_inexact(x):
    """``x`` as a JAX array of a floating or complex dtype: integer and boolean arrays become
    floating as JAX's linear algebra promotes them (``int64`` to ``float64`` where x64 is on, the
    narrower ones to ``float32``)."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        try:  # JAX's own rule (int64 -> float64, narrower integers and bool -> float32)
            from jax._src.dtypes import to_inexact_dtype
            dtype = to_inexact_dtype(x.dtype)
        except ImportError:  # pragma: no cover - a JAX without it
            dtype = jnp.float64 if x.dtype.itemsize == 8 else jnp.float32
        x = x.astype(jax.dtypes.canonicalize_dtype(dtype))
    return x


def _hermitian_from(a, UPLO, symmetrize_input):
    """The Hermitian matrix the decomposition reads: ``(a + a^H)/2`` (the default, as JAX), or the
    triangle ``UPLO`` mirrored (``symmetrize_input=False``, as LAPACK)."""
    a = as_inexact(a)
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
@_rt.library
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


@_rt.library
def eigvalsh(a, UPLO="L", *, symmetrize_input=True):
    """The eigenvalues of Hermitian ``a``, ascending, as ``jax.numpy.linalg.eigvalsh``."""
    return eigh(a, UPLO=UPLO, symmetrize_input=symmetrize_input, eigvals_only=True)


@_rt.library
def eig(a, *, cluster_rtol=None, broadening=None):
    """Eigendecomposition of a general square ``a``, as ``jax.numpy.linalg.eig``:
    ``EigResult(eigenvalues, eigenvectors)``, complex (``derivations/eig.py``)."""
    return EigResult(*_eig.eig(as_inexact(a), cluster_rtol=cluster_rtol, broadening=broadening))


@_rt.library
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


@_rt.library
def svd(a, full_matrices=True, compute_uv=True, hermitian=False, *, cluster_rtol=None, broadening=None):
    """Singular value decomposition, as ``jax.numpy.linalg.svd``: ``SVDResult(U, S, Vh)``, or ``S``
    alone with ``compute_uv=False``.  ``full_matrices=True`` (the default, as JAX) with m != n
    completes ``U`` (tall) or ``Vh`` (wide) with an orthonormal basis of the complement, defined only
    through its span: a loss of the span (``U2 U2^H``) gets its exact gradient
    (``derivations/svd_complement.py``), one of the basis raises ``ComplementBasisError`` (NaN under
    ``jit``).  ``hermitian`` is accepted and ignored (the general SVD serves Hermitian input too)."""
    del hermitian
    a = as_inexact(a)
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


@_rt.library
def svdvals(x, /):
    """The singular values, descending, as ``jax.numpy.linalg.svdvals``."""
    return svd(x, compute_uv=False)


# ---------------------------------------------------------------- factorizations and solves
@_rt.library
def qr(a, mode="reduced"):
    """QR factorization, as ``jax.numpy.linalg.qr``: ``QRResult(Q, R)`` for ``mode="reduced"`` and
    ``"complete"``, ``R`` alone for ``mode="r"`` (``derivations/qr.py``; a wide ``a = [X | Y]`` is
    ``X = Q R_X``, ``R = [R_X | Q^H Y]``, so its derivative is the same rule's).  ``"complete"`` for
    a tall ``a`` appends LAPACK's basis ``Q2`` of the complement of span(Q) to ``Q`` (and zero rows
    to ``R``), as JAX: defined only through its span, so a loss of the span (``Q2 Q2^H``) gets its
    exact derivative (``derivations/qr_complement.py``) and a loss of the basis raises
    ``ComplementBasisError`` (NaN under ``jit``), where JAX differentiates LAPACK's Householder
    basis.  ``"raw"`` (LAPACK's Householder vectors) raises ``NotImplementedError``."""
    a = as_inexact(a)
    if mode not in ("reduced", "complete", "r", "raw"):
        raise ValueError(f"qr: unsupported mode {mode!r} (reduced, complete, r, raw)")
    if mode == "raw":
        raise NotImplementedError("qr: mode='raw' (LAPACK's Householder form) is not differentiable here")
    Q, R = _qr_any(a)
    m, n = a.shape[-2:]
    if mode == "complete" and m > n:
        Q2 = _qr_complement_of(a, Q, R)
        Q = jnp.concatenate([Q, Q2], axis=-1)
        R = jnp.concatenate([R, _zeros(R, m - n, n)], axis=-2)
    return R if mode == "r" else QRResult(Q, R)


_QR_COMPLEMENT_ARGS = ("Q", "R", "Q2")
_QR_COMPLEMENT_RULES = Rules(
    op="qr",
    outputs=("gA",),
    vjp=Call(_qr_complement.qr_complement_vjp, (*_QR_COMPLEMENT_ARGS, "gQ2")),
    jvp=Call(_qr_complement.qr_complement_jvp, (*_QR_COMPLEMENT_ARGS, "dA")),
    data="A",
    vjp_checked=Call(_qr_complement.qr_complement_vjp_checked, (*_QR_COMPLEMENT_ARGS, "gQ2")),
    residuals=(Residual("residual_basis", ("gQ2",), what="basis"),),
    vjp_complex=Call(_qr_complement.qr_complement_vjp_complex, (*_QR_COMPLEMENT_ARGS, "gQ2")),
    jvp_complex=Call(_qr_complement.qr_complement_jvp_complex, (*_QR_COMPLEMENT_ARGS, "dA")),
    vjp_complex_checked=Call(_qr_complement.qr_complement_vjp_complex_checked, (*_QR_COMPLEMENT_ARGS, "gQ2")),
    residuals_complex=(Residual("residual_basis", ("gQ2",), what="basis"),),
)


@jax.custom_jvp
def _qr_complement_of(A, Q, R):
    """LAPACK's basis of the complement of span(Q) (the last m - n columns of ``A``'s complete Q)."""
    n = A.shape[-1]
    return jnp.linalg.qr(jax.lax.stop_gradient(A), mode="complete")[0][..., :, n:]


@_qr_complement_of.defjvp
def _qr_complement_of_jvp(primals, tangents):
    """``dQ2`` from ``dA`` alone (``derivations/qr_complement.py``): the tangents of ``Q, R`` are
    those of the same ``A``, already counted through it."""
    A, Q, R = primals
    dA = tangents[0]
    Q2 = _qr_complement_of(A, Q, R)
    dQ2, = _rt.jvp(_QR_COMPLEMENT_RULES, dict(A=A, Q=Q, R=R, Q2=Q2, dA=dA), ("gQ2",))
    return Q2, dQ2


def _qr_any(a):
    """``(Q, R)`` of any shape: the derived rule of ``derivations/qr.py`` is for m >= n; a wide
    ``a = [X | Y]`` is factored as ``X = Q R_X`` with ``R = [R_X | Q^H Y]`` (LAPACK's factors: its
    first m Householder reflections are those of ``X``)."""
    m, n = a.shape[-2:]
    if m >= n:
        return _qr.qr(a)
    Q, R_X = _qr.qr(a[..., :m])
    return Q, jnp.concatenate([R_X, _H(Q) @ a[..., m:]], axis=-1)


@_rt.library
def cholesky(a, *, upper=False, symmetrize_input=True):
    """Cholesky factor of a Hermitian positive definite ``a``, as ``jax.numpy.linalg.cholesky``:
    lower ``L`` with ``a = L L^H`` (``upper=True``: ``L^H``).  A matrix that is not positive definite
    raises outside ``jit`` (NaN under it, as JAX)."""
    a, = _rt.inputs("cholesky", (("A", as_inexact(a)),), square=(True,), complex_ok=True)
    if symmetrize_input:
        a = 0.5 * (a + _H(a))
    else:
        a = _hermitian_from(a, "L", False)
    L = _cholesky.cholesky(a)
    return _H(L) if upper else L


def _as_matrix_rhs(a, b):
    """``(b as (..., n, k), whether it was a vector)``: a 1-d ``b`` is one right-hand side, as
    ``jax.numpy.linalg.solve`` has it (NumPy 2 semantics)."""
    b = as_inexact(b)
    if b.ndim == 1:
        return jnp.broadcast_to(b[:, None], (*jnp.shape(a)[:-2], b.shape[0], 1)), True
    return b, False


@_rt.library
def solve(a, b):
    """``x`` with ``a x = b``, as ``jax.numpy.linalg.solve``: ``b`` of shape ``(..., n, k)``, or
    ``(n,)`` for one right-hand side (batch dimensions broadcast; ``derivations/solve.py``)."""
    a = as_inexact(a)
    B, vector = _as_matrix_rhs(a, b)
    X = _solve.solve(a, B)
    return X[..., 0] if vector else X


@_rt.library
def solve_triangular(a, b, trans=0, lower=False, unit_diagonal=False, overwrite_b=False, debug=None,
                     check_finite=True):
    """``x`` with ``op(a) x = b`` for triangular ``a``, as ``jax.scipy.linalg.solve_triangular``
    (``lower=False`` by default, as SciPy; ``trans`` 0/'N', 1/'T', 2/'C'; ``unit_diagonal``):
    every case is the derived lower-triangular solve (``derivations/solve_triangular.py``) of the
    triangle ``a`` names, transposed or flipped (``J a J`` of an upper ``a`` is lower)."""
    del overwrite_b, debug, check_finite
    a = as_inexact(a)
    trans = {"N": 0, "T": 1, "C": 2}.get(trans, trans)
    if trans not in (0, 1, 2):
        raise ValueError(f"solve_triangular: trans must be 0, 1, 2, 'N', 'T' or 'C', got {trans!r}")
    # the generated solve reads the lower triangle of what it is given (of J a J for an upper a):
    # the triangle is cut here only where a transposition moves it
    T = a if not trans else (jnp.tril(a) if lower else jnp.triu(a))
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


@_rt.library
def lstsq(a, b, rcond=None, *, numpy_resid=False):
    """Least squares, as ``jax.numpy.linalg.lstsq``: ``(x, resid, rank, s)``; ``x`` differentiable by
    ``derivations/lstsq.py`` (the minimum-norm solution, ``pinv(a) b``), ``s`` the singular values
    (:func:`svdvals`), ``rank`` their count above ``rcond * s[0]`` (default ``eps * max(m, n)``),
    ``resid`` the squared residual norms (``numpy_resid=True``: NumPy's, empty unless ``a`` is
    tall and of full rank)."""
    a = as_inexact(a)
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


@_rt.library
def lu(a, permute_l=False, overwrite_a=False, check_finite=True):
    """LU factorization with partial pivoting, as ``jax.scipy.linalg.lu``: ``(p, l, u)`` with
    ``a = p l u``, or ``(p l, u)`` with ``permute_l``, for ``a`` of shape ``(..., m, n)`` (``l``
    ``(..., m, k)`` unit lower triangular, ``u`` ``(..., k, n)`` upper, ``k = min(m, n)``; ``p`` is
    piecewise constant, with a zero derivative).  The rules are ``derivations/lu.py``'s (square);
    a tall or wide ``a`` uses them on a square completion of the factors (see
    :func:`_lu_rectangular`)."""
    del overwrite_a, check_finite
    a, = _rt.inputs("lu", (("A", as_inexact(a)),), square=(False,), complex_ok=True)
    m, n = a.shape[-2:]
    P, L, U = _lu.lu(a) if m == n else _lu_rectangular(a)
    P = jnp.real(P)  # real, as JAX's (its derivative is zero)
    return (P @ L, U) if permute_l else (P, L, U)


def _eye(x, size):
    return jnp.broadcast_to(jnp.eye(size, dtype=x.dtype), (*x.shape[:-2], size, size))


def _zeros(x, rows, cols):
    return jnp.zeros((*x.shape[:-2], rows, cols), x.dtype)


def _lu_completed(P, L, U):
    """The square completion of the factors of a tall or wide ``A = P L U``: a tall ``A`` (m > n)
    is the first n columns of ``[A | P E]`` (``E`` the last m - n columns of the identity), with the
    factors ``P``, ``[L | E]``, ``diag(U, I)``; a wide ``A`` (m < n) the first m rows of
    ``[A; 0 I]``, with ``diag(P, I)``, ``diag(L, I)``, ``[U; 0 I]``.  With ``P`` fixed (piecewise
    constant) these factorizations are unique, so the square rule along ``[dA | 0]`` (``[dA; 0]``)
    restricted to ``L``'s and ``U``'s blocks is the derivative of ``A``'s factors."""
    m, n = L.shape[-2], U.shape[-1]
    if m > n:
        L_ext = jnp.concatenate([L, jnp.concatenate([_zeros(L, n, m - n), _eye(L, m - n)], -2)], -1)
        U_ext = jnp.concatenate([jnp.concatenate([U, _zeros(U, n, m - n)], -1),
                                 jnp.concatenate([_zeros(U, m - n, n), _eye(U, m - n)], -1)], -2)
        return P, L_ext, U_ext

    def block_diagonal(X, Y):
        return jnp.concatenate([jnp.concatenate([X, _zeros(X, X.shape[-2], Y.shape[-1])], -1),
                                jnp.concatenate([_zeros(X, Y.shape[-2], X.shape[-1]), Y], -1)], -2)

    U_ext = jnp.concatenate([U, jnp.concatenate([_zeros(U, n - m, m), _eye(U, n - m)], -1)], -2)
    return block_diagonal(P, _eye(P, n - m)), block_diagonal(L, _eye(L, n - m)), U_ext


@jax.custom_jvp
def _lu_rectangular(a):
    """``(P, L, U)`` of a tall or wide ``a``: JAX's forward; the derivative is the square rule of
    ``derivations/lu.py`` on the completion :func:`_lu_completed`."""
    with _rt.library_semantics():
        return _rt.lu(a)


@_lu_rectangular.defjvp
def _lu_rectangular_jvp(primals, tangents):
    a, = primals
    da, = tangents
    P, L, U = _lu_rectangular(a)
    m, n = a.shape[-2:]
    P_ext, L_ext, U_ext = _lu_completed(P, L, U)
    da_ext = (jnp.concatenate([da, _zeros(da, m, m - n)], -1) if m > n
              else jnp.concatenate([da, _zeros(da, n - m, n)], -2))
    env = dict(A=a, P=P_ext, L=L_ext, U=U_ext, dA=da_ext)
    dL, dU = _rt.jvp(_lu.RULES, env, ("gL", "gU"))
    dL, dU = (dL[..., :, :n], dU[..., :n, :n]) if m > n else (dL[..., :m, :m], dU[..., :m, :])
    return (P, L, U), (jnp.zeros_like(P), dL, dU)


@_rt.library
def slogdet(a, *, method=None):
    """``SlogdetResult(sign, logabsdet)``, as ``jax.numpy.linalg.slogdet`` (``method`` is accepted;
    the forward is one LU factorization; ``derivations/slogdet.py``)."""
    if method not in (None, "lu", "qr"):
        raise ValueError(f"slogdet: unknown method {method!r}")
    return SlogdetResult(*_slogdet.slogdet(as_inexact(a)))


@_rt.library
def pinv(a, rtol=None, hermitian=False, *, rcond=None, atol=None):
    """Pseudo-inverse, as ``jax.numpy.linalg.pinv(a, rtol, hermitian, rcond=)``: singular values at
    or below ``max(atol, rtol * s[0])`` count as zero (``derivations/pinv.py``)."""
    if rcond is not None:
        if rtol is not None:
            raise ValueError("pinv: pass rtol or rcond, not both")
        rtol = rcond
    return _pinv.pinv(as_inexact(a), atol=atol, rtol=rtol, hermitian=hermitian)


@_rt.library
def det(a):
    """The determinant, as ``jax.numpy.linalg.det`` (``derivations/det.py``: exact and finite at
    singular ``a`` too)."""
    return _det.det(as_inexact(a))


@_rt.library
def inv(a):
    """``a^-1``, as ``jax.numpy.linalg.inv`` (``derivations/inv.py``)."""
    return _inv.inv(as_inexact(a))


def _lapack_normalized(V, reference, fixed_phase):
    """The columns of ``V`` (unit norm) scaled by the phase that makes the largest-magnitude
    component of each real, with the sign that component has in ``reference`` (LAPACK ``geev``'s
    vectors): ``geev``'s normalization, written as a function of ``V``.

    ``fixed_phase``: the phase is a function of ``V`` (differentiated by JAX), so the result does
    not change when a column of ``V`` is multiplied by ``e^{iθ}``, and its derivative is the one
    under ``geev``'s normalization (``jax.lax.linalg.eig(enable_eigvec_derivs=True)``: valid where
    no two components tie for the largest magnitude).  Else the phase is held constant: the value
    is the same, and the derivative keeps ``V``'s gauge (a loss must not depend on the phases)."""
    k = jnp.argmax(jnp.abs(jax.lax.stop_gradient(V)), axis=-2)[..., None, :]
    top = jnp.take_along_axis(V, k, axis=-2)
    sign = jnp.sign(jnp.real(jnp.take_along_axis(jax.lax.stop_gradient(reference), k, axis=-2)))
    phase = sign * jnp.conj(top) / jnp.abs(top)
    return V * (phase if fixed_phase else jax.lax.stop_gradient(phase))


@_rt.library
def eig_lapack(a, *, left=True, right=True, fixed_phase=False):
    """``[w, vl?, vr?]`` as ``jax.lax.linalg.eig``: the eigenvalues, the left eigenvectors
    (``vl_j^H a = w_j vl_j^H``) and the right ones, each column of unit norm with its
    largest-magnitude component real (LAPACK ``geev``'s normalization).

    Everything is differentiated by derived rules: ``w`` and the right eigenvectors ``V`` by
    ``derivations/eig.py``, the left ones as the normalized columns of ``V^-H`` (the rows of
    ``V^-1`` are left eigenvectors) through ``derivations/inv.py``, and the normalization by JAX
    (:func:`_lapack_normalized`; ``fixed_phase`` as ``enable_eigvec_derivs``)."""
    w, V = eig(a)
    out = [w]
    if left:
        a = as_inexact(a)
        reference = jax.lax.linalg.eig(jax.lax.stop_gradient(a), compute_left_eigenvectors=True,
                                       compute_right_eigenvectors=False)[1]
        X = _H(inv(V))
        X = X / jnp.linalg.norm(X, axis=-2, keepdims=True)
        out.append(_lapack_normalized(X, reference, fixed_phase))
    if right:
        out.append(_lapack_normalized(V, V, fixed_phase))
    return out

"""Array-module helpers for the generated CuPy/NumPy rules."""
from __future__ import annotations

import functools
from importlib import resources

import numpy

try:  # CuPy is optional: without it every rule runs on NumPy arrays
    import cupy
except Exception:  # pragma: no cover - depends on the machine
    cupy = None


def array_module(*arrays):
    """``cupy`` if any argument is a CuPy array, else ``numpy``."""
    if cupy is not None:
        return cupy.get_array_module(*arrays)
    return numpy


def is_cupy(xp) -> bool:
    return cupy is not None and xp is cupy


#: values within this many ulps, times sqrt(n) and relative to the pair, count as equal to
#: rounding: the forwards rotate their vectors to a generic basis (torch:
#: :func:`adjointgen.runtime.degeneracy.generic_basis`, JAX: :func:`adjointgen.runtime.jax.generic_basis`).
#: The rotation moves a vector's residual ``|A v - w v|`` by at most the spread of its cluster's
#: values, so the spread is bounded by the tolerance (not chained from neighbour to neighbour) and
#: the tolerance stays at the level of the solver's own backward error: ``16 n eps`` relative to
#: the largest value merged the whole spectrum of a float32 matrix of size 1024 with eigenvalues
#: 8e-4 apart (residual 0.3) and mixed the vectors of a graded spectrum (1e-300, 1, 1e100, 1e300).
ROUNDING_ULPS = 16


def rounding_rtol(n: int, eps: float) -> float:
    """The relative tolerance of "equal to rounding" for ``n`` values with machine epsilon ``eps``:
    ``ROUNDING_ULPS sqrt(n) eps``."""
    import math

    return ROUNDING_ULPS * math.sqrt(max(n, 1)) * eps


def cluster_mask(xp, d, rtol=None):
    """``(..., n, n)`` booleans: ``i != j`` with ``|d_i - d_j| <= rtol * max_k |d_k|`` (the NumPy/CuPy
    counterpart of :func:`adjointgen.runtime.degeneracy.cluster_mask`; ``rtol`` defaults to
    ``sqrt(eps)`` of the dtype)."""
    real = numpy.finfo(d.dtype).eps if d.dtype.kind == "f" else numpy.finfo(d.real.dtype).eps
    rtol = numpy.sqrt(real) if rtol is None else rtol
    n = d.shape[-1]
    scale = xp.abs(d).max(axis=-1, keepdims=True) if n else xp.ones(d.shape[:-1] + (1,), dtype=d.dtype)
    scale = xp.maximum(scale, numpy.finfo(d.dtype).tiny)[..., None]
    close = xp.abs(d[..., :, None] - d[..., None, :]) <= rtol * scale
    return close & ~xp.eye(n, dtype=bool)


def negligible(xp, denominator, d, rtol=None):
    """The pairs where a pairwise denominator vanishes: ``|den_ij| <= rtol * max_k |d_k|`` (the
    diagonal and a cluster of equal values for ``d_j - d_i``)."""
    real = numpy.finfo(d.dtype).eps if d.dtype.kind == "f" else numpy.finfo(d.real.dtype).eps
    rtol = numpy.sqrt(real) if rtol is None else rtol
    n = d.shape[-1]
    scale = xp.abs(d).max(axis=-1, keepdims=True) if n else xp.ones(d.shape[:-1] + (1,), dtype=d.dtype)
    scale = xp.maximum(scale, numpy.finfo(d.dtype).tiny)[..., None]
    return xp.abs(denominator) <= rtol * scale


def assemble(xp, V, fw):
    """``V diag(fw) V^H``: a matrix function from its eigenvectors and the function's values."""
    return xp.matmul(V * fw.astype(V.dtype)[..., None, :], xp.conj(xp.swapaxes(V, -1, -2)))


def matrix_part(xp, X, part, hermitian=False):
    """``X`` itself (``part="plain"``), its skew-symmetric (``"skew"``) or symmetric (``"sym"``)
    part; with ``hermitian``, the anti-Hermitian or Hermitian part of a complex ``X``."""
    if part == "plain":
        return X
    Xt = xp.swapaxes(X, -1, -2)
    Xt = xp.conj(Xt) if hermitian else Xt
    return 0.5 * (X - Xt) if part == "skew" else 0.5 * (X + Xt)


def zero_where_negligible(xp, values, denominator, d, rtol=None):
    """``values`` with 0 where the pairwise denominator is negligible (:func:`negligible`): a
    kernel's ``inf * x`` at the pairs a masked pairwise matrix leaves free."""
    return xp.where(negligible(xp, denominator, d, rtol), 0, values)


def check_tangent(xp, op, X, denominator, d, rtol=None):
    """``X``; raise when a JVP's projected tangent ``X`` splits a cluster of equal ``d`` (its block there is
    not a multiple of the identity): the NumPy/CuPy counterpart of
    :func:`adjointgen.runtime.degeneracy.check_tangent`, which says why.  On the device; the host
    reads one flag (and the matrix, to name the cluster, only when it raises)."""
    from .gauge import enabled

    if not enabled() or d.shape[-1] < 2 or X.size == 0:
        return X
    n = X.shape[-1]
    off = negligible(xp, denominator, d, rtol) & ~xp.eye(n, dtype=bool)
    if not bool(off.any()):
        return X
    bad = split_pairs(xp, X, off)
    if not bool(bad.any()):
        return X
    from .gauge import clusters_of, tangent_split_error

    to_host = cupy.asnumpy if is_cupy(xp) else numpy.asarray
    flat_bad = to_host(bad).reshape(-1, n, n)
    flat_off = numpy.broadcast_to(to_host(off), bad.shape).reshape(-1, n, n)
    b = int(numpy.flatnonzero(flat_bad.any(axis=(-2, -1)))[0])
    members = next(c for c in clusters_of(flat_off[b])
                   if flat_bad[b][numpy.ix_(c, c)].any())
    rows = to_host(d).reshape(-1, d.shape[-1])
    raise tangent_split_error(op, members, f"batch index {b}, " if flat_bad.shape[0] > 1 else "",
                              rows[b % rows.shape[0]] if rows.shape[0] else None)


def split_pairs(xp, X, off):
    """The pairs ``off`` (of one cluster) where the tangent block ``X`` is not a multiple of the
    identity: an off-diagonal entry or a difference of diagonal entries above ``sqrt(eps)`` of
    ``max |X|`` (the criterion of :func:`check_tangent`)."""
    real = X.real.dtype if X.dtype.kind == "c" else X.dtype
    eps, tiny = numpy.finfo(real).eps, numpy.finfo(real).tiny
    level = xp.abs(X).max(axis=(-2, -1), keepdims=True)
    diag = xp.diagonal(X, 0, -2, -1)
    spread = xp.abs(diag[..., :, None] - diag[..., None, :])
    tol = numpy.sqrt(eps) * level + tiny
    return off & ((xp.abs(X) > tol) | (spread > tol))


def quotient(xp, numerator, denominator, diagonal, d):
    """``numerator / denominator`` off the diagonal, ``diagonal`` on it (no ``inf``/NaN formed), in
    the dtype of ``d`` (the torch counterpart: :func:`adjointgen.runtime.pairwise.quotient`)."""
    on_diagonal = xp.eye(d.shape[-1], dtype=bool)
    denominator = xp.where(on_diagonal, 1, denominator)
    return xp.where(on_diagonal, diagonal, numerator / denominator).astype(d.dtype)


def masked_quotient(xp, numerator, denominator, d, rtol=None, broadened=None):
    """``numerator / denominator``, and 0 where the denominator is negligible (:func:`negligible`:
    the diagonal and clusters of equal ``d``); ``broadened``: a callable giving the broadened form,
    taken instead (see :func:`adjointgen.runtime.pairwise.masked_quotient`)."""
    same = negligible(xp, denominator, d, rtol)
    if broadened is not None:
        return xp.where(same, 0, broadened()).astype(d.dtype)
    denominator = xp.where(same, 1, denominator)
    return xp.where(same, 0, numerator / denominator).astype(d.dtype)


def reciprocal(xp, s, rtol=None):
    """``1/s``, and 0 where ``|s_i| <= rtol * max |s|`` (zero singular values)."""
    real = numpy.finfo(s.dtype).eps if s.dtype.kind == "f" else numpy.finfo(s.real.dtype).eps
    rtol = numpy.sqrt(real) if rtol is None else rtol
    scale = xp.abs(s).max(axis=-1, keepdims=True) if s.shape[-1] else xp.ones(s.shape[:-1] + (1,), dtype=s.dtype)
    zero = xp.abs(s) <= rtol * xp.maximum(scale, numpy.finfo(s.dtype).tiny)
    return xp.where(zero, 0, 1 / xp.where(zero, 1, s))


def add_diag(xp, X, d):
    """``X + diag(d)`` for batched ``X`` (..., n, n) and ``d`` (..., n)."""
    out = X.copy()
    idx = xp.arange(d.shape[-1])
    out[..., idx, idx] += d
    return out


def add_diag_(xp, X, d):
    """``X += diag(d)`` in place (a temporary of the generated code), NumPy and CuPy alike
    (advanced indexing; ``einsum`` diagonals are not guaranteed to be writable views on CuPy)."""
    idx = xp.arange(d.shape[-1])
    X[..., idx, idx] += d


def solve_triangular(xp, M, B, lower: bool, unit: bool = False):
    """``M^-1 B`` for triangular ``M`` (batched): SciPy's (NumPy) or cupyx's (CuPy) triangular
    solve, one matrix of the batch at a time."""
    if is_cupy(xp):
        from cupyx.scipy.linalg import solve_triangular as solve
    else:
        from scipy.linalg import solve_triangular as solve
    batch = numpy.broadcast_shapes(M.shape[:-2], B.shape[:-2])
    Mb = xp.broadcast_to(M, batch + M.shape[-2:]).reshape((-1,) + M.shape[-2:])
    Bb = xp.broadcast_to(B, batch + B.shape[-2:]).reshape((-1,) + B.shape[-2:])
    out = xp.empty(Bb.shape, dtype=xp.result_type(M.dtype, B.dtype))
    for i in range(Mb.shape[0]):
        out[i] = solve(Mb[i], Bb[i], lower=lower, unit_diagonal=unit)
    return out.reshape(batch + B.shape[-2:])


def solve_triangular_right(xp, M, B, lower: bool, unit: bool = False):
    """``B M^-1`` for triangular ``M`` (batched): the transposed left solve."""
    return xp.swapaxes(solve_triangular(xp, xp.swapaxes(M, -1, -2), xp.swapaxes(B, -1, -2), lower=not lower, unit=unit),
                       -1, -2)


def solve_lower(A, B):
    """``A^-1 B`` for a lower triangular ``A`` (its upper triangle not read), NumPy or CuPy; raises
    ``numpy.linalg.LinAlgError`` (as ``xp.linalg.solve``) for a zero on the diagonal."""
    xp = array_module(A, B)
    diagonal = xp.diagonal(A, axis1=-2, axis2=-1)
    if diagonal.size and bool((diagonal == 0).any()):
        raise numpy.linalg.LinAlgError("solve_triangular: A is singular: a diagonal entry is zero")
    return solve_triangular(xp, xp.tril(A), B, lower=True)


def lu_solve(xp, A, LU, pivots, B, adjoint: bool = False, left: bool = True):
    """``op(A)^-1 B`` or ``B op(A)^-1`` (``op(A) = A^H`` with ``adjoint``) for NumPy/CuPy arrays.  The
    NumPy/CuPy rules receive no factorization (``LU = None``) and solve with ``A``."""
    M = xp.conj(xp.swapaxes(A, -1, -2)) if adjoint else A
    if left:
        return xp.linalg.solve(M, B)
    # B M^-1 = (M^T^-1 B^T)^T
    return xp.swapaxes(xp.linalg.solve(xp.swapaxes(M, -1, -2), xp.swapaxes(B, -1, -2)), -1, -2)


def cuda_include_dir() -> str:
    """The folder of the runtime's CUDA headers (``adjointgen_divided.cuh``)."""
    return str(resources.files("adjointgen.runtime").joinpath("cuda"))


@functools.lru_cache(maxsize=None)
def _module(package: str, op: str):
    source = resources.files(package).joinpath("cuda", f"{op}.cu").read_text()
    return cupy.RawModule(code=source, options=("--std=c++14", f"-I{cuda_include_dir()}"))


def launch_pairwise_kernel(package: str, op: str, fn: str, part: str, w, X, threads: int = 256,
                           hermitian: bool = False):
    """Run the generated kernel ``<fn>_mul_<part>_<f32|f64>`` of ``<package>/cuda/<op>.cu``.

    A complex ``X`` runs as two real launches on its real and imaginary parts (``F`` is real):
    ``F ∘ skew(X) = F ∘ skew(Re X) + i F ∘ sym(Im X)`` for the anti-Hermitian part
    (``hermitian=True``), and the mirror identity for the Hermitian part."""
    if X.dtype.kind == "c":
        flip = {"plain": "plain", "skew": "sym", "sym": "skew"}[part] if hermitian else part
        real = launch_pairwise_kernel(package, op, fn, part, w, cupy.ascontiguousarray(X.real), threads)
        imag = launch_pairwise_kernel(package, op, fn, flip, w, cupy.ascontiguousarray(X.imag), threads)
        return real + 1j * imag
    if X.dtype not in (numpy.float32, numpy.float64):
        raise TypeError(f"{fn}: CUDA kernels exist for float32 and float64, not {X.dtype}")
    suffix = "f32" if X.dtype == numpy.float32 else "f64"
    kernel = _module(package, op).get_function(f"{fn}_mul_{part}_{suffix}")
    w = cupy.ascontiguousarray(w, dtype=X.dtype)
    X = cupy.ascontiguousarray(X)
    out = cupy.empty_like(X)
    total = X.size
    blocks = min((total + threads - 1) // threads, 65535)
    if total:
        kernel((blocks,), (threads,), (w, X, out, numpy.int32(X.shape[-1]), numpy.int64(total)))
    return out


def launch_matrix_kernel(package: str, op: str, fn: str, w, *options, threads: int = 256):
    """Run the generated kernel ``<fn>_<f32|f64>`` of ``<package>/cuda/<op>.cu`` that fills
    ``out (..., n, n)`` from ``w (..., n)`` (``L_ij = f[w_i, w_j]``), with scalar options."""
    if w.dtype not in (numpy.float32, numpy.float64):
        raise TypeError(f"{fn}: CUDA kernels exist for float32 and float64, not {w.dtype}")
    suffix = "f32" if w.dtype == numpy.float32 else "f64"
    kernel = _module(package, op).get_function(f"{fn}_{suffix}")
    w = cupy.ascontiguousarray(w)
    n = w.shape[-1]
    out = cupy.empty(w.shape + (n,), dtype=w.dtype)
    total = out.size
    blocks = min((total + threads - 1) // threads, 65535)
    if total:
        kernel((blocks,), (threads,), (w, out, numpy.int32(n), numpy.int64(total), *[w.dtype.type(o) for o in options]))
    return out


def check_spectrum(xp, name: str, w, program, options=()):
    """The eigenvalues ``w`` checked against the domain of ``f`` (a scalar program,
    :func:`adjointgen.runtime.divided.check_domain`): snapped onto a closed end within rounding,
    else a :class:`ValueError` naming the eigenvalue."""
    from . import divided

    if w.size == 0:
        return w
    eps = numpy.finfo(w.dtype).eps
    tol = 8 * w.shape[-1] * eps * xp.abs(w).max(axis=-1, keepdims=True)
    return divided.check_domain(program, w, tuple(options), order=0, name=name, tol=tol)


def shifted_solve(xp, A, B, U, w, X):
    """The projected shifted solve ``S(X)`` of the generated rules, for dense NumPy/CuPy arrays:
    column ``i`` solves the bordered system ``[[A - w_i B, B U], [(B U)^T, 0]] [s; l] = [x_i; 0]``
    (one batched ``xp.linalg.solve``; memory ``k (n + k)^2``).  ``B`` is ``None`` for the identity.
    An operator ``A`` with a method ``projected_shifted_solve(B, U, w, X)`` solves its own (the
    distributed matrices of :mod:`adjointgen.petsc`)."""
    if hasattr(A, "projected_shifted_solve"):
        return A.projected_shifted_solve(B, U, w, X)
    n, k = U.shape[-2], U.shape[-1]
    BU = U if B is None else xp.matmul(B, U)
    eye = xp.eye(n, dtype=X.dtype)
    Bm = eye if B is None else B
    shifted = A[..., None, :, :] - w[..., :, None, None] * Bm[..., None, :, :]  # (..., k, n, n)
    batch = shifted.shape[:-2]
    top = xp.concatenate([shifted, xp.broadcast_to(BU[..., None, :, :], batch + (n, k))], axis=-1)
    bottom = xp.concatenate([xp.broadcast_to(xp.conj(xp.swapaxes(BU, -1, -2))[..., None, :, :], batch + (k, n)),
                             xp.zeros(batch + (k, k), dtype=X.dtype)], axis=-1)
    M = xp.concatenate([top, bottom], axis=-2)
    rhs = xp.concatenate([xp.swapaxes(X, -1, -2), xp.zeros(X.shape[:-2] + (X.shape[-1], k), dtype=X.dtype)], axis=-1)
    sol = xp.linalg.solve(M, rhs[..., None])[..., 0]  # (..., k, n + k)
    return xp.swapaxes(sol[..., :n], -1, -2)


# ---------------------------------------------------------------- forward computations (NumPy/CuPy)
def eigh(A):
    """``(w, V)`` of Hermitian NumPy or CuPy arrays (batched), LAPACK's (the JAX backend's
    counterpart, :func:`adjointgen.runtime.jax.eigh`, rotates exactly degenerate eigenspaces to a
    generic basis)."""
    return array_module(A).linalg.eigh(A)


def module_linalg(name: str, array_module=array_module):
    """The forward ``name`` that is the array module's own ``xp.linalg.<name>``, as a function of
    the runtime (a derivation declares ``forward(runtime="inv")`` and every backend finds ``inv``
    in its runtime; ``array_module``: how the backend finds the module of its arrays)."""

    def forward(*arrays):
        return getattr(array_module(*arrays).linalg, name)(*arrays)

    forward.__name__ = forward.__qualname__ = name
    forward.__doc__ = f"``xp.linalg.{name}`` of the arrays' own module."
    return forward


cholesky, det, inv, qr, slogdet, solve = map(module_linalg, ("cholesky", "det", "inv", "qr", "slogdet", "solve"))


def svd(A):
    """Thin SVD ``(U, S, Vh)`` of NumPy or CuPy arrays."""
    return array_module(A).linalg.svd(A, full_matrices=False)


def eigh_generalized(A, B):
    """``A V = B V diag(w)``, ``V^H B V = I`` through the Cholesky factor of ``B``, for NumPy or
    CuPy arrays (batched)."""
    xp = array_module(A, B)
    L = xp.linalg.cholesky(B)
    Linv = xp.linalg.inv(L)  # triangular; small dense problems of the NumPy/CuPy path
    LinvH = xp.conj(xp.swapaxes(Linv, -1, -2))
    C = xp.matmul(xp.matmul(Linv, A), LinvH)
    C = 0.5 * (C + xp.conj(xp.swapaxes(C, -1, -2)))
    w, Y = xp.linalg.eigh(C)
    return w, xp.matmul(LinvH, Y)


def pinv(A, atol=None, rtol=None, hermitian=False):
    """``torch.linalg.pinv``'s cutoff semantics for NumPy or CuPy arrays: singular values at most
    ``max(atol, rtol * sigma_max)`` are discarded; ``rtol`` defaults to ``eps * max(m, n)`` when
    ``atol`` is not given, else to 0."""
    return pinv_with(array_module(A), A, atol, rtol)


def lstsq(A, B, rcond=None):
    """``(X, P)``: ``X = A⁺ B`` and ``P = A⁺`` with ``torch.linalg.lstsq``'s rank cutoff, for NumPy or
    CuPy arrays (the array-module counterpart of :func:`adjointgen.runtime.forward.lstsq`)."""
    xp = array_module(A)
    P = pinv_with(xp, A, None, rcond)
    return xp.matmul(P, B), P


def pinv_with(xp, A, atol=None, rtol=None):
    """:func:`pinv` on the array module ``xp`` (NumPy, CuPy, ``jax.numpy``)."""
    m, n = A.shape[-2:]
    if rtol is None:
        rtol = numpy.finfo(A.dtype).eps * max(m, n) if atol is None or atol == 0 else 0.0
    atol = 0.0 if atol is None else atol
    U, s, Vh = xp.linalg.svd(A, full_matrices=False)
    cutoff = xp.maximum(atol, rtol * (s[..., :1] if s.shape[-1] else 0))
    s_inv = xp.where(s > cutoff, 1 / xp.where(s > cutoff, s, 1), 0)
    return xp.matmul(xp.conj(xp.swapaxes(Vh, -1, -2)) * s_inv[..., None, :], xp.conj(xp.swapaxes(U, -1, -2)))


def sylvester(xp, A, B, C, hermitian: bool = True):
    """``X`` with ``A X + X B = C`` (batched): for Hermitian ``A``, ``B`` in their eigenbases,
    otherwise by Bartels-Stewart on the host (:func:`bartels_stewart`; CuPy arrays make a round
    trip); the array-module counterpart of :func:`adjointgen.runtime.linalg.sylvester`.

    Raises:
        SingularMatrixError: an eigenvalue of ``A`` is, to rounding, the negative of one of ``B``
            (both named in the message): no unique ``X``.
    """
    if not hermitian:
        host = (lambda x: x.get()) if is_cupy(xp) else numpy.asarray
        a, b, c = (host(x) for x in (A, B, C))
        batch = numpy.broadcast_shapes(a.shape[:-2], b.shape[:-2], c.shape[:-2])
        a, b, c = (numpy.broadcast_to(x, batch + x.shape[-2:]) for x in (a, b, c))
        out = numpy.empty(c.shape, dtype=numpy.result_type(a, b, c, numpy.float32))
        for idx in numpy.ndindex(*batch):
            out[idx] = bartels_stewart(a[idx], b[idx], c[idx], where=idx if batch else None)
        return xp.asarray(out)
    wa, Va = xp.linalg.eigh(A)
    wb, Vb = xp.linalg.eigh(B)
    denominator = wa[..., :, None] + wb[..., None, :]
    if not is_cupy(xp):
        check_sums(numpy.asarray(wa), numpy.asarray(wb), numpy.abs(numpy.asarray(wa)).max(-1, initial=0)
                   + numpy.abs(numpy.asarray(wb)).max(-1, initial=0))
    conj = xp.conj if xp.iscomplexobj(C) or xp.iscomplexobj(Va) else (lambda x: x)
    Ct = conj(xp.swapaxes(Va, -1, -2)) @ C @ Vb
    return Va @ (Ct / denominator) @ conj(xp.swapaxes(Vb, -1, -2))


def check_sums(a, b, scale, where=None) -> None:
    """A :class:`~adjointgen.runtime.checks.SingularMatrixError` naming the pair where an eigenvalue
    ``a_i`` (of ``A``, batched ``(..., n)``) and ``b_j`` (of ``B``, ``(..., m)``) add up to zero to
    rounding (``|a_i + b_j| <= 100 eps max(n, m) scale``, ``scale`` ``(...)`` the size of the
    matrices): the Sylvester equation ``A X + X B = C`` has no unique solution there."""
    a, b = numpy.asarray(a), numpy.asarray(b)
    if not a.shape[-1] or not b.shape[-1]:
        return
    sums = numpy.abs(a[..., :, None] + b[..., None, :])
    real = numpy.finfo(numpy.result_type(a, b, numpy.float32)).eps
    bound = 100 * real * max(a.shape[-1], b.shape[-1]) * numpy.asarray(scale)[..., None, None]
    bad = sums <= bound
    if not bad.any():
        return
    index = numpy.argwhere(bad)[0]
    *batch, i, j = (int(k) for k in index)
    ai, bj = a[(*batch, i)], b[(*batch, j)]
    where = tuple(batch) if batch else where
    from .checks import SingularMatrixError

    raise SingularMatrixError(
        f"the Sylvester equation A X + X B = C has no unique solution{f' (batch index {where})' if where else ''}: "
        f"the eigenvalue a_{i} = {_number(ai)} of A is, to rounding, the negative of the eigenvalue "
        f"b_{j} = {_number(bj)} of B (|a_{i} + b_{j}| = {float(sums[tuple(index)]):.2e})")


def _number(z) -> str:
    z = complex(z)
    return f"{z.real:.6g}" if z.imag == 0 else f"{z.real:.6g}{z.imag:+.6g}j"


def schur_eigenvalues(T):
    """The eigenvalues of a (quasi-)triangular Schur factor: its diagonal, and the pairs of its
    ``2 x 2`` blocks (a real Schur form)."""
    n = T.shape[-1]
    w = T.diagonal().astype(numpy.result_type(T, numpy.complex64))
    if numpy.iscomplexobj(T) or n < 2:
        return w
    starts = numpy.flatnonzero(T.diagonal(-1))  # a block's subdiagonal entry; blocks never overlap
    if starts.size:  # [[a, b], [c, d]]: (a + d)/2 +- sqrt(((a - d)/2)^2 + b c), in closed form
        a, b, c, d = (T[starts + i, starts + j] for i, j in ((0, 0), (0, 1), (1, 0), (1, 1)))
        mean, root = (a + d) / 2, numpy.sqrt((((a - d) / 2) ** 2 + b * c).astype(w.dtype))
        w[starts], w[starts + 1] = mean + root, mean - root
    return w


#: Schur forms of recent host matrices, by content: a backward's Sylvester solve with ``A^H``, ``B^H``
#: (the adjoint of the forward's) reads the forward's forms of ``A``, ``B`` (``A^H = Q S^H Q^H``) instead
#: of computing them again; at most ``_SCHUR_CACHE_SIZE`` entries and ``_SCHUR_CACHE_BYTES`` in all
_SCHUR_CACHE: dict = {}
_SCHUR_CACHE_SIZE, _SCHUR_CACHE_BYTES = 8, 1 << 27


def _content_key(x, kind):
    import hashlib

    return x.shape, x.dtype.str, kind, hashlib.blake2b(numpy.ascontiguousarray(x).tobytes(), digest_size=16).digest()


def _schur_form(x, kind):
    """``(S, Q, op)`` with ``x = Q op(S) Q^H`` (``op``: LAPACK's ``"N"``, or ``"C"``/``"T"`` where ``x``
    is the conjugate transpose of a matrix whose form is cached)."""
    import scipy.linalg

    hit = _SCHUR_CACHE.get(_content_key(x, kind))
    if hit is not None:
        return (*hit, "N")
    hit = _SCHUR_CACHE.get(_content_key(x.conj().T, kind))
    if hit is not None:
        return (*hit, "C" if kind == "complex" else "T")
    S, Q = scipy.linalg.schur(x, output=kind)
    if 2 * S.nbytes <= _SCHUR_CACHE_BYTES // _SCHUR_CACHE_SIZE:
        while len(_SCHUR_CACHE) >= _SCHUR_CACHE_SIZE:
            _SCHUR_CACHE.pop(next(iter(_SCHUR_CACHE)))  # the oldest
        _SCHUR_CACHE[_content_key(x, kind)] = (S, Q)
    return S, Q, "N"


def _adjoint_op(op, kind):
    return ("C" if kind == "complex" else "T") if op == "N" else "N"


def bartels_stewart(a, b, c, where=None):
    """``X`` with ``a X + X b = c`` for one pair of general square host (NumPy) matrices
    (Bartels-Stewart): the Schur forms ``a = Q S Q^H``, ``b = R T R^H``, LAPACK's triangular solve
    ``S Y + Y T = Q^H c R`` (``trsyl``), ``X = Q Y R^H``.  ``b`` equal to ``a`` or to ``a^H`` (the
    square root's and the Lyapunov equation's) takes one Schur form, not two; a form computed for a
    recent call is reused, also for the conjugate transpose (``a^H = Q S^H Q^H``: ``trsyl`` solves
    with ``S^H``), so the adjoint solve of a backward computes none.  Real data stays real
    (quasi-triangular Schur forms).

    Raises:
        SingularMatrixError: an eigenvalue of ``a`` and one of ``b`` add up to zero to rounding
            (both named; ``trsyl`` would perturb them silently).
    """
    import scipy.linalg

    dtype = numpy.result_type(a, b, c, numpy.float32)
    a, b, c = (numpy.asarray(x, dtype=dtype) for x in (a, b, c))
    n, m = a.shape[-1], b.shape[-1]
    if not n or not m:
        return numpy.zeros((n, m), dtype=dtype)
    kind = "complex" if numpy.iscomplexobj(a) else "real"
    S, Q, opa = _schur_form(a, kind)
    if b is a or (n == m and numpy.array_equal(b, a)):
        T, R, opb = S, Q, opa
    elif n == m and numpy.array_equal(b, a.conj().T):
        T, R, opb = S, Q, _adjoint_op(opa, kind)  # b = Q op(S)^H Q^H
    else:
        T, R, opb = _schur_form(b, kind)
    wa = schur_eigenvalues(S) if opa == "N" else schur_eigenvalues(S).conj()
    wb = schur_eigenvalues(T) if opb == "N" else schur_eigenvalues(T).conj()
    check_sums(wa, wb, numpy.abs(a).max() + numpy.abs(b).max(), where)
    trsyl, = scipy.linalg.get_lapack_funcs(("trsyl",), (S, T, c))
    F = Q.conj().T @ c @ R
    Y, scale, info = trsyl(S, T, F, trana=opa, tranb=opb)
    if info < 0:  # pragma: no cover - an argument error of ours
        raise ValueError(f"trsyl: illegal value in argument {-info}")
    return (Q @ Y @ R.conj().T) / scale


def check_principal_branch(a, what: str = "square root") -> None:
    """A ``ValueError`` naming an eigenvalue of the host array ``a`` (batched) on the closed negative
    real axis, to rounding: there the principal square root (or logarithm) does not exist, or is
    not differentiable (at 0)."""
    w = numpy.linalg.eigvals(a)
    if not w.size:
        return
    eps = numpy.finfo(w.real.dtype).eps
    scale = numpy.abs(w).max(axis=-1, keepdims=True, initial=numpy.finfo(w.real.dtype).tiny)
    bad = (w.real <= 0) & (numpy.abs(w.imag) <= 100 * eps * scale)
    if bad.any():
        idx = tuple(int(i) for i in numpy.argwhere(bad)[0][:-1])
        where = f" (batch index {idx})" if idx else ""
        name = "sqrtm" if what == "square root" else "logm"
        raise ValueError(f"{name}: A{where} has the eigenvalue {w[bad][0]:.6g} on the closed negative real axis: "
                         f"no principal {what} (differentiable)")


def sqrtm_general(A):
    """The principal square root of general square ``A`` (batched): SciPy's Schur method on the host
    (CuPy arrays make a round trip).  Raises ``ValueError`` naming an eigenvalue on the closed
    negative real axis (no principal square root; at 0 the root is not differentiable)."""
    import scipy.linalg

    xp = array_module(A)
    a = A.get() if is_cupy(xp) else numpy.asarray(A)
    out = numpy.empty(a.shape, dtype=numpy.result_type(a.dtype, numpy.float32))
    check_principal_branch(a)
    for idx in numpy.ndindex(*a.shape[:-2]):
        root = scipy.linalg.sqrtm(a[idx])
        out[idx] = root.real if not numpy.iscomplexobj(out) else root
    return xp.asarray(out)


def lu(A):
    """``(P, L, U)`` with ``A = P L U`` (partial pivoting, ``P`` in ``A``'s dtype) for NumPy arrays
    (SciPy, batched) and CuPy arrays (``cupyx.scipy.linalg.lu`` per matrix)."""
    xp = array_module(A)
    if is_cupy(xp):  # pragma: no cover - needs a GPU
        import cupyx.scipy.linalg

        flat = A.reshape(-1, *A.shape[-2:])
        parts = [cupyx.scipy.linalg.lu(a) for a in flat]
        P, L, U = (xp.stack([p[i] for p in parts]).reshape(*A.shape[:-2], *parts[0][i].shape) if parts else
                   xp.empty((*A.shape[:-2], *shape), A.dtype)
                   for i, shape in enumerate(((A.shape[-2],) * 2, (A.shape[-2], min(A.shape[-2:])),
                                              (min(A.shape[-2:]), A.shape[-1]))))
        return P.astype(A.dtype), L, U
    import scipy.linalg

    a = numpy.asarray(A)
    m, n = a.shape[-2:]
    if a.size == 0:
        k = min(m, n)
        batch = a.shape[:-2]
        eye = numpy.broadcast_to(numpy.eye(m, dtype=a.dtype), (*batch, m, m)).copy()
        return eye, numpy.zeros((*batch, m, k), a.dtype), numpy.zeros((*batch, k, n), a.dtype)
    P, L, U = scipy.linalg.lu(a)
    return P.astype(a.dtype), L, U


def adjugate(xp, A):
    """``adj(A)`` (``A adj(A) = det(A) I``) for NumPy/CuPy arrays, finite at singular ``A``:
    ``det(A) A^-1`` where every matrix's singular values are within ``sqrt(eps)`` of the largest, else from the SVD (see :func:`adjointgen.runtime.linalg.adjugate`)."""
    n = A.shape[-1]
    if n <= 1:
        return xp.ones_like(A) if n == 1 else A.copy()
    U, S, Vh = xp.linalg.svd(A)
    eps = xp.finfo(S.dtype).eps
    if A.size and bool((S[..., -1] > S[..., 0] * eps ** 0.5).all()):
        return xp.linalg.det(A)[..., None, None] * xp.linalg.inv(A)
    ones = xp.ones_like(S[..., :1])
    before = xp.cumprod(xp.concatenate([ones, S[..., :-1]], -1), -1)
    after = xp.flip(xp.cumprod(xp.concatenate([ones, xp.flip(S, -1)[..., :-1]], -1), -1), -1)
    phase = xp.linalg.det(U) * xp.linalg.det(Vh)
    V = xp.conj(xp.swapaxes(Vh, -1, -2))
    return phase[..., None, None] * xp.matmul(V * (before * after)[..., None, :], xp.conj(xp.swapaxes(U, -1, -2)))


def eig(A):
    """Eigenvalues and unit-norm eigenvectors of general square ``A`` (complex, batched): NumPy's
    ``eig`` (LAPACK ``geev``), on the host for CuPy arrays (CuPy has no general eigensolver)."""
    xp = array_module(A)
    a = numpy.asarray(A.get() if is_cupy(xp) else A)
    ctype = numpy.result_type(a.dtype, numpy.complex64)
    if a.size == 0:
        w, V = numpy.zeros(a.shape[:-1], ctype), numpy.zeros(a.shape, ctype)
    else:
        w, V = numpy.linalg.eig(a)
        w, V = w.astype(ctype, copy=False), V.astype(ctype, copy=False)
    return (xp.asarray(w), xp.asarray(V)) if is_cupy(xp) else (w, V)


def matrix_exp(A):
    """``exp(A)`` of general square ``A`` (batched): SciPy's ``expm`` (NumPy), CuPy's ``expm``."""
    xp = array_module(A)
    if is_cupy(xp):  # pragma: no cover - needs a GPU
        import cupyx.scipy.linalg

        flat = A.reshape(-1, *A.shape[-2:])
        return xp.stack([cupyx.scipy.linalg.expm(a) for a in flat]).reshape(A.shape) if flat.shape[0] else A.copy()
    import scipy.linalg

    a = numpy.asarray(A)
    return scipy.linalg.expm(a) if a.size else a.copy()


def expm_frechet(xp, A, E):
    """``L_exp[A](E)``: the upper right corner of ``exp([[A, E], [0, A]])`` (batched)."""
    batch = numpy.broadcast_shapes(A.shape[:-2], E.shape[:-2])
    A, E = (xp.broadcast_to(x, batch + x.shape[-2:]) for x in (A, E))
    n = A.shape[-1]
    Z = xp.zeros_like(A)
    M = xp.concatenate([xp.concatenate([A, E], -1), xp.concatenate([Z, A], -1)], -2)
    return matrix_exp(M)[..., :n, n:]


def expm_frechet_solve(xp, X, C):
    """``Y`` with ``L_exp[X](Y) = C`` (batched): the upper right corner of the principal logarithm
    of ``[[exp(X), C], [0, exp(X)]]`` (SciPy on the host; CuPy arrays make a round trip), for ``X``
    a principal logarithm.  Raises ``numpy.linalg.LinAlgError`` where an eigenvalue of ``X`` has
    ``|Im| >= pi``."""
    import scipy.linalg

    x = X.get() if is_cupy(xp) else numpy.asarray(X)
    c = C.get() if is_cupy(xp) else numpy.asarray(C)
    batch = numpy.broadcast_shapes(x.shape[:-2], c.shape[:-2])
    x, c = (numpy.broadcast_to(t, batch + t.shape[-2:]) for t in (x, c))
    dtype = numpy.result_type(x.dtype, c.dtype, numpy.float32)
    out = numpy.empty(c.shape, dtype=dtype)
    n = x.shape[-1]
    for idx in numpy.ndindex(*batch):
        lam = numpy.linalg.eigvals(x[idx]) if n else numpy.zeros(0)
        if lam.size and numpy.abs(lam.imag).max() >= numpy.pi:
            raise numpy.linalg.LinAlgError("expm_frechet_solve: an eigenvalue of X has |Im| >= pi "
                              f"({lam[numpy.argmax(numpy.abs(lam.imag))]:.6g}): not a principal logarithm, "
                              "where the logarithm's Fréchet derivative is not exp's inverse")
        if n == 0:
            continue
        a = scipy.linalg.expm(x[idx])
        block = numpy.block([[a, c[idx]], [numpy.zeros_like(a), a]])
        corner = scipy.linalg.logm(block)[:n, n:]
        out[idx] = corner.real if not numpy.iscomplexobj(out) else corner
    return xp.asarray(out)


def logm_general(A):
    """The principal logarithm of general square ``A`` (batched): SciPy's ``logm`` on the host
    (CuPy arrays make a round trip), real for real ``A``.  Raises ``ValueError`` naming an eigenvalue
    on the closed negative real axis (no principal logarithm; at 0 none at all)."""
    import scipy.linalg

    xp = array_module(A)
    a = A.get() if is_cupy(xp) else numpy.asarray(A)
    out = numpy.empty(a.shape, dtype=numpy.result_type(a.dtype, numpy.float32))
    check_principal_branch(a, "logarithm")
    for idx in numpy.ndindex(*a.shape[:-2]):
        if a.shape[-1]:
            log = scipy.linalg.logm(a[idx])
            out[idx] = log.real if not numpy.iscomplexobj(out) else log
    return xp.asarray(out)


def check_triangular_spectrum(xp, T, upper: bool) -> None:
    """The conditions of :func:`triangular_sylvester_solve` on concrete values: ``T`` triangular on the
    ``upper`` side (else a ``ValueError`` naming an entry on the other side: a ``2 x 2`` block of a
    real Schur form, for a pair of complex eigenvalues, is not triangular), and distinct diagonal
    entries (else a :class:`~adjointgen.runtime.checks.SingularMatrixError` naming the equal pair:
    a repeated eigenvalue, defective or not, where the solution is not unique).  Diagonal entries
    closer than ``sqrt(eps)`` relative to the largest are equal (the split of a defective
    eigenvalue by rounding is of that order)."""
    t = numpy.asarray(T.get() if is_cupy(xp) else T)
    n = t.shape[-1]
    if n < 2 or not t.size:
        return
    other = numpy.tril(t, -1) if upper else numpy.triu(t, 1)
    if numpy.any(other != 0):
        index = numpy.argwhere(other != 0)[0]
        *batch, i, j = (int(k) for k in index)
        where = f" (batch index {tuple(batch)})" if batch else ""
        raise ValueError(f"the triangular Sylvester solve needs {'an upper' if upper else 'a lower'} triangular T{where}: "
                         f"T[{i}, {j}] = {_number(t[tuple(index)])} is not zero -- a 2 x 2 block of a real Schur form "
                         "(a pair of complex eigenvalues) has no derived rule; the complex Schur form (output='complex') has one")
    w = numpy.diagonal(t, axis1=-2, axis2=-1)
    eps = numpy.finfo(numpy.result_type(w.real.dtype, numpy.float32)).eps
    scale = numpy.abs(w).max(-1, initial=0)[..., None, None]
    gaps = numpy.where(numpy.eye(n, dtype=bool), numpy.inf, numpy.abs(w[..., :, None] - w[..., None, :]))
    bad = gaps <= numpy.sqrt(eps) * numpy.maximum(scale, numpy.finfo(eps.dtype).tiny)
    if bad.any():
        *batch, i, j = (int(k) for k in numpy.argwhere(bad)[0])
        where = f" (batch index {tuple(batch)})" if batch else ""
        from .checks import SingularMatrixError

        raise SingularMatrixError(
            f"the triangular Sylvester solve has no unique solution{where}: the diagonal entries T[{i}, {i}] = "
            f"{_number(w[(*batch, i)])} and T[{j}, {j}] = {_number(w[(*batch, j)])} of T are equal to rounding (a "
            "repeated eigenvalue: the Schur vectors have no derivative there)")


def triangular_sylvester_solve(xp, T, C, upper: bool = True):
    """The strictly lower ``X`` with ``tril₋(X T - T X) = tril₋(C)`` for triangular ``T`` (batched,
    broadcasting), by triangular solves: for upper ``T`` column by column,
    ``(T_jj I - T[j+1:, j+1:]) x_j = C[j+1:, j] - X[j+1:, :j] T[:j, j]``; for lower ``T`` row by row,
    ``x_i (T[:i, :i] - T_ii I) = C[i, :i] + T[i, :i] X[:i, :i]``.  Functional (no in-place update), so
    ``jax.numpy`` traces, batches and differentiates it; NumPy and CuPy too.  Where the values are
    concrete, :func:`check_triangular_spectrum` first."""
    if _is_jax(xp):
        import jax

        concrete = not any(isinstance(x, jax.core.Tracer) for x in (T, C))
    else:
        concrete = True
    batch = tuple(numpy.broadcast_shapes(T.shape[:-2], C.shape[:-2]))
    dtype = xp.result_type(T.dtype, C.dtype)
    T = xp.broadcast_to(xp.asarray(T, dtype=dtype), batch + tuple(T.shape[-2:]))
    C = xp.broadcast_to(xp.asarray(C, dtype=dtype), batch + tuple(C.shape[-2:]))
    if concrete:
        check_triangular_spectrum(xp, T, upper)
    if xp is numpy:  # no derivative of the solve is taken here: LAPACK's blocks
        return triangular_sylvester_blocks(T, C, upper)
    n = T.shape[-1]
    if n < 2:
        return xp.zeros(batch + (n, n), dtype=dtype)
    eye = xp.eye(n, dtype=dtype)
    parts = []
    if upper:  # columns, each with zeros above the diagonal
        for j in range(n - 1):
            rhs = C[..., j + 1:, j]
            if j:
                done = xp.stack(parts, axis=-1)[..., j + 1:, :]
                rhs = rhs - xp.matmul(done, T[..., :j, j][..., None])[..., 0]
            M = T[..., j:j + 1, j:j + 1] * eye[j + 1:, j + 1:] - T[..., j + 1:, j + 1:]
            x = _solve_triangular_vector(xp, M, rhs, upper=True)
            parts.append(xp.concatenate([xp.zeros(batch + (j + 1,), dtype=dtype), x], axis=-1))
        parts.append(xp.zeros(batch + (n,), dtype=dtype))
        return xp.stack(parts, axis=-1)
    parts.append(xp.zeros(batch + (n,), dtype=dtype))  # rows, each with zeros right of the diagonal
    for i in range(1, n):
        done = xp.stack(parts, axis=-2)[..., :i, :i]
        rhs = C[..., i, :i] + xp.matmul(T[..., i:i + 1, :i], done)[..., 0, :]
        M = xp.swapaxes(T[..., :i, :i] - T[..., i:i + 1, i:i + 1] * eye[:i, :i], -1, -2)  # x M = r: M^T x = r
        x = _solve_triangular_vector(xp, M, rhs, upper=True)
        parts.append(xp.concatenate([x, xp.zeros(batch + (n - i,), dtype=dtype)], axis=-1))
    return xp.stack(parts, axis=-2)


def triangular_sylvester_blocks(T, C, upper: bool = True):
    """:func:`triangular_sylvester_solve` on host (NumPy) matrices by halving, LAPACK's ``trsyl`` for the
    off-diagonal blocks: ``O(n^3)`` in LAPACK, where the column-by-column solve takes ``n`` Python
    steps.  With ``T = [[T11, T12], [0, T22]]`` (upper) the strictly lower ``X`` has the full block
    ``X21`` with ``X21 T11 - T22 X21 = C21`` (a Sylvester equation with triangular coefficients),
    then ``X11`` and ``X22`` solve the same problem for ``T11`` and ``C11 + T12 X21``, ``T22`` and
    ``C22 - X21 T12``.  For lower ``T = [[T11, 0], [T21, T22]]`` the diagonal blocks come first and
    ``X21 T11 - T22 X21 = C21 - X22 T21 + T21 X11``.  Batched (a loop on the host); no check of
    the spectrum (:func:`check_triangular_spectrum` says where it is singular)."""
    import scipy.linalg

    batch = numpy.broadcast_shapes(T.shape[:-2], C.shape[:-2])
    dtype = numpy.result_type(T, C, numpy.float32)
    T = numpy.broadcast_to(numpy.asarray(T, dtype=dtype), batch + T.shape[-2:])
    C = numpy.broadcast_to(numpy.asarray(C, dtype=dtype), batch + C.shape[-2:])
    out = numpy.zeros(batch + C.shape[-2:], dtype=dtype)
    if not out.size:
        return out
    trsyl, = scipy.linalg.get_lapack_funcs(("trsyl",), (numpy.zeros((1, 1), dtype=dtype),))

    def sylvester(A, B, R):  # X with A X - X B = R, A and B upper triangular
        X, scale, info = trsyl(A, B, R, isgn=-1)
        if info < 0:  # pragma: no cover - an argument error of ours
            raise ValueError(f"trsyl: illegal value in argument {-info}")
        return X / scale

    def solve(t, c):
        n = t.shape[-1]
        if n < 2:
            return numpy.zeros_like(c)
        k = n // 2
        x = numpy.zeros_like(c)
        if upper:
            # X21 T11 - T22 X21 = C21  <=>  T22 X21 - X21 T11 = -C21
            x[k:, :k] = sylvester(t[k:, k:], t[:k, :k], -c[k:, :k])
            x[:k, :k] = solve(t[:k, :k], c[:k, :k] + t[:k, k:] @ x[k:, :k])
            x[k:, k:] = solve(t[k:, k:], c[k:, k:] - x[k:, :k] @ t[:k, k:])
        else:
            x[:k, :k] = solve(t[:k, :k], c[:k, :k])
            x[k:, k:] = solve(t[k:, k:], c[k:, k:])
            r = c[k:, :k] - x[k:, k:] @ t[k:, :k] + t[k:, :k] @ x[:k, :k]
            # X21 T11 - T22 X21 = R  <=>  T11^T X21^T - X21^T T22^T = R^T (upper coefficients)
            x[k:, :k] = sylvester(t[:k, :k].T, t[k:, k:].T, r.T).T
        return x

    for index in numpy.ndindex(*batch):
        out[index] = numpy.tril(solve(numpy.ascontiguousarray(T[index]), numpy.array(C[index])), -1)
    return out


def _is_jax(xp) -> bool:
    return getattr(xp, "__name__", "").startswith("jax")


def _solve_triangular_vector(xp, M, b, upper: bool):
    """``M^-1 b`` for triangular ``M`` (``(..., m, m)``) and vectors ``b`` (``(..., m)``)."""
    if _is_jax(xp):
        import jax.scipy.linalg

        return jax.scipy.linalg.solve_triangular(M, b[..., None], lower=not upper)[..., 0]
    return solve_triangular(xp, M, b[..., None], lower=not upper)[..., 0]

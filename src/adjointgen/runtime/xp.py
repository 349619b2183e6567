"""Array-module helpers for the generated CuPy/NumPy rules, and the NumPy/CuPy forwards."""
from __future__ import annotations

import functools
from importlib import resources

import numpy

try:  # CuPy is optional: without it every rule runs on NumPy arrays
    import cupy
except Exception:  # pragma: no cover - depends on the machine
    cupy = None

# the host Schur solvers (runtime/schur.py): the forwards below use them, and the generated rules
# import the triangular Sylvester solve from here, the array backend's helper module
from .schur import bartels_stewart, check_principal_branch, check_sums  # noqa: E402
from .schur import schur_eigenvalues, triangular_sylvester_solve  # noqa: E402,F401  (re-exported)


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


def adjugate(xp, A, LU=None, pivots=None, adjoint: bool = False):
    """``adj(op(A))`` (``A adj(A) = det(A) I``, ``op(A) = A^H`` with ``adjoint``) for NumPy/CuPy arrays,
    finite at singular ``A``: ``det(A) A^-1`` where every matrix's singular values are within
    ``sqrt(eps)`` of the largest, else from the SVD (see :func:`adjointgen.runtime.linalg.adjugate`).
    The NumPy/CuPy rules receive no factorization (``LU = None``)."""
    del LU, pivots
    if adjoint:
        A = xp.conj(xp.swapaxes(A, -1, -2))
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



"""The array algorithms of the JAX runtime (:mod:`adjointgen.runtime.jax`): the helpers the generated
rules call (solves, Sylvester, adjugate, the exponential and its Fréchet derivative) and the forward
computations on ``jax.numpy``, all traceable, batchable and transposable.  The JAX runtime
re-exports them; generated modules import them from there.

Imports JAX, NumPy and the library-free :mod:`adjointgen.runtime` modules; never torch.
"""
from __future__ import annotations

import contextlib
import functools
import math

import jax
import jax.numpy as jnp
import numpy
from jax import lax

from .xp import module_linalg, rounding_rtol


@contextlib.contextmanager
def library_semantics():
    """The JAX settings adjointgen's own code is written for, whatever the caller's are: standard
    dtype promotion (the derived rules multiply real pairwise matrices, eigenvalues and singular
    values with complex vectors, and scale by Python scalars), batch dimensions broadcast where
    the rules broadcast them, and matrix products at ``Precision.HIGHEST`` (as JAX's own derivative
    rules ask: float32 products on accelerators otherwise round to bfloat16/TF32).  A caller's
    ``jax_numpy_dtype_promotion='strict'`` or ``jax_numpy_rank_promotion='raise'`` (JAX's test
    configuration) then governs the caller's code, not the library's; the outputs keep the dtypes
    and shapes JAX's own functions give (``custom_jvp`` and :func:`linear_rule`'s transpose check
    them)."""
    with jax.numpy_dtype_promotion("standard"), jax.numpy_rank_promotion("allow"), \
            jax.default_matmul_precision("highest"):
        yield


def library(fn):
    """``fn`` run under :func:`library_semantics` (a decorator for every entry point JAX calls:
    forwards, derivative rules, transpositions, primitive implementations and lowerings)."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with library_semantics():
            return fn(*args, **kwargs)
    return wrapped


def array_module(*arrays):
    """``jax.numpy``: the module the generated rules compute with."""
    return jnp


def is_concrete(*xs) -> bool:
    """Whether every array is a concrete value (not traced by ``jit``, ``vmap``, ``grad``)."""
    return not any(isinstance(x, jax.core.Tracer) for x in xs if x is not None)


def concrete_true(predicate, *xs) -> bool:
    """``bool(predicate(*xs))`` where every array is concrete, else ``False``.  Evaluated at once
    (``jax.ensure_compile_time_eval``), also for a constant that ``jit`` closes over, where a
    ``jax.numpy`` operation would otherwise be staged into the trace."""
    if not is_concrete(*xs):
        return False
    with jax.ensure_compile_time_eval():
        return bool(predicate(*xs))


def add_diag(xp, X, d):
    """``X + diag(d)`` for batched ``X`` (..., n, n) and ``d`` (..., n): one elementwise select
    (``where(i == j, X + d_j, X)``), which XLA fuses with its neighbours, where a scatter into the
    diagonal is a pass of its own."""
    n = X.shape[-1]
    batch = jnp.broadcast_shapes(X.shape[:-2], d.shape[:-1])
    dtype = jnp.result_type(X, d)
    X = jnp.broadcast_to(X, batch + X.shape[-2:]).astype(dtype)
    d = jnp.broadcast_to(d, batch + d.shape[-1:]).astype(dtype)
    on_diagonal = jnp.broadcast_to(jnp.eye(n, dtype=bool), X.shape)
    return jnp.where(on_diagonal, X + d[..., None, :], X)


def solve_triangular(xp, M, B, lower: bool, unit: bool = False):
    """``M^-1 B`` for triangular ``M`` (batched, broadcasting): ``jax.scipy.linalg.solve_triangular``."""
    batch = jnp.broadcast_shapes(M.shape[:-2], B.shape[:-2])
    M = jnp.broadcast_to(M, batch + M.shape[-2:])
    B = jnp.broadcast_to(B, batch + B.shape[-2:])
    return jax.scipy.linalg.solve_triangular(M, B, lower=lower, unit_diagonal=unit)


def lu_solve(xp, A, LU, pivots, B, adjoint: bool = False, left: bool = True):
    """``op(A)^-1 B`` or ``B op(A)^-1`` (``op(A) = A^H`` with ``adjoint``), batched and broadcasting,
    from an LU factorization of ``A`` itself (``lax.linalg.lu`` of the held ``A``) for every
    ``op`` and side: under ``jit`` XLA merges it with the forward's factorization of the same ``A``
    (``jnp.linalg.solve``'s), so a derivative costs triangular solves, not a second LU (the JAX
    rules receive no factorization: ``LU = None``).  A ``lax.custom_linear_solve`` of
    ``x -> op(A) x``, so its own derivatives (in ``A`` too) are exact."""
    del LU, pivots
    batch = jnp.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    dtype = jnp.result_type(A, B)
    A = jnp.broadcast_to(A, batch + A.shape[-2:]).astype(dtype)
    B = jnp.broadcast_to(B, batch + B.shape[-2:]).astype(dtype)
    if not left:  # X op(A) = B  <=>  op(A)^T X^T = B^T, op(A)^T = conj(op'(A)) with op' the other one
        Bt = jnp.swapaxes(B, -1, -2)
        if adjoint:  # conj(A) X^T = B^T  <=>  A conj(X^T) = conj(B^T)
            return jnp.conj(jnp.swapaxes(lu_solve(xp, A, None, None, jnp.conj(Bt)), -1, -2))
        return jnp.swapaxes(_lu_linear_solve(A, Bt, 1), -1, -2)
    return _lu_linear_solve(A, B, 2 if adjoint else 0)


def _lu_linear_solve(A, B, trans):
    """``op(A) X = B`` (``trans`` 0, 1, 2: ``A``, ``A^T``, ``A^H``) from the LU of the held ``A``."""
    lu, pivots, _ = lax.linalg.lu(lax.stop_gradient(A))
    flip = {0: 1, 1: 0, 2: None}[trans]  # op(A)^T: A^T, A, conj(A)

    def op(M, X, t):
        M = jnp.swapaxes(M, -1, -2) if t else M
        return (jnp.conj(M) if t == 2 else M) @ X

    def solve(_, R):
        return jax.scipy.linalg.lu_solve((lu, pivots), R, trans=trans)

    def transpose_solve(_, R):
        if flip is not None:
            return jax.scipy.linalg.lu_solve((lu, pivots), R, trans=flip)
        return jnp.conj(jax.scipy.linalg.lu_solve((lu, pivots), jnp.conj(R), trans=0))

    return lax.custom_linear_solve(lambda X: op(A, X, trans), B, solve=solve, transpose_solve=transpose_solve)


def solve_triangular_right(xp, M, B, lower: bool, unit: bool = False):
    """``B M^-1`` for triangular ``M`` (batched, broadcasting): one right-side triangular solve
    (``lax.linalg.triangular_solve(left_side=False)``), no transposed copies of ``B`` and the result."""
    batch = jnp.broadcast_shapes(M.shape[:-2], B.shape[:-2])
    dtype = jnp.result_type(M, B)
    M = jnp.broadcast_to(M, batch + M.shape[-2:]).astype(dtype)
    B = jnp.broadcast_to(B, batch + B.shape[-2:]).astype(dtype)
    return lax.linalg.triangular_solve(M, B, left_side=False, lower=lower, unit_diagonal=unit)


# ---------------------------------------------------------------- forward computations (jax.numpy)
def _sylvester_in_eigenbases(A, B, C):
    wa, Va = jnp.linalg.eigh(A)
    wb, Vb = jnp.linalg.eigh(B)
    Ct = adjoint(Va) @ C @ Vb
    return Va @ (Ct / (wa[..., :, None] + wb[..., None, :])) @ adjoint(Vb)


def sylvester(xp, A, B, C, hermitian: bool = True):
    """``X`` with ``A X + X B = C`` (batched): a ``lax.custom_linear_solve`` of ``X -> A X + X B``,
    solved in the eigenbases of Hermitian ``A``, ``B`` (else by ``jax.scipy.linalg.solve_sylvester``,
    Bartels-Stewart through JAX's Schur decomposition, CPU only), so its derivatives (every order,
    forward and reverse) come from the linear map, never from ``eigh``'s (no gap enters)."""
    batch = jnp.broadcast_shapes(A.shape[:-2], B.shape[:-2], C.shape[:-2])
    A, B, C = (jnp.broadcast_to(x, batch + x.shape[-2:]) for x in (A, B, C))
    dtype = jnp.result_type(A, B, C)
    A, B, C = (x.astype(dtype) for x in (A, B, C))
    A0, B0 = lax.stop_gradient(A), lax.stop_gradient(B)
    if hermitian:
        inner = _sylvester_in_eigenbases
    else:
        import jax.scipy.linalg as jsl

        def inner(a, b, c):
            solve = jsl.solve_sylvester
            for _ in batch:
                solve = jax.vmap(solve)
            return solve(a, b, c)
    return lax.custom_linear_solve(lambda X: A @ X + X @ B, C,
                                   solve=lambda _, R: inner(A0, B0, R),
                                   # JAX transposes linearly: the transpose (not the adjoint) of X -> A X + X B
                                   transpose_solve=lambda _, R: inner(jnp.swapaxes(A0, -1, -2),
                                                                      jnp.swapaxes(B0, -1, -2), R))


def sqrtm_general(A):
    """The principal square root of general square ``A`` (batched): ``jax.scipy.linalg.sqrtm``
    (Schur method; JAX's Schur decomposition runs on the CPU only), real for real ``A``.  Where ``A``
    is concrete, an eigenvalue on the closed negative real axis raises a ``ValueError`` naming it."""
    import jax.scipy.linalg as jsl

    if is_concrete(A):
        from .schur import check_principal_branch

        check_principal_branch(numpy.asarray(A))
    root = jsl.sqrtm
    for _ in A.shape[:-2]:
        root = jax.vmap(root)
    X = root(A)
    return X if jnp.iscomplexobj(A) else jnp.real(X).astype(A.dtype)


@jax.jit
def _rounding_clusters(d):
    """``(..., n, n)``: the pairs ``i != j`` whose values are equal to rounding (one jitted
    computation: op by op it would be twenty small ones)."""
    n = d.shape[-1]
    real = jnp.finfo(d.dtype).dtype
    eps = float(jnp.finfo(real).eps)
    scale = jnp.maximum(jnp.max(jnp.abs(d), axis=-1, keepdims=True), jnp.finfo(real).tiny)[..., None]
    rtol = rounding_rtol(n, eps)
    tol = rtol * scale
    # buckets of width tol from the smallest value: the rotation mixes values of one bucket only, so
    # no chain of close neighbours spreads a cluster beyond tol (the residual moves by its spread)
    real_d = jnp.real(d) if jnp.iscomplexobj(d) else d
    width = jnp.maximum(tol[..., 0], jnp.finfo(real).tiny)  # (tol underflows for the zero matrix)
    bucket = jnp.floor((real_d - jnp.min(real_d, axis=-1, keepdims=True)) / width)
    # and relative to the pair: a graded spectrum (1e-300, 1, 1e100, 1e300) keeps its eigenvectors
    pair = jnp.maximum(jnp.abs(d)[..., :, None], jnp.abs(d)[..., None, :])
    off_diagonal = jnp.broadcast_to(~jnp.eye(n, dtype=bool), pair.shape)
    return ((jnp.abs(d[..., :, None] - d[..., None, :]) <= rtol * pair)
            & (bucket[..., :, None] == bucket[..., None, :]) & off_diagonal)


def generic_basis(d, *vectors, normalize: bool = False):
    """``vectors`` (columns paired with the values ``d``) with the columns of every cluster of values
    equal to rounding (:func:`adjointgen.runtime.xp.rounding_rtol`, relative to the pair) rotated by one
    generic orthogonal (unitary) matrix, the
    same for every array (so ``U S V^H`` and ``V^H B V = I`` are kept); ``normalize``: the columns
    scaled to unit norm again (``eig``'s).  LAPACK's basis of an exactly degenerate eigenspace has
    exact zeros, at which the first-order test of a basis-dependent loss vanishes by accident (the
    torch side's :func:`adjointgen.runtime.degeneracy.generic_basis`).  Jittable: the rotation is
    ``expm(K ∘ Ω)`` for the rounding-cluster indicator ``K`` and a fixed generic anti-Hermitian ``Ω``,
    taken only where a cluster exists (``lax.cond``)."""
    n = d.shape[-1]
    if n < 2 or not vectors:
        return vectors
    dtype = vectors[0].dtype
    K = _rounding_clusters(d)
    rng = numpy.random.default_rng(0x5EED + n)
    M = rng.standard_normal((n, n)) + (1j * rng.standard_normal((n, n)) if jnp.iscomplexobj(vectors[0]) else 0)
    Omega = jnp.asarray((M - numpy.conj(M.T)) / 2, dtype=dtype)
    # module-level branches and the constants as operands: the conditional is traced once per
    # shape, not per call (a new closure each call would compile again in op-by-op mode)
    rotated = _rotated_normalized if normalize else _rotated
    if is_concrete(K):  # op by op: the rotation (and its compilation) only where a cluster exists
        return rotated((K, Omega, tuple(vectors))) if bool(jnp.any(K)) else tuple(vectors)
    return jax.lax.cond(jnp.any(K), rotated, _unrotated, (K, Omega, tuple(vectors)))


def _rotated(args):
    K, Omega, vs = args
    R = jax.scipy.linalg.expm(jnp.where(K, Omega, jnp.zeros((), Omega.dtype)))
    return tuple(v @ R for v in vs)


def _rotated_normalized(args):
    return tuple(v / jnp.linalg.norm(v, axis=-2, keepdims=True) for v in _rotated(args))


def _unrotated(args):
    return tuple(args[2])


def eigh(A):
    """``(w, V)`` as ``jax.numpy.linalg.eigh``, the eigenvectors of eigenvalues equal to rounding in
    a generic basis of their eigenspace (:func:`generic_basis`)."""
    w, V = jnp.linalg.eigh(A)
    (V,) = generic_basis(w, V)
    return w, V


#: the forwards that are ``jax.numpy.linalg``'s own
cholesky, det, inv, qr, slogdet, solve = (module_linalg(name, array_module)
                                          for name in ("cholesky", "det", "inv", "qr", "slogdet", "solve"))


def svd(A):
    """Thin SVD ``(U, S, Vh)``, the singular vectors of singular values equal to rounding in a
    generic basis (:func:`generic_basis`, the same rotation on both sides)."""
    U, S, Vh = jnp.linalg.svd(A, full_matrices=False)
    U, V = generic_basis(S, U, adjoint(Vh))
    return U, S, adjoint(V)


def solve_lower(A, B):
    """``A^-1 B`` for a lower triangular ``A`` (its upper triangle not read); a concrete ``A`` with a
    zero on the diagonal raises ``ValueError`` (traced, the result is Inf/NaN, as JAX's solves)."""
    if A.size and concrete_true(lambda A: (jnp.diagonal(A, axis1=-2, axis2=-1) == 0).any(), A):
        raise ValueError("solve_triangular: A is singular: a diagonal entry is zero")
    return solve_triangular(jnp, A, B, lower=True)


def eigh_generalized(A, B):
    """``A V = B V diag(w)``, ``V^H B V = I`` through the Cholesky factor of ``B`` (batched)."""
    L = jnp.linalg.cholesky(B)
    Linv = solve_triangular(jnp, L, jnp.broadcast_to(jnp.eye(L.shape[-1], dtype=L.dtype), L.shape), lower=True)
    LinvH = jnp.conj(jnp.swapaxes(Linv, -1, -2))
    C = Linv @ A @ LinvH
    w, Y = jnp.linalg.eigh(0.5 * (C + jnp.conj(jnp.swapaxes(C, -1, -2))))
    (Y,) = generic_basis(w, Y)  # a generic basis of exactly degenerate eigenspaces
    return w, LinvH @ Y


def pinv(A, atol=None, rtol=None, hermitian=False):
    """The pseudo-inverse with ``torch.linalg.pinv``'s cutoff (:func:`adjointgen.runtime.xp.pinv`)."""
    from .xp import pinv_with

    return pinv_with(jnp, A, atol, rtol)


def lstsq(A, B, rcond=None):
    """``(X, P)``: ``X = A⁺ B`` and ``P = A⁺`` with ``torch.linalg.lstsq``'s rank cutoff, on
    ``jax.numpy`` (:func:`adjointgen.runtime.xp.lstsq`)."""
    from .xp import pinv_with

    P = pinv_with(jnp, A, None, rcond)
    return P @ B, P


def lu(A):
    """``(P, L, U)`` with ``A = P L U`` (partial pivoting; ``P`` in ``A``'s dtype), as
    ``jax.scipy.linalg.lu``, batched."""
    import jax.scipy.linalg

    factor = jax.scipy.linalg.lu
    for _ in A.shape[:-2]:  # batched (jax.scipy.linalg.lu takes one matrix)
        factor = jax.vmap(factor)
    P, L, U = factor(A)
    return P.astype(A.dtype), L, U


def adjugate(xp, A, LU=None, pivots=None, adjoint: bool = False):
    """``adj(op(A))`` (``A adj(A) = det(A) I``, ``op(A) = A^H`` with ``adjoint``) on ``jax.numpy``
    (the JAX rules receive no factorization, ``LU = None``: under ``jit`` XLA shares the forward's),
    finite and exact at singular ``A``:
    ``det(A) A^-1`` from one LU factorization where its pivots are within ``sqrt(eps)`` of the
    largest (a cheap test of the conditioning: what the SVD costs is several LU factorizations),
    else from the SVD ``A = U S V^H``: ``c V diag(prod_{j != i} s_j) U^H`` with ``c = det(U) det(V^H)``,
    whose derivative comes from the same factors, ``d adj(A)[E] = c V M(U^H E V) U^H`` with
    ``M(X)_ii = sum_{k != i} P_ik X_kk``, ``M(X)_ij = -P_ij X_ij``, ``P_ij = prod_{l not in {i, j}} s_l``:
    exact at every rank (``adj`` is a polynomial; no derivative of the SVD enters), so second
    derivatives of ``det`` are right at singular ``A`` (see :func:`adjointgen.runtime.linalg.adjugate`).
    Traced, ``lax.cond`` takes the SVD for the whole batch where one matrix needs it."""
    del LU, pivots
    if adjoint:
        A = jnp.conj(jnp.swapaxes(A, -1, -2))
    n = A.shape[-1]
    if n <= 1:
        return xp.ones_like(A) if n == 1 else A
    lu, pivots, _ = lax.linalg.lu(A)
    u = jnp.diagonal(lu, axis1=-2, axis2=-1)
    eps = float(jnp.finfo(A.dtype).eps)
    well = jnp.all(jnp.min(jnp.abs(u), axis=-1) > math.sqrt(eps) * jnp.max(jnp.abs(u), axis=-1))
    if is_concrete(well):
        return _adjugate_lu((A, lu, pivots, u)) if bool(well) else _adjugate_svd((A, lu, pivots, u))
    return lax.cond(well, _adjugate_lu, _adjugate_svd, (A, lu, pivots, u))


def _adjugate_lu(args):
    A, lu, pivots, u = args
    n = A.shape[-1]
    swaps = jnp.sum(pivots != jnp.arange(n, dtype=pivots.dtype), axis=-1)
    det = jnp.where(swaps % 2 == 1, -1, 1).astype(A.dtype) * jnp.prod(u, axis=-1)
    inverse = jax.scipy.linalg.lu_solve((lu, pivots), jnp.broadcast_to(jnp.eye(n, dtype=A.dtype), A.shape))
    return det[..., None, None] * inverse


def _adjugate_svd(args):
    return _adjugate(args[0])


def _adjugate_factors(A):
    U, S, Vh = jnp.linalg.svd(A)
    c = (jnp.linalg.det(U) * jnp.linalg.det(Vh))[..., None, None]
    return c, jnp.conj(jnp.swapaxes(Vh, -1, -2)), S, U


def _products_but(S, pair: bool):
    """``prod_{l != i} s_l``, or with ``pair`` the matrix ``prod_{l not in {i, j}} s_l``: no division
    (the count of zeros decides where a product is zero, logarithms of the others give it)."""
    zero = S == 0
    logs = jnp.where(zero, 0.0, jnp.log(jnp.where(zero, 1.0, S)))
    total, zeros = logs.sum(-1, keepdims=True), zero.sum(-1, keepdims=True)
    if not pair:
        return jnp.where(zeros - zero > 0, 0.0, jnp.exp(total - logs))
    left = zeros[..., None] - zero[..., :, None] - zero[..., None, :]
    return jnp.where(left > 0, 0.0, jnp.exp(total[..., None] - logs[..., :, None] - logs[..., None, :]))


@jax.custom_jvp
def _adjugate(A):
    c, V, S, U = _adjugate_factors(A)
    return c * jnp.matmul(V * _products_but(S, False).astype(A.dtype)[..., None, :], jnp.conj(jnp.swapaxes(U, -1, -2)))


@_adjugate.defjvp
def _adjugate_jvp(primals, tangents):
    A, = primals
    E, = tangents
    c, V, S, U = _adjugate_factors(A)
    Uh = jnp.conj(jnp.swapaxes(U, -1, -2))
    X = Uh @ E.astype(A.dtype) @ V
    n = S.shape[-1]
    P = jnp.where(jnp.eye(n, dtype=bool), 0.0, _products_but(S, True)).astype(A.dtype)
    M = _diag_embed(jnp.sum(P * jnp.diagonal(X, axis1=-2, axis2=-1)[..., None, :], -1)) - P * X
    out = c * jnp.matmul(V * _products_but(S, False).astype(A.dtype)[..., None, :], Uh)
    return out, c * (V @ M @ Uh)


def _diag_embed(x):
    return x[..., :, None] * jnp.eye(x.shape[-1], dtype=x.dtype)


def eig(A):
    """``(w, V)``: eigenvalues and unit-norm eigenvectors of general square ``A``, complex, as
    ``jax.numpy.linalg.eig`` (LAPACK ``geev``; JAX runs it on the host for accelerator arrays), the
    eigenvectors of eigenvalues equal to rounding in a generic basis, renormalized (:func:`generic_basis`)."""
    w, V = jnp.linalg.eig(A)
    (V,) = generic_basis(w, V, normalize=True)
    return w, V


def matrix_exp(A):
    """``exp(A)`` of general square ``A``: ``jax.scipy.linalg.expm`` (batched)."""
    import jax.scipy.linalg as jsl

    return jsl.expm(A)


#: Padé [13/13] coefficients of exp (Higham, SIAM J. Matrix Anal. Appl. 26 (2005), Table 2.3)
_PADE13 = (64764752532480000., 32382376266240000., 7771770303897600., 1187353796428800., 129060195264000.,
           10559470521600., 670442572800., 33522128640., 1323241920., 40840800., 960960., 16380., 182., 1.)
#: the 1-norm up to which Padé [13/13] is accurate to double precision (Higham 2005)
_THETA13 = 5.371920351148152
#: scaling steps unrolled (norms up to 2^32 theta13; beyond, exp overflows double precision anyway)
_MAX_SQUARINGS = 32


def _expm_selected(A):
    """``exp(A)`` (batched) by scaling and squaring with Padé [13/13], every squaring a ``select``
    on the number of steps chosen from ``A``'s norm, never a ``lax.cond``: so its derivative in ``A``
    is linear in the tangent in a form JAX can transpose also where ``A`` is batched (a batched
    ``cond`` becomes a ``select`` with a ``stop_gradient`` on its operands, which has no transpose:
    ``jax.scipy.linalg.expm``'s derivative then fails under ``hessian`` and ``vmap(jvp)``)."""
    norm = jnp.max(jnp.sum(jnp.abs(A), axis=-2), axis=-1)
    steps = lax.stop_gradient(jnp.clip(jnp.ceil(jnp.log2(norm / _THETA13)), 0, _MAX_SQUARINGS))
    X = A / (2.0 ** steps).astype(A.dtype)[..., None, None]
    b = _PADE13
    eye = jnp.broadcast_to(jnp.eye(A.shape[-1], dtype=A.dtype), A.shape)
    mm = functools.partial(jnp.matmul, precision=lax.Precision.HIGHEST)
    X2 = mm(X, X)
    X4 = mm(X2, X2)
    X6 = mm(X4, X2)
    U = mm(X, mm(X6, b[13] * X6 + b[11] * X4 + b[9] * X2) + b[7] * X6 + b[5] * X4 + b[3] * X2 + b[1] * eye)
    V = mm(X6, b[12] * X6 + b[10] * X4 + b[8] * X2) + b[6] * X6 + b[4] * X4 + b[2] * X2 + b[0] * eye
    R = jnp.linalg.solve(V - U, V + U)

    def square(R, k):
        return jnp.where((k < steps)[..., None, None], mm(R, R), R), None

    R, _ = lax.scan(square, R, jnp.arange(_MAX_SQUARINGS, dtype=steps.dtype))
    return R


def expm_frechet(xp, A, E):
    """``L_exp[A](E)`` (batched): the derivative of :func:`_expm_selected` along ``E``, whose scaling
    is chosen from ``A`` alone and whose squarings are selects, so JAX can transpose it in ``E`` and
    differentiate it in ``A`` to any order, batched or not (the block exponential's scaling reads
    ``E``)."""
    batch = jnp.broadcast_shapes(A.shape[:-2], E.shape[:-2])
    dtype = jnp.result_type(A, E)
    A, E = (jnp.broadcast_to(x, batch + x.shape[-2:]).astype(dtype) for x in (A, E))
    return jax.jvp(_expm_selected, (A,), (E,))[1]


def expm_frechet_solve(xp, X, C):
    """``Y`` with ``L_exp[X](Y) = C`` (batched): a ``lax.custom_linear_solve`` of ``Y -> L_exp[X](Y)``
    solved densely (the ``n^2 × n^2`` matrix of the map, for the small matrices this is meant for),
    so its derivatives in ``C`` come from the linear map; those in ``X`` from JAX's differentiation
    of the map."""
    batch = jnp.broadcast_shapes(X.shape[:-2], C.shape[:-2])
    dtype = jnp.result_type(X, C)
    X, C = (jnp.broadcast_to(x, batch + x.shape[-2:]).astype(dtype) for x in (X, C))
    n = X.shape[-1]

    def dense_solve(M, R):
        operator = jax.vmap(lambda e: expm_frechet(xp, M, e.reshape(n, n)).reshape(-1))(jnp.eye(n * n, dtype=dtype))
        return jnp.linalg.solve(operator.T, R.reshape(-1)).reshape(n, n)

    def solve(M, R):
        f = dense_solve
        for _ in batch:
            f = jax.vmap(f)
        return f(M, R)

    return lax.custom_linear_solve(lambda Y: expm_frechet(xp, X, Y), C,
                                   # X as a constant of the solves: custom_linear_solve takes their derivatives
                                   # from the map's (a stop_gradient here has no transpose: hessian failed)
                                   solve=lambda _, R: solve(X, R),
                                   transpose_solve=lambda _, R: solve(jnp.swapaxes(X, -1, -2), R))


def logm_general(A):
    """The principal logarithm of general square ``A``: SciPy's ``logm`` on the host through
    ``jax.pure_callback`` (JAX has no ``logm``); a concrete ``A`` with an eigenvalue on the closed
    negative real axis raises a ``ValueError`` naming it."""
    from .xp import logm_general as on_host

    if is_concrete(A):
        return jnp.asarray(on_host(numpy.asarray(A)))
    out = jax.ShapeDtypeStruct(A.shape, A.dtype)
    return jax.pure_callback(lambda a: on_host(numpy.asarray(a)).astype(a.dtype), out, A, vmap_method="expand_dims")


def adjoint(x):
    """``x^H``: an output returned in adjoint form (``Vh``) in the form the rules take (``V``)."""
    return jnp.conj(jnp.swapaxes(x, -1, -2))

"""The JAX runtime of the generated JAX modules (``adjointgen.generated.jax.<op>``).

What a generated JAX module needs beyond its rule functions, written once for every operation:

- the array helpers its rules call (the same names and meanings as :mod:`adjointgen.runtime.xp`,
  with ``xp`` being ``jax.numpy``; no in-place update, so everything traces, batches and
  transposes);
- the forward computations on ``jax.numpy`` (:func:`svd`, :func:`pinv`, :func:`eigh_generalized`);
- :func:`inputs`, the argument checks of a public function: dtype and shape always, the values
  (NaN/Inf) only where they are concrete (outside ``jit``; a traced value cannot raise);
- :func:`jvp`, the dispatch of its ``jax.custom_jvp`` rule, which picks the complex or real derived
  JVP and wraps the output tangents in :func:`gauge_checked`, whose transpose is where reverse mode
  checks the loss against the gauge.

**Gauges in JAX.**  JAX's reverse mode transposes the derived JVP, so the cotangents of the outputs
reach only the transposed program.  The output tangents pass through an identity primitive
(``adjointgen_gauge_hook``) whose transpose is a check primitive (``adjointgen_gauge_check``): there
the derived gauge residuals (the rules ``<op>_vjp_checked`` return them) are evaluated on the
cotangents.  Where the values are concrete (outside ``jit``) a loss that depends on the gauge (the
basis inside a cluster of equal values, the individual values of a cluster, a complex phase)
raises :class:`~adjointgen.runtime.gauge.DegenerateSubspaceError` or
:class:`~adjointgen.runtime.gauge.PhaseDependentLossError`, as the torch side does; under ``jit`` the
batch elements concerned get NaN cotangents, so exactly the gradients that do not exist are NaN and
never a finite wrong value (:func:`errors_in_jit` adds a host callback that raises, at the price of
a host round trip).  ``jax.experimental.checkify`` cannot see into these primitives, so the check is
not a checkify check.  In forward mode, the projected tangent at a masked quotient passes a third
primitive (``adjointgen_tangent_check``): a tangent that splits a cluster raises where concrete and
is NaN where traced (``jacfwd``, ``jit``), and reverse mode transposes it as the identity.

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

from . import gauge
from .rules import Rules
from .xp import assemble, cluster_mask, lu_solve, masked_quotient, matrix_part, negligible, quotient, reciprocal
from .xp import module_linalg, rounding_rtol, shifted_solve, triangular_sylvester_solve, zero_where_negligible

__all__ = [
    "add_diag", "adjoint", "array_module", "assemble", "broadcast_batch", "check_tangent", "errors_in_jit", "cluster_mask",
    "eigh_generalized", "gauge_checked", "inputs", "is_concrete", "jvp", "library", "library_semantics", "lu_solve", "masked_quotient",
    "matrix_part", "negligible", "pinv", "quotient", "reciprocal", "shifted_solve", "solve_triangular", "svd",
    "symmetrized", "sqrtm_general", "sylvester", "triangular_sylvester_solve", "zero_where_negligible",
    "check_finite_outputs",
]

_RAISE_IN_JIT = False


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
        from .xp import check_principal_branch

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


def adjugate(xp, A):
    """``adj(A)`` (``A adj(A) = det(A) I``) on ``jax.numpy``, finite and exact at singular ``A``:
    ``det(A) A^-1`` from one LU factorization where its pivots are within ``sqrt(eps)`` of the
    largest (a cheap test of the conditioning: what the SVD costs is several LU factorizations),
    else from the SVD ``A = U S V^H``: ``c V diag(prod_{j != i} s_j) U^H`` with ``c = det(U) det(V^H)``,
    whose derivative comes from the same factors, ``d adj(A)[E] = c V M(U^H E V) U^H`` with
    ``M(X)_ii = sum_{k != i} P_ik X_kk``, ``M(X)_ij = -P_ij X_ij``, ``P_ij = prod_{l not in {i, j}} s_l``:
    exact at every rank (``adj`` is a polynomial; no derivative of the SVD enters), so second
    derivatives of ``det`` are right at singular ``A`` (see :func:`adjointgen.runtime.linalg.adjugate`).
    Traced, ``lax.cond`` takes the SVD for the whole batch where one matrix needs it."""
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


# ---------------------------------------------------------------- argument checks
def inputs(op: str, named, *, square, complex_ok: bool):
    """Check a public function's inputs (``(name, array)`` pairs): floating (complex where
    ``complex_ok``), matrices (``square`` per input), one dtype; NaN/Inf where the values are
    concrete.  Returns the arrays as ``jax`` arrays."""
    out = []
    dtype = None
    for (name, x), sq in zip(named, square):
        x = jnp.asarray(x)
        kind = numpy.dtype(x.dtype).kind
        if kind not in ("f", "c") or (kind == "c" and not complex_ok):
            raise TypeError(f"{op}: {name} must be a floating{' or complex' if complex_ok else ''} array, "
                            f"got dtype {x.dtype}")
        if x.ndim < 2:
            raise ValueError(f"{op}: {name} must be a (..., m, n) matrix, got shape {tuple(x.shape)}")
        if sq and x.shape[-1] != x.shape[-2]:
            raise ValueError(f"{op}: {name} must be square, got shape {tuple(x.shape)}")
        if dtype is not None and x.dtype != dtype:
            raise TypeError(f"{op}: the inputs must have one dtype, got {dtype} and {x.dtype} ({name})")
        dtype = x.dtype
        if x.size and concrete_true(lambda x: ~jnp.isfinite(x).all(), x):
            raise ValueError(f"{op}: {name} has NaN or Inf entries")
        out.append(x)
    return out


def adjoint(x):
    """``x^H``: an output returned in adjoint form (``Vh``) in the form the rules take (``V``)."""
    return jnp.conj(jnp.swapaxes(x, -1, -2))


def broadcast_batch(*xs):
    """The arrays with their batch dimensions (all but the last two) broadcast to one shape."""
    batch = jnp.broadcast_shapes(*(x.shape[:-2] for x in xs))
    return tuple(jnp.broadcast_to(x, batch + x.shape[-2:]) for x in xs)


def symmetrized(x):
    """``(x + x^H) / 2``: the Hermitian part, as ``jax.numpy.linalg.eigh(symmetrize_input=True)``
    takes it (the derivative of a function of a symmetric matrix along any direction)."""
    return 0.5 * (x + jnp.conj(jnp.swapaxes(x, -1, -2)))


def check_finite_outputs(op: str, what: str, *xs) -> None:
    """Raise ``ValueError`` where a concrete forward output has NaN (a Cholesky factor of a matrix
    that is not positive definite, as ``jax.numpy.linalg.cholesky`` returns it)."""
    if concrete_true(lambda *xs: any(x.size and not bool(jnp.isfinite(x).all()) for x in xs), *xs):
        raise ValueError(f"{op}: {what}")


# ---------------------------------------------------------------- forward mode at clusters
def check_tangent(xp, op, X, denominator, d, rtol=None):
    """``X``, the projected tangent of a JVP at the operand of a masked pairwise quotient
    (``V^H dA V``), checked not to split a cluster of equal ``d`` (see
    :func:`adjointgen.runtime.degeneracy.check_tangent` for why): a concrete ``X`` that splits one
    raises :class:`~adjointgen.runtime.gauge.DegenerateSubspaceError`; a traced one (``jit``,
    ``jacfwd``) gets NaN in the batch elements that split one.  A primitive, so that reverse mode
    transposes it as the identity (the reverse-mode check is :func:`gauge_checked`'s)."""
    if not gauge.enabled() or d.shape[-1] < 2 or X.size == 0:
        return X
    return _tangent_p.bind(X, denominator, d, op=op, rtol=rtol)


# ---------------------------------------------------------------- dispatch and the reverse-mode gauge check
@contextlib.contextmanager
def errors_in_jit(flag: bool = True):
    """Within this block, functions traced under ``jit`` raise on a gauge violation in reverse mode
    too (a host callback, which JAX reports as ``JaxRuntimeError`` carrying the message), instead
    of only NaN cotangents.  Outside ``jit`` they always raise."""
    global _RAISE_IN_JIT
    old, _RAISE_IN_JIT = _RAISE_IN_JIT, flag
    try:
        yield
    finally:
        _RAISE_IN_JIT = old


def _complex(rules: Rules, env: dict) -> bool:
    """The complex rules: for complex data, and for complex outputs of real data (the complex Schur
    form of a real matrix; the transposition takes the real part of a real input's cotangent)."""
    return rules.vjp_complex is not None and (jnp.iscomplexobj(env[rules.data]) or any(
        (isinstance(v, jax.Array) or hasattr(v, "aval")) and jnp.iscomplexobj(v) for v in env.values()))


_TRANSPOSE = "derived"


@contextlib.contextmanager
def transposition(mode: str):
    """Within this block (while tracing), reverse mode of the generated functions runs the derived
    VJP (``"derived"``, the default) or JAX's transposition of the derived JVP's operations
    (``"jax"``): for comparing the two (``benchmarks/bench_jax_rules.py``)."""
    global _TRANSPOSE
    if mode not in ("derived", "jax"):
        raise ValueError(f"transposition: mode must be 'derived' or 'jax', not {mode!r}")
    old, _TRANSPOSE = _TRANSPOSE, mode
    try:
        yield
    finally:
        _TRANSPOSE = old


@library
def jvp(rules: Rules, env: dict, cotangent_names: tuple[str, ...], *, transpose: str | None = None) -> tuple:
    """The output tangents of the derived JVP (complex or real rules), passed through
    :func:`gauge_checked` where the operation has gauge residuals.  ``cotangent_names``: the names
    the checked VJP gives the outputs' cotangents (``gw``, ``gV``), in the order of the tangents.

    ``transpose="derived"`` (the default, see :func:`transposition`): reverse mode runs the derived
    VJP (:func:`linear_rule`: the JVP as a linear primitive whose transpose is the VJP), forward mode
    the derived JVP; ``"jax"``: JAX transposes the JVP's operations itself."""
    singular = _singular_factors(rules, env)
    rules = rules.for_shapes(env)
    complex_ = _complex(rules, env)
    call = rules.jvp_complex if complex_ else rules.jvp
    back = rules.vjp_complex if complex_ else rules.vjp
    if (transpose or _TRANSPOSE) == "derived" and not rules.complex_only:
        tangents = linear_rule(rules.op, call, back, env, tuple("d" + name[1:] for name in rules.outputs),
                               cotangent_names)
    else:
        tangents = call(env)
    if singular is not None:  # traced: NaN in both modes (a factor NaN or 1, linear in the tangents)
        tangents = tuple(t * jnp.where(singular.reshape(singular.shape + (1,) * (t.ndim - singular.ndim)),
                                       jnp.nan, 1).astype(t.dtype) for t in tangents)
    checked = rules.vjp_complex_checked if complex_ else rules.vjp_checked
    if checked is None or not gauge.enabled() or (rules.broadening and env.get("broadening") is not None):
        return tangents
    residuals = rules.residuals_complex if complex_ else rules.residuals
    return gauge_checked(rules, env, checked, residuals, tangents, cotangent_names)


def _singular_factors(rules: Rules, env: dict):
    """The triangular factors the rules invert (``rules.invertible``: QR's ``R``, Cholesky's ``L``),
    checked as :func:`adjointgen.runtime.checks.invertible_factor` does: a pivot at most
    ``(k eps)^(1/degree)`` times the norm of its line (an upper factor's column, a lower one's row)
    has no correct digits, nor has a derivative that divides by it.  Concrete values raise
    ``SingularMatrixError``; traced ones give the batch elements' flags (``None``: nothing to flag)."""
    flags = None
    for name, degree, *side in rules.invertible:  # (side: declared since 2026-12; older modules have none)
        T = env.get(name)
        if T is None or not T.size:
            continue
        T = lax.stop_gradient(T)
        k = min(T.shape[-2:])
        # on T / max|T| (the test is homogeneous): the squares of entries near 1e300 would overflow
        top = jnp.maximum(jnp.max(jnp.abs(T), axis=(-2, -1)), jnp.finfo(jnp.abs(T).dtype).tiny)[..., None]
        Y = T / top[..., None]
        pivots = jnp.abs(jnp.diagonal(Y, axis1=-2, axis2=-1))[..., :k]
        columns = jnp.sqrt(jnp.sum(jnp.abs(Y) ** 2, axis=-2))[..., :k]
        rows = jnp.sqrt(jnp.sum(jnp.abs(Y) ** 2, axis=-1))[..., :k]
        if side:
            size = columns if side[0] == "upper" else rows
        else:
            size = jnp.where(jnp.all(jnp.tril(T, -1) == 0, axis=(-2, -1))[..., None], columns, rows)
        eps = float(jnp.finfo(pivots.dtype).eps)
        noise = pivots <= (k * eps) ** (1.0 / degree) * size
        if is_concrete(noise):
            if bool(jnp.any(noise)):
                bad = numpy.argwhere(numpy.asarray(noise))[0]
                factor = float(top[tuple(bad[:-1])][0])
                pivot, scale = float(pivots[tuple(bad)]) * factor, float(size[tuple(bad)]) * factor
                where = f" (batch index {tuple(int(b) for b in bad[:-1])})" if len(bad) > 1 else ""
                try:
                    from .checks import SingularMatrixError
                except ImportError:  # no torch
                    SingularMatrixError = ValueError
                raise SingularMatrixError(gauge.singular_factor_message(rules.op, name, int(bad[-1]), pivot, where, k,
                                                                        degree, scale))
            continue
        found = jnp.any(noise, axis=-1)
        flags = found if flags is None else flags | found
    return flags


class _Linear:
    """The static part of one :func:`linear_rule` (hashed by identity): the rules and the names of
    the operands."""

    def __init__(self, op, call, back, tangent_names, cotangent_names, names, static):
        self.op, self.call, self.back = op, call, back
        self.tangent_names, self.cotangent_names, self.names, self.static = tangent_names, cotangent_names, names, static

    def env(self, args) -> dict:
        k = len(self.tangent_names)
        return dict(self.static, **dict(zip(self.tangent_names, args[:k])), **dict(zip(self.names, args[k:])))

    @library
    def forward(self, *args):
        return list(self.call(self.env(args)))


def linear_rule(op, call, back, env, tangent_names, cotangent_names):
    """The output tangents ``call(env)`` (the derived JVP), through one primitive that is linear in
    the input tangents ``tangent_names`` and whose transpose is ``back`` (the derived VJP), so that
    reverse mode runs the derived VJP instead of JAX's transposition of the JVP's operations (one
    rule, audited, for each direction, as on the torch side).  Its own derivative (second order)
    differentiates the JVP's ``jax.numpy`` operations."""
    needed = {*call.args, *call.keywords, *back.args, *back.keywords} - set(tangent_names) - set(cotangent_names)
    names = tuple(k for k in sorted(needed) if isinstance(env.get(k), jax.Array) or hasattr(env.get(k), "aval"))
    static = tuple((k, env.get(k)) for k in sorted(needed) if k not in names)
    plan = _Linear(op, call, back, tuple(tangent_names), tuple(cotangent_names), names, static)
    return tuple(_linear_p.bind(*(env[k] for k in tangent_names), *(env[k] for k in names), plan=plan))


def gauge_checked(rules, env, checked, residuals, tangents, cotangent_names):
    """``tangents`` unchanged; in reverse mode, the cotangents that reach them are checked against
    the derived gauge residuals of ``checked``: an error raised where the values are concrete
    (outside ``jit``; within :func:`errors_in_jit` also under it), and NaN for the batch elements
    whose loss depends on the gauge where they are traced.

    Two primitives carry it: ``adjointgen_gauge_hook`` is the identity on the tangents, and its
    transpose is ``adjointgen_gauge_check`` on the cotangents.  The check's own derivative passes
    the tangents of the cotangents through (NaN where its verdict is), since the verdict is
    piecewise constant; so second derivatives (``hessian``, ``check_grads(order=2)``) work and check
    the first-order cotangent only."""
    # what the checked VJP and the residuals' checks read, but the cotangents they are given
    needed = {*checked.args, *checked.keywords, *(r.vector for r in residuals if r.vector)} - set(cotangent_names)
    names = tuple(k for k in sorted(needed) if isinstance(env.get(k), jax.Array))
    static = tuple((k, env.get(k)) for k in sorted(needed) if not isinstance(env.get(k), jax.Array))
    check = _Check(rules, checked, residuals, tuple(cotangent_names), names, static)
    held = [lax.stop_gradient(env[k]) for k in names]  # the verdict is piecewise constant
    return tuple(_hook_p.bind(*tangents, *held, check=check, count=len(tangents)))


class _Check:
    """The static part of one check (hashed by identity): the rules and the names of the held
    values passed to the primitives as operands."""

    def __init__(self, rules, checked, residuals, cotangent_names, names, static):
        self.rules, self.checked, self.residuals = rules, checked, residuals
        self.cotangent_names, self.names, self.static = cotangent_names, names, static

    def env(self, held) -> dict:
        return dict(self.static, **dict(zip(self.names, held)))

    def bad(self, cotangents, held):
        """Per batch element, whether the loss depends on the gauge (JAX's cotangents are the
        conjugates of the rules', ``Re tr(G^H dX)``); ``None``: nothing to check."""
        return _violations(self.rules, self.env(held), self.checked, self.residuals,
                           tuple(jnp.conj(c) for c in cotangents), self.cotangent_names)

    def clustered(self, held):
        """Whether a residual can be nonzero at all: ``None`` where some residual is not confined to
        clusters (a phase, a complement's basis: always checked), else whether any batch element
        has two values in a cluster.  The cluster residuals vanish elsewhere, so the check (a
        product of the size of the VJP's) runs only where one exists, as on the torch side."""
        if any(r.vector is None for r in self.residuals):
            return None
        env = self.env(held)
        return functools.reduce(jnp.logical_or, (jnp.any(cluster_mask(jnp, env[r.vector], env.get("cluster_rtol")))
                                                 for r in self.residuals))


def _poison(bad, values):
    return [jnp.where(bad.reshape(bad.shape + (1,) * (v.ndim - bad.ndim)), jnp.nan, v) for v in values]


def _make_primitives():
    from jax.extend.core import Primitive
    from jax.interpreters import ad, batching, mlir

    hook_p = Primitive("adjointgen_gauge_hook")
    check_p = Primitive("adjointgen_gauge_check")
    hook_p.multiple_results = check_p.multiple_results = True

    def shapes(*args, check, count):
        return [jax.core.ShapedArray(x.shape, x.dtype) for x in args[:count]]

    @library
    def traced_check(*args, check, count):
        cotangents, held = list(args[:count]), args[count:]

        def verdict(operands):
            cotangents, held = operands
            bad, *kinds = check.bad(cotangents, held)
            if _RAISE_IN_JIT:
                jax.debug.callback(functools.partial(_raise, check.rules.op, phases=_phase_residual(check.residuals)),
                                   *kinds)
            return bad

        if jax.eval_shape(lambda ops: check.bad(*ops), (cotangents, held)) is None:
            return cotangents
        clustered = check.clustered(held)
        if clustered is None:
            bad = verdict((cotangents, held))
        else:
            # the branches return the verdict per batch element only (not the cotangents: a
            # conditional that returns them copies them, 5 % of jit(grad(svd)) at n = 512)
            shape = jax.eval_shape(verdict, (cotangents, held))
            bad = lax.cond(clustered, verdict, lambda operands: jnp.zeros(shape.shape, bool), (cotangents, held))
        return _poison(bad, cotangents)

    @library
    def eager_check(*args, check, count):
        cotangents, held = list(args[:count]), args[count:]
        clustered = check.clustered(held)
        if clustered is not None and not bool(clustered):
            return cotangents
        found = check.bad(cotangents, held)
        if found is not None:
            _raise(check.rules.op, *found[1:], phases=_phase_residual(check.residuals))
        return cotangents

    def batched(p):
        def rule(args, dims, **params):
            size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
            args = [batching.bdim_at_front(x, d, size) for x, d in zip(args, dims)]
            return p.bind(*args, **params), [0] * params["count"]
        return rule

    hook_p.def_impl(lambda *args, check, count: list(args[:count]))
    hook_p.def_abstract_eval(shapes)
    mlir.register_lowering(hook_p, mlir.lower_fun(lambda *args, check, count: list(args[:count]), multiple_results=True))
    batching.primitive_batchers[hook_p] = batched(hook_p)

    def hook_jvp(primals, tangents, *, check, count):
        # the hook is linear, and an outer derivative's cotangents are not a loss's: plain identity
        out = hook_p.bind(*primals, check=check, count=count)
        return out, [ad.instantiate_zeros(t) for t in tangents[:count]]

    @library
    def hook_transpose(cts, *args, check, count):
        held = args[count:]
        cts = [ad.instantiate_zeros(c) if type(c) is ad.Zero else c for c in cts]
        cts = [jnp.zeros(a.aval.shape, a.aval.dtype) if type(c) is ad.Zero else c for c, a in zip(cts, args)]
        return [*check_p.bind(*cts, *held, check=check, count=count), *([None] * len(held))]

    ad.primitive_jvps[hook_p] = hook_jvp
    ad.primitive_transposes[hook_p] = hook_transpose

    check_p.def_impl(eager_check)
    check_p.def_abstract_eval(shapes)
    mlir.register_lowering(check_p, mlir.lower_fun(traced_check, multiple_results=True))
    batching.primitive_batchers[check_p] = batched(check_p)

    @library
    def check_jvp(primals, tangents, *, check, count):
        out = check_p.bind(*primals, check=check, count=count)
        found = check.bad(list(primals[:count]), primals[count:])
        dts = [ad.instantiate_zeros(t) for t in tangents[:count]]
        return out, (dts if found is None else _poison(found[0], dts))

    ad.primitive_jvps[check_p] = check_jvp

    tangent_p = Primitive("adjointgen_tangent_check")

    @library
    def tangent_impl(X, denominator, d, *, op, rtol):
        from .xp import check_tangent as host_check

        host_check(numpy, op, numpy.asarray(X), numpy.asarray(denominator), numpy.asarray(d), rtol)
        return X

    @library
    def tangent_traced(X, denominator, d, *, op, rtol):
        off = negligible(jnp, denominator, d, rtol) & ~jnp.eye(X.shape[-1], dtype=bool)
        from .xp import split_pairs

        bad = jnp.any(split_pairs(jnp, X, off), axis=(-2, -1))
        return jnp.where(bad[..., None, None], jnp.nan, X)

    def tangent_batched(args, dims, **params):
        size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
        args = [batching.bdim_at_front(x, d, size) for x, d in zip(args, dims)]
        return tangent_p.bind(*args, **params), 0

    def tangent_jvp(primals, tangents, *, op, rtol):
        return tangent_p.bind(*primals, op=op, rtol=rtol), ad.instantiate_zeros(tangents[0])

    def tangent_transpose(ct, X, denominator, d, *, op, rtol):
        return [ct, None, None]

    tangent_p.def_impl(tangent_impl)
    tangent_p.def_abstract_eval(lambda X, denominator, d, **_: jax.core.ShapedArray(X.shape, X.dtype))
    mlir.register_lowering(tangent_p, mlir.lower_fun(tangent_traced, multiple_results=False))
    batching.primitive_batchers[tangent_p] = tangent_batched
    ad.primitive_jvps[tangent_p] = tangent_jvp
    ad.primitive_transposes[tangent_p] = tangent_transpose

    linear_p = Primitive("adjointgen_linear_rule")
    linear_p.multiple_results = True

    @library
    def linear_abstract(*args, plan):
        avals = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in args]
        return [jax.core.ShapedArray(o.shape, o.dtype) for o in jax.eval_shape(plan.forward, *avals)]

    def linear_batched(args, dims, *, plan):
        size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
        args = [batching.bdim_at_front(x, d, size) for x, d in zip(args, dims)]
        out = linear_p.bind(*args, plan=plan)
        return out, [0] * len(out)

    @library
    def linear_jvp(primals, tangents, *, plan):
        # the JVP is linear in the input tangents, not in the primal values it reads: its
        # derivative is that of its jax.numpy operations
        tangents = [ad.instantiate_zeros(t) for t in tangents]
        out, dout = jax.jvp(plan.forward, tuple(primals), tuple(tangents))
        return out, dout

    @library
    def linear_transpose(cts, *args, plan):
        k = len(plan.tangent_names)
        held = args[k:]
        avals = linear_abstract(*[a.aval if ad.is_undefined_primal(a) else a for a in args], plan=plan)
        cts = [jnp.zeros(a.shape, a.dtype) if type(c) is ad.Zero else c for c, a in zip(cts, avals)]
        env = dict(plan.static, **dict(zip(plan.names, held)))
        # JAX's cotangents are the conjugates of the rules' (Re tr(G^H dX)), and so are its results
        env.update(zip(plan.cotangent_names, (jnp.conj(c) for c in cts)))
        grads = plan.back(env)
        out = []
        for g, a in zip(grads, args[:k]):
            aval = a.aval if ad.is_undefined_primal(a) else a
            g = jnp.conj(g)
            g = g.real if not jnp.iscomplexobj(jnp.zeros((), aval.dtype)) and jnp.iscomplexobj(g) else g
            out.append(jnp.broadcast_to(g, aval.shape).astype(aval.dtype) if g.shape != aval.shape else g.astype(aval.dtype))
        return out + [None] * len(held)

    linear_p.def_impl(lambda *args, plan: plan.forward(*args))
    linear_p.def_abstract_eval(linear_abstract)
    mlir.register_lowering(linear_p, mlir.lower_fun(lambda *args, plan: plan.forward(*args), multiple_results=True))
    batching.primitive_batchers[linear_p] = linear_batched
    ad.primitive_jvps[linear_p] = linear_jvp
    ad.primitive_transposes[linear_p] = linear_transpose
    return hook_p, check_p, tangent_p, linear_p


def _violations(rules, env, checked, residuals, cotangents, names):
    """Per batch element, whether the derived gauge residuals of ``checked`` exceed ``sqrt(eps)``
    relative to the cotangents (the criteria of :func:`adjointgen.runtime.degeneracy.check` and
    :func:`adjointgen.runtime.gauge.check`); ``None`` when there is nothing to check."""
    env = dict(env, **dict(zip(names, cotangents)))
    values = dict(zip((*rules.outputs, *(r.output for r in residuals)), checked(env)))
    bad, phase, cluster, basis = None, False, False, False
    # the size of the loss's derivative through the values (max|g_w| max|w|): cotangents of the
    # vectors below sqrt(eps) of it are rounding (a second derivative of a loss of the values alone)
    floor = next((jnp.max(jnp.abs(env[r.split]), axis=-1, keepdims=True) * jnp.max(jnp.abs(env[r.vector]), axis=-1, keepdims=True)
                  for r in residuals if r.vector is not None and r.split is not None and env[r.vector].shape[-1]), 0.0)
    for r in residuals:
        cot = [env[c] for c in r.cotangents]
        residual = values[r.output]
        real = jnp.finfo(residual.dtype).dtype
        eps, tiny = float(jnp.finfo(real).eps), float(jnp.finfo(real).tiny)
        norms = sum(jnp.sqrt(jnp.sum(jnp.abs(g) ** 2, axis=-2)) for g in cot)
        if r.vector is None and r.what == "basis":  # a change of basis of a complement: k x k
            flag = jnp.any(jnp.abs(residual) > math.sqrt(eps) * (norms[..., :, None] + norms[..., None, :]) + tiny,
                           axis=(-2, -1))
            basis = basis | jnp.any(flag)
        elif r.vector is None:  # a phase residual, one per column
            flag = jnp.any(jnp.abs(residual) > math.sqrt(eps) * (norms + floor) + tiny, axis=-1)
            phase = phase | jnp.any(flag)
        else:
            clusters = cluster_mask(jnp, env[r.vector], env.get("cluster_rtol"))
            scale = norms[..., :, None] + norms[..., None, :]
            d = env[r.vector]
            if r.split is not None and d.shape[-1] and not jnp.iscomplexobj(d):
                # the dropped quotient residual / (d_j - d_i) against the gradient's size, as
                # adjointgen.runtime.degeneracy.check: ((A - λ)^2 at a cluster at λ, A^2 at a zero one)
                size = jnp.maximum(jnp.max(jnp.abs(d), axis=-1, keepdims=True), tiny)
                gradient = jnp.max(jnp.abs(env[r.split]), axis=-1, keepdims=True) + jnp.max(norms, axis=-1, keepdims=True) / size
                scale = scale + jnp.abs(d[..., :, None] - d[..., None, :]) * gradient[..., None]
            flag = jnp.any(clusters & (jnp.abs(residual) > math.sqrt(eps) * scale + tiny), axis=(-2, -1))
            if r.split is not None:
                g = env[r.split]  # complex values (eig): their complex differences
                level = jnp.max(jnp.abs(g), axis=-1, keepdims=True)[..., None] if g.shape[-1] else 0
                spread = jnp.abs(g[..., :, None] - g[..., None, :])
                flag = flag | jnp.any(clusters & (spread > math.sqrt(eps) * level + tiny), axis=(-2, -1))
            cluster = cluster | jnp.any(flag)
        bad = flag if bad is None else bad | flag
    return None if bad is None else (bad, phase, cluster, basis)


def _phase_residual(residuals):
    """The phase residual among ``residuals`` (its wording: the rotated outputs, invariant forms)."""
    return next((r for r in residuals if r.vector is None and r.what != "basis"), None)


def _raise(op, phase, cluster, basis=False, phases=None):
    """The host side of the reverse-mode check: the torch side's error classes and advice
    (``phases``: the phase residual, whose declaration words the phase error)."""
    if bool(basis):
        raise gauge.ComplementBasisError(
            f"{op}: the loss depends on the basis chosen for the complement (the columns full_matrices=True "
            "or mode='complete' adds), which is defined only through its span: use a loss of its projector "
            "U2 U2^H, or the reduced factors. Disable this check with adjointgen.runtime.gauge.set_enabled(False)")
    if bool(cluster):
        raise gauge.DegenerateSubspaceError(
            f"{op}: the loss depends on the basis chosen inside a cluster of equal values, or on the individual "
            "values of a cluster, so its gradient does not exist: use a loss that depends on a cluster only "
            "through its span (the projector onto it) and symmetric functions of its values; set the tolerance "
            "with cluster_rtol=, use broadening= for a biased finite surrogate, or disable the check with "
            "adjointgen.runtime.gauge.set_enabled(False). In a second derivative (jax.hessian, "
            "jacrev(jacrev(f)), check_grads(order=2)) at a cluster this check sees the outer derivative's "
            "cotangents, which no invariant loss makes zero: second derivatives at an exact cluster are not "
            "available in JAX (torch's reverse over reverse has them)")
    if bool(phase):
        raise gauge.PhaseDependentLossError(gauge.phase_message(
            op, phases.phases if phases is not None else (), phases.invariant if phases is not None else ""))


_hook_p, _check_p, _tangent_p, _linear_p = _make_primitives()

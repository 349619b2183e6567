"""The host Schur solvers and their checks, for NumPy and CuPy arrays (and JAX's host callbacks):
Bartels-Stewart for ``A X + X B = C`` in Schur form, the triangular Sylvester solve of the
Schur-factor rules (blocked, with a vector fallback), the eigenvalues of a real Schur form, and
the checks that a spectrum admits the solve (no ``λ_i + μ_j = 0``, no eigenvalue on a branch
cut)."""
from __future__ import annotations

import numpy

#: Schur forms of recent host matrices, by content: a backward's Sylvester solve with ``A^H``, ``B^H``
#: (the adjoint of the forward's) reads the forward's forms of ``A``, ``B`` (``A^H = Q S^H Q^H``) instead
#: of computing them again; at most ``_SCHUR_CACHE_SIZE`` entries and ``_SCHUR_CACHE_BYTES`` in all
_SCHUR_CACHE: dict = {}
_SCHUR_CACHE_SIZE, _SCHUR_CACHE_BYTES = 8, 1 << 27


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


def check_triangular_spectrum(xp, T, upper: bool) -> None:
    """The conditions of :func:`triangular_sylvester_solve` on concrete values: ``T`` triangular on the
    ``upper`` side (else a ``ValueError`` naming an entry on the other side: a ``2 x 2`` block of a
    real Schur form, for a pair of complex eigenvalues, is not triangular), and distinct diagonal
    entries (else a :class:`~adjointgen.runtime.checks.SingularMatrixError` naming the equal pair:
    a repeated eigenvalue, defective or not, where the solution is not unique).  Diagonal entries
    closer than ``sqrt(eps)`` relative to the largest are equal (the split of a defective
    eigenvalue by rounding is of that order)."""
    from .xp import is_cupy

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
    from .xp import solve_triangular

    return solve_triangular(xp, M, b[..., None], lower=not upper)[..., 0]

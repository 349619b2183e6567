"""Host forwards of catalogue operations that SciPy lacks, or computes silently wrong at the edge of
their domain.  Each takes one matrix (a 2-D NumPy array) per input, as SciPy's functions do; the
derivation declares it with ``d.forward(host="adjointgen.catalogue._forwards:<name>")`` and
:mod:`adjointgen.runtime.host` runs it for every backend (torch on any device, NumPy, CuPy, JAX).

Algorithms and domain checks only: every derivative is derived in the derivation files.
"""
from __future__ import annotations

import numpy
import scipy.linalg

from adjointgen.runtime.schur import bartels_stewart, schur_eigenvalues


def polar(a):
    """``(U, P)`` with ``A = U P`` (SciPy's ``polar``), for ``m >= n``: ``U`` with orthonormal columns,
    ``P = (A^H A)^(1/2)``, the domain of ``derivations/polar.py``'s rules (the public function reaches
    ``side="left"`` and wide ``A`` through :func:`adjointgen.catalogue._extensions.polar`)."""
    m, n = a.shape[-2:]
    if m < n:
        raise ValueError(f"polar: A is {m}x{n} (wide): the derived rules are for m >= n; the public function "
                         "takes wide A through the decomposition of A^H")
    return scipy.linalg.polar(a, side="right")


def solve_sylvester(a, b, q):
    """``X`` with ``A X + X B = Q`` by Bartels-Stewart (:func:`adjointgen.runtime.xp.bartels_stewart`);
    a ``SingularMatrixError`` names an eigenvalue of ``A`` that is the negative of one of ``B``
    (SciPy's ``solve_sylvester`` perturbs it silently)."""
    return bartels_stewart(a, b, q)


def solve_continuous_lyapunov(a, q):
    """``X`` with ``A X + X A^H = Q`` (SciPy's ``solve_continuous_lyapunov``): one Schur form of ``A``;
    a ``SingularMatrixError`` names the eigenvalues ``a_i``, ``conj(a_j)`` with ``a_i + conj(a_j) = 0``
    (SciPy perturbs them silently)."""
    return bartels_stewart(a, a.conj().T, q)


def signm(a):
    """The matrix sign function ``S = A (A^2)^(-1/2)`` by the Schur method with reordering (Higham,
    Functions of Matrices, §5.2): the Schur form ``A = Z T Z^H`` (real for real ``A``) with the eigenvalues of
    positive real part first, ``T = [[T11, T12], [0, T22]]``, gives ``sign(T) = [[I, Y], [0, -I]]``
    with ``T11 Y - Y T22 = 2 T12`` (a Sylvester equation whose two sides have no eigenvalue in
    common).  Real ``A`` gives real ``S``.  A ``ValueError`` names an eigenvalue on the imaginary
    axis (to rounding), where ``sign`` is not defined.  SciPy's ``signm`` returns zeros there, and
    elsewhere shifts ``A`` when its Parlett recurrence fails."""
    n = a.shape[-1]
    if not n:
        return numpy.zeros_like(a)
    # real A: the real Schur form (2 x 2 blocks for complex pairs), four times cheaper than the complex one
    T, Z, k = scipy.linalg.schur(a, output="complex" if numpy.iscomplexobj(a) else "real", sort="rhp")
    w = schur_eigenvalues(T)
    eps = numpy.finfo(w.real.dtype).eps
    scale = max(numpy.abs(w).max(), numpy.finfo(w.real.dtype).tiny)
    near = numpy.abs(w.real) <= 100 * n * eps * scale
    if near.any():
        i = int(numpy.argmax(near))
        raise ValueError(f"signm: the eigenvalue {complex(w[i]):.6g} of A is on the imaginary axis (to rounding, "
                         f"|Re| = {abs(w[i].real):.2e}): the matrix sign function is not defined there")
    S = -numpy.eye(n, dtype=T.dtype)
    S[:k, :k] = numpy.eye(k)
    if 0 < k < n:
        S[:k, k:] = bartels_stewart(T[:k, :k], -T[k:, k:], 2 * T[:k, k:])
    S = Z @ S @ Z.conj().T
    return S.real.astype(a.dtype, copy=False) if not numpy.iscomplexobj(a) else S


def ldl(a):
    """``(L, d)`` with ``A = L diag(d) L^H`` and no pivoting: ``L`` unit lower triangular, ``d`` real,
    for a Hermitian ``A`` whose leading principal minors are nonzero (positive definite, negative
    definite, quasi-definite, or any such indefinite ``A``).  Column by column, each an ``O(n^2)``
    update.  A :class:`~adjointgen.runtime.checks.SingularMatrixError` names the pivot that is zero to
    rounding (a singular leading principal submatrix): there the unpivoted factorization does not
    exist, or has no derivative; ``scipy.linalg.ldl`` (Bunch-Kaufman pivoting) factors such ``A``."""
    n = a.shape[-1]
    L = numpy.eye(n, dtype=a.dtype)
    d = numpy.zeros(n, dtype=numpy.zeros((), a.dtype).real.dtype)
    if not n:
        return L, d
    scale = numpy.abs(a).max()
    tol = 8 * n * numpy.finfo(d.dtype).eps * scale
    for j in range(n):
        v = L[j, :j].conj() * d[:j]  # conj(L_jk) d_k, k < j
        pivot = a[j, j].real - (L[j, :j] @ v).real
        if not abs(pivot) > tol:  # also a NaN
            from adjointgen.runtime.checks import SingularMatrixError

            raise SingularMatrixError(
                f"ldl: pivot {j} is {pivot:.3g} (zero to rounding, |A| = {scale:.3g}): the leading {j + 1} x {j + 1} "
                "submatrix of A is singular, so A has no LDL^H factorization without pivoting (or it has no "
                "derivative); scipy.linalg.ldl factors A with symmetric pivoting")
        d[j] = pivot
        L[j + 1:, j] = (a[j + 1:, j] - L[j + 1:, :j] @ v) / pivot
    return L, d

"""Forward solvers for the partial (k of n) symmetric and generalized eigenproblem.

``A U = B U D``, ``U^T B U = I`` (``B = I`` when not given), ``D`` holding the ``k`` largest or
smallest eigenvalues. This module only computes eigenpairs; it holds no derivative formula (those are
generated from ``derivations/``). What it guarantees to the generated gradient code:

- the returned pairs have a *measured* relative residual (``info.residual``) at most the tolerance,
  or a :class:`ConvergenceError` is raised;
- no eigenvalue is skipped silently (``info.certificate``, below): a Krylov solver can converge to
  the wrong pairs (ARPACK's ``'SA'`` misses the exact 0 of an 800 x 800 tridiagonal matrix with one
  zeroed row and column in each of 10 runs, five random starts times ``ncv`` 40 and 80: it returns
  0.158, 0.239, 0.288 for the three smallest), so an iterative route's result is certified or
  checked, and repaired or refused;
- a :class:`UserWarning` when the gap between the last kept and the first discarded eigenvalue is
  below ``max(sqrt(eps), 10 tol)`` times ``||A|| + |d_k| ||B||`` (the scale of the residuals, not of
  the computed eigenvalues, which may all be tiny next to ``||A||``); ``info.split`` names the kept
  pairs that coincide with the first discarded one to within ``info.resolution`` (``k`` cuts a
  degenerate eigenvalue: the autograd glue refuses to differentiate through those pairs);
- clear ``ValueError`` for bad input.

Routes (``info.method``), chosen by size, structure and device (override with ``method=``):

``"dense"``
    When ``n <= 600``, or ``3 k >= n``, or ``k >= n - 1``, or the input is dense with ``B`` and
    ``n <= 2000``, or dense without ``B`` and ``n <= 1000``. On the CPU: LAPACK through
    :func:`scipy.linalg.eigh` with ``subset_by_index`` (``syevr``, MRRR, for ``B = I``; ``sygvx`` for
    generalized problems) computing only the wanted eigenpairs; for dense input without ``B`` and
    ``400 < n <= 1000`` the whole spectrum by :func:`torch.linalg.eigh`, which makes the backward's
    shifted solves exact GEMMs (:class:`~adjointgen.runtime.linsolve.SpectralAid`). On other devices:
    :func:`torch.linalg.eigh`, generalized problems reduced with a Cholesky factor ``L`` of ``B``:
    ``L^{-1} A L^{-T}``. Sparse or operator input is densified (an ``n x n`` matrix: this route is
    for small ``n`` or large ``k``). Measured on 2 CPU threads, n = 1000, k = 8: ``syevr`` subset
    30 ms, ``torch.linalg.eigh`` (full) 63 ms; n = 600: 9 ms vs 18 ms.
``"krylov"``
    Dense input without ``B`` on the CPU, ``n > 1000`` (and ``4 (k + 25) <= n``): block Lanczos (block
    8, full reorthogonalization) in torch, usually on ``(sigma I - A)^{-1}`` through one Cholesky
    factorization (:func:`_solve_krylov`). Falls back to ``"dense"`` when its basis limit is reached,
    or (when chosen automatically) as soon as it has spent, or predicts from its convergence so far
    that it would spend, 1.5 times the direct solver's time (priced from its own measured products):
    it then costs at most about 2.5 times the direct route, usually far less since the prediction
    gives up after a few passes, and a fraction of it on spectra where it converges fast. The route
    is then timing dependent: results agree to the tolerance, not bit for bit, between runs on a
    loaded machine; pass ``method=`` for a fixed route.
    Measured on 2 CPU threads, GOE n = 2000, k = 8: 0.11 s (22 passes of triangular solves after 6
    locating passes), where ``syevr`` subset takes 0.37 s and plain block Lanczos 0.18 s (80
    passes); it also returns 24 extra Ritz pairs, which deflate the backward's solves.
``"arpack"``
    CPU, large sparse / dense input, ``B`` absent or explicit (dense or sparse):
    :func:`scipy.sparse.linalg.eigsh` (implicitly restarted Lanczos) for ``k + 1`` pairs with
    ``which='LA'``/``'SA'``, ``ncv = max(40, 3 (k + 1))``; generalized problems in ARPACK's mode 2
    with ``M = B`` and ``Minv`` from a Cholesky factor (dense ``B``) or a symmetric-mode sparse LU
    (sparse ``B``). If ARPACK's own stopping test is met but the measured residual is not (it
    happens for ill-conditioned ``B``), it is restarted once from the current vectors with a tighter
    tolerance. (Shift-invert below the spectrum for the smallest eigenvalues was measured on the
    300 x 300 grid Laplacian with potential, k = 8: 0.26 s factorization + 3.1 s for 332 solves at the
    Gershgorin bound, vs 5.3 s for ``'SA'``; it is used here only to repair skipped eigenvalues.)
``"lobpcg"``
    Non-CPU devices (torch ops only, so CUDA works without CuPy), and any device when ``B`` is a
    matvec closure: a block LOBPCG written here (B-orthonormalised basis ``[X, W, P]``,
    Rayleigh–Ritz with a Cholesky-factored Gram matrix, soft locking of converged columns, block
    size ``max(k + 1, min(2 (k + 1), n // 3))``). Its stopping test is the measured residual itself.

Certificates (``info.certificate``): ``"direct"`` for the dense route (LAPACK selects the pairs by
index). The iterative routes count: where a factorization is affordable (dense or sparse CPU ``A``,
``B`` absent or explicit; for sparse input when the band ``LDL^T`` flops of a reverse
Cuthill–McKee ordering are at most 20 times the flops of the products the solve spent), Sylvester's
law of inertia at a shift ``sigma`` between the k-th and (k+1)-th computed eigenvalue must give
exactly ``k`` eigenvalues beyond ``sigma`` (``"inertia"``): sparse input by the pivots of a
symmetric-mode sparse ``LDL^T`` (``splu`` with ``diag_pivot_thresh=0``, trusted only with diagonal
pivots and a small backward error), dense input by one Cholesky factorization of ``s (A - sigma B)``
with the k computed pairs deflated (positive definite iff none is missing). When the k-th and
(k+1)-th pair coincide, ``sigma`` goes in front of their cluster instead. A count that is too high
means skipped eigenvalues: dense input is recomputed by the direct solver, sparse input by ARPACK in
shift-invert mode with the same factorization for all eigenvalues beyond ``sigma``, and the count is
checked again (``"repaired"``); a count that cannot be trusted falls back to the check below, one
that is too far off to repair raises :class:`ConvergenceError`. Measured: 0.30 s (+0.04 s for the
fill estimate) on the 300 x 300 grid with k = 8 next to 3.9 s for ARPACK; 0.046 s on the dense n = 2000 route (0.11 s), whose factor then
preconditions the backward (15 CG iterations instead of 186). Without an affordable factorization
(matvec closures, non-CPU tensors, too much fill) an independent block LOBPCG run on the pencil with
the computed pairs deflated must find nothing beyond them (``"second-opinion"``); when it does, the
pairs are recomputed (``"repaired"``), and when it cannot converge a :class:`ConvergenceError` is
raised rather than an unchecked answer returned.

The factorization and the extra pairs are handed on to the backward (``info.aid``, a
:class:`~adjointgen.runtime.linsolve.ShiftedSolveAid`).

Tolerance: ``tol`` bounds the relative residual of every returned pair,
``||A u_i - d_i B u_i|| / ((||A|| + |d_i| ||B||) ||u_i||)`` with ``||A||``, ``||B||`` estimated by a
few power iterations (lower bounds, so the test errs on the strict side). The default is
``eps ** (2/3)`` of the dtype (3.7e-11 for float64, 2.4e-5 for float32): about two thirds of the
digits, which keeps Lanczos/LOBPCG iteration counts moderate; pass a smaller ``tol`` when gaps are
small (eigenvector error is about residual * ||A|| / gap). ``tol`` is clamped below at ``10 eps``.
The dense route is direct; its residual is checked against ``max(tol, eps ** (1/3))``, which only
catches broken input (a non-symmetric closure, an extremely ill-conditioned ``B``).

Complex Hermitian problems (complex64/complex128 ``A``, Hermitian positive definite ``B``; ``^T``
above is then the conjugate transpose) take the same routes with these differences: the eigenvalues
are real (float32/float64), the eigenvectors complex, each normalised so that its largest-magnitude
entry is real and positive; ``"krylov"`` (its banded Ritz solver is real) is replaced by
``"dense"`` (``n <= 2000``) or ``"arpack"``; ARPACK runs its complex (Arnoldi) driver, which scipy
uses for Hermitian input, and its vectors get a Rayleigh–Ritz step so that they are exactly
B-orthonormal also inside clusters; the inertia certificates count the real pivots of the
Hermitian ``LDL^T`` (``L D L^H``) and the Cholesky factor is complex.
"""
from __future__ import annotations

from ..errors import ConvergenceError
from .common import DENSE_INPUT_MAX_N, DENSE_MAX_N, PartialEighInfo
from .entry import partial_eigh, partial_eigh_batched

__all__ = ["ConvergenceError", "PartialEighInfo", "partial_eigh", "partial_eigh_batched"]

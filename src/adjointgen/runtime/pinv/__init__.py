"""Forward pass of the Moore–Penrose pseudo-inverse with a rank-revealing fast path (MATH.md §5).

``pinv_forward(A)`` returns what ``torch.linalg.pinv(A, atol=, rtol=, hermitian=)`` returns, but
computes it with a cheap factorization whenever that provably (with overwhelming probability, see
below) gives the same matrix: when every singular value of ``A`` is clearly above torch's cutoff,
no singular value is discarded, so the pseudo-inverse is the ordinary inverse (square), the
least-squares inverse ``(A^H A)^-1 A^H`` (tall), ``A^H (A A^H)^-1`` (wide), or ``H^-1`` (Hermitian).
Otherwise it calls ``torch.linalg.pinv`` itself, so the slow path is torch's result bit for bit.

This module computes values only. The gradient is generated from the derivation of §5; the public
op wraps this function in an autograd Function and runs it under ``torch.no_grad()``.

Routes (``PinvInfo.method``)
    ``"lu"``        square, not Hermitian: LU with partial pivoting, inverse from the factors by
                    one solve with the identity in place (the LAPACK calls of ``torch.linalg.inv``).
                    A real row-major ``A`` is factored as ``A^T``, which is column-major already, and
                    solved transposed, so no transposing copy of ``A`` is made.
    ``"cholesky"``  tall/wide: Cholesky of the Gram matrix ``A^H A`` (``A A^H`` for wide), then one
                    ``cholesky_solve`` for ``A^H`` (no explicit inverse of the Gram matrix); ``‖A‖_F``
                    comes from the Gram matrix's trace. With ``hermitian=True``: Cholesky of ``H`` (or
                    of ``-H`` when ``H`` is negative definite), where ``H`` is the Hermitian matrix of
                    the lower triangle, as torch reads it (Cholesky reads only that triangle), and
                    ``cholesky_inverse``.
    ``"qr"``        tall/wide with a condition number too large for the normal equations but small
                    enough for Householder QR: ``A⁺ = R^-1 Q^H``.
    ``"svd"``       fallback, ``torch.linalg.pinv`` (SVD); ``"eigh"`` the Hermitian fallback.

When the fast path is taken
    The factorization is computed first (it is a fraction of the SVD's cost, which bounds the
    overhead paid on a refused matrix). From its factors we get, per matrix,

    * ``sigma_min_lo`` — a lower bound on the smallest singular value, from power iteration on the
      inverse operator (``(A^H A)^-1`` through the LU or Cholesky factors) with random starts;
    * ``sigma_max_up`` — an upper bound on the largest one: ``min(‖A‖_F, power-iteration bound)``;
    * ``cutoff_up = max(atol, rtol * sigma_max_up)`` — an upper bound on torch's cutoff;
    * ``kappa_up = sigma_max_up / sigma_min_lo`` — an upper bound on the condition number.

    Power iteration from a random start only ever *under*-estimates the norm of an operator
    (``‖M^k x‖^(1/k) <= ‖M‖`` for unit ``x``), so its raw value is an upper bound on ``sigma_min``:
    the unsafe direction. It is turned into a lower bound with Dixon's theorem (SIAM J. Numer.
    Anal. 20, 1983): if ``x`` is uniform on the unit sphere, ``|u1 . x|^2 < δ`` has probability at
    most ``0.8 sqrt(n δ)``, and otherwise ``‖M^k x‖ >= ‖M‖^k |u1 . x|``. With ``L`` "levels" (one
    level = one multiplication by something of norm ``1/sigma_min``), the raw per-level growth
    ``g = ‖v_L‖^(1/L)`` satisfies ``1/sigma_min <= s * g`` except with probability
    ``<= 0.8 sqrt(n) s^-L`` per probe, for any slack ``s >= 1`` fixed in advance. ``N_PROBES``
    independent probes are run and the largest growth is kept, so a wrong bound needs every probe to
    fail: probability ``<= (0.8 sqrt(n) s^-L)^N_PROBES``. The same argument gives ``sigma_max_up``.

    The bounds are computed in two stages, and the failure probability is split between them
    (``FAILURE_PROBABILITY / 2`` each, so that by the union bound each of the two bounds of each
    matrix is wrong with probability at most ``FAILURE_PROBABILITY`` = 1e-12 overall):

    1. *Quick stage*: ``QUICK_LEVELS`` levels (2 for LU and Hermitian Cholesky, where the upper
       bound is ``‖A‖_F`` alone; 4 for the Gram route, whose cap needs a tighter ``sigma_max``),
       with the large slack ``s`` that makes so few levels meet the probability. A well-conditioned
       matrix is accepted here; for LU the stage costs two solves with the factors for 16
       vectors, 10-15% of the factorization at n = 2000 on 2 CPU cores (``bench_pinv.py``). A
       matrix that the *deterministic* side of the same numbers already condemns (``sigma_min <=
       1/g`` and ``sigma_max >= max(g_fwd, ‖A‖_F / sqrt(min(m, n)))`` hold for the computed factors
       whatever the probes) is refused here too, without further iteration: the full stage could
       not accept it (except when its own bound fails), and refusing is always correct.
    2. *Full stage*, only when the quick one is inconclusive: the same probes are iterated on to
       ``L`` levels, the smallest ``L`` for which slack ``SIGMA_SLACK`` (1.5) meets the probability.
       Each bound kept is the better of the two stages' (both hold, except with the summed
       probability).

    The probes come from a private generator with a fixed seed, so the decision is reproducible
    and the caller's random state is untouched; they are drawn outside functorch's view (under
    ``torch._C._DisableFuncTorch``), so that a random operation never happens inside a ``vmap``
    (``jacfwd``, ``hessian``) and no ``randomness=`` argument is needed.

    The fast path is taken only if, for every matrix of the batch,

    1. the factorization succeeded (no zero pivot / the Gram matrix is numerically definite),
    2. ``sigma_min_lo > CUTOFF_MARGIN * cutoff_up`` (``CUTOFF_MARGIN = 10``): torch's SVD would keep
       every singular value, with room for the rounding errors of both algorithms, and
    3. ``kappa_up`` is below the accuracy cap of the route, so that its error stays close to the
       SVD route's ``~ kappa * eps``: ``eps^-1/2`` for the backward-stable LU, QR and Hermitian
       Cholesky (double 6.7e7, single 2.9e3; ``kappa * eps <= sqrt(eps)``); ``eps^-1/6`` for the
       normal equations (double 406, single 14), whose error ``kappa^2 * eps`` then stays below
       ``eps^(2/3)`` and within a factor ``kappa`` of the SVD's.

    The bounds describe the *computed* factors. For LU and the Hermitian Cholesky the difference
    to ``A`` is the factorization's backward error, ``O(eps ‖A‖)``, which is tiny against
    ``sigma_min`` under the caps and absorbed by the 10x margin. Forming a Gram matrix perturbs its
    eigenvalues by up to ``~(m + n) eps ‖A‖^2`` (a first-order worst-case model), which is *not*
    small against ``sigma_min^2`` in general; that amount is subtracted from the lower bound, and
    the Gram route is refused when the correction exceeds a quarter of the bound
    (``GRAM_CORRECTION_MAX``), i.e. when the Gram matrix cannot resolve ``sigma_min``.

Batches and synchronisation
    The decision is made for the whole batch: if any matrix fails a test, the whole batch goes to
    ``torch.linalg.pinv``. Everything up to a decision runs on the device; the checks of the input
    (finite entries, symmetry, non-negative tolerance tensors) and the quick stage's decision are
    brought to the host together in *one* transfer (a device synchronisation on CUDA); a second
    one follows only when the full stage runs, and one more only when the input turns out to be
    invalid (to name the offending value).

Transforms
    ``torch.func.grad``, ``jvp``, ``jacrev``, ``jacfwd`` and ``hessian`` hand the autograd
    Function's forward plain tensors, so the decision is made as without them. Under ``vmap`` the
    forward receives a ``BatchedTensor``, whose values cannot reach the host from inside the
    transform; ``pinv_forward`` then takes the underlying physical tensor (all vmapped dimensions
    moved to the front), decides for that whole stacked batch as for any batch (so the result is
    the fast path's, or ``torch.linalg.pinv``'s when any matrix of the stack is refused) and wraps
    the result back. Where that is not possible — ``atol``/``rtol`` tensors that are themselves
    vmapped, wrappers other than ``vmap``'s between the levels, ``torch.compile`` tracing — it calls
    ``torch.linalg.pinv`` directly (torch's result and semantics, without this module's value checks).
    Empty inputs (a zero batch size, ``m = 0`` or ``n = 0``) are ``torch.linalg.pinv``'s, shapes
    included.
"""
from __future__ import annotations

from .common import (CUTOFF_MARGIN, FAILURE_PROBABILITY, GRAM_CORRECTION_MAX, N_PROBES, QUICK_LEVELS,
                     SIGMA_SLACK, SYMMETRY_FACTOR, PinvInfo)
from .decision import pinv_forward

__all__ = [
    "CUTOFF_MARGIN",
    "FAILURE_PROBABILITY",
    "N_PROBES",
    "PinvInfo",
    "QUICK_LEVELS",
    "SIGMA_SLACK",
    "pinv_forward",
]

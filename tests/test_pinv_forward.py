"""``adjointgen.runtime.pinv.pinv_forward`` against ``torch.linalg.pinv``.

What is compared, and why the tolerances are what they are:

* When the fast path is refused the result *is* ``torch.linalg.pinv``'s, so it is compared with
  ``torch.equal`` (bit for bit).
* When it is taken on a matrix whose rank is unambiguous, each algorithm's forward error is about
  ``c * kappa * eps``: the SVD and QR routes are backward stable and first-order perturbation theory
  for the pseudo-inverse at constant rank (Wedin: ``‖B⁺ - A⁺‖ <= sqrt(2) ‖A⁺‖ ‖B⁺‖ ‖B - A‖``) turns
  a backward error ``c * eps`` into that; the inverse from LU factors has the same forward-error
  bound (Higham, Accuracy and Stability, ch. 14). So their difference is ``<= 2 c kappa eps``. We
  allow ``ERROR_CONSTANT * kappa * eps`` with ``ERROR_CONSTANT = 10`` and the exact ``kappa`` (computed here
  by SVD in float64). For the normal equations (Cholesky of ``A^T A``) forming ``A^T A`` squares
  the condition number, so the allowance is ``ERROR_CONSTANT * kappa^2 * eps``. In float64 with the
  random matrices below (kappa < 1e3) all of these are below 1e-10, which is asserted as well.
* For an ill-conditioned but still accepted matrix (cond 1e6) two correct algorithms legitimately
  differ by ``~ kappa * eps ~ 1e-10``: there we check the same ``kappa * eps`` allowance and, in
  addition, that our Penrose residuals are no worse than 10x torch's (plus a ``kappa * eps`` floor).

Then: empty inputs (torch's shapes), ``torch.func`` (probes drawn outside functorch, ``vmap``
deciding for the stacked batch), and the two stages of the bounds with their probability budget.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch

from adjointgen.runtime.pinv import (
    CUTOFF_MARGIN,
    FAILURE_PROBABILITY,
    N_PROBES,
    QUICK_LEVELS,
    SIGMA_SLACK,
    PinvInfo,
    pinv_forward,
)
from adjointgen.runtime.pinv.bounds import _levels_needed, _slack

ERROR_CONSTANT = 10.0
F64_TOL = 1e-10


def _orthonormal(rows: int, cols: int, generator: torch.Generator, dtype=torch.float64) -> torch.Tensor:
    Q, _ = torch.linalg.qr(torch.randn(rows, cols, dtype=dtype, generator=generator))
    return Q


def with_spectrum(m: int, n: int, singular_values, *, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    """``U diag(s) V^T`` with random orthonormal ``U``, ``V``; zeros pad ``s`` to ``min(m, n)``."""
    generator = torch.Generator().manual_seed(seed)
    k = min(m, n)
    s = torch.zeros(k, dtype=torch.float64)
    values = torch.as_tensor(singular_values, dtype=torch.float64)
    s[: len(values)] = values
    A = _orthonormal(m, k, generator) * s @ _orthonormal(n, k, generator).T
    return A.to(dtype)


def log_spaced(k: int, cond: float) -> torch.Tensor:
    return torch.logspace(0.0, -math.log10(cond), k, dtype=torch.float64)


def gaussian(*shape, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def relative_error(X: torch.Tensor, reference: torch.Tensor) -> float:
    return (torch.linalg.matrix_norm(X - reference) / torch.linalg.matrix_norm(reference)).max().item()


def exact_condition(A: torch.Tensor) -> float:
    s = torch.linalg.svdvals(A.to(torch.complex128 if A.is_complex() else torch.float64))
    return (s[..., 0] / s[..., -1]).max().item()


def penrose_residuals(A: torch.Tensor, X: torch.Tensor) -> list[float]:
    """The four Penrose conditions, each relative to the size of the matrix it should reproduce."""
    def rel(R, ref):
        return (torch.linalg.matrix_norm(R) / torch.linalg.matrix_norm(ref)).max().item()

    AX, XA = A @ X, X @ A
    return [rel(AX @ A - A, A), rel(XA @ X - X, X), rel(AX - AX.mH, AX), rel(XA - XA.mH, XA)]


def eps(dtype) -> float:
    return torch.finfo(dtype).eps


# --------------------------------------------------------------------------------------------------
# fast path taken, accurate
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, method",
    [
        ((60, 60), "lu"),
        ((90, 40), "cholesky"),
        ((40, 90), "cholesky"),
        ((3, 30, 30), "lu"),
        ((2, 3, 50, 20), "cholesky"),
    ],
)
def test_full_rank_float64_takes_fast_path(shape, method):
    A = gaussian(*shape, seed=1)
    X, info = pinv_forward(A, return_info=True)
    assert isinstance(info, PinvInfo) and info.method == method, info
    kappa = exact_condition(A)
    power = 2 if method == "cholesky" else 1
    error = relative_error(X, torch.linalg.pinv(A))
    assert error <= ERROR_CONSTANT * kappa**power * eps(torch.float64), (error, kappa)
    assert error <= F64_TOL
    assert X.shape == (*shape[:-2], shape[-1], shape[-2]) and X.dtype == A.dtype
    # the reported bounds bracket the truth
    s = torch.linalg.svdvals(A)
    assert info.sigma_min_est <= s[..., -1].min().item()
    assert info.sigma_max_est >= s[..., 0].max().item()


@pytest.mark.parametrize("shape, method", [((40, 40), "lu"), ((120, 30), "cholesky"), ((30, 120), "cholesky")])
def test_full_rank_float32_honest_tolerance(shape, method):
    # Normal equations in single precision are capped at cond <= eps^-1/6 ~ 14 (before the bound's
    # slack), so the tall/wide cases use Gaussian matrices (cond ~ 3); LU gets cond 100.
    if method == "cholesky":
        A32 = gaussian(*shape, seed=2, dtype=torch.float32)
    else:
        A32 = with_spectrum(*shape, log_spaced(min(shape), 100.0), seed=2).to(torch.float32)
    X, info = pinv_forward(A32, return_info=True)
    assert info.method == method, info
    kappa = exact_condition(A32)
    power = 2 if method == "cholesky" else 1
    error = relative_error(X, torch.linalg.pinv(A32))
    assert error <= ERROR_CONSTANT * kappa**power * eps(torch.float32), (error, kappa)


def test_complex128_fast_path():
    generator = torch.Generator().manual_seed(3)
    A = torch.randn(40, 40, dtype=torch.complex128, generator=generator)
    B = torch.randn(70, 30, dtype=torch.complex128, generator=generator)
    for M, method in ((A, "lu"), (B, "cholesky")):
        X, info = pinv_forward(M, return_info=True)
        assert info.method == method
        assert relative_error(X, torch.linalg.pinv(M)) <= F64_TOL


@pytest.mark.parametrize("shape, method", [((80, 80), "lu"), ((90, 40), "qr"), ((40, 90), "qr")])
def test_cond_1e6_accepted_and_as_good_as_svd(shape, method):
    A = with_spectrum(*shape, log_spaced(min(shape), 1e6), seed=4)
    X, info = pinv_forward(A, return_info=True)
    assert info.method == method, info
    reference = torch.linalg.pinv(A)
    kappa = 1e6
    assert relative_error(X, reference) <= ERROR_CONSTANT * kappa * eps(torch.float64)
    floor = kappa * eps(torch.float64)
    for ours, theirs in zip(penrose_residuals(A, X), penrose_residuals(A, reference)):
        assert ours <= 10 * theirs + floor, (ours, theirs)


def test_tall_moderate_condition_uses_qr():
    # cond 1e4: too large for the normal equations (cap eps^-1/6 ~ 406), fine for QR (cap eps^-1/2).
    A = with_spectrum(100, 40, log_spaced(40, 1e4), seed=5)
    for M in (A, A.mT):
        X, info = pinv_forward(M, return_info=True)
        assert info.method == "qr", info
        assert relative_error(X, torch.linalg.pinv(M)) <= ERROR_CONSTANT * 1e4 * eps(torch.float64)


# --------------------------------------------------------------------------------------------------
# fast path refused: the result is torch's, bit for bit
# --------------------------------------------------------------------------------------------------


def assert_refused_and_equal(A, **kwargs):
    X, info = pinv_forward(A, return_info=True, **kwargs)
    expected_method = "eigh" if kwargs.get("hermitian") else "svd"
    assert info.method == expected_method, info
    assert info.reason.startswith("fallback"), info
    assert torch.equal(X, torch.linalg.pinv(A, **kwargs))
    return info


@pytest.mark.parametrize("shape", [(60, 60), (90, 40), (40, 90)])
def test_rank_deficient_refused(shape):
    rank = min(shape) // 2
    A = with_spectrum(*shape, torch.linspace(1.0, 0.1, rank), seed=6)
    assert_refused_and_equal(A)


@pytest.mark.parametrize("cond", [1e10, 1e14])
@pytest.mark.parametrize("shape", [(60, 60), (90, 40), (40, 90)])
def test_ill_conditioned_refused(shape, cond):
    A = with_spectrum(*shape, log_spaced(min(shape), cond), seed=7)
    assert_refused_and_equal(A)


@pytest.mark.parametrize("factor", [0.5, 2.0, 5.0])
@pytest.mark.parametrize("shape", [(50, 50), (80, 30)])
def test_near_atol_cutoff_refused(shape, factor):
    atol = 1e-4
    A = with_spectrum(*shape, log_spaced(min(shape), 1.0 / (factor * atol)), seed=8)
    info = assert_refused_and_equal(A, atol=atol)
    assert "cutoff" in info.reason


@pytest.mark.parametrize("factor", [0.5, 3.0])
def test_near_rtol_cutoff_refused(factor):
    rtol = 1e-3
    A = with_spectrum(40, 40, log_spaced(40, 1.0 / (factor * rtol)), seed=9)
    info = assert_refused_and_equal(A, rtol=rtol)
    assert "cutoff" in info.reason


def test_near_default_cutoff_float32_refused():
    # default rtol = eps * n; put sigma_min at 3x that cutoff.
    n = 64
    A = with_spectrum(n, n, log_spaced(n, 1.0 / (3 * n * eps(torch.float32))), seed=10).to(torch.float32)
    assert_refused_and_equal(A)


def test_batch_with_one_hard_matrix_falls_back_as_a_whole():
    good = gaussian(3, 30, 30, seed=11)
    bad = with_spectrum(30, 30, torch.ones(10), seed=12)
    A = torch.cat([good, bad[None]], dim=0)
    assert_refused_and_equal(A)
    assert pinv_forward(good, return_info=True)[1].method == "lu"


# --------------------------------------------------------------------------------------------------
# cutoff semantics (torch's defaults)
# --------------------------------------------------------------------------------------------------


def test_cutoff_follows_torch_defaults():
    A = gaussian(30, 30, seed=13)
    e, n = eps(torch.float64), 30
    _, info = pinv_forward(A, return_info=True)
    assert info.cutoff == pytest.approx(e * n * info.sigma_max_est)
    _, info = pinv_forward(A, atol=0.0, return_info=True)  # atol = 0 keeps the default rtol
    assert info.cutoff == pytest.approx(e * n * info.sigma_max_est)
    _, info = pinv_forward(A, atol=1e-9, return_info=True)  # atol > 0 alone sets rtol = 0
    assert info.cutoff == pytest.approx(1e-9)
    _, info = pinv_forward(A, atol=1e-9, rtol=1e-3, return_info=True)
    assert info.cutoff == pytest.approx(max(1e-9, 1e-3 * info.sigma_max_est))
    # a cutoff above some singular values: refused, torch's truncated result
    assert_refused_and_equal(A, rtol=0.5)


def test_tensor_tolerances_per_batch():
    A = gaussian(3, 25, 25, seed=14)
    atol = torch.tensor([0.0, 1e-8, 1e-6], dtype=torch.float64)
    X, info = pinv_forward(A, atol=atol, return_info=True)
    assert info.method == "lu"
    assert relative_error(X, torch.linalg.pinv(A, atol=atol)) <= F64_TOL
    huge = torch.tensor([0.0, 0.0, 1e3], dtype=torch.float64)
    assert_refused_and_equal(A, atol=huge)


# --------------------------------------------------------------------------------------------------
# hermitian=True
# --------------------------------------------------------------------------------------------------


def test_hermitian_definite_and_indefinite():
    B = gaussian(50, 50, seed=15)
    spd = B @ B.T + 50 * torch.eye(50, dtype=torch.float64)
    for H in (spd, -spd):
        X, info = pinv_forward(H, hermitian=True, return_info=True)
        assert info.method == "cholesky", info
        assert relative_error(X, torch.linalg.pinv(H, hermitian=True)) <= F64_TOL
    indefinite = spd - 100 * torch.eye(50, dtype=torch.float64)
    assert_refused_and_equal(indefinite, hermitian=True)
    singular_psd = B[:, :20] @ B[:, :20].T
    assert_refused_and_equal(singular_psd, hermitian=True)


def test_hermitian_uses_lower_triangle_like_torch():
    B = gaussian(30, 30, seed=16)
    H = B @ B.T + 30 * torch.eye(30, dtype=torch.float64)
    H = H + 1e-15 * torch.triu(gaussian(30, 30, seed=17), 1)  # asymmetry below the tolerance
    X, info = pinv_forward(H, hermitian=True, return_info=True)
    assert info.method == "cholesky"
    assert relative_error(X, torch.linalg.pinv(H, hermitian=True)) <= F64_TOL


# --------------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------------


def _with_entry(value):
    A = gaussian(6, 6, seed=18)
    A[2, 3] = value
    return A


@pytest.mark.parametrize(
    "make, kwargs, message",
    [
        (lambda: _with_entry(float("nan")), {}, "NaN"),
        (lambda: _with_entry(float("inf")), {}, "infinite"),
        (lambda: _with_entry(float("-inf")), {"hermitian": False}, "infinite"),
        (lambda: _with_entry(float("nan"))[:, :4], {}, "NaN"),  # the Gram route's check (trace of A^T A)
        (lambda: _with_entry(float("inf"))[:4, :], {}, "infinite"),
        (lambda: gaussian(6, 6), {"atol": -1.0}, "atol"),
        (lambda: gaussian(6, 6), {"rtol": -1e-3}, "rtol"),
        (lambda: gaussian(6, 6), {"atol": float("nan")}, "atol"),
        (lambda: gaussian(2, 6, 6), {"atol": torch.tensor([0.0, -1.0], dtype=torch.float64)}, "non-negative"),
        (lambda: gaussian(6), {}, "2 dimensions"),
        (lambda: torch.ones(4, 4, dtype=torch.int64), {}, "dtype"),
        (lambda: torch.ones(4, 4, dtype=torch.float16), {}, "dtype"),
        (lambda: gaussian(5, 6), {"hermitian": True}, "square"),
        (lambda: gaussian(6, 6), {"hermitian": True}, "Hermitian"),
    ],
)
def test_bad_input_raises_value_error(make, kwargs, message):
    with pytest.raises(ValueError, match=message):
        pinv_forward(make(), **kwargs)


# --------------------------------------------------------------------------------------------------
# odds and ends
# --------------------------------------------------------------------------------------------------


def test_grad_inputs_and_rng_untouched():
    A = gaussian(10, 10, seed=19).requires_grad_()
    state = torch.random.get_rng_state()
    X = pinv_forward(A)
    assert torch.equal(state, torch.random.get_rng_state())
    assert not X.requires_grad


# --------------------------------------------------------------------------------------------------
# empty inputs: torch's shapes
# --------------------------------------------------------------------------------------------------

EMPTY_SHAPES = [(0, 3, 3), (0, 3, 4), (0, 4, 3), (3, 0), (0, 3), (0, 0), (2, 0, 3), (2, 3, 0), (2, 0, 0), (0, 2, 0, 5)]


@pytest.mark.parametrize("shape", EMPTY_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex128])
def test_empty_inputs_have_torch_shapes(shape, dtype):
    A = torch.zeros(shape, dtype=dtype)
    for hermitian in (False, True) if shape[-1] == shape[-2] else (False,):
        expected = torch.linalg.pinv(A, hermitian=hermitian)
        X, info = pinv_forward(A, hermitian=hermitian, return_info=True)
        assert X.shape == expected.shape and X.dtype == expected.dtype
        assert info.method == ("eigh" if hermitian else "svd") and info.reason == "empty input"
        # with per-batch tolerance tensors too
        tol = torch.zeros(shape[:-2], dtype=torch.float64)
        assert pinv_forward(A, atol=tol, rtol=tol, hermitian=hermitian).shape == expected.shape


def test_empty_input_still_checks_its_arguments():
    with pytest.raises(ValueError, match="non-negative"):
        pinv_forward(torch.zeros(0, 3, 3, dtype=torch.float64), atol=torch.tensor(-1.0, dtype=torch.float64))
    with pytest.raises(ValueError, match="square"):
        pinv_forward(torch.zeros(0, 3, 4, dtype=torch.float64), hermitian=True)
    with pytest.raises(ValueError, match="rtol"):
        pinv_forward(torch.zeros(0, 3), rtol=-1.0)


# --------------------------------------------------------------------------------------------------
# torch.func: probes drawn outside functorch, vmap decides for the stacked batch
# --------------------------------------------------------------------------------------------------


def test_probes_are_drawn_outside_vmap():
    # jacfwd = vmap over tangents with a plain primal: a random draw inside would raise in vmap's
    # default randomness="error" mode. The decision is the one made without the transform.
    A = gaussian(6, 6, seed=21)
    T = gaussian(6, 6, seed=22)
    X_plain, info = pinv_forward(A, return_info=True)
    assert info.method == "lu"
    X, tangent = torch.func.vmap(lambda t: torch.func.jvp(pinv_forward, (A,), (t,)), randomness="error")(
        torch.stack([T, 2 * T])
    )
    assert torch.equal(X[0], X_plain) and torch.equal(X[1], X_plain)


@pytest.mark.parametrize("shape, method", [((3, 12, 12), "lu"), ((3, 15, 6), "cholesky"), ((3, 6, 15), "cholesky")])
def test_vmap_decides_for_the_stacked_batch(shape, method, caplog):
    A = gaussian(*shape, seed=23)
    expected, info = pinv_forward(A, return_info=True)
    assert info.method == method
    with caplog.at_level(logging.DEBUG, logger="adjointgen.pinv"):
        X = torch.func.vmap(pinv_forward)(A)
    assert any(f": {method}: vmapped: decided for the stacked batch" in r.getMessage() for r in caplog.records)
    assert torch.equal(X, expected)
    # other batch dimension, and vmap of vmap: the same numbers
    assert relative_error(torch.func.vmap(pinv_forward, in_dims=1)(A.movedim(0, 1)), expected) <= F64_TOL
    nested = torch.func.vmap(torch.func.vmap(pinv_forward))(torch.stack([A, 2 * A]))
    assert relative_error(nested[0], expected) <= F64_TOL and relative_error(nested[1], expected / 2) <= F64_TOL


def test_vmap_with_a_hard_matrix_in_the_stack_is_torchs_result():
    good = gaussian(3, 20, 20, seed=24)
    bad = with_spectrum(20, 20, torch.ones(5), seed=25)
    A = torch.cat([good, bad[None]], dim=0)
    assert torch.equal(torch.func.vmap(pinv_forward)(A), torch.linalg.pinv(A))
    H = good @ good.mT + 20 * torch.eye(20, dtype=torch.float64)
    X = torch.func.vmap(lambda M: pinv_forward(M, hermitian=True))(H)
    assert relative_error(X, torch.linalg.pinv(H, hermitian=True)) <= F64_TOL


def test_vmap_tolerances():
    A = gaussian(3, 10, 10, seed=26)
    # vmapped tolerance tensors: torch's own batching rule
    atol = torch.tensor([0.0, 1e-3, 1e3], dtype=torch.float64)
    X = torch.func.vmap(lambda M, t: pinv_forward(M, atol=t))(A, atol)
    assert torch.equal(X, torch.linalg.pinv(A, atol=atol))
    X = torch.func.vmap(lambda t: pinv_forward(A[0], atol=t))(atol)
    expected = torch.stack([torch.linalg.pinv(A[0], atol=float(t)) for t in atol])
    assert torch.allclose(X, expected, rtol=0, atol=F64_TOL) and not X[2].any()  # atol 1e3 discards all
    # a plain tolerance tensor per example's batch: broadcast against the logical batch shape
    B = torch.stack([A, A])  # vmapped over the first dimension, each example a batch of 3
    small = torch.tensor([0.0, 1e-8, 1e-6], dtype=torch.float64)
    X = torch.func.vmap(lambda M: pinv_forward(M, atol=small))(B)
    assert relative_error(X, torch.linalg.pinv(B, atol=small)) <= F64_TOL
    X = torch.func.vmap(lambda M: pinv_forward(M, atol=atol))(B)
    assert torch.allclose(X, torch.linalg.pinv(B, atol=atol), rtol=0, atol=F64_TOL)
    # a tolerance that broadcasts each example's result beyond its batch shape
    wide = torch.zeros(4, 1, dtype=torch.float64)
    X = torch.func.vmap(lambda M: pinv_forward(M, atol=wide))(A)
    expected = torch.stack([torch.linalg.pinv(M, atol=wide) for M in A])  # (3, 4, 1, 10, 10)
    assert X.shape == expected.shape and relative_error(X, expected) <= F64_TOL


def test_route_is_logged(caplog):
    with caplog.at_level(logging.DEBUG, logger="adjointgen.pinv"):
        pinv_forward(gaussian(8, 8, seed=27))
        pinv_forward(with_spectrum(8, 8, torch.ones(3), seed=28))
    messages = [r.getMessage() for r in caplog.records if r.name == "adjointgen.pinv"]
    assert len(messages) == 2
    assert ": lu: fast path" in messages[0] and ": svd: fallback" in messages[1]


# --------------------------------------------------------------------------------------------------
# the two stages of the bounds, and their probability budget
# --------------------------------------------------------------------------------------------------


def test_quick_stage_decides_clear_cases():
    # well conditioned: accepted after the quick stage's few levels
    for A, kind in ((gaussian(50, 50, seed=29), "lu"), (gaussian(80, 30, seed=29), "gram")):
        _, info = pinv_forward(A, return_info=True)
        assert info.method in ("lu", "cholesky") and info.levels == QUICK_LEVELS[kind], info
        assert "quick stage" in info.reason
    B = gaussian(40, 40, seed=29)
    _, info = pinv_forward(B @ B.T + 40 * torch.eye(40, dtype=torch.float64), hermitian=True, return_info=True)
    assert info.method == "cholesky" and info.levels == QUICK_LEVELS["hermitian"], info
    # clearly hopeless: refused after the quick stage on deterministic grounds
    for A in (with_spectrum(50, 50, torch.linspace(1.0, 0.1, 25), seed=30), with_spectrum(50, 50, log_spaced(50, 1e11), seed=30)):
        info = assert_refused_and_equal(A)
        assert info.levels == QUICK_LEVELS["lu"] and "quick stage" in info.reason, info


def test_full_stage_runs_when_the_quick_one_is_inconclusive():
    # cond 1e8 is above the LU cap but not by enough for the quick stage's loose bound to show it
    A = with_spectrum(60, 60, log_spaced(60, 1e8), seed=7)
    info = assert_refused_and_equal(A)
    assert info.levels == _levels_needed(60) and "full stage" in info.reason
    s = torch.linalg.svdvals(A)
    assert info.sigma_min_est <= s[-1].item() and info.sigma_max_est >= s[0].item()
    # the normal-equations cap needs the full stage; QR would do, but only the full stage decides
    B = with_spectrum(100, 40, log_spaced(40, 1e4), seed=5)
    _, info = pinv_forward(B, return_info=True)
    assert info.method == "qr" and info.levels >= _levels_needed(40), info


def test_probability_budget():
    # each stage's bound fails with probability <= FAILURE_PROBABILITY / 2: <= FAILURE_PROBABILITY together
    for n in (1, 10, 2000, 10**6):
        levels = _levels_needed(n)
        full = (0.8 * math.sqrt(n) * SIGMA_SLACK**-levels) ** N_PROBES
        assert full <= FAILURE_PROBABILITY / 2 or levels == 2
        assert _slack(n, levels) <= SIGMA_SLACK
        for quick in set(QUICK_LEVELS.values()):
            s = _slack(n, quick)
            assert min(1.0, 0.8 * math.sqrt(n) * s**-quick) ** N_PROBES <= FAILURE_PROBABILITY / 2 * (1 + 1e-9)
    assert _levels_needed(2000) == 14  # as before the stages: the split costs no level at this size
    assert CUTOFF_MARGIN >= 2


def test_quick_stage_bounds_bracket_the_truth():
    # the quick stage's slack is large; the bounds it reports must still hold, matrix by matrix
    for seed in range(6):
        for shape in ((30, 30), (45, 20), (20, 45)):
            A = gaussian(4, *shape, seed=100 + seed)
            _, info = pinv_forward(A, return_info=True)
            assert "quick stage" in info.reason, info
            s = torch.linalg.svdvals(A)
            assert info.sigma_min_est <= s[..., -1].min().item()
            assert info.sigma_max_est >= s[..., 0].max().item()

"""The value checks of small CPU tensors run on the host (one read, plain Python arithmetic:
``checks.host_values``); larger and traced tensors run on the tensors.  Both must reach the same
verdict, with the same message, on every input a user meets: symmetric or not by a little or a lot,
NaN, Inf, entries near the overflow threshold, batches, real and complex, and triangular factors
with a pivot at rounding level."""
from __future__ import annotations

import pytest
import torch

from adjointgen.runtime import checks, verdict


def _outcome(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the comparison is of the error itself
        return type(exc).__name__, str(exc)
    return "ok", ""


def _both(fn, *args, **kwargs):
    host = _outcome(fn, *args, **kwargs)
    saved = checks.HOST_ENTRIES
    checks.HOST_ENTRIES = -1  # every tensor on the tensor path
    try:
        tensors = _outcome(fn, *args, **kwargs)
    finally:
        checks.HOST_ENTRIES = saved
    return host, tensors


def _matrix(kind, shape, dtype, g):
    x = torch.randn(*shape, dtype=dtype, generator=g)
    x = x + x.mH
    big = 1e300 if dtype in (torch.float64, torch.complex128) else 1e30
    if kind == "asymmetric":
        x[..., 0, -1] += 1
    elif kind == "rounding":
        x[..., 0, -1] += 1e-15 if dtype in (torch.float64, torch.complex128) else 1e-6
    elif kind == "nan":
        x[..., 0, 0] = float("nan")
    elif kind == "inf":
        x[..., -1, 0] = float("inf")
    elif kind == "huge":
        x = x * big
    elif kind == "complex diagonal" and x.is_complex():
        x[..., 0, 0] += 1j
    return x


KINDS = ("symmetric", "asymmetric", "rounding", "nan", "inf", "huge", "complex diagonal")
DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)
SHAPES = ((4, 4), (2, 3, 3), (1, 1), (2, 1, 2, 2), (6, 6))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_symmetry_and_finiteness_verdicts_agree(kind, dtype):
    g = torch.Generator().manual_seed(KINDS.index(kind))
    raised = 0
    for shape in SHAPES:
        x = _matrix(kind, shape, dtype, g)
        assert checks.host_values(x) is not None  # (the host path is the one under test)
        for fn, kwargs in ((checks.symmetric, {"check_finite": True}), (checks.symmetric, {}), (checks.finite, {})):
            host, tensors = _both(fn, x, "A", **kwargs)
            assert host == tensors, (shape, fn.__name__, kwargs)
            raised += host[0] != "ok"
    expected = {"symmetric": 0, "huge": 0, "rounding": 0}
    if kind in expected:
        assert raised == 0
    elif kind != "complex diagonal" or dtype.is_complex:
        assert raised > 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("degree", (1, 2))
@pytest.mark.parametrize("kind", ("symmetric", "huge", "nan"))
def test_triangular_factor_verdicts_agree(kind, degree, dtype):
    g = torch.Generator().manual_seed(7)
    for shape in SHAPES:
        x = _matrix(kind, shape, dtype, g)
        n = x.shape[-1]
        x = x + 2 * n * torch.eye(n, dtype=dtype) * x.abs().amax().nan_to_num(1.0)
        for T, side in ((torch.linalg.qr(x)[1], "upper"), (torch.linalg.cholesky_ex(x)[0], "lower"),
                        (torch.triu(x)[..., : max(n - 1, 1), :], "upper")):
            for zero in (False, True):
                T = T.clone()
                if zero:
                    T[..., 0, 0] = 0
                host, tensors = _both(checks.invertible_factor, "op", "T", T, degree)
                assert host == tensors, (shape, zero)
                # the side declared by the rules (Rules.invertible) gives the verdict the zeros give
                assert _both(checks.invertible_factor, "op", "T", T, degree, side) == (host, tensors), (shape, side)
                if zero and kind != "nan":
                    assert host[0] == "SingularMatrixError"
                if not zero and kind != "nan":
                    assert host[0] == "ok", host  # (entries near 1e300 overflowed the tensors' norms once)


def test_the_host_path_is_taken_only_where_it_is_exact_to_do_so():
    x = torch.eye(3, dtype=torch.float64)
    assert checks.host_values(x) == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert checks.host_values(torch.eye(17, dtype=torch.float64)) is None  # (more than HOST_ENTRIES)
    assert checks.host_values(x.to("meta")) is None
    assert checks.host_values(x.to(torch.complex128).conj()) is None  # (a lazy conjugate: read on the tensors)
    with verdict.checking("deferred"):
        assert checks.host_values(x) is None  # no read at all
    seen = []
    torch.func.vmap(lambda a: seen.append(checks.host_values(a)) or a)(x.expand(2, 3, 3))
    assert seen == [None]  # a transform's wrapper


def test_lapack_status_verdicts():
    from adjointgen.runtime.verdict import nonzero

    def error():
        return ValueError("failed")

    for info in (torch.tensor(0, dtype=torch.int32), torch.zeros(2, 3, dtype=torch.int32), torch.zeros(0, dtype=torch.int32)):
        nonzero(info, error)
        bad = info.clone().reshape(-1)
        if bad.numel():
            bad[-1] = 2
            with pytest.raises(ValueError, match="failed"):
                nonzero(bad.reshape(info.shape), error)
    with pytest.raises(ValueError, match="failed"):
        nonzero(torch.tensor(3, dtype=torch.int32), error)

"""Route choice and the public entry points partial_eigh and partial_eigh_batched.

Part of :mod:`adjointgen.runtime.eigsolvers` (its docstring describes the routes and certificates)."""
from __future__ import annotations

import math
import warnings
from typing import Any
import torch

from ..errors import ConvergenceError
from ..linear_operator import LinearOperator
from .common import DENSE_INPUT_MAX_N, DENSE_MAX_N, PartialEighInfo, _check_b_norms, _check_k, _default_tol, _dense_matrix, _estimate_norm, _fix_signs, _order, _prepare_operators, _relative_residuals
from .dense import _solve_dense
from .arpack import _solve_arpack
from .krylov import _FULL_SPECTRUM_MAX_N, _KRYLOV_EXTRA, _solve_krylov
from .lobpcg import _solve_lobpcg
from .certify import _Uncertain, _backward_aid, _certification_kind, _certify_explicit, _lazy_dense_aid, _second_opinion

# ---------------------------------------------------------------------------------------------------
# public entry points
# ---------------------------------------------------------------------------------------------------
def _choose_method(opA: LinearOperator, opB: LinearOperator | None, k: int) -> str:
    n = opA.shape[0]
    if n <= DENSE_MAX_N or 3 * k >= n or k >= n - 1:
        return "dense"
    dense_input = opA.kind == "dense" and (opB is None or opB.kind == "dense")
    if (opA.kind == "dense" and opB is None and opA.device.type == "cpu" and n > _FULL_SPECTRUM_MAX_N
            and 4 * (k + 1 + _KRYLOV_EXTRA) <= n and not opA.dtype.is_complex):
        return "krylov"
    if dense_input and n <= DENSE_INPUT_MAX_N:
        return "dense"
    if opA.device.type == "cpu" and (opB is None or opB.kind != "operator"):
        return "arpack"
    return "lobpcg"


def partial_eigh(
    A: Any,
    k: int,
    B: Any = None,
    *,
    largest: bool = True,
    tol: float | None = None,
    maxiter: int | None = None,
    method: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, PartialEighInfo]:
    """The ``k`` largest (or smallest) eigenpairs of ``A U = B U D``, ``U^T B U = I``.

    Runs without autograd (the gradient comes from the generated rules). A single, unbatched
    problem; see :func:`partial_eigh_batched` for dense batches.

    Args:
        A: symmetric ``(n, n)`` matrix: dense or sparse (COO/CSR) torch tensor, numpy/scipy matrix,
            or :class:`~adjointgen.runtime.linear_operator.LinearOperator` (``symmetric=True``);
            float32/float64, or complex64/complex128 and Hermitian.
        k: number of eigenpairs, ``1 <= k <= n``.
        B: symmetric positive definite ``(n, n)`` matrix in any of the same forms, or ``None`` for
            the standard problem.
        largest: the ``k`` largest eigenvalues (returned descending) or the smallest (ascending).
        tol: bound on the relative residual of each pair (module docstring); default
            ``eps ** (2/3)`` of the dtype.
        maxiter: iteration cap of the iterative routes (ARPACK: restarts, default ``10 n``;
            LOBPCG: block iterations, default 5000). Ignored by the dense and krylov routes.
        method: ``None``/``"auto"`` (by size and device), ``"dense"``, ``"krylov"`` (dense ``A``
            without ``B``; otherwise the route ``"auto"`` would take for such input), ``"arpack"``
            (CPU solver; products of non-CPU operators are copied) or ``"lobpcg"``. ARPACK needs
            ``k <= n - 2`` and falls back to ``"dense"`` otherwise.

    Returns:
        ``(w, U, info)``: eigenvalues ``(k,)`` (real: float32/float64 also for complex input),
        B-orthonormal eigenvectors ``(n, k)`` (largest entry of each column real positive) on A's
        device and dtype, and a :class:`PartialEighInfo`.

    Raises:
        ValueError: non-square, mismatched shapes/dtypes/devices, k out of range (or not an
            integer), NaN/Inf entries, non-symmetric (non-Hermitian) input, ``B`` not positive
            definite.
        ConvergenceError: the measured residual exceeds the tolerance, or the iterative route's
            result can neither be certified nor repaired (a ``ValueError``; it reports the residual
            reached and the ``k`` asked for).

    Warns:
        UserWarning: the gap between the last kept and first discarded eigenvalue is below
            ``max(sqrt(eps), 10 tol) (||A|| + |d_k| ||B||)``: the eigenvectors, and any gradient
            through them, are ill-defined.
    """
    opA, opB = _prepare_operators(A, B)
    n = opA.shape[0]
    k = _check_k(k, n)
    dtype, device = opA.dtype, opA.device
    real_dtype = dtype.to_real()  # of the eigenvalues (complex Hermitian input: real eigenvalues)
    eps = torch.finfo(dtype).eps
    tol = _default_tol(dtype) if tol is None else float(tol)
    if not tol > 0:
        raise ValueError(f"partial_eigh: tol must be positive, got {tol}")
    tol = max(tol, 10 * eps)
    automatic = method in (None, "auto")
    if automatic:
        method = _choose_method(opA, opB, k)
    if method not in ("dense", "krylov", "arpack", "lobpcg"):
        raise ValueError(
            f"partial_eigh: method must be None, 'auto', 'dense', 'krylov', 'arpack' or 'lobpcg', got {method!r}")
    if method == "krylov" and dtype.is_complex:
        method = _choose_method(opA, opB, k)  # block Lanczos's banded Ritz solver is real
    if method == "krylov" and (opA.kind != "dense" or opB is not None or 3 * (k + 1) > n):
        method = "dense" if opA.kind == "dense" or 3 * (k + 1) > n else "arpack"
    if method == "arpack" and k >= n - 1:
        method = "dense"
    if method == "lobpcg" and 3 * (k + 1) > n:
        method = "dense"
    if method == "arpack" and opB is not None and opB.kind == "operator":
        method = "lobpcg"  # ARPACK's mode 2 needs B^{-1}; LOBPCG needs only products with B
    m = min(k + 1, n)  # one extra pair measures the gap to the discarded spectrum

    with torch.no_grad():
        normA, normB = _estimate_norm(opA), _estimate_norm(opB)
        if not (math.isfinite(normA) and math.isfinite(normB)):
            raise ValueError("partial_eigh: A or B produced NaN or Inf in a product")
        iterations = products = 0
        extra = None  # Ritz pairs beyond the m wanted ones (krylov route): a deflation space
        spectral_aid = None
        if method == "krylov":
            result = _solve_krylov(_dense_matrix(opA), m, _KRYLOV_EXTRA, largest, tol, normA, budgeted=automatic)
            products = iterations = result.products
            if result.converged:
                w, U = result.w[:m], result.U[:, :m]
                extra = (result.w[m:], result.U[:, m:])
                limit = tol
            else:  # the basis limit or the cost budget was reached: the direct solver takes over
                method = "dense"
        if method == "dense":
            # extra pairs beyond the m wanted ones deflate the backward's iterative solves (used
            # where those run: n above the bordered direct solve's size)
            from ..solvers import DENSE_DIRECT_MAX_N

            p = min(_KRYLOV_EXTRA, n - m) if n > DENSE_DIRECT_MAX_N and m > k else 0
            full = (opB is None and opA.kind == "dense" and DENSE_DIRECT_MAX_N < n <= _FULL_SPECTRUM_MAX_N
                    and m > k)
            if full:
                # the whole spectrum (MKL through torch): the backward's solves become exact GEMMs
                from ..linsolve import SpectralAid

                w_all, V_all = torch.linalg.eigh(_dense_matrix(opA))
                kept = torch.arange(n - k, n) if largest else torch.arange(k)
                spectral_aid = SpectralAid(w_all, V_all, kept.to(w_all.device), -1.0 if largest else 1.0)
                w, U = (w_all[n - m:], V_all[:, n - m:]) if largest else (w_all[:m], V_all[:, :m])
                p = 0
            else:
                w, U = _solve_dense(opA, opB, m + p, largest)
            w, U = w.to(device=device, dtype=real_dtype), U.to(device=device, dtype=dtype)
            if p:
                w, U = _order(w, U, largest)
                extra = (w[m:], U[:, m:])
                w, U = w[:m], U[:, :m]
            limit = max(tol, eps ** (1.0 / 3.0))
        elif method == "krylov":
            pass
        elif method == "arpack":
            limit = tol
            w, U, products = _solve_arpack(opA, opB, m, k, largest, tol, maxiter, normA, normB, limit)
            iterations = products
        else:
            limit = tol
            w, U, iterations, products = _solve_lobpcg(opA, opB, m, largest, tol, maxiter, normA, normB, k=k)
        w, U = w.to(device=device, dtype=real_dtype), U.to(device=device, dtype=dtype)
        if not bool(torch.isfinite(w).all() and torch.isfinite(U).all()):
            raise ConvergenceError(
                "partial_eigh: the solver returned NaN or Inf (is B positive definite? does the "
                "matvec return finite values?)", method=method, residual=math.inf, tol=limit,
                iterations=iterations,
            )
        w, U = _order(w, U, largest)
        _check_b_norms(opB, U[:, :k])
        residual = float(_relative_residuals(opA, opB, w[:k], U[:, :k], normA, normB).max())
        if method == "krylov" and not residual <= limit:  # the estimates misled: direct solver
            method, extra = "dense", None
            w, U = _solve_dense(opA, opB, m, largest)
            w, U = _order(w.to(device=device, dtype=real_dtype), U.to(device=device, dtype=dtype), largest)
            limit = max(tol, eps ** (1.0 / 3.0))
            residual = float(_relative_residuals(opA, opB, w[:k], U[:, :k], normA, normB).max())
        if not residual <= limit:
            raise ConvergenceError(
                f"partial_eigh: the {k} computed eigenpairs of an n = {n} problem have relative "
                f"residual {residual:.3e} > {limit:.3e}", method=method, residual=residual, tol=limit,
                iterations=iterations,
            )
        # no eigenvalue skipped: the direct solver computes the pairs by index; an iterative one is
        # certified by an inertia count where a factorization is affordable, else checked by an
        # independent deflated run
        certificate = "direct"
        aid = None
        if method == "dense" and spectral_aid is not None:
            aid = spectral_aid.bind(U[:, :k], w[:k])
        elif method == "dense" and extra is not None and opA.kind == "dense" and (opB is None or opB.kind == "dense"):
            aid = _lazy_dense_aid(opA, opB, w, U, k, largest, extra, normA, normB)
            if aid is not None:
                aid.bind(U[:, :k], w[:k])
        if method != "dense" and m > k:
            kind = _certification_kind(opA, opB, products)
            if kind is not None:
                try:
                    w, U, certificate, route, factor = _certify_explicit(
                        kind, opA, opB, w, U, k, m, largest, tol, normA, normB)
                except _Uncertain:
                    kind = None
                else:
                    if route is not None:
                        method = route
                        limit = max(tol, eps ** (1.0 / 3.0))
                    aid = _backward_aid(factor, w, U, k, extra if certificate != "repaired" else None)
                    if aid is not None:
                        aid.bind(U[:, :k], w[:k])
            if kind is None:
                w, U, certificate = _second_opinion(opA, opB, w, U, k, m, largest, tol, maxiter, normA, normB)
                if certificate == "repaired":
                    method = "lobpcg"
                elif certificate == "direct":
                    method, limit = "dense", max(tol, eps ** (1.0 / 3.0))
            w, U = w.to(device=device, dtype=real_dtype), U.to(device=device, dtype=dtype)
            if certificate in ("repaired", "direct"):
                _check_b_norms(opB, U[:, :k])
                residual = float(_relative_residuals(opA, opB, w[:k], U[:, :k], normA, normB).max())
                if not residual <= limit:
                    raise ConvergenceError(
                        f"partial_eigh: the {k} eigenpairs recomputed after skipped eigenvalues were "
                        f"found have relative residual {residual:.3e} > {limit:.3e}", method=method,
                        residual=residual, tol=limit, iterations=iterations,
                    )
        kept_w, kept_U = w[:k], U[:, :k]
        gap = None
        split: tuple[int, ...] = ()
        resolution = None
        if m > k:
            gap = float((w[k - 1] - w[k]).abs())
            # the scale of eigenvalue errors is that of the residual: ||A|| + |d| ||B||, not the
            # computed eigenvalues (which may all be tiny next to ||A||)
            scale = normA + float(w[k - 1].abs()) * normB
            threshold = max(math.sqrt(eps), 10 * tol) * scale
            resolution = max(tol, 10 * eps) * scale
            if gap <= resolution:
                # the last kept and first discarded eigenvalue coincide to the accuracy of the
                # pairs: which of them is kept is arbitrary (the backward refuses to differentiate)
                split = tuple(i for i in range(k) if float((w[i] - w[k]).abs()) <= resolution)
            if gap <= threshold:
                side = "largest" if largest else "smallest"
                warnings.warn(
                    f"partial_eigh: the gap between the last kept eigenvalue ({float(w[k - 1]):.6g}) "
                    f"and the first discarded one ({float(w[k]):.6g}) is {gap:.3e}, below "
                    f"{threshold:.3e} (relative to the scale ||A|| + |d_k| ||B|| = {scale:.3e}): the {k} "
                    f"{side} eigenvectors and their gradient are ill-defined; change k so it does not "
                    "split a (near-)degenerate eigenvalue",
                    UserWarning,
                    stacklevel=2,
                )
        kept_U = _fix_signs(kept_U)
    from ..routes import taken

    taken("partial_eigh", method)
    info = PartialEighInfo(method=method, residual=residual, iterations=int(iterations), tol=limit, gap=gap,
                           certificate=certificate, split=split, resolution=resolution, aid=aid)
    return kept_w.contiguous(), kept_U.contiguous(), info


def partial_eigh_batched(
    A: torch.Tensor,
    k: int,
    B: torch.Tensor | None = None,
    *,
    largest: bool = True,
    tol: float | None = None,
    maxiter: int | None = None,
    method: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, tuple[PartialEighInfo, ...]]:
    """:func:`partial_eigh` over the leading batch dimensions of dense ``(..., n, n)`` tensors.

    ``B`` (``(..., n, n)`` or ``None``) broadcasts against ``A``'s batch shape. Loops over the batch
    in Python (one :func:`partial_eigh` call each). Warnings and errors name the batch index.

    Returns:
        ``(w, U, infos)`` with ``w`` of shape ``(..., k)``, ``U`` of shape ``(..., n, k)`` and one
        :class:`PartialEighInfo` per problem, in row-major batch order.
    """
    if not isinstance(A, torch.Tensor) or A.layout != torch.strided or A.dim() < 2:
        raise ValueError("partial_eigh_batched: A must be a dense tensor of shape (..., n, n)")
    if B is not None and (not isinstance(B, torch.Tensor) or B.layout != torch.strided or B.dim() < 2):
        raise ValueError("partial_eigh_batched: B must be None or a dense tensor of shape (..., n, n)")
    batch_shape = A.shape[:-2] if B is None else torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    n = A.shape[-1]
    A_flat = A.expand(*batch_shape, *A.shape[-2:]).reshape(-1, *A.shape[-2:])
    B_flat = None if B is None else B.expand(*batch_shape, *B.shape[-2:]).reshape(-1, *B.shape[-2:])
    eigenvalues, eigenvectors, infos = [], [], []
    for index in range(A_flat.shape[0]):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                w, U, info = partial_eigh(
                    A_flat[index], k, None if B_flat is None else B_flat[index], largest=largest, tol=tol,
                    maxiter=maxiter, method=method,
                )
            except ConvergenceError as exc:
                raise ConvergenceError(
                    f"batch index {index}: {exc}", method=exc.method, residual=exc.residual, tol=exc.tol,
                    iterations=exc.iterations,
                ) from None
            except ValueError as exc:
                raise ValueError(f"partial_eigh_batched: batch index {index}: {exc}") from None
        for warning in caught:
            warnings.warn(f"batch index {index}: {warning.message}", warning.category, stacklevel=2)
        eigenvalues.append(w)
        eigenvectors.append(U)
        infos.append(info)
    if not eigenvalues:
        empty_k = _check_k(k, n)
        return (
            A.new_zeros(*batch_shape, empty_k),
            A.new_zeros(*batch_shape, n, empty_k),
            (),
        )
    w = torch.stack(eigenvalues).reshape(*batch_shape, -1)
    U = torch.stack(eigenvectors).reshape(*batch_shape, n, -1)
    return w, U, tuple(infos)

"""PyTorch API: differentiable matrix decompositions with derived, audited rules.

``import adjointgen.torch as agt``.  Every function accepts batches ``(..., m, n)``, float32 and
float64, on CPU and CUDA, and is differentiable in reverse and forward mode (``torch.autograd``,
``torch.func.grad``/``jvp``/``vmap``), including higher derivatives.  Bad input raises
``ValueError`` naming the problem.
"""
from __future__ import annotations


import torch

from ..generated.torch import cholesky as _cholesky
from ..generated.torch import det as _det
from ..generated.torch import eigh as _eigh
from ..generated.torch import eigh_generalized as _eigh_generalized
from ..generated.torch import inv as _inv
from ..generated.torch import lstsq as _lstsq
from ..generated.torch import qr as _qr
from ..generated.torch import slogdet as _slogdet
from ..generated.torch import solve as _solve
from ..generated.torch import solve_triangular as _solve_triangular
from ..generated.torch import svd as _svd
from ..generated.torch.pinv import PinvFunction
from ..runtime import checks
from ..runtime import function as _function
from ..runtime import routes as _routes
from ..runtime.verdict import checking, raise_deferred  # noqa: F401  (the check mode: eager or deferred)

__all__ = ["cholesky", "det", "eig", "eigvals", "eigh", "eigsh", "expm", "funm", "inv", "logdet", "logm", "lstsq", "lu", "matrix_exp", "lu_factor", "lu_solve", "pinv", "powm", "qr", "slogdet", "solve",
           "solve_triangular", "sqrtm", "svd", "svds", "eigvalsh", "svdvals", "cholesky_ex", "inv_ex", "lu_factor_ex",
           "solve_ex"]


def cholesky(A: torch.Tensor, *, upper: bool = False) -> torch.Tensor:
    """Cholesky factor of symmetric (Hermitian) positive definite matrices, as
    :func:`torch.linalg.cholesky`: ``A = L L^H`` with ``L`` lower triangular and a positive diagonal
    (``upper=True``: ``U = L^H``, ``A = U^H U``); real or complex.

    The gradient is the rule derived in ``derivations/cholesky.py``,
    ``gA = sym(L^-H Φ(L^H gL) L^-1)`` with ``Φ`` the lower triangle with the diagonal halved
    (reverse and forward mode, ``torch.func`` transforms, higher derivatives; batches
    ``(..., n, n)``, float32/float64/complex64/complex128, CPU/CUDA).

    Raises:
        ValueError: not a square floating matrix, NaN/Inf, not symmetric;
            :class:`adjointgen.NotPositiveDefiniteError` (also a ``torch.linalg.LinAlgError``) when
            ``A`` is not positive definite, naming the batch index and the leading minor.
    """
    L = _cholesky.cholesky(A)
    return L.mH if upper else L


def inv(A: torch.Tensor) -> torch.Tensor:
    """Matrix inverse, as :func:`torch.linalg.inv` (real or complex), with the rule derived in
    ``derivations/inv.py`` (``dX = -X dA X``, ``gA = -X^H gX X^H``).

    Raises:
        ValueError: not a square floating matrix, NaN/Inf;
            :class:`adjointgen.SingularMatrixError` (also a ``torch.linalg.LinAlgError``) for a
            singular matrix.
    """
    return _inv.inv(A)


def det(A: torch.Tensor) -> torch.Tensor:
    """Determinant, as :func:`torch.linalg.det`: shape ``(...)`` for ``A`` of shape
    ``(..., n, n)``, real or complex.

    The rules are derived in ``derivations/det.py`` from Jacobi's formula in its adjugate form,
    ``d det = tr(adj(A) dA)``, ``gA = conj(g) adj(A)^H``, so the gradient is right at singular
    ``A`` too (the cofactor matrix: nonzero at rank ``n - 1``).  ``adj(A)`` is ``det(A) A^-1`` from
    one LU where ``A`` is well conditioned and comes from the SVD otherwise
    (:func:`adjointgen.runtime.linalg.adjugate`).  Reverse and forward mode, ``torch.func``
    transforms, second derivatives at every rank (the zero matrix included: ``adj``'s derivative
    comes from the same SVD factors in a form that divides by nothing); float32/float64/complex64/
    complex128, CPU/CUDA, empty batches.

    Raises:
        ValueError: not a square floating matrix, NaN/Inf.
    """
    return _det.det(A)


def logdet(A: torch.Tensor) -> torch.Tensor:
    """``log(det A)``, as :func:`torch.logdet`: real ``A`` with a negative determinant gives NaN and
    a singular ``A`` gives ``-inf`` (as torch); complex ``A`` gives the complex logarithm
    ``log|det A| + i arg(det A)``.  Composed from :func:`slogdet` (``logabsdet + log(sign)``), so
    its derivatives are ``slogdet``'s derived rules (``gA = g A^-H`` for real ``A``)."""
    sign, logabsdet = slogdet(A)
    return logabsdet + torch.log(sign) if A.is_complex() else logabsdet + torch.log(sign)


def slogdet(A: torch.Tensor):
    """Sign and logarithm of the absolute value of the determinant, as :func:`torch.linalg.slogdet`:
    a named tuple ``(sign, logabsdet)`` of shape ``(...)`` for ``A`` of shape ``(..., n, n)``, real or
    complex (``sign`` is then a unit phase, ``logabsdet`` real).

    The rules are derived in ``derivations/slogdet.py`` from ``logabsdet = log|det A|`` and
    ``sign = det A / |det A|`` by Jacobi's formula: with ``t = tr(A^-1 dA)``,
    ``d logabsdet = Re t``, ``d sign = i Im(t) sign`` (zero for real ``A``), and
    ``gA = A^-H (g + i Im(h conj(sign)))`` for cotangents ``g``, ``h``.  The backward reuses the LU
    factors of the forward (one triangular solve pair, no new factorization).  Reverse and forward
    mode, ``torch.func`` transforms, higher derivatives; float32/float64/complex64/complex128,
    CPU/CUDA.  A singular ``A`` gives ``sign = 0``, ``logabsdet = -inf``, as torch does (its gradient
    is then infinite).

    Raises:
        ValueError: not a square floating matrix, NaN/Inf.
    """
    sign, logabsdet = _slogdet.slogdet(A)
    return torch.return_types.linalg_slogdet((sign, logabsdet))


def solve(A: torch.Tensor, B: torch.Tensor, *, left: bool = True) -> torch.Tensor:
    """Solution of ``A X = B`` (``left=False``: ``X A = B``), as :func:`torch.linalg.solve`, real or
    complex, with its shape rules: ``B`` is a batch of vectors ``(*, n)`` exactly when it is 1-D or
    ``B.shape == A.shape[:-1]``, else a batch of matrices ``(*, n, k)`` (``(*, k, n)`` with
    ``left=False``); batch dimensions broadcast.  Shapes torch rejects are rejected with torch's
    message.

    The rule is derived in ``derivations/solve.py`` (``gB = A^-H gX``, ``gA = -gB X^H``); the
    backward reuses the LU factors of the forward (and solves with ``A`` again only when a graph
    of the backward is recorded, for higher derivatives).

    Raises:
        ValueError: shapes torch rejects (also a ``RuntimeError``, as torch's), NaN/Inf, non-floating
            dtypes; :class:`adjointgen.SingularMatrixError` for a singular ``A``.
    """
    checks.tensor(A, "A")
    checks.tensor(B, "B")
    checks.like_torch(torch.linalg.solve, A, B, left=left)
    vector = B.dim() == 1 or (B.dim() == A.dim() - 1 and B.shape == A.shape[:-1])
    _routes.taken("solve", ("left" if left else "right") + ("_vector" if vector else "_matrix"))
    if not left:  # X A = B  <=>  A^T X^T = B^T (a vector is its own transpose)
        At = A.mT
        if vector:
            return _solve.solve(At, B.unsqueeze(-1)).squeeze(-1)
        return _solve.solve(At, B.mT).mT
    if vector:
        return _solve.solve(A, B.unsqueeze(-1)).squeeze(-1)
    return _solve.solve(A, B)


def solve_triangular(A: torch.Tensor, B: torch.Tensor, *, upper: bool, left: bool = True,
                     unitriangular: bool = False) -> torch.Tensor:
    """Solution of ``A X = B`` (``left=False``: ``X A = B``) for triangular ``A``, as
    :func:`torch.linalg.solve_triangular`: only the triangle ``upper`` names is read (with
    ``unitriangular=True`` not its diagonal either, taken as ones), and the gradient in ``A`` lies
    in that triangle; real or complex, batch dimensions broadcast.

    The rule is derived in ``derivations/solve_triangular.py`` for a lower triangular ``A``
    (``gB = A^-H gX``, ``gA = tril(-gB X^H)``); an upper triangular ``A`` is the lower triangular
    ``J A J`` (``J`` reverses the order of rows and columns), and ``X A = B`` is ``A^T X^T = B^T``.

    Raises:
        ValueError: shapes torch rejects (also a ``RuntimeError``, as torch's), NaN/Inf, non-floating
            dtypes; :class:`adjointgen.SingularMatrixError` for a zero on the diagonal (where torch
            returns Inf/NaN).
    """
    checks.tensor(A, "A")
    checks.tensor(B, "B")
    checks.like_torch(torch.linalg.solve_triangular, A, B, upper=upper, left=left, unitriangular=unitriangular)
    if unitriangular:
        _routes.taken("solve_triangular", "unitriangular")
        eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
        A = (A.triu(1) if upper else A.tril(-1)) + eye
    if not left:
        _routes.taken("solve_triangular", "right")  # X A = B  <=>  A^T X^T = B^T, with A^T triangular on the other side
        return solve_triangular(A.mT, B.mT, upper=not upper).mT
    _routes.taken("solve_triangular", "upper" if upper else "lower")
    if upper:  # J A J is lower triangular: (J A J)(J X) = J B
        return _solve_triangular.solve_triangular(A.flip(-2, -1), B.flip(-2)).flip(-2)
    return _solve_triangular.solve_triangular(A, B)


def lu(A: torch.Tensor, *, pivot: bool = True):
    """LU factorization with partial pivoting, as :func:`torch.linalg.lu`: a named tuple
    ``(P, L, U)`` with ``A = P L U`` for ``A`` of shape ``(..., m, n)`` (square, tall or wide), ``P``
    ``(..., m, m)`` a permutation, ``L`` ``(..., m, k)`` unit lower triangular, ``U`` ``(..., k, n)``
    upper triangular, ``k = min(m, n)``; real or complex.

    The rules are derived in ``derivations/lu.py`` (``dL = L tril₋(L^-1 P^T dA U^-1)``,
    ``dU = (L^-1 P^T dA - tril₋(L^-1 P^T dA U^-1) U)``, the VJP by transposition); tall and wide
    ``A`` use them on a square completion of the factors (:mod:`adjointgen.composite.lu`).  ``P`` is
    piecewise constant and not differentiable.  Reverse and forward mode, ``torch.func`` transforms,
    higher derivatives; float32/float64/complex64/complex128, CPU/CUDA, empty batches.

    Raises:
        ValueError: not a floating matrix, NaN/Inf; ``RuntimeError`` for ``pivot=False`` on the CPU
            (torch's own: LU without pivoting runs on CUDA only, where ``P`` comes back empty and
            the rules take ``P = I``); :class:`adjointgen.SingularMatrixError` (also a ``torch.linalg.LinAlgError``) in a
            derivative when ``U`` has a zero pivot (a rank-deficient ``A``: the rules divide by it).
    """
    from ..composite.lu import LuFunction, LuFunctionCompiled

    checks.matrix_input(A, "A", complex_ok=True)
    m, n = A.shape[-2:]
    _routes.taken("lu", "square" if m == n else ("tall" if m > n else "wide"))
    P, L, U, _ = _function.apply(LuFunction, A, bool(pivot), compiled=LuFunctionCompiled)
    return torch.return_types.linalg_lu((P, L, U))


def lu_factor(A: torch.Tensor, *, pivot: bool = True):
    """LU factorization in LAPACK's packed form, as :func:`torch.linalg.lu_factor`: a named tuple
    ``(LU, pivots)``, ``LU`` of shape ``(..., m, n)`` holding ``L``'s strictly lower part and ``U``,
    ``pivots`` (int32, not differentiable) LAPACK's row interchanges.  Differentiable in ``A`` by the
    rules of :func:`lu`; the same errors.  :func:`lu_solve` takes the result."""
    from ..composite.lu import LuFunction, LuFunctionCompiled, check_pivots, packed

    checks.matrix_input(A, "A", complex_ok=True)
    _, L, U, pivots = _function.apply(LuFunction, A, bool(pivot), compiled=LuFunctionCompiled)
    check_pivots(U.detach(), "lu_factor of a singular A would divide by zero in lu_solve (as torch.linalg.lu_factor, "
                             "this raises; agt.lu factors it)")
    return torch.return_types.linalg_lu_factor((packed(L, U), pivots))


def lu_solve(LU: torch.Tensor, pivots: torch.Tensor, B: torch.Tensor, *, left: bool = True,
             adjoint: bool = False) -> torch.Tensor:
    """``X`` with ``A X = B`` (``X A = B`` with ``left=False``; ``A^H`` for ``A`` with ``adjoint=True``)
    from the packed factors of a square ``A = P L U`` (:func:`lu_factor`), as
    :func:`torch.linalg.lu_solve`.  Differentiable in ``LU`` and ``B``: the two triangular solves
    are :func:`solve_triangular`'s derived rules, ``P`` is constant.

    Raises:
        ValueError (a ``RuntimeError`` too, as torch's): shapes or dtypes torch rejects;
            :class:`adjointgen.SingularMatrixError` for a zero pivot.
    """
    from ..composite.lu import unpacked

    checks.like_torch(torch.linalg.lu_solve, LU, pivots, B, left=left, adjoint=adjoint)
    checks.matrix_input(LU, "LU", square=True, complex_ok=True)
    checks.matrix_input(B, "B", complex_ok=True)
    P, L, U = unpacked(LU, pivots)
    if adjoint:  # A^H = U^H L^H P^T
        if left:  # X = P L^-H U^-H B
            Y = solve_triangular(U.mH, B, upper=False)
            return P @ solve_triangular(L.mH, Y, upper=True, unitriangular=True)
        # X A^H = B: X = B P L^-H U^-H
        Y = solve_triangular(L.mH, B @ P, upper=True, left=False, unitriangular=True)
        return solve_triangular(U.mH, Y, upper=False, left=False)
    if left:  # X = U^-1 L^-1 P^T B
        Y = solve_triangular(L, P.mT @ B, upper=False, unitriangular=True)
        return solve_triangular(U, Y, upper=True)
    # X P L U = B: X = B U^-1 L^-1 P^T
    Y = solve_triangular(U, B, upper=True, left=False)
    return solve_triangular(L, Y, upper=False, left=False, unitriangular=True) @ P.mT


def qr(A: torch.Tensor, mode: str = "reduced"):
    """QR factorization, as :func:`torch.linalg.qr` (LAPACK's signs): ``A = Q R``.

    Real or complex ``A`` (complex: ``R`` has a real diagonal, as LAPACK's).
    ``mode="reduced"``: ``Q (..., m, k)``, ``R (..., k, n)``, ``k = min(m, n)``; ``"complete"``:
    ``Q (..., m, m)``; ``"r"``: ``(empty Q, R)``.  The gradient of a tall or square ``A`` is the rule
    derived in ``derivations/qr.py``; a wide ``A = [X | Y]`` is factored as ``X = Q R_X``,
    ``R = [R_X | Q^H Y]``, so its gradient flows through the same rule.  With ``mode="r"`` ``R`` is
    differentiable too.  With ``mode="complete"`` and ``m > n`` the extra columns of ``Q`` are any
    orthonormal basis of the complement: a backward through them raises (as torch does).

    Raises:
        ValueError: not a floating matrix, NaN/Inf, an unknown mode.
    """
    if mode not in ("reduced", "complete", "r"):
        raise ValueError(f"qr: mode must be 'reduced', 'complete' or 'r', got {mode!r}")
    checks.matrix_input(A, "A", complex_ok=True)
    m, n = A.shape[-2:]
    if m >= n:
        _routes.taken("qr", "tall")
        Q, R = _qr.qr(A)
    else:
        _routes.taken("qr", "wide")
        Q, R_X = _qr.qr(A[..., :m])
        R = torch.cat([R_X, torch.conj_physical(Q).mT @ A[..., m:]], dim=-1)  # no conjugate view: batched forward AD
    if mode == "r":
        return A.new_empty(0), R
    if mode == "complete" and m > n:
        _routes.taken("qr", "complete")
        from ..runtime.factorizations import complete_q

        Q = complete_q(A, Q)
        R = torch.cat([R, R.new_zeros(*R.shape[:-2], m - n, n)], dim=-2)  # (m, n), as LAPACK's
    return Q, R




def eigh(A: torch.Tensor, B: torch.Tensor | None = None, *, UPLO: str = "L", cluster_rtol: float | None = None,
         broadening: float | None = None):
    """Symmetric (Hermitian) eigendecomposition ``A = V diag(w) V^H``, or with ``B`` the
    generalized symmetric-definite problem ``A V = B V diag(w)``, ``V^T B V = I``.

    Args:
        A: real symmetric matrices ``(..., n, n)``, float32 or float64, or complex Hermitian ones,
            complex64 or complex128.  Only symmetric (Hermitian) perturbations are
            meaningful, so the gradient with respect to ``A`` is symmetric (Hermitian).
        B: optional symmetric (Hermitian) positive definite matrices of the same shape and dtype
            (batch dimensions broadcast); differentiable too (symmetric gradient).
        UPLO: ``"L"`` or ``"U"``, accepted as :func:`torch.linalg.eigh` does (``eigh(A, "U")``
            too); ``A`` is checked to be symmetric, so both triangles are the same matrix.

    Returns:
        ``(w, V)``: eigenvalues ascending ``(..., n)`` and eigenvectors ``(..., n, n)``,
        orthonormal (``B``-orthonormal with ``B``), as :func:`torch.linalg.eigh` /
        :func:`scipy.linalg.eigh`.

    Gradients of the eigenvectors are defined only for distinct eigenvalues; a loss must not
    depend on the sign of an eigenvector, nor (complex) on its phase ``e^{iθ}``: the backward
    checks the derived gauge residual and raises
    :class:`adjointgen.GaugeDependentLossError` (see :mod:`adjointgen.runtime.gauge`).

    Raises:
        ValueError: ``A`` (or ``B``) not a square floating matrix, not symmetric (within 100 eps
            relative), containing NaN/Inf; ``B`` not positive definite or of another shape.
    """
    if isinstance(B, str):  # torch.linalg.eigh(A, "U")
        B, UPLO = None, B
    _uplo(UPLO)
    checks.degeneracy_options(cluster_rtol, broadening)
    if B is None:
        return _eigh.eigh(A, cluster_rtol=cluster_rtol, broadening=broadening)
    return _eigh_generalized.eigh_generalized(A, B, cluster_rtol=cluster_rtol, broadening=broadening)


def _uplo(UPLO) -> None:
    if UPLO not in ("L", "U"):
        raise checks.ShapeError(f"UPLO must be 'L' or 'U', got {UPLO!r}")


def _differentiated(A: torch.Tensor) -> bool:
    """Whether a gradient (or a torch.func transform) may follow ``A``: then the decomposition
    with its derived rule runs; else the cheaper values-only LAPACK routine."""
    if not isinstance(A, torch.Tensor):
        return False
    wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
    if wrapped is None:  # pragma: no cover - a torch without it: the derived path is always right
        return True
    return ((torch.is_grad_enabled() and A.requires_grad) or wrapped(A)
            or torch.autograd.forward_ad.unpack_dual(A).tangent is not None)


def eig(A: torch.Tensor, *, left: bool = False, cluster_rtol: float | None = None, broadening: float | None = None):
    """Eigendecomposition ``A V = V diag(w)`` of general square matrices, as :func:`torch.linalg.eig`.

    Args:
        A: ``(..., n, n)``, float32/float64 or complex64/complex128; batch dimensions broadcast.
        left: also return the left eigenvectors, ``(w, VL, V)`` as ``scipy.linalg.eig(A, left=True)``:
            ``VL[:, j]^H A = w_j VL[:, j]^H``, unit columns, normalized so that ``VL[:, j]^H V[:, j]`` is
            real and positive (the columns of ``V^-H``, scaled: their phase is tied to ``V``'s, so
            the phase gauge below covers both).  Differentiated through the derived rules of
            ``derivations/eig.py`` and ``derivations/inv.py``.
        cluster_rtol: relative tolerance below which two eigenvalues form a cluster of equal values
            (default ``sqrt(eps)`` of the dtype).
        broadening: ``ε > 0`` replaces every reciprocal gap ``1/x`` by ``conj(x)/(|x|^2 + ε)``: a
            biased, finite surrogate; the cluster checks are then skipped.

    Returns:
        ``(w, V)``: complex eigenvalues ``(..., n)`` and unit-norm eigenvectors ``(..., n, n)``,
        exactly those of :func:`torch.linalg.eig` (LAPACK ``geev``: the same order, the same phases),
        except at eigenvalues equal to rounding: there the eigenvectors are a generic basis of the
        eigenspace (LAPACK's has exact zeros, at which a basis-dependent loss would pass the check).

    The rules are derived in ``derivations/eig.py`` from ``A V = V diag(w)`` and the unit columns:
    ``dw = diag(V^-1 dA V)``, ``dV = V (F ∘ (V^-1 dA V) - diag(Re(V^H V (F ∘ (V^-1 dA V)))))``,
    ``gA = V^-H (diag(gw) + conj(F) ∘ (V^H (gV - V diag(Re(V^H gV))))) V^H`` with
    ``F_ij = 1/(w_j - w_i)``; a real ``A`` gets the real part.  Reverse and forward mode,
    ``torch.func`` transforms and higher derivatives work.

    Gauges, checked in the backward: each eigenvector is defined up to its phase ``e^{iθ}``, so a loss
    must not depend on it (:class:`adjointgen.PhaseDependentLossError`, as torch checks).  At a cluster
    of equal eigenvalues of a diagonalizable ``A`` any basis of the cluster's eigenspace (renormalized)
    is as valid: a loss invariant to that (the sum of the cluster's eigenvalues, its spectral projector)
    gets its exact gradient, one that is not (an individual eigenvalue, an eigenvector) raises
    :class:`adjointgen.DegenerateSubspaceError`.  A defective ``A`` (a Jordan block: the cluster's
    eigenvectors dependent) raises :class:`adjointgen.DefectiveMatrixError` in the
    backward; so does forward mode at a cluster.  Where eigenvalues are merely close, the derivative
    exists and is large (it is that of the matrix as given).

    Raises:
        ValueError: not a square floating matrix, NaN/Inf.
    """
    from ..generated.torch.eig import eig as general

    w, V = general(A, cluster_rtol=cluster_rtol, broadening=broadening)
    if not left:
        return w, V
    VL = inv(V).mH  # the rows of V^-1 are left eigenvectors, with (V^-1)_j V_j = 1
    return w, VL / torch.linalg.vector_norm(VL, dim=-2, keepdim=True), V


def eigvals(A: torch.Tensor, *, cluster_rtol: float | None = None) -> torch.Tensor:
    """Eigenvalues of general square matrices, as :func:`torch.linalg.eigvals` (complex ``(..., n)``,
    LAPACK's order).

    Without a gradient to follow this is ``torch.linalg.eigvals``; with one it is ``eig(A)[0]``,
    differentiated by the rule derived in ``derivations/eig.py`` (``gA = V^-H diag(gw) V^H``).  At a
    cluster of equal eigenvalues a loss symmetric in them (their sum, their product) gets its exact
    gradient, one on an individual eigenvalue raises :class:`adjointgen.DegenerateSubspaceError`, and
    a defective ``A`` raises :class:`adjointgen.DefectiveMatrixError`.

    Raises:
        ValueError: not a square floating matrix, NaN/Inf.
    """
    if _differentiated(A):
        _routes.taken("eigvals", "decomposition")
        return eig(A, cluster_rtol=cluster_rtol)[0]
    _routes.taken("eigvals", "values")
    checks.matrix_input(A, "A", square=True, complex_ok=True)
    return torch.linalg.eigvals(A)


def eigvalsh(A: torch.Tensor, UPLO: str = "L", *, cluster_rtol: float | None = None) -> torch.Tensor:
    """Eigenvalues of symmetric (Hermitian) matrices, ascending, as :func:`torch.linalg.eigvalsh`.

    Without a gradient to follow this is ``torch.linalg.eigvalsh`` (no eigenvectors); with one it
    is ``eigh(A)[0]``, differentiated by the rule derived in ``derivations/eigh.py``
    (``gA = V diag(gw) V^H``).  At a cluster of equal eigenvalues a loss that depends on them only
    symmetrically (their sum, any symmetric function) gets its exact gradient, and one that depends
    on an individual eigenvalue of the cluster, which is not differentiable there, raises
    :class:`adjointgen.DegenerateSubspaceError` (torch returns one of its one-sided derivatives).

    Raises:
        ValueError: as :func:`eigh` (not square, not symmetric, NaN/Inf, not floating).
    """
    _uplo(UPLO)
    if _differentiated(A):
        _routes.taken("eigvalsh", "decomposition")
        return eigh(A, cluster_rtol=cluster_rtol)[0]
    _routes.taken("eigvalsh", "values")
    checks.matrix_input(A, "A", square=True, symmetric=True, complex_ok=True)
    return torch.linalg.eigvalsh(A, UPLO=UPLO)


def svdvals(A: torch.Tensor, *, cluster_rtol: float | None = None) -> torch.Tensor:
    """Singular values, descending, as :func:`torch.linalg.svdvals` (``(..., min(m, n))``).

    Without a gradient to follow this is ``torch.linalg.svdvals``; with one it is
    ``svd(A, full_matrices=False)[1]``, differentiated by the rule derived in
    ``derivations/svd.py`` (``gA = U diag(gS) V^H``), with the same guarantees at clusters as
    :func:`eigvalsh` and an error (instead of a subgradient) for a loss on a zero singular value of
    a rank-deficient rectangular matrix.

    Raises:
        ValueError: not a floating matrix, NaN/Inf.
    """
    if _differentiated(A):
        _routes.taken("svdvals", "decomposition")
        return svd(A, full_matrices=False, cluster_rtol=cluster_rtol)[1]
    _routes.taken("svdvals", "values")
    checks.matrix_input(A, "A", square=False, complex_ok=True)
    return torch.linalg.svdvals(A)


#: the rest of ``torch.linalg``, as torch has them, so that ``adjointgen.torch`` stands in for the
#: whole namespace: none differentiates through a decomposition whose derivative divides by a gap
#: (the spectral norms and ``cond`` use singular values alone, whose derivative ``U diag(g) V^H``
#: has no quotient; ``matrix_rank`` has none; the rest are products, norms and solves)
cond, cross, diagonal, householder_product = (torch.linalg.cond, torch.linalg.cross, torch.linalg.diagonal,
                                              torch.linalg.householder_product)
ldl_factor, ldl_factor_ex, ldl_solve = torch.linalg.ldl_factor, torch.linalg.ldl_factor_ex, torch.linalg.ldl_solve
matmul, matrix_norm, matrix_power, matrix_rank = (torch.linalg.matmul, torch.linalg.matrix_norm,
                                                  torch.linalg.matrix_power, torch.linalg.matrix_rank)
multi_dot, norm, tensorinv, tensorsolve = torch.linalg.multi_dot, torch.linalg.norm, torch.linalg.tensorinv, \
    torch.linalg.tensorsolve
vander, vecdot, vector_norm = torch.linalg.vander, torch.linalg.vecdot, torch.linalg.vector_norm


def eigsh(A, k: int, B=None, *, largest: bool = True, tol: float | None = None, maxiter: int | None = None,
          return_info: bool = False):
    """The ``k`` largest (or smallest) eigenpairs of ``A V = B V diag(w)``, ``V^T B V = I``,
    without a full decomposition, with exact gradients (the part of ``dV`` outside the kept
    eigenspace comes from projected shifted solves, not from the full spectrum).

    Args:
        A: symmetric (complex: Hermitian) ``(n, n)`` matrix, float32/float64 or complex64/complex128: dense tensor (also batched ``(..., n, n)``), torch sparse
            COO/CSR, or :class:`adjointgen.LinearOperator` (a matvec with parameters).
        k: number of eigenpairs, ``1 <= k <= n``.
        B: optional symmetric (Hermitian) positive definite matrix in the same forms and dtype
            (``None``: identity).
        largest: the ``k`` largest eigenvalues, descending; else the smallest, ascending.
        tol: relative residual of the computed pairs (default ``eps ** (2/3)``); the backward
            solves use ``min(tol, 1e-11)`` (float64) or ``1e-5`` (float32).
        maxiter: iteration cap of the iterative eigensolver.

    Returns:
        ``(w, V)``: eigenvalues ``(..., k)`` and eigenvectors ``(..., n, k)``; with
        ``return_info=True`` also a :class:`~adjointgen.runtime.eigsolvers.PartialEighInfo` (a list
        of them for a batch): the route (``method``), the residual reached, ``certificate`` (why no
        eigenvalue was skipped: ``"direct"``, ``"inertia"``, ``"second-opinion"``, ``"repaired"``),
        the ``gap`` to the first discarded eigenvalue.

    Gradients: dense inputs get a dense symmetric gradient; sparse inputs get a sparse gradient on
    their own sparsity pattern (O(nnz·k), no n×n tensor); a LinearOperator passes the gradient to its
    parameters through one matvec.  Forward mode (``torch.func.jvp``) works for dense inputs.
    Second derivatives work for dense inputs with n <= 400 (exact bordered solves).

    Raises:
        ValueError: bad shapes, k out of range, NaN/Inf, non-symmetric input, ``B`` not positive
            definite.
        adjointgen.ConvergenceError: the eigensolver or a backward solve did not reach its
            tolerance (the message gives the residual reached).

    Warns:
        UserWarning: the gap between the last kept and the first discarded eigenvalue is tiny, so
            the eigenvectors and their gradient are ill-defined.
    """
    from ..composite.eigsh import eigsh as _eigsh

    if isinstance(A, torch.Tensor) and A.layout == torch.strided:
        checks.symmetric_matrix(A, "A", complex_ok=True)
    if isinstance(B, torch.Tensor) and B.layout == torch.strided:
        checks.symmetric_matrix(B, "B", complex_ok=True)
    return _eigsh(A, k, B, largest=largest, tol=tol, maxiter=maxiter, return_info=return_info)


def pinv(A: torch.Tensor, *, atol=None, rtol=None, hermitian: bool = False) -> torch.Tensor:
    """Moore–Penrose pseudo-inverse with ``torch.linalg.pinv``'s cutoff semantics and result, and a
    rank-revealing fast path: LU (square), Cholesky of the Gram matrix or QR (tall/wide), Cholesky
    (``hermitian``) when randomized bounds on the extreme singular values show that no singular
    value is near the cutoff; otherwise the SVD (eigh for ``hermitian``).  The choice and its reason
    are logged at DEBUG level on the ``adjointgen.pinv`` logger;
    :func:`adjointgen.runtime.pinv.pinv_forward` with ``return_info=True`` returns them.

    The gradient is the constant-rank derivative derived from the four Penrose identities
    (``derivations/pinv.py``); reverse and forward mode, second derivatives, batches ``(..., m, n)``,
    float32/float64/complex64/complex128, CPU/CUDA.  With ``hermitian=True`` the input must be
    symmetric (Hermitian) and the gradient is too (as ``torch.linalg.pinv``'s).

    Raises:
        ValueError: NaN/Inf entries, negative ``atol``/``rtol``, fewer than two dimensions, an
            integer dtype, ``hermitian=True`` with a non-square or non-symmetric matrix.
    """
    checks.tensor(A, "A")
    checks.floating(A, "A", complex_ok=True)
    checks.matrix(A, "A", square=hermitian)  # finiteness is checked by the forward, in its one host transfer
    if hermitian:
        checks.symmetric(A, "A")
        A = 0.5 * (A + A.mH)  # equal for valid input; the gradient is Hermitian, as for eigh
    return _function.apply(PinvFunction, A, checks.Options((atol, rtol, hermitian)))


_LSTSQ_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def lstsq(A: torch.Tensor, B: torch.Tensor, rcond: float | None = None, *, driver: str | None = None):
    """Least-squares solution of ``A X = B`` as :func:`torch.linalg.lstsq`: the result tuple
    ``(solution, residuals, rank, singular_values)`` with torch's shapes and its per-driver rules for
    which of the last three are computed (``driver`` defaults to ``"gelsy"`` on CPU and ``"gels"``
    on CUDA, where it is the only one).

    ``solution`` is the minimum-norm least-squares solution ``A⁺ B`` for every driver: singular
    values at most ``rcond * sigma_max`` are treated as zero (``rcond`` defaults to
    ``eps * max(m, n)``), so full-rank tall input gets the least-squares solution, full-rank wide
    input the solution of least norm, and rank-deficient input the minimum-norm minimiser (torch's
    ``"gels"`` assumes full rank and returns garbage otherwise).  The pseudo-inverse is computed by
    the rank-revealing fast path of :func:`pinv` (one LU, Cholesky or QR when no singular value is
    near the cutoff; the SVD otherwise) and kept for the rule.

    The gradient of ``solution`` (and of ``residuals``, computed from it) is the constant-rank rule
    derived in ``derivations/lstsq.py`` from ``X = P B`` and the four Penrose identities of ``P = A⁺``
    (torch's backward computes ``pinv(A)`` by an SVD); reverse and forward mode, ``torch.func``
    transforms, higher derivatives, real and complex, batches that broadcast.  ``rank`` and
    ``singular_values`` are not differentiable, as in torch.

    ``B`` is a batch of vectors ``(..., m)`` exactly when it is 1-D or ``B.shape == A.shape[:-1]``
    (as for :func:`solve`), else a batch of matrices ``(..., m, k)``; batch dimensions broadcast.

    Raises:
        ValueError: NaN/Inf, non-floating or mismatched dtypes, shapes torch rejects (also a
            ``RuntimeError``, with torch's message), an unknown driver.
    """
    checks.tensor(A, "A")
    checks.tensor(B, "B")
    if A.dim() < 2:
        raise checks.ShapeError("torch.linalg.lstsq: input must have at least 2 dimensions.")
    if not 0 <= A.dim() - B.dim() <= 1 or B.dim() < 1:
        raise checks.ShapeError("torch.linalg.lstsq: input.dim() must be greater or equal to other.dim() and "
                                "(input.dim() - other.dim()) <= 1")
    if A.dtype != B.dtype:
        raise checks.ShapeError(f"torch.linalg.lstsq: Expected input and other to have the same dtype, but got "
                                f"input's dtype {str(A.dtype)[6:].capitalize()} and other's dtype "
                                f"{str(B.dtype)[6:].capitalize()}")
    vector = B.dim() == 1 or (B.dim() == A.dim() - 1 and B.shape == A.shape[:-1])
    Bm = B.unsqueeze(-1) if vector else B
    if A.shape[-2] != Bm.shape[-2]:
        raise checks.ShapeError("torch.linalg.lstsq: input.size(-2) should match other.size(-2)")
    if driver is None:
        driver = "gels" if A.device.type == "cuda" else "gelsy"
    if driver not in _LSTSQ_DRIVERS:
        raise checks.ShapeError("torch.linalg.lstsq: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)")
    if A.device.type == "cuda" and driver != "gels":
        raise checks.ShapeError("torch.linalg.lstsq: `driver` other than `gels` is not supported on CUDA")
    if rcond is not None and not (isinstance(rcond, (int, float)) and rcond >= 0):
        raise ValueError(f"lstsq: rcond must be a non-negative number or None, got {rcond!r}")
    m, n = A.shape[-2:]
    checks.matrix_input(A, "A", complex_ok=True)
    checks.matrix_input(Bm, "B", complex_ok=True)
    Ab, Bb = checks.broadcast_batch(A, Bm)
    X, P = _lstsq.LstsqFunction.apply(Ab, Bb, checks.Options((rcond,)))  # P = A⁺, for the rule and the rank
    batch_A = A.shape[:-2]
    real = A.real.dtype if A.is_complex() else A.dtype
    empty = A.new_empty((0,), dtype=real)
    rank = torch.empty(0, dtype=torch.int64, device=A.device)
    if driver != "gels":
        with torch.no_grad():
            if min(m, n) == 0:
                rank = torch.zeros(batch_A, dtype=torch.int64, device=A.device)
            else:
                # rank(A) = tr(A A⁺) (A A⁺ is an orthogonal projector): no second factorization
                trace = (Ab.detach() * P.detach().mT).sum((-2, -1))
                ranks = (trace.real if trace.is_complex() else trace).round().to(torch.int64)
                # torch's rank has the batch shape of A (B has no more dimensions than A), not the broadcast one
                rank = ranks[tuple(slice(0, 1) if a == 1 else slice(None) for a in batch_A)].reshape(batch_A)
    # not computed: empty, but (as torch's) an output of the graph, so that tools that differentiate
    # every floating output (gradcheck) see the same outputs
    residuals = (X.real if X.is_complex() else X).reshape(-1)[:0]
    # torch computes residuals for m > n, except with gelsy, and with gelsd/gelss only at full rank
    if m > n and (driver == "gels" or driver != "gelsy" and (rank.numel() == 0 or bool((rank == n).all()))):
        r = A @ X - Bm
        residuals = (r.real ** 2 + r.imag ** 2 if r.is_complex() else r ** 2).sum(-2)
    singular_values = empty
    if driver in ("gelsd", "gelss"):
        with torch.no_grad():
            singular_values = torch.linalg.svdvals(A.detach())
    return torch.return_types.linalg_lstsq((X.squeeze(-1) if vector else X, residuals, rank, singular_values))


def svd(A: torch.Tensor, full_matrices: bool = True, *, cluster_rtol: float | None = None,
        broadening: float | None = None):
    """Singular value decomposition ``A = U diag(S) Vh`` as :func:`torch.linalg.svd`, with the rule
    derived in ``derivations/svd.py`` (cotangents on ``U``, ``S`` and ``Vh``, each may be absent).

    Args:
        A: ``(..., m, n)`` float32/float64/complex64/complex128.
        full_matrices: ``True`` (the default, as torch's) with m != n: ``U`` is m×m (or ``Vh``
            n×n); the extra columns are an orthonormal basis of the complement, defined only
            through their span: a loss that depends on them through their span (e.g. the projector
            ``U2 U2^H``) gets its exact gradient (``derivations/svd_complement.py``), one that
            depends on the basis itself raises (torch silently ignores their cotangent).
            ``False``: thin factors, k = min(m, n).

    Returns:
        ``(U, S, Vh)``: ``(..., m, m)`` (thin: ``(..., m, k)``), ``(..., k)`` descending,
        ``(..., n, n)`` (thin: ``(..., k, n)``).

    Gradients of ``U``, ``Vh`` are defined for distinct nonzero singular values and losses that do
    not depend on the sign (complex: the phase ``e^{iθ}``) of a singular pair.  For complex ``A`` the
    backward evaluates the derived gauge residual and raises
    :class:`adjointgen.runtime.gauge.PhaseDependentLossError` for a phase-dependent loss (turn the
    check, a host synchronisation on GPUs, off with ``adjointgen.runtime.gauge.set_enabled(False)``); a warning names the pair when two singular values
    (or one and zero) are too close for the rule's ``1/(s_j^2 - s_i^2)`` and ``1/s``.

    Raises:
        ValueError: NaN/Inf, empty dimensions, integer dtype, fewer than two dimensions.
    """
    if full_matrices and isinstance(A, torch.Tensor) and A.dim() >= 2 and A.shape[-1] != A.shape[-2]:
        _routes.taken("svd", "full")
        checks.matrix_input(A, "A", complex_ok=True)
        from ..composite.svd import SvdFullFunction, SvdFullFunctionCompiled

        U, S, Vh = _function.apply(SvdFullFunction, A, compiled=SvdFullFunctionCompiled)
    else:
        _routes.taken("svd", "thin")
        checks.degeneracy_options(cluster_rtol, broadening)
        U, S, Vh = _svd.svd(A, cluster_rtol=cluster_rtol, broadening=broadening)
        if isinstance(A, torch.Tensor) and A.dim() >= 2:
            from ..composite.svd import guard_null_space

            if A.shape[-2] >= A.shape[-1]:  # tall: U's columns of zero singular values are free in the cokernel
                U, S = guard_null_space(U, S, cluster_rtol)
            else:
                V, S = guard_null_space(Vh.mH, S, cluster_rtol)
                Vh = V.mH
    return U, S, Vh


def svds(A: torch.Tensor, k: int, *, largest: bool = True, tol: float | None = None, maxiter: int | None = None,
         return_info: bool = False):
    """The ``k`` largest (or smallest) singular triplets ``A ≈ U diag(S) Vh`` without a full SVD,
    with the exact gradient, including the coupling to the discarded singular vectors.

    Forward: the partial eigendecomposition of the Gram operator ``X -> A^T (A X)`` (or
    ``A (A^T X)`` for a wide ``A``), matrix-free, then ``S = sqrt(w)``, ``U = A V S^-1``.
    Reverse and forward mode: the rules derived in ``derivations/svds.py``, whose projected shifted
    solves with ``A^T A - s_i^2 I`` on the complement of span(V) carry the coupling to the discarded
    part; the Gram operator is applied matrix-free for n > 400 (dense, and differentiable twice,
    below).  Singular values below ``sqrt(eps) * S[0]`` lose relative accuracy through the
    squaring; ``largest=False`` is meant for well-conditioned ``A``.

    Args:
        A: ``(..., m, n)`` float32/float64 dense tensor.
        k: ``1 <= k <= min(m, n)``.

    Returns:
        ``(U, S, Vh)``: ``(..., m, k)``, ``(..., k)`` (descending when ``largest``), ``(..., k, n)``;
        with ``return_info=True`` also the partial eigensolver's
        :class:`~adjointgen.runtime.eigsolvers.PartialEighInfo` of the Gram matrix (a list of them
        for a batch): the route, the residual reached, the certificate that no singular value was
        skipped, the gap to the first discarded one.

    Equal singular values (to ``cluster_rtol``, as for :func:`svd`): a loss that depends on the
    basis of their singular vectors, or on the individual values, raises
    :class:`adjointgen.DegenerateSubspaceError` in the backward; so does a loss that uses a kept
    pair of a cluster that ``k`` cuts.  The left vectors of zero singular values are completed to
    an orthonormal set.
    """

    checks.tensor(A, "A")
    checks.floating(A, "A")
    checks.matrix(A, "A")
    checks.finite(A, "A")
    m, n = A.shape[-2:]
    if not isinstance(k, int) or not 1 <= k <= min(m, n):
        raise ValueError(f"k must be an integer in [1, min(m, n) = {min(m, n)}], got {k!r}")
    if A.dim() > 2 and A.numel() == 0:  # an empty batch: empty results, connected to A for autograd
        anchor = A.sum((-2, -1), keepdim=True) * 0
        batch = A.shape[:-2]
        out = (anchor.expand(*batch, m, k), anchor[..., 0].expand(*batch, k), anchor.expand(*batch, k, n))
        return (*out, []) if return_info else out
    if A.dim() > 2:
        outs = [svds(a, k, largest=largest, tol=tol, maxiter=maxiter, return_info=True)
                for a in A.reshape(-1, m, n).unbind(0)]
        out = tuple(torch.stack([o[i] for o in outs]).reshape(*A.shape[:-2], *outs[0][i].shape) for i in range(3))
        return (*out, [o[3] for o in outs]) if return_info else out
    if m < n:
        Vt, S, Ut, info = svds(A.mT, k, largest=largest, tol=tol, maxiter=maxiter, return_info=True)
        return (Ut.mT, S, Vt.mT, info) if return_info else (Ut.mT, S, Vt.mT)
    from ..composite.svds import SvdsFunction

    U, S, V, info = SvdsFunction.apply(A, k, largest, tol, maxiter, return_info=True)
    from ..composite.svd import guard_null_space

    U, S = guard_null_space(U, S)  # zero singular values: their U columns and values (see svd)
    return (U, S, V.mT, info) if return_info else (U, S, V.mT)


# ------------------------------------------------------------------ matrix functions
from .matrix_functions import expm, funm, logm, matrix_exp, powm, sqrtm  # noqa: E402

# the _ex variants: an info tensor instead of an error
from .ex import cholesky_ex, inv_ex, lu_factor_ex, solve_ex  # noqa: E402


def _catalogue() -> list[str]:
    """Every generated operation with a public function that this module does not define by hand
    (``adjointgen.generated.torch.<name>.<name>``, its checked public function): an operation is its
    derivation file, and a new one appears here with no edit of this module."""
    import importlib
    import pkgutil

    package = importlib.import_module("adjointgen.generated.torch")
    added = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name in globals():
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        public = getattr(module, info.name, None)
        if callable(public) and hasattr(module, "RULES"):
            globals()[info.name] = public
            added.append(info.name)
    return added


__all__ += _catalogue()

"""Solves that generated rules call with a factorization the forward saved (``d.forward(saves=)``).

``lu_solve(A, LU, pivots, B)`` is ``A^-1 B`` (``A^-H B`` with ``adjoint``; ``B A^-1`` with
``left=False``).  A first-order backward runs without a graph (grad mode off): then the LU factors
of the forward are reused, an ``O(n^2 p)`` solve instead of a new ``O(n^3)`` factorization.  When a
graph is recorded (``create_graph=True``, forward-mode transforms), the factors are constants of the
graph, so the solve is done with ``A`` itself and every higher derivative stays exact.  No formula
lives here: which factorization to use is a numerical choice, the rule is the derived one.
"""
from __future__ import annotations

import torch
from . import memo
from .function import nested_forward as _nested_forward
from .routes import taken

__all__ = ["adjugate", "expm_frechet", "expm_frechet_solve", "lower_half", "lu_solve", "matrix_exp", "sylvester",
           "triangular_sylvester_solve"]


def _reusable(*tensors) -> bool:
    if torch.is_grad_enabled():
        return False
    if _plain_mode() and all(type(t) is torch.Tensor and not t.is_meta for t in tensors if t is not None):
        return True  # no transform, dual level or compiler: plain tensors are neither traced nor dual
    from .checks import is_traced

    return not any(isinstance(t, torch.Tensor) and (is_traced(t) or _is_dual(t)) for t in tensors)


def _plain_mode() -> bool:
    """No ``torch.func`` transform, forward-AD dual level or compiler is active (the common
    first-order backward): a cheap test before the per-tensor ones of :func:`_reusable`."""
    try:
        from torch._C import _are_functorch_transforms_active
        from torch.autograd import forward_ad

        return (not _are_functorch_transforms_active() and forward_ad._current_level < 0
                and not torch.compiler.is_compiling())
    except (ImportError, AttributeError):  # pragma: no cover - another torch: the per-tensor tests
        return False


def _is_dual(t: torch.Tensor) -> bool:
    try:
        from torch._C._functorch import is_functorch_wrapped_tensor

        if is_functorch_wrapped_tensor(t):
            return True
    except ImportError:  # pragma: no cover - older torch
        pass
    return torch.autograd.forward_ad.unpack_dual(t).tangent is not None


def pivot_parity(pivots, dtype):
    """``det(P)`` of LAPACK's row interchanges ``pivots`` (``(..., n)``, 1-based, as
    ``torch.linalg.lu_factor`` returns them): ``-1`` for an odd number of swaps, else ``1``."""
    n = pivots.shape[-1]
    swaps = (pivots != torch.arange(1, n + 1, device=pivots.device, dtype=pivots.dtype)).sum(-1)
    return 1 - 2 * (swaps % 2).to(dtype)


def lower_half(X):
    """``Φ(X)``: the lower triangle of ``X`` with its diagonal halved (the triangular factorizations'
    projection), in one pass over ``X``: a product with the fixed mask (1 below the diagonal, 1/2 on
    it), out of place, so that forward-mode zero tangents, ``vmap`` and compilers take it as any
    product."""
    n = X.shape[-1]
    real = X.real.dtype if X.is_complex() else X.dtype
    key = (n, real, X.device)
    mask = _HALF_LOWER.get(key)
    if mask is None:
        mask = torch.ones(n, n, dtype=real, device=X.device).tril()
        mask.diagonal().fill_(0.5)
        mask = memo.store(_HALF_LOWER, key, mask, limit=64)
    return X * mask


#: the masks of :func:`lower_half`, per size, dtype and device
_HALF_LOWER: dict = memo.table()


def lu_solve(A, LU, pivots, B, *, adjoint: bool = False, left: bool = True):
    """``op(A)^-1 B`` (``left``) or ``B op(A)^-1``, ``op(A) = A^H`` with ``adjoint``."""
    if LU is not None and _reusable(A, B):
        return torch.linalg.lu_solve(LU, pivots, B, left=left, adjoint=adjoint)
    M = A.mH if adjoint else A
    return torch.linalg.solve(M, B, left=left)


def _sylvester_in_eigenbases(A, B, C, same=False):
    """``X`` with ``A X + X B = C`` for Hermitian ``A``, ``B`` (no graph): ``C`` taken to the
    eigenbases, divided entrywise by ``a_i + b_j``, and taken back (``same``: ``B`` is ``A``)."""
    from .checks import is_traced
    from .schur import check_sums

    wa, Va = torch.linalg.eigh(A)
    wb, Vb = (wa, Va) if same else torch.linalg.eigh(B)
    denominator = wa[..., :, None] + wb[..., None, :]
    if not is_traced(denominator) and denominator.numel():  # a pair adding up to zero to rounding: named
        a, b = (w.detach().cpu().numpy() for w in (wa, wb))
        check_sums(a, b, abs(a).max(-1, initial=0) + abs(b).max(-1, initial=0))
    Ct = Va.mH @ C @ Vb
    return Va @ (Ct / denominator.to(Ct.dtype)) @ Vb.mH


@torch.compiler.disable  # NumPy on the host: a compiler runs it as is
def _bartels_stewart(A, B, C):
    """``X`` with ``A X + X B = C`` for general ``A``, ``B`` (batched): the NumPy solver on the host."""
    from .xp import sylvester as on_host

    import numpy

    from .checks import host_arrays

    from .host import single_threaded_blas

    a, b, c = host_arrays("sylvester (general A, B)", A, B, C)
    with single_threaded_blas():
        X = on_host(numpy, a, b, c, hermitian=False)
    return torch.from_numpy(X).to(device=C.device)


class _SylvesterSolve(torch.autograd.Function):
    """``X = Syl[A, B](C)``, solved by ``_solve(A, B, C, *extra)``.  Its derivatives are Sylvester
    solves again (so every order is exact and no eigenvalue gap enters, unlike differentiating
    through ``eigh``): ``dX = Syl[A, B](dC - dA X - X dB)``; reverse: ``gC = Syl[A^H, B^H](gX)``,
    ``gA = -gC X^H``, ``gB = -X^H gC``.  Subclasses: the Hermitian solver (``extra``: ``same``, ``B``
    is ``A``; ``A^H = A`` keeps the eigenbases) and the general one."""

    @staticmethod
    def _setup(ctx, inputs, output, solver):
        A, B, C, *extra = inputs
        ctx.solver, ctx.extra = solver, tuple(extra)
        ctx.save_for_backward(A, B, output)
        ctx.save_for_forward(A, B, output)

    @staticmethod
    def backward(ctx, gX, *_):
        A, B, X = ctx.saved_tensors
        gC = ctx.solver.apply(A.mH, B.mH, gX, *ctx.extra)
        gA = -(gC @ X.mH) if ctx.needs_input_grad[0] else None
        gB = -(X.mH @ gC) if ctx.needs_input_grad[1] else None
        return (gA, gB, gC, *(None,) * len(ctx.extra))

    @staticmethod
    @_nested_forward
    def jvp(ctx, dA, dB, dC, *_):
        A, B, X = ctx.saved_tensors
        rhs = torch.zeros_like(X) if dC is None else dC
        if dA is not None:
            rhs = rhs - dA @ X
        if dB is not None:
            rhs = rhs - X @ dB
        return ctx.solver.apply(A, B, rhs, *ctx.extra)


class _Sylvester(_SylvesterSolve):
    """Hermitian ``A``, ``B``: solved in their eigenbases, any device, vmapped by torch."""

    generate_vmap_rule = True

    @staticmethod
    def forward(A, B, C, same):
        return _sylvester_in_eigenbases(A, B, C, same)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _SylvesterSolve._setup(ctx, inputs, output, _Sylvester)


class _SylvesterGeneral(_SylvesterSolve):
    """General ``A``, ``B``: Bartels-Stewart on the host; ``vmap`` runs the batch on plain tensors."""

    @staticmethod
    def forward(A, B, C):
        return _bartels_stewart(A, B, C)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _SylvesterSolve._setup(ctx, inputs, output, _SylvesterGeneral)

    @staticmethod
    def vmap(info, in_dims, A, B, C):
        from .checks import vmap_as_batch

        return vmap_as_batch(_SylvesterGeneral, info, in_dims, A, B, C)


def sylvester(A, B, C, hermitian: bool = True):
    """``X`` with ``A X + X B = C`` (batched, broadcasting), e.g. ``P X + X P = C`` of the polar
    decomposition or ``X dX + dX X = dA`` of a square root.  ``hermitian``: ``A`` and ``B`` are
    Hermitian (real symmetric), solved in their eigenbases on any device; otherwise by
    Bartels-Stewart (SciPy on the CPU: other devices make a host round trip).  Differentiable to any
    order (its own derivatives are Sylvester solves), also where ``A`` or ``B`` has repeated
    eigenvalues.

    Raises:
        SingularMatrixError: an eigenvalue of ``A`` is the negative of one of ``B`` (no unique ``X``).
    """
    same = A is B
    batch = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2], C.shape[:-2])
    dtype = torch.promote_types(torch.promote_types(A.dtype, B.dtype), C.dtype)
    A, B, C = (x.to(dtype).expand(*batch, *x.shape[-2:]) for x in (A, B, C))
    if not hermitian:
        return _SylvesterGeneral.apply(A, B, C)
    return _Sylvester.apply(A, A if same else B, C, same)


def adjugate(A, LU=None, pivots=None, *, adjoint: bool = False):
    """``adj(op(A))``, with ``A adj(A) = det(A) I`` and ``op(A) = A^H`` with ``adjoint``, for batches
    of square real or complex ``A``, differentiable to second order at every ``A``, singular ones
    included.  ``LU``, ``pivots``: the LU factorization of ``A`` the forward saved (``None``: none);
    a first-order backward takes ``det(A) A^-1`` from it instead of factoring ``A`` again.

    Where every matrix of the batch is well conditioned (its LU pivots within ``sqrt(eps)`` of the
    largest, read on the host) it is ``det(A) A^-1`` from one LU factorization, differentiated by
    torch to any order.  Otherwise (and under a compiler, which has no values to read) it comes from
    the SVD ``A = U S V^H``: ``adj(A) = c V adj(S) U^H`` with ``c = det(U) det(V^H)`` and
    ``adj(S) = diag(prod_{j != i} s_j)``, and its derivative from the same factors,
    ``d adj(A)[E] = c V M(U^H E V) U^H`` (:func:`_adjugate_differential`), which is exact at every
    rank: ``adj`` is a polynomial, and ``adj(U (S + X) V^H) = c V adj(S + X) U^H`` holds with the
    factors held fixed, so no derivative of the SVD (which divides by gaps) enters.  A third
    derivative on this path raises."""
    n = A.shape[-1]
    if n == 0:
        return A.clone()
    if n == 1:
        return torch.ones_like(A)
    from .checks import physical

    from .verdict import deferred

    if adjoint and (LU is None or not _reusable(A, LU)):  # adj(A^H) = adj(A)^H: factor A^H itself
        A, LU, adjoint = A.mH, None, False
    if deferred(A):  # no host decision: the form exact at every rank
        taken("adjugate", "svd")
        adj = _Adjugate.apply(A)
        return adj.mH if adjoint else adj
    if LU is None or not _reusable(A, LU):
        LU, pivots, _ = torch.linalg.lu_factor_ex(A)  # one factorization: its pivots decide, and it is used
    plain = physical(LU.detach())
    if plain is not None:
        magnitude = plain[0].diagonal(dim1=-2, dim2=-1).abs()
        eps = torch.finfo(magnitude.dtype).eps
        if not magnitude.numel() or bool((magnitude.amin(-1) > magnitude.amax(-1) * eps ** 0.5).all()):
            det = pivot_parity(pivots, A.dtype) * LU.diagonal(dim1=-2, dim2=-1).prod(-1)
            eye = torch.eye(n, dtype=A.dtype, device=A.device).expand_as(A)
            taken("adjugate", "lu")
            if adjoint:  # adj(A^H) = conj(det A) A^-H
                return det.conj()[..., None, None] * torch.linalg.lu_solve(LU, pivots, eye, adjoint=True)
            return det[..., None, None] * torch.linalg.lu_solve(LU, pivots, eye)
    taken("adjugate", "svd")
    adj = _Adjugate.apply(A)
    return adj.mH if adjoint else adj


def _svd_factors(A):
    """``(c, V, S, U)`` of ``A = U S V^H``, ``c = det(U) det(V^H)`` (``(..., 1, 1)``):
    ``adj(A) = c V adj(S) U^H``."""
    U, S, Vh = torch.linalg.svd(A)
    phase = torch.linalg.det(U) * torch.linalg.det(Vh)
    return phase[..., None, None], Vh.mH, S, U


def _products_but(S, exclude_pair: bool):
    """``prod_{l != i} s_l`` (``(..., n)``), or with ``exclude_pair`` the matrix
    ``P_ij = prod_{l not in {i, j}} s_l`` (``(..., n, n)``, ``P_ii`` unused): no division, exact zeros
    where two or more singular values are zero (the count of zeros decides; logarithms of the
    others give the product)."""
    zero = S == 0
    logs = torch.where(zero, torch.zeros((), dtype=S.dtype, device=S.device), torch.log(torch.where(zero, 1, S)))
    total, zeros = logs.sum(-1, keepdim=True), zero.sum(-1, keepdim=True)
    if not exclude_pair:
        left = zeros - zero.to(zeros.dtype)
        return torch.where(left > 0, torch.zeros((), dtype=S.dtype, device=S.device), torch.exp(total - logs))
    pair = logs[..., :, None] + logs[..., None, :]
    left = zeros[..., None] - zero[..., :, None].to(zeros.dtype) - zero[..., None, :].to(zeros.dtype)
    return torch.where(left > 0, torch.zeros((), dtype=S.dtype, device=S.device), torch.exp(total[..., None] - pair))


def _adjugate_differential(S, X):
    """``M(X) = d adj(S)[X]`` for diagonal ``S``: ``c V M(U^H E V) U^H`` is the derivative of ``adj``
    at ``A = U S V^H`` along ``E`` -- and, as ``M`` is self-adjoint, the reverse-mode cotangent
    ``U M(conj(c) V^H G U) V^H`` is the same map read the other way (see :func:`adjugate`).  ``M(X)_ii = sum_{k != i} P_ik X_kk``, ``M(X)_ij = -P_ij X_ij`` (``i != j``),
    ``P_ij = prod_{l not in {i, j}} s_l``."""
    P = _products_but(S, True).to(X.dtype)
    n = S.shape[-1]
    off = ~torch.eye(n, dtype=torch.bool, device=S.device)
    P = torch.where(off, P, torch.zeros((), dtype=P.dtype, device=P.device))
    diag = (P * torch.diagonal(X, dim1=-2, dim2=-1)[..., None, :]).sum(-1)
    return torch.diag_embed(diag) - P * X


class _Adjugate(torch.autograd.Function):
    """``adj(A)`` from the SVD, its derivatives from the same factors (:func:`adjugate`)."""

    @staticmethod
    def forward(A):
        c, V, S, U = _svd_factors(A)
        return c * ((V * _products_but(S, False).to(A.dtype)[..., None, :]) @ U.mH)

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, = inputs
        ctx.save_for_backward(A)
        ctx.save_for_forward(A)

    @staticmethod
    def backward(ctx, G):
        A, = ctx.saved_tensors
        return _AdjugateDerivative.apply(A, G, True)

    @staticmethod
    @_nested_forward
    def jvp(ctx, dA):
        A, = ctx.saved_tensors
        return _AdjugateDerivative.apply(A, dA, False)

    @staticmethod
    def vmap(info, in_dims, A):
        from .checks import vmap_as_batch

        return vmap_as_batch(_Adjugate, info, in_dims, A)


class _AdjugateDerivative(torch.autograd.Function):
    """``d adj(A)[E]`` (``reverse``: the cotangent ``gA`` of ``G``), linear in the second argument;
    its derivative in ``A`` (a third derivative of ``det``) raises."""

    @staticmethod
    def forward(A, E, reverse):
        c, V, S, U = _svd_factors(A)
        E = E.to(A.dtype)
        if reverse:  # U M(conj(c) V^H G U) V^H
            return U @ _adjugate_differential(S, c.conj() * (V.mH @ E @ U)) @ V.mH
        return c * (V @ _adjugate_differential(S, U.mH @ E @ V) @ U.mH)

    @staticmethod
    def setup_context(ctx, inputs, output):
        A, _, ctx.reverse = inputs
        ctx.save_for_backward(A)
        ctx.save_for_forward(A)

    @staticmethod
    def backward(ctx, G):
        A, = ctx.saved_tensors
        if ctx.needs_input_grad[0]:
            raise NotImplementedError("adjugate: a third derivative of det at a singular or ill-conditioned A is "
                                      "not implemented")
        return None, _AdjugateDerivative.apply(A, G, not ctx.reverse), None

    @staticmethod
    @_nested_forward
    def jvp(ctx, dA, dE, _):
        A, = ctx.saved_tensors
        if dA is not None:
            raise NotImplementedError("adjugate: a third derivative of det at a singular or ill-conditioned A is "
                                      "not implemented")
        return _AdjugateDerivative.apply(A, dE, ctx.reverse)

    @staticmethod
    def vmap(info, in_dims, A, E, reverse):
        from .checks import vmap_as_batch

        return vmap_as_batch(_AdjugateDerivative, info, in_dims, A, E, reverse)


def matrix_exp(A):
    """``exp(A)`` of general square ``A`` (``torch.linalg.matrix_exp``)."""
    return torch.linalg.matrix_exp(A)


def _block(rows):
    return torch.cat([torch.cat(row, -1) for row in rows], -2)


def expm_frechet(A, E):
    """``L_exp[A](E)``, the Fréchet derivative of ``exp`` at ``A`` along ``E``: the upper right
    corner of ``exp([[A, E], [0, A]])`` (batched, broadcasting; torch operations only, so every
    derivative of it is exact)."""
    batch = torch.broadcast_shapes(A.shape[:-2], E.shape[:-2])
    dtype = torch.promote_types(A.dtype, E.dtype)
    A, E = (x.to(dtype).expand(*batch, *x.shape[-2:]) for x in (A, E))
    n = A.shape[-1]
    Z = torch.zeros_like(A)
    return torch.linalg.matrix_exp(_block([[A, E], [Z, A]]))[..., :n, n:]


def _expm_frechet2(A, E1, E2):
    """The second Fréchet derivative ``L2_exp[A](E1, E2)``: the corner ``(1, 4)`` of the exponential
    of ``[[A, E1, E2, 0], [0, A, 0, E2], [0, 0, A, E1], [0, 0, 0, A]]`` (Higham and Relton)."""
    n = A.shape[-1]
    Z = torch.zeros_like(A)
    M = _block([[A, E1, E2, Z], [Z, A, Z, E2], [Z, Z, A, E1], [Z, Z, Z, A]])
    return torch.linalg.matrix_exp(M)[..., :n, 3 * n:]


def expm_frechet_solve(X, C):
    """``Y`` with ``L_exp[X](Y) = C`` (batched, broadcasting): the Fréchet derivative of the
    principal logarithm at ``exp(X)``, for ``X`` a principal logarithm (eigenvalues with imaginary
    parts in ``(-pi, pi)``).  Differentiable to any order: ``dY = L_exp[X]^-1(dC - L2_exp[X](dX, Y))``,
    reverse ``gC = L_exp[X^H]^-1(gY)``, ``gX = -L2_exp[X^H](Y^H, gC)``.

    Raises:
        SingularMatrixError: an eigenvalue of ``X`` has ``|Im| >= pi`` (``L_exp[X]`` may be singular
            there, and the logarithm is not the principal one).
    """
    batch = torch.broadcast_shapes(X.shape[:-2], C.shape[:-2])
    dtype = torch.promote_types(X.dtype, C.dtype)
    X, C = (x.to(dtype).expand(*batch, *x.shape[-2:]) for x in (X, C))
    return _ExpFrechetSolve.apply(X, C)


@torch.compiler.disable  # SciPy on the host: a compiler runs it as is
def _expm_frechet_solve_on_host(X, C):
    from .xp import expm_frechet_solve as on_host

    import numpy

    from .checks import host_arrays

    x, c = host_arrays("the inverse Fréchet derivative of exp (logm)", X, C)
    try:
        y = on_host(numpy, x, c)
    except numpy.linalg.LinAlgError as exc:
        from .checks import SingularMatrixError

        raise SingularMatrixError(str(exc)) from None
    return torch.from_numpy(y).to(device=C.device, dtype=C.dtype)


class _ExpFrechetSolve(torch.autograd.Function):
    """``Y = L_exp[X]^-1(C)`` on the host (SciPy); its derivatives through :func:`expm_frechet`'s
    second-order form and itself."""

    @staticmethod
    def forward(X, C):
        return _expm_frechet_solve_on_host(X, C)

    @staticmethod
    def setup_context(ctx, inputs, output):
        X, C = inputs
        ctx.save_for_backward(X, output)
        ctx.save_for_forward(X, output)

    @staticmethod
    def backward(ctx, gY):
        X, Y = ctx.saved_tensors
        gC = _ExpFrechetSolve.apply(X.mH, gY)
        gX = -_expm_frechet2(X.mH, Y.mH, gC) if ctx.needs_input_grad[0] else None
        return gX, gC

    @staticmethod
    @_nested_forward
    def jvp(ctx, dX, dC):
        X, Y = ctx.saved_tensors
        rhs = torch.zeros_like(Y) if dC is None else dC
        if dX is not None:
            rhs = rhs - _expm_frechet2(X, dX, Y)
        return _ExpFrechetSolve.apply(X, rhs)

    @staticmethod
    def vmap(info, in_dims, X, C):
        from .checks import vmap_as_batch

        return vmap_as_batch(_ExpFrechetSolve, info, in_dims, X, C)


def triangular_sylvester_solve(T, C, upper: bool = True):
    """The strictly lower ``X`` with ``tril₋(X T - T X) = tril₋(C)`` for triangular ``T`` (batched,
    broadcasting): the Schur decomposition's ``tril₋(Z^H dZ)`` (upper ``T``) and its adjoint (lower
    ``T^H``).  Column by column for upper ``T``,
    ``(T_jj I - T[j+1:, j+1:]) x_j = C[j+1:, j] - X[j+1:, :j] T[:j, j]``; row by row for lower ``T``,
    ``x_i (T[:i, :i] - T_ii I) = C[i, :i] + T[i, :i] X[:i, :i]``: ``n - 1`` triangular solves, made of
    torch operations without in-place updates, so every derivative (and ``vmap``) is torch's.  Where no
    derivative of the solve can be taken (no graph recorded, no forward-mode tangent, no ``torch.func``
    transform: a first-order backward) and the tensors are on the CPU, LAPACK's block solve on the host
    instead (:func:`adjointgen.runtime.xp.triangular_sylvester_blocks`: the same solution, ``O(n^3)`` in
    LAPACK where the loop takes ``n`` Python steps).

    Raises:
        ValueError: ``T`` is not triangular on that side (a ``2 x 2`` block of a real Schur form).
        SingularMatrixError: two diagonal entries of ``T`` are equal (to ``sqrt(eps)`` relative): no
            unique solution (a repeated eigenvalue).
    """
    from .checks import is_compiling_or_fake, physical

    batch = torch.broadcast_shapes(T.shape[:-2], C.shape[:-2])
    dtype = torch.promote_types(T.dtype, C.dtype)
    T, C = (x.to(dtype).expand(*batch, *x.shape[-2:]) for x in (T, C))
    plain = None if T.is_meta or is_compiling_or_fake(T) else physical(T.detach())
    if plain is not None and plain[0].numel():  # the values, also under torch.func transforms
        _check_triangular_spectrum(plain[0], upper)
    n = T.shape[-1]
    if n < 2:
        return torch.zeros_like(C)
    if plain is not None and not _recorded(T, C) and T.device.type == C.device.type == "cpu":
        import numpy

        from .host import single_threaded_blas
        from .schur import triangular_sylvester_blocks

        with torch.no_grad(), single_threaded_blas():
            X = triangular_sylvester_blocks(T.resolve_conj().numpy(), C.resolve_conj().numpy(), upper)
        return torch.from_numpy(numpy.ascontiguousarray(X))
    eye = torch.eye(n, dtype=dtype, device=T.device)
    zeros = lambda k: torch.zeros(*batch, k, dtype=dtype, device=T.device)  # noqa: E731
    parts = []
    if upper:  # columns, each with zeros above the diagonal
        for j in range(n - 1):
            rhs = C[..., j + 1:, j]
            if j:
                done = torch.stack(parts, -1)[..., j + 1:, :]
                rhs = rhs - (done @ T[..., :j, j, None])[..., 0]
            M = T[..., j:j + 1, j:j + 1] * eye[j + 1:, j + 1:] - T[..., j + 1:, j + 1:]
            x = torch.linalg.solve_triangular(M, rhs[..., None], upper=True)[..., 0]
            parts.append(torch.cat([zeros(j + 1), x], -1))
        parts.append(zeros(n))
        return torch.stack(parts, -1)
    parts.append(zeros(n))  # rows, each with zeros right of the diagonal
    for i in range(1, n):
        done = torch.stack(parts, -2)[..., :i, :i]
        rhs = C[..., i, :i] + (T[..., i:i + 1, :i] @ done)[..., 0, :]
        M = T[..., :i, :i] - T[..., i:i + 1, i:i + 1] * eye[:i, :i]
        x = torch.linalg.solve_triangular(M, rhs[..., None, :], upper=False, left=False)[..., 0, :]  # x M = r
        parts.append(torch.cat([x, zeros(n - i)], -1))
    return torch.stack(parts, -2)


def _recorded(*tensors) -> bool:
    """Whether a derivative of an operation on ``tensors`` can be taken: a graph is recorded, one of
    them carries a forward-mode tangent, or a ``torch.func`` transform wraps it."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return True
    wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
    return any((wrapped is None or wrapped(t)) or torch.autograd.forward_ad.unpack_dual(t).tangent is not None
               for t in tensors)


def _check_triangular_spectrum(T, upper: bool) -> None:
    """:func:`adjointgen.runtime.xp.check_triangular_spectrum` on a tensor: the verdicts in torch (on
    the tensor's device, readable under ``torch.func`` transforms), and the host only for the
    message of a failure."""
    with torch.no_grad():
        n = T.shape[-1]
        if n < 2:
            return
        other = T.tril(-1) if upper else T.triu(1)
        w = T.diagonal(dim1=-2, dim2=-1)
        eps = torch.finfo(w.real.dtype if w.is_complex() else w.dtype).eps
        scale = w.abs().amax(-1, keepdim=True)[..., None].clamp_min(torch.finfo(w.abs().dtype).tiny)
        gaps = (w[..., :, None] - w[..., None, :]).abs()
        eye = torch.eye(n, dtype=torch.bool, device=T.device)
        bad = (gaps <= eps ** 0.5 * scale) & ~eye
        if not bool(other.any()) and not bool(bad.any()):
            return
        import numpy

        from .schur import check_triangular_spectrum

        values = numpy.array(T.cpu().resolve_conj().tolist(), dtype=numpy.complex128 if T.is_complex() else numpy.float64)
    check_triangular_spectrum(numpy, values, upper)


def gram(A: torch.Tensor) -> torch.Tensor:
    """``A^H A`` (``A`` one ``m x n`` matrix, no graph): on the CPU by BLAS's symmetric rank-k update
    (``?syrk``/``?herk``: half the flops of the general product; 4000 x 2000 float64 on 2 threads, 0.22 s
    against 0.39 s), symmetric (Hermitian) to the last bit; elsewhere the product, symmetrized."""
    if A.device.type == "cpu" and A.dim() == 2 and A.dtype in (torch.float32, torch.float64, torch.complex64,
                                                                  torch.complex128) and min(A.shape) > 0:
        from scipy.linalg import blas

        a = A.detach().resolve_conj().numpy()
        update = {torch.float32: blas.ssyrk, torch.float64: blas.dsyrk, torch.complex64: blas.cherk,
                  torch.complex128: blas.zherk}[A.dtype]
        # a.T is the Fortran-ordered n x m matrix A^T: C = (A^T)(A^T)^H = A^T conj(A); A^H A is its conjugate
        lower = torch.from_numpy(update(1.0, a.T, trans=0, lower=1))
        if A.is_complex():
            lower = lower.conj()
        G = lower.tril() + lower.tril(-1).mH
        if A.is_complex():
            G.diagonal().imag.zero_()
        return G.resolve_conj()
    G = A.mH @ A
    return (G + G.mH) / 2

"""Linear-operator adapters: one interface over dense tensors, torch sparse tensors and matvec closures.

The partial eigensolvers and the projected linear solvers only ever need products ``A @ X`` with a
dense block ``X`` of shape ``(n, m)``. Everything they accept is wrapped by :func:`as_operator` into a
:class:`LinearOperator`, which exposes

- ``matmul(X)`` (also ``A @ X``): the product, in torch, on the operator's device;
- ``shape``, ``dtype``, ``device``;
- ``to_scipy()``: the same operator for the CPU solvers in :mod:`scipy.sparse.linalg`
  (a numpy array, a ``scipy.sparse`` CSR matrix, or a ``scipy.sparse.linalg.LinearOperator``);
- ``diagonal()``, ``to_dense()``, ``is_finite()``, ``is_symmetric()``: cheap facts the solvers use
  for preconditioning, small-problem fallbacks and input checks.

Complex operators (complex64/complex128 tensors, closures with complex parameters) work the same
way; "symmetric" then means Hermitian, ``A == A^H``.

A user-built :class:`LinearOperator` carries its parameters explicitly (``params``; without a
floating tensor among them and without ``dtype=``, the dtype is inferred from one probe product, or
a ``ValueError`` asks for it): ``matvec(X, *params)`` is ordinary differentiable torch code, so a
gradient of a loss with respect to the operator reaches the parameters by autograd through one extra
matvec (the generated backward calls ``matvec`` with the low-rank cotangent factors).

:func:`sparse_lowrank_pattern_grad` turns a low-rank cotangent ``L R^T`` into the gradient with
respect to the stored values of a sparse matrix, in ``O(nnz * r)`` without forming ``n x n``. The
sparse tensors built here pass ``check_invariants=False`` explicitly and torch's own warnings about
its sparse support are silenced around them (they are not about the user's code).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Sequence

import numpy as np
import torch

__all__ = ["LinearOperator", "as_operator", "sparse_lowrank_pattern_grad"]

# Number of gathered (row, rank) entries processed per chunk in sparse_lowrank_pattern_grad: bounds
# the temporary memory at about 2 * 8 MiB * itemsize / 8 independently of nnz.
_PATTERN_CHUNK_ELEMENTS = 1 << 20

_SPARSE_LAYOUTS = (torch.sparse_coo, torch.sparse_csr)


@contextlib.contextmanager
def _quiet_sparse():
    """Silence torch's warnings about its own sparse support ("sparse CSR tensor support is in beta
    state", "sparse invariant checks are implicitly disabled") around the sparse tensors built here
    for the user: they are about torch, not about the user's code. Constructors inside also pass
    ``check_invariants=False`` explicitly (the indices come from a valid matrix)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"(?i).*sparse.*(beta|invariant)")
        yield


def _torch_dtype_to_numpy(dtype: torch.dtype) -> np.dtype:
    return torch.empty((), dtype=dtype).numpy().dtype


class LinearOperator:
    """A linear map ``X -> A @ X`` given by a matvec closure written in differentiable torch ops.

    Args:
        matvec: ``matvec(X, *params) -> Y`` mapping a dense ``(n, m)`` tensor to ``(rows, m)``. It
            must accept any ``m >= 1`` (the solvers apply it to whole blocks) and be written in
            torch ops of ``params`` so that autograd reaches them.
        shape: ``(rows, n)``; the eigensolvers need ``rows == n``.
        params: tensors (or other objects) passed to ``matvec`` after ``X``. Gradients with respect
            to the operator are gradients with respect to these.
        dtype: the operator's dtype; default: that of the first floating tensor in ``params``, else
            inferred on first use from one probe product with a single zero column (tried in
            ``torch.get_default_dtype()``, then float64, float32, complex128, complex64: the first
            dtype the matvec accepts and returns unchanged). A ``ValueError`` asks for ``dtype=``
            when no probe succeeds.
        device: the operator's device; default: that of the first tensor in ``params``, else that of
            the probe's result (CPU unless the matvec moves it).
        symmetric: whether ``A == A^T`` (complex: Hermitian, ``A == A^H``). The eigensolvers refuse
            ``symmetric=False``.

    Example:
        >>> L = torch.randn(5, 2, requires_grad=True)
        >>> op = LinearOperator(lambda X, L: L @ (L.T @ X) + X, (5, 5), params=(L,))
        >>> (op @ torch.eye(5)).shape
        torch.Size([5, 5])
    """

    #: ``"operator"`` for a matvec closure, ``"dense"``, ``"sparse_coo"`` or ``"sparse_csr"`` for the
    #: wrappers :func:`as_operator` builds.
    kind: str = "operator"

    def __init__(
        self,
        matvec: Callable[..., torch.Tensor],
        shape: Sequence[int],
        params: Sequence[Any] = (),
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        symmetric: bool = True,
    ):
        if not callable(matvec):
            raise ValueError(f"LinearOperator: matvec must be callable, got {type(matvec).__name__}")
        shape = tuple(int(s) for s in shape)
        if len(shape) != 2 or min(shape) < 1:
            raise ValueError(f"LinearOperator: shape must be (rows, cols) with positive sizes, got {shape}")
        params = tuple(params)
        tensors = [p for p in params if isinstance(p, torch.Tensor)]
        if dtype is None:
            floating = [p.dtype for p in tensors if p.is_floating_point() or p.is_complex()]
            dtype = floating[0] if floating else None  # None: probed on first use
        if device is None and tensors:
            device = tensors[0].device
        self._matvec = matvec
        self._shape = shape
        self.params = params
        self._dtype = dtype
        self._device = None if device is None else torch.device(device)
        self.symmetric = bool(symmetric)

    # -- basic facts -------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        """``(rows, cols)`` of the operator."""
        return self._shape

    @property
    def dtype(self) -> torch.dtype:
        """The dtype products are computed in."""
        if self._dtype is None:
            self._probe()
        return self._dtype

    @property
    def device(self) -> torch.device:
        """The device products are computed on."""
        if self._device is None:
            if self._dtype is None:
                self._probe()
            else:
                self._device = torch.device("cpu")
        return self._device

    def _probe(self) -> None:
        """Infer the dtype (and device) from one product with a zero column, for an operator built
        without floating parameters or ``dtype=``."""
        device = self._device or torch.device("cpu")
        candidates = dict.fromkeys([torch.get_default_dtype(), torch.float64, torch.float32, torch.complex128,
                                    torch.complex64])
        failures = []
        for dtype in candidates:
            X = torch.zeros(self._shape[1], 1, dtype=dtype, device=device)
            try:
                with torch.no_grad():
                    Y = self._matvec(X, *self.params)
            except Exception as exc:  # noqa: BLE001 - any failure means "not this dtype"
                failures.append(f"{dtype}: {type(exc).__name__}: {exc}"[:200])
                continue
            if isinstance(Y, torch.Tensor) and Y.dtype == dtype and Y.shape == (self._shape[0], 1):
                self._dtype = dtype
                if self._device is None:
                    self._device = Y.device
                return
            got = f"{Y.dtype} {tuple(Y.shape)}" if isinstance(Y, torch.Tensor) else type(Y).__name__
            failures.append(f"{dtype}: returned {got}")
        raise ValueError(
            "LinearOperator: could not infer the dtype of the operator (it has no floating tensor in "
            "params and a probe product with a zero column failed: " + "; ".join(failures)
            + "); pass dtype= (and device=) explicitly"
        )

    def __repr__(self) -> str:
        # the stored facts (no probe product from a repr; None: not inferred yet)
        return (
            f"{type(self).__name__}(kind={self.kind!r}, shape={self.shape}, dtype={self._dtype}, "
            f"device={self._device})"
        )

    # -- products ----------------------------------------------------------------------------------
    def matmul(self, X: torch.Tensor) -> torch.Tensor:
        """Return ``A @ X`` for a dense ``(n, m)`` (or ``(n,)``) tensor ``X``.

        The product is taken with whatever grad mode is active: the solvers call it under
        ``torch.no_grad()``; generated backward code calls it with grad enabled to reach ``params``.
        """
        vector = X.dim() == 1
        if vector:
            X = X.unsqueeze(-1)
        if X.dim() != 2 or X.shape[0] != self._shape[1]:
            raise ValueError(f"{self!r}: cannot multiply a block of shape {tuple(X.shape)}")
        Y = self._apply(X)
        if not isinstance(Y, torch.Tensor) or Y.shape != (self._shape[0], X.shape[1]):
            got = tuple(Y.shape) if isinstance(Y, torch.Tensor) else type(Y).__name__
            raise ValueError(
                f"{self!r}: matvec returned {got} for an input of shape {tuple(X.shape)}, "
                f"expected {(self._shape[0], X.shape[1])}"
            )
        return Y.squeeze(-1) if vector else Y

    def __matmul__(self, X: torch.Tensor) -> torch.Tensor:
        return self.matmul(X)

    def _apply(self, X: torch.Tensor) -> torch.Tensor:
        return self._matvec(X, *self.params)

    # -- facts the solvers use ---------------------------------------------------------------------
    def diagonal(self) -> torch.Tensor | None:
        """The diagonal as a tensor, or ``None`` when it is not cheaply available (matvec closures)."""
        return None

    def is_finite(self) -> bool | None:
        """Whether all stored entries are finite; ``None`` when unknown (matvec closures)."""
        return None

    def is_symmetric(self, rtol: float = 1e-10) -> bool:
        """Whether the operator is symmetric (complex: Hermitian); for closures this is the
        ``symmetric`` flag."""
        return self.symmetric and self._shape[0] == self._shape[1]

    def to_dense(self) -> torch.Tensor:
        """The dense matrix ``A @ I`` (one product with the identity; for small operators only)."""
        eye = torch.eye(self._shape[1], dtype=self.dtype, device=self.device)
        return self.matmul(eye)

    def to_scipy(self):
        """The operator for :mod:`scipy.sparse.linalg` on the CPU.

        For a matvec closure this is a ``scipy.sparse.linalg.LinearOperator`` whose products move the
        block to ``self.device``, apply ``matvec`` under ``torch.no_grad()`` and move it back.
        """
        return _scipy_operator(self)


def _left_matmul(X: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """``matrix @ X``: the matvec of the dense and sparse wrappers (``params == (matrix,)``)."""
    return matrix @ X


class _DenseOperator(LinearOperator):
    """A dense ``(rows, cols)`` tensor as an operator."""

    kind = "dense"

    def __init__(self, matrix: torch.Tensor):
        self.matrix = matrix
        super().__init__(_left_matmul, matrix.shape, params=(matrix,), dtype=matrix.dtype, device=matrix.device)

    def diagonal(self) -> torch.Tensor:
        return torch.diagonal(self.matrix)

    def is_finite(self) -> bool:
        # max |a_ij| in one pass without an n x n temporary (NaN propagates through the max)
        return bool(torch.isfinite(torch.linalg.vector_norm(self.matrix.detach(), float("inf"))))

    def is_symmetric(self, rtol: float = 1e-10) -> bool:
        A = self.matrix.detach()
        if A.shape[0] != A.shape[1]:
            return False
        if torch.equal(A, A.mH):  # the common case, exactly symmetric (Hermitian): no temporaries
            return True
        scale = A.abs().max()
        return bool((A - A.mH).abs().max() <= rtol * scale)

    def to_dense(self) -> torch.Tensor:
        return self.matrix

    def to_scipy(self) -> np.ndarray:
        """The matrix as a numpy array (a copy when it is not on the CPU, or a conjugate view)."""
        return self.matrix.detach().cpu().resolve_conj().numpy()


def _sparse_rows_cols(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column index of every stored entry, in storage order (COO: as stored, even uncoalesced)."""
    if matrix.layout == torch.sparse_coo:
        indices = matrix._indices()
        return indices[0], indices[1]
    crow = matrix.crow_indices()
    rows = torch.repeat_interleave(
        torch.arange(matrix.shape[0], device=crow.device, dtype=crow.dtype), crow.diff()
    )
    return rows, matrix.col_indices()


def _sparse_values(matrix: torch.Tensor) -> torch.Tensor:
    """The stored values, for the facts the solvers read (no graph needed)."""
    if matrix.layout == torch.sparse_coo:
        return matrix._values()
    values = matrix.values()
    # torch 2.x cannot take .real, isfinite or resolve_conj of the complex values() view of a CSR
    # tensor ("Sparse CSR tensors do not have strides"); a detached alias of the same storage can
    return values.detach() if values.is_complex() else values


class _SparseOperator(LinearOperator):
    """A torch sparse COO or CSR matrix as an operator (``matmul`` is sparse @ dense)."""

    def __init__(self, matrix: torch.Tensor):
        if matrix.layout == torch.sparse_coo and not matrix.is_coalesced():
            matrix = matrix.coalesce()
        self.matrix = matrix
        self.kind = "sparse_coo" if matrix.layout == torch.sparse_coo else "sparse_csr"
        super().__init__(_left_matmul, matrix.shape, params=(matrix,), dtype=matrix.dtype, device=matrix.device)
        self._product_matrix = None  # CSR copy for products that need no graph (built on first use)

    def _apply(self, X: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (self.matrix.requires_grad or X.requires_grad):
            return self.matrix @ X  # differentiable product with the user's tensor
        # Products without a graph (the solvers' inner loops) use a CSR copy: torch's COO product is
        # ~4x slower than CSR, and on the CPU scipy's CSR kernel is ~2x faster than torch's
        # (measured: n = 90,000, 5 nnz/row, 8 columns, float64, 1 thread: 3.7 / 8.3 / 31 ms).
        if self._product_matrix is None:
            if self.device.type == "cpu":
                self._product_matrix = self.to_scipy()
            else:
                self._product_matrix = self.matrix.detach().to_sparse_csr()
        if self.device.type == "cpu":
            return torch.from_numpy(np.asarray(self._product_matrix @ X.detach().resolve_conj().numpy()))
        return self._product_matrix @ X

    def diagonal(self) -> torch.Tensor:
        rows, cols = _sparse_rows_cols(self.matrix)
        values = _sparse_values(self.matrix)
        on_diagonal = rows == cols
        diag = torch.zeros(min(self.shape), dtype=self.dtype, device=self.device)
        return diag.index_add(0, rows[on_diagonal], values[on_diagonal])

    def is_finite(self) -> bool:
        return bool(torch.isfinite(_sparse_values(self.matrix)).all())

    def is_symmetric(self, rtol: float = 1e-10) -> bool:
        if self.shape[0] != self.shape[1]:
            return False
        S = self.to_scipy()
        difference = S - (S.conj().T if np.iscomplexobj(S.data) else S.T)
        if difference.nnz == 0:
            return True
        scale = abs(S).max()
        return bool(abs(difference).max() <= rtol * scale)

    def to_dense(self) -> torch.Tensor:
        return self.matrix.to_dense()

    def to_scipy(self):
        """The matrix as a ``scipy.sparse.csr_matrix`` (CSR also for COO input: faster products)."""
        import scipy.sparse as sp

        rows, cols = _sparse_rows_cols(self.matrix)
        values = _sparse_values(self.matrix).detach().cpu().resolve_conj().numpy()
        return sp.csr_matrix(
            (values, (rows.cpu().numpy(), cols.cpu().numpy())), shape=self.shape
        )


def _scipy_operator(op: LinearOperator):
    """A ``scipy.sparse.linalg.LinearOperator`` applying the torch operator ``op`` (scipy imported lazily)."""
    import scipy.sparse.linalg as spla

    np_dtype = _torch_dtype_to_numpy(op.dtype)

    class _TorchBackedOperator(spla.LinearOperator):
        def __init__(self):
            super().__init__(dtype=np_dtype, shape=op.shape)

        def _matmat(self, X):
            Xt = torch.from_numpy(np.ascontiguousarray(X, dtype=np_dtype)).to(op.device)
            with torch.no_grad():
                return op.matmul(Xt).detach().cpu().resolve_conj().numpy()

        def _matvec(self, x):
            return self._matmat(np.asarray(x).reshape(-1, 1)).reshape(-1)

        def _adjoint(self):
            return self if op.symmetric else super()._adjoint()

    return _TorchBackedOperator()


def _from_scipy_operator(op) -> LinearOperator:
    np_dtype = np.dtype(op.dtype)
    dtype = torch.from_numpy(np.zeros(0, dtype=np_dtype)).dtype

    def matvec(X: torch.Tensor) -> torch.Tensor:
        Y = op.matmat(X.detach().cpu().resolve_conj().numpy())
        return torch.from_numpy(np.ascontiguousarray(Y)).to(X.device)

    return LinearOperator(matvec, op.shape, dtype=dtype)


def as_operator(A: Any) -> LinearOperator:
    """Wrap ``A`` as a :class:`LinearOperator`.

    Accepted: a :class:`LinearOperator` (returned unchanged); a dense 2-D torch tensor; a 2-D torch
    sparse tensor in COO (coalesced here if needed) or CSR layout without dense dimensions; a numpy
    array; a ``scipy.sparse`` matrix/array (converted to torch CSR); a
    ``scipy.sparse.linalg.LinearOperator`` (products go through numpy).

    Raises:
        ValueError: for anything else, for batched (more than 2-D) input, for other sparse layouts
            and for non-floating dtypes.
    """
    if isinstance(A, LinearOperator):
        return A
    if isinstance(A, np.ndarray):
        A = torch.from_numpy(A)
    elif not isinstance(A, torch.Tensor):
        try:
            import scipy.sparse as sp
            import scipy.sparse.linalg as spla
        except ImportError:  # pragma: no cover - scipy is a dependency
            sp = spla = None
        if sp is not None and sp.issparse(A):
            csr = sp.csr_matrix(A)
            csr.sort_indices()
            with _quiet_sparse():
                A = torch.sparse_csr_tensor(
                    torch.from_numpy(csr.indptr.astype(np.int64)),
                    torch.from_numpy(csr.indices.astype(np.int64)),
                    torch.from_numpy(csr.data),
                    size=csr.shape,
                    check_invariants=False,
                )
        elif spla is not None and isinstance(A, spla.LinearOperator):
            return _from_scipy_operator(A)
        else:
            raise ValueError(
                "as_operator: expected a torch tensor (dense, sparse COO or CSR), a numpy array, a "
                f"scipy sparse matrix or a LinearOperator, got {type(A).__name__}"
            )
    if not (A.is_floating_point() or A.is_complex()):
        raise ValueError(f"as_operator: expected a floating-point matrix, got dtype {A.dtype}")
    if A.layout == torch.strided:
        if A.dim() != 2:
            raise ValueError(
                f"as_operator: expected a 2-D matrix, got shape {tuple(A.shape)} "
                "(batched dense input goes to the *_batched functions)"
            )
        return _DenseOperator(A)
    if A.layout in _SPARSE_LAYOUTS:
        if A.dim() != 2 or (A.layout == torch.sparse_coo and A.dense_dim() != 0):
            raise ValueError(
                f"as_operator: expected a 2-D sparse matrix without dense dimensions, got shape {tuple(A.shape)}"
            )
        return _SparseOperator(A)
    raise ValueError(f"as_operator: sparse layout {A.layout} is not supported; use COO or CSR")


def sparse_lowrank_pattern_grad(A_sparse: torch.Tensor, L: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
    """The low-rank matrix ``L @ R.T`` restricted to the sparsity pattern of ``A_sparse``.

    This is the gradient with respect to the stored values of a sparse ``A`` when the dense
    cotangent is ``sum_r L[:, r] R[:, r]^T``: entry ``(i, j)`` stored in ``A`` gets
    ``sum_r L[i, r] * R[j, r]`` (no conjugation: for the complex cotangent ``L R^H`` pass
    ``R.conj()``). It costs ``O(nnz * r)`` time by gathering the rows of ``L`` and ``R``
    for the stored entries (processed in chunks, so temporary memory does not grow with nnz) and
    never forms an ``n x n`` matrix. It is plain torch code, differentiable with respect to ``L`` and
    ``R``.

    Args:
        A_sparse: a 2-D torch sparse tensor, COO or CSR, shape ``(m, n)``.
        L: ``(m, r)`` dense factor.
        R: ``(n, r)`` dense factor.

    Returns:
        A sparse tensor with the layout, indices and shape of ``A_sparse`` (for COO the stored
        indices are kept as they are, duplicates included, each duplicate getting the full value,
        which is the gradient with respect to each stored value) and values of dtype
        ``torch.result_type(L, R)``.
    """
    if not isinstance(A_sparse, torch.Tensor) or A_sparse.layout not in _SPARSE_LAYOUTS:
        raise ValueError("sparse_lowrank_pattern_grad: A_sparse must be a torch sparse COO or CSR tensor")
    if A_sparse.dim() != 2 or (A_sparse.layout == torch.sparse_coo and A_sparse.dense_dim() != 0):
        raise ValueError(
            f"sparse_lowrank_pattern_grad: A_sparse must be a 2-D sparse matrix, got shape {tuple(A_sparse.shape)}"
        )
    m, n = A_sparse.shape
    if L.dim() != 2 or R.dim() != 2 or L.shape[0] != m or R.shape[0] != n or L.shape[1] != R.shape[1]:
        raise ValueError(
            f"sparse_lowrank_pattern_grad: need L (m, r) and R (n, r) for A of shape {(m, n)}, "
            f"got L {tuple(L.shape)} and R {tuple(R.shape)}"
        )
    rows, cols = _sparse_rows_cols(A_sparse)
    rank = max(L.shape[1], 1)
    chunk = max(1, _PATTERN_CHUNK_ELEMENTS // rank)
    pieces = [
        (L[rows[start:start + chunk]] * R[cols[start:start + chunk]]).sum(-1)
        for start in range(0, rows.numel(), chunk)
    ]
    dtype = torch.result_type(L, R)
    values = torch.cat(pieces) if pieces else torch.zeros(0, dtype=dtype, device=L.device)
    with _quiet_sparse():
        if A_sparse.layout == torch.sparse_coo:
            return torch.sparse_coo_tensor(
                A_sparse._indices(), values, (m, n), is_coalesced=A_sparse.is_coalesced(), check_invariants=False
            )
        return torch.sparse_csr_tensor(A_sparse.crow_indices(), A_sparse.col_indices(), values, (m, n),
                                       check_invariants=False)

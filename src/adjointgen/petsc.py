"""Distributed sparse symmetric eigenproblems on SLEPc/PETSc, differentiable in torch.

``adjointgen.petsc.eigsh`` computes ``k`` eigenpairs of a sparse symmetric ``A`` (or of the
pencil ``(A, B)``, ``B`` symmetric positive definite) whose rows are distributed over MPI ranks,
with SLEPc's eigensolvers, and differentiates them with the generated NumPy rules of
``derivations/eigsh.py`` (``eigsh_vjp_factors``, its gauge residual) run on this rank's rows: a
product that contracts the distributed dimension (``V^T gV``) is summed over the ranks
(:class:`_Rows`), and the rules' projected shifted solve,

    (A - w_i B) z_i = (I - B U U^T) g_i,   U^T B z_i = 0,

run with PETSc KSP (MINRES) on the same distributed matrices, preconditioned by the forward's
shift-invert factorization where there was one.  The gradient of a stored entry ``(r, c)`` is
``sym(L U^T)_rc`` for low-rank factors ``L`` (``n x k``); the ghost rows it needs are scattered
like a matrix-vector product's.

The matrix is given as this rank's stored entries: a :class:`Pattern` (global row and column
indices of the entries of the rows this rank owns, PETSc's default row split, see
:func:`ownership`) and a torch tensor of their values, which may depend on torch parameters; the
gradient comes back to those values, and through autograd to the parameters, on every rank.

Semantics across ranks: the outputs are ``w`` (``(k,)``, the same on every rank) and this rank's
rows of ``V`` (``(n_local, k)``).  The loss differentiated is the **sum of the ranks' losses**; a
term computed from ``w`` on every rank counts once per rank.  Every rank must call ``backward``
through the outputs (the backward is collective: a rank whose loss does not use them must add
``0 * w.sum()``).  Errors (bad input on one rank, no convergence, a loss that depends on the
basis of a degenerate eigenspace) are raised on every rank with the same message.

Requires ``petsc4py``, ``slepc4py`` and ``mpi4py`` (real, double precision PETSc with MUMPS for
shift-invert and certification); see the README, "Distributed eigenproblems".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .runtime import degeneracy as _degeneracy
from .runtime import gauge as _gauge
from .runtime.errors import ConvergenceError

__all__ = ["Pattern", "eigsh", "ownership"]


def _libs():
    try:
        from mpi4py import MPI  # noqa: F401
        from petsc4py import PETSc
        from slepc4py import SLEPc
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise ImportError(
            "adjointgen.petsc needs petsc4py, slepc4py and mpi4py (a real, double-precision PETSc); "
            "see the README, 'Distributed eigenproblems', for the Debian packages and the environment "
            f"they need ({e})") from e
    return PETSc, SLEPc


def _comm(comm):
    PETSc, _ = _libs()
    return PETSc.COMM_WORLD if comm is None else comm


def ownership(n: int, comm=None) -> tuple[int, int]:
    """``(rstart, rend)``: the rows ``[rstart, rend)`` of an ``n``-row matrix this rank owns (PETSc's
    default split: the first ``n % size`` ranks one row more)."""
    comm = _comm(comm)
    size, rank = comm.getSize(), comm.getRank()
    base, extra = divmod(int(n), size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def _agree(mpi, message: str | None, kind=ValueError):
    """Raise ``kind`` on every rank when any rank has a ``message`` (the first one, naming its
    rank), so that no rank goes on into a collective call the others left."""
    messages = mpi.allgather(message)
    for rank, m in enumerate(messages):
        if m:
            raise kind(f"adjointgen.petsc (rank {rank}): {m}")


class Pattern:
    """The stored entries of this rank's rows of a distributed ``n x n`` sparse matrix.

    Args:
        rows, cols: global indices (integer arrays or tensors, one entry each); every row in
            ``ownership(n, comm)``, no ``(row, col)`` twice.  A symmetric matrix stores both
            ``(r, c)`` and ``(c, r)``.
        n: global size.
        comm: a ``petsc4py`` communicator (default ``PETSc.COMM_WORLD``).

    Raises ``ValueError`` on every rank when any rank's entries are out of range or repeated.
    """

    def __init__(self, rows, cols, n: int, comm=None):
        PETSc, _ = _libs()
        self.comm = _comm(comm)
        self.mpi = self.comm.tompi4py()
        self.n = int(n)
        self.rstart, self.rend = ownership(self.n, self.comm)
        rows = np.asarray(torch.as_tensor(rows).cpu(), dtype=np.int64).ravel()
        cols = np.asarray(torch.as_tensor(cols).cpu(), dtype=np.int64).ravel()
        problem = None
        if rows.shape != cols.shape:
            problem = f"rows and cols have {rows.size} and {cols.size} entries"
        elif rows.size and (rows.min() < self.rstart or rows.max() >= self.rend):
            problem = f"rows outside this rank's [{self.rstart}, {self.rend}) (see adjointgen.petsc.ownership)"
        elif cols.size and (cols.min() < 0 or cols.max() >= self.n):
            problem = f"columns outside [0, {self.n})"
        if problem is None:
            order = np.lexsort((cols, rows))
            r, c = rows[order], cols[order]
            if r.size > 1 and bool(np.any((r[1:] == r[:-1]) & (c[1:] == c[:-1]))):
                problem = "an entry (row, col) is given twice (sum the duplicates first)"
        _agree(self.mpi, problem)
        self.order = order
        self.nnz = rows.size
        nloc = self.rend - self.rstart
        self.local_rows = r - self.rstart
        self.indptr = np.zeros(nloc + 1, dtype=PETSc.IntType)
        np.add.at(self.indptr, self.local_rows + 1, 1)
        self.indptr = np.cumsum(self.indptr).astype(PETSc.IntType)
        self.indices = c.astype(PETSc.IntType)
        self.needed, self.col_index = np.unique(c, return_inverse=True)  # ghost rows a gradient reads
        self._scatter = None

    @property
    def local_size(self) -> int:
        return self.rend - self.rstart

    def matrix(self, values: np.ndarray):
        """The PETSc ``MPIAIJ`` matrix with these values (in the order the entries were given)."""
        PETSc, _ = _libs()
        data = np.ascontiguousarray(np.asarray(values, dtype=PETSc.ScalarType)[self.order])
        M = PETSc.Mat().createAIJ(size=((self.local_size, self.n), (self.local_size, self.n)),
                                  csr=(self.indptr, self.indices, data), comm=self.comm)
        M.assemble()
        return M

    def gather_rows(self, X: np.ndarray) -> np.ndarray:
        """``X`` (this rank's rows, ``(n_local, m)``) at the global rows :attr:`needed`
        (``(len(needed), m)``), one scatter per column."""
        PETSc, _ = _libs()
        if self._scatter is None:
            src = PETSc.Vec().createMPI((self.local_size, self.n), comm=self.comm)
            dst = PETSc.Vec().createSeq(len(self.needed), comm=PETSc.COMM_SELF)
            index = PETSc.IS().createGeneral(self.needed.astype(PETSc.IntType), comm=PETSc.COMM_SELF)
            self._scatter = (PETSc.Scatter().create(src, index, dst, None), src, dst)
        scatter, src, dst = self._scatter
        out = np.empty((len(self.needed), X.shape[1]))
        for j in range(X.shape[1]):
            src.getArray()[:] = X[:, j]
            scatter.scatter(src, dst, addv=PETSc.InsertMode.INSERT_VALUES, mode=PETSc.ScatterMode.FORWARD)
            out[:, j] = dst.getArray()
        return out

    def entry_gradient(self, L: np.ndarray, U: np.ndarray) -> np.ndarray:
        """``sym(L U^T)`` at the stored entries, in the order they were given (``L``, ``U``: this
        rank's rows)."""
        ghosts = self.gather_rows(np.concatenate([L, U], axis=1))
        k = U.shape[1]
        Lc, Uc = ghosts[self.col_index, :k], ghosts[self.col_index, k:]
        Lr, Ur = L[self.local_rows], U[self.local_rows]
        sorted_grad = 0.5 * ((Lr * Uc).sum(1) + (Lc * Ur).sum(1))
        out = np.empty_like(sorted_grad)
        out[self.order] = sorted_grad
        return out


@dataclass
class _Config:
    pattern: Pattern
    k: int
    largest: bool
    sigma: float | None
    tol: float
    maxiter: int | None
    eps_type: str | None
    options: dict
    certify: bool
    backward_rtol: float


def _apply(mat, X: np.ndarray) -> np.ndarray:
    """``mat @ X`` for this rank's rows ``X`` (``(n_local, m)``)."""
    x, y = mat.createVecs()
    out = np.empty_like(X)
    for j in range(X.shape[1]):
        x.getArray()[:] = X[:, j]
        mat.mult(x, y)
        out[:, j] = y.getArray()
    return out


class _Forward:
    """What the backward needs from the forward."""

    def __init__(self, cfg, A, B, eps, U, BU, w, w_next):
        self.cfg, self.A, self.B, self.eps, self.U, self.BU, self.w, self.w_next = cfg, A, B, eps, U, BU, w, w_next


def _solve(cfg: _Config, A, B):
    PETSc, SLEPc = _libs()
    mpi = cfg.pattern.mpi
    n, k = cfg.pattern.n, cfg.k
    nev = min(k + 1, n)  # one more: the gap to the first discarded pair (a cut cluster), the certificate
    eps = SLEPc.EPS().create(cfg.pattern.comm)
    eps.setOperators(A, B)
    eps.setProblemType(SLEPc.EPS.ProblemType.GHEP if B is not None else SLEPc.EPS.ProblemType.HEP)
    eps.setDimensions(nev, PETSc.DECIDE, PETSc.DECIDE)
    if cfg.eps_type is not None:
        eps.setType(cfg.eps_type)
    prefix = f"adjointgen_{id(eps)}_"
    eps.setOptionsPrefix(prefix)
    if cfg.sigma is not None:
        eps.setTarget(float(cfg.sigma))
        eps.setWhichEigenpairs(SLEPc.EPS.Which.TARGET_REAL)
        st = eps.getST()
        st.setType(SLEPc.ST.Type.SINVERT)
        ksp = st.getKSP()
        ksp.setType(PETSc.KSP.Type.PREONLY)
        pc = ksp.getPC()
        pc.setType(PETSc.PC.Type.CHOLESKY if cfg.pattern.comm.getSize() == 1 else PETSc.PC.Type.LU)
        pc.setFactorSolverType("mumps")
    else:
        eps.setWhichEigenpairs(SLEPc.EPS.Which.LARGEST_REAL if cfg.largest else SLEPc.EPS.Which.SMALLEST_REAL)
    eps.setTolerances(cfg.tol, cfg.maxiter if cfg.maxiter is not None else PETSc.DEFAULT)
    opts = PETSc.Options()
    for key, value in cfg.options.items():
        opts.setValue(prefix + key.lstrip("-"), value)
    eps.setFromOptions()
    eps.solve()
    nconv = eps.getConverged()
    if nconv < k:
        errors = [eps.computeError(i) for i in range(nconv)]
        raise ConvergenceError(
            f"adjointgen.petsc.eigsh: SLEPc ({eps.getType()}) converged {nconv} of the {k} pairs asked for "
            f"(reason {eps.getConvergedReason()}); raise maxiter, or use sigma= (shift-invert)",
            method=f"slepc-{eps.getType()}", residual=max(errors, default=math.inf), tol=cfg.tol,
            iterations=eps.getIterationNumber())
    values = np.array([eps.getEigenvalue(i).real for i in range(nconv)])
    if cfg.sigma is not None:
        keep = np.argsort(np.abs(values - cfg.sigma), kind="stable")[:nev]
        keep = keep[np.argsort(values[keep], kind="stable")]
    else:
        keep = np.argsort(-values if cfg.largest else values, kind="stable")[:nev]
    # the explicit backward error ||A x - w B x|| / ((||A|| + |w| ||B||) ||x||) of the returned pairs
    residual = max(eps.computeError(int(i), SLEPc.EPS.ErrorType.BACKWARD) for i in keep[:k])
    if not residual <= 10 * cfg.tol:
        raise ConvergenceError("adjointgen.petsc.eigsh: a returned pair's backward error is above 10 tol", method=f"slepc-{eps.getType()}", residual=residual, tol=cfg.tol,
                               iterations=eps.getIterationNumber())
    vr = A.createVecRight()
    U = np.empty((cfg.pattern.local_size, k))
    for j, i in enumerate(keep[:k]):
        eps.getEigenvector(int(i), vr)
        U[:, j] = vr.getArray()
    w = values[keep[:k]]
    w_next = values[keep[k]] if len(keep) > k else None
    # B-orthonormal to rounding (close pairs come out orthogonal only to the solver's tolerance),
    # and a deterministic sign: the projection on a fixed vector of the global indices positive
    BU = U if B is None else _apply(B, U)
    G = mpi.allreduce(U.T @ BU)
    C = np.linalg.cholesky(0.5 * (G + G.T))
    U = np.linalg.solve(C, U.T).T
    BU = np.linalg.solve(C, BU.T).T
    rows = np.arange(cfg.pattern.rstart, cfg.pattern.rend)
    sign = np.sign(mpi.allreduce(np.sin(0.7 * rows + 0.1) @ U))
    sign[sign == 0] = 1
    U, BU = U * sign, BU * sign
    if cfg.certify:
        _certify(cfg, A, B, w, w_next)
    return _Forward(cfg, A, B, eps, U, BU, w, w_next)


def _certify(cfg, A, B, w, w_next):
    """The inertia of ``A - τ B`` at ``τ`` in the gap after the kept eigenvalues (before a cluster
    that ``k`` cuts, whose kept members the backward refuses anyway) counts the eigenvalues on the
    kept side: it must be the number of kept ones (MUMPS' LDL^T).  A Krylov solver started from one
    vector can return one copy of a repeated eigenvalue and go on to the next: this catches it."""
    PETSc, _ = _libs()
    if w_next is None:
        return
    values = np.append(w, w_next)
    close = _degeneracy.cluster_mask(torch.from_numpy(values))[-1, :-1].numpy()
    count = int(np.argmax(close)) if close.any() else cfg.k  # the kept values before a cut cluster
    if count == 0:
        return
    order = values if not cfg.largest else values[::-1]
    lo, hi = (w[count - 1], values[count]) if not close.any() else (w[count - 1], w[count])
    tau = 0.5 * (lo + hi)
    K = A.copy()
    if B is not None:
        K.axpy(-tau, B)
    else:
        K.shift(-tau)
    ksp = PETSc.KSP().create(cfg.pattern.comm)
    ksp.setOperators(K)
    ksp.setType(PETSc.KSP.Type.PREONLY)
    pc = ksp.getPC()
    pc.setType(PETSc.PC.Type.CHOLESKY)
    pc.setFactorSolverType("mumps")
    pc.setFactorSetUpSolverType()
    F = pc.getFactorMatrix()
    F.setMumpsIcntl(13, 1)  # inertia in parallel
    F.setMumpsIcntl(24, 1)  # null pivots detected (and counted as zero eigenvalues)
    ksp.setUp()
    negative, zero, positive = pc.getFactorMatrix().getInertia()
    del order
    kept_side = positive if cfg.largest else negative
    if kept_side != count or zero:
        raise ConvergenceError(
            f"adjointgen.petsc.eigsh: not certified: A - tau B at tau = {tau:.6g} has {kept_side} eigenvalues on "
            f"the kept side ({zero} zero), SLEPc returned {count} there: it skipped an eigenvalue (a repeated "
            f"one, typically).  Use sigma= (shift-invert), a block solver (eps_type='lobpcg' with "
            f"options={{'eps_lobpcg_blocksize': ...}}) or a larger subspace (options={{'eps_ncv': ...}})",
            method="inertia", residual=math.inf, tol=cfg.tol, iterations=0)


def _shifted_solves(fw: _Forward, R: np.ndarray) -> np.ndarray:
    """``Z`` with ``(A - w_i B) z_i = r_i`` on ``U^T B z = 0`` (``r_i`` projected, ``U^T r_i = 0``),
    by MINRES on ``Q^T (A - w_i B) Q`` (``Q = I - U U^T B``), preconditioned by ``Q K^{-1} Q^T``
    with the forward's shift-invert factorization ``K = A - σB`` where ``σ`` lies below (above,
    for the largest) the kept eigenvalues."""
    PETSc, _ = _libs()
    cfg, A, B, U, BU = fw.cfg, fw.A, fw.B, fw.U, fw.BU
    mpi = cfg.pattern.mpi
    work = A.createVecLeft()

    def project_domain(x):  # Q x = x - U (BU^T x): one reduction for the k products
        a = x.getArray()
        a -= U @ mpi.allreduce(BU.T @ a)

    def project_range(y):  # Q^T y = y - BU (U^T y)
        a = y.getArray()
        a -= BU @ mpi.allreduce(U.T @ a)

    class Shifted:
        def __init__(self, shift):
            self.shift = shift

        def mult(self, mat, x, y):
            work.setArray(x.getArray())
            project_domain(work)
            A.mult(work, y)
            if B is not None:
                tmp = y.duplicate()
                B.mult(work, tmp)
                y.axpy(-self.shift, tmp)
            else:
                y.axpy(-self.shift, work)
            project_range(y)

    factored = None
    if cfg.sigma is not None and (cfg.sigma > fw.w.max() if cfg.largest else cfg.sigma < fw.w.min()):
        factored = fw.eps.getST().getKSP()
        sign = -1.0 if cfg.largest else 1.0

    class Factored:
        def apply(self, pc, x, y):
            r = x.copy()
            project_range(r)
            factored.solve(r, y)
            y.scale(sign)
            project_domain(y)

    nloc, n = cfg.pattern.local_size, cfg.pattern.n
    Z = np.zeros_like(R)
    norms = np.sqrt(mpi.allreduce((R * R).sum(0)))
    worst, iterations = 0.0, 0
    for i in range(R.shape[1]):
        if norms[i] == 0:
            continue
        op = PETSc.Mat().createPython(((nloc, n), (nloc, n)), Shifted(fw.w[i]), comm=cfg.pattern.comm)
        op.setUp()
        ksp = PETSc.KSP().create(cfg.pattern.comm)
        ksp.setOperators(op)
        ksp.setType(PETSc.KSP.Type.MINRES)
        ksp.setTolerances(rtol=cfg.backward_rtol, atol=0.0, max_it=min(max(10 * n, 200), 20000))
        pc = ksp.getPC()
        if factored is not None:
            pc.setType(PETSc.PC.Type.PYTHON)
            pc.setPythonContext(Factored())
        else:
            pc.setType(PETSc.PC.Type.NONE)
        b, x = op.createVecs()
        b.getArray()[:] = R[:, i]
        x.set(0.0)
        ksp.solve(b, x)
        iterations += ksp.getIterationNumber()
        project_domain(x)
        check = b.duplicate()
        op.mult(x, check)
        check.axpy(-1.0, b)
        worst = max(worst, check.norm() / norms[i])
        Z[:, i] = x.getArray()
    if not worst <= 100 * cfg.backward_rtol:
        raise ConvergenceError("adjointgen.petsc.eigsh: a backward shifted solve did not reach its tolerance "
                               "(a discarded eigenvalue equal to a kept one makes it singular: certify=True "
                               "checks that none was skipped)",
                               method="petsc-minres", residual=worst, tol=cfg.backward_rtol, iterations=iterations)
    return Z


class _Rows(np.ndarray):
    """This rank's rows of a matrix distributed by rows (``transposed``: of its transpose), for the
    generated NumPy rules: a ``matmul`` that contracts the distributed dimension (``V^T gV``) is
    summed over the ranks and replicated; other products and elementwise operations stay local."""

    def __new__(cls, array, mpi, transposed=False):
        out = np.asarray(array).view(cls)
        out.mpi, out.transposed = mpi, transposed
        return out

    def __array_finalize__(self, obj):
        self.mpi = getattr(obj, "mpi", None)
        self.transposed = getattr(obj, "transposed", False)

    def swapaxes(self, a, b):
        return _Rows(np.asarray(self).swapaxes(a, b), self.mpi, not self.transposed)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        tagged = [x for x in inputs if isinstance(x, _Rows)]
        plain = [np.asarray(x) if isinstance(x, _Rows) else x for x in inputs]
        result = getattr(ufunc, method)(*plain, **kwargs)
        if ufunc is np.matmul and method == "__call__":
            a, b = inputs
            kind = (None if not isinstance(a, _Rows) else a.transposed, None if not isinstance(b, _Rows) else b.transposed)
            if kind == (True, False):
                return self.mpi.allreduce(result)  # (V^T gV): summed over the ranks
            if kind == (False, None):  # rows @ (k x m): local rows
                return _Rows(result, self.mpi)
            if kind == (None, True):  # (m x k) @ rows^T
                return _Rows(result, self.mpi, True)
            raise ValueError("adjointgen.petsc: a product that mixes distributed and local dimensions")
        return _Rows(result, self.mpi, tagged[0].transposed) if np.ndim(result) else result


class _Operator:
    """``A`` (and ``B``) of a distributed problem for the generated rules: it solves the rules'
    projected shifted systems on PETSc (:func:`adjointgen.runtime.xp.shifted_solve` defers to it)."""

    def __init__(self, fw: _Forward):
        self.fw = fw

    def projected_shifted_solve(self, B, U, w, X):
        """``S(X)``: ``(A - w_i B) s_i = Q^T x_i`` on ``U^T B s_i = 0`` (``Q^T = I - B U U^T``)."""
        fw = self.fw
        mpi = fw.cfg.pattern.mpi
        X = np.asarray(X)
        R = X - fw.BU @ mpi.allreduce(fw.U.T @ X)
        R = R - fw.BU @ mpi.allreduce(fw.U.T @ R)  # twice (rounding along U no solve can match)
        return _Rows(_shifted_solves(fw, R), mpi)


def _backward(fw: _Forward, gw: np.ndarray, gU: np.ndarray):
    """``(L_A, L_B)`` with ``gA = sym(L_A U^T)`` (``gB`` likewise): the generated rules'
    ``vjp_factors`` (``derivations/eigsh.py``), whose right factors are ``U``, after the checks."""
    from .generated.cupy import eigsh as rules
    from .generated.cupy import eigsh_generalized as rules_generalized

    cfg, w = fw.cfg, fw.w
    mpi = cfg.pattern.mpi
    k = cfg.k
    gw = mpi.allreduce(gw)  # the sum of the ranks' losses
    U, gV = _Rows(fw.U, mpi), _Rows(gU, mpi)
    if _gauge.enabled():
        colnorms = np.sqrt(mpi.allreduce((gU * gU).sum(0)))
        if fw.w_next is not None:
            values = torch.from_numpy(np.append(w, fw.w_next))
            close = _degeneracy.cluster_mask(values)[-1, :-1]
            split = tuple(int(i) for i in torch.nonzero(close).flatten())
            if split:
                _degeneracy.check_cut("adjointgen.petsc.eigsh", k, cfg.largest, values[:k], split,
                                      (torch.from_numpy(gw), torch.from_numpy(colnorms)))
        residual = (rules_generalized.eigsh_generalized_gauge_clusters if fw.B is not None
                    else rules.eigsh_gauge_clusters)(w, U, gV)
        wt = torch.from_numpy(w)
        _degeneracy.check("adjointgen.petsc.eigsh", torch.from_numpy(np.asarray(residual)),
                          _degeneracy.cluster_mask(wt), torch.from_numpy(gw),
                          torch.from_numpy(colnorms).reshape(1, k), values=wt)
    A = _Operator(fw)
    if fw.B is None:
        L_A, _ = rules.eigsh_vjp_factors(A, w, U, gw, gV)
        return np.asarray(L_A), None
    L_A, _, L_B, _ = rules_generalized.eigsh_generalized_vjp_factors(A, A, w, U, gw, gV)
    return np.asarray(L_A), np.asarray(L_B)


class _EigshFunction(torch.autograd.Function):
    @staticmethod
    def forward(values_A, values_B, cfg):
        mpi = cfg.pattern.mpi
        problem = None
        for name, v in (("A", values_A), ("B", values_B)):
            if v is None:
                continue
            if v.dtype != torch.float64 or v.dim() != 1 or v.shape[0] != cfg.pattern.nnz:
                problem = f"values of {name} must be float64 of shape ({cfg.pattern.nnz},), got {v.dtype} {tuple(v.shape)}"
            elif not bool(torch.isfinite(v).all()):
                problem = f"values of {name} contain NaN or Inf"
        _agree(mpi, problem)
        A = cfg.pattern.matrix(values_A.detach().cpu().numpy())
        B = None if values_B is None else cfg.pattern.matrix(values_B.detach().cpu().numpy())
        if not A.isSymmetric(1e-12 * max(A.norm(), 1e-300)):
            raise ValueError("adjointgen.petsc (every rank): A is not symmetric")
        if B is not None and not B.isSymmetric(1e-12 * max(B.norm(), 1e-300)):
            raise ValueError("adjointgen.petsc (every rank): B is not symmetric")
        fw = _solve(cfg, A, B)
        w = torch.from_numpy(fw.w.copy())
        V = torch.from_numpy(fw.U.copy())
        return w, V, fw

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.fw = output[2]
        ctx.has_B = inputs[1] is not None

    @staticmethod
    def backward(ctx, gw, gV, _gfw=None):
        fw = ctx.fw
        k = fw.cfg.k
        gw = np.zeros(k) if gw is None else gw.detach().cpu().numpy().astype(np.float64)
        gV = np.zeros_like(fw.U) if gV is None else gV.detach().cpu().numpy().astype(np.float64)
        L_A, L_B = _backward(fw, gw, gV)
        pattern = fw.cfg.pattern
        gA = torch.from_numpy(pattern.entry_gradient(L_A, fw.U))
        gB = torch.from_numpy(pattern.entry_gradient(L_B, fw.U)) if ctx.has_B else None
        return gA, gB, None


def eigsh(values_A: torch.Tensor, pattern: Pattern, k: int, values_B: torch.Tensor | None = None, *,
          largest: bool = False, sigma: float | None = None, tol: float = 1e-10, maxiter: int | None = None,
          eps_type: str | None = None, options: dict | None = None, certify: bool = True,
          backward_rtol: float = 1e-12):
    """``k`` eigenpairs of the distributed sparse symmetric ``A`` (``A v = w B v``), differentiable.

    Args:
        values_A: ``(nnz_local,)`` float64 values of this rank's stored entries of ``A``, in the
            order of ``pattern`` (may require grad).
        pattern: the stored entries (:class:`Pattern`), shared by ``A`` and ``B``.
        k: number of pairs.
        values_B: the values of a symmetric positive definite ``B`` on the same pattern, or ``None``.
        largest: the ``k`` largest eigenvalues (descending order is not used: the values come
            ascending either way); else the smallest.
        sigma: shift-invert about ``sigma`` (SLEPc's ``sinvert`` with a MUMPS factorization): the
            ``k`` eigenvalues closest to it.  Much faster for the smallest eigenvalues of a
            Laplacian (``sigma=0``); the factorization then preconditions the backward solves.
        tol: SLEPc's relative tolerance; a returned pair whose explicit backward error
            ``||A v - w B v|| / ((||A|| + |w| ||B||) ||v||)`` is above ``10 * tol`` raises.
        maxiter: SLEPc's iteration cap.
        eps_type: SLEPc's solver (``"krylovschur"`` default, ``"lobpcg"``, ``"jd"``, ...).
        options: more SLEPc/PETSc options for this solve, e.g. ``{"eps_ncv": 40}`` (applied under a
            private prefix).
        certify: count the eigenvalues on the kept side of the gap by the inertia of ``A - τ B``
            (one MUMPS LDL^T factorization) and raise unless SLEPc returned all of them (default;
            ``False`` saves the factorization where it is too expensive, at the risk of a skipped
            repeated eigenvalue).
        backward_rtol: relative tolerance of the backward's MINRES solves.

    Returns:
        ``(w, V)``: the ``k`` eigenvalues, ascending (``(k,)``, the same on every rank), and this
        rank's rows of the ``B``-orthonormal eigenvectors (``(n_local, k)``).

    Raises (on every rank, with the same message):
        ValueError: bad values (shape, dtype, NaN) on any rank, a non-symmetric matrix.
        adjointgen.ConvergenceError: SLEPc or a backward solve did not converge, or ``certify``
            found a skipped eigenvalue.
        adjointgen.GaugeDependentLossError: (backward) the loss depends on the basis of a
            degenerate eigenspace, on its individual eigenvalues, or on pairs ``k`` cuts out of a
            cluster.
    """
    if not 1 <= int(k) <= pattern.n:
        raise ValueError(f"adjointgen.petsc.eigsh: k must be in [1, {pattern.n}], got {k}")
    cfg = _Config(pattern, int(k), bool(largest), sigma, float(tol), maxiter, eps_type, dict(options or {}),
                  bool(certify), float(backward_rtol))
    w, V, _ = _EigshFunction.apply(values_A, values_B, cfg)
    return w, V

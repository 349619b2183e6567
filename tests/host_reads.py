"""A test-only counter of the reads of device values on the host: ``aten._local_scalar_dense``
(``item``, ``bool``, ``float``, ``int``) through a dispatch mode, and calls of ``Tensor.tolist``,
``Tensor.numpy`` and ``Tensor.cpu``.  On a GPU each is a synchronisation; on the CPU they are counted
alike, so the suite can hold the count against torch's without a GPU."""
from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class _Scalars(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.n += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def counting():
    """``with counting() as reads: ...``; afterwards ``reads`` maps each kind to its count."""
    counts = {"tolist": 0, "numpy": 0, "cpu": 0}
    saved = {name: getattr(torch.Tensor, name) for name in counts}
    for name, orig in saved.items():
        def wrapped(self, *a, _orig=orig, _name=name, **k):
            counts[_name] += 1
            return _orig(self, *a, **k)
        setattr(torch.Tensor, name, wrapped)
    mode = _Scalars()
    try:
        with mode:
            yield counts
    finally:
        for name, orig in saved.items():
            setattr(torch.Tensor, name, orig)
        counts["scalar"] = mode.n


def cases(n: int, dtype=torch.float64):
    """name -> (function of a namespace, input, loss): forward + backward of each dense operation."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, n, dtype=dtype, generator=g)
    S = X @ X.mT + n * torch.eye(n, dtype=dtype)
    return {
        "eigh": (lambda f: f.eigh, S, lambda o: o[0].sum() + (o[1] ** 2).sum()),
        "svd": (lambda f: (lambda a: f.svd(a, full_matrices=False)), X, lambda o: o[1].sum() + (o[0] ** 2).sum()),
        "cholesky": (lambda f: f.cholesky, S, lambda o: o.sum()),
        "qr": (lambda f: f.qr, X, lambda o: o[0].sum() + o[1].sum()),
        "inv": (lambda f: f.inv, S, lambda o: o.sum()),
        "solve": (lambda f: (lambda a: f.solve(a, a[:, :2])), S, lambda o: o.sum()),
        "det": (lambda f: f.det, S, lambda o: o),
        "slogdet": (lambda f: f.slogdet, S, lambda o: o[1]),
        "lu": (lambda f: f.lu, X, lambda o: o[1].sum() + o[2].sum()),
        "matrix_exp": (lambda f: f.matrix_exp, X, lambda o: o.sum()),
    }


def step(fn, A, loss):
    """One forward + backward from a fresh leaf."""
    A = A.clone().requires_grad_()
    loss(fn(A)).backward()
    return A.grad

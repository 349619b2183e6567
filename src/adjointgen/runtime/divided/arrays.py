"""The array operations the divided-difference evaluator needs, for torch, NumPy, CuPy and JAX.

One small adapter per array module, so that :mod:`adjointgen.runtime.divided.primitives` is written
once.  Special functions come from ``torch.special`` (torch), SciPy (NumPy) and ``cupyx.scipy``
(CuPy).
"""
from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["Arrays", "for_array"]


class Arrays:
    """Elementwise operations of one array module (``self.m``), with the dtype's constants."""

    name = "numpy"

    def __init__(self, module, special):
        self.m, self.sp = module, special

    # ---------------------------------------------------------------- constants of a dtype
    def eps(self, x) -> float:
        return float(np.finfo(self.dtype_of(x)).eps)

    def tiny(self, x) -> float:
        return float(np.finfo(self.dtype_of(x)).tiny)

    def log_max(self, x) -> float:
        """``log`` of the largest finite number of ``x``'s dtype (exp overflows beyond)."""
        return math.log(float(np.finfo(self.dtype_of(x)).max))

    def dtype_of(self, x):
        return x.dtype

    def concrete(self, x) -> bool:
        """Whether ``x`` has values to read on the host (not a tracer of a compiler)."""
        return True

    # ---------------------------------------------------------------- basics
    def where(self, c, a, b):
        return self.m.where(c, a, b)

    def minimum(self, a, b):
        return self.m.minimum(a, b)

    def maximum(self, a, b):
        return self.m.maximum(a, b)

    def abs(self, x):
        return self.m.abs(x)

    def sign(self, x):
        return self.m.sign(x)

    def isfinite(self, x):
        return self.m.isfinite(x)

    def isnan(self, x):
        return self.m.isnan(x)

    def any(self, x) -> bool:
        return bool(self.m.any(x))

    def max(self, x):
        return self.m.max(x) if getattr(x, "size", 1) else -math.inf

    def full_like(self, x, value):
        return self.m.full_like(x, value)

    def like(self, value, ref):
        """``value`` (a number or array) as an array of ``ref``'s dtype broadcast to its shape."""
        return self.m.zeros_like(ref) + value

    def exponent(self, x):
        """The binary exponent ``e`` of ``|x|``, ``|x| = f 2^e`` with ``f`` in [0.5, 1) (0 for 0)."""
        return np.frexp(x)[1]

    def ldexp(self, x, e):
        return np.ldexp(x, e)

    def exp2(self, x):
        return self.m.exp2(x)

    def log2(self, x):
        return self.m.log2(x)

    def hypot(self, a, b):
        return self.m.hypot(a, b)

    def floor(self, x):
        return self.m.floor(x)

    def ceil(self, x):
        return self.m.ceil(x)

    def logical_and(self, a, b):
        return self.m.logical_and(a, b)

    def logical_or(self, a, b):
        return self.m.logical_or(a, b)

    def logical_not(self, a):
        return self.m.logical_not(a)

    def errstate(self):
        return np.errstate(all="ignore")

    # ---------------------------------------------------------------- elementary and special functions
    def __getattr__(self, name):  # exp, log, log1p, expm1, sqrt, sin, ..., atanh: the module's own
        return getattr(self.m, _ALIASES.get(name, name))

    def erf(self, x):
        return self.sp.erf(x)

    def erfc(self, x):
        return self.sp.erfc(x)

    def lgamma(self, x):
        return self.sp.gammaln(x)

    def polygamma(self, n, x):
        return self.sp.polygamma(n, x)

    def j0(self, x):
        return self.sp.j0(x)

    def j1(self, x):
        return self.sp.j1(x)


_ALIASES = {"atan": "arctan", "asin": "arcsin", "acos": "arccos", "asinh": "arcsinh", "acosh": "arccosh",
            "atanh": "arctanh"}


class TorchArrays(Arrays):
    name = "torch"

    def __init__(self):
        import torch

        super().__init__(torch, torch.special)

    def concrete(self, x) -> bool:
        """Not traced by a compiler, ``make_fx`` (``torch.func.linearize``) or ``vmap``."""
        import torch

        from ..checks import is_traced

        return not (isinstance(x, torch.Tensor) and is_traced(x))

    def dtype_of(self, x):
        import torch

        return {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
                torch.bfloat16: np.float32}.get(x.dtype, np.float64)

    def where(self, c, a, b):
        return self.m.where(c, a, b)

    def minimum(self, a, b):
        return self.m.minimum(self._t(a, b), self._t(b, a))

    def maximum(self, a, b):
        return self.m.maximum(self._t(a, b), self._t(b, a))

    def _t(self, a, ref):
        return a if isinstance(a, self.m.Tensor) else self.m.as_tensor(a, dtype=ref.dtype, device=ref.device)

    def any(self, x) -> bool:
        return bool(x.any()) if isinstance(x, self.m.Tensor) else bool(x)

    def max(self, x):
        return x.max() if x.numel() else -math.inf

    def exponent(self, x):
        return self.m.frexp(x)[1]

    def ldexp(self, x, e):
        return self.m.ldexp(x, e.to(x.dtype) if isinstance(e, self.m.Tensor) else e)

    def hypot(self, a, b):
        return self.m.hypot(self._t(a, b), self._t(b, a))

    def logical_and(self, a, b):
        return self.m.logical_and(a, b)

    def logical_or(self, a, b):
        return self.m.logical_or(a, b)

    def logical_not(self, a):
        return self.m.logical_not(a)

    def errstate(self):
        import contextlib

        return contextlib.nullcontext()

    def __getattr__(self, name):
        return getattr(self.m, name)

    def erf(self, x):
        return self.sp.erf(x)

    def erfc(self, x):
        return self.sp.erfc(x)

    def lgamma(self, x):
        return self.m.lgamma(x)

    # torch's Bessel functions and polygamma are accurate to about 1e-7 and 1e-9 (torch 2.13):
    # SciPy's, on the host (a transfer on GPUs)
    def polygamma(self, n, x):
        return self._scipy(lambda v: _scipy_special().polygamma(int(n), v), x)

    def j0(self, x):
        return self._scipy(_scipy_special().j0, x)

    def j1(self, x):
        return self._scipy(_scipy_special().j1, x)

    def _scipy(self, fn, x):
        out = fn(x.detach().cpu().numpy())
        return self.m.as_tensor(out, dtype=x.dtype, device=x.device)


def _scipy_special():
    import scipy.special

    return scipy.special


class JaxArrays(Arrays):
    """``jax.numpy`` and ``jax.scipy.special``.  Under a transform the values cannot be read: the
    host decisions (whether any element needs a series branch, whether an exponential can
    overflow) take the branch that is right for every element, and nothing is recorded."""

    name = "jax"

    def __init__(self):
        import jax.numpy as jnp
        import jax.scipy.special as special

        super().__init__(jnp, special)

    def concrete(self, x) -> bool:
        import jax

        return not isinstance(x, jax.core.Tracer)

    def any(self, x) -> bool:
        return bool(self.m.any(x)) if self.concrete(x) else True

    def max(self, x):
        if not getattr(x, "size", 1):
            return -math.inf
        return self.m.max(x) if self.concrete(x) else math.inf

    def exponent(self, x):
        return self.m.frexp(x)[1]

    def ldexp(self, x, e):
        return self.m.ldexp(x, e)

    def errstate(self):
        import contextlib

        return contextlib.nullcontext()

    def lgamma(self, x):
        return self.sp.gammaln(x)

    def polygamma(self, n, x):
        return self.sp.polygamma(int(n), x)

    def j0(self, x):
        return self.sp.bessel_jn(x, v=0)[0]

    def j1(self, x):
        return self.sp.bessel_jn(x, v=1)[1]


@functools.lru_cache(maxsize=None)
def _jax():
    return JaxArrays()


@functools.lru_cache(maxsize=None)
def _numpy():
    import scipy.special

    return Arrays(np, scipy.special)


@functools.lru_cache(maxsize=None)
def _torch():
    return TorchArrays()


@functools.lru_cache(maxsize=None)
def _cupy():
    import cupy
    import cupyx.scipy.special

    adapter = Arrays(cupy, cupyx.scipy.special)
    adapter.name = "cupy"
    return adapter


def for_array(x) -> Arrays:
    """The adapter of ``x``'s array module (torch tensors, CuPy arrays, else NumPy)."""
    module = type(x).__module__
    if module.startswith("torch"):
        return _torch()
    if module.startswith("cupy"):
        return _cupy()
    if module.startswith(("jax", "jaxlib")):
        return _jax()
    return _numpy()

"""The generated NumPy/CuPy rule functions in one namespace: ``import adjointgen.cupy as agc``.

``agc.<op>_jvp(...)``, ``agc.<op>_vjp(...)`` (and, where an operation has them,
``<op>_vjp_factors``, ``<op>_jvp_complex``, ``<op>_vjp_complex``, ``<op>_gauge``) take arrays of one
module — NumPy on the CPU, CuPy on a GPU, where the elementwise parts run as the generated CUDA
kernels — and return arrays of the same module, e.g. ``agc.eigh_vjp(w, V, gw, gV) -> gA``,
``agc.svds_vjp(A, U, S, V, gU, gS, gV) -> gA``.  Each function lives in
``adjointgen.generated.cupy.<op>``, generated from ``derivations/<op>.py``; its docstring shows the
derived formula.  The matrix functions of ``derivations/funm.py`` are here too: ``agc.expm(A)``,
``agc.expm_L(xp, w)`` (the divided differences the rules take), and so on.
"""
import importlib as _importlib
import pkgutil as _pkgutil

from . import generated as _generated

_RULE_SUFFIXES = ("_jvp", "_vjp", "_vjp_factors", "_jvp_complex", "_vjp_complex", "_vjp_complex_checked", "_gauge")


def _rules():
    package = _importlib.import_module(f"{_generated.__name__}.cupy")
    found = {}
    for info in sorted(_pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module = _importlib.import_module(f"{package.__name__}.{info.name}")
        for suffix in _RULE_SUFFIXES:
            fn = getattr(module, info.name + suffix, None)
            if callable(fn):
                found[info.name + suffix] = fn
        for inst in getattr(module, "INSTANCES", ()):  # a derivation's concrete functions
            for suffix in ("", "_f", "_dd", "_L", "_dd2"):
                if callable(getattr(module, inst + suffix, None)):
                    found[inst + suffix] = getattr(module, inst + suffix)
    return found


_RULES = _rules()
globals().update(_RULES)
__all__ = sorted(_RULES)
del _RULES


def __dir__():
    return list(__all__)

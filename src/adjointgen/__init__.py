"""adjointgen: derived, audited JVP/VJP rules for matrix decompositions.

``import adjointgen.torch as agt`` for the PyTorch functions, ``import adjointgen.cupy as agc`` for
the NumPy/CuPy rule functions, ``adjointgen.LinearOperator`` for matrix-free operators,
``adjointgen.testing`` for gradient checks of functions of symmetric matrices.  Importing
``adjointgen`` itself is cheap: the names below load their modules (and torch) on first use.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: public name -> module that defines it (loaded on first access)
_LAZY = {
    "ConvergenceError": "adjointgen.runtime.errors",
    "GaugeDependentLossError": "adjointgen.runtime.gauge",
    "PhaseDependentLossError": "adjointgen.runtime.gauge",
    "DegenerateSubspaceError": "adjointgen.runtime.gauge",
    "ComplementBasisError": "adjointgen.runtime.gauge",
    "LinearOperator": "adjointgen.runtime.linear_operator",
    "NotPositiveDefiniteError": "adjointgen.runtime.checks",
    "SingularMatrixError": "adjointgen.runtime.checks",
    "DefectiveMatrixError": "adjointgen.runtime.checks",
    "checking": "adjointgen.runtime.verdict",
    "raise_deferred": "adjointgen.runtime.verdict",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'adjointgen' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))

"""The JAX backend: the rules on ``jax.numpy`` and ``jax.custom_jvp`` public functions
(``jax/op.py.j2``; runtime: :mod:`adjointgen.runtime.jax`)."""
from __future__ import annotations

from ...printers import ArrayPrinter
from ...verify import verify_jax_module
from .. import Backend
from ..cupy import PRINTER as _XP
from ..cupy import _array_imports

#: JAX (``xp`` is ``jax.numpy``): the NumPy table with no in-place statement (JAX arrays are
#: immutable) and the module's own triangular solves, batched and transposable
PRINTER = ArrayPrinter(
    "jax",
    {**_XP.table, "diagonal": "xp.diagonal({0}, axis1=-2, axis2=-1)"},
    inplace={},
    complex_table={**_XP.complex_table, "diag_sym": "xp.real(xp.diagonal({0}, axis1=-2, axis2=-1))"},
    imports=_array_imports("adjointgen.runtime.jax", _functools="functools", _jax="jax", _jnp="jax.numpy",
                           _rt="adjointgen.runtime:jax", _rules="adjointgen.runtime:rules"),
    forwards="adjointgen.runtime.jax",
)


BACKEND = Backend("jax", "jax/op.py.j2", PRINTER, "#", runtime=("adjointgen.runtime.jax", "adjointgen.runtime.rules",
                                                             "adjointgen.runtime.host"),
                  package_init="jax/__init__.py", verifier=verify_jax_module, libraries=("jax", "jaxlib"))

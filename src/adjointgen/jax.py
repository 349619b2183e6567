"""adjointgen's operations for JAX: ``import adjointgen.jax as agj``.

``agj.eigh(A)``, ``agj.eigh_generalized(A, B)``, ``agj.svd(A)``, ``agj.pinv(A)``,
``agj.eig(A)``, ``agj.cholesky(A)``, ``agj.qr(A)``, ``agj.lu(A)`` (square), ``agj.lstsq(A, B)``, ``agj.det(A)``,
``agj.matrix_exp(A)`` (``agj.expm``), ``agj.logm_general(A)`` (``agj.logm``), ``agj.sqrtm(A)``, ``agj.powm(A, p)``, ``agj.inv(A)``, ``agj.solve(A, B)``, ``agj.solve_triangular(A, B)`` (lower
triangular ``A``), ``agj.slogdet(A)``: each is
``jax.custom_jvp`` with the JVP derived in ``derivations/<op>.py`` (reverse mode is JAX's
transposition of it), generated into ``adjointgen.generated.jax.<op>``, so ``jit``, ``vmap``,
``grad``, ``jvp``, ``jacfwd``, ``jacrev``, ``hessian`` and ``linearize`` all work.  The rule
functions (``agj.eigh_jvp``, ``agj.eigh_vjp``, ...) are here too, on ``jax.numpy`` arrays.

Gauges: where a loss depends on the basis inside a cluster of equal values (or on a complex phase),
its gradient does not exist: outside ``jit`` reverse mode raises ``DegenerateSubspaceError`` (or
``PhaseDependentLossError``), under ``jit`` it returns NaN for those batch elements (or raises
within :func:`errors_in_jit`); see :mod:`adjointgen.runtime.jax`.  Needs ``pip install adjointgen[jax]``.
"""
import importlib as _importlib
import pkgutil as _pkgutil

try:
    import jax as _jax  # noqa: F401
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError("adjointgen.jax needs JAX: pip install 'adjointgen[jax]' (or jax itself)") from _exc

from . import generated as _generated
from .runtime.jax import errors_in_jit

_RULE_SUFFIXES = ("_jvp", "_vjp", "_vjp_factors", "_jvp_complex", "_vjp_complex", "_vjp_checked",
                  "_vjp_complex_checked", "_gauge")


def _functions():
    package = _importlib.import_module(f"{_generated.__name__}.jax")
    found = {}
    for info in sorted(_pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module = _importlib.import_module(f"{package.__name__}.{info.name}")
        names = [info.name] if hasattr(module, "RULES") else []
        names += [info.name + suffix for suffix in _RULE_SUFFIXES]
        for name in names:
            if callable(getattr(module, name, None)):
                found[name] = getattr(module, name)
    return found


_FUNCTIONS = _functions()
globals().update(_FUNCTIONS)


def expm(A):
    """``exp(A)`` of a square ``A``, as ``jax.scipy.linalg.expm``: :func:`matrix_exp`, whose Fréchet
    derivative is derived in ``derivations/matrix_exp.py`` (no gauge, so exact at repeated
    eigenvalues too; every order)."""
    return matrix_exp(A)  # noqa: F821 - generated, in globals()


def logm(A):
    """The principal logarithm of a square ``A`` (no eigenvalue on the closed negative real axis,
    else ``ValueError`` naming it): :func:`logm_general`, derived in ``derivations/logm_general.py``
    (``exp(X) = A``, the exponential's Fréchet map inverted).  The forward is SciPy's on the host
    (``jax.pure_callback`` under ``jit``)."""
    return logm_general(A)  # noqa: F821


def sqrtm(A):
    """The principal square root of a square ``A``, as ``jax.scipy.linalg.sqrtm``:
    :func:`sqrtm_general`, derived in ``derivations/sqrtm_general.py`` (``X dX + dX X = dA``)."""
    return sqrtm_general(A)  # noqa: F821


def powm(A, p):
    """``A^p = exp(p log A)`` (principal branch) for real ``p``: :func:`expm` of ``p`` :func:`logm`,
    each with its derived rule, so every derivative is the chain rule of two derived ones."""
    return expm(p * logm(A))


from .composite.jax_eigsh import eigsh  # noqa: E402  (the forwards are not generated: LAPACK on the host)
from .composite.jax_svds import svds  # noqa: E402

__all__ = sorted([*_FUNCTIONS, "errors_in_jit", "expm", "logm", "sqrtm", "powm", "eigsh", "svds"])
del _FUNCTIONS


def __dir__():
    return list(__all__)

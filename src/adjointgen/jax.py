"""adjointgen's operations for JAX: ``import adjointgen.jax as agj``.

Drop-ins with JAX's signatures, results and output dtypes (:mod:`adjointgen.composite.jax_dropins`):
``agj`` has those of ``jax.numpy.linalg`` -- ``eigh(a, UPLO=None, symmetrize_input=True)`` (and
``eigh(a, b)``, the generalized problem, which JAX lacks), ``eigvalsh``, ``eig``, ``eigvals``,
``svd(a, full_matrices=True, compute_uv=True)``, ``svdvals``, ``qr(a, mode)`` (any shape),
``cholesky(a, upper=False)``, ``solve``, ``lstsq`` (``(x, resid, rank, s)``), ``slogdet``,
``det``, ``inv``, ``pinv(a, rtol, hermitian)`` -- plus ``lu``, ``solve_triangular``, ``expm``,
``sqrtm``; ``agj.scipy`` those of ``jax.scipy.linalg`` with SciPy's defaults
(:mod:`adjointgen.composite.jax_scipy`); ``agj.lax`` those of ``jax.lax.linalg``
(:mod:`adjointgen.composite.jax_lax`: ``eig`` with left eigenvectors and
``enable_eigvec_derivs``, ``eigh`` returning ``(v, w)``, the packed ``lu``, ``triangular_solve``
with every flag).  Beyond JAX: ``agj.logm``, ``agj.powm(A, p)``, ``agj.eigsh(A, k)``,
``agj.svds(A, k)``, ``agj.eigh_generalized(A, B)``, ``agj.matrix_exp``, ``agj.funm(A, f)``
(Hermitian ``A``, any real scalar ``f`` as a SymPy expression).  Each differentiates through
``jax.custom_jvp`` with the JVP derived in ``derivations/<op>.py`` (reverse mode runs the derived
VJP), generated into ``adjointgen.generated.jax.<op>``, so ``jit``, ``vmap``, ``grad``, ``jvp``,
``jacfwd``, ``jacrev``, ``hessian`` and ``linearize`` all work, under any of JAX's promotion and
precision settings (:func:`adjointgen.runtime.jax.library_semantics`).  The rule functions
(``agj.eigh_jvp``, ``agj.eigh_vjp``, ...) are here too, on ``jax.numpy`` arrays.

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


def logm(A):
    """The principal logarithm of a square ``A`` (no eigenvalue on the closed negative real axis,
    else ``ValueError`` naming it): :func:`logm_general`, derived in ``derivations/logm_general.py``
    (``exp(X) = A``, the exponential's Fréchet map inverted).  The forward is SciPy's on the host
    (``jax.pure_callback`` under ``jit``)."""
    return logm_general(A)  # noqa: F821


def powm(A, p):
    """``A^p = exp(p log A)`` (principal branch) for real ``p``: :func:`expm` of ``p`` :func:`logm`,
    each with its derived rule, so every derivative is the chain rule of two derived ones."""
    return expm(p * logm(A))


def expm(A, *, upper_triangular=False, max_squarings=16):  # noqa: F811
    """``exp(A)`` of a square ``A``, as ``jax.scipy.linalg.expm`` (its keywords are accepted; the
    forward is JAX's): :func:`matrix_exp`, whose Fréchet derivative is derived in
    ``derivations/matrix_exp.py`` (no gauge, so exact at repeated eigenvalues too; every order)."""
    del upper_triangular, max_squarings
    return matrix_exp(A)  # noqa: F821 - generated, in globals()


def sqrtm(A, blocksize=1):  # noqa: F811
    """The principal square root of a square ``A``, as ``jax.scipy.linalg.sqrtm``:
    :func:`sqrtm_general`, derived in ``derivations/sqrtm_general.py`` (``X dX + dX X = dA``)."""
    del blocksize
    return sqrtm_general(A)  # noqa: F821


from .composite.jax_eigsh import eigsh  # noqa: E402  (the forwards are not generated: LAPACK on the host)
from .composite.jax_svds import svds  # noqa: E402
from .composite import jax_funm as _jax_funm  # noqa: E402


def funm(A, f, *, domain=None):
    """``f(A) = V f(w) V^H`` for Hermitian ``A`` and a real scalar ``f``: a SymPy expression in one
    symbol (``sympy.cos(x)``, ``x*sympy.log(x)``, ``sympy.Piecewise(...)``) or ``"exp"``, ``"log"``,
    ``"sqrt"``.  ``domain``: an optional SymPy set or condition the eigenvalues must satisfy.

    ``f`` is compiled once, as for ``agt.funm`` (:mod:`adjointgen.codegen.scalar`), and
    differentiated by the rule of ``derivations/funm.py`` with divided differences that never
    cancel (:mod:`adjointgen.composite.jax_funm`): exact gradients also at repeated eigenvalues,
    second derivatives through ``f[a, b, c]`` (at an exact cluster a second derivative raises; a
    third is NaN).  Every JAX transform.  Eigenvalues outside ``f``'s domain (``log`` of a
    non-positive one), or where ``f`` is not differentiable in a derivative, raise ``ValueError``
    where the values are concrete (outside ``jit``); under ``jit`` they give NaN or Inf, as ``f``
    itself would.  (``jax.scipy.linalg.funm(A, func)`` takes a general ``A`` and has no derivative
    rule; this takes a Hermitian one.)"""
    from .codegen import scalar

    names = {"exp": "exp(x)", "expm": "exp(x)", "log": "log(x)", "logm": "log(x)", "sqrt": "sqrt(x)",
             "sqrtm": "sqrt(x)"}
    if isinstance(f, str):
        if f not in names:
            raise TypeError(f"funm: unknown function name {f!r}; use one of {', '.join(sorted(names))} or a "
                            "SymPy expression")
        f = names[f]
    program = scalar.compile_cached(f)
    if program.options:
        raise TypeError(f"funm: {program.text} has options {program.options}; give f with their values")
    condition = scalar.compile_condition(domain, program) if domain is not None else (None, None)
    return _jax_funm.funm(A, program, condition)
# the signatures and results of jax.numpy.linalg / jax.scipy.linalg over the generated operations
from .composite.jax_dropins import (  # noqa: E402,F811
    EighResult, EigResult, QRResult, SlogdetResult, SVDResult, cholesky, det, eig, eigh, eigvals, eigvalsh, inv, lstsq,
    lu, pinv, qr, slogdet, solve, solve_triangular, svd, svdvals)
from .composite import jax_lax as lax  # noqa: E402  (jax.lax.linalg's signatures)
from .composite import jax_scipy as scipy  # noqa: E402  (jax.scipy.linalg's signatures)

# the rest of jax.numpy.linalg as JAX has it (none differentiates through a quotient of gaps: the
# spectral norms and cond use singular values alone), so that agj stands in for the namespace
from jax.numpy.linalg import (  # noqa: E402
    cond, cross, diagonal, matmul, matrix_norm, matrix_power, matrix_rank, matrix_transpose, multi_dot, norm, outer,
    tensordot, tensorinv, tensorsolve, trace, vecdot, vector_norm)

_AS_JAX = ["cond", "cross", "diagonal", "matmul", "matrix_norm", "matrix_power", "matrix_rank", "matrix_transpose",
           "multi_dot", "norm", "outer", "tensordot", "tensorinv", "tensorsolve", "trace", "vecdot", "vector_norm"]
_DROPINS = ["eigh", "eigvalsh", "eig", "eigvals", "svd", "svdvals", "qr", "cholesky", "solve", "solve_triangular",
            "lstsq", "lu", "slogdet", "pinv", "det", "inv", "lax", "scipy", "EighResult", "EigResult", "QRResult", "SlogdetResult", "SVDResult"]
__all__ = sorted({*_FUNCTIONS, *_DROPINS, *_AS_JAX, "errors_in_jit", "expm", "logm", "sqrtm", "powm", "eigsh", "svds",
                  "funm"})
del _FUNCTIONS


def __dir__():
    return list(__all__)

"""The matrix functions of ``adjointgen.torch``: ``expm``, ``logm``, ``sqrtm`` (Hermitian input through
the spectral rules, general input through the general rules), ``powm`` and ``funm`` of any scalar
function (compiled to a scalar program).
"""
from __future__ import annotations

import torch

from ..generated.torch import funm as _funm
from ..runtime import checks
from ..runtime import routes as _routes
from ..runtime import spectral as _spectral


def expm(A: torch.Tensor) -> torch.Tensor:
    """``exp(A)`` of a square ``A``, as :func:`torch.linalg.matrix_exp`.

    Symmetric (Hermitian) ``A`` (to ``100 eps``): ``V exp(w) V^H`` from ``eigh``, differentiable with the
    Daleckii–Krein rule derived in ``derivations/funm.py`` along every direction, symmetric or not
    (``Derivation.general_directions``: the audit checks it against the general exponential), so
    its derivatives are :func:`matrix_exp`'s (continuous at repeated eigenvalues).  Any other ``A``,
    and every ``A`` whose values cannot be read (under ``vmap``, ``torch.compile``, on meta
    tensors): :func:`matrix_exp`.  Reverse and forward mode, ``torch.func`` transforms, second
    derivatives.

    Raises:
        ValueError: not a square floating matrix, NaN/Inf.
    """
    return _symmetric_or_general("expm", A, _general_directions("expm"), "matrix_exp")


def matrix_exp(A: torch.Tensor) -> torch.Tensor:
    """``exp(A)`` of a general square ``A``, as :func:`torch.linalg.matrix_exp` (real or complex).

    The Fréchet derivative is derived in ``derivations/matrix_exp.py``: ``dX = L_exp[A](dA)``, the
    upper right corner of ``exp([[A, dA], [0, A]])``, and ``gA = L_exp[A^H](gX)``; both are evaluated
    with the block exponential, whose own derivatives are exact, so every order is (reverse and
    forward mode, ``torch.func`` transforms, higher derivatives; float32/float64/complex64/
    complex128, CPU/CUDA, empty batches).

    Raises:
        ValueError: not a square floating matrix, NaN/Inf.
    """
    from ..generated.torch.matrix_exp import matrix_exp as general

    return general(A)


def logm(A: torch.Tensor) -> torch.Tensor:
    """The principal logarithm of a square ``A`` (eigenvalues off the closed negative real axis), as
    :func:`scipy.linalg.logm`.

    Symmetric (Hermitian) ``A`` (to ``100 eps``): positive definite, ``V log(w) V^H`` from ``eigh``,
    differentiable to second order along every direction (see :func:`expm`).  Any other ``A``, and
    every ``A`` whose values cannot be read (``vmap``, ``torch.compile``): SciPy's inverse scaling
    and squaring on the host (tensors on a GPU make a round trip),
    real for real ``A``; its Fréchet derivative is derived in ``derivations/logm_general.py`` from
    ``exp(X) = A`` as the inverse of the exponential's, ``dX = L_exp[X]^-1(dA)``, solved with the
    block logarithm, to any order (reverse, forward, ``torch.func`` transforms).

    Raises:
        ValueError: an eigenvalue ``<= 0`` of symmetric ``A``, or of general ``A`` on the closed
            negative real axis (named in the message).
    """
    return _symmetric_or_general("logm", A, _general_directions("logm"), "logm_general")


def sqrtm(A: torch.Tensor) -> torch.Tensor:
    """The principal square root of a square ``A``, as :func:`scipy.linalg.sqrtm`.

    Symmetric (Hermitian) ``A`` (to ``100 eps``): positive semidefinite, ``V sqrt(w) V^H`` from ``eigh``
    (eigenvalues within rounding of 0 are taken as 0), differentiable to second order along every
    direction where ``A`` is positive definite, continuous at repeated eigenvalues (see :func:`expm`).

    Any other ``A``, and every ``A`` whose values cannot be read (``vmap``, ``torch.compile``; a
    singular positive semidefinite ``A`` then raises): the root whose eigenvalues have positive real parts,
    by SciPy's Schur method on
    the host (tensors on a GPU make a round trip), real for real ``A``; its Fréchet derivative
    ``X dX + dX X = dA`` and the adjoint are derived in ``derivations/sqrtm_general.py`` and solved
    by Bartels-Stewart, to any order (reverse, forward, ``torch.func`` transforms).

    Raises:
        ValueError: a negative eigenvalue of symmetric ``A``, or an eigenvalue of general ``A`` on
            the closed negative real axis (named in the message); in a derivative, a zero
            eigenvalue of symmetric ``A`` (the derivative of ``sqrt`` is infinite there).
    """
    return _symmetric_or_general("sqrtm", A, _general_directions("sqrtm"), "sqrtm_general")


def _symmetric_or_general(name: str, A, hermitian_function, general: str):
    """``f(A)`` of a general-matrix function: for Hermitian ``A`` (eager, values checked) from
    ``eigh`` with the rules of ``derivations/funm.py`` along unstructured tangents (the general
    function's derivative at a Hermitian point: ``Derivation.general_directions``, audited against
    the general function), else the generated general-matrix function ``general``.  Where values
    cannot be read (under ``vmap``, ``torch.compile``, on fake tensors) the general function runs: it
    is right for every ``A``; meta tensors (shapes only) take the eigh route."""
    import importlib

    checks.tensor(A, "A")
    checks.floating(A, "A", complex_ok=True)
    checks.matrix(A, "A", square=True)
    if A.is_meta:  # shapes only: the eigh route propagates them (the general one computes on the host)
        return hermitian_function(A)
    hermitian = not checks.is_traced(A)
    if hermitian:
        try:
            checks.symmetric(A, "A")
        except ValueError:
            hermitian = False
    if not hermitian:
        _routes.taken(name, "general")
        module = importlib.import_module(f"adjointgen.generated.torch.{general}")
        return getattr(module, general)(A)
    _routes.taken(name, "hermitian")
    return hermitian_function(A)


def _general_directions(name: str):
    """``funm``'s ``name`` with the derivatives of the general-matrix function (unstructured directions)."""
    return lambda A: _spectral.apply(_funm.SPECTRAL[name], A, general=True)


def powm(A: torch.Tensor, p: float) -> torch.Tensor:
    """``A^p = V w^p V^H`` of symmetric (Hermitian) ``A`` for a real ``p``, differentiable to second
    order (see :func:`expm`).  Integer ``p`` accepts any symmetric ``A`` (``p < 0``: invertible)
    and uses exact divided differences; other ``p`` need a positive semidefinite ``A`` (definite
    for ``p < 0``).

    Raises:
        ValueError: not symmetric, or an eigenvalue outside the domain of ``x**p`` (named).
        TypeError: ``p`` is not a real number.
    """
    return _funm.powm(A, p)


def funm(A: torch.Tensor, f, *, domain=None) -> torch.Tensor:
    """``f(A) = V f(w) V^H`` for symmetric (Hermitian) ``A`` and any real scalar function ``f``,
    differentiable to second order (reverse and forward mode, every ``torch.func`` transform), also
    at repeated eigenvalues.

    Args:
        A: symmetric (Hermitian) ``(..., n, n)`` matrices, float32/float64 (complex64/complex128).
        f: a SymPy expression in one symbol (``sympy.cos(x)``, ``x*sympy.log(x)``,
            ``sympy.Piecewise(...)``), or a name of the catalogue: ``"expm"`` (or ``"exp"``),
            ``"logm"`` (``"log"``), ``"sqrtm"`` (``"sqrt"``).
        domain: optional: where ``f`` may be applied, a SymPy set (``sympy.Interval(0, sympy.oo)``)
            or condition in the symbol; an eigenvalue outside raises.  The domains of the
            primitives ``f`` is built of (``log`` needs a positive argument, ...) are always checked.

    ``f`` is compiled once into a program over primitives (:mod:`adjointgen.codegen.scalar`; kept on
    disk, ``$ADJOINTGEN_CACHE``), in milliseconds and without expanding ``f``.  Its divided
    differences ``f[a, b]`` (and ``f[a, b, c]`` for second derivatives) are composed from the
    primitives' stable forms by the chain and Leibniz rules (:mod:`adjointgen.runtime.divided`): no
    cancellation for any gap, and no overflow where the result is finite.  Forms that overflow as
    written become primitives that do not (``log(1 + exp(x))`` is softplus, ``x*log(x)`` is 0 at 0,
    ``sin(x)/x`` is ``sinc``).  An estimated accuracy below ``sqrt(eps)`` warns
    (:class:`adjointgen.runtime.divided.AccuracyWarning`) with the eigenvalues.

    Example::

        import sympy, torch
        import adjointgen.torch as agt
        x = sympy.Symbol("x")
        A = torch.eye(3, dtype=torch.float64)
        agt.funm(A, sympy.cos(x))  # cos(1) I

    Raises:
        ValueError: ``A`` not a symmetric floating matrix; ``f`` complex-valued, in more than one
            symbol, not scalar, or using a function adjointgen cannot evaluate; an eigenvalue
            outside the domain of a primitive of ``f`` (named, with the primitive); in a
            derivative, an eigenvalue where ``f`` is not differentiable.
        TypeError: ``f`` is neither a name of the catalogue nor a SymPy expression.
    """
    return _spectral.apply(_spectral_of(f, domain), A)


def _spectral_of(f, domain=None):
    if isinstance(f, str):
        name = {"exp": "expm", "log": "logm", "sqrt": "sqrtm"}.get(f, f)
        spec = getattr(_funm, "SPECTRAL", {}).get(name)
        if spec is None or spec.options:
            known = sorted(k for k, s in getattr(_funm, "SPECTRAL", {}).items() if not s.options)
            raise TypeError(f"funm: unknown function name {f!r}; use one of {', '.join(known)} or a SymPy "
                            "expression (powm(A, p) takes its option)")
        if domain is None:
            return spec
        f = spec.program.text
    from ..codegen import scalar

    program = scalar.compile_cached(f)
    cond = text = None
    if domain is not None:
        cond, text = scalar.compile_condition(domain, program)
    return _spectral.Spectral("funm", program, frechet=_funm.FRECHET, domain=cond, domain_text=text)

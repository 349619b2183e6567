"""Extensions of catalogue operations beyond the domain their rules were derived on
(:meth:`adjointgen.calculus.Derivation.extend`): compositions of the derived public function with
array operations that every backend's arrays have and differentiate (``.conj()``, ``.swapaxes``,
``@``, arithmetic), so that every derivative, to every order, is the derived rules' composed.

No formula for a derivative lives here; the tests check each case against an independent
reference (SciPy, finite differences).
"""
from __future__ import annotations


def _h(x):
    """The conjugate transpose of the last two axes (torch, JAX, NumPy and CuPy arrays alike)."""
    return x.conj().swapaxes(-1, -2)


def _resolved(x):
    """``x`` with a lazy conjugation carried out (torch marks ``x.conj()`` with a bit that
    ``.numpy()`` refuses); other arrays as they are."""
    resolve = getattr(x, "resolve_conj", None)
    return x if resolve is None else resolve()


def _hermitian_part(x):
    return (x + _h(x)) / 2


def polar(derived, a, side="right"):
    """The polar decomposition ``(U, P)`` of an ``(..., m, n)`` ``A``, as ``scipy.linalg.polar``:
    ``side="right"``: ``A = U P`` with ``P = (A^H A)^(1/2)`` ``(n, n)``; ``side="left"``: ``A = P U``
    with ``P = (A A^H)^(1/2)`` ``(m, m)``.  ``U`` is ``(m, n)``, with orthonormal columns if
    ``m >= n`` and orthonormal rows otherwise (unitary for square ``A``).

    The rules are derived for ``side="right"``, ``m >= n`` (``derivations/polar.py``: no division by
    gaps, exact at repeated singular values and at an orthogonal ``A``).  The other cases are that
    decomposition of ``A`` or ``A^H``:

    - ``side="left"``, ``m <= n``: ``U', P = polar(A^H)``, ``U = U'^H``;
    - ``side="right"``, ``m < n``: ``U`` as above and ``P = U^H A`` (rank ``m``);
    - ``side="left"``, ``m > n``: ``U, _ = polar(A)`` and ``P = A U^H`` (rank ``n``).

    ``A`` must have full rank ``min(m, n)``: there ``U`` is unique and every output differentiable.
    """
    if side not in ("right", "left"):
        raise ValueError(f"polar: side must be 'right' or 'left', not {side!r}")
    m, n = a.shape[-2], a.shape[-1]
    if side == "right" and m >= n:
        return derived(a)
    if side == "left" and m <= n:
        u, p = derived(_h(a))
        return _resolved(_h(u)), p
    if side == "right":
        u = _resolved(_h(derived(_h(a))[0]))
        return u, _hermitian_part(_h(u) @ a)
    u = derived(a)[0]
    return u, _hermitian_part(a @ _h(u))

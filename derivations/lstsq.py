"""Least squares ``X = A⁺ B``: the minimum-norm solution of ``min ‖A X - B‖_F`` at constant rank,
real or complex (the derivation runs over complex matrices, ``^T`` the conjugate transpose; the
rules are also specialised to real data).

For ``A`` of full column rank (tall) ``X`` solves the normal equations ``A^T A X = A^T B``; of full
row rank (wide), ``X`` is the solution of ``A X = B`` of least norm; of lower rank, the
minimum-norm minimiser.  One identity covers all three: ``X = P B`` with ``P = A⁺``, a hidden output
of the forward (the rules read it, as torch's backward does; it has its own rule, so derivatives
of the rules are exact).  ``dP`` follows from the four
Penrose identities (``_penrose.py``, shared with ``pinv.py``), and ``dX = dP B + P dB``.  The rule
holds along perturbations that keep the rank (for full-rank ``A``, all of them).

References: G. Golub, V. Pereyra, SIAM J. Numer. Anal. 10 (1973); MATH.md §5.
"""
import numpy as np

import _penrose as penrose
from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation


# ---------------------------------------------------------------- numeric instances for the audit
def sample(rng, m, n, p, r=None, field="real"):
    """A = L R^H of rank r (min(m, n) unless given), a right-hand side B; the direction
    dA = dL R^H + L dR^H keeps the rank, so finite differences of numpy.linalg.pinv measure the
    constant-rank derivative."""
    def randn(*shape):
        x = rng.standard_normal(shape)
        return x + 1j * rng.standard_normal(shape) if field == "complex" else x

    r = r or min(m, n)
    L, R, B = randn(m, r), randn(n, r), randn(m, p)
    dL, dR, dB = randn(m, r), randn(n, r), randn(m, p)

    def forward(L, R, B):
        P = np.linalg.pinv(L @ R.conj().T, rcond=1e-10)
        return {"X": P @ B, "P": P}

    base, tan = fd_tangents(forward, {"L": L, "R": R, "B": B}, {"L": dL, "R": dR, "B": dB})
    return {"A": L @ R.conj().T, "B": B, "dA": dL @ R.conj().T + L @ dR.conj().T, "dB": dB,
            "X": base["X"], "P": base["P"], "dX": tan["X"], "dP": tan["P"]}


# ---------------------------------------------------------------- declarations
d = Derivation("lstsq", __file__, title="least squares X = A⁺ B (minimum norm, constant rank; real or complex)",
               references=("Golub & Pereyra, SIAM J. Numer. Anal. 10 (1973)",), field="complex")
m, n, p = d.dim("m"), d.dim("n"), d.dim("p")
d.either_orientation(m, n)  # A tall or wide: products ordered for both, picked by shape
A = d.input("A", m, n)
B = d.input("B", m, p)
X = d.output("X", n, p)
P = d.output("P", n, m, hidden=True)  # returned with its rule (higher derivatives read it), not by agt.lstsq
d.forward(runtime="lstsq", options={"rcond": None})
d.instances(sample, [{"m": 5, "n": 3, "p": 2, "field": "complex"}, {"m": 3, "n": 5, "p": 2, "field": "complex"},
                     {"m": 5, "n": 4, "p": 3, "r": 2, "field": "complex"}, {"m": 5, "n": 3, "p": 2, "field": "real"},
                     {"m": 3, "n": 5, "p": 1, "field": "real"}, {"m": 5, "n": 4, "p": 2, "r": 2, "field": "real"}])
d.symbolic_sizes = {"m": 3, "n": 2, "p": 1}

# ---------------------------------------------------------------- JVP
# dP from the four Penrose identities (derivations/_penrose.py), then X = P B
dP = penrose.pseudo_inverse_tangent(d, A, P, m, n)
solution = d.identity("the minimum-norm solution P B = X", P * B, X)
s = d.differentiate(solution, "differentiate P B = X")
s = d.solve_for(d.replace(s, dP, "substitute dP"), d.tangent(X))
d.set_jvp(dX=d.substitute(s, solution, "substitute P B = X"), dP=dP)

# ---------------------------------------------------------------- VJP
d.derive_vjp()

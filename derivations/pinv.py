"""Moore–Penrose pseudo-inverse ``X = A⁺`` at constant rank, from the four Penrose identities, real
or complex (the derivation runs over complex matrices, ``^T`` the conjugate transpose; the rules
are also specialised to real data).

``A X A = A``, ``X A X = X``, ``(A X)^T = A X``, ``(X A)^T = X A``.  The tangent ``dX`` is split by
the projectors ``X A`` and ``A X``: ``dX = XA dX AX + XA dX (I - AX) + (I - XA) dX AX +
(I - XA) dX (I - AX)``; each block follows from one differentiated identity, and their sum is
``dX``.  The rule holds along perturbations that keep the rank (for full-rank ``A``, all of them).

References: G. Golub, V. Pereyra, SIAM J. Numer. Anal. 10 (1973); MATH.md §5.
"""
import numpy as np

import _penrose as penrose
from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation


# ---------------------------------------------------------------- numeric instances for the audit
def sample(rng, m, n, r=None, field="real"):
    """A = L R^H of rank r; the direction dA = dL R^H + L dR^H keeps the rank, so finite
    differences of numpy.linalg.pinv measure the constant-rank derivative."""
    def randn(*shape):
        x = rng.standard_normal(shape)
        return x + 1j * rng.standard_normal(shape) if field == "complex" else x

    r = r or min(m, n)
    L, R = randn(m, r), randn(n, r)
    dL, dR = randn(m, r), randn(n, r)
    forward = lambda L, R: {"X": np.linalg.pinv(L @ R.conj().T, rcond=1e-10)}
    base, tan = fd_tangents(forward, {"L": L, "R": R}, {"L": dL, "R": dR})
    return {"A": L @ R.conj().T, "dA": dL @ R.conj().T + L @ dR.conj().T, "X": base["X"], "dX": tan["X"]}


def sample_with_rank(rng, m, n, field):
    return sample(rng, m, n, r=RANKS.get((m, n)), field=field)


RANKS = {(5, 4): 2}

# ---------------------------------------------------------------- declarations
d = Derivation("pinv", __file__, title="Moore–Penrose pseudo-inverse X = A⁺ (constant rank; real or complex)",
               references=("Golub & Pereyra, SIAM J. Numer. Anal. 10 (1973)",), field="complex")
m, n = d.dim("m"), d.dim("n")
d.either_orientation(m, n)  # A tall or wide: products ordered for both, picked by shape
A = d.input("A", m, n)
X = d.output("X", n, m, api="P")
dA, dX = d.tangent(A), d.tangent(X)
d.forward(runtime="pinv", options={"atol": None, "rtol": None, "hermitian": False})
d.instances(sample_with_rank, [{"m": 5, "n": 3, "field": "complex"}, {"m": 3, "n": 5, "field": "complex"},
                               {"m": 5, "n": 4, "field": "complex"}, {"m": 5, "n": 3, "field": "real"},
                               {"m": 3, "n": 5, "field": "real"}, {"m": 5, "n": 4, "field": "real"}])
d.symbolic_sizes = {"m": 3, "n": 2}  # explicit 3×2 A: products of five generic matrices stay cheap

# dX from the four Penrose identities (derivations/_penrose.py)
d.set_jvp(dX=penrose.pseudo_inverse_tangent(d, A, X, m, n))

# ---------------------------------------------------------------- VJP
d.derive_vjp()

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

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Identity, Transpose


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
A = d.input("A", m, n)
X = d.output("X", n, m, api="P")
dA, dX = d.tangent(A), d.tangent(X)
d.forward(torch="adjointgen.runtime.forward:pinv", numpy="adjointgen.runtime.xp:pinv",
          options={"atol": None, "rtol": None, "hermitian": False})
d.instances(sample_with_rank, [{"m": 5, "n": 3, "field": "complex"}, {"m": 3, "n": 5, "field": "complex"},
                               {"m": 5, "n": 4, "field": "complex"}, {"m": 5, "n": 3, "field": "real"},
                               {"m": 3, "n": 5, "field": "real"}, {"m": 5, "n": 4, "field": "real"}])
d.symbolic_sizes = {"m": 3, "n": 2}  # explicit 3×2 A: products of five generic matrices stay cheap

penrose1 = d.identity("Penrose 1: A X A = A", A * X * A, A)
penrose2 = d.identity("Penrose 2: X A X = X", X * A * X, X)
penrose3 = d.identity("Penrose 3: (A X)^T = A X", Transpose(A * X), A * X)
penrose4 = d.identity("Penrose 4: (X A)^T = X A", Transpose(X * A), X * A)
AtAX = d.substitute(d.transpose(penrose1, "transpose Penrose 1: A^T X^T A^T = A^T"), penrose3,
                    "substitute X^T A^T = A X: A^T A X = A^T")
XAAt = d.substitute(d.transpose(penrose1, "transpose Penrose 1 again"), penrose4,
                    "substitute A^T X^T = X A: X A A^T = A^T")
I_AX = Identity(m) - A * X
I_XA = Identity(n) - X * A

# ---------------------------------------------------------------- block X A dX A X, from Penrose 1
b1 = d.differentiate(penrose1, "differentiate A X A = A")
b1 = d.right_multiply(d.left_multiply(b1, X, "left-multiply by X"), X, "right-multiply by X")
b1 = d.substitute(b1, penrose2, "substitute X A X = X")
b1 = d.isolate(b1, dX, X * A * dX * A * X)

# ---------------------------------------------------------------- block (I - XA) dX (I - AX), from Penrose 2
b4 = d.differentiate(penrose2, "differentiate X A X = X")
b4 = d.right_multiply(d.left_multiply(b4, I_XA, "left-multiply by I - X A"), I_AX, "right-multiply by I - A X")
b4 = d.substitute(b4, penrose1, "substitute A X A = A")
b4 = d.substitute(b4, penrose2, "substitute X A X = X")
b4 = d.isolate(b4, dX, I_XA * dX * I_AX)

# ---------------------------------------------------------------- block X A dX (I - AX), from Penrose 3
b2 = d.differentiate(penrose3, "differentiate (A X)^T = A X")
b2 = d.right_multiply(d.left_multiply(b2, X, "left-multiply by X"), I_AX, "right-multiply by I - A X")
b2 = d.substitute(b2, AtAX, "substitute A^T A X = A^T")
b2 = d.substitute(b2, penrose2, "substitute X A X = X")
b2 = d.isolate(b2, dX, X * A * dX * I_AX)

# ---------------------------------------------------------------- block (I - XA) dX A X, from Penrose 4
b3 = d.differentiate(penrose4, "differentiate (X A)^T = X A")
b3 = d.right_multiply(d.left_multiply(b3, I_XA, "left-multiply by I - X A"), X, "right-multiply by X")
b3 = d.substitute(b3, XAAt, "substitute X A A^T = A^T")
b3 = d.substitute(b3, penrose2, "substitute X A X = X")
b3 = d.isolate(b3, dX, I_XA * dX * A * X)

# ---------------------------------------------------------------- the blocks sum to dX
total = d.add(b1, b2, b3, b4, label="sum of the four projector blocks")
d.set_jvp(dX=d.solve_for(total, dX))

# ---------------------------------------------------------------- VJP
d.derive_vjp()

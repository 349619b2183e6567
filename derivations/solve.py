"""Linear solve ``X = A^-1 B``: A n×n invertible, B n×p, from ``A X = B``.

Differentiating gives ``dA X + A dX = dB``; multiplying by ``A^-1`` isolates
``dX = A^-1 (dB - dA X)``.  Transposing gives ``gB = A^-T gX`` and ``gA = -A^-T gX X^T``, which
share the one solve with ``A^T``.

References: M. Giles, NA-08-01 (2008).
"""
import numpy as np

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Inverse


def forward(A, B):
    return {"X": np.linalg.solve(A, B)}


def sample(rng, n, p):
    A = rng.standard_normal((n, n)) + 2 * np.sqrt(n) * np.eye(n)
    B = rng.standard_normal((n, p))
    dA, dB = rng.standard_normal((n, n)), rng.standard_normal((n, p))
    base, tangents = fd_tangents(forward, {"A": A, "B": B}, {"A": dA, "B": dB})
    return {"A": A, "B": B, "dA": dA, "dB": dB, "X": base["X"], "dX": tangents["X"]}


d = Derivation("solve", __file__, title="linear solve X = A^-1 B", references=("Giles, NA-08-01 (2008)",))
n, p = d.dim("n"), d.dim("p")
A = d.input("A", n, n)
B = d.input("B", n, p)
X = d.output("X", n, p)
dX = d.tangent(X)
d.forward(torch="adjointgen.runtime.forward:solve", numpy="xp.linalg.solve", saves={"A": "lu"})
d.instances(sample, [{"n": 3, "p": 2}, {"n": 4, "p": 1}, {"n": 5, "p": 5}])

system = d.identity("A X = B", A * X, B)

# ---------------------------------------------------------------- JVP
s = d.differentiate(system, "differentiate: dA X + A dX = dB")
s = d.left_multiply(s, Inverse(A), "left-multiply by A^-1")
d.set_jvp(dX=d.solve_for(s, dX))

# ---------------------------------------------------------------- VJP
d.derive_vjp()

"""Matrix inverse ``X = A^-1``, from ``A X = I`` (and ``X A = I``).

Differentiating ``A X = I`` gives ``dA X + A dX = 0``; multiplying by ``X`` on the left and
substituting ``X A = I`` isolates ``dX = -X dA X``.  The VJP ``gA = -X^T gX X^T`` follows by
transposition; both use the inverse the forward computed, so no solve is needed.

References: M. Giles, NA-08-01 (2008).
"""
import numpy as np

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Identity


def forward(A):
    return {"X": np.linalg.inv(A)}


def sample(rng, n):
    A = rng.standard_normal((n, n)) + 2 * np.sqrt(n) * np.eye(n)  # well conditioned
    dA = rng.standard_normal((n, n))
    base, tangents = fd_tangents(forward, {"A": A}, {"A": dA})
    return {"A": A, "dA": dA, "X": base["X"], "dX": tangents["X"]}


d = Derivation("inv", __file__, title="matrix inverse X = A^-1", references=("Giles, NA-08-01 (2008)",))
n = d.dim("n")
A = d.input("A", n, n)
X = d.output("X", n, n)
dA, dX = d.tangent(A), d.tangent(X)
d.forward(torch="adjointgen.runtime.forward:inv", numpy="xp.linalg.inv")
d.instances(sample, [{"n": 3}, {"n": 4}, {"n": 5}])

right = d.identity("A X = I", A * X, Identity(n))
left = d.identity("X A = I", X * A, Identity(n))

# ---------------------------------------------------------------- JVP
s = d.differentiate(right, "differentiate: dA X + A dX = 0")
s = d.left_multiply(s, X, "left-multiply by X")
s = d.substitute(s, left, "substitute X A = I")
d.set_jvp(dX=d.solve_for(s, dX))

# ---------------------------------------------------------------- VJP
d.derive_vjp()

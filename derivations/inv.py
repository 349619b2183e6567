"""Matrix inverse ``X = A^-1``, from ``A X = I`` (and ``X A = I``), real or complex.

The derivation runs over complex matrices (``^T`` is the conjugate transpose); the engine also
specialises the rules to real data.  Differentiating ``A X = I`` gives ``dA X + A dX = 0``; multiplying by ``X`` on the left and
substituting ``X A = I`` isolates ``dX = -X dA X``.  The VJP ``gA = -X^T gX X^T`` follows by
transposition; both use the inverse the forward computed, so no solve is needed.

References: M. Giles, NA-08-01 (2008).
"""
import numpy as np

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Identity


def forward(A):
    return {"X": np.linalg.inv(A)}


def sample(rng, n, field):
    A = rng.standard_normal((n, n)) + 2 * np.sqrt(n) * np.eye(n)  # well conditioned
    dA = rng.standard_normal((n, n))
    if field == "complex":
        A, dA = A + 1j * rng.standard_normal((n, n)), dA + 1j * rng.standard_normal((n, n))
    base, tangents = fd_tangents(forward, {"A": A}, {"A": dA})
    return {"A": A, "dA": dA, "X": base["X"], "dX": tangents["X"]}


d = Derivation("inv", __file__, title="matrix inverse X = A^-1 (real or complex)", references=("Giles, NA-08-01 (2008)",),
               field="complex")
n = d.dim("n")
A = d.input("A", n, n)
X = d.output("X", n, n)
dA, dX = d.tangent(A), d.tangent(X)
d.forward(runtime="inv")
d.instances(sample, [{"n": 3, "field": "complex"}, {"n": 4, "field": "complex"}, {"n": 4, "field": "real"},
                     {"n": 5, "field": "real"}])

right = d.identity("A X = I", A * X, Identity(n))
left = d.identity("X A = I", X * A, Identity(n))

# ---------------------------------------------------------------- JVP
s = d.differentiate(right, "differentiate: dA X + A dX = 0")
s = d.left_multiply(s, X, "left-multiply by X")
s = d.substitute(s, left, "substitute X A = I")
d.set_jvp(dX=d.solve_for(s, dX))

# ---------------------------------------------------------------- VJP
d.derive_vjp()

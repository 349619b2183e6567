"""Linear solve ``X = A^-1 B``: A n×n invertible, B n×p, from ``A X = B``, real or complex.

The derivation runs over complex matrices (``^T`` is the conjugate transpose); the engine also
specialises the rules to real data.  Differentiating gives ``dA X + A dX = dB``; multiplying by ``A^-1`` isolates
``dX = A^-1 (dB - dA X)``.  Transposing gives ``gB = A^-T gX`` and ``gA = -A^-T gX X^T``, which
share the one solve with ``A^T``.

References: M. Giles, NA-08-01 (2008).
"""
import numpy as np

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Inverse


def forward(A, B):
    return {"X": np.linalg.solve(A, B)}


def sample(rng, n, p, field):
    def randn(*shape):
        x = rng.standard_normal(shape)
        return x + 1j * rng.standard_normal(shape) if field == "complex" else x

    A = randn(n, n) + 2 * np.sqrt(n) * np.eye(n)
    B = randn(n, p)
    dA, dB = randn(n, n), randn(n, p)
    base, tangents = fd_tangents(forward, {"A": A, "B": B}, {"A": dA, "B": dB})
    return {"A": A, "B": B, "dA": dA, "dB": dB, "X": base["X"], "dX": tangents["X"]}


d = Derivation("solve", __file__, title="linear solve X = A^-1 B (real or complex)", references=("Giles, NA-08-01 (2008)",),
               field="complex")
n, p = d.dim("n"), d.dim("p")
A = d.input("A", n, n)
B = d.input("B", n, p)
X = d.output("X", n, p)
dX = d.tangent(X)
d.forward(runtime="solve", saves={"A": "lu"})
d.instances(sample, [{"n": 3, "p": 2, "field": "complex"}, {"n": 4, "p": 1, "field": "complex"},
                     {"n": 4, "p": 1, "field": "real"}, {"n": 5, "p": 5, "field": "real"}])

system = d.identity("A X = B", A * X, B)

# ---------------------------------------------------------------- JVP
s = d.differentiate(system, "differentiate: dA X + A dX = dB")
s = d.left_multiply(s, Inverse(A), "left-multiply by A^-1")
d.set_jvp(dX=d.solve_for(s, dX))

# ---------------------------------------------------------------- VJP
d.derive_vjp()

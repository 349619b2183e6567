"""Weighted least squares ``X = (A^T W A)^-1 A^T W B``: A m×n of full column rank, W m×m symmetric
positive definite, B m×p.

Identity: the normal equations ``A^T W A X = A^T W B``.  Differentiating them and multiplying by
``(A^T W A)^-1`` isolates ``dX``; the engine transposes that JVP into the VJP, with the gradient in
``W`` projected onto symmetric matrices.  ``adjointgen audit weighted_lstsq`` prints every step.
"""
import numpy as np

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Inverse


# ---------------------------------------------------------------- numeric instances for the audit
def forward(A, W, B):
    AtW = A.T @ W
    return {"X": np.linalg.solve(AtW @ A, AtW @ B)}


def sample(rng, m, n, p):
    A = rng.standard_normal((m, n))
    Q, _ = np.linalg.qr(rng.standard_normal((m, m)))
    W = (Q * rng.uniform(0.5, 2.0, m)) @ Q.T
    W = (W + W.T) / 2
    B = rng.standard_normal((m, p))
    dA, dB = rng.standard_normal((m, n)), rng.standard_normal((m, p))
    dW = rng.standard_normal((m, m))
    dW = (dW + dW.T) / 2
    base, tangents = fd_tangents(forward, {"A": A, "W": W, "B": B}, {"A": dA, "W": dW, "B": dB})
    return {"A": A, "W": W, "B": B, "dA": dA, "dW": dW, "dB": dB, "X": base["X"], "dX": tangents["X"]}


# ---------------------------------------------------------------- declarations
d = Derivation("weighted_lstsq", __file__, title="weighted least squares X = (A^T W A)^-1 A^T W B")
m, n, p = d.dim("m"), d.dim("n"), d.dim("p")
A = d.input("A", m, n)
W = d.input("W", m, m, positive_definite=True)
B = d.input("B", m, p)
X = d.output("X", n, p)
d.forward(torch="lstsq_layer.ops:weighted_lstsq", numpy="lstsq_layer.ops:weighted_lstsq_numpy")
d.instances(sample, [{"m": 6, "n": 3, "p": 2}, {"m": 5, "n": 2, "p": 3}])
d.symbolic_sizes = {"m": 3, "n": 2, "p": 2}

# ---------------------------------------------------------------- JVP
normal = d.identity("normal equations A^T W A X = A^T W B", A.T * W * A * X, A.T * W * B)
s = d.differentiate(normal, "differentiate the normal equations")
s = d.left_multiply(s, Inverse(A.T * W * A), "left-multiply by (A^T W A)^-1")
d.set_jvp(dX=d.solve_for(s, d.tangent(X)))

# ---------------------------------------------------------------- VJP
d.derive_vjp()

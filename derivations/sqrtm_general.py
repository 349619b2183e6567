"""Principal square root ``X = A^(1/2)`` of a general (non-Hermitian) square ``A``, real or complex:
the ``X`` with ``X X = A`` whose eigenvalues lie in the open right half plane.

Differentiating ``X X = A`` gives the Sylvester equation ``X dX + dX X = dA``: one solution, since no
two eigenvalues of ``X`` sum to zero (their real parts are positive), so ``dX = Syl[X, X](dA)``; the
engine transposes it into ``gA = Syl[X^T, X^T](gX)``.  The generated code solves both by
Bartels-Stewart (Schur forms), the Fréchet derivative without a Padé loop or autograd through the
forward.  Hermitian ``A`` takes ``funm``'s eigenbasis rule instead (``agt.sqrtm``).

References: N. J. Higham, "Functions of Matrices" (2008), §6.1; Björck and Hammarling (1983).
"""
import numpy as np
import scipy.linalg

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation


def forward(A):
    return {"X": scipy.linalg.sqrtm(A)}


def sample(rng, n, field):
    def randn(*shape):
        z = rng.standard_normal(shape)
        return z + 1j * rng.standard_normal(shape) if field == "complex" else z

    A = randn(n, n) + 2 * np.sqrt(n) * np.eye(n)  # eigenvalues in the right half plane
    dA = randn(n, n)
    base, tangents = fd_tangents(forward, {"A": A}, {"A": dA})
    return {"A": A, "dA": dA, "X": base["X"], "dX": tangents["X"]}


d = Derivation("sqrtm_general", __file__, title="principal square root X = A^(1/2) of a general square A",
               references=("Higham, Functions of Matrices (2008), §6.1", "Björck and Hammarling (1983)"),
               field="complex")
n = d.dim("n")
A = d.input("A", n, n)
X = d.output("X", n, n)
dA, dX = d.tangent(A), d.tangent(X)
d.forward(runtime="sqrtm_general")
d.instances(sample, [{"n": 3, "field": "complex"}, {"n": 4, "field": "complex"}, {"n": 4, "field": "real"},
                     {"n": 5, "field": "real"}])

root = d.identity("X X = A", X * X, A)

# ---------------------------------------------------------------- JVP
s = d.differentiate(root, "differentiate: dX X + X dX = dA")
d.set_jvp(dX=d.solve_sylvester(s, dX, X, label="solve X dX + dX X = dA"))

# ---------------------------------------------------------------- VJP
d.derive_vjp()

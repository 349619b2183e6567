"""Principal logarithm ``X = log(A)`` of a general (non-Hermitian) square ``A``, real or complex:
the ``X`` with ``exp(X) = A`` whose eigenvalues have imaginary parts in ``(-pi, pi)``.

Differentiating ``exp(X) = A`` gives ``L_exp[X](dX) = dA`` (the exponential's Fréchet derivative,
the engine's rule for ``exp``); inverting that operator gives ``dX = L_exp[X]^-1(dA)``, which is
the logarithm's Fréchet derivative, and the engine transposes it into ``gA = L_exp[X^H]^-1(gX)``.
The generated code solves with the block logarithm ``log([[A, C], [0, A]])`` on the host (SciPy);
its own derivatives are solves of the same kind and second Fréchet derivatives of ``exp``, so every
order is exact.  Hermitian positive definite ``A`` also has ``funm``'s eigenbasis rule
(``agt.logm``).

References: N. J. Higham, "Functions of Matrices" (2008), ch. 11; A. H. Al-Mohy, N. J. Higham,
S. D. Relton, "Computing the Fréchet derivative of the matrix logarithm and estimating the
condition number", SIAM J. Sci. Comput. 35 (2013).
"""
import numpy as np
import scipy.linalg

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, MatrixExp


def forward(A):
    return {"X": scipy.linalg.logm(A)}


def sample(rng, n, field):
    def randn(*shape):
        z = rng.standard_normal(shape)
        return z + 1j * rng.standard_normal(shape) if field == "complex" else z

    A = randn(n, n) + 2 * np.sqrt(n) * np.eye(n)  # eigenvalues in the right half plane
    dA = randn(n, n)
    base, tangents = fd_tangents(forward, {"A": A}, {"A": dA})
    return {"A": A, "dA": dA, "X": base["X"], "dX": tangents["X"]}


d = Derivation("logm_general", __file__, title="principal logarithm X = log(A) of a general square A",
               references=("Higham, Functions of Matrices (2008), ch. 11",
                           "Al-Mohy, Higham and Relton, SIAM J. Sci. Comput. 35 (2013)"), field="complex")
n = d.dim("n")
A = d.input("A", n, n)
X = d.output("X", n, n)
dA, dX = d.tangent(A), d.tangent(X)
d.forward(runtime="logm_general")
d.instances(sample, [{"n": 3, "field": "complex"}, {"n": 4, "field": "complex"}, {"n": 4, "field": "real"},
                     {"n": 5, "field": "real"}])

definition = d.identity("exp(X) = A", MatrixExp(X), A)

# ---------------------------------------------------------------- JVP
s = d.differentiate(definition, "differentiate: L_exp[X](dX) = dA")
d.set_jvp(dX=d.invert_operator(s, dX, "invert L_exp[X]: dX = L_exp[X]^-1(dA)"))

# ---------------------------------------------------------------- VJP
d.derive_vjp()

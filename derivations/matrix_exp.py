"""Exponential ``X = exp(A)`` of a general square ``A``, real or complex (``torch.linalg.matrix_exp``).

Its differential is the Fréchet derivative, ``dX = L_exp[A](dA)``, the upper right corner of
``exp([[A, dA], [0, A]])`` (Najfeld and Havel 1995; Al-Mohy and Higham 2009): the engine's rule for
the ``exp`` node, so no Padé loop is differentiated.  Transposing gives ``gA = L_exp[A^H](gX)``, the
same corner with ``A^H``.  The generated code evaluates both with the block exponential, whose own
derivatives are exact, so every order is.  Hermitian ``A`` also has ``funm``'s eigenbasis rule
(``agt.expm``).

References: I. Najfeld, T. F. Havel, "Derivatives of the matrix exponential and their computation",
Adv. Appl. Math. 16 (1995); A. H. Al-Mohy, N. J. Higham, SIAM J. Matrix Anal. Appl. 30 (2009).
"""
import numpy as np
import scipy.linalg

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, MatrixExp


def forward(A):
    return {"X": scipy.linalg.expm(A)}


def sample(rng, n, field):
    def randn(*shape):
        z = rng.standard_normal(shape)
        return z + 1j * rng.standard_normal(shape) if field == "complex" else z

    A = randn(n, n) / np.sqrt(n)
    dA = randn(n, n)
    base, tangents = fd_tangents(forward, {"A": A}, {"A": dA})
    return {"A": A, "dA": dA, "X": base["X"], "dX": tangents["X"]}


d = Derivation("matrix_exp", __file__, title="exponential X = exp(A) of a general square A",
               references=("Najfeld and Havel, Adv. Appl. Math. 16 (1995)",
                           "Al-Mohy and Higham, SIAM J. Matrix Anal. Appl. 30 (2009)"), field="complex")
n = d.dim("n")
A = d.input("A", n, n)
X = d.output("X", n, n)
dA, dX = d.tangent(A), d.tangent(X)
d.forward(runtime="matrix_exp")
d.instances(sample, [{"n": 3, "field": "complex"}, {"n": 4, "field": "complex"}, {"n": 4, "field": "real"},
                     {"n": 5, "field": "real"}])

definition = d.identity("X = exp(A)", X, MatrixExp(A))

# ---------------------------------------------------------------- JVP
s = d.differentiate(definition, "differentiate: dX = L_exp[A](dA), the Fréchet derivative")
d.set_jvp(dX=d.solve_for(s, dX))

# ---------------------------------------------------------------- VJP
d.derive_vjp()

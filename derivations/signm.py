"""The matrix sign function ``S = sign(A) = A (A^2)^(-1/2)`` (``scipy.linalg.signm``) of a square
``A`` with no eigenvalue on the imaginary axis, real or complex: ``S^2 = I``, ``A S = S A``, and the
eigenvalues of ``S`` are the signs of the real parts of ``A``'s.

Differentiating ``A S = S A`` gives ``dA S + A dS = dS A + S dA``; times ``S`` on the right, with
``S S = I``: ``dA + A dS S = dS A S + S dA S``.  The term ``A dS S`` (``dS`` between two factors)
goes with the second differentiated identity, ``dS S + S dS = 0`` times ``A``: what remains,
``(A S) dS + dS (A S) = dA - S dA S``, is a Sylvester equation whose coefficient ``A S = (A^2)^(1/2)``
has its eigenvalues in the open right half plane: never singular, whatever the spectrum's gaps
(repeated eigenvalues are no special case).  The engine transposes the solve into the VJP.

The forward is the Schur method with reordering (Higham, §5.2): a ``ValueError`` names an
eigenvalue on the imaginary axis, where SciPy's ``signm`` returns zeros.

References: N. J. Higham, "Functions of Matrices" (2008), ch. 5; C. S. Kenney, A. J. Laub, "The
matrix sign function", IEEE Trans. Automat. Control 40 (1995).
"""
import numpy as np
import scipy.linalg

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Identity


def forward(A):  # the audit's reference: SciPy's, independent of the forward declared below
    return {"S": scipy.linalg.signm(A)}


def sample(rng, n, field):
    def randn(*shape):
        z = rng.standard_normal(shape)
        return z + 1j * rng.standard_normal(shape) if field == "complex" else z

    V = np.eye(n) + 0.3 * randn(n, n)
    signs = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
    A = V @ np.diag(signs * (1 + np.arange(n))) @ np.linalg.inv(V)  # eigenvalues +-1, +-2, ...
    dA = randn(n, n)
    base, tangents = fd_tangents(forward, {"A": A}, {"A": dA})
    return {"A": A, "dA": dA, "S": base["S"], "dS": tangents["S"]}


d = Derivation("signm", __file__, title="matrix sign function S = sign(A)", field="complex",
               references=("Higham, Functions of Matrices (2008), ch. 5", "Kenney and Laub, IEEE TAC 40 (1995)"))
n = d.dim("n")
A = d.input("A", n, n)
S = d.output("S", n, n)
dA, dS = d.tangent(A), d.tangent(S)
d.forward(host="adjointgen.catalogue._forwards:signm")
d.instances(sample, [{"n": 3, "field": "complex"}, {"n": 4, "field": "complex"}, {"n": 4, "field": "real"},
                     {"n": 5, "field": "real"}])

square = d.identity("S S = I", S * S, Identity(n))
commute = d.identity("A S = S A", A * S, S * A)

# ---------------------------------------------------------------- JVP
s = d.differentiate(commute, "differentiate: dA S + A dS = dS A + S dA")
s = d.right_multiply(s, S, "right-multiply by S")
s = d.substitute(s, square, "substitute S S = I: dA + A dS S = dS A S + S dA S")
# eliminate A dS S with the second differentiated identity, dS S + S dS = 0, times A
q = d.left_multiply(d.differentiate(square, "differentiate: dS S + S dS = 0"), A, "left-multiply by A")
s = d.subtract(s, q, "subtract: dA - A S dS = dS A S + S dA S")
d.set_jvp(dS=d.solve_sylvester(s, dS, A * S, label="solve (A S) dS + dS (A S) = dA - S dA S"))

# ---------------------------------------------------------------- VJP
d.derive_vjp()

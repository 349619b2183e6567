"""The Sylvester equation ``A X + X B = Q`` (``scipy.linalg.solve_sylvester``): ``X`` (m×n) for
square ``A`` (m×m), ``B`` (n×n) and ``Q`` (m×n), real or complex, where no eigenvalue of ``A`` is the
negative of one of ``B``.

Differentiating gives ``dA X + A dX + dX B + X dB = dQ``: a Sylvester equation for ``dX`` with the
same operator, ``dX = Syl[A, B](dQ - dA X - X dB)``.  The engine transposes the solve into
``S = Syl[A^H, B^H](gX)`` (one solve for the three input cotangents): ``gQ = S``,
``gA = -S X^H``, ``gB = -X^H S``.  The forward and the backward each take one Bartels-Stewart solve
(Schur forms of both coefficients); a singular equation raises an error naming the eigenvalues
that collide.

References: R. H. Bartels, G. W. Stewart, "Solution of the matrix equation AX + XB = C", Comm. ACM
15 (1972); M. B. Giles, "An extended collection of matrix derivative results", NA-08-01 (2008).
"""
import numpy as np
import scipy.linalg

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation


def forward(A, B, Q):  # the audit's reference: SciPy's, independent of the forward declared below
    return {"X": scipy.linalg.solve_sylvester(A, B, Q)}


def sample(rng, m, n, field):
    def randn(*shape):
        z = rng.standard_normal(shape)
        return z + 1j * rng.standard_normal(shape) if field == "complex" else z

    A = randn(m, m) + 2 * np.sqrt(m) * np.eye(m)  # both spectra in the right half plane: never singular
    B = randn(n, n) + 2 * np.sqrt(n) * np.eye(n)
    Q, dA, dB, dQ = randn(m, n), randn(m, m), randn(n, n), randn(m, n)
    base, tangents = fd_tangents(forward, {"A": A, "B": B, "Q": Q}, {"A": dA, "B": dB, "Q": dQ})
    return {"A": A, "B": B, "Q": Q, "dA": dA, "dB": dB, "dQ": dQ, "X": base["X"], "dX": tangents["X"]}


d = Derivation("solve_sylvester", __file__, title="Sylvester equation A X + X B = Q", field="complex",
               references=("Bartels and Stewart, Comm. ACM 15 (1972)", "Giles, NA-08-01 (2008)"))
m, n = d.dim("m"), d.dim("n")
A = d.input("A", m, m)
B = d.input("B", n, n)
Q = d.input("Q", m, n)
X = d.output("X", m, n)
dA, dB, dQ, dX = d.tangent(A), d.tangent(B), d.tangent(Q), d.tangent(X)
d.forward(host="adjointgen.catalogue._forwards:solve_sylvester")
d.instances(sample, [{"m": 3, "n": 2, "field": "complex"}, {"m": 4, "n": 4, "field": "complex"},
                     {"m": 4, "n": 3, "field": "real"}, {"m": 3, "n": 5, "field": "real"}])

sylvester = d.identity("A X + X B = Q", A * X + X * B, Q)

# ---------------------------------------------------------------- JVP
s = d.differentiate(sylvester, "differentiate: dA X + A dX + dX B + X dB = dQ")
d.set_jvp(dX=d.solve_sylvester(s, dX, A, B, label="solve A dX + dX B = dQ - dA X - X dB"))

# ---------------------------------------------------------------- VJP
d.derive_vjp()

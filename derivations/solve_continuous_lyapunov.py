"""The continuous Lyapunov equation ``A X + X A^H = Q`` (``scipy.linalg.solve_continuous_lyapunov``):
``X`` for square ``A`` and ``Q``, real or complex, where no two eigenvalues of ``A`` satisfy
``a_i + conj(a_j) = 0`` (a stable ``A`` for instance).

Differentiating gives ``dA X + A dX + dX A^H + X dA^H = dQ``: a Sylvester equation for ``dX`` with
the same operator, ``dX = Syl[A, A^H](dQ - dA X - X dA^H)``.  The engine transposes the solve
into ``S = Syl[A^H, A](gX)``: ``gQ = S``, ``gA = -(S X^H + S^H X)``.  The operator ``Syl[A^H, A]``
is its own transpose, so the two solves the transposition writes (on ``gX`` and on ``gX^H``) are
one solve and its transpose in the generated code (:func:`adjointgen.calculus.algebra.share_solves`):
the backward costs one Sylvester solve, as the forward does.  The forward and both solves use one
Schur form of ``A`` each (Bartels-Stewart with ``B = A^H``), and a singular equation raises an
error naming the eigenvalues that collide.

References: R. H. Bartels, G. W. Stewart, "Solution of the matrix equation AX + XB = C", Comm. ACM
15 (1972); M. B. Giles, "An extended collection of matrix derivative results", NA-08-01 (2008).
"""
import numpy as np
import scipy.linalg

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation


def forward(A, Q):  # the audit's reference: SciPy's, independent of the forward declared below
    return {"X": scipy.linalg.solve_continuous_lyapunov(A, Q)}


def sample(rng, n, field):
    def randn(*shape):
        z = rng.standard_normal(shape)
        return z + 1j * rng.standard_normal(shape) if field == "complex" else z

    A = randn(n, n) - 2 * np.sqrt(n) * np.eye(n)  # stable: every a_i + conj(a_j) has a negative real part
    Q, dA, dQ = randn(n, n), randn(n, n), randn(n, n)
    base, tangents = fd_tangents(forward, {"A": A, "Q": Q}, {"A": dA, "Q": dQ})
    return {"A": A, "Q": Q, "dA": dA, "dQ": dQ, "X": base["X"], "dX": tangents["X"]}


d = Derivation("solve_continuous_lyapunov", __file__, title="continuous Lyapunov equation A X + X A^H = Q",
               field="complex", references=("Bartels and Stewart, Comm. ACM 15 (1972)", "Giles, NA-08-01 (2008)"))
n = d.dim("n")
A = d.input("A", n, n)
Q = d.input("Q", n, n)
X = d.output("X", n, n)
dA, dQ, dX = d.tangent(A), d.tangent(Q), d.tangent(X)
d.forward(host="adjointgen.catalogue._forwards:solve_continuous_lyapunov")
d.instances(sample, [{"n": 3, "field": "complex"}, {"n": 4, "field": "complex"}, {"n": 4, "field": "real"},
                     {"n": 5, "field": "real"}])

lyapunov = d.identity("A X + X A^H = Q", A * X + X * A.T, Q)

# ---------------------------------------------------------------- JVP
s = d.differentiate(lyapunov, "differentiate: dA X + A dX + dX A^H + X dA^H = dQ")
d.set_jvp(dX=d.solve_sylvester(s, dX, A, A.T, label="solve A dX + dX A^H = dQ - dA X - X dA^H"))

# ---------------------------------------------------------------- VJP
d.derive_vjp()

"""Sign and log-absolute determinant ``(sign, logabsdet) = slogdet(A)`` of a real invertible A
(``torch.linalg.slogdet``'s outputs and conventions).

``logabsdet = log|det A|`` is the defining identity; the engine differentiates it by Jacobi's
formula, ``d log|det A| = tr(A^-1 dA)``.  Transposing under ``<X, Y> = tr(X^T Y)`` with a scalar
cotangent ``g`` gives ``gA = g A^-T``: one solve with the LU factors of the forward.  ``sign`` is
piecewise constant (its derivative is zero wherever ``det A != 0``).

References: M. Giles, NA-08-01 (2008); J. R. Magnus, H. Neudecker, "Matrix Differential Calculus
with Applications in Statistics and Econometrics" (3rd ed., 2019), ch. 8.
"""
import numpy as np

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, LogAbsDet


def forward(A):
    sign, logabsdet = np.linalg.slogdet(A)
    return {"sign": np.array([[sign]]), "logabsdet": np.array([[logabsdet]])}


def sample(rng, n):
    A = rng.standard_normal((n, n)) + 2 * np.sqrt(n) * np.eye(n)  # well conditioned
    A[[0, 1]] = A[[1, 0]]  # a negative determinant: the sign matters
    dA = rng.standard_normal((n, n))
    base, tangents = fd_tangents(forward, {"A": A}, {"A": dA})
    return {"A": A, "dA": dA, "sign": base["sign"], "logabsdet": base["logabsdet"],
            "dlogabsdet": tangents["logabsdet"]}


d = Derivation("slogdet", __file__, title="sign and log-absolute determinant of a square matrix",
               references=("Giles, NA-08-01 (2008)", "Magnus and Neudecker (2019), ch. 8"))
n = d.dim("n")
A = d.input("A", n, n)
sign = d.output("sign", 1, 1, constant=True)
logabsdet = d.output("logabsdet", 1, 1)
dlogabsdet = d.tangent(logabsdet)
d.api_outputs("sign", "logabsdet")
d.forward(torch="adjointgen.runtime.forward:slogdet", numpy="xp.linalg.slogdet", saves={"A": "lu"})
d.instances(sample, [{"n": 3}, {"n": 4}, {"n": 5}])
d.symbolic_sizes = {"n": 2}

definition = d.identity("logabsdet = log|det A|", logabsdet, LogAbsDet(A))

# ---------------------------------------------------------------- JVP
s = d.differentiate(definition, "differentiate (Jacobi's formula): dlogabsdet = tr(A^-1 dA)")
d.set_jvp(dlogabsdet=d.solve_for(s, dlogabsdet))

# ---------------------------------------------------------------- VJP
d.derive_vjp()

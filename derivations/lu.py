"""LU factorization with partial pivoting ``A = P L U`` of a square ``A`` (``torch.linalg.lu``'s
outputs and conventions): ``P`` a permutation, ``L`` unit lower triangular, ``U`` upper triangular;
real or complex.

``P`` is piecewise constant (a permutation changes only where two pivot candidates tie), so it is
an output without a tangent.  Differentiating gives ``dA = P (dL U + L dU)``; multiplying by
``P^T`` (``P^T P = I``), by ``L^-1`` on the left and ``U^-1`` on the right leaves
``L^-1 P^T dA U^-1 = dF + dE`` with ``dF = L^-1 dL`` strictly lower triangular (a product of unit
lower triangular factors' tangent) and ``dE = dU U^-1`` upper triangular.  The strictly lower part
gives ``dF``, the rest ``dE``; the engine transposes that JVP into the VJP.  Tall and wide ``A``
reduce to this square rule (``adjointgen.composite.lu``).

References: S. P. Walter, L. Lehmann, "Algorithmic differentiation of linear algebra functions with
application in optimum experimental design" (2018); M. Seeger et al., arXiv:1710.08717 (2017).
"""
import numpy as np
import scipy.linalg

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Identity, Inverse


# ---------------------------------------------------------------- numeric instances for the audit
def forward(A):
    P, L, U = scipy.linalg.lu(A)
    return {"P": P.astype(A.dtype), "L": L, "U": U}


def sample(rng, n, field):
    """A random A (its pivots well away from ties, so P is locally constant), a direction dA, and
    dL, dU by finite differences."""
    def randn(*shape):
        z = rng.standard_normal(shape)
        return z + 1j * rng.standard_normal(shape) if field == "complex" else z

    A = randn(n, n)
    dA = randn(n, n)
    base, tangents = fd_tangents(forward, {"A": A}, {"A": dA})
    return {"A": A, "dA": dA, "P": base["P"], "L": base["L"], "U": base["U"], "dL": tangents["L"],
            "dU": tangents["U"]}


# ---------------------------------------------------------------- declarations
d = Derivation("lu", __file__, title="LU factorization with partial pivoting A = P L U (square A)",
               references=("Walter and Lehmann (2018)", "Seeger et al., arXiv:1710.08717 (2017)"), field="complex")
n = d.dim("n")
A = d.input("A", n, n)
P = d.output("P", n, n, constant=True, orthonormal=True)  # a permutation: no tangent
L = d.output("L", n, n, lower=True, unit_diagonal=True)
U = d.output("U", n, n, upper=True)
d.api_outputs("P", "L", "U")
dA, dL, dU = d.tangent(A), d.tangent(L), d.tangent(U)
d.forward(runtime="lu")
d.instances(sample, [{"n": 3, "field": "complex"}, {"n": 4, "field": "complex"}, {"n": 4, "field": "real"},
                     {"n": 6, "field": "real"}])

lu = d.identity("A = P L U", A, P * L * U)
perm = d.identity("P^T P = I", P.T * P, Identity(n))

# ---------------------------------------------------------------- JVP
s = d.differentiate(lu, "differentiate (P piecewise constant): dA = P dL U + P L dU")
s = d.left_multiply(s, P.T, "left-multiply by P^T")
s = d.substitute(s, perm, "substitute P^T P = I")
s = d.left_multiply(s, Inverse(L), "left-multiply by L^-1")
s = d.right_multiply(s, Inverse(U), "right-multiply by U^-1")
dF = d.introduce("dF", Inverse(L) * dL, lower=True)
dE = d.introduce("dE", dU * Inverse(U), upper=True)
s = d.use_definition(d.use_definition(s, dF), dE)  # L^-1 P^T dA U^-1 = dF + dE
low = d.strictly_lower_part(s, "strictly lower part: tril₋(dE) = 0 for the upper triangular dE")
dF_sol = d.solve_for(low, dF)
dE_sol = d.replace(d.solve_for(s, dE), dF_sol)
back_L = d.left_multiply(d.identity("definition of dF", dF, Inverse(L) * dL), L, "left-multiply dF = L^-1 dL by L")
back_U = d.right_multiply(d.identity("definition of dE", dE, dU * Inverse(U)), U, "right-multiply dE = dU U^-1 by U")
d.set_jvp(dL=d.replace(d.solve_for(back_L, dL), dF_sol), dU=d.replace(d.solve_for(back_U, dU), dE_sol))

# ---------------------------------------------------------------- VJP
d.derive_vjp()

"""LDL^H factorization without pivoting ``A = L D L^H``: ``A`` Hermitian (symmetric) with nonzero
leading principal minors, ``L`` unit lower triangular, ``D`` real diagonal (returned as the vector
``d``); real or complex.  ``A`` need not be definite: quasi-definite matrices (the KKT systems of
interior-point methods) and any other ``A`` whose pivots are nonzero factor too.  It is the
square-root-free Cholesky factorization for positive definite ``A`` (``L_chol = L D^(1/2)``).

Differentiating gives ``dA = dL D L^H + L dD L^H + L D dL^H``.  Multiplying by ``L^-1`` on the left
and ``L^-H`` on the right leaves ``L^-1 dA L^-H = dF D + dD + D dF^H`` with ``dF = L^-1 dL`` strictly
lower triangular (``L`` has a unit diagonal).  The strictly lower part of the right side is
``dF D`` alone, its diagonal ``dD`` alone: so ``dF = tril₋(L^-1 dA L^-H) D^-1`` and
``dD = diag(L^-1 dA L^-H)``, then ``dL = L dF``; the engine transposes that JVP into the VJP.

References: S. P. Walter, L. Lehmann, "Algorithmic differentiation of linear algebra functions with
application in optimum experimental design" (2018); G. H. Golub, C. F. Van Loan, Matrix
Computations, 4th ed., §4.1 (the LDL^T factorization).
"""
import numpy as np

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Inverse


# ---------------------------------------------------------------- numeric instances for the audit
def forward(A):
    from adjointgen.catalogue._forwards import ldl

    L, w = ldl(A)
    return {"L": L, "D": np.diag(w)}


def sample(rng, n, field):
    """An indefinite Hermitian ``A = L0 D0 L0^H`` (pivots of both signs, ``|d| >= 1``), a Hermitian
    direction dA, and dL, dD by finite differences."""
    def randn(*shape):
        x = rng.standard_normal(shape)
        return x + 1j * rng.standard_normal(shape) if field == "complex" else x

    L0 = np.eye(n) + np.tril(0.5 * randn(n, n), -1)
    d0 = rng.uniform(1, 3, n) * np.where(np.arange(n) % 2, -1, 1)
    A = (L0 * d0) @ L0.conj().T
    A = (A + A.conj().T) / 2
    dA = randn(n, n)
    dA = (dA + dA.conj().T) / 2
    base, tangents = fd_tangents(forward, {"A": A}, {"A": dA})
    return {"A": A, "dA": dA, "L": base["L"], "D": base["D"], "dL": tangents["L"], "dD": tangents["D"]}


# ---------------------------------------------------------------- declarations
d = Derivation("ldl", __file__, title="LDL^H factorization A = L D L^H without pivoting (L unit lower triangular)",
               references=("Walter and Lehmann (2018)", "Golub and Van Loan, Matrix Computations §4.1"), field="complex")
n = d.dim("n")
A = d.input("A", n, n, symmetric=True)
L = d.output("L", n, n, lower=True, unit_diagonal=True)
D = d.output("D", n, n, diagonal=True, api="d")
d.api_outputs("L", "d")
dA, dL, dD = d.tangent(A), d.tangent(L), d.tangent(D)
d.forward(host="adjointgen.catalogue._forwards:ldl")
d.instances(sample, [{"n": 3, "field": "complex"}, {"n": 4, "field": "complex"}, {"n": 4, "field": "real"},
                     {"n": 6, "field": "real"}])

factorization = d.identity("A = L D L^T", A, L * D * L.T)

# ---------------------------------------------------------------- JVP
s = d.differentiate(factorization, "differentiate: dA = dL D L^T + L dD L^T + L D dL^T")
s = d.left_multiply(s, Inverse(L), "left-multiply by L^-1")
s = d.right_multiply(s, Inverse(L.T), "right-multiply by L^-T")
dF = d.introduce("dF", Inverse(L) * dL, lower=True)
s = d.use_definition(s, dF)  # L^-1 dA L^-T = dF D + dD + D dF^T
low = d.strictly_lower_part(s, "strictly lower part: tril₋(dD + D dF^T) = 0, tril₋(dF D) = dF D")
low = d.right_multiply(low, Inverse(D), "right-multiply by D^-1")
dF_sol = d.solve_for(low, dF)
diagonal = d.diagonal_part(s, "diagonal part: diag(dF D) = diag(D dF^T) = 0 for the strictly lower dF")
dD_sol = d.solve_for(d.hermitian_part(diagonal, "Hermitian part (dD real)"), dD)
back = d.left_multiply(d.identity("definition of dF", dF, Inverse(L) * dL), L, "left-multiply dF = L^-1 dL by L")
d.set_jvp(dL=d.replace(d.solve_for(back, dL), dF_sol), dD=dD_sol)

# ---------------------------------------------------------------- VJP
d.derive_vjp()

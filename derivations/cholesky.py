"""Cholesky factorization ``A = L L^T``: A symmetric positive definite, L lower triangular with a
positive diagonal (``torch.linalg.cholesky``'s lower factor).

Differentiating gives ``dA = dL L^T + L dL^T``.  Multiplying by ``L^-1`` on the left and ``L^-T``
on the right leaves ``L^-1 dA L^-T = dC + dC^T`` with ``dC = L^-1 dL`` lower triangular (a product
of lower triangular factors).  The projection ``Φ`` onto the lower triangle with the diagonal halved
gives ``Φ(dC + dC^T) = dC``, hence ``dL = L Φ(L^-1 dA L^-T)``; the VJP follows by transposition
(``Φ`` is self-adjoint, as the engine shows), projected onto symmetric matrices.

References: I. Murray, "Differentiation of the Cholesky decomposition", arXiv:1602.07527 (2016);
M. Seeger et al., "Auto-differentiating linear algebra", arXiv:1710.08717 (2017).
"""
import numpy as np

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Inverse


# ---------------------------------------------------------------- numeric instances for the audit
def forward(A):
    return {"L": np.linalg.cholesky(A)}


def sample(rng, n, field):
    """A random SPD A (condition ~10), a symmetric direction dA, and dL by finite differences."""
    def randn(*shape):
        x = rng.standard_normal(shape)
        return x + 1j * rng.standard_normal(shape) if field == "complex" else x

    Q, _ = np.linalg.qr(randn(n, n))
    A = (Q * rng.uniform(1, 10, n)) @ Q.conj().T
    A = (A + A.conj().T) / 2
    dA = randn(n, n)
    dA = (dA + dA.conj().T) / 2
    base, tangents = fd_tangents(forward, {"A": A}, {"A": dA})
    return {"A": A, "dA": dA, "L": base["L"], "dL": tangents["L"]}


# ---------------------------------------------------------------- declarations
d = Derivation("cholesky", __file__, title="Cholesky factorization A = L L^T (L lower triangular)",
               references=("Murray, arXiv:1602.07527 (2016)", "Seeger et al., arXiv:1710.08717 (2017)"), field="complex")
n = d.dim("n")
A = d.input("A", n, n, positive_definite=True)
L = d.output("L", n, n, lower=True, real_diagonal=True)  # positive diagonal, real for complex A too
dA, dL = d.tangent(A), d.tangent(L)
d.forward(runtime="cholesky", checked=("positive_definite",))
d.instances(sample, [{"n": 3, "field": "complex"}, {"n": 4, "field": "complex"}, {"n": 4, "field": "real"},
                     {"n": 6, "field": "real"}])

chol = d.identity("A = L L^T", A, L * L.T)

# ---------------------------------------------------------------- JVP
s = d.differentiate(chol, "differentiate: dA = dL L^T + L dL^T")
s = d.left_multiply(s, Inverse(L), "left-multiply by L^-1")
s = d.right_multiply(s, Inverse(L.T), "right-multiply by L^-T")
dC = d.introduce("dC", Inverse(L) * dL, lower=True)
s = d.use_definition(s, dC)  # L^-1 dA L^-T = dC + dC^T
s = d.lower_half(s, "apply Φ: Φ(dC + dC^T) = dC for a lower triangular dC")
dC_sol = d.solve_for(s, dC)
back = d.left_multiply(d.identity("definition of dC", dC, Inverse(L) * dL), L, "left-multiply dC = L^-1 dL by L")
dL_sol = d.replace(d.solve_for(back, dL), dC_sol)
d.set_jvp(dL=dL_sol)

# ---------------------------------------------------------------- VJP
d.derive_vjp()

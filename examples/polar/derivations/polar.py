"""The polar decomposition ``A = U P`` of a nonsingular square ``A``: ``U`` unitary (orthogonal),
``P`` Hermitian (symmetric) positive definite.

Differentiating ``A = U P`` and multiplying by ``U^T`` gives ``U^T dA = dO P + dP`` with the skew
``dO = U^T dU``.  Its transpose is ``dA^T U = -P dO + dP``; the difference eliminates ``dP`` and
leaves the Sylvester (Lyapunov) equation ``P dO + dO P = U^T dA - dA^T U``, solved in ``P``'s
eigenbasis (``1 / (p_i + p_j)``: never singular, so no gauge and no degeneracy enters).  Then
``dU = U dO`` and ``dP = U^T dA - dO P``; the engine transposes that JVP into the VJP, the
Sylvester solve into its adjoint.  ``adjointgen audit polar`` prints every step.

References: N. J. Higham, "Functions of Matrices" (2008), ch. 8.
"""
import numpy as np

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Identity


# ---------------------------------------------------------------- numeric instances for the audit
def forward(A):
    W, s, Vh = np.linalg.svd(A)
    return {"U": W @ Vh, "P": (Vh.conj().T * s) @ Vh}


def sample(rng, n, field):
    def randn(*shape):
        z = rng.standard_normal(shape)
        return z + 1j * rng.standard_normal(shape) if field == "complex" else z

    A = randn(n, n) + 2 * np.sqrt(n) * np.eye(n)  # well conditioned: singular values away from 0
    dA = randn(n, n)
    base, tangents = fd_tangents(forward, {"A": A}, {"A": dA})
    return {"A": A, "dA": dA, "U": base["U"], "P": base["P"], "dU": tangents["U"], "dP": tangents["P"]}


# ---------------------------------------------------------------- declarations
d = Derivation("polar", __file__, title="polar decomposition A = U P", field="complex",
               references=("Higham, Functions of Matrices (2008), ch. 8",))
n = d.dim("n")
A = d.input("A", n, n)
U = d.output("U", n, n, orthonormal=True)
P = d.output("P", n, n, symmetric=True)
dA, dU, dP = d.tangent(A), d.tangent(U), d.tangent(P)
d.forward(torch="polar_layer.ops:polar", numpy="polar_layer.ops:polar_numpy")
d.instances(sample, [{"n": 3, "field": "complex"}, {"n": 4, "field": "complex"}, {"n": 4, "field": "real"},
                     {"n": 5, "field": "real"}])

polar = d.identity("A = U P", A, U * P)
orth = d.identity("U^T U = I", U.T * U, Identity(n))

# ---------------------------------------------------------------- JVP
s = d.differentiate(polar, "differentiate: dA = dU P + U dP")
s = d.left_multiply(s, U.T, "left-multiply by U^T")
s = d.substitute(s, orth, "substitute U^T U = I")
dO = d.introduce("dO", U.T * dU, skew_by=d.differentiate(orth, "differentiate U^T U = I"))
s = d.use_definition(s, dO)                                   # U^T dA = dO P + dP
t = d.transpose(s, "transpose (P and dP symmetric, dO skew)")  # dA^T U = -P dO + dP
r = d.subtract(s, t, "subtract: U^T dA - dA^T U = dO P + P dO")
dO_sol = d.solve_sylvester(r, dO, P, label="solve P dO + dO P = U^T dA - dA^T U")
dP_sol = d.replace(d.solve_for(s, dP), dO_sol, "substitute dO")
dU_sol = d.replace(d.invert_definition(dO, dU), dO_sol, "substitute dO")
d.set_jvp(dU=dU_sol, dP=dP_sol)

# ---------------------------------------------------------------- VJP
d.derive_vjp()

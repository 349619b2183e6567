"""The polar decomposition ``A = U P`` derived by two routes, as a user might write it: the
Lyapunov route (``P dO + dO P = U^T dA - dA^T U`` with the skew ``dO = U^T dU``) and the route
through ``P^2 = A^T A`` (``P dP + dP P = dA^T A + A^T dA``, then ``dU = (dA - U dP) P^-1``), whose
rules are the ones generated.  The test of issue 47: every step verified, none numeric only."""
import numpy as np

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Identity, Inverse


def forward(A):
    W, s, Vh = np.linalg.svd(A)
    return {"U": W @ Vh, "P": (Vh.conj().T * s) @ Vh}


def sample(rng, n, field):
    def randn(*shape):
        z = rng.standard_normal(shape)
        return z + 1j * rng.standard_normal(shape) if field == "complex" else z

    A = randn(n, n) + 2 * np.sqrt(n) * np.eye(n)
    dA = randn(n, n)
    base, tangents = fd_tangents(forward, {"A": A}, {"A": dA})
    return {"A": A, "dA": dA, "U": base["U"], "P": base["P"], "dU": tangents["U"], "dP": tangents["P"]}


d = Derivation("polar_routes", __file__, title="polar decomposition A = U P, two routes", field="complex")
n = d.dim("n")
A = d.input("A", n, n)
U = d.output("U", n, n, orthonormal=True)
P = d.output("P", n, n, symmetric=True)
dA, dU, dP = d.tangent(A), d.tangent(U), d.tangent(P)
d.forward(torch="polar_ops:polar", numpy="polar_ops:polar_numpy")
d.instances(sample, [{"n": 3, "field": "complex"}, {"n": 4, "field": "complex"}, {"n": 4, "field": "real"}])

polar = d.identity("A = U P", A, U * P)
orth = d.identity("U^T U = I", U.T * U, Identity(n))
complete = d.identity("U U^T = I (U square)", U * U.T, Identity(n))

# ---- route 1: the skew dO = U^T dU and a Lyapunov equation
s = d.differentiate(polar, "differentiate: dA = dU P + U dP")
s = d.left_multiply(s, U.T, "left-multiply by U^T")
s = d.substitute(s, orth, "substitute U^T U = I")
dO = d.introduce("dO", U.T * dU, skew_by=d.differentiate(orth, "differentiate U^T U = I"))
s1 = d.use_definition(s, dO)
t = d.transpose(s1, "transpose (P and dP symmetric, dO skew)")
r = d.subtract(s1, t, "subtract: U^T dA - dA^T U = dO P + P dO")
dO_sol = d.solve_sylvester(r, dO, P, label="solve P dO + dO P = U^T dA - dA^T U")
dP_1 = d.replace(d.solve_for(s1, dP), dO_sol, "route 1: substitute dO into dP")
dU_1 = d.replace(d.invert_definition(dO, dU), dO_sol, "route 1: substitute dO into dU")

# ---- route 2: P^2 = A^T A
gram = d.identity("P P = A^T A", P * P, A.T * A)
g = d.differentiate(gram, "differentiate: dP P + P dP = dA^T A + A^T dA")
dP_2 = d.solve_sylvester(g, dP, P, label="solve P dP + dP P = dA^T A + A^T dA")
u = d.right_multiply(s, Inverse(P), "right-multiply U^T dA = U^T dU P + dP by P^-1")
u = d.left_multiply(u, U, "left-multiply by U")
u = d.substitute(u, complete, "substitute U U^T = I: dA P^-1 = dU + U dP P^-1")
dU_2 = d.solve_for(u, dU, "solve for dU")
dU_2 = d.replace(dU_2, dP_2, "route 2: substitute dP into dU")

# both routes at once: the difference of the two dP vanishes (each checked against the instances)
both = d.subtract(dP_2, dP_1, "the two routes' dP agree")
both = d.subtract(dU_2, dU_1, "the two routes' dU agree")
# route 2's dP is Hermitian, and route 2's dU keeps U unitary (U^T dU is skew)
sym = d.subtract(dP_2, d.transpose(dP_2, "transpose dP"), "dP - dP^T")
w = d.left_multiply(dU_2, U.T, "left-multiply route 2's dU by U^T")
w = d.substitute(w, orth, "substitute U^T U = I: U^T dU")
w = d.add(w, d.transpose(w, "transpose"), label="U^T dU + dU^T U")

d.set_jvp(dU=dU_2, dP=dP_2)
d.derive_vjp()

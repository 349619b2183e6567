"""The polar decomposition ``A = U P`` of an m×n ``A``, ``m >= n`` (``scipy.linalg.polar``,
``side="right"``): ``U`` with orthonormal columns (unitary for square ``A``), ``P = (A^H A)^(1/2)``
Hermitian positive definite for full-rank ``A``; real or complex.

Differentiating ``A = U P`` and multiplying by ``U^T`` gives ``U^T dA = dO P + dP`` with the skew
(anti-Hermitian) ``dO = U^T dU``.  Its transpose is ``dA^T U = -P dO + dP``; the difference
eliminates ``dP`` and leaves the Sylvester (Lyapunov) equation ``P dO + dO P = U^T dA - dA^T U``,
solved in ``P``'s eigenbasis: it divides by ``p_i + p_j > 0``, never by a gap, so repeated singular
values (an orthogonal ``A``, where ``P = I``) are no special case, to every order.  Then
``dP = U^T dA - dO P``.  The part of ``dU`` outside span(U) is ``W = (I - U U^T) dA P^-1`` (zero
for square ``A``: :meth:`square_variants`).  The engine transposes the JVP into the VJP, the
Sylvester solve into its adjoint.

The tutorial (``docs/tutorial.md``) derives the square case step by step.  ``side="left"``
(``A = P U``) and wide ``A`` (a singular ``P``) are this decomposition of ``A^H`` conjugate-transposed,
or ``P = U^H A`` (``A U^H``): the public function composes them from the derived one
(``d.extend``, :func:`adjointgen.catalogue._extensions.polar`), so their derivatives are these
rules' composed.

References: N. J. Higham, "Functions of Matrices" (2008), ch. 8.
"""
import numpy as np
import scipy.linalg

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Identity, Inverse


# ---------------------------------------------------------------- numeric instances for the audit
def forward(A):
    U, P = scipy.linalg.polar(A)
    return {"U": U, "P": P}


def sample(rng, m, n, field):
    def randn(*shape):
        z = rng.standard_normal(shape)
        return z + 1j * rng.standard_normal(shape) if field == "complex" else z

    A = randn(m, n) + 2 * np.sqrt(m) * np.eye(m, n)  # full rank: singular values away from 0
    dA = randn(m, n)
    base, tangents = fd_tangents(forward, {"A": A}, {"A": dA})
    return {"A": A, "dA": dA, "U": base["U"], "P": base["P"], "dU": tangents["U"], "dP": tangents["P"]}


# ---------------------------------------------------------------- declarations
d = Derivation("polar", __file__, title="polar decomposition A = U P (m >= n, U orthonormal columns, P = (A^H A)^(1/2))",
               field="complex", references=("Higham, Functions of Matrices (2008), ch. 8",))
m, n = d.dim("m"), d.dim("n")
A = d.input("A", m, n)
U = d.output("U", m, n, orthonormal=True)
P = d.output("P", n, n, symmetric=True)
d.api_outputs("U", "P")
dA, dU, dP = d.tangent(A), d.tangent(U), d.tangent(P)
d.forward(host="adjointgen.catalogue._forwards:polar")
d.extend("adjointgen.catalogue._extensions:polar", options={"side": "right"})  # side="left", wide A
d.instances(sample, [{"m": 3, "n": 3, "field": "complex"}, {"m": 5, "n": 3, "field": "complex"},
                     {"m": 4, "n": 4, "field": "real"}, {"m": 5, "n": 3, "field": "real"}])

polar = d.identity("A = U P", A, U * P)
orth = d.identity("U^T U = I", U.T * U, Identity(n))

# ---------------------------------------------------------------- inside span(U)
s = d.differentiate(polar, "differentiate: dA = dU P + U dP")
p = d.left_multiply(s, U.T, "left-multiply by U^T")
p = d.substitute(p, orth, "substitute U^T U = I")
dO = d.introduce("dO", U.T * dU, skew_by=d.differentiate(orth, "differentiate U^T U = I"))
p = d.use_definition(p, dO)                                   # U^T dA = dO P + dP
t = d.transpose(p, "transpose (P and dP symmetric, dO skew)")  # dA^T U = -P dO + dP
r = d.subtract(p, t, "subtract: U^T dA - dA^T U = dO P + P dO")
dO_sol = d.solve_sylvester(r, dO, P, label="solve P dO + dO P = U^T dA - dA^T U")
dP_sol = d.replace(d.solve_for(p, dP), dO_sol, "substitute dO")

# ---------------------------------------------------------------- outside span(U): W = (I - U U^T) dU
W = d.introduce("W", dU - U * dO)
w_def = d.identity("definition of W", W, dU - U * dO)
w = d.replace(s, d.solve_for(w_def, dU), "substitute dU = U dO + W")
w = d.left_multiply(w, Identity(m) - U * U.T, "project with I - U U^T")
w = d.substitute(w, orth, "substitute U^T U = I")
w_perp = d.use_definition(d.substitute(d.left_multiply(w_def, U.T, "U^T W"), orth, "substitute U^T U = I"), dO,
                          "substitute dO = U^T dU: U^T W = 0")
w = d.substitute(w, w_perp, "substitute U^T W = 0")
w = d.right_multiply(w, Inverse(P), "right-multiply by P^-1")
W_sol = d.solve_for(w, W)
dU_sol = d.replace(d.replace(d.solve_for(w_def, dU), W_sol), dO_sol)
d.set_jvp(dU=dU_sol, dP=dP_sol)

# ---------------------------------------------------------------- VJP
d.derive_vjp()

# ---------------------------------------------------------------- square U
# U U^T = I where m = n: the complement term (I - U U^T) dA P^-1 vanishes
d.square_variants(U)

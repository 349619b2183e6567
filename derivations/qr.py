"""Reduced QR factorization ``A = Q R`` of a tall (or square) A: m×n, m ≥ n, Q m×n with
orthonormal columns, R n×n upper triangular (LAPACK's signs, as ``torch.linalg.qr``), real or
complex; R's diagonal is real (LAPACK's Householder reflections make it so).

The derivation runs over complex matrices (``^T`` is the conjugate transpose); the engine also
specialises the rules to real data.  Differentiating gives ``dA = dQ R + Q dR``.  Projected onto
span(Q) and multiplied by ``R^-1``: ``Q^T dA R^-1 = dC + dE`` with ``dC = Q^T dQ`` skew
(anti-Hermitian) and ``dE = dR R^-1`` upper triangular with a real diagonal.  Their strictly lower
parts separate them: ``tril₋(Q^T dA R^-1) = tril₋(dC)``; on the diagonal the anti-Hermitian part
leaves ``diag(dC)`` alone (zero for real data).  A skew ``dC`` is
``tril₋(dC) - tril₋(dC)^T + diag(dC)``.  Then ``dR = (Q^T dA R^-1 - dC) R``; the part of ``dQ``
outside span(Q) is ``(I - Q Q^T) dA R^-1`` (zero for square A).  The VJP follows by transposition.
Wide matrices (m < n) are handled by the public function: ``A = [X | Y]``, ``(Q, R_X) = qr(X)``,
``R = [R_X | Q^H Y]``.

References: S. F. Walter, L. Lehmann, "Algorithmic differentiation of linear algebra functions
with application in optimum experimental design" (2018); D. A. Roberts, L. R. Roberts, "QR and LQ
decomposition matrix backpropagation algorithms for square, wide, and deep matrices and their
software implementation", arXiv:2009.10071 (2020).
"""
import numpy as np

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, DiagPart, Identity, Inverse, StrictlyLower


# ---------------------------------------------------------------- numeric instances for the audit
def forward(A):
    Q, R = np.linalg.qr(A)
    return {"Q": Q, "R": R}


def sample(rng, m, n, field):
    def randn(*shape):
        x = rng.standard_normal(shape)
        return x + 1j * rng.standard_normal(shape) if field == "complex" else x

    A = randn(m, n) + np.eye(m, n) * np.sqrt(m)  # well conditioned
    dA = randn(m, n)
    base, tangents = fd_tangents(forward, {"A": A}, {"A": dA})  # the signs of R's diagonal are locally fixed
    return {"A": A, "dA": dA, "Q": base["Q"], "R": base["R"], "dQ": tangents["Q"], "dR": tangents["R"]}


# ---------------------------------------------------------------- declarations
d = Derivation("qr", __file__, title="reduced QR factorization A = Q R (m >= n, R upper triangular)",
               references=("Walter and Lehmann (2018)", "Roberts and Roberts, arXiv:2009.10071 (2020)"), field="complex")
m, n = d.dim("m"), d.dim("n")
A = d.input("A", m, n)
Q = d.output("Q", m, n, orthonormal=True)
R = d.output("R", n, n, upper=True, real_diagonal=True)  # LAPACK's R has a real diagonal
d.api_outputs("Q", "R")
dA, dQ, dR = d.tangent(A), d.tangent(Q), d.tangent(R)
d.forward(runtime="qr")
d.instances(sample, [{"m": 5, "n": 3, "field": "complex"}, {"m": 4, "n": 4, "field": "complex"},
                     {"m": 5, "n": 3, "field": "real"}, {"m": 4, "n": 4, "field": "real"}, {"m": 6, "n": 2, "field": "real"}])
d.symbolic_sizes = {"m": 3, "n": 2}

qr = d.identity("A = Q R", A, Q * R)
orth = d.identity("Q^T Q = I", Q.T * Q, Identity(n))

# ---------------------------------------------------------------- inside span(Q)
s = d.differentiate(qr, "differentiate: dA = dQ R + Q dR")
p = d.left_multiply(s, Q.T, "left-multiply by Q^T")
p = d.substitute(p, orth, "substitute Q^T Q = I")
p = d.right_multiply(p, Inverse(R), "right-multiply by R^-1")
dC = d.introduce("dC", Q.T * dQ, skew_by=d.differentiate(orth, "differentiate Q^T Q = I"))
dE = d.introduce("dE", dR * Inverse(R), upper=True)
p = d.use_definition(d.use_definition(p, dC), dE)  # Q^T dA R^-1 = dC + dE
low = d.strictly_lower_part(p, "strictly lower part: tril₋(dE) = 0 for the upper triangular dE")
# the diagonal: dC's is imaginary (anti-Hermitian dC), dE's real (R has a real diagonal)
dg = d.antihermitian_part(d.diagonal_part(p, "diagonal part: diag(Q^T dA R^-1) = diag(dC) + diag(dE)"),
                          "anti-Hermitian part: the real diag(dE) drops out")
dC_sol = d.skew_from_lower(d.solve_for(low, StrictlyLower(dC)), dC, diagonal=d.solve_for(dg, DiagPart(dC)))
dE_sol = d.replace(d.solve_for(p, dE), dC_sol)
back = d.right_multiply(d.identity("definition of dE", dE, dR * Inverse(R)), R, "right-multiply dE = dR R^-1 by R")
dR_sol = d.replace(d.solve_for(back, dR), dE_sol)

# ---------------------------------------------------------------- outside span(Q): W = (I - Q Q^T) dQ
W = d.introduce("W", dQ - Q * dC)
w_def = d.identity("definition of W", W, dQ - Q * dC)
w = d.replace(s, d.solve_for(w_def, dQ), "substitute dQ = Q dC + W")
w = d.left_multiply(w, Identity(m) - Q * Q.T, "project with I - Q Q^T")
w = d.substitute(w, orth, "substitute Q^T Q = I")
w_perp = d.use_definition(d.substitute(d.left_multiply(w_def, Q.T, "Q^T W"), orth, "substitute Q^T Q = I"), dC,
                          "substitute dC = Q^T dQ: Q^T W = 0")
w = d.substitute(w, w_perp, "substitute Q^T W = 0")
w = d.right_multiply(w, Inverse(R), "right-multiply by R^-1")
W_sol = d.solve_for(w, W)
dQ_sol = d.replace(d.replace(d.solve_for(w_def, dQ), W_sol), dC_sol)
d.set_jvp(dQ=dQ_sol, dR=dR_sol)

# ---------------------------------------------------------------- VJP
d.derive_vjp()

# ---------------------------------------------------------------- square Q
# Q Q^T = I where m = n: the complement term (I - Q Q^T) dA R^-1 vanishes
d.square_variants(Q)

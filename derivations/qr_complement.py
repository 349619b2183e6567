"""The extra columns of a complete QR factorization (``mode="complete"``): ``Q2`` (m×p, p = m - n)
spans the orthogonal complement of span(Q) in ``A = Q R`` of a tall A (m > n), real or complex
(``^T`` below is the conjugate transpose; the engine also specialises the rule to real data).

As for the SVD's (``derivations/svd_complement.py``), ``Q2`` is any orthonormal basis of that
complement, so only its span is defined: the rotation ``Q2 -> Q2 exp(Ω)`` (Ω anti-Hermitian) is a
gauge, with the residual ``skew(Q2^T gQ2)`` that a loss of the span makes zero.  With the gauge
``Q2^T dQ2 = 0``, ``[Q Q2]`` square and ``Q^T Q2 = 0`` give ``dQ2 = -Q dQ^T Q2``, and projecting
``dA = dQ R + Q dR`` onto the complement gives ``Q2^T dQ = Q2^T dA R^-1``, so
``dQ2 = -Q R^-T dA^T Q2``.  (LAPACK's complete Q, JAX's, is one particular basis, its Householder
vectors'; this rule differentiates the span, the same for every basis.)

References: MATH.md §4 and §7 (full_matrices, QR); Walter and Lehmann (2018).
"""
import numpy as np

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Identity, Inverse, ZeroMatrix


# ---------------------------------------------------------------- numeric instances for the audit
def forward(A):
    n = A.shape[1]
    Q, R = np.linalg.qr(A, mode="complete")
    return {"Q": Q[:, :n], "R": R[:n], "Q2": Q[:, n:]}


def align(base, out):
    """For ``Q2`` the Procrustes rotation onto the base basis, so that the finite-difference tangent
    satisfies the gauge ``Q2^H dQ2 = 0`` (``Q`` and ``R`` are unique: LAPACK's signs hold nearby)."""
    W, _, Zh = np.linalg.svd(out["Q2"].conj().T @ base["Q2"])
    return {"Q": out["Q"], "R": out["R"], "Q2": out["Q2"] @ (W @ Zh)}


def sample(rng, m, n, p, field):
    def randn(*shape):
        x = rng.standard_normal(shape)
        return x + 1j * rng.standard_normal(shape) if field == "complex" else x

    A = randn(m, n) + np.eye(m, n) * np.sqrt(m)  # well conditioned
    dA = randn(m, n)
    base, tan = fd_tangents(forward, {"A": A}, {"A": dA}, align=align)
    return {"A": A, "dA": dA, **base, **{"d" + k: v for k, v in tan.items()}}


# ---------------------------------------------------------------- declarations
d = Derivation("qr_complement", __file__,
               title="complete QR: the complement basis Q2 of a tall A (through its span)",
               references=("Walter and Lehmann (2018)",), field="complex")
m, n, p = d.dim("m"), d.dim("n"), d.dim("p")
A = d.input("A", m, n)
Q = d.output("Q", m, n, orthonormal=True, api="Q")
R = d.output("R", n, n, upper=True, real_diagonal=True, api="R")
Q2 = d.output("Q2", m, p, orthonormal=True, api="Q2")
d.api_outputs("Q", "R", "Q2")
dA, dQ, dR, dQ2 = (d.tangent(x) for x in (A, Q, R, Q2))
d.instances(sample, [{"m": 5, "n": 3, "p": 2, "field": "complex"}, {"m": 6, "n": 2, "p": 4, "field": "complex"},
                     {"m": 4, "n": 3, "p": 1, "field": "real"}, {"m": 5, "n": 2, "p": 3, "field": "real"}])

qr = d.identity("A = Q R", A, Q * R)
orth = d.identity("Q^T Q = I", Q.T * Q, Identity(n))
perp = d.identity("Q^T Q2 = 0", Q.T * Q2, ZeroMatrix(n, p))
complete = d.identity("[Q Q2] square: Q Q^T + Q2 Q2^T = I", Q * Q.T + Q2 * Q2.T, Identity(m))
Omega = d.parameter("Omega", p, p, skew=True)
gauge = d.gauge("Q2 -> Q2 exp(Omega): any orthonormal basis of the complement", Omega, {Q2: Q2 * Omega}, name="basis",
                fix=(Q2.T * dQ2, ZeroMatrix(p, p)))

# ---------------------------------------------------------------- dQ2 = -Q dQ^T Q2
e = d.right_multiply(complete, dQ2, "right-multiply by dQ2")
e = d.substitute(e, gauge, "substitute Q2^T dQ2 = 0")
q_part = d.isolate(d.differentiate(perp, "differentiate Q^T Q2 = 0"), dQ2, Q.T * dQ2)
e = d.substitute(e, q_part, "substitute Q^T dQ2 = -dQ^T Q2")
dQ2_of_dQ = d.solve_for(e, dQ2)

# ---------------------------------------------------------------- dQ^T Q2 from A = Q R
perp_t = d.transpose(perp, "transpose: Q2^T Q = 0")
r = d.left_multiply(d.differentiate(qr, "differentiate A = Q R"), Q2.T, "left-multiply by Q2^T")
r = d.substitute(r, perp_t, "substitute Q2^T Q = 0")
r = d.right_multiply(r, Inverse(R), "right-multiply by R^-1")
r = d.isolate(d.transpose(r, "transpose"), dQ, dQ.T * Q2)
dQ2_sol = d.substitute(dQ2_of_dQ, r, "substitute dQ^T Q2 = R^-T dA^T Q2")
d.set_jvp(partial=True, dQ2=dQ2_sol)

# ---------------------------------------------------------------- VJP (the gQ2 contribution)
d.derive_vjp()

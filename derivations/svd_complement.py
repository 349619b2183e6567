"""The extra columns of ``full_matrices=True``: ``U2`` (m×p, p = m - k) spans the orthogonal
complement of span(U) in the SVD ``A = U S V^H`` of a tall A (m > n = k), real or complex
(``^T`` below is the conjugate transpose; the engine also specialises the rule to real data).

``U2`` is any orthonormal basis of that complement, so only its span is defined; a loss that depends
on ``U2`` through ``U2 U2^T`` (or is otherwise invariant to ``U2 -> U2 Q``, Q unitary) has a
well-defined gradient: the derivation declares the rotation ``U2 -> U2 exp(Ω)`` (Ω anti-Hermitian) a gauge and
derives the residual ``R = skew(U2^T gU2)`` that such a loss makes zero.  Choosing the gauge
``U2^T dU2 = 0`` (the derivative of a Procrustes-aligned
path), ``[U U2]`` square and ``U^T U2 = 0`` give ``dU2 = U (U^T dU2) = -U dU^T U2``, and with ``dU``
from the thin derivation, ``dU2 = -U S^-1 V^T dA^T U2``.  (PyTorch drops this cotangent; JAX
refuses.)  A wide A is handled through ``A^T``.

References: MATH.md §4 (full_matrices); Townsend (2016).
"""
import numpy as np

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Identity, Inverse, ZeroMatrix


# ---------------------------------------------------------------- numeric instances for the audit
def forward(A):
    U, s, Vh = np.linalg.svd(A, full_matrices=True)
    k = min(A.shape)
    return {"U": U[:, :k], "S": np.diag(s), "V": Vh[:k].conj().T, "U2": U[:, k:]}


def align(base, out):
    """Phases (signs) of the singular pairs; for U2 the Procrustes rotation onto the base basis, so
    that the finite-difference tangent satisfies the gauge U2^H dU2 = 0."""
    z = np.sum(base["U"].conj() * out["U"], axis=0) + np.sum(base["V"].conj() * out["V"], axis=0)
    phase = z.conj() / np.abs(z)
    W, _, Zh = np.linalg.svd(out["U2"].conj().T @ base["U2"])
    return {"U": out["U"] * phase, "S": out["S"], "V": out["V"] * phase, "U2": out["U2"] @ (W @ Zh)}


def sample(rng, m, n, p, field):
    def randn(*shape):
        x = rng.standard_normal(shape)
        return x + 1j * rng.standard_normal(shape) if field == "complex" else x

    Q1, _ = np.linalg.qr(randn(m, n))
    Q2, _ = np.linalg.qr(randn(n, n))
    A = (Q1 * (np.sort(rng.uniform(0, 0.5, n)) + 1 + np.arange(n))) @ Q2.conj().T
    dA = randn(m, n)
    base, tan = fd_tangents(forward, {"A": A}, {"A": dA}, align=align)
    return {"A": A, "dA": dA, **base, **{"d" + k: v for k, v in tan.items()}}


# ---------------------------------------------------------------- declarations
d = Derivation("svd_complement", __file__,
               title="full_matrices SVD: the complement basis U2 of a tall A (through its span)",
               references=("Townsend, Differentiating the SVD (2016)",), field="complex")
m, n, p = d.dim("m"), d.dim("n"), d.dim("p")
A = d.input("A", m, n)
U = d.output("U", m, n, orthonormal=True, api="U")
S = d.output("S", n, n, diagonal=True, api="S")
V = d.output("V", n, n, orthonormal=True, api="V")
U2 = d.output("U2", m, p, orthonormal=True, api="U2")
d.api_outputs("U", "S", "V", "U2")
dA, dU, dS, dV, dU2 = (d.tangent(x) for x in (A, U, S, V, U2))
d.instances(sample, [{"m": 5, "n": 3, "p": 2, "field": "complex"}, {"m": 6, "n": 2, "p": 4, "field": "complex"},
                     {"m": 4, "n": 3, "p": 1, "field": "real"}, {"m": 5, "n": 2, "p": 3, "field": "real"}])

right = d.identity("A V = U S", A * V, U * S)
left = d.identity("A^T U = V S", A.T * U, V * S)
orth_U = d.identity("U^T U = I", U.T * U, Identity(n))
orth_V = d.identity("V^T V = I", V.T * V, Identity(n))
complete_V = d.identity("V V^T = I (V square)", V * V.T, Identity(n))
perp = d.identity("U^T U2 = 0", U.T * U2, ZeroMatrix(n, p))
complete = d.identity("[U U2] square: U U^T + U2 U2^T = I", U * U.T + U2 * U2.T, Identity(m))
Omega = d.parameter("Omega", p, p, skew=True)
gauge = d.gauge("U2 -> U2 exp(Omega): any orthonormal basis of the complement", Omega, {U2: U2 * Omega}, name="basis",
                fix=(U2.T * dU2, ZeroMatrix(p, p)))

# ---------------------------------------------------------------- dU2 = -U dU^T U2
e = d.right_multiply(complete, dU2, "right-multiply by dU2")
e = d.substitute(e, gauge, "substitute U2^T dU2 = 0")
u_part = d.isolate(d.differentiate(perp, "differentiate U^T U2 = 0"), dU2, U.T * dU2)
e = d.substitute(e, u_part, "substitute U^T dU2 = -dU^T U2")
dU2_of_dU = d.solve_for(e, dU2)

# ---------------------------------------------------------------- dU^T U2 from A V = U S
recon = d.identity("A = U S V^T", A, U * S * V.T)
perp_t = d.transpose(perp, "transpose: U2^T U = 0")
U2tA = d.substitute(d.left_multiply(recon, U2.T, "left-multiply by U2^T"), perp_t, "substitute U2^T U = 0: U2^T A = 0")
r = d.left_multiply(d.differentiate(right, "differentiate A V = U S"), U2.T, "left-multiply by U2^T")
r = d.substitute(r, U2tA, "substitute U2^T A = 0")
r = d.substitute(r, perp_t, "substitute U2^T U = 0")
r = d.right_multiply(r, Inverse(S), "right-multiply by S^-1")
r = d.isolate(d.transpose(r, "transpose"), dU, dU.T * U2)
dU2_sol = d.substitute(dU2_of_dU, r, "substitute dU^T U2 = S^-1 V^T dA^T U2")
d.set_jvp(partial=True, dU2=dU2_sol)

# ---------------------------------------------------------------- VJP (the gU2 contribution)
d.derive_vjp()

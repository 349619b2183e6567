"""Partial generalized eigendecomposition: k of n pairs of ``A U = B U D``, ``U^T B U = I_k``.

``A`` Hermitian (real symmetric), ``B`` Hermitian positive definite; the derivation runs over
complex matrices (``^T`` is the conjugate transpose) and the engine specialises the rules to real
data.  The k×k part is the generalized full-spectrum derivation (``dC = U^T B dU`` with
``dC + dC^T = -U^T dB U``; ``dW = dC + U^T dB U / 2`` is anti-Hermitian, its imaginary diagonal the
phase of each eigenvector, a gauge fixed by ``diag(dW) = 0``); the rest of the tangent,
``W = dU - U dC``, lies in the B-orthogonal complement (``U^T B W = 0``).  Projecting the differentiated identity with ``P = I - B U U^T``
(``P B U = 0``) leaves, column by column, ``(A - d_i B) w_i = -P (dA - d_i dB) u_i``.  The adjoint
solve applies ``P`` to ``gU`` — not ``P^T`` — because the solve operator ``P^T K^+ P`` is
self-adjoint; the audit's dot-product identity checks exactly that.

References: pytorch/pytorch#38948; MATH.md §3.
"""
import numpy as np
import scipy.linalg

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, HadamardProduct, Identity, ZeroMatrix


# ---------------------------------------------------------------- numeric instances for the audit
def forward(A, B, k):
    w, V = scipy.linalg.eigh(A, B)
    return {"U": V[:, :k], "D": np.diag(w[:k])}  # the k smallest


def aligner(B):
    """Rotate each eigenvector by the phase (a sign for real data) that makes ``u0_j^H B u_j`` real
    positive: the path then satisfies the gauge ``diag(dW) = 0``."""
    def align(base, out):
        z = np.sum(base["U"].conj() * (B @ out["U"]), axis=0)
        return {"U": out["U"] * (z.conj() / np.abs(z)), "D": out["D"]}

    return align


def sample(rng, n, k, field):
    """Random Hermitian A and Hermitian positive definite B (condition ~20) with well-separated
    generalized eigenvalues, Hermitian directions dA, dB, and the output tangents of the k smallest
    pairs by finite differences of scipy.linalg.eigh."""
    def randn(*shape):
        x = rng.standard_normal(shape)
        return x + 1j * rng.standard_normal(shape) if field == "complex" else x

    def herm(X):
        return (X + X.conj().T) / 2

    Q, _ = np.linalg.qr(randn(n, n))
    B = herm((Q * rng.uniform(1, 20, n)) @ Q.conj().T)
    L = np.linalg.cholesky(B)
    Q2, _ = np.linalg.qr(randn(n, n))
    C = (Q2 * (np.sort(rng.uniform(-2, 2, n)) + np.arange(n))) @ Q2.conj().T
    A = herm(L @ herm(C) @ L.conj().T)
    dA, dB = herm(randn(n, n)), herm(randn(n, n))
    base, tan = fd_tangents(lambda A, B: forward(A, B, k), {"A": A, "B": B}, {"A": dA, "B": dB},
                            align=aligner(B))
    return {"A": A, "B": B, "dA": dA, "dB": dB, "U": base["U"], "D": base["D"],
            "dU": tan["U"], "dD": tan["D"]}


# ---------------------------------------------------------------- declarations
d = Derivation("eigsh_generalized", __file__,
               title="partial generalized Hermitian-definite eigendecomposition A U = B U D, U^H B U = I, U n×k "
                     "(real or complex)",
               references=("pytorch/pytorch#38948",), field="complex")
n, k = d.dim("n"), d.dim("k")
A = d.input("A", n, n, symmetric=True)
B = d.input("B", n, n, positive_definite=True)
U = d.output("U", n, k, orthonormal="B", api="V")
D = d.output("D", k, k, diagonal=True, api="w")
d.api_outputs("w", "V")
dA, dB, dU, dD = d.tangent(A), d.tangent(B), d.tangent(U), d.tangent(D)
d.instances(sample, [{"n": 5, "k": 2, "field": "complex"}, {"n": 7, "k": 3, "field": "complex"},
                     {"n": 5, "k": 2, "field": "real"}, {"n": 7, "k": 3, "field": "real"},
                     {"n": 6, "k": 1, "field": "real"}])

eig = d.identity("generalized eigenvector equation", A * U, B * U * D)
borth = d.identity("B-orthonormal columns", U.T * B * U, Identity(k))
left_eig = d.transpose(eig, "transpose, with A, B, D symmetric: U^T A = D U^T B")
s = d.differentiate(eig, "differentiate A U = B U D")

# ---------------------------------------------------------------- the k×k part
p = d.left_multiply(s, U.T, "left-multiply by U^T")
p = d.substitute(p, left_eig, "substitute U^T A = D U^T B")
p = d.substitute(p, borth, "substitute U^T B U = I")
dC = d.introduce("dC", U.T * B * dU)
p = d.use_definition(p, dC)
d_borth = d.use_definition(d.differentiate(borth, "differentiate U^T B U = I"), dC)  # dC + dC^T = -U^T dB U
dW = d.introduce("dW", dC + U.T * dB * U / 2)
dC_of_dW = d.solve_for(d.identity("definition of dW", dW, dC + U.T * dB * U / 2), dC)
d.declare_skew(d.replace(d_borth, dC_of_dW, "substitute dC = dW - U^T dB U / 2: dW + dW^T = 0"), dW)
p = d.replace(p, dC_of_dW, "substitute dC = dW - U^T dB U / 2")
p, E = d.hadamard_split(p, D, dW, "E")
# the Hermitian part of the diagonal gives dD (E_ii = 0; diag(dW) is imaginary)
dD_sol = d.solve_for(d.hermitian_part(d.diagonal_part(p, "diagonal part (E_ii = 0)"), "Hermitian part (dD real)"), dD)
# diag(dW) is free: the phases of the eigenvectors, a gauge
T = d.imaginary_diagonal("Theta", k)
phase = d.gauge("u_j -> e^{i theta_j} u_j", T, {U: U * T}, fix=(d.diag(dW), ZeroMatrix(k, k)))
# rotations inside clusters of equal kept eigenvalues are a gauge (dW is zero there; Q unitary
# keeps U^T B U = I)
K = d.clusters(D, completes=U)
Omega = d.parameter("Omega", k, k, skew=True, within=K)
d.gauge("rotations inside clusters of equal eigenvalues: U_c -> U_c Q", Omega, {U: U * Omega},
        fix=(HadamardProduct(K, dW), ZeroMatrix(k, k)))
dW_sol, F = d.solve_offdiagonal(p, dW, E, "F", diagonal=phase, clusters=K)
dC_sol = d.replace(dC_of_dW, dW_sol)

# ---------------------------------------------------------------- the B-orthogonal complement
W = d.introduce("W", dU - U * dC)
w_def = d.identity("definition of W", W, dU - U * dC)
split = d.solve_for(w_def, dU)
c = d.left_multiply(w_def, U.T * B, "left-multiply the definition of W by U^T B")
c = d.substitute(c, borth, "substitute U^T B U = I")
complement = d.use_definition(c, dC, "substitute dC = U^T B dU: U^T B W = 0")
r = d.replace(s, split, "substitute dU = U dC + W")
r = d.left_multiply(r, Identity(n) - B * U * U.T, "project with P = I - B U U^T")
r = d.substitute(r, eig, "substitute A U = B U D")
r = d.substitute(r, left_eig, "substitute U^T A = D U^T B")
r = d.substitute(r, borth, "substitute U^T B U = I")
r = d.substitute(r, complement, "substitute U^T B W = 0")
W_sol = d.solve_shifted(r, W, A, B, D, U, "solve (A - d_i B) w_i = -P (dA - d_i dB) u_i")
dU_sol = d.replace(d.replace(split, W_sol), dC_sol)
d.set_jvp(dU=dU_sol, dD=dD_sol)

# ---------------------------------------------------------------- VJP
d.derive_vjp(lowrank=k)

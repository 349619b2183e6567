"""Generalized Hermitian-definite eigenproblem, full spectrum: ``A U = B U D``, ``U^T B U = I``.

``A`` Hermitian (real symmetric), ``B`` Hermitian positive definite, ``D`` real diagonal; the
derivation runs over complex matrices (``^T`` is the conjugate transpose) and the engine
specialises the rules to real data.  Eigenvalues are returned as ``w`` ascending, eigenvectors as
``V`` (B-orthonormal).  Two routes are derived and shown to meet:

1. the B-inner product: differentiate ``A U = B U D`` and project with ``U^T``; ``dC = U^T B dU``
   is no longer anti-Hermitian: ``dC + dC^T = -U^T dB U`` fixes its Hermitian part;
2. the reduction ``C = B^-1 A``: differentiate ``B^-1 A U = U D``
   (``d(B^-1 A) = B^-1 dA - B^-1 dB B^-1 A``) and project with ``U^T B``.

``dW = dC + U^T dB U / 2`` is anti-Hermitian; its imaginary diagonal is the phase of each
eigenvector (a gauge, fixed by ``diag(dW) = 0``), and inside a cluster of equal eigenvalues the
B-unitary rotations are a gauge too.

References: pytorch/pytorch#38948 (the thread behind torch.lobpcg's backward); Giles, NA-08-01.
"""
import numpy as np
import scipy.linalg

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, HadamardProduct, Identity, Inverse, ZeroMatrix


# ---------------------------------------------------------------- numeric instances for the audit
def forward(A, B):
    w, V = scipy.linalg.eigh(A, B)
    return {"U": V, "D": np.diag(w)}


def aligner(B):
    """Rotate each eigenvector by the phase (a sign for real data) that makes ``u0_j^H B u_j`` real
    positive: the path then satisfies the gauge ``diag(dW) = 0``."""
    def align(base, out):
        z = np.sum(base["U"].conj() * (B @ out["U"]), axis=0)
        return {"U": out["U"] * (z.conj() / np.abs(z)), "D": out["D"]}

    return align


def sample(rng, n, field):
    """Random Hermitian A and Hermitian positive definite B (condition ~10) with well-separated
    generalized eigenvalues, Hermitian directions dA, dB, and output tangents by finite differences
    of scipy.linalg.eigh."""
    def randn(*shape):
        x = rng.standard_normal(shape)
        return x + 1j * rng.standard_normal(shape) if field == "complex" else x

    def herm(X):
        return (X + X.conj().T) / 2

    Q, _ = np.linalg.qr(randn(n, n))
    B = herm((Q * rng.uniform(1, 10, n)) @ Q.conj().T)
    L = np.linalg.cholesky(B)
    Q2, _ = np.linalg.qr(randn(n, n))
    C = (Q2 * (np.sort(rng.uniform(-2, 2, n)) + np.arange(n))) @ Q2.conj().T
    A = herm(L @ herm(C) @ L.conj().T)
    dA, dB = herm(randn(n, n)), herm(randn(n, n))
    base, tan = fd_tangents(forward, {"A": A, "B": B}, {"A": dA, "B": dB}, align=aligner(B))
    return {"A": A, "B": B, "dA": dA, "dB": dB, "U": base["U"], "D": base["D"],
            "dU": tan["U"], "dD": tan["D"]}


# ---------------------------------------------------------------- declarations
d = Derivation("eigh_generalized", __file__,
               title="generalized Hermitian-definite eigendecomposition A U = B U D, U^H B U = I (real or complex)",
               references=("pytorch/pytorch#38948", "Giles, NA-08-01 (2008)"), field="complex")
n = d.dim("n")
A = d.input("A", n, n, symmetric=True)
B = d.input("B", n, n, positive_definite=True)
U = d.output("U", n, n, orthonormal="B", api="V")
D = d.output("D", n, n, diagonal=True, api="w")
d.api_outputs("w", "V")
d.forward(runtime="eigh_generalized", checked=("positive_definite",))
dA, dB, dU, dD = d.tangent(A), d.tangent(B), d.tangent(U), d.tangent(D)
d.instances(sample, [{"n": 4, "field": "complex"}, {"n": 5, "field": "complex"}, {"n": 4, "field": "real"},
                     {"n": 6, "field": "real"}])

eig = d.identity("generalized eigenvector equation", A * U, B * U * D)
borth = d.identity("B-orthonormal columns", U.T * B * U, Identity(n))
complete = d.identity("complete basis (U square): U U^T B = I", U * U.T * B, Identity(n))
left_eig = d.transpose(eig, "transpose, with A, B, D symmetric: U^T A = D U^T B")

# ---------------------------------------------------------------- route 1: the B-inner product
s = d.differentiate(eig, "differentiate A U = B U D")
s = d.left_multiply(s, U.T, "left-multiply by U^T")
s = d.substitute(s, left_eig, "substitute U^T A = D U^T B")
s = d.substitute(s, borth, "substitute U^T B U = I")
dC = d.introduce("dC", U.T * B * dU)
route1 = d.use_definition(s, dC)

# ---------------------------------------------------------------- route 2: C = B^-1 A
reduced = d.identity("reduced eigenvector equation C U = U D, C = B^-1 A", Inverse(B) * A * U, U * D)
r = d.differentiate(reduced, "differentiate B^-1 A U = U D (d(B^-1 A) = B^-1 dA - B^-1 dB B^-1 A)")
r = d.left_multiply(r, U.T * B, "left-multiply by U^T B (the inverse of U)")
r = d.substitute(r, reduced, "substitute B^-1 A U = U D")
r = d.substitute(r, left_eig, "substitute U^T A = D U^T B")
r = d.substitute(r, borth, "substitute U^T B U = I")
route2 = d.use_definition(r, dC)
s = d.same(route1, route2, "both routes give U^T dA U + D dC = dC D + dD + U^T dB U D")

# ---------------------------------------------------------------- dC = dW - U^T dB U / 2 with dW skew
d_borth = d.use_definition(d.differentiate(borth, "differentiate U^T B U = I"), dC)  # dC + dC^T = -U^T dB U
dW = d.introduce("dW", dC + U.T * dB * U / 2)
dC_of_dW = d.solve_for(d.identity("definition of dW", dW, dC + U.T * dB * U / 2), dC)
d.declare_skew(d.replace(d_borth, dC_of_dW, "substitute dC = dW - U^T dB U / 2: dW + dW^T = 0"), dW)
s = d.replace(s, dC_of_dW, "substitute dC = dW - U^T dB U / 2")

# ---------------------------------------------------------------- solve
s, E = d.hadamard_split(s, D, dW, "E")
# the Hermitian part of the diagonal gives dD (E_ii = 0; diag(dW) is imaginary)
dD_sol = d.solve_for(d.hermitian_part(d.diagonal_part(s, "diagonal part (E_ii = 0)"), "Hermitian part (dD real)"), dD)
# diag(dW) is free: the phases of the eigenvectors, a gauge
T = d.imaginary_diagonal("Theta", n)
phase = d.gauge("u_j -> e^{i theta_j} u_j", T, {U: U * T}, fix=(d.diag(dW), ZeroMatrix(n, n)))
# inside a cluster of equal eigenvalues E_ij = 0: the rotations U_c -> U_c Q (Q orthogonal keeps
# U^T B U = I) are a gauge; dW is zero there, its determined part -U^T dB U / 2 stays in dC
K = d.clusters(D, completes=U)
Omega = d.parameter("Omega", n, n, skew=True, within=K)
d.gauge("rotations inside clusters of equal eigenvalues: U_c -> U_c Q", Omega, {U: U * Omega},
        fix=(HadamardProduct(K, dW), ZeroMatrix(n, n)))
dW_sol, F = d.solve_offdiagonal(s, dW, E, "F", diagonal=phase, clusters=K)
dC_sol = d.replace(dC_of_dW, dW_sol)
back = d.left_multiply(d.identity("definition of dC", dC, U.T * B * dU), U, "left-multiply dC = U^T B dU by U")
back = d.substitute(back, complete, "substitute U U^T B = I")
dU_sol = d.replace(d.solve_for(back, dU), dC_sol)
d.set_jvp(dU=dU_sol, dD=dD_sol)

# ---------------------------------------------------------------- VJP
d.derive_vjp()

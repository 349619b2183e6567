"""Partial Hermitian (real symmetric) eigendecomposition: k of n eigenpairs, ``A U = U D``,
``U^T U = I_k``.

The derivation runs over complex matrices (``^T`` below is the conjugate transpose); the engine
specialises the rules to real symmetric data.  ``U`` is n×k, so ``U U^T != I``: the tangent splits
as ``dU = U dC + W`` with ``U^T W = 0``.  ``dC`` and ``dD`` come from the k×k projection exactly as
for the full spectrum: ``dC = U^T dU`` is anti-Hermitian, its imaginary diagonal is the phase of
each eigenvector (``u_j -> e^{iθ_j} u_j``, a gauge fixed by ``diag(dC) = 0``, with the residual
``diag(skew(U^T gU))`` that a well-defined loss makes zero).  ``W`` is not determined by
``U^T dA U``: projecting the differentiated identity with ``P = I - U U^T`` gives, column by
column, the shifted systems ``(A - d_i I) w_i = -P dA u_i``, ``U^T w_i = 0`` — solved matrix-free
at run time, with no complement basis and no full spectrum.  The adjoint applies the same solve to
``gU``.

References: pytorch/pytorch#38948; MATH.md §2 (the Sylvester equation on the complement).
"""
import numpy as np
import scipy.linalg

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, HadamardProduct, Identity, ZeroMatrix

K_OF = {5: 2, 7: 3, 8: 1}


# ---------------------------------------------------------------- numeric instances for the audit
def forward(A, k):
    w, V = scipy.linalg.eigh(A)
    return {"U": V[:, -k:], "D": np.diag(w[-k:])}  # the k largest


def align_phases(base, out):
    """Rotate each eigenvector by the phase (a sign for real data) that makes ``u0_j^H u_j`` real
    positive: the path then satisfies the gauge ``diag(U^H dU) = 0``."""
    z = np.sum(base["U"].conj() * out["U"], axis=0)
    return {"U": out["U"] * (z.conj() / np.abs(z)), "D": out["D"]}


def sample(rng, n, k, field):
    """A random Hermitian A with well-separated eigenvalues, a Hermitian direction dA, and the
    output tangents of the k largest pairs by finite differences of scipy.linalg.eigh."""
    def randn(*shape):
        x = rng.standard_normal(shape)
        return x + 1j * rng.standard_normal(shape) if field == "complex" else x

    Q, _ = np.linalg.qr(randn(n, n))
    A = (Q * (np.sort(rng.uniform(-2, 2, n)) + np.arange(n))) @ Q.conj().T
    A = (A + A.conj().T) / 2
    dA = randn(n, n)
    dA = (dA + dA.conj().T) / 2
    base, tan = fd_tangents(lambda A: forward(A, k), {"A": A}, {"A": dA}, align=align_phases)
    return {"A": A, "dA": dA, "U": base["U"], "D": base["D"], "dU": tan["U"], "dD": tan["D"]}


# ---------------------------------------------------------------- declarations
d = Derivation("eigsh", __file__,
               title="partial Hermitian eigendecomposition A U = U D, U n×k (real or complex)",
               references=("pytorch/pytorch#38948",), field="complex")
n, k = d.dim("n"), d.dim("k")
A = d.input("A", n, n, symmetric=True)
U = d.output("U", n, k, orthonormal=True, api="V")
D = d.output("D", k, k, diagonal=True, api="w")
d.api_outputs("w", "V")
dA, dU, dD = d.tangent(A), d.tangent(U), d.tangent(D)
d.instances(sample, [{"n": 5, "k": 2, "field": "complex"}, {"n": 7, "k": 3, "field": "complex"},
                     {"n": 5, "k": 2, "field": "real"}, {"n": 7, "k": 3, "field": "real"},
                     {"n": 8, "k": 1, "field": "real"}])

eig = d.identity("eigenvector equation", A * U, U * D)
orth = d.identity("orthonormal columns", U.T * U, Identity(k))
left_eig = d.transpose(eig, "transpose, with A and D symmetric: U^T A = D U^T")
s = d.differentiate(eig, "differentiate A U = U D")

# ---------------------------------------------------------------- the k×k part: dC = U^T dU, dD
p = d.left_multiply(s, U.T, "left-multiply by U^T")
p = d.substitute(p, left_eig, "substitute U^T A = D U^T")
p = d.substitute(p, orth, "substitute U^T U = I")
dC = d.introduce("dC", U.T * dU, skew_by=d.differentiate(orth, "differentiate U^T U = I"))
p = d.use_definition(p, dC)
p, E = d.hadamard_split(p, D, dC, "E")
# the real part of the diagonal gives dD (E_ii = 0; diag(dC) is imaginary)
dD_sol = d.solve_for(d.hermitian_part(d.diagonal_part(p, "diagonal part (E_ii = 0)"), "Hermitian part (dD real)"), dD)
# diag(dC) is free: the phases of the eigenvectors, a gauge
T = d.imaginary_diagonal("Theta", k)
phase = d.gauge("u_j -> e^{i theta_j} u_j", T, {U: U * T}, fix=(d.diag(dC), ZeroMatrix(k, k)))
# rotations inside clusters of equal kept eigenvalues are a gauge (dC is zero there)
K = d.clusters(D, completes=U)
Omega = d.parameter("Omega", k, k, skew=True, within=K)
d.gauge("rotations inside clusters of equal eigenvalues: U_c -> U_c Q", Omega, {U: U * Omega},
        fix=(HadamardProduct(K, dC), ZeroMatrix(k, k)))
dC_sol, F = d.solve_offdiagonal(p, dC, E, "F", diagonal=phase, clusters=K)

# ---------------------------------------------------------------- the complement: dU = U dC + W
W = d.introduce("W", dU - U * dC)
w_def = d.identity("definition of W", W, dU - U * dC)
split = d.solve_for(w_def, dU)
c = d.left_multiply(w_def, U.T, "left-multiply the definition of W by U^T")
c = d.substitute(c, orth, "substitute U^T U = I")
complement = d.use_definition(c, dC, "substitute dC = U^T dU: U^T W = 0")
r = d.replace(s, split, "substitute dU = U dC + W")
r = d.left_multiply(r, Identity(n) - U * U.T, "project with P = I - U U^T")
r = d.substitute(r, eig, "substitute A U = U D")
r = d.substitute(r, left_eig, "substitute U^T A = D U^T")
r = d.substitute(r, orth, "substitute U^T U = I")
r = d.substitute(r, complement, "substitute U^T W = 0")
W_sol = d.solve_shifted(r, W, A, None, D, U, "solve (A - d_i I) w_i = -P dA u_i on the complement")
dU_sol = d.replace(d.replace(split, W_sol), dC_sol)
d.set_jvp(dU=dU_sol, dD=dD_sol)

# ---------------------------------------------------------------- VJP
d.derive_vjp(lowrank=k)

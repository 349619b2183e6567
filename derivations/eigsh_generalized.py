"""Partial generalized eigendecomposition: k of n pairs of ``A U = B U D``, ``U^T B U = I_k``.

The k×k part is the generalized full-spectrum derivation (``dC = U^T B dU`` with
``dC + dC^T = -U^T dB U``); the rest of the tangent, ``W = dU - U dC``, lies in the B-orthogonal
complement (``U^T B W = 0``).  Projecting the differentiated identity with ``P = I - B U U^T``
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


def align_signs(base, out):
    signs = np.sign(np.sum(base["U"] * out["U"], axis=0))
    return {"U": out["U"] * signs, "D": out["D"]}


def sample(rng, n, k):
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    B = (Q * rng.uniform(1, 20, n)) @ Q.T
    B = (B + B.T) / 2
    L = np.linalg.cholesky(B)
    Q2, _ = np.linalg.qr(rng.standard_normal((n, n)))
    C = (Q2 * (np.sort(rng.uniform(-2, 2, n)) + np.arange(n))) @ Q2.T
    A = L @ ((C + C.T) / 2) @ L.T
    A = (A + A.T) / 2
    dA, dB = rng.standard_normal((2, n, n))
    dA, dB = (dA + dA.T) / 2, (dB + dB.T) / 2
    base, tan = fd_tangents(lambda A, B: forward(A, B, k), {"A": A, "B": B}, {"A": dA, "B": dB},
                            align=align_signs)
    return {"A": A, "B": B, "dA": dA, "dB": dB, "U": base["U"], "D": base["D"],
            "dU": tan["U"], "dD": tan["D"]}


# ---------------------------------------------------------------- declarations
d = Derivation("eigsh_generalized", __file__,
               title="partial generalized eigendecomposition A U = B U D, U^T B U = I, U n×k",
               references=("pytorch/pytorch#38948",))
n, k = d.dim("n"), d.dim("k")
A = d.input("A", n, n, symmetric=True)
B = d.input("B", n, n, positive_definite=True)
U = d.output("U", n, k, orthonormal="B", api="V")
D = d.output("D", k, k, diagonal=True, api="w")
d.api_outputs("w", "V")
dA, dB, dU, dD = d.tangent(A), d.tangent(B), d.tangent(U), d.tangent(D)
d.instances(sample, [{"n": 5, "k": 2}, {"n": 7, "k": 3}, {"n": 6, "k": 1}])

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
dD_sol = d.solve_for(d.diagonal_part(p, "diagonal part (E_ii = 0)"), dD)
# rotations inside clusters of equal kept eigenvalues are a gauge (dW is zero there)
K = d.clusters(D)
Omega = d.parameter("Omega", k, k, skew=True, within=K)
d.gauge("rotations inside clusters of equal eigenvalues: U_c -> U_c Q", Omega, {U: U * Omega},
        fix=(HadamardProduct(K, dW), ZeroMatrix(k, k)))
dW_sol, F = d.solve_offdiagonal(p, dW, E, "F", clusters=K)
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

"""Symmetric eigendecomposition, full spectrum: ``A = U D U^T``.

Identities: ``A U = U D``, ``U^T U = I`` (and ``U U^T = I``, U square), ``A = A^T``, ``D`` diagonal.
The eigenvalues are returned as the vector ``w`` (the diagonal of ``D``), the eigenvectors as ``V``.

References: M. Giles, "An extended collection of matrix derivative results for forward and reverse
mode algorithmic differentiation", NA-08-01 (2008); C. Ionescu et al., "Matrix backpropagation
for deep networks with structured layers", ICCV 2015.
"""
import numpy as np

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Identity


# ---------------------------------------------------------------- numeric instances for the audit
def forward(A):
    w, V = np.linalg.eigh(A)
    return {"U": V, "D": np.diag(w)}


def align_signs(base, out):
    signs = np.sign(np.sum(base["U"] * out["U"], axis=0))
    return {"U": out["U"] * signs, "D": out["D"]}


def sample(rng, n):
    """A random symmetric A with well-separated eigenvalues, a symmetric direction dA, and the
    output tangents measured by finite differences of numpy.linalg.eigh."""
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    w = np.sort(rng.uniform(-2, 2, n)) + np.arange(n)  # gaps >= ~1
    A = (Q * w) @ Q.T
    A = (A + A.T) / 2
    dA = rng.standard_normal((n, n))
    dA = (dA + dA.T) / 2
    base, tan = fd_tangents(forward, {"A": A}, {"A": dA}, align=align_signs)
    return {"A": A, "dA": dA, "U": base["U"], "D": base["D"], "dU": tan["U"], "dD": tan["D"]}


# ---------------------------------------------------------------- declarations
d = Derivation("eigh", __file__, title="symmetric eigendecomposition A = U D U^T (full spectrum)",
               references=("Giles, NA-08-01 (2008)", "Ionescu et al., ICCV 2015"))
n = d.dim("n")
A = d.input("A", n, n, symmetric=True)
U = d.output("U", n, n, orthonormal=True, api="V")
D = d.output("D", n, n, diagonal=True, api="w")
d.api_outputs("w", "V")  # as torch.linalg.eigh
dA, dU, dD = d.tangent(A), d.tangent(U), d.tangent(D)
d.instances(sample, [{"n": 4}, {"n": 5}, {"n": 7}])

eig = d.identity("eigenvector equation", A * U, U * D)
orth = d.identity("orthonormal columns", U.T * U, Identity(n))
complete = d.identity("complete basis (U square)", U * U.T, Identity(n))
left_eig = d.transpose(eig, "transpose, with A and D symmetric: U^T A = D U^T")

# ---------------------------------------------------------------- JVP
# 1. differentiate the eigenvector equation: dA U + A dU = dU D + U dD
s = d.differentiate(eig, "differentiate A U = U D")
# 2. project onto the eigenbasis
s = d.left_multiply(s, U.T, "left-multiply by U^T")
s = d.substitute(s, left_eig, "substitute U^T A = D U^T")
s = d.substitute(s, orth, "substitute U^T U = I")
# 3. dC = U^T dU is skew-symmetric: differentiate U^T U = I
d_orth = d.differentiate(orth, "differentiate U^T U = I")
dC = d.introduce("dC", U.T * dU, skew_by=d_orth)
s = d.use_definition(s, dC)
# 4. D dC - dC D = E ∘ dC
s, E = d.hadamard_split(s, D, dC, "E")
# 5. the diagonal gives dD
dD_sol = d.solve_for(d.diagonal_part(s, "diagonal part (E_ii = 0, dC_ii = 0)"), dD)
# 6. off the diagonal, solve E ∘ dC = -U^T dA U for the skew dC
dC_sol, F = d.solve_offdiagonal(s, dC, E, "F")
# 7. dU = U dC, since U U^T = I
back = d.left_multiply(d.identity("definition of dC", dC, U.T * dU), U, "left-multiply dC = U^T dU by U")
back = d.substitute(back, complete, "substitute U U^T = I")
dU_sol = d.replace(d.solve_for(back, dU), dC_sol)
d.set_jvp(dU=dU_sol, dD=dD_sol)

# ---------------------------------------------------------------- VJP
d.derive_vjp()

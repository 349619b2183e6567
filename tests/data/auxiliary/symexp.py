"""``X = exp(A)`` of a symmetric ``A`` through its eigendecomposition ``A = U D U^T``, with ``U`` and
``D`` declared auxiliary: the forward returns them for the rules, which read them, and the public
function returns ``X`` only.  A user's derivation (tests/test_auxiliary_outputs.py): its second
derivatives need the derivative of ``U`` and ``D``, which the generated function gets by running
the forward again where the rules are differentiated."""
import numpy as np
import sympy as sp

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, HadamardProduct, Identity, ZeroMatrix

x = sp.Symbol("x", real=True)
EXP = sp.Lambda(x, sp.exp(x))


def forward(A):
    w, V = np.linalg.eigh(A)
    return {"X": (V * np.exp(w)) @ V.T, "U": V, "D": np.diag(w)}


def align(base, out):
    signs = np.sign(np.sum(base["U"] * out["U"], axis=0))
    return {"X": out["X"], "U": out["U"] * signs, "D": out["D"]}


def sample(rng, n):
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    A = (Q * (np.arange(n) + rng.uniform(0.2, 0.8, n))) @ Q.T
    A = (A + A.T) / 2
    dA = rng.standard_normal((n, n))
    dA = dA + dA.T
    base, tan = fd_tangents(forward, {"A": A}, {"A": dA}, align=align, h=1e-4)
    return {"A": A, "dA": dA, "X": base["X"], "U": base["U"], "D": base["D"], "dX": tan["X"], "dU": tan["U"],
            "dD": tan["D"]}


d = Derivation("symexp", __file__, title="exp of a symmetric matrix through its eigendecomposition")
n = d.dim("n")
A = d.input("A", n, n, symmetric=True)
X = d.output("X", n, n)
U = d.output("U", n, n, orthonormal=True, api="V", auxiliary=True)
D = d.output("D", n, n, diagonal=True, api="w", auxiliary=True)
d.api_outputs("X", "w", "V")
d.forward(torch="auxops.forward:symexp", numpy="auxops.forward:symexp_array")
d.instances(sample, [{"n": 3}, {"n": 4}])
dA, dX, dU, dD = d.tangent(A), d.tangent(X), d.tangent(U), d.tangent(D)

eig = d.identity("A U = U D", A * U, U * D)
orth = d.identity("U^T U = I", U.T * U, Identity(n))
complete = d.identity("U U^T = I", U * U.T, Identity(n))
left = d.transpose(eig, "U^T A = D U^T")
fA = d.identity("X = U exp(D) U^T", X, U * d.apply(EXP, D) * U.T)

# the eigendecomposition's tangents: dD = diag(U^T dA U), dC = U^T dU = F ∘ (U^T dA U)
s = d.differentiate(eig, "differentiate A U = U D")
s = d.substitute(d.substitute(d.left_multiply(s, U.T, "left-multiply by U^T"), left), orth)
dC = d.introduce("dC", U.T * dU, skew_by=d.differentiate(orth, "differentiate U^T U = I"))
s = d.use_definition(s, dC)
s, E = d.hadamard_split(s, D, dC, "E")
dD_sol = d.solve_for(d.diagonal_part(s, "diagonal part"), dD)
K = d.clusters(D, completes=U)
Omega = d.parameter("Omega", n, n, skew=True, within=K)
d.gauge("rotations inside clusters", Omega, {U: U * Omega}, fix=(HadamardProduct(K, dC), ZeroMatrix(n, n)))
dC_sol, F = d.solve_offdiagonal(s, dC, E, "F", clusters=K)

# dX = U (L ∘ (U^T dA U)) U^T with the divided differences L of exp
s = d.differentiate(fA, "differentiate X = U exp(D) U^T")
s = d.substitute(d.right_multiply(d.left_multiply(s, U.T, "left-multiply by U^T"), U, "right-multiply by U"), orth)
s = d.use_definition(s, dC)
s, Ef = d.hadamard_split(s, D, dC, "Ef")
s = d.replace(d.replace(s, dC_sol), dD_sol)
s, L = d.combine_pairwise(s, (Ef, F), "L", diagonal=d.apply(EXP, D), label="divided differences of exp")
s = d.right_multiply(d.left_multiply(s, U, "left-multiply by U"), U.T, "right-multiply by U^T")
s = d.substitute(s, complete)
d.set_jvp(partial=True, dX=d.solve_for(s, dX))
d.derive_vjp()

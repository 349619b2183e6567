"""Thin singular value decomposition ``A = U S V^T``, A m×n, k = min(m, n).

Identities: ``A V = U S``, ``A^T U = V S``, ``U^T U = I``, ``V^T V = I`` (k×k), ``A = U S V^T``.
``dU^T U`` and ``dV^T V`` are skew; projecting both differentiated identities gives
``P + S dCV = dCU S + dS`` and ``P^T + S dCU = dCV S + dS`` with ``P = U^T dA V``.  Combining them
isolates ``dCU S² - S² dCU`` (and the same for ``dCV``), a Hadamard split with
``E_ij = s_j² - s_i²``.  The parts of ``dU`` and ``dV`` outside span(U), span(V) follow from the
complement projections and need ``S^-1``: ``(I - UU^T) dA V S^-1``, ``(I - VV^T) dA^T U S^-1``
(each vanishes when its factor is square).  Sizes: the projectors are m×m and n×n — the slip of the
hand-written GPU rule in seed 000 (``I - V V^T`` sized with m) cannot happen here.

References: J. Townsend, "Differentiating the singular value decomposition" (2016); Giles (2008).
"""
import numpy as np

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Identity, Inverse


# ---------------------------------------------------------------- numeric instances for the audit
def forward(A):
    U, s, Vt = np.linalg.svd(A, full_matrices=False)
    return {"U": U, "S": np.diag(s), "V": Vt.T}


def align_signs(base, out):
    signs = np.sign(np.sum(base["U"] * out["U"], axis=0))
    return {"U": out["U"] * signs, "S": out["S"], "V": out["V"] * signs}


def sample(rng, m, n, k):
    """A with well-separated singular values in [1, ~k+1] and a random direction dA."""
    Q1, _ = np.linalg.qr(rng.standard_normal((m, k)))
    Q2, _ = np.linalg.qr(rng.standard_normal((n, k)))
    s = np.sort(rng.uniform(0, 0.5, k)) + 1 + np.arange(k)
    A = (Q1 * s) @ Q2.T
    dA = rng.standard_normal((m, n))
    base, tan = fd_tangents(forward, {"A": A}, {"A": dA}, align=align_signs)
    return {"A": A, "dA": dA, "U": base["U"], "S": base["S"], "V": base["V"],
            "dU": tan["U"], "dS": tan["S"], "dV": tan["V"]}


# ---------------------------------------------------------------- declarations
d = Derivation("svd", __file__, title="thin singular value decomposition A = U S V^T",
               references=("Townsend, Differentiating the SVD (2016)", "Giles, NA-08-01 (2008)"))
m, n, k = d.dim("m"), d.dim("n"), d.dim("k")
A = d.input("A", m, n)
U = d.output("U", m, k, orthonormal=True, api="U")
S = d.output("S", k, k, diagonal=True, api="S")
V = d.output("V", n, k, orthonormal=True, api="V")
d.api_outputs("U", "S", "V")
dA, dU, dS, dV = d.tangent(A), d.tangent(U), d.tangent(S), d.tangent(V)
d.instances(sample, [{"m": 5, "n": 3, "k": 3}, {"m": 3, "n": 5, "k": 3}, {"m": 4, "n": 4, "k": 4}])

right = d.identity("right singular vectors: A V = U S", A * V, U * S)
left = d.identity("left singular vectors: A^T U = V S", A.T * U, V * S)
orth_U = d.identity("U^T U = I", U.T * U, Identity(k))
orth_V = d.identity("V^T V = I", V.T * V, Identity(k))
recon = d.identity("thin reconstruction A = U S V^T", A, U * S * V.T)
UtA = d.transpose(left, "transpose A^T U = V S: U^T A = S V^T")
VtAt = d.transpose(right, "transpose A V = U S: V^T A^T = S U^T")
dCU = d.introduce("dCU", U.T * dU, skew_by=d.differentiate(orth_U, "differentiate U^T U = I"))
dCV = d.introduce("dCV", V.T * dV, skew_by=d.differentiate(orth_V, "differentiate V^T V = I"))
d_right = d.differentiate(right, "differentiate A V = U S")
d_left = d.differentiate(left, "differentiate A^T U = V S")

# ---------------------------------------------------------------- projections onto span(U), span(V)
a = d.left_multiply(d_right, U.T, "left-multiply dA V + A dV = dU S + U dS by U^T")
a = d.substitute(a, UtA, "substitute U^T A = S V^T")
a = d.substitute(a, orth_U, "substitute U^T U = I")
a = d.use_definition(d.use_definition(a, dCU), dCV)
b = d.left_multiply(d_left, V.T, "left-multiply dA^T U + A^T dU = dV S + V dS by V^T")
b = d.substitute(b, VtAt, "substitute V^T A^T = S U^T")
b = d.substitute(b, orth_V, "substitute V^T V = I")
b = d.use_definition(d.use_definition(b, dCU), dCV)
dS_sol = d.solve_for(d.diagonal_part(a, "diagonal part (dCU, dCV skew: zero diagonal)"), dS)

# ---------------------------------------------------------------- dCU: (a) S + S (b) eliminates dCV
cu = d.add(d.right_multiply(a, S, "right-multiply by S"), d.left_multiply(b, S, "left-multiply by S"),
           label="add: the S dCV S terms cancel")
cu, E = d.hadamard_split(cu, S, dCU, "E")
dCU_sol, F = d.solve_offdiagonal(cu, dCU, E, "F")
# ---------------------------------------------------------------- dCV: S (a) + (b) S eliminates dCU
cv = d.add(d.left_multiply(a, S, "left-multiply by S"), d.right_multiply(b, S, "right-multiply by S"),
           label="add: the S dCU S terms cancel")
cv, E2 = d.hadamard_split(cv, S, dCV, "E")
dCV_sol, _ = d.solve_offdiagonal(cv, dCV, E2, "F")

# ---------------------------------------------------------------- outside span(U): W_U = (I - UU^T) dU
WU = d.introduce("WU", dU - U * dCU)
wu_def = d.identity("definition of WU", WU, dU - U * dCU)
wu = d.replace(d_right, d.solve_for(wu_def, dU), "substitute dU = U dCU + WU")
wu = d.left_multiply(wu, Identity(m) - U * U.T, "project with I - U U^T")
wu = d.substitute(wu, recon, "substitute A = U S V^T")
wu = d.substitute(wu, orth_U, "substitute U^T U = I")
wu_perp = d.use_definition(d.substitute(d.left_multiply(wu_def, U.T, "U^T WU"), orth_U, "substitute U^T U = I"), dCU,
                           "substitute dCU = U^T dU: U^T WU = 0")
wu = d.substitute(wu, wu_perp, "substitute U^T WU = 0")
wu = d.right_multiply(wu, Inverse(S), "right-multiply by S^-1")
WU_sol = d.solve_for(wu, WU)
# ---------------------------------------------------------------- outside span(V): W_V = (I - VV^T) dV
WV = d.introduce("WV", dV - V * dCV)
wv_def = d.identity("definition of WV", WV, dV - V * dCV)
wv = d.replace(d_left, d.solve_for(wv_def, dV), "substitute dV = V dCV + WV")
wv = d.left_multiply(wv, Identity(n) - V * V.T, "project with I - V V^T")
wv = d.substitute(wv, d.transpose(recon, "transpose: A^T = V S U^T"), "substitute A^T = V S U^T")
wv = d.substitute(wv, orth_V, "substitute V^T V = I")
wv_perp = d.use_definition(d.substitute(d.left_multiply(wv_def, V.T, "V^T WV"), orth_V, "substitute V^T V = I"), dCV,
                           "substitute dCV = V^T dV: V^T WV = 0")
wv = d.substitute(wv, wv_perp, "substitute V^T WV = 0")
wv = d.right_multiply(wv, Inverse(S), "right-multiply by S^-1")
WV_sol = d.solve_for(wv, WV)

# ---------------------------------------------------------------- assemble
dU_sol = d.replace(d.replace(d.solve_for(wu_def, dU), WU_sol), dCU_sol)
dV_sol = d.replace(d.replace(d.solve_for(wv_def, dV), WV_sol), dCV_sol)
d.set_jvp(dU=dU_sol, dS=dS_sol, dV=dV_sol)

# ---------------------------------------------------------------- VJP
d.derive_vjp()

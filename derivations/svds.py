"""Truncated SVD: the k largest (or smallest) singular triplets ``A V = U S``, ``A^T U = V S``,
``U^T U = V^T V = I`` of an m×n A, k < min(m, n), real.

Unlike the thin SVD there is no reconstruction ``A = U S V^T``: the discarded singular vectors
couple to ``dU``, ``dV``.  Inside span(U), span(V) the steps are those of the thin SVD.  Outside,
``WU = (I - UU^T) dU`` and ``WV = (I - VV^T) dV`` satisfy the projected identities
``WU S = (I - UU^T) dA V + A WV`` and ``WV S = (I - VV^T) dA^T U + A^T WU``; eliminating ``WU``
leaves, column by column, ``(A^T A - s_i² I) wv_i = -r_i`` on the complement of span(V): projected
shifted solves with the Gram operator and shifts ``s_i²`` (matrix-free, the runtime family of the
partial eigensolver).  The result is exact for any discarded spectrum: no term assumes the
discarded singular values are zero.

References: MATH.md §4 (truncated SVD); Francuz, Schuch, Vanhecke, arXiv:2311.11894.
"""
import numpy as np

import _singular_spaces as singular_spaces
from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Identity, Inverse


# ---------------------------------------------------------------- numeric instances for the audit
def forward(A, k):
    U, s, Vt = np.linalg.svd(A, full_matrices=False)
    return {"U": U[:, :k], "S": np.diag(s[:k]), "V": Vt[:k].T}


def align_signs(base, out):
    signs = np.sign(np.sum(base["U"] * out["U"], axis=0))
    return {"U": out["U"] * signs, "S": out["S"], "V": out["V"] * signs}


def sample(rng, m, n, k):
    """A with separated singular values, none of the discarded ones zero, and a direction dA."""
    r = min(m, n)
    Q1, _ = np.linalg.qr(rng.standard_normal((m, r)))
    Q2, _ = np.linalg.qr(rng.standard_normal((n, r)))
    s = (np.sort(rng.uniform(0, 0.5, r)) + 1 + np.arange(r))[::-1]
    A = (Q1 * s) @ Q2.T
    dA = rng.standard_normal((m, n))
    base, tan = fd_tangents(lambda A: forward(A, k), {"A": A}, {"A": dA}, align=align_signs)
    return {"A": A, "dA": dA, "U": base["U"], "S": base["S"], "V": base["V"],
            "dU": tan["U"], "dS": tan["S"], "dV": tan["V"]}


# ---------------------------------------------------------------- declarations
d = Derivation("svds", __file__, title="truncated singular value decomposition A V = U S, A^T U = V S (k triplets)",
               references=("Francuz, Schuch, Vanhecke, arXiv:2311.11894", "Townsend (2016)"))
m, n, k = d.dim("m"), d.dim("n"), d.dim("k")
A = d.input("A", m, n)
U = d.output("U", m, k, orthonormal=True, api="U")
S = d.output("S", k, k, diagonal=True, api="S")
V = d.output("V", n, k, orthonormal=True, api="V")
d.api_outputs("U", "S", "V")
dA, dU, dS, dV = d.tangent(A), d.tangent(U), d.tangent(S), d.tangent(V)
d.instances(sample, [{"m": 6, "n": 4, "k": 2}, {"m": 4, "n": 6, "k": 2}, {"m": 5, "n": 5, "k": 3}])

e = singular_spaces.identities(d, A, U, S, V, k)
right, left, orth_U, orth_V, UtA, VtAt, dCU, dCV, d_right, d_left = (
    e[x] for x in ("right", "left", "orth_U", "orth_V", "UtA", "VtAt", "dCU", "dCV", "d_right", "d_left"))

# ---------------------------------------------------------------- inside span(U), span(V): as the thin SVD
a, b = singular_spaces.project(d, U, V, e)
dS_sol, dCU_sol, dCV_sol = singular_spaces.inside(d, S, a, b, e)

# ---------------------------------------------------------------- outside: WU, WV
WU = d.introduce("WU", dU - U * dCU)
WV = d.introduce("WV", dV - V * dCV)
wu_def = d.identity("definition of WU", WU, dU - U * dCU)
wv_def = d.identity("definition of WV", WV, dV - V * dCV)
dU_of_W = d.solve_for(wu_def, dU)
dV_of_W = d.solve_for(wv_def, dV)
wu_perp = d.use_definition(d.substitute(d.left_multiply(wu_def, U.T, "U^T WU"), orth_U, "substitute U^T U = I"), dCU,
                           "substitute dCU = U^T dU: U^T WU = 0")
wv_perp = d.use_definition(d.substitute(d.left_multiply(wv_def, V.T, "V^T WV"), orth_V, "substitute V^T V = I"), dCV,
                           "substitute dCV = V^T dV: V^T WV = 0")

wu = d.replace(d.replace(d_right, dU_of_W), dV_of_W, "substitute dU = U dCU + WU, dV = V dCV + WV")
wu = d.left_multiply(wu, Identity(m) - U * U.T, "project with I - U U^T")
wu = d.substitute(wu, right, "substitute A V = U S")
wu = d.substitute(wu, UtA, "substitute U^T A = S V^T")
wu = d.substitute(wu, orth_U, "substitute U^T U = I")
wu = d.substitute(wu, wu_perp, "substitute U^T WU = 0")
wu = d.substitute(wu, wv_perp, "substitute V^T WV = 0")
wu = d.right_multiply(wu, Inverse(S), "right-multiply by S^-1")
WU_of_WV = d.solve_for(wu, WU)

wv = d.replace(d.replace(d_left, dU_of_W), dV_of_W, "substitute dU = U dCU + WU, dV = V dCV + WV")
wv = d.left_multiply(wv, Identity(n) - V * V.T, "project with I - V V^T")
wv = d.substitute(wv, left, "substitute A^T U = V S")
wv = d.substitute(wv, VtAt, "substitute V^T A^T = S U^T")
wv = d.substitute(wv, orth_V, "substitute V^T V = I")
wv = d.substitute(wv, wu_perp, "substitute U^T WU = 0")
wv = d.substitute(wv, wv_perp, "substitute V^T WV = 0")
wv = d.replace(wv, WU_of_WV, "eliminate WU")
wv = d.right_multiply(wv, S, "right-multiply by S")
wv = d.substitute(wv, left, "substitute A^T U = V S")
WV_sol = d.solve_shifted(wv, WV, A.T * A, None, S * S, V,
                         "solve (A^T A - s_i^2 I) wv_i = -r_i on the complement of span(V)")
WU_sol = d.replace(WU_of_WV, WV_sol, "substitute WV")

# ---------------------------------------------------------------- assemble
dU_sol = d.replace(d.replace(dU_of_W, WU_sol), dCU_sol)
dV_sol = d.replace(d.replace(dV_of_W, WV_sol), dCV_sol)
d.set_jvp(dU=dU_sol, dS=dS_sol, dV=dV_sol)
d.derive_vjp()

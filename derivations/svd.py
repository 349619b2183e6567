"""Singular value decomposition ``A = U S V^H``, A m×n real or complex, k = min(m, n), thin factors.

The derivation runs over complex matrices: ``^T`` below is the conjugate transpose, ``sym``/``skew``
the Hermitian and anti-Hermitian parts; the engine also specialises every rule to real data.

Identities: ``A V = U S``, ``A^T U = V S``, ``U^T U = I``, ``V^T V = I`` (k×k), ``A = U S V^T``, S real.
``dCU = U^T dU`` and ``dCV = V^T dV`` are anti-Hermitian; projecting both differentiated identities
gives ``P + S dCV = dCU S + dS`` and ``P^T + S dCU = dCV S + dS`` with ``P = U^T dA V``.
Off the diagonal, combining them isolates ``dCU S² - S² dCU`` (and the same for ``dCV``), a
Hadamard split with ``E_ij = s_j² - s_i²``.  On the diagonal, the Hermitian part gives
``dS = diag(sym(P))``; the anti-Hermitian part gives only ``diag(dCU) - diag(dCV)``: the columns
``(u_j, v_j) -> e^{iθ_j} (u_j, v_j)`` leave ``A`` unchanged, a gauge, fixed here by
``diag(dCU) + diag(dCV) = 0``.  A loss is well defined only if its derivative along that gauge,
the derived residual ``R = diag(skew(U^T gU + V^T gV))``, vanishes; generated code reports one that
does not.  (For real data the gauge is a sign, the diagonal terms vanish, and the rules are those of
the real derivation.)  The parts of ``dU`` and ``dV`` outside span(U), span(V) follow from the
complement projections and need ``S^-1``: ``(I - UU^T) dA V S^-1``, ``(I - VV^T) dA^T U S^-1``
(each vanishes when its factor is square: the rules are also derived for those shapes, with
``U U^T = I`` or ``V V^T = I``, and the generated code picks them by shape).  Sizes: the projectors are m×m and n×n — the slip of the
hand-written GPU rule in seed 000 (``I - V V^T`` sized with m) cannot happen here.

References: J. Townsend, "Differentiating the singular value decomposition" (2016); Giles (2008);
Wan and Zhang, "Automatic differentiation for complex valued SVD" (2019).
"""
import numpy as np

import _singular_spaces as singular_spaces
from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Identity, Inverse, ZeroMatrix


# ---------------------------------------------------------------- numeric instances for the audit
def forward(A):
    U, s, Vh = np.linalg.svd(A, full_matrices=False)
    return {"U": U, "S": np.diag(s), "V": Vh.conj().T}


def align_phases(base, out):
    """Rotate each singular pair (u_j, v_j) by the phase (a sign for real data) that makes
    ``u0_j^H u_j + v0_j^H v_j`` real positive: the path then satisfies the gauge
    ``diag(U^H dU + V^H dV) = 0`` that the derivation fixes."""
    z = np.sum(base["U"].conj() * out["U"], axis=0) + np.sum(base["V"].conj() * out["V"], axis=0)
    phase = z.conj() / np.abs(z)
    return {"U": out["U"] * phase, "S": out["S"], "V": out["V"] * phase}


def sample(rng, m, n, k, field):
    """A with well-separated singular values in [1, ~k+1] and a random direction dA."""
    def randn(*shape):
        x = rng.standard_normal(shape)
        return x + 1j * rng.standard_normal(shape) if field == "complex" else x

    Q1, _ = np.linalg.qr(randn(m, k))
    Q2, _ = np.linalg.qr(randn(n, k))
    s = np.sort(rng.uniform(0, 0.5, k)) + 1 + np.arange(k)
    A = (Q1 * s) @ Q2.conj().T
    dA = randn(m, n)
    base, tan = fd_tangents(forward, {"A": A}, {"A": dA}, align=align_phases)
    return {"A": A, "dA": dA, "U": base["U"], "S": base["S"], "V": base["V"],
            "dU": tan["U"], "dS": tan["S"], "dV": tan["V"]}


# ---------------------------------------------------------------- declarations
d = Derivation("svd", __file__, title="thin singular value decomposition A = U S V^H (real or complex)",
               references=("Townsend, Differentiating the SVD (2016)", "Giles, NA-08-01 (2008)",
                           "Wan and Zhang, arXiv:1909.02659 (2019)"),
               field="complex")
m, n, k = d.dim("m"), d.dim("n"), d.dim("k")
A = d.input("A", m, n)
U = d.output("U", m, k, orthonormal=True, api="U")
S = d.output("S", k, k, diagonal=True, api="S")
V = d.output("V", n, k, orthonormal=True, api="V", public="Vh", form="adjoint")  # returned as Vh, like torch
d.api_outputs("U", "S", "V")
d.forward(runtime="svd")
dA, dU, dS, dV = d.tangent(A), d.tangent(U), d.tangent(S), d.tangent(V)
d.instances(sample, [{"m": 5, "n": 3, "k": 3, "field": "complex"}, {"m": 3, "n": 4, "k": 3, "field": "complex"},
                     {"m": 4, "n": 4, "k": 4, "field": "real"}, {"m": 3, "n": 5, "k": 3, "field": "real"},
                     {"m": 4, "n": 3, "k": 3, "field": "real"}, {"m": 3, "n": 3, "k": 3, "field": "complex"}])
d.symbolic_sizes = {"k": 2}  # explicit complex 3×3 / 3×2 / 2×2 matrices: k < m, n keeps the projections nontrivial

e = singular_spaces.identities(d, A, U, S, V, k)
recon = d.identity("thin reconstruction A = U S V^T", A, U * S * V.T)
orth_U, orth_V, dCU, dCV, d_right, d_left = (e[x] for x in ("orth_U", "orth_V", "dCU", "dCV", "d_right", "d_left"))

# ---------------------------------------------------------------- projections onto span(U), span(V)
a, b = singular_spaces.project(d, U, V, e)
T = d.imaginary_diagonal("Theta", k)  # the phases (u_j, v_j) -> e^{i theta_j} (u_j, v_j)
dS_sol, dCU_sol, dCV_sol = singular_spaces.inside(d, S, a, b, e, phases=T)

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

# ---------------------------------------------------------------- square factors
# U U^T = I where m = k (and V V^T = I where n = k): the complement terms vanish, and a square A
# needs four products for each rule, not five
d.square_variants(U, V)

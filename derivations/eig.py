"""Eigendecomposition of a general square matrix: ``A V = V L`` (``torch.linalg.eig``).

The derivation runs over complex matrices (``^T`` below is the conjugate transpose); ``L`` is a
diagonal of complex eigenvalues, ``V`` has unit-norm columns, as LAPACK's ``geev`` returns them.
Identities: ``A V = V L``, ``diag(V^T V) = I`` (unit columns), and, with ``V`` invertible (``A``
diagonalizable), ``V^-1 A = L V^-1``.  With ``dC = V^-1 dV``:

* ``V^-1 dA V + L dC - dC L = dL``: the diagonal gives ``dL = diag(V^-1 dA V)``, the off-diagonal
  ``dC = F ∘ (V^-1 dA V)`` with ``F_ij = 1/(l_j - l_i)`` (complex);
* the diagonal of ``dC`` is fixed by the unit columns (``Re diag(V^T dV) = 0``) up to its imaginary
  part: the phases ``v_j -> e^{iθ_j} v_j`` are a gauge, fixed by ``Im diag(dC) = 0``, with the
  residual ``Im diag(V^T gV)`` that a well-defined loss makes zero (torch checks the same);
* inside a cluster of equal eigenvalues of a diagonalizable ``A``, any invertible change of basis
  of the cluster's columns (renormalized) is a gauge, with its residual.

References: M. Giles, "An extended collection of matrix derivative results for forward and reverse
mode algorithmic differentiation", NA-08-01 (2008), §3.1; the normalisation as in
``torch.linalg.eig``'s derivative (its documentation, "gauge invariance").
"""
import numpy as np
import scipy.linalg
from sympy import Identity, ZeroMatrix

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Inverse, Sym


# ---------------------------------------------------------------- numeric instances for the audit
def forward(A):
    w, V = scipy.linalg.eig(A)
    order = np.lexsort((w.imag, w.real))
    V = V[:, order]
    return {"V": V / np.linalg.norm(V, axis=0), "L": np.diag(w[order])}


def align(base, out):
    """Match the eigenvalues to the base's (nearest), and rotate each eigenvector by the phase that
    makes ``(V0^-1 V)_jj`` real positive: the path satisfies the gauge ``Im diag(V^-1 dV) = 0``."""
    w0, w = np.diag(base["L"]), np.diag(out["L"])
    order = [int(np.argmin(abs(w - x))) for x in w0]
    V = out["V"][:, order]
    z = np.diag(np.linalg.solve(base["V"], V))  # diag(V0^-1 V) real positive: Im diag(dC) = 0
    return {"V": V * (z.conj() / np.abs(z)), "L": np.diag(w[order])}


def sample(rng, n, field):
    def randn(*shape):
        x = rng.standard_normal(shape)
        return x + 1j * rng.standard_normal(shape) if field == "complex" else x

    # a well-conditioned V and eigenvalues at least ~1 apart
    V = np.eye(n) + 0.3 * randn(n, n)
    w = np.arange(n) * 1.5 + 0.5 * (rng.uniform(-1, 1, n) + 1j * rng.uniform(-1, 1, n))
    A = (V * w) @ np.linalg.inv(V)
    dA = randn(n, n)
    base, tan = fd_tangents(forward, {"A": A}, {"A": dA}, align=align)
    return {"A": A, "dA": dA, "V": base["V"], "L": base["L"], "dV": tan["V"], "dL": tan["L"]}


# ---------------------------------------------------------------- declarations
d = Derivation("eig", __file__, title="eigendecomposition A V = V L of a general square matrix",
               references=("Giles, NA-08-01 (2008)",), field="complex")
n = d.dim("n")
A = d.input("A", n, n)
V = d.output("V", n, n)
L = d.output("L", n, n, complex_diagonal=True, api="w")
d.api_outputs("w", "V")  # as torch.linalg.eig
d.forward(runtime="eig")
dA, dV, dL = d.tangent(A), d.tangent(V), d.tangent(L)
d.instances(sample, [{"n": 3, "field": "complex"}, {"n": 4, "field": "complex"}, {"n": 4, "field": "real"},
                     {"n": 5, "field": "real"}])

eig = d.identity("eigenvector equation", A * V, V * L)
unit = d.identity("unit-norm columns", d.diag(V.T * V), Identity(n))
left = d.left_multiply(eig, Inverse(V), "left-multiply by V^-1: V^-1 A V = L")
left = d.right_multiply(left, Inverse(V), "right-multiply by V^-1: V^-1 A = L V^-1")

# ---------------------------------------------------------------- JVP
s = d.differentiate(eig, "differentiate A V = V L")
s = d.left_multiply(s, Inverse(V), "left-multiply by V^-1")
s = d.substitute(s, left, "substitute V^-1 A = L V^-1")
dC = d.introduce("dC", Inverse(V) * dV)
s = d.use_definition(s, dC)
s, E = d.hadamard_split(s, L, dC, "E")
dL_sol = d.solve_for(d.diagonal_part(s, "diagonal part (E_ii = 0)"), dL)
# inside a cluster of equal eigenvalues, a change of basis of its columns is a gauge
K = d.clusters(L)
Omega = d.parameter("Omega", n, n, within=K)
d.gauge("changes of basis inside clusters of equal eigenvalues: V_c -> V_c M, renormalized", Omega,
        {V: V * Omega - V * d.diag(Sym(V.T * V * Omega))}, fix=(d.diag(dC), d.diag(dC)))
# off the diagonal: E ∘ dC = -(V^-1 dA V) off the diagonal; the diagonal of dC stays an unknown
dC_sol, F = d.solve_offdiagonal(s, dC, E, "F", diagonal=d.identity("diag(dC) is not given by A V = V L",
                                                                     d.diag(dC), d.diag(dC)), clusters=K)
# its real part follows from the unit columns: diag(dV^T V + V^T dV) = 0 with dV = V dC
norm = d.differentiate(unit, "differentiate diag(V^T V) = I")
dV_of_dC = d.invert_definition(dC, dV)
norm = d.replace(norm, dV_of_dC, "substitute dV = V dC")
norm = d.replace(norm, dC_sol, "substitute dC = F ∘ (V^-1 dA V) + diag(dC)")
norm = d.substitute(norm, unit, "substitute diag(V^T V) = I")
real_part = d.hermitian_part(norm, "Hermitian (real) part of the diagonal")
# its imaginary part is the eigenvectors' phases: a gauge
T = d.imaginary_diagonal("Theta", n)
phase = d.gauge("v_j -> e^{i theta_j} v_j", T, {V: V * T}, fix=(d.diag(Sym(dC)), d.diag(dC)))
diag_dC = d.substitute(real_part, phase, "substitute the gauge choice diag(sym(dC)) = diag(dC)")
diag_dC = d.solve_for(diag_dC, d.diag(dC))
# dV = V dC
dV_sol = d.replace(dV_of_dC, dC_sol, "substitute dC = F ∘ (V^-1 dA V) + diag(dC)")
dV_sol = d.replace(dV_sol, diag_dC, "substitute diag(dC)")
d.set_jvp(dV=dV_sol, dL=dL_sol)

# ---------------------------------------------------------------- VJP
d.derive_vjp()

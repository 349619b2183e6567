"""Hermitian (real symmetric) eigendecomposition, full spectrum: ``A = U D U^H``.

The derivation runs over complex matrices (``^T`` below is the conjugate transpose, ``sym``/``skew``
the Hermitian/anti-Hermitian parts); the engine specialises the rules to real symmetric data.
Identities: ``A U = U D``, ``U^T U = I`` (and ``U U^T = I``, U square), ``A = A^T``, ``D`` real
diagonal.  The eigenvalues are returned as the vector ``w`` (the diagonal of ``D``), the
eigenvectors as ``V``.  ``dC = U^T dU`` is anti-Hermitian; off its diagonal it follows from the
Hadamard split, its diagonal is free: ``u_j -> e^{iθ_j} u_j`` leaves ``A`` unchanged, a gauge fixed
by ``diag(dC) = 0``, with the residual ``R = diag(skew(U^T gU))`` that a well-defined loss makes zero.

References: M. Giles, "An extended collection of matrix derivative results for forward and reverse
mode algorithmic differentiation", NA-08-01 (2008); C. Ionescu et al., "Matrix backpropagation
for deep networks with structured layers", ICCV 2015.
"""
import numpy as np

import _eigenspaces as eigenspaces
from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation


# ---------------------------------------------------------------- numeric instances for the audit
def forward(A):
    w, V = np.linalg.eigh(A)
    return {"U": V, "D": np.diag(w)}


def align_phases(base, out):
    """Rotate each eigenvector by the phase (a sign for real data) that makes ``u0_j^H u_j`` real
    positive: the path then satisfies the gauge ``diag(U^H dU) = 0``."""
    z = np.sum(base["U"].conj() * out["U"], axis=0)
    return {"U": out["U"] * (z.conj() / np.abs(z)), "D": out["D"]}


def sample(rng, n, field):
    """A random Hermitian A with well-separated eigenvalues, a Hermitian direction dA, and the
    output tangents measured by finite differences of numpy.linalg.eigh."""
    def randn(*shape):
        x = rng.standard_normal(shape)
        return x + 1j * rng.standard_normal(shape) if field == "complex" else x

    Q, _ = np.linalg.qr(randn(n, n))
    w = np.sort(rng.uniform(-2, 2, n)) + np.arange(n)  # gaps >= ~1
    A = (Q * w) @ Q.conj().T
    A = (A + A.conj().T) / 2
    dA = randn(n, n)
    dA = (dA + dA.conj().T) / 2
    base, tan = fd_tangents(forward, {"A": A}, {"A": dA}, align=align_phases)
    return {"A": A, "dA": dA, "U": base["U"], "D": base["D"], "dU": tan["U"], "dD": tan["D"]}


# ---------------------------------------------------------------- declarations
d = Derivation("eigh", __file__, title="Hermitian eigendecomposition A = U D U^H (full spectrum, real or complex)",
               references=("Giles, NA-08-01 (2008)", "Ionescu et al., ICCV 2015"), field="complex")
n = d.dim("n")
A = d.input("A", n, n, symmetric=True)
U = d.output("U", n, n, orthonormal=True, api="V")
D = d.output("D", n, n, diagonal=True, api="w")
d.api_outputs("w", "V")  # as torch.linalg.eigh
d.forward(runtime="eigh")
dA, dU, dD = d.tangent(A), d.tangent(U), d.tangent(D)
d.instances(sample, [{"n": 4, "field": "complex"}, {"n": 5, "field": "complex"}, {"n": 4, "field": "real"},
                     {"n": 6, "field": "real"}])

e = eigenspaces.identities(d, A, U, D, n)

# ---------------------------------------------------------------- JVP
# dD = diag(U^T dA U), dC = U^T dU = F ∘ (U^T dA U) with the phase and cluster gauges
dD_sol, dC, dC_sol = eigenspaces.eigenvalues_and_rotation(d, e, n)
# dU = U dC, since U U^T = I
back = d.left_multiply(d.identity("definition of dC", dC, U.T * dU), U, "left-multiply dC = U^T dU by U")
back = d.substitute(back, e["complete"], "substitute U U^T = I")
dU_sol = d.replace(d.solve_for(back, dU), dC_sol)
d.set_jvp(dU=dU_sol, dD=dD_sol)

# ---------------------------------------------------------------- VJP
d.derive_vjp()

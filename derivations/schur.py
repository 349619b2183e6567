"""The Schur decomposition ``A = Z T Z^H`` (``scipy.linalg.schur``): ``Z`` unitary (orthogonal),
``T`` upper triangular with the eigenvalues of ``A`` on its diagonal; the complex form
(``output="complex"``), and the real form (``output="real"``, the default) where the eigenvalues of
a real ``A`` are real.

The derivation runs over complex matrices (``^T`` is the conjugate transpose); the engine also
specialises the rules to real data.  With the anti-Hermitian ``dC = Z^T dZ``, differentiating
``A Z = Z T`` and multiplying by ``Z^T`` gives ``Z^T dA Z = dC T - T dC + dT``.  Its strictly lower
part does not see the upper triangular ``dT``, nor the upper part and the diagonal of ``dC``:
``tril₋(L T - T L) = tril₋(Z^T dA Z)`` for ``L = tril₋(dC)``, a triangular Sylvester-type system,
solved column by column (:meth:`Derivation.solve_strictly_lower`, one solution where the
eigenvalues are distinct).  The diagonal of ``dC`` is imaginary: the phases ``z_j -> e^{iθ_j} z_j``
(with ``T -> Θ^H T Θ``) are a gauge, fixed by ``diag(dC) = 0``, with the residual that a loss
independent of the phases makes zero (``|T|``, ``diag(T)``, the projectors ``Z[:, :k] Z[:, :k]^H``
onto the leading invariant subspaces); real data has signs instead (no residual).  Then
``dZ = Z dC`` and ``dT = Z^T dA Z + T dC - dC T``; the engine transposes the JVP, the triangular
solve into its adjoint (a triangular system with ``T^H``, row by row).

Repeated eigenvalues, defective or not, leave ``Z`` without a derivative: the generated solve
raises there, naming them.  A real Schur form with ``2 x 2`` blocks (complex eigenvalues of a real
``A``) is block triangular, which this derivation does not cover: its derivative raises and points
at ``output="complex"``.

References: G. W. Stewart, "Error and perturbation bounds for subspaces associated with certain
eigenvalue problems", SIAM Review 15 (1973); D. Kressner, "Numerical Methods for General and
Structured Eigenvalue Problems" (2005), §1.2.
"""
import numpy as np
import scipy.linalg

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Identity, ZeroMatrix


# ---------------------------------------------------------------- numeric instances for the audit
def forward(A):
    T, Z = scipy.linalg.schur(A, output="complex" if np.iscomplexobj(A) else "real")
    return {"T": T, "Z": Z}


def align(base, out):
    """Rotate each Schur vector by the phase (sign) that makes ``(Z0^H Z)_jj`` real positive: the path
    satisfies the gauge ``diag(Z^H dZ) = 0``; ``T`` follows (``Θ^H T Θ``)."""
    z = np.diag(base["Z"].conj().T @ out["Z"])
    phase = z.conj() / np.abs(z)
    return {"Z": out["Z"] * phase, "T": (phase.conj()[:, None] * out["T"]) * phase[None, :]}


def sample(rng, n, field):
    def randn(*shape):
        x = rng.standard_normal(shape)
        return x + 1j * rng.standard_normal(shape) if field == "complex" else x

    # eigenvalues at least ~1 apart (real ones for real data: a triangular real Schur form)
    w = np.arange(n) * 1.5 - n / 2 + (0.5 * (rng.uniform(-1, 1, n) + 1j * rng.uniform(-1, 1, n))
                                      if field == "complex" else 0.3 * rng.uniform(-1, 1, n))
    V = np.eye(n) + 0.3 * randn(n, n)
    A = (V * w) @ np.linalg.inv(V)
    A = A.real if field == "real" else A
    dA = randn(n, n)
    base, tan = fd_tangents(forward, {"A": A}, {"A": dA}, align=align)
    return {"A": A, "dA": dA, "T": base["T"], "Z": base["Z"], "dT": tan["T"], "dZ": tan["Z"]}


# ---------------------------------------------------------------- declarations
d = Derivation("schur", __file__, title="Schur decomposition A = Z T Z^H (T upper triangular, Z unitary)",
               references=("Stewart, SIAM Review 15 (1973)", "Kressner, Numerical Methods for General and Structured "
                           "Eigenvalue Problems (2005)"), field="complex")
n = d.dim("n")
A = d.input("A", n, n)
T = d.output("T", n, n, upper=True)
Z = d.output("Z", n, n, orthonormal=True)
d.api_outputs("T", "Z")
dA, dT, dZ = d.tangent(A), d.tangent(T), d.tangent(Z)
d.forward(host="scipy.linalg:schur", options={"output": "real"})
d.instances(sample, [{"n": 3, "field": "complex"}, {"n": 4, "field": "complex"}, {"n": 4, "field": "real"},
                     {"n": 5, "field": "real"}])

schur = d.identity("A Z = Z T", A * Z, Z * T)
orth = d.identity("Z^T Z = I", Z.T * Z, Identity(n))
square = d.identity("Z Z^T = I (Z is square)", Z * Z.T, Identity(n))
left = d.substitute(d.left_multiply(schur, Z.T, "left-multiply by Z^T"), orth, "substitute Z^T Z = I: Z^T A Z = T")
left = d.right_multiply(left, Z.T, "right-multiply by Z^T")
left = d.substitute(left, square, "substitute Z Z^T = I: Z^T A = T Z^T")

# ---------------------------------------------------------------- JVP
s = d.differentiate(schur, "differentiate: dA Z + A dZ = dZ T + Z dT")
s = d.left_multiply(s, Z.T, "left-multiply by Z^T")
s = d.substitute(s, orth, "substitute Z^T Z = I")
s = d.substitute(s, left, "substitute Z^T A = T Z^T")
dC = d.introduce("dC", Z.T * dZ, skew_by=d.differentiate(orth, "differentiate Z^T Z = I"))
s = d.use_definition(s, dC)  # Z^T dA Z + T dC = dC T + dT
low = d.strictly_lower_part(s, "strictly lower part: tril₋(dT) = 0 for the upper triangular dT")
L_sol = d.solve_strictly_lower(low, dC, T, "solve tril₋(L T - T L) = tril₋(Z^T dA Z) for L = tril₋(dC)")
# the diagonal of the anti-Hermitian dC: the phases of Z's columns, a gauge
Theta = d.imaginary_diagonal("Theta", n)
phase = d.gauge("z_j -> e^{i theta_j} z_j, T -> Theta^H T Theta", Theta, {Z: Z * Theta, T: T * Theta - Theta * T},
                fix=(d.diag(dC), ZeroMatrix(n, n)))
dC_sol = d.skew_from_lower(L_sol, dC, diagonal=phase)
dT_sol = d.replace(d.solve_for(s, dT), dC_sol, "substitute dC = L - L^T")
dZ_sol = d.replace(d.invert_definition(dC, dZ), dC_sol, "substitute dC = L - L^T")
d.set_jvp(dT=dT_sol, dZ=dZ_sol)

# ---------------------------------------------------------------- VJP
d.derive_vjp()

"""Steps shared by the derivations of the full Hermitian eigendecomposition (``eigh.py``,
``funm.py``): from ``A U = U D`` to ``dD`` and ``dC = U^T dU``, with the phase and the cluster gauges.

Files whose name starts with ``_`` are helpers, not derivations; each function records its steps
on the given :class:`~adjointgen.calculus.Derivation`, attributed to the calling line.
"""
from adjointgen.calculus import HadamardProduct, Identity, ZeroMatrix


def identities(d, A, U, D, n):
    """``A U = U D``, ``U^T U = I``, ``U U^T = I`` (U square) and ``U^T A = D U^T``."""
    e = {"U": U, "D": D}
    e["eig"] = d.identity("eigenvector equation", A * U, U * D)
    e["orth"] = d.identity("orthonormal columns", U.T * U, Identity(n))
    e["complete"] = d.identity("complete basis (U square)", U * U.T, Identity(n))
    e["left_eig"] = d.transpose(e["eig"], "transpose, with A and D symmetric: U^T A = D U^T")
    return e


def eigenvalues_and_rotation(d, e, n):
    """``dD = diag(U^T dA U)`` and the anti-Hermitian ``dC = U^T dU = F ∘ (U^T dA U)``, with
    ``F_ij = 1/(d_j - d_i)``: the phases ``u_j -> e^{iθ_j} u_j`` (``diag(dC) = 0``) and the rotations
    inside clusters of equal eigenvalues (zero there) are gauges.  Returns ``(dD, dC, dC_sol)``."""
    U, D = e["U"], e["D"]
    dU, dD = d.tangent(U), d.tangent(D)
    # differentiate the eigenvector equation: dA U + A dU = dU D + U dD, and project onto the eigenbasis
    s = d.differentiate(e["eig"], "differentiate A U = U D")
    s = d.left_multiply(s, U.T, "left-multiply by U^T")
    s = d.substitute(s, e["left_eig"], "substitute U^T A = D U^T")
    s = d.substitute(s, e["orth"], "substitute U^T U = I")
    # dC = U^T dU is skew-symmetric (anti-Hermitian): differentiate U^T U = I
    dC = d.introduce("dC", U.T * dU, skew_by=d.differentiate(e["orth"], "differentiate U^T U = I"))
    s = d.use_definition(s, dC)
    # D dC - dC D = E ∘ dC
    s, E = d.hadamard_split(s, D, dC, "E")
    # the real part of the diagonal gives dD (E_ii = 0; diag(dC) is imaginary)
    dD_sol = d.solve_for(d.hermitian_part(d.diagonal_part(s, "diagonal part (E_ii = 0)"),
                                          "Hermitian part (dD real)"), dD)
    # diag(dC) is free: the phases of the eigenvectors, a gauge
    T = d.imaginary_diagonal("Theta", n)
    fix = d.gauge("u_j -> e^{i theta_j} u_j", T, {U: U * T}, fix=(d.diag(dC), ZeroMatrix(n, n)))
    # inside a cluster of equal eigenvalues E_ij = 0: the rotations U_c -> U_c Q are a gauge too
    K = d.clusters(D, completes=U)
    Omega = d.parameter("Omega", n, n, skew=True, within=K)
    d.gauge("rotations inside clusters of equal eigenvalues: U_c -> U_c Q", Omega, {U: U * Omega},
            fix=(HadamardProduct(K, dC), ZeroMatrix(n, n)))
    # off the diagonal, solve E ∘ dC = -U^T dA U for the anti-Hermitian dC (zero inside the clusters)
    dC_sol, F = d.solve_offdiagonal(s, dC, E, "F", diagonal=fix, clusters=K)
    return dD_sol, dC, dC_sol

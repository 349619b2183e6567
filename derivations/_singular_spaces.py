"""Steps shared by the SVD derivations (``svd.py``, ``svds.py``): the singular-vector identities,
their differentials, and the part of ``dU``, ``dV`` inside span(U), span(V).

Files whose name starts with ``_`` are helpers, not derivations; each function records its steps
on the given :class:`~adjointgen.calculus.Derivation`, attributed to the calling line.
"""
from adjointgen.calculus import HadamardProduct, Identity, ZeroMatrix


def identities(d, A, U, S, V, k):
    """``A V = U S``, ``A^T U = V S``, orthonormal columns, their transposes and differentials, and
    the anti-Hermitian (skew) ``dCU = U^T dU``, ``dCV = V^T dV``."""
    dU, dV = d.tangent(U), d.tangent(V)
    e = {}
    e["right"] = d.identity("right singular vectors: A V = U S", A * V, U * S)
    e["left"] = d.identity("left singular vectors: A^T U = V S", A.T * U, V * S)
    e["orth_U"] = d.identity("U^T U = I", U.T * U, Identity(k))
    e["orth_V"] = d.identity("V^T V = I", V.T * V, Identity(k))
    e["UtA"] = d.transpose(e["left"], "transpose A^T U = V S: U^T A = S V^T")
    e["VtAt"] = d.transpose(e["right"], "transpose A V = U S: V^T A^T = S U^T")
    e["dCU"] = d.introduce("dCU", U.T * dU, skew_by=d.differentiate(e["orth_U"], "differentiate U^T U = I"))
    e["dCV"] = d.introduce("dCV", V.T * dV, skew_by=d.differentiate(e["orth_V"], "differentiate V^T V = I"))
    e["d_right"] = d.differentiate(e["right"], "differentiate A V = U S")
    e["d_left"] = d.differentiate(e["left"], "differentiate A^T U = V S")
    e["U"], e["V"] = U, V
    return e


def project(d, U, V, e):
    """Both differentiated identities projected onto the singular vectors:
    ``P + S dCV = dCU S + dS`` and ``P^T + S dCU = dCV S + dS`` with ``P = U^T dA V``."""
    a = d.left_multiply(e["d_right"], U.T, "left-multiply dA V + A dV = dU S + U dS by U^T")
    a = d.substitute(a, e["UtA"], "substitute U^T A = S V^T")
    a = d.substitute(a, e["orth_U"], "substitute U^T U = I")
    a = d.use_definition(d.use_definition(a, e["dCU"]), e["dCV"])
    b = d.left_multiply(e["d_left"], V.T, "left-multiply dA^T U + A^T dU = dV S + V dS by V^T")
    b = d.substitute(b, e["VtAt"], "substitute V^T A^T = S U^T")
    b = d.substitute(b, e["orth_V"], "substitute V^T V = I")
    b = d.use_definition(d.use_definition(b, e["dCU"]), e["dCV"])
    return a, b


def inside(d, S, a, b, e, *, phases=None):
    """``dCU``, ``dCV`` from the projected identities (a), (b), through their sum and difference.

    ``dCP = dCU + dCV`` and ``dCM = dCU - dCV``: ``(a) + (b)`` gives ``P + P^T = dCP S - S dCP + 2 dS``,
    a Hadamard split with the gaps ``s_j - s_i``; ``(a) - (b)`` gives ``P - P^T = dCM S + S dCM``, with
    the sums ``s_i + s_j``.  Inside a cluster of equal singular values the gaps vanish and ``dCP`` is
    free: the rotations ``(U_c, V_c) -> (U_c Q, V_c Q)``, a gauge (its residual is derived); ``dCM``
    is determined wherever ``s_i + s_j > 0``, its diagonal included (the phase term of complex data).
    ``phases``: a complex derivation's phase parameter; ``diag(dCP)`` is then the gauge of the phases,
    fixed to zero.  Returns ``(dS, dCU, dCV)`` solutions."""
    dCU, dCV = e["dCU"], e["dCV"]
    k = S.shape[0]
    plus = d.add(a, b, label="add (a) and (b): P + P^T + S (dCU + dCV) = (dCU + dCV) S + 2 dS")
    minus = d.subtract(a, b, label="subtract (b) from (a): P - P^T = (dCU - dCV) S + S (dCU - dCV)")
    dCP = d.introduce("dCP", dCU + dCV)
    dCM = d.introduce("dCM", dCU - dCV)
    p_def = d.identity("definition of dCP", dCP, dCU + dCV)
    m_def = d.identity("definition of dCM", dCM, dCU - dCV)
    for sym, definition in ((dCP, p_def), (dCM, m_def)):  # sums of skew matrices are skew
        d.declare_skew(d.add(definition, d.transpose(definition), label=f"add {sym.name} = ... and its transpose"), sym)
    dCU_of = d.solve_for(d.add(p_def, m_def, label="add the definitions: dCP + dCM = 2 dCU"), dCU)
    dCV_of = d.solve_for(d.subtract(p_def, m_def, label="subtract them: dCP - dCM = 2 dCV"), dCV)
    plus = d.replace(d.replace(plus, dCU_of, "substitute dCU = (dCP + dCM)/2"), dCV_of, "substitute dCV = (dCP - dCM)/2")
    minus = d.replace(d.replace(minus, dCU_of, "substitute dCU = (dCP + dCM)/2"), dCV_of, "substitute dCV = (dCP - dCM)/2")
    # the diagonal: dS from the Hermitian part (diag(dCP S - S dCP) = 0)
    diag_plus = d.diagonal_part(plus, "diagonal part")
    if phases is not None:
        diag_plus = d.hermitian_part(diag_plus, "Hermitian part: diag(dCP) is imaginary")
    dS_sol = d.solve_for(diag_plus, d.tangent(S))
    fix = None
    if phases is not None:
        fix = d.gauge("(u_j, v_j) -> e^{i theta_j} (u_j, v_j)", phases, {e["U"]: e["U"] * phases, e["V"]: e["V"] * phases},
                      fix=(d.diag(dCP), ZeroMatrix(k, k)))
    # off the diagonal: the gaps, with the rotations inside clusters as a gauge
    plus, E = d.hadamard_split(plus, S, dCP, "E")
    K = d.clusters(S, what="singular values", completes=(e["U"], e["V"]))
    Omega = d.parameter("Omega", k, k, skew=True, within=K)
    d.gauge("rotations inside clusters of equal singular values: (U_c, V_c) -> (U_c Q, V_c Q)", Omega,
            {e["U"]: e["U"] * Omega, e["V"]: e["V"] * Omega}, fix=(HadamardProduct(K, dCP), ZeroMatrix(k, k)))
    dCP_sol, F = d.solve_offdiagonal(plus, dCP, E, "F", diagonal=fix, clusters=K)
    # the sums s_i + s_j, diagonal included
    minus, Es = d.hadamard_split(minus, S, dCM, "Es")
    dCM_sol, G = d.solve_hadamard(minus, dCM, Es, "G")
    dCU_sol = d.replace(d.replace(dCU_of, dCP_sol), dCM_sol)
    dCV_sol = d.replace(d.replace(dCV_of, dCP_sol), dCM_sol)
    return dS_sol, dCU_sol, dCV_sol

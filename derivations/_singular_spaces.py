"""Steps shared by the SVD derivations (``svd.py``, ``svds.py``): the singular-vector identities,
their differentials, and the part of ``dU``, ``dV`` inside span(U), span(V).

Files whose name starts with ``_`` are helpers, not derivations; each function records its steps
on the given :class:`~adjointgen.calculus.Derivation`, attributed to the calling line.
"""
from adjointgen.calculus import Identity


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


def inside(d, S, a, b, e, dCU_diagonal=None, dCV_diagonal=None):
    """``dCU``, ``dCV`` off the diagonal: ``(a) S + S (b)`` eliminates ``dCV`` and leaves
    ``dCU S² - S² dCU``, a Hadamard split with ``E_ij = s_j² - s_i²``; ``S (a) + (b) S`` likewise.
    Their diagonals are zero (real) or given (complex, after the gauge)."""
    dCU, dCV = e["dCU"], e["dCV"]
    cu = d.add(d.right_multiply(a, S, "right-multiply by S"), d.left_multiply(b, S, "left-multiply by S"),
               label="add: the S dCV S terms cancel")
    cu, E = d.hadamard_split(cu, S, dCU, "E")
    dCU_sol, F = d.solve_offdiagonal(cu, dCU, E, "F", diagonal=dCU_diagonal)
    cv = d.add(d.left_multiply(a, S, "left-multiply by S"), d.right_multiply(b, S, "right-multiply by S"),
               label="add: the S dCU S terms cancel")
    cv, E2 = d.hadamard_split(cv, S, dCV, "E")
    dCV_sol, _ = d.solve_offdiagonal(cv, dCV, E2, "F", diagonal=dCV_diagonal)
    return dCU_sol, dCV_sol

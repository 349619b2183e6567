"""Determinant ``det A`` of a square ``A``, real or complex (``torch.linalg.det``), differentiable
at singular ``A`` too.

The identity ``det = det(A)`` differentiates by Jacobi's formula in its adjugate form,
``d det = tr(adj(A) dA)``, which holds for every ``A`` (the form ``det(A) tr(A^-1 dA)`` of
``slogdet`` needs ``A`` invertible).  Transposing gives ``gA = conj(g) adj(A)^H``: the matrix of
cofactors, which is finite and nonzero at rank ``n - 1``, where the gradient of ``det`` is nonzero
although ``det`` is zero.  Generated code computes ``adj(A)`` with a runtime routine (``det(A) A^-1``
from one LU where ``A`` is well conditioned, the SVD otherwise).

References: J. R. Magnus, H. Neudecker, "Matrix Differential Calculus with Applications in
Statistics and Econometrics" (3rd ed., 2019), ch. 8; M. Giles, NA-08-01 (2008).
"""
import numpy as np

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Det


def forward(A):
    return {"det": np.array([[np.linalg.det(A)]])}


def sample(rng, n, field):
    def randn(*shape):
        z = rng.standard_normal(shape)
        return z + 1j * rng.standard_normal(shape) if field == "complex" else z

    A = randn(n, n) + np.sqrt(n) * np.eye(n)
    dA = randn(n, n)
    base, tangents = fd_tangents(forward, {"A": A}, {"A": dA})
    return {"A": A, "dA": dA, "det": base["det"], "ddet": tangents["det"]}


d = Derivation("det", __file__, title="determinant of a square matrix (real or complex)",
               references=("Magnus and Neudecker (2019), ch. 8", "Giles, NA-08-01 (2008)"), field="complex")
n = d.dim("n")
A = d.input("A", n, n)
det = d.output("det", 1, 1)
ddet = d.tangent(det)
d.forward(runtime="det", saves={"A": "lu"})
d.instances(sample, [{"n": 3, "field": "complex"}, {"n": 4, "field": "complex"}, {"n": 3, "field": "real"},
                     {"n": 5, "field": "real"}])
d.symbolic_sizes = {"n": 2}

definition = d.identity("det = det(A)", det, Det(A))

# ---------------------------------------------------------------- JVP
s = d.differentiate(definition, "differentiate (Jacobi's formula): ddet = tr(adj(A) dA)")
d.set_jvp(ddet=d.solve_for(s, ddet))

# ---------------------------------------------------------------- VJP
d.derive_vjp()

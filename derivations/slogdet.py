"""Sign and log-absolute determinant ``(sign, logabsdet) = slogdet(A)`` of an invertible A, real
or complex (``torch.linalg.slogdet``'s outputs and conventions).

The derivation runs over complex matrices (``^T`` is the conjugate transpose); the engine also
specialises the rules to real data.  Its defining identities are ``logabsdet = log|det A|`` and
``sign = det A / |det A|``; the engine differentiates them by Jacobi's formula: with
``t = tr(A^-1 dA)``, ``d logabsdet = sym(t)`` (the real part) and ``d sign = skew(t) sign`` (``i Im t``
times the phase; zero for real A, whose sign is piecewise constant).  Transposing under
``<X, Y> = Re tr(X^H Y)`` with cotangents ``g`` (real) and ``h`` (complex) gives
``gA = A^-H (g + skew(h sign^H)) `` (times the identity): one solve with the LU factors of the
forward.

References: M. Giles, NA-08-01 (2008); J. R. Magnus, H. Neudecker, "Matrix Differential Calculus
with Applications in Statistics and Econometrics" (3rd ed., 2019), ch. 8.
"""
import numpy as np

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, LogAbsDet, SignDet


def forward(A):
    sign, logabsdet = np.linalg.slogdet(A)
    return {"sign": np.array([[sign]]), "logabsdet": np.array([[logabsdet]])}


def sample(rng, n, field):
    A = rng.standard_normal((n, n)) + 2 * np.sqrt(n) * np.eye(n)  # well conditioned
    A[[0, 1]] = A[[1, 0]]  # a negative determinant: the sign matters
    dA = rng.standard_normal((n, n))
    if field == "complex":
        A = A + 1j * rng.standard_normal((n, n))
        dA = dA + 1j * rng.standard_normal((n, n))
    base, tangents = fd_tangents(forward, {"A": A}, {"A": dA})
    return {"A": A, "dA": dA, "sign": base["sign"], "logabsdet": base["logabsdet"].real,
            "dsign": tangents["sign"], "dlogabsdet": tangents["logabsdet"].real}


d = Derivation("slogdet", __file__, title="sign and log-absolute determinant of a square matrix (real or complex)",
               references=("Giles, NA-08-01 (2008)", "Magnus and Neudecker (2019), ch. 8"), field="complex")
n = d.dim("n")
A = d.input("A", n, n)
sign = d.output("sign", 1, 1)
logabsdet = d.output("logabsdet", 1, 1, diagonal=True)  # a real scalar
dsign, dlogabsdet = d.tangent(sign), d.tangent(logabsdet)
d.api_outputs("sign", "logabsdet")
d.forward(runtime="slogdet", saves={"A": "lu"})
d.instances(sample, [{"n": 3, "field": "complex"}, {"n": 4, "field": "complex"}, {"n": 3, "field": "real"},
                     {"n": 5, "field": "real"}])
d.symbolic_sizes = {"n": 2}

modulus = d.identity("logabsdet = log|det A|", logabsdet, LogAbsDet(A))
phase = d.identity("det A / |det A| = sign", SignDet(A), sign)

# ---------------------------------------------------------------- JVP
s = d.differentiate(modulus, "differentiate (Jacobi's formula): dlogabsdet = sym(tr(A^-1 dA))")
p = d.differentiate(phase, "differentiate (Jacobi's formula): skew(tr(A^-1 dA)) sgn det A = dsign")
p = d.substitute(p, phase, "substitute det A / |det A| = sign")
d.set_jvp(dlogabsdet=d.solve_for(s, dlogabsdet), dsign=d.solve_for(p, dsign))

# ---------------------------------------------------------------- VJP
d.derive_vjp()

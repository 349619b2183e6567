"""Triangular solve ``X = A^-1 B``: A n×n lower triangular and invertible, B n×p, from ``A X = B``,
real or complex (``^T`` below is the conjugate transpose).

Only A's lower triangle is an input: its tangent ``dA`` is lower triangular, so the rule's ``gA`` is
the lower triangle of ``-A^-T gX X^T`` (the transposition projects onto the input's structure), and
every ``A^-1`` is a triangular solve.  ``torch.linalg.solve_triangular``'s other cases reduce to this
one in ``adjointgen.torch.solve_triangular``: an upper triangular A is the lower triangular
``J A J`` with ``J`` the reversal permutation, ``left=False`` is the transposed system, and
``unitriangular=True`` replaces A's diagonal by ones before the solve (so its gradient there is zero).

References: M. Giles, NA-08-01 (2008).
"""
import numpy as np

from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation, Inverse


def forward(A, B):
    return {"X": np.linalg.solve(A, B)}


def sample(rng, n, p, field):
    """A lower triangular A with a dominant diagonal (well conditioned), a lower triangular
    direction dA, and the tangent of X by finite differences."""
    def randn(*shape):
        x = rng.standard_normal(shape)
        return x + 1j * rng.standard_normal(shape) if field == "complex" else x

    A = np.tril(randn(n, n)) + 2 * np.sqrt(n) * np.eye(n)
    B = randn(n, p)
    dA, dB = np.tril(randn(n, n)), randn(n, p)
    base, tangents = fd_tangents(forward, {"A": A, "B": B}, {"A": dA, "B": dB})
    return {"A": A, "B": B, "dA": dA, "dB": dB, "X": base["X"], "dX": tangents["X"]}


d = Derivation("solve_triangular", __file__, title="triangular solve X = A^-1 B, A lower triangular (real or complex)",
               references=("Giles, NA-08-01 (2008)",), field="complex")
n, p = d.dim("n"), d.dim("p")
A = d.input("A", n, n, lower=True)
B = d.input("B", n, p)
X = d.output("X", n, p)
dX = d.tangent(X)
d.forward(runtime="solve_lower")
d.instances(sample, [{"n": 3, "p": 2, "field": "complex"}, {"n": 4, "p": 1, "field": "complex"},
                     {"n": 4, "p": 1, "field": "real"}, {"n": 5, "p": 5, "field": "real"}])

system = d.identity("A X = B", A * X, B)

# ---------------------------------------------------------------- JVP
s = d.differentiate(system, "differentiate: dA X + A dX = dB")
s = d.left_multiply(s, Inverse(A), "left-multiply by A^-1 (a triangular solve)")
d.set_jvp(dX=d.solve_for(s, dX))

# ---------------------------------------------------------------- VJP
d.derive_vjp()

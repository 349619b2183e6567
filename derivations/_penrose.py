"""Steps shared by the derivations that rest on the Moore–Penrose pseudo-inverse (``pinv.py``,
``lstsq.py``): the tangent of ``X = A⁺`` at constant rank, from the four Penrose identities.

Files whose name starts with ``_`` are helpers, not derivations; each function records its steps
on the given :class:`~adjointgen.calculus.Derivation`, attributed to the calling line.
"""
from adjointgen.calculus import Identity, Transpose


def pseudo_inverse_tangent(d, A, X, m, n):
    """``dX`` for ``X = A⁺`` (``A`` m×n, ``X`` n×m): the tangent is split by the projectors ``X A``
    and ``A X`` into four blocks, ``dX = XA dX AX + XA dX (I - AX) + (I - XA) dX AX +
    (I - XA) dX (I - AX)``; each block follows from one differentiated Penrose identity, and their
    sum is ``dX``.  Returns the equation solved for ``dX``."""
    dX = d.tangent(X)

    def say(text):  # the labels name the derivation's symbols
        return text.replace("dX", "d" + X.name).replace("X", X.name).replace("A", A.name)

    penrose1 = d.identity(say("Penrose 1: A X A = A"), A * X * A, A)
    penrose2 = d.identity(say("Penrose 2: X A X = X"), X * A * X, X)
    penrose3 = d.identity(say("Penrose 3: (A X)^T = A X"), Transpose(A * X), A * X)
    penrose4 = d.identity(say("Penrose 4: (X A)^T = X A"), Transpose(X * A), X * A)
    AtAX = d.substitute(d.transpose(penrose1, say("transpose Penrose 1: A^T X^T A^T = A^T")), penrose3,
                        say("substitute X^T A^T = A X: A^T A X = A^T"))
    XAAt = d.substitute(d.transpose(penrose1, "transpose Penrose 1 again"), penrose4,
                        say("substitute A^T X^T = X A: X A A^T = A^T"))
    I_AX = Identity(m) - A * X
    I_XA = Identity(n) - X * A

    # block X A dX A X, from Penrose 1
    b1 = d.differentiate(penrose1, say("differentiate A X A = A"))
    b1 = d.right_multiply(d.left_multiply(b1, X, say("left-multiply by X")), X, say("right-multiply by X"))
    b1 = d.substitute(b1, penrose2, say("substitute X A X = X"))
    b1 = d.isolate(b1, dX, X * A * dX * A * X)

    # block (I - XA) dX (I - AX), from Penrose 2
    b4 = d.differentiate(penrose2, say("differentiate X A X = X"))
    b4 = d.right_multiply(d.left_multiply(b4, I_XA, say("left-multiply by I - X A")), I_AX, say("right-multiply by I - A X"))
    b4 = d.substitute(b4, penrose1, say("substitute A X A = A"))
    b4 = d.substitute(b4, penrose2, say("substitute X A X = X"))
    b4 = d.isolate(b4, dX, I_XA * dX * I_AX)

    # block X A dX (I - AX), from Penrose 3
    b2 = d.differentiate(penrose3, say("differentiate (A X)^T = A X"))
    b2 = d.right_multiply(d.left_multiply(b2, X, say("left-multiply by X")), I_AX, say("right-multiply by I - A X"))
    b2 = d.substitute(b2, AtAX, say("substitute A^T A X = A^T"))
    b2 = d.substitute(b2, penrose2, say("substitute X A X = X"))
    b2 = d.isolate(b2, dX, X * A * dX * I_AX)

    # block (I - XA) dX A X, from Penrose 4
    b3 = d.differentiate(penrose4, say("differentiate (X A)^T = X A"))
    b3 = d.right_multiply(d.left_multiply(b3, I_XA, say("left-multiply by I - X A")), X, say("right-multiply by X"))
    b3 = d.substitute(b3, XAAt, say("substitute X A A^T = A^T"))
    b3 = d.substitute(b3, penrose2, say("substitute X A X = X"))
    b3 = d.isolate(b3, dX, I_XA * dX * A * X)

    # the blocks sum to dX
    total = d.add(b1, b2, b3, b4, label="sum of the four projector blocks")
    return d.solve_for(total, dX)

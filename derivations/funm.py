"""Matrix function ``X = f(A) = U f(D) U^H`` of a Hermitian (real symmetric) A, for a scalar ``f``.

The derivation is generic in ``f``: the engine differentiates ``f`` with SymPy.  From ``A U = U D``
come ``dD = diag(U^T dA U)`` and ``dC = U^T dU = F ∘ (U^T dA U)`` (the eigh steps).  Differentiating
``X = U f(D) U^T`` and projecting onto the eigenbasis gives ``U^T dX U = dC f(D) - f(D) dC +
f'(D) dD``; the Hadamard split turns ``dC f(D) - f(D) dC`` into ``E_f ∘ dC`` with
``E_f = f(d_j) - f(d_i)``, and ``E_f ∘ F`` is the matrix of divided differences
``L_ij = (f(d_i) - f(d_j)) / (d_i - d_j)``, whose limit on the diagonal is ``f'(d_i)``, the
coefficient of ``dD``: ``dX = U (L ∘ (U^T dA U)) U^T`` (Daleckii–Krein).  ``L`` is continuous across
equal eigenvalues, so no gauge enters the rule; the generated code evaluates ``L`` with forms that
do not cancel (:mod:`adjointgen.runtime.divided`).

References: Ju. L. Daleckii, S. G. Krein (1965); N. J. Higham, "Functions of Matrices" (2008), §3.
"""
import numpy as np
import scipy.linalg
import sympy as sp

import _eigenspaces as eigenspaces
from adjointgen.audit import fd_tangents
from adjointgen.calculus import Derivation

x, p = sp.symbols("x p", real=True)
#: the catalogue: each becomes a public function (p is a keyword argument of powm)
CATALOGUE = {"expm": sp.exp(x), "logm": sp.log(x), "sqrtm": sp.sqrt(x), "powm": x ** p}
#: the concrete functions the audit runs the derivation on (spectra positive: log, sqrt, powers)
AUDITED = {"exp": sp.exp(x), "log": sp.log(x), "sqrt": sp.sqrt(x), "cube": x ** 3, "pow": x ** sp.Rational(3, 2),
           "sin": sp.sin(x)}


#: the primary matrix function of every square matrix that each audited f restricts (SciPy's)
GENERAL = {"exp": scipy.linalg.expm, "log": scipy.linalg.logm, "sqrt": scipy.linalg.sqrtm,
           "cube": lambda A: A @ A @ A, "pow": lambda A: scipy.linalg.fractional_matrix_power(A, 1.5),
           "sin": scipy.linalg.sinm}


# ---------------------------------------------------------------- numeric instances for the audit
def general_forward(f):
    def forward(A):
        X = GENERAL[f](A)
        return {"X": X if np.iscomplexobj(A) else np.real_if_close(X, tol=1e6).real}
    return forward


def forward(A, fn):
    w, V = np.linalg.eigh(A)
    f = sp.lambdify(x, fn, "numpy")
    return {"X": (V * f(w)) @ V.conj().T, "U": V, "D": np.diag(w)}


def align_phases(base, out):
    z = np.sum(base["U"].conj() * out["U"], axis=0)
    return {"X": out["X"], "U": out["U"] * (z.conj() / np.abs(z)), "D": out["D"]}


def sample(rng, n, field, f):
    def randn(*shape):
        z = rng.standard_normal(shape)
        return z + 1j * rng.standard_normal(shape) if field == "complex" else z

    fn = AUDITED[f]
    Q, _ = np.linalg.qr(randn(n, n))
    w = np.sort(rng.uniform(0.5, 1.5, n)) + np.arange(n)  # positive, gaps >= ~0.5
    A = (Q * w) @ Q.conj().T
    A = (A + A.conj().T) / 2
    dA = randn(n, n)
    dA = (dA + dA.conj().T) / 2
    base, tan = fd_tangents(lambda A: forward(A, fn), {"A": A}, {"A": dA}, align=align_phases, h=1e-4)
    return {"A": A, "dA": dA, "X": base["X"], "U": base["U"], "D": base["D"], "dX": tan["X"], "dU": tan["U"],
            "dD": tan["D"], "f": sp.Lambda(x, fn), "general": general_forward(f)}


# ---------------------------------------------------------------- declarations
d = Derivation("funm", __file__, title="matrix function X = f(A) = U f(D) U^H of a Hermitian A",
               references=("Daleckii and Krein (1965)", "Higham, Functions of Matrices (2008)"), field="complex")
n = d.dim("n")
A = d.input("A", n, n, symmetric=True)
X = d.output("X", n, n, api="X")
U = d.output("U", n, n, orthonormal=True, api="V", auxiliary=True)
D = d.output("D", n, n, diagonal=True, api="w", auxiliary=True)
d.api_outputs("X", "w", "V")
f = d.function("f")
dA, dX = d.tangent(A), d.tangent(X)
d.instances(sample, [{"n": 4, "field": "complex", "f": "exp"}, {"n": 3, "field": "complex", "f": "log"},
                     {"n": 4, "field": "real", "f": "sqrt"}, {"n": 3, "field": "real", "f": "cube"},
                     {"n": 4, "field": "real", "f": "pow"}, {"n": 3, "field": "real", "f": "sin"}])
d.instantiate(f, CATALOGUE, options={"p": p})

e = eigenspaces.identities(d, A, U, D, n)
fA = d.identity("X = U f(D) U^T", X, U * d.apply(f, D) * U.T)

# ---------------------------------------------------------------- the eigendecomposition's tangents
dD_sol, dC, dC_sol = eigenspaces.eigenvalues_and_rotation(d, e, n)

# ---------------------------------------------------------------- JVP of X
s = d.differentiate(fA, "differentiate X = U f(D) U^T: dX = dU f(D) U^T + U f'(D) dD U^T + U f(D) dU^T")
s = d.right_multiply(d.left_multiply(s, U.T, "left-multiply by U^T"), U, "right-multiply by U")
s = d.substitute(s, e["orth"], "substitute U^T U = I")
s = d.use_definition(s, dC)  # U^T dX U = dC f(D) - f(D) dC + f'(D) dD
s, Ef = d.hadamard_split(s, D, dC, "Ef")
s = d.replace(d.replace(s, dC_sol), dD_sol)
s, L = d.combine_pairwise(s, (Ef, d.pairwise_matrix("F")), "L", diagonal=d.apply(f, D).derivative(),
                          label="the divided differences L = Ef ∘ F, with f'(d_i) on the diagonal")
s = d.right_multiply(d.left_multiply(s, U, "left-multiply by U"), U.T, "right-multiply by U^T")
s = d.substitute(s, e["complete"], "substitute U U^T = I")
d.set_jvp(partial=True, dX=d.solve_for(s, dX))

# ---------------------------------------------------------------- VJP
d.derive_vjp()

# ---------------------------------------------------------------- the general matrix function at Hermitian A
# exp, log, sqrt of any square matrix restrict to these: along a non-symmetric dA their derivative at
# Hermitian A is the same Daleckii-Krein form, not projected (checked against SciPy's general functions)
d.general_directions(A)

# ---------------------------------------------------------------- second derivatives
T = d.second_order(L)

"""Near degeneracy: the error of the gradient of a loss that does not depend on the basis inside a
near-degenerate pair (the projector onto it, contracted with a matrix), against central finite
differences, as the gap closes: ``agt.eigh`` against an eigh-composed projector under torch's
autograd, whose rule divides by the gap.

    python benchmarks/bench_degeneracy.py

The projector onto the pair is smooth in A whatever the gap inside the pair (the pair is 1 away
from the rest of the spectrum), so central differences (Richardson-extrapolated, steps 1e-3 and
5e-4) measure its exact derivative.  An error, not a time: this script is not part of
``run_all.py``'s table of ratios.
"""
import torch

import adjointgen.torch as agt

D = torch.float64


def with_spectrum(values, seed):
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(len(values), len(values), dtype=D, generator=g))
    A = (Q * torch.tensor(values, dtype=D)) @ Q.mT
    return 0.5 * (A + A.mT)


def projector_loss(eigh, G):
    def loss(A):
        w, V = eigh(A)
        P = V[:, :2] @ V[:, :2].mT  # the pair with the two smallest eigenvalues
        return (P * G).sum()
    return loss


def main(argv=None):
    G = torch.randn(4, 4, dtype=D, generator=torch.Generator().manual_seed(3))
    E = torch.randn(4, 4, dtype=D, generator=torch.Generator().manual_seed(11))
    E = E + E.mT
    h = 1e-3
    rows = []
    for gap in (1e-2, 1e-4, 1e-6, 1e-8, 1e-10, 1e-12, 0.0):
        A = with_spectrum([1.0, 1.0 + gap, 2.0, 3.0], seed=1)
        ours_loss, torch_loss = projector_loss(agt.eigh, G), projector_loss(torch.linalg.eigh, G)
        def central(step):
            return (ours_loss(A + step * E) - ours_loss(A - step * E)) / (2 * step)

        fd = float((4 * central(h / 2) - central(h)) / 3)
        out = []
        for loss in (ours_loss, torch_loss):
            Ar = A.clone().requires_grad_()
            (g,) = torch.autograd.grad(loss(Ar), Ar)
            out.append(abs(float((g * E).sum()) - fd) / max(1.0, abs(fd)))
        rows.append((gap, *out))
    print("relative error of <grad, E> against central differences, the projector onto a pair")
    print(f"{'gap':>8}  {'adjointgen':>11}  {'torch':>11}")
    for gap, ours, theirs in rows:
        print(f"{gap:8.0e}  {ours:11.2e}  {theirs:11.2e}")
    return rows


if __name__ == "__main__":
    main()

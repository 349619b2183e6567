"""Checks of values without host reads: the deferred check mode (adjointgen.runtime.verdict).

- With valid input, forward + backward of every dense operation reads no device value on the host
  beyond what torch.linalg's namesake reads (counted on the CPU, tests/host_reads.py), with the
  checks deferred -- the default on a GPU, where each read is a synchronisation.
- Deferred checks still find every error: raise_deferred() raises the error the eager mode raises
  at the call, and the gradients computed without a read are those of the eager mode.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

import adjointgen.torch as agt
from adjointgen.runtime import verdict
from adjointgen.runtime.checks import NotPositiveDefiniteError, SingularMatrixError
from adjointgen.runtime.gauge import DegenerateSubspaceError, PhaseDependentLossError

from host_reads import cases, counting, step


@pytest.fixture(autouse=True)
def _clean():
    verdict.raise_deferred()  # nothing left over from another test
    yield
    verdict.set_mode("auto")
    try:
        verdict.raise_deferred()
    except Exception:
        pass


@pytest.mark.parametrize("name", sorted(cases(5)))
def test_deferred_checks_read_no_more_than_torch(name):
    get, A, loss = cases(5)[name]
    counted = {}
    for label, namespace, mode in (("torch", torch.linalg, "auto"), ("ours", agt, "deferred")):
        with verdict.checking(mode):
            step(get(namespace), A, loss)  # warm (first-call caches)
            with counting() as reads:
                step(get(namespace), A, loss)
        counted[label] = sum(reads.values())
    assert counted["ours"] <= counted["torch"], (name, counted)
    verdict.raise_deferred()  # valid input: nothing to raise


@pytest.mark.parametrize("name", sorted(cases(5)))
def test_eager_checks_count_one_read_per_check(name):
    """The eager mode (a CPU tensor's default) reads; the counter sees it (so the test above can fail)."""
    get, A, loss = cases(5)[name]
    step(get(agt), A, loss)
    with counting() as reads:
        step(get(agt), A, loss)
    assert sum(reads.values()) >= 1


@pytest.mark.parametrize("name", sorted(cases(6)))
def test_deferred_gradients_equal_eager_ones(name):
    get, A, loss = cases(6)[name]
    eager = step(get(agt), A, loss)
    with verdict.checking("deferred"):
        late = step(get(agt), A, loss)
    torch.testing.assert_close(late, eager, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(late, step(get(torch.linalg), A, loss), rtol=1e-8, atol=1e-10)


def _raises_late(error, fn, *args):
    """``fn(*args)`` raises ``error`` at once when eager; deferred, it returns, and raise_deferred raises
    the same error with the same message."""
    with pytest.raises(error) as eager:
        fn(*args)
    with verdict.checking("deferred"):
        fn(*args)
        assert verdict.pending() >= 1
    with pytest.raises(error) as late:
        verdict.raise_deferred()
    assert str(late.value) == str(eager.value)
    assert verdict.pending() == 0
    verdict.raise_deferred()  # cleared


def test_input_checks_are_deferred():
    A = torch.randn(4, 4, dtype=torch.float64)
    _raises_late(ValueError, agt.eigh, A)  # not symmetric
    _raises_late(ValueError, agt.inv, torch.full((3, 3), float("nan"), dtype=torch.float64))
    _raises_late(NotPositiveDefiniteError, agt.cholesky, -torch.eye(3, dtype=torch.float64))
    _raises_late(SingularMatrixError, agt.inv, torch.zeros(3, 3, dtype=torch.float64))
    _raises_late(SingularMatrixError, agt.solve, torch.zeros(3, 3, dtype=torch.float64),
                 torch.ones(3, 1, dtype=torch.float64))


def test_backward_checks_are_deferred():
    A = torch.diag(torch.tensor([1.0, 2.0, 2.0, 3.0], dtype=torch.float64))

    def basis_dependent(A):  # a column of a cluster: depends on the basis chosen inside it
        A = A.clone().requires_grad_()
        w, V = agt.eigh(A)
        (V[:, 1] * torch.arange(4.0, dtype=torch.float64)).sum().backward()

    _raises_late(DegenerateSubspaceError, basis_dependent, A)

    def phase_dependent(A):
        A = A.clone().requires_grad_()
        w, V = agt.eigh(A)
        V.real.sum().backward()

    Z = torch.randn(4, 4, dtype=torch.complex128, generator=torch.Generator().manual_seed(1))
    _raises_late(PhaseDependentLossError, phase_dependent, Z + Z.mH)

    def rank_deficient_qr(A):
        A = A.clone().requires_grad_()
        Q, R = agt.qr(A)
        R.sum().backward()

    X = torch.randn(4, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    _raises_late(SingularMatrixError, rank_deficient_qr, torch.cat([X, X], dim=1))


def test_a_value_of_a_cluster_is_refused_when_deferred():
    """Eager, a loss through V f(D) V^H at a cluster is re-expressed (exact); deferred it cannot be (the
    clusters would be read), and a loss on one value of a cluster is refused either way."""
    A = torch.diag(torch.tensor([1.0, 2.0, 2.0], dtype=torch.float64)).requires_grad_()
    with verdict.checking("deferred"):
        w, V = agt.eigh(A)
        w[1].backward()
    with pytest.raises(DegenerateSubspaceError):
        verdict.raise_deferred()
    # an invariant loss at the cluster passes deferred too
    A.grad = None
    with verdict.checking("deferred"):
        w, V = agt.eigh(A)
        (w.sum() + (V[:, 1:] @ V[:, 1:].mT).diagonal().square().sum()).backward()
    verdict.raise_deferred()


def test_auto_is_eager_on_the_cpu_and_modes_are_validated():
    assert verdict.mode() == "auto"
    assert not verdict.deferred(torch.zeros(1))
    assert verdict.deferred(torch.zeros(1, device="meta")) is False
    with verdict.checking("deferred"):
        assert verdict.deferred(torch.zeros(1))
    with pytest.raises(ValueError, match="check mode"):
        verdict.set_mode("lazy")


def test_the_record_is_bounded():
    bad = torch.ones((), dtype=torch.bool)
    with verdict.checking("deferred"):
        for _ in range(verdict._MAX + 10):
            verdict.verdict(~bad, lambda: AssertionError("not this one"))
        verdict.verdict(bad, lambda: AssertionError("never built: folded"))
    assert verdict.pending() == verdict._MAX + 1
    with pytest.raises(RuntimeError, match="after the first"):
        verdict.raise_deferred()


@pytest.mark.parametrize("checks_on", [False, True])
@pytest.mark.parametrize("name", sorted(cases(4)))
def test_forward_and_backward_compile_without_a_graph_break(name, checks_on):
    """``torch.compile(fullgraph=True)`` of a forward + backward (fullgraph raises at any graph break),
    with the gauge checks off and on (a compiler reads no values: the value checks are skipped under
    it), and the gradient of the compiled step is the eager one.  The runtime's memo tables are
    emptied first: the compiled call is the process's first (a table written while tracing breaks
    the graph)."""
    import warnings

    from adjointgen.runtime import gauge, memo

    get, A, loss = cases(4)[name]
    f = get(agt)
    torch._dynamo.reset()
    memo.clear()
    compiled = torch.compile(lambda a: loss(f(a)), fullgraph=True, backend="aot_eager")
    a = A.clone().requires_grad_()
    with warnings.catch_warnings(), (contextlib.nullcontext() if checks_on else gauge.disabled()):
        warnings.simplefilter("ignore")
        compiled(a).backward()
    torch.testing.assert_close(a.grad, step(f, A, loss), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("A", [torch.zeros(4, 4), torch.eye(4), torch.diag(torch.tensor([1.0, 2, 2, 3])),
                               torch.diag(torch.tensor([5.0, 1, 1, 1, 1, 1, 0.5]))],
                         ids=["zero", "identity", "pair", "run of five"])
def test_deferred_bases_of_exact_clusters_are_generic(A):
    """LAPACK's basis of an exactly degenerate eigenspace has exact zeros, at which a basis-dependent
    loss (V[1, 1]^2 at the identity) can look invariant to first order; the deferred mode rotates runs
    of equal values on the device (no read), so the loss is refused as in the eager mode, and the
    decomposition is still one of A."""
    A = A.to(torch.float64)
    n = A.shape[-1]
    with verdict.checking("deferred"):
        w, V = agt.eigh(A)
        U, S, Vh = agt.svd(A, full_matrices=False)
    torch.testing.assert_close((V * w) @ V.mT, A, atol=1e-14, rtol=0)
    torch.testing.assert_close(V.mT @ V, torch.eye(n, dtype=torch.float64), atol=1e-14, rtol=0)
    torch.testing.assert_close((U * S) @ Vh, A, atol=1e-14, rtol=0)
    inside = [j for j in range(n) if ((w - w[j]).abs() < 1e-12).sum() > 1]
    assert inside and all(bool((V[:, j] != 0).sum() > 1) for j in inside)  # no column left a unit vector
    j = inside[0]
    X = A.clone().requires_grad_()
    with verdict.checking("deferred"):
        w, V = agt.eigh(X)
        torch.autograd.grad(V[j, j] ** 2, X)
    with pytest.raises(DegenerateSubspaceError):
        verdict.raise_deferred()


@pytest.mark.parametrize("partial", ["eigsh", "svds"])
def test_partial_solvers_refuse_a_value_of_a_cluster_when_deferred(partial):
    """The partial solvers' backward at a cluster of the kept values: deferred, the loss is not
    re-expressed, so a loss on one value of the cluster must be refused, not differentiated as if the
    values were apart."""
    n = 40
    Q, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(5)))
    values = torch.linspace(0.1, 1.0, n, dtype=torch.float64)
    values[-3:] = torch.tensor([3.0, 5.0, 5.0], dtype=torch.float64)
    A = ((Q * values) @ Q.mT).requires_grad_()
    with verdict.checking("deferred"):
        if partial == "eigsh":
            w, V = agt.eigsh(A, 3)
            torch.autograd.grad(w[0] + 2 * w[1], A)  # the two 5s: an individual value of the pair
        else:
            U, S, Vh = agt.svds(A, 3)
            torch.autograd.grad(S[0] + 2 * S[1], A)
    with pytest.raises(DegenerateSubspaceError):
        verdict.raise_deferred()


def test_forward_mode_checks_are_deferred_and_read_nothing():
    """Forward mode (jvp) of eigh: no read with valid input; a tangent that splits a cluster (which
    the tangents cannot carry) is refused at raise_deferred, as the eager mode refuses it at once."""
    A = torch.randn(5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    A = A + A.mT
    T = torch.randn(5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    T = T + T.mT
    with verdict.checking("deferred"):
        torch.func.jvp(agt.eigh, (A,), (T,))
        with counting() as reads:
            torch.func.jvp(agt.eigh, (A,), (T,))
    assert sum(reads.values()) == 0, reads
    D = torch.diag(torch.tensor([1.0, 2.0, 2.0, 3.0], dtype=torch.float64))
    split = torch.zeros(4, 4, dtype=torch.float64)
    split[1, 1] = 1.0  # moves one of the two equal eigenvalues only
    _raises_late(DegenerateSubspaceError, lambda: torch.func.jvp(agt.eigh, (D,), (split,)))

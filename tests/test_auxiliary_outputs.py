"""Auxiliary outputs next to a declared forward (a user's derivation of ``exp`` of a symmetric
matrix whose rules read its eigendecomposition ``w, V``, declared ``auxiliary=True``).

The generated function returns ``X`` only; first derivatives use the saved ``w, V``; a derivative
of the rules (``gradgradcheck``, ``hessian``, ``jacrev(jacrev)``, ``jacfwd(jacfwd)``, JAX's
``check_grads(order=2)``) recomputes them by running the forward again, differentiably.  Treating
them as constants would make every second derivative wrong (all of it here: the rule reads only
``w`` and ``V``).  A forward torch cannot differentiate works at first order and raises at second
order, saying why."""
import importlib
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from adjointgen.codegen import generate as gen
from adjointgen.project import load_project

DATA = Path(__file__).parent / "data" / "auxiliary"
D = torch.float64


@pytest.fixture(scope="module")
def auxops(tmp_path_factory):
    root = tmp_path_factory.mktemp("aux")
    (root / "derivations").mkdir()
    (root / "auxops").mkdir()
    (root / "auxops" / "__init__.py").write_text("")
    shutil.copy(DATA / "forward.py", root / "auxops" / "forward.py")
    text = (DATA / "symexp.py").read_text()
    (root / "derivations" / "symexp.py").write_text(text)
    (root / "derivations" / "symexp_host.py").write_text(
        text.replace('Derivation("symexp"', 'Derivation("symexp_host"').replace(
            'torch="auxops.forward:symexp"', 'torch="auxops.forward:symexp_host"'))
    (root / "pyproject.toml").write_text('[tool.adjointgen]\npackage = "auxops._adjoint"\noutput = "auxops/_adjoint"\n'
                                         'backends = ["torch", "cupy", "jax"]\n')
    sys.path.insert(0, str(root))
    try:
        gen.write(gen.render(load_project(root), jobs=1))
        yield root
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == "auxops" or m.startswith("auxops.")]:
            del sys.modules[name]


def _inputs():
    g = torch.Generator().manual_seed(0)
    Q, _ = torch.linalg.qr(torch.randn(4, 4, dtype=D, generator=g))
    A = (Q * torch.tensor([0.1, 0.7, 1.3, 2.2], dtype=D)) @ Q.mT
    return (A + A.mT) / 2, torch.randn(4, 4, dtype=D, generator=g)


def test_the_public_function_returns_the_rule_outputs_only(auxops):
    from auxops._adjoint.torch.symexp import SymexpFunction, symexp

    A, _ = _inputs()
    X = symexp(A)
    assert isinstance(X, torch.Tensor)
    torch.testing.assert_close(X, torch.linalg.matrix_exp(A), rtol=1e-12, atol=1e-12)
    X, w, V = SymexpFunction.apply(A.requires_grad_())  # the autograd function returns w, V too, not differentiable
    assert X.requires_grad and not w.requires_grad and not V.requires_grad


def test_every_derivative_through_the_auxiliary_outputs_is_exact(auxops):
    from auxops._adjoint.torch.symexp import symexp

    A, G = _inputs()
    ours = lambda A: (symexp((A + A.mT) / 2) * G).sum()  # noqa: E731
    ref = lambda A: (torch.linalg.matrix_exp((A + A.mT) / 2) * G).sum()  # noqa: E731
    torch.testing.assert_close(torch.func.grad(ours)(A), torch.func.grad(ref)(A), rtol=1e-11, atol=1e-11)
    H = torch.func.jacrev(torch.func.jacrev(ref))(A)
    assert H.abs().max() > 1  # the aux outputs' derivative is all of it: constants would give 0
    for name, T in {"hessian": torch.func.hessian,
                    "jacrev(jacrev)": lambda f: torch.func.jacrev(torch.func.jacrev(f)),
                    "jacfwd(jacfwd)": lambda f: torch.func.jacfwd(torch.func.jacfwd(f))}.items():
        torch.testing.assert_close(T(ours)(A), H, rtol=1e-10, atol=1e-10, msg=name)
    Ar = A.clone().requires_grad_()
    (g,) = torch.autograd.grad(ours(Ar), Ar, create_graph=True)
    (hv,) = torch.autograd.grad((g * G).sum(), Ar)
    torch.testing.assert_close(hv, (H * G).sum((-2, -1)), rtol=1e-10, atol=1e-10)
    assert torch.autograd.gradgradcheck(lambda A: symexp((A + A.mT) / 2), (Ar,))
    # batched, and vmap over the gradient
    As = torch.stack([A, A + 0.1 * torch.eye(4, dtype=D)])
    got = torch.func.vmap(torch.func.grad(ours))(As)
    torch.testing.assert_close(got, torch.func.vmap(torch.func.grad(ref))(As), rtol=1e-11, atol=1e-11)


def test_a_forward_torch_cannot_differentiate_works_at_first_order_and_says_why_at_second(auxops):
    from auxops._adjoint.torch.symexp import symexp
    from auxops._adjoint.torch.symexp_host import symexp_host

    A, G = _inputs()
    loss = lambda f: lambda A: (f((A + A.mT) / 2) * G).sum()  # noqa: E731
    torch.testing.assert_close(torch.func.grad(loss(symexp_host))(A), torch.func.grad(loss(symexp))(A))
    torch.testing.assert_close(torch.func.jacrev(symexp_host)(A), torch.func.jacrev(symexp)(A))
    torch.testing.assert_close(torch.func.jacfwd(symexp_host)(A), torch.func.jacfwd(symexp)(A))
    Ar = A.clone().requires_grad_()
    for name, second in {
            "autograd": lambda: torch.autograd.grad(
                (torch.autograd.grad(loss(symexp_host)(Ar), Ar, create_graph=True)[0] * G).sum(), Ar),
            "hessian": lambda: torch.func.hessian(loss(symexp_host))(A),
            "jacrev(jacrev)": lambda: torch.func.jacrev(torch.func.jacrev(loss(symexp_host)))(A),
            "jacfwd(jacfwd)": lambda: torch.func.jacfwd(torch.func.jacfwd(loss(symexp_host)))(A)}.items():
        with pytest.raises(RuntimeError, match="auxiliary output.*w, V.*differentiable"):
            second()
            pytest.fail(name)


def test_jax_differentiates_the_auxiliary_outputs_through_the_forward(auxops):
    jax = pytest.importorskip("jax")
    from jax.test_util import check_grads

    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    symexp = importlib.import_module("auxops._adjoint.jax.symexp").symexp
    A, G = (jnp.asarray(t.numpy()) for t in _inputs())
    ours = lambda A: (symexp((A + A.T) / 2) * G).sum()  # noqa: E731
    ref = lambda A: (jax.scipy.linalg.expm((A + A.T) / 2) * G).sum()  # noqa: E731
    H = jax.hessian(ref)(A)
    for T in (jax.hessian, lambda f: jax.jacfwd(jax.jacfwd(f)), lambda f: jax.jit(jax.jacrev(jax.jacrev(f)))):
        np.testing.assert_allclose(T(ours)(A), H, rtol=1e-10, atol=1e-10)
    check_grads(lambda A: symexp((A + A.T) / 2), (A,), order=2, modes=("fwd", "rev"))


def test_the_array_backend_returns_the_auxiliary_outputs_for_its_rules(auxops):
    mod = importlib.import_module("auxops._adjoint.cupy.symexp")
    A, G = (t.numpy() for t in _inputs())
    X, w, V = mod.symexp(A)
    np.testing.assert_allclose(X, torch.linalg.matrix_exp(torch.from_numpy(A)).numpy(), rtol=1e-12, atol=1e-12)
    gA = mod.symexp_vjp(X, w, V, G)
    want = torch.func.grad(lambda A: (torch.linalg.matrix_exp(A) * torch.from_numpy(G)).sum())(torch.from_numpy(A))
    np.testing.assert_allclose(gA, (want + want.mT).numpy() / 2, rtol=1e-10, atol=1e-10)  # symmetric input

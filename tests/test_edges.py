"""Every public function on the edge shapes torch accepts (empty batches, 0 x 0 matrices), and
with batched cotangents (jacrev, vmap over the backward): the cases of issue 12."""
import pytest
import torch

import adjointgen.torch as agt


def spd(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(*shape, dtype=torch.float64, generator=g)
    return A @ A.mT + shape[-1] * torch.eye(shape[-1], dtype=torch.float64)


OPS = {
    "eigh": lambda A: agt.eigh(A)[0],
    "eigh_generalized": lambda A: agt.eigh(A, spd(*A.shape, seed=1))[1].abs(),
    "pinv_hermitian": lambda A: agt.pinv(A, hermitian=True),
    "pinv": agt.pinv,
    "svd": lambda A: agt.svd(A, full_matrices=False)[1],
    "svd_full": lambda A: agt.svd(A, full_matrices=True)[1],
    "cholesky": agt.cholesky,
    "qr": lambda A: agt.qr(A)[1],
    "inv": agt.inv,
    "solve": lambda A: agt.solve(A, A[..., :1]),
    "expm": agt.expm,
    "logm": agt.logm,
    "sqrtm": agt.sqrtm,
}
SPARSE = {"eigsh": lambda A: agt.eigsh(A, 1)[0], "svds": lambda A: agt.svds(A, 1)[1]}
#: a scalar per matrix (of a 0 x 0 matrix too: det = 1)
SCALAR = {"slogdet": lambda A: agt.slogdet(A)[1]}


@pytest.mark.parametrize("name", sorted({**OPS, **SPARSE, **SCALAR}))
def test_empty_batch_forward_and_backward(name):
    fn = {**OPS, **SPARSE, **SCALAR}[name]
    A = spd(0, 3, 3).requires_grad_()
    y = fn(A)
    assert y.shape[0] == 0
    (g,) = torch.autograd.grad(y.sum(), A)
    assert g.shape == (0, 3, 3)


@pytest.mark.parametrize("name", sorted(OPS))
def test_zero_by_zero_matrices(name):
    A = torch.zeros(2, 0, 0, dtype=torch.float64, requires_grad=True)
    y = OPS[name](A)
    assert y.shape[0] == 2 and y.numel() == 0
    (g,) = torch.autograd.grad(y.sum(), A)
    assert g.shape == (2, 0, 0)


@pytest.mark.parametrize("name", sorted(SPARSE))
def test_k_larger_than_an_empty_matrix_is_a_value_error(name):
    with pytest.raises(ValueError, match="k"):
        SPARSE[name](torch.zeros(2, 0, 0, dtype=torch.float64))


@pytest.mark.parametrize("name", sorted({**OPS, **SPARSE, **SCALAR}))
def test_batched_cotangents(name):
    """jacrev and is_grads_batched run the backward under vmap: nothing in it may write in place."""
    fn = {**OPS, **SPARSE, **SCALAR}[name]
    A = spd(4, 4, seed=2)
    J = torch.func.jacrev(fn)(A)
    y = fn(A)
    # the same Jacobian row by row through the autograd engine
    Ar = A.clone().requires_grad_()
    out = fn(Ar)
    basis = torch.eye(out.numel(), dtype=torch.float64).reshape(-1, *out.shape)
    (rows,) = torch.autograd.grad(out, Ar, basis, is_grads_batched=True)
    torch.testing.assert_close(rows.reshape(J.shape), J.reshape(J.shape))
    assert J.shape == (*y.shape, 4, 4)


def test_the_numpy_namespace_lists_only_its_functions():
    import adjointgen.cupy as agc

    names = dir(agc)
    assert not {"annotations", "importlib", "pkgutil"} & set(names)
    assert {"eigh_vjp", "svd_jvp", "funm_vjp", "expm", "expm_L"} <= set(names)
    assert all(callable(getattr(agc, n)) for n in names)

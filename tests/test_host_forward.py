"""The host forward mechanism: ``d.forward(host="module:attr")`` declares one NumPy function for every
backend, and :mod:`adjointgen.runtime.host` adapts it (batches, precision, devices, meta tensors,
compilers, JAX tracing)."""
import numpy as np
import pytest
import scipy.linalg
import torch

from adjointgen.calculus import Derivation, DerivationError
from adjointgen.runtime import host


def test_call_loops_over_the_broadcast_batch_and_keeps_the_precision():
    rng = np.random.default_rng(0)
    A = rng.standard_normal((2, 3, 4, 4))
    T, Z = host.call(scipy.linalg.schur, [A], {"output": "complex"})
    assert T.shape == Z.shape == (2, 3, 4, 4) and T.dtype == np.complex128
    for index in np.ndindex(2, 3):
        np.testing.assert_allclose(Z[index] @ T[index] @ Z[index].conj().T, A[index], atol=1e-12)
    T32, _ = host.call(scipy.linalg.schur, [A.astype(np.float32)], {"output": "complex"})
    assert T32.dtype == np.complex64  # complex as SciPy returns it, single as the input
    X = host.call(scipy.linalg.solve_sylvester, [A[0], A[1, :1] + 4 * np.eye(4), np.ones((4, 4))], {})
    assert X.shape == (3, 4, 4)  # one array, broadcast over the batch
    empty = host.call(scipy.linalg.polar, [np.zeros((0, 5, 3))], {})
    assert [e.shape for e in empty] == [(0, 5, 3), (0, 3, 3)]  # shapes from a call on identity matrices


def test_torch_forward_on_batches_dtypes_and_meta_tensors():
    forward = host.torch_forward("scipy.linalg:schur")
    A = torch.randn(3, 5, 5, dtype=torch.float32)
    T, Z = forward(A, output="complex")
    assert T.dtype == torch.complex64 and T.device == A.device
    torch.testing.assert_close(Z @ T @ Z.mH, A.to(torch.complex64), atol=1e-5, rtol=1e-5)
    T, Z = forward(torch.empty(2, 5, 5, dtype=torch.float64, device="meta"), output="real")
    assert T.is_meta and T.shape == (2, 5, 5) and T.dtype == torch.float64
    polar = host.torch_forward("scipy.linalg:polar")
    U, P = polar(torch.randn(0, 6, 2, dtype=torch.float64))
    assert U.shape == (0, 6, 2) and P.shape == (0, 2, 2)


def test_torch_forward_is_opaque_to_torch_compile():
    forward = host.torch_forward("scipy.linalg:expm")
    compiled = torch.compile(lambda a: forward(a) * 2, backend="eager", fullgraph=False)
    A = 0.1 * torch.randn(2, 3, 3, dtype=torch.float64)
    torch.testing.assert_close(compiled(A), 2 * torch.linalg.matrix_exp(A))


def test_array_forward_on_numpy():
    forward = host.array_forward("scipy.linalg:expm")
    A = 0.1 * np.random.default_rng(1).standard_normal((2, 3, 3))
    np.testing.assert_allclose(forward(A), scipy.linalg.expm(A), atol=1e-14)


def test_jax_forward_eager_jit_and_vmap():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    forward = host.jax_forward("scipy.linalg:schur")
    A = jnp.asarray(np.random.default_rng(2).standard_normal((3, 4, 4)))
    T, Z = forward(A, output="complex")
    np.testing.assert_allclose(np.asarray(Z @ T @ jnp.conj(jnp.swapaxes(Z, -1, -2))), np.asarray(A), atol=1e-12)
    Tj, _ = jax.jit(lambda a: forward(a, output="complex"))(A)
    np.testing.assert_allclose(np.abs(np.asarray(Tj)), np.abs(np.asarray(T)), atol=1e-12)
    Tv, _ = jax.vmap(lambda a: forward(a, output="complex"))(A)
    np.testing.assert_allclose(np.abs(np.asarray(Tv)), np.abs(np.asarray(T)), atol=1e-12)


def test_a_domain_error_of_the_host_function_raises_as_itself():
    from adjointgen.runtime.checks import SingularMatrixError

    forward = host.torch_forward("adjointgen.runtime.xp:bartels_stewart")
    A, B = torch.diag(torch.tensor([1.0, 2.0], dtype=torch.float64)), -torch.eye(2, dtype=torch.float64)
    with pytest.raises(SingularMatrixError, match="negative"):
        forward(A, B, torch.ones(2, 2, dtype=torch.float64))


def test_the_declaration_refuses_a_second_forward():
    d = Derivation("hosted", __file__, title="test")
    n = d.dim("n")
    d.input("A", n, n)
    d.output("X", n, n)
    with pytest.raises(DerivationError, match="host"):
        d.forward(host="scipy.linalg:expm", torch="torch.linalg.matrix_exp")
    with pytest.raises(DerivationError, match="importable"):
        d.forward(host="scipy linalg expm")
    d.forward(host="scipy.linalg:expm")
    assert d.forward_spec.host and d.forward_spec.numpy.name == "scipy.linalg:expm"

"""Rules specialised to square orthonormal factors (``Derivation.square_variants``): derived by the
engine with ``U U^H = I``, audited on the square instances, picked by shape at run time."""
from pathlib import Path

import numpy as np
import pytest

from adjointgen.calculus import algebra
from adjointgen.calculus.algebra import DerivationError

ROOT = Path(__file__).resolve().parents[1]


def _load(path):
    from adjointgen.codegen import generate as gen

    return gen.load_derivation_file(path)


def test_the_square_qr_rules_are_audited_on_the_square_instances():
    from adjointgen.audit import audit

    spec = _load(ROOT / "derivations" / "qr.py")
    assert [v.name for v in spec.variants] == ["square_Q"]
    # the complement term (I - Q Q^T) dA R^-1 is gone from the variant, not from the general rule
    assert "dA*R**(-1)" in str(spec.jvp.rewritten["dQ"]).replace(" ", "")
    assert "Q*Q.T" not in str(spec.variants[0].jvp.raw["dQ"])
    report = audit(spec, symbolic=False)
    assert report.passed, report.to_text()
    squares = [s for s in report.steps if s.kind == "square"]
    assert len(squares) == 3 and all(s.residual < 1e-12 for s in squares)


def test_a_wrong_square_identity_fails_the_audit(monkeypatch):
    """The audit compares each variant with the general rule where the factors are square: a variant
    derived from a false identity (here ``Q Q^T = 0``) fails there."""
    from adjointgen.audit import audit
    from sympy.matrices.expressions import Identity, ZeroMatrix

    real = algebra.substitute_product

    def wrong(expr, pattern, replacement, structure):
        if str(pattern) == "Q*Q.T" and isinstance(replacement, Identity):  # the variant's identity only
            replacement = ZeroMatrix(*replacement.shape)
        return real(expr, pattern, replacement, structure)

    monkeypatch.setattr(algebra, "substitute_product", wrong)
    spec = _load(ROOT / "derivations" / "qr.py")
    monkeypatch.setattr(algebra, "substitute_product", real)
    report = audit(spec, symbolic=False)
    failed = report.first_failure()
    assert failed is not None and failed.kind == "square", report.to_text()


def test_square_variants_need_a_square_instance(tmp_path):
    text = (ROOT / "derivations" / "qr.py").read_text()
    start = text.index("d.instances(sample, [")
    end = text.index("])", start) + 2
    tall = text[:start] + 'd.instances(sample, [{"m": 5, "n": 3, "field": "complex"}, {"m": 5, "n": 3, "field": "real"}])' + text[end:]
    path = tmp_path / "qr_tall.py"
    path.write_text(tall)
    with pytest.raises(DerivationError, match="no audit instance has Q square"):
        _load(path)
    one_field = text[:start] + ('d.instances(sample, [{"m": 5, "n": 3, "field": "complex"}, '
                                '{"m": 4, "n": 4, "field": "complex"}, {"m": 5, "n": 3, "field": "real"}])') + text[end:]
    path.write_text(one_field)
    with pytest.raises(DerivationError, match="are all complex"):
        _load(path)


def test_square_variants_take_orthonormal_outputs_only(tmp_path):
    text = (ROOT / "derivations" / "qr.py").read_text().replace("d.square_variants(Q)", "d.square_variants(R)")
    path = tmp_path / "qr_r.py"
    path.write_text(text)
    with pytest.raises(DerivationError, match="not an output declared orthonormal=True"):
        _load(path)


class _Shaped:
    def __init__(self, *shape):
        self.shape = shape


@pytest.mark.parametrize("m, n, suffix", [(4, 4, "_square_U_V"), (6, 4, "_square_V"), (4, 6, "_square_U"),
                                          (2, 6, "_square_U")])
def test_the_rules_table_picks_the_variant_of_the_shapes(m, n, suffix):
    from adjointgen.generated.torch import svd

    k = min(m, n)
    env = {"U": _Shaped(3, m, k), "V": _Shaped(3, n, k), "S": _Shaped(3, k)}
    rules = svd.RULES.for_shapes(env)
    for field in ("jvp", "vjp", "vjp_checked", "jvp_complex", "vjp_complex", "vjp_complex_checked"):
        name = getattr(rules, field).fn.__name__
        assert name == f"svd_{field}{suffix}", (field, name)
    # the thin factors of a partial SVD (k < m, n) keep the general rules
    env = {"U": _Shaped(6, 2), "V": _Shaped(5, 2)}
    assert svd.RULES.for_shapes(env).vjp.fn.__name__ == "svd_vjp"


def _invariant_loss(U, S, Vh, W, c):
    # a function of the pairs u_j v_j^H and of S: no gauge (signs, phases) in it
    return ((U * c) @ Vh * W).real.sum() + (S * c[: S.shape[-1]]).sum() + (U[..., :, :1] @ Vh[..., :1, :]).abs().sum()


@pytest.mark.parametrize("dtype", ["float64", "complex128"])
@pytest.mark.parametrize("shape", [(5, 5), (7, 4), (4, 7), (2, 3, 3), (2, 6, 3)])
def test_gradients_of_every_shape_match_torch(shape, dtype):
    """Square, tall and wide matrices (each takes another variant): the gradient of an invariant
    loss and a JVP match torch.linalg.svd's."""
    import torch

    import adjointgen.torch as agt

    g = torch.Generator().manual_seed(sum(shape))
    dt = getattr(torch, dtype)
    A = torch.randn(shape, dtype=dt, generator=g)
    W = torch.randn(shape, dtype=dt, generator=g)
    c = torch.rand(min(shape[-2:]), dtype=torch.float64, generator=g) + 0.5

    def ours(A):
        return _invariant_loss(*agt.svd(A, full_matrices=False), W, c)

    def theirs(A):
        return _invariant_loss(*torch.linalg.svd(A, full_matrices=False), W, c)

    (g1,) = torch.autograd.grad(ours(A.requires_grad_()), A)
    (g2,) = torch.autograd.grad(theirs(A), A)
    assert torch.allclose(g1, g2, atol=1e-10, rtol=1e-10)
    dA = torch.randn(shape, dtype=dt, generator=g)
    t1 = torch.func.jvp(ours, (A.detach(),), (dA,))[1]
    t2 = torch.func.jvp(theirs, (A.detach(),), (dA,))[1]
    assert torch.allclose(t1, t2, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("shape", [(5, 5), (7, 4), (4, 7)])
def test_jax_gradients_of_every_shape_match_jnp(shape):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import adjointgen.jax as agj

    with jax.enable_x64(True):
        rng = np.random.default_rng(sum(shape))
        A = jnp.asarray(rng.standard_normal(shape) + 1j * rng.standard_normal(shape))
        W = jnp.asarray(rng.standard_normal(shape))
        c = jnp.asarray(rng.uniform(0.5, 1.5, min(shape)))

        def loss(svd):
            def f(A):
                U, S, Vh = svd(A)
                return (((U * c) @ Vh) * W).real.sum() + (S * c).sum()
            return f

        ours = jax.jit(jax.grad(loss(lambda A: agj.svd(A, full_matrices=False))))(A)
        theirs = jax.grad(loss(lambda A: jnp.linalg.svd(A, full_matrices=False)))(A)
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=1e-10, rtol=1e-10)


def test_rules_fed_shapes_outside_their_derivation_raise():
    """The rules of the tall QR fed a wide matrix's factors (Q square, R wide): every backend's
    dispatch says so (the square variant once applied there, and its solve with the wide R failed
    deep inside), torch and JAX alike; the public functions split a wide matrix first."""
    from adjointgen.generated.torch import qr

    env = {"A": _Shaped(3, 5), "Q": _Shaped(3, 3), "R": _Shaped(3, 5)}
    with pytest.raises(ValueError, match=r"qr: the rules are derived for A \(m, n\), Q \(m, n\), R \(n, n\)"):
        qr.RULES.for_shapes(env)
    assert qr.RULES.for_shapes({"A": _Shaped(4, 4), "Q": _Shaped(4, 4), "R": _Shaped(4, 4)}).jvp.fn.__name__ \
        == "qr_jvp_square_Q"
    assert qr.RULES.for_shapes({"A": _Shaped(5, 3), "Q": _Shaped(5, 3), "R": _Shaped(3, 3)}).jvp.fn.__name__ == "qr_jvp"
    jax = pytest.importorskip("jax")
    from adjointgen.generated.jax import qr as jqr

    A = jax.numpy.ones((3, 5)) + jax.numpy.eye(3, 5)
    with pytest.raises(ValueError, match="qr: the rules are derived for"):
        jax.jvp(jqr.qr, (A,), (A,))


@pytest.mark.parametrize("shape, suffix", [((6, 6), ""), ((300, 4), "_tall"), ((4, 300), "_wide")])
def test_oriented_rules_form_no_product_of_the_larger_dimension_squared(shape, suffix):
    """``Derivation.either_orientation`` (pinv, lstsq): the rules for a tall and for a wide input
    are the derived sums of products, each ordered for that orientation and picked by shape; none
    forms a ``max(m, n)^2`` array (the collected form of the derived rule does, for one orientation
    or the other: a 2×400000 ``A`` needed 640 GB), and each gives the derived rule's values."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from adjointgen.generated.jax import pinv

    m, n = shape
    rng = np.random.default_rng(m + n)
    A = jnp.asarray(rng.standard_normal(shape))
    P = jnp.linalg.pinv(A)
    dA, gP = jnp.asarray(rng.standard_normal(shape)), jnp.asarray(rng.standard_normal((n, m)))
    rules = pinv.RULES.for_shapes({"A": A, "P": P})
    assert rules.jvp.fn.__name__ == "pinv_jvp" + suffix and rules.vjp.fn.__name__ == "pinv_vjp" + suffix
    for rule, args in ((rules.jvp.fn, (A, P, dA)), (rules.vjp.fn, (A, P, gP))):
        jaxpr = jax.make_jaxpr(rule)(*args).jaxpr
        largest = max(int(np.prod(v.aval.shape)) for e in jaxpr.eqns for v in e.outvars)
        assert largest <= max(m * n, min(m, n) ** 2), (rule.__name__, largest)
    general = (pinv.pinv_jvp(A, P, dA), pinv.pinv_vjp(A, P, gP))  # float32 unless x64 is on: rounding 1e-6
    for ours, theirs in zip((rules.jvp.fn(A, P, dA), rules.vjp.fn(A, P, gP)), general):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5 * float(jnp.max(jnp.abs(theirs))))

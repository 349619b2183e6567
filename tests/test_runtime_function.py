"""``runtime.function.apply``: the generated functions' call path without torch's per-call
signature binding gives what ``cls.apply`` gives, with defaults, under transforms and in graphs."""
import torch

from adjointgen.runtime import function


class _Square(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x, scale):
        return scale * x * x

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.scale = inputs[1]

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * ctx.scale * x * g, None


class _WithDefault(_Square):
    @staticmethod
    def forward(x, scale=3.0):
        return scale * x * x


def test_fast_path_gives_the_same_values_and_gradients_as_apply():
    x = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64, requires_grad=True)
    y = function.apply(_Square, x, 2.0)
    assert function._PLAIN[_Square] is True
    assert torch.equal(y, _Square.apply(x, 2.0))
    (g,) = torch.autograd.grad(y.sum(), x)
    assert torch.equal(g, 4 * x.detach())
    assert y.grad_fn is not None and "_Square" in type(y.grad_fn).__name__


def test_a_forward_with_defaults_goes_through_apply_and_gets_its_default():
    x = torch.tensor([2.0], dtype=torch.float64)
    assert float(function.apply(_WithDefault, x)) == 12.0
    assert function._PLAIN[_WithDefault] is False


def test_under_torch_func_transforms_it_is_apply():
    x = torch.tensor([1.0, 2.0], dtype=torch.float64)
    g = torch.func.grad(lambda x: function.apply(_Square, x, 1.5).sum())(x)
    assert torch.allclose(g, 3 * x)
    v = torch.func.vmap(torch.func.grad(lambda x: function.apply(_Square, x, 1.0).sum()))(x[:, None])
    assert torch.allclose(v, 2 * x[:, None])

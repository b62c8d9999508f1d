"""Every hand-written layer: central differences and torch.autograd (float64), torch.nn parity, bad input."""

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gradcheck import check_layer
from layers import Layer, Linear, ReLU, Sigmoid, Softmax, Tanh
from tests.conftest import assert_all_pass

f64 = torch.float64
SHAPES_2D = [(1, 5), (4, 7), (16, 3)]


def off_kink(x):
    return torch.where(x.abs() < 1e-2, torch.full_like(x, 0.5), x)


@pytest.mark.parametrize("n,d", SHAPES_2D)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_gradcheck(n, d, bias):
    torch.manual_seed(n * 10 + d)
    assert_all_pass(check_layer(Linear(d, 4, bias=bias, dtype=f64), torch.randn(n, d, dtype=f64)))


@pytest.mark.parametrize(
    "make",
    [ReLU, Tanh, Sigmoid, Softmax, lambda: Softmax(dim=0)],
    ids=["relu", "tanh", "sigmoid", "softmax", "softmax0"],
)
@pytest.mark.parametrize("shape", [(1, 5), (4, 7), (2, 3, 4)])
def test_activation_gradcheck(make, shape):
    torch.manual_seed(sum(shape))
    assert_all_pass(check_layer(make(), off_kink(torch.randn(*shape, dtype=f64) * 2)))


@pytest.mark.parametrize("make", [lambda: Linear(3, 3), ReLU, Tanh, Sigmoid, Softmax])
def test_layers_keep_the_protocol(make):
    """Through the protocol alone: call == forward, backward(dout) returns dx of x's shape and fills every
    parameter's .grad, and parameters() require a gradient (as nn.Parameter) while nothing records a graph."""
    layer = make()
    assert isinstance(layer, Layer)
    x = torch.randn(4, 3)
    out = layer(x)
    assert torch.equal(out, layer.forward(x))
    dx = layer.backward(torch.randn_like(out))
    assert isinstance(dx, torch.Tensor) and dx.shape == x.shape
    for p in layer.parameters():
        assert p.requires_grad and p.grad is not None and p.grad.shape == p.shape and p.grad.grad_fn is None
    assert out.grad_fn is None and dx.grad_fn is None


def test_protocol_rejects_an_object_without_backward():
    class NoBackward:
        def __call__(self, x):
            return x

        def forward(self, x):
            return x

        def parameters(self):
            return []

    assert not isinstance(NoBackward(), Layer)


def test_linear_init_matches_nn_linear_under_same_seed():
    torch.manual_seed(7)
    ours = Linear(30, 20)
    torch.manual_seed(7)
    ref = nn.Linear(30, 20)
    assert ours.weight.shape == (20, 30) and ours.weight.is_contiguous()  # nn.Linear's (out, in), row-major
    assert torch.equal(ours.weight, ref.weight.detach())
    assert torch.equal(ours.bias, ref.bias.detach())
    assert ours.weight.requires_grad and ours.bias.requires_grad  # as nn.Parameter's


def test_linear_init_distribution():
    torch.manual_seed(0)
    w = Linear(400, 300).weight
    bound = 1 / 400**0.5
    assert w.abs().max() <= bound
    assert w.abs().max() > 0.99 * bound  # uses the whole range
    assert abs(w.std().item() - bound / 3**0.5) < 0.01 * bound  # std of U(-b, b)


@pytest.mark.parametrize(
    "make,ref",
    [
        (ReLU, torch.relu),
        (Tanh, torch.tanh),
        (Sigmoid, torch.sigmoid),
        (Softmax, lambda x: F.softmax(x, -1)),
        (lambda: Softmax(0), lambda x: F.softmax(x, 0)),
    ],
)
def test_activation_matches_torch(make, ref):
    """Forward and backward against torch's own functions (not our forward) under autograd."""
    torch.manual_seed(1)
    x = torch.randn(6, 5, dtype=f64)
    dout = torch.randn(6, 5, dtype=f64)
    layer = make()
    out = layer(x)
    dx = layer.backward(dout)
    xr = x.clone().requires_grad_()
    outr = ref(xr)
    outr.backward(dout)
    torch.testing.assert_close(out, outr.detach(), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(dx, xr.grad, rtol=1e-12, atol=1e-14)


def test_linear_matches_nn_linear_forward_backward():
    torch.manual_seed(2)
    lin = Linear(6, 4, dtype=f64)
    ref = nn.Linear(6, 4, dtype=f64)
    with torch.no_grad():
        ref.weight.copy_(lin.weight)
        ref.bias.copy_(lin.bias)
    x, dout = torch.randn(5, 6, dtype=f64), torch.randn(5, 4, dtype=f64)
    xr = x.clone().requires_grad_()
    ref(xr).backward(dout)
    out = lin(x)
    dx = lin.backward(dout)
    torch.testing.assert_close(out, ref(x).detach(), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(dx, xr.grad, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(lin.weight.grad, ref.weight.grad, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(lin.bias.grad, ref.bias.grad, rtol=1e-12, atol=1e-14)


def test_gradients_accumulate_across_backwards():
    torch.manual_seed(3)
    lin = Linear(3, 2, dtype=f64)
    x1, x2 = torch.randn(4, 3, dtype=f64), torch.randn(5, 3, dtype=f64)
    d1, d2 = torch.randn(4, 2, dtype=f64), torch.randn(5, 2, dtype=f64)
    lin(x1)
    lin.backward(d1)
    lin(x2)
    lin.backward(d2)
    torch.testing.assert_close(lin.weight.grad, d1.t() @ x1 + d2.t() @ x2, rtol=1e-13, atol=0)
    torch.testing.assert_close(lin.bias.grad, d1.sum(0) + d2.sum(0), rtol=1e-13, atol=0)


def test_need_input_grad_false_skips_dx_but_fills_grads():
    lin = Linear(3, 2, dtype=f64)
    x, d = torch.randn(4, 3, dtype=f64), torch.randn(4, 2, dtype=f64)
    lin(x)
    assert lin.backward(d, need_input_grad=False) is None
    torch.testing.assert_close(lin.weight.grad, d.t() @ x)


def test_no_autograd_graph_is_built():
    lin, act = Linear(3, 2), ReLU()
    out = act(lin(torch.randn(4, 3)))
    assert not out.requires_grad and out.grad_fn is None
    act.backward(torch.ones_like(out))


# -- bad input -----------------------------------------------------------------------------------------


def test_linear_wrong_feature_size_names_shapes():
    with pytest.raises(ValueError, match=r"Linear\(in_features=3.*expected input of shape \(\*, 3\), got \(4, 5\)"):
        Linear(3, 2)(torch.randn(4, 5))


def test_linear_refuses_a_scalar():
    with pytest.raises(ValueError, match=r"expected input of shape \(\*, 3\), got \(\)"):
        Linear(3, 2)(torch.tensor(1.0))


@pytest.mark.parametrize("shape", [(5,), (2, 3, 5), (2, 1, 4, 5), (0, 5), (3, 0, 5)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_any_leading_axes_equals_nn_linear(shape, bias):
    """(*, D) -> (*, H) as nn.Linear: unbatched (D,), a sequence (B, T, D), empty batches; float64 vs autograd."""
    torch.manual_seed(0)
    lin = Linear(5, 4, bias=bias, dtype=torch.float64)
    twin = lin.to_torch()
    x = torch.randn(shape, dtype=torch.float64)
    out = lin(x)
    xt = x.clone().requires_grad_(True)
    ref = twin(xt)
    assert out.shape == ref.shape == (*shape[:-1], 4)
    assert torch.equal(out, ref.detach())
    dout = torch.randn_like(out)
    dx = lin.backward(dout)
    ref.backward(dout)
    assert dx.shape == x.shape
    torch.testing.assert_close(dx, xt.grad, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(lin.weight.grad, twin.weight.grad, rtol=1e-13, atol=1e-13)
    if bias:
        torch.testing.assert_close(lin.bias.grad, twin.bias.grad, rtol=1e-13, atol=1e-13)


def test_linear_dout_must_have_the_outputs_leading_axes():
    lin = Linear(3, 2)
    lin(torch.randn(2, 4, 3))
    with pytest.raises(ValueError, match=r"dout has shape \(8, 2\) but the forward output had shape \(2, 4, 2\)"):
        lin.backward(torch.randn(8, 2))


@pytest.mark.parametrize("make", [lambda: Linear(3, 2), ReLU, Tanh, Sigmoid, Softmax])
def test_backward_before_forward(make):
    with pytest.raises(RuntimeError, match="backward called before forward"):
        make().backward(torch.ones(4, 2))


@pytest.mark.parametrize("make", [lambda: Linear(3, 2), ReLU, Tanh, Sigmoid, Softmax])
def test_second_backward_without_forward_is_refused(make):
    layer = make()
    out = layer(torch.randn(4, 3))
    layer.backward(torch.ones_like(out))
    with pytest.raises(RuntimeError, match="backward called before forward"):
        layer.backward(torch.ones_like(out))


@pytest.mark.parametrize("make", [lambda: Linear(3, 2), ReLU, Tanh, Sigmoid, Softmax])
def test_dout_shape_mismatch(make):
    layer = make()
    out = layer(torch.randn(4, 3))
    msg = f"dout has shape (4, 7) but the forward output had shape {tuple(out.shape)}"
    with pytest.raises(ValueError, match=re.escape(msg)):
        layer.backward(torch.ones(4, 7))


def test_mixed_dtypes_refused():
    with pytest.raises(ValueError, match=r"input has dtype torch.float64 but weight has dtype torch.float32"):
        Linear(3, 2)(torch.randn(4, 3, dtype=f64))
    act = Tanh()
    act(torch.randn(2, 2))
    with pytest.raises(ValueError, match="dout has dtype torch.float64"):
        act.backward(torch.ones(2, 2, dtype=f64))


def test_integer_input_refused_by_activation():
    with pytest.raises(ValueError, match="floating-point"):
        ReLU()(torch.ones(2, 2, dtype=torch.long))


def test_non_tensor_input_refused():
    with pytest.raises(TypeError, match="must be a torch.Tensor, got list"):
        Linear(2, 2)([[1.0, 2.0]])


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match=r"Linear: in_features must be an int >= 1, got 0"):
        Linear(0, 3)
    with pytest.raises(ValueError, match="dim must be an int"):
        Softmax(dim=1.5)
    with pytest.raises(ValueError, match="dim 2 is out of range"):
        Softmax(dim=2)(torch.randn(3, 4))

"""A layer written in the template gets the base's machinery: checked against central differences and autograd,
usable in a Sequential beside torch, frozen as torch freezes, refused when misused, split into B and W.

The layer here is what docs/layers.md shows a new user writing: Swish with a learned slope, y = x sigmoid(beta x).
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch
from torch import Tensor

import optimizers
from gradcheck import check_layer
from layers import BaseLayer, Linear, Sequential
from layers.layer import Product, learned
from losses import MSELoss

f64 = torch.float64


class Swish(BaseLayer):
    """y = x * sigmoid(beta * x), beta learned (one per feature).
    dy/dx = s + beta x s (1 - s),  dy/dbeta = x^2 s (1 - s),  s = sigmoid(beta x)."""

    _param_names = ("beta",)

    class Saved(NamedTuple):
        x: Tensor  # (N, F)
        s: Tensor  # (N, F), sigmoid(beta x)

    def __init__(self, features: int, dtype=None):
        (self.beta,) = learned(torch.ones(features, dtype=dtype))

    def forward_math(self, x):
        s = torch.sigmoid(self.beta * x)
        return x * s, self.Saved(x, s)

    def backward_math(self, dout, saved):
        x, s = saved
        ds = s * (1 - s)  # sigmoid's derivative
        return dout * (s + self.beta * x * ds), {"beta": (dout * x * x * ds).sum(0)}


class TorchSwish(torch.nn.Module):
    def __init__(self, beta: Tensor):
        super().__init__()
        self.beta = torch.nn.Parameter(beta.clone())

    def forward(self, x):
        return x * torch.sigmoid(self.beta * x)


def test_check_layer_passes_the_template_layer():
    torch.manual_seed(0)
    layer = Swish(5, dtype=f64)
    with torch.no_grad():
        layer.beta.uniform_(0.5, 1.5)
    results = check_layer(layer, torch.randn(4, 5, dtype=f64))
    assert {r.tensor for r in results} == {"x", "beta"}
    assert all(r.passed and r.rel_autograd is not None for r in results), [r.describe() for r in results]


def test_check_layer_catches_a_wrong_template_backward():
    class WrongSwish(Swish):
        def backward_math(self, dout, saved):
            dx, grads = Swish.backward_math(self, dout, saved)
            return dx, {"beta": 2 * grads["beta"]}  # a planted factor of two

    torch.manual_seed(0)
    results = {r.tensor: r for r in check_layer(WrongSwish(5, dtype=f64), torch.randn(4, 5, dtype=f64))}
    assert results["x"].passed and not results["beta"].passed


def _pair(frozen: bool):
    torch.manual_seed(1)
    ours = Sequential(Linear(3, 5, dtype=f64), Swish(5, dtype=f64), Linear(5, 2, dtype=f64))
    theirs = torch.nn.Sequential(ours[0].to_torch(), TorchSwish(ours[1].beta.detach()), ours[2].to_torch())
    if frozen:
        ours.requires_grad_(False, ["1.beta"])
        theirs[1].beta.requires_grad_(False)
    return ours, theirs


@pytest.mark.parametrize("frozen", [False, True])
def test_in_a_sequential_it_trains_as_its_torch_twin(frozen):
    ours, theirs = _pair(frozen)
    opt = optimizers.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    topt = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    crit = MSELoss()
    for _step in range(4):
        x, y = torch.randn(6, 3, dtype=f64), torch.randn(6, 2, dtype=f64)
        opt.zero_grad()
        crit(ours(x), y)
        ours.backward(crit.backward())
        opt.step()
        topt.zero_grad()
        torch.nn.functional.mse_loss(theirs(x), y).backward()
        topt.step()
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b.detach(), rtol=1e-12, atol=1e-12, msg=name)
    assert (ours[1].beta.grad is None) == frozen
    if frozen:
        torch.testing.assert_close(ours[1].beta, torch.ones(5, dtype=f64), rtol=0, atol=0)


def test_the_base_refuses_misuse_naming_the_layer():
    layer = Swish(3, dtype=f64)
    x = torch.randn(2, 3, dtype=f64)
    with pytest.raises(RuntimeError, match=r"Swish\(\): backward called before forward"):
        layer.backward(torch.ones(2, 3, dtype=f64))
    layer(x)
    with pytest.raises(ValueError, match=r"dout has shape \(2, 4\) but the forward output had shape \(2, 3\)"):
        layer.backward(torch.ones(2, 4, dtype=f64))
    x.mul_(2)  # the kept input changed in place
    with pytest.raises(RuntimeError, match=r"its input x was modified in place after the forward, before backward"):
        layer.backward(torch.ones(2, 3, dtype=f64))
    with pytest.raises(TypeError, match=r"Swish\(\): x must be a torch.Tensor, got list"):
        layer([1.0, 2.0, 3.0])


def test_a_wrong_gradient_is_refused_by_name_and_shape():
    class Misnamed(Swish):
        def backward_math(self, dout, saved):
            return dout, {"gamma": dout.sum(0)}

    class Misshapen(Swish):
        def backward_math(self, dout, saved):
            return dout, {"beta": dout}

    x, d = torch.randn(2, 3, dtype=f64), torch.ones(2, 3, dtype=f64)
    layer = Misnamed(3, dtype=f64)
    layer(x)
    with pytest.raises(KeyError, match=r"gradient for 'gamma', which is not one of its parameters \('beta',\)"):
        layer.backward(d)
    layer = Misshapen(3, dtype=f64)
    layer(x)
    with pytest.raises(ValueError, match=r"gradient for beta has shape \(2, 3\), but beta has shape \(3,\)"):
        layer.backward(d)


def test_a_product_of_the_wrong_shape_is_refused_first_time_and_when_adding():
    """A weight gradient given as Product(a, b) is checked against the parameter whether it becomes .grad or
    is added into an existing one (addmm_)."""

    class Transposed(Linear):
        def backward_math(self, dout, saved, input=None):
            return None, {"weight": Product(saved.x.t(), dout)}  # (D, H): dW transposed

    layer = Transposed(3, 2, dtype=f64)
    x, d = torch.randn(4, 3, dtype=f64), torch.ones(4, 2, dtype=f64)
    for grad in (None, torch.zeros(2, 3, dtype=f64)):
        layer.weight.grad = grad
        layer(x)
        with pytest.raises(ValueError, match=r"gradient for weight has shape \(3, 2\), but weight has shape \(2, 3\)"):
            layer.backward(d)
        assert (layer.weight.grad is None) if grad is None else torch.equal(layer.weight.grad, grad)


def test_a_refused_backward_keeps_the_cache_for_a_retry():
    class Picky(Swish):
        def backward_math(self, dout, saved, scale=1.0):
            if scale <= 0:
                raise ValueError("scale must be > 0")
            return Swish.backward_math(self, dout * scale, saved)

    layer, ref = Picky(3, dtype=f64), Swish(3, dtype=f64)
    x, d = torch.randn(2, 3, dtype=f64), torch.randn(2, 3, dtype=f64)
    layer(x), ref(x)
    with pytest.raises(ValueError, match="scale must be > 0"):
        layer.backward(d, scale=0.0)
    assert layer.beta.grad is None
    torch.testing.assert_close(layer.backward(d), ref.backward(d), rtol=0, atol=0)
    torch.testing.assert_close(layer.beta.grad, ref.beta.grad, rtol=0, atol=0)


def test_b_then_w_equals_the_fused_backward_bit_for_bit():
    torch.manual_seed(2)
    fused, split = Swish(4, dtype=f64), Swish(4, dtype=f64)
    lin_f, lin_s = Linear(4, 3, dtype=f64), Linear(4, 3, dtype=f64)
    lin_s.load_state_dict(lin_f.state_dict())
    for _ in range(2):  # the second round accumulates into existing .grad
        x, d = torch.randn(5, 4, dtype=f64), torch.randn(5, 3, dtype=f64)
        lin_f(fused(x))
        dx_f = fused.backward(lin_f.backward(d))
        lin_s(split(x))
        dh = lin_s.backward_input(d)
        assert lin_s.weight.grad is None or not torch.equal(lin_s.weight.grad, lin_f.weight.grad)  # W not yet run
        dx_s = split.backward_input(dh)
        split.backward_weight()
        lin_s.backward_weight()
        assert torch.equal(dx_f, dx_s)
        for a, b in ((fused.beta, split.beta), (lin_f.weight, lin_s.weight), (lin_f.bias, lin_s.bias)):
            assert torch.equal(a.grad, b.grad)
    with pytest.raises(RuntimeError, match="backward_weight\\(\\) needs a backward_input\\(\\) before it"):
        split.backward_weight()


def test_a_product_gradient_is_skipped_for_a_frozen_parameter_and_accumulated_in_place():
    class Scale(BaseLayer):
        """y = x @ w^T (no bias), written with a Product for dW."""

        _param_names = ("weight",)

        class Saved(NamedTuple):
            x: Tensor

        def __init__(self):
            (self.weight,) = learned(torch.randn(3, 4, dtype=f64))

        def forward_math(self, x):
            return x @ self.weight.t(), self.Saved(x)

        def backward_math(self, dout, saved):
            return dout @ self.weight, {"weight": Product(dout.t(), saved.x)}

    layer = Scale()
    x, d = torch.randn(5, 4, dtype=f64), torch.randn(5, 3, dtype=f64)
    layer(x)
    layer.backward(d)
    grad = layer.weight.grad
    torch.testing.assert_close(grad, d.t() @ x, rtol=1e-15, atol=0)
    layer(x)
    layer.backward(d)
    assert layer.weight.grad is grad  # added into, in place
    torch.testing.assert_close(grad, 2 * (d.t() @ x), rtol=1e-14, atol=0)
    layer.weight.requires_grad_(False)
    layer(x)
    layer.backward(d)
    torch.testing.assert_close(layer.weight.grad, 2 * (d.t() @ x), rtol=1e-14, atol=0)  # untouched when frozen


def test_the_template_builds_no_graph():
    layer = Swish(3, dtype=f64)
    out = layer(torch.randn(2, 3, dtype=f64, requires_grad=True))
    assert out.grad_fn is None and not out.requires_grad
    dx = layer.backward(torch.ones(2, 3, dtype=f64))
    assert dx.grad_fn is None and layer.beta.grad.grad_fn is None

"""The gradient checker itself: it passes correct layers and catches a wrong one, naming where."""
import pytest
import torch

import gradcheck
from gradcheck import check_layer
from layers import Linear


class WrongBiasLinear(Linear):
    """A Linear whose bias gradient is wrong in one element: the checker must point at it."""

    def backward(self, dout, need_input_grad=True):
        dx = super().backward(dout, need_input_grad)
        self.bias.grad[2] += 0.5
        return dx


class DoubleScaleTanh:
    """A user-written layer with a wrong input gradient (factor 2)."""

    def __call__(self, x):
        return self.forward(x)

    def forward(self, x):
        self.out = torch.tanh(x)
        return self.out

    def backward(self, dout):
        return 2 * dout * (1 - self.out ** 2)

    def parameters(self):
        return []


def test_catches_wrong_parameter_gradient_and_names_index():
    torch.manual_seed(0)
    results = {r.tensor: r for r in check_layer(WrongBiasLinear(4, 5, dtype=torch.float64),
                                                 torch.randn(3, 4, dtype=torch.float64))}
    assert results["x"].passed and results["weight"].passed
    bad = results["bias"]
    assert not bad.passed
    assert bad.worst_index == (2,)
    assert abs(bad.actual - bad.expected - 0.5) < 1e-8
    assert bad.rel_autograd > 1e-3
    assert "bias" in bad.describe() and "(2,)" in bad.describe()


def test_catches_wrong_input_gradient_of_user_layer():
    r, = check_layer(DoubleScaleTanh(), torch.randn(2, 3, dtype=torch.float64))
    assert r.tensor == "x" and not r.passed and r.rel_numeric > 0.4


def test_leaves_existing_grads_alone():
    lin = Linear(2, 2, dtype=torch.float64)
    lin.weight.grad = torch.full((2, 2), 7.0, dtype=torch.float64)
    check_layer(lin, torch.randn(3, 2, dtype=torch.float64))
    assert torch.equal(lin.weight.grad, torch.full((2, 2), 7.0, dtype=torch.float64))
    assert lin.bias.grad is None and not lin.weight.requires_grad


def test_refuses_float32():
    with pytest.raises(ValueError, match="need float64"):
        check_layer(Linear(2, 2), torch.randn(3, 2))


class OpaqueCrash:
    """A layer whose forward autograd cannot trace (an in-place write into a leaf that requires grad)."""

    autograd_opaque = False

    def __call__(self, x):
        return self.forward(x)

    def forward(self, x):
        x.mul_(1.0)  # autograd refuses in-place ops on a leaf that requires grad
        self.x = x
        return 2 * x

    def backward(self, dout):
        return 2 * dout

    def parameters(self):
        return []


def test_autograd_failure_is_an_error_unless_the_layer_declares_itself_opaque():
    x = torch.randn(3, 2, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="autograd could not differentiate.*autograd_opaque = True"):
        check_layer(OpaqueCrash(), x)
    layer = OpaqueCrash()
    layer.autograd_opaque = True
    r, = check_layer(layer, x)
    assert r.passed and r.rel_autograd is None and "opaque" in r.describe()


class RandomScale:
    """Multiplies by a random per-element factor drawn at each forward (as dropout draws its mask)."""

    def __call__(self, x):
        return self.forward(x)

    def forward(self, x):
        self.m = torch.rand(x.shape, dtype=x.dtype)
        return x * self.m

    def backward(self, dout):
        return dout * self.m

    def parameters(self):
        return []


def test_layers_that_draw_random_numbers_see_the_same_draws_in_every_forward():
    x = torch.randn(4, 3, dtype=torch.float64)
    before = torch.get_rng_state()
    r, = check_layer(RandomScale(), x)
    assert r.passed, r.describe()
    assert torch.equal(torch.get_rng_state(), before)  # the caller's RNG is untouched


@pytest.mark.parametrize("fast", [False, True])
def test_fast_and_full_modes_catch_a_wrong_gradient(fast):
    torch.manual_seed(0)
    results = {r.tensor: r for r in check_layer(WrongBiasLinear(4, 5, dtype=torch.float64),
                                                 torch.randn(3, 4, dtype=torch.float64), fast=fast)}
    assert results["x"].passed and results["weight"].passed
    assert not results["bias"].passed and results["bias"].rel_numeric > 1e-3
    r, = check_layer(DoubleScaleTanh(), torch.randn(2, 3, dtype=torch.float64), fast=fast)
    assert not r.passed


def test_fast_mode_passes_a_correct_net_and_is_cheap():
    from models import Net
    net = Net(hidden_size=40, num_classes=10, in_features=60, depth=2, dtype=torch.float64)
    calls = 0
    real_forward = net.forward

    def counting(x):
        nonlocal calls
        calls += 1
        return real_forward(x)

    net.forward = counting
    results = check_layer(net, torch.randn(8, 60, dtype=torch.float64), fast=True)
    assert len(results) == 7 and all(r.passed for r in results), [r.describe() for r in results if not r.passed]
    # 2 hand/autograd forwards + 2 per direction per tensor, not 2 per element (~6,000 elements here).
    assert calls == 3 + 2 * gradcheck.PROJECTIONS * 7


def test_main_one_family_in_process(capsys):
    assert gradcheck.main(["--layer", "Softmax"]) == 0
    out = capsys.readouterr().out
    assert "Softmax" in out and "Linear" not in out and " 0 failed" in out


def test_main_unknown_name_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        gradcheck.main(["--layer", "conv3d"])
    assert e.value.code == 2 and "unknown layer 'conv3d'" in capsys.readouterr().err


def test_main_exits_1_on_a_failure(monkeypatch, capsys):
    monkeypatch.setattr(gradcheck, "CASE_FAMILIES", [lambda: {"wrong": [
        lambda fast: check_layer(DoubleScaleTanh(), torch.randn(2, 3, dtype=torch.float64), name="wrong")]}])
    assert gradcheck.main([]) == 1
    captured = capsys.readouterr()
    assert "FAIL" in captured.out and "FAIL: wrong x" in captured.err


def test_every_exported_layer_has_a_gradcheck_case():
    import layers
    names = {k.lower() for k in gradcheck.builtin_cases()}
    classes = {n.lower() for n in layers.__all__ if isinstance(getattr(layers, n), type)
               and issubclass(getattr(layers, n), layers.BaseLayer) and n not in ("BaseLayer",)}
    assert classes - {"sequential"} <= names, f"layers without a gradcheck case: {sorted(classes - names)}"


def test_a_plain_function_is_refused_saying_what_is_needed():
    with pytest.raises(TypeError, match=r"needs a layer, an object with forward\(x\) and backward\(dout\)"):
        check_layer(torch.tanh, torch.randn(2, 3, dtype=torch.float64))


class Bilinear:
    """A two-input, two-output layer: out = (a * b, a + b); backward(d1, d2) -> (da, db)."""

    def __init__(self, wrong: bool = False):
        self.wrong = wrong

    def forward(self, a, b, *, scale=1.0):
        self.a, self.b, self.scale = a, b, scale
        return a * b * scale, a + b

    def backward(self, d1, d2):
        da = d1 * self.b * self.scale + d2
        db = d1 * self.a * self.scale + (0 if self.wrong else d2)
        return da, db

    def parameters(self):
        return []


def test_several_inputs_and_outputs_are_checked_each_by_name():
    a, b = torch.randn(3, 2, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)
    good = check_layer(Bilinear(), (a, b), forward_kwargs={"scale": 3.0})
    assert [r.tensor for r in good] == ["a", "b"] and all(r.passed for r in good)
    bad = {r.tensor: r for r in check_layer(Bilinear(wrong=True), (a, b))}
    assert bad["a"].passed and not bad["b"].passed and bad["b"].rel_autograd > 1e-3


class Lookup:
    """An integer input (token ids) has no gradient: the checker passes it through and expects None back."""

    def __init__(self, gives_grad: bool = False):
        self.weight = torch.randn(5, 3, dtype=torch.float64)
        self.gives_grad = gives_grad

    def forward(self, idx):
        self.idx = idx
        return self.weight[idx]

    def backward(self, dout):
        self.weight.grad = torch.zeros_like(self.weight).index_add_(0, self.idx.reshape(-1), dout.reshape(-1, 3))
        return torch.zeros(1) if self.gives_grad else None

    def parameters(self):
        return [self.weight]


def test_an_integer_input_is_passed_through_and_gets_none():
    idx = torch.tensor([[0, 4, 4], [1, 0, 2]])
    r, = check_layer(Lookup(), idx)
    assert r.tensor == "weight" and r.passed  # named by the attribute that holds it
    with pytest.raises(TypeError, match="returned a gradient for x, which has none"):
        check_layer(Lookup(gives_grad=True), idx)

"""The gradient checker itself: it passes correct layers and catches a wrong one, naming where."""

import pytest
import torch

import gradcheck
from gradcheck import check_layer
from layers import Linear


class WrongBiasLinear(Linear):
    """A Linear whose bias gradient is wrong in one element: the checker must point at it."""

    def backward(self, dout, *, need_input_grad=True):
        dx = super().backward(dout, need_input_grad=need_input_grad)
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
        return 2 * dout * (1 - self.out**2)

    def parameters(self):
        return []


def test_catches_wrong_parameter_gradient_and_names_index():
    torch.manual_seed(0)
    results = {
        r.tensor: r
        for r in check_layer(WrongBiasLinear(4, 5, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64))
    }
    assert results["x"].passed and results["weight"].passed
    bad = results["bias"]
    assert not bad.passed
    assert bad.worst_index == (2,)
    assert abs(bad.actual - bad.expected - 0.5) < 1e-8
    assert bad.rel_autograd > 1e-3
    assert "bias" in bad.describe() and "(2,)" in bad.describe()


def test_catches_wrong_input_gradient_of_user_layer():
    (r,) = check_layer(DoubleScaleTanh(), torch.randn(2, 3, dtype=torch.float64))
    assert r.tensor == "x" and not r.passed and r.rel_numeric > 0.4


def test_leaves_existing_grads_alone():
    lin = Linear(2, 2, dtype=torch.float64)
    lin.weight.grad = torch.full((2, 2), 7.0, dtype=torch.float64)
    check_layer(lin, torch.randn(3, 2, dtype=torch.float64))
    assert torch.equal(lin.weight.grad, torch.full((2, 2), 7.0, dtype=torch.float64))
    assert lin.bias.grad is None and lin.weight.requires_grad and lin.bias.requires_grad  # flags as they were


def test_checks_a_frozen_parameter_and_leaves_it_frozen():
    lin = Linear(2, 2, dtype=torch.float64)
    lin.weight.requires_grad_(False)
    results = check_layer(lin, torch.randn(3, 2, dtype=torch.float64))
    assert {r.tensor for r in results} == {"x", "weight", "bias"} and all(r.passed for r in results)
    assert not lin.weight.requires_grad and lin.bias.requires_grad and lin.weight.grad is None


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
    (r,) = check_layer(layer, x)
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
    (r,) = check_layer(RandomScale(), x)
    assert r.passed, r.describe()
    assert torch.equal(torch.get_rng_state(), before)  # the caller's RNG is untouched


@pytest.mark.parametrize("fast", [False, True])
def test_fast_and_full_modes_catch_a_wrong_gradient(fast):
    torch.manual_seed(0)
    results = {
        r.tensor: r
        for r in check_layer(
            WrongBiasLinear(4, 5, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64), fast=fast
        )
    }
    assert results["x"].passed and results["weight"].passed
    assert not results["bias"].passed and results["bias"].rel_numeric > 1e-3
    (r,) = check_layer(DoubleScaleTanh(), torch.randn(2, 3, dtype=torch.float64), fast=fast)
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
    # 4 (douts, hand, hand again on pre-filled .grads, autograd) + 2 per direction per tensor, not 2 per element
    # (~6,000 elements here).
    assert calls == 4 + 2 * gradcheck.PROJECTIONS * 7


def test_main_one_family_in_process(capsys):
    assert gradcheck.main(["--layer", "Softmax"]) == 0
    out = capsys.readouterr().out
    assert "Softmax" in out and "Linear" not in out and " 0 failed" in out


def test_recurrent_cases_reach_the_parameters_through_the_torch_twin(capsys):
    # the autograd oracle of the recurrent layers is their torch.nn twin run on the layer's own parameters: a
    # detached copy would give zero gradients there and fail every parameter "vs autograd"
    assert gradcheck.main(["--layer", "rnncell"]) == 0
    out = capsys.readouterr().out
    assert "RNNCell" in out and "weight_hh" in out and " 0 failed" in out


def test_main_unknown_name_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        gradcheck.main(["--layer", "conv3d"])
    assert e.value.code == 2 and "unknown layer 'conv3d'" in capsys.readouterr().err


def test_main_reports_an_overwritten_grad_as_a_failure(monkeypatch, capsys):
    monkeypatch.setattr(
        gradcheck,
        "CASE_FAMILIES",
        [
            lambda: {
                "affine": [
                    lambda fast: check_layer(Affine("overwrite"), torch.randn(2, 3, dtype=torch.float64), name="Affine")
                ]
            }
        ],
    )
    assert gradcheck.main([]) == 1
    captured = capsys.readouterr()
    assert "2 passed, 1 failed" in captured.out
    assert "FAIL: Affine weight_hh: rel error" in captured.err and "backward overwrites weight_hh.grad" in captured.err


def test_main_exits_1_on_a_failure(monkeypatch, capsys):
    monkeypatch.setattr(
        gradcheck,
        "CASE_FAMILIES",
        [
            lambda: {
                "wrong": [
                    lambda fast: check_layer(DoubleScaleTanh(), torch.randn(2, 3, dtype=torch.float64), name="wrong")
                ]
            }
        ],
    )
    assert gradcheck.main([]) == 1
    captured = capsys.readouterr()
    assert "FAIL" in captured.out and "FAIL: wrong x" in captured.err


def test_every_exported_layer_has_a_gradcheck_case():
    import layers

    names = {k.lower() for k in gradcheck.builtin_cases()}
    classes = {
        n.lower()
        for n in layers.__all__
        if isinstance(getattr(layers, n), type)
        and issubclass(getattr(layers, n), layers.BaseLayer)
        and n not in ("BaseLayer",)
    }
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
        dw = torch.zeros_like(self.weight).index_add_(0, self.idx.reshape(-1), dout.reshape(-1, 3))
        self.weight.grad = dw if self.weight.grad is None else self.weight.grad + dw
        return torch.zeros(1) if self.gives_grad else None

    def parameters(self):
        return [self.weight]


def test_an_integer_input_is_passed_through_and_gets_none():
    idx = torch.tensor([[0, 4, 4], [1, 0, 2]])
    (r,) = check_layer(Lookup(), idx)
    assert r.tensor == "weight" and r.passed  # named by the attribute that holds it
    with pytest.raises(TypeError, match="returned a gradient for x, which has none"):
        check_layer(Lookup(gives_grad=True), idx)


# -- faults one backward's numbers do not show ----------------------------------------------------------


class Affine:
    """out = x * weight_hh + bias, with parameters() only (no named_parameters): a learner's layer.  ``bug``:
    "overwrite" assigns weight_hh.grad where it should add; "dout" zeroes dout in place where x < 0 and
    returns the changed dout as part of dx; "matmul", "keepdim": shape bugs in the backward."""

    def __init__(self, bug: str | None = None):
        g = torch.Generator().manual_seed(0)
        self.weight_hh = torch.randn(3, generator=g, dtype=torch.float64)
        self.bias = torch.randn(3, generator=g, dtype=torch.float64)
        self.bug = bug

    def forward(self, x):
        self.x = x
        return x * self.weight_hh + self.bias

    def backward(self, dout):
        dw = (dout * self.x).sum(0)
        db = dout.sum(0, keepdim=self.bug == "keepdim")
        if self.bug == "overwrite":
            self.weight_hh.grad = dw
        else:
            self.weight_hh.grad = dw if self.weight_hh.grad is None else self.weight_hh.grad + dw
        self.bias.grad = db if self.bias.grad is None else self.bias.grad + db
        if self.bug == "dout":
            dout.mul_(self.weight_hh)  # dx computed in place, in the caller's dout
            return dout
        if self.bug == "matmul":
            return dout @ torch.ones(5, 3, dtype=torch.float64)
        return dout * self.weight_hh

    def parameters(self):
        return [self.weight_hh, self.bias]


def test_a_correct_layer_with_parameters_only_is_checked_under_its_attribute_names():
    results = check_layer(Affine(), torch.randn(4, 3, dtype=torch.float64))
    assert [r.tensor for r in results] == ["x", "weight_hh", "bias"]  # not "0", "1"
    assert all(r.passed and r.problem is None for r in results), [r.describe() for r in results]


def test_a_backward_that_overwrites_grad_is_reported_by_the_parameters_name():
    """The most common learner's mistake: its gradient from an empty .grad is right, so the numbers alone pass it."""
    results = {r.tensor: r for r in check_layer(Affine("overwrite"), torch.randn(4, 3, dtype=torch.float64))}
    bad = results["weight_hh"]
    assert bad.rel_numeric < 1e-7 and bad.rel_autograd < 1e-7  # the numbers alone are right
    assert not bad.passed
    assert bad.problem.startswith("backward overwrites weight_hh.grad instead of adding to it")
    assert "weight_hh.grad += ..." in bad.describe()
    assert results["x"].passed and results["bias"].passed


@pytest.mark.parametrize("fast", [False, True])
def test_a_backward_that_changes_dout_in_place_is_reported(fast):
    """Its dx is right (the changed dout is dx), so the numbers alone pass it; in a network the layer before would then
    receive a changed gradient."""
    dout = torch.randn(4, 3, dtype=torch.float64)
    kept = dout.clone()
    results = {
        r.tensor: r for r in check_layer(Affine("dout"), torch.randn(4, 3, dtype=torch.float64), dout, fast=fast)
    }
    x = results["x"]
    assert x.rel_numeric < 1e-7 and not x.passed
    assert x.problem.startswith("backward changed its upstream gradient dout (by up to ")
    assert "in place: in a network the layer before it would receive changed values" in x.problem
    assert torch.equal(dout, kept)  # the caller's dout is untouched: backward was given a copy
    assert results["weight_hh"].passed and results["bias"].passed


@pytest.mark.parametrize(
    "bug,torch_says",
    [
        ("matmul", "mat1 and mat2 shapes cannot be multiplied (4x3 and 5x3)"),
        ("keepdim", "attempting to assign a gradient of size '[1, 3]' to a tensor of size '[3]'"),
    ],
)
def test_a_shape_bug_in_backward_names_the_layer_and_the_shapes_given_and_expected(bug, torch_says):
    with pytest.raises(RuntimeError) as e:
        check_layer(Affine(bug), torch.randn(4, 3, dtype=torch.float64), name="Affine")
    msg = str(e.value)
    assert msg.startswith(
        "gradcheck Affine: Affine.backward failed, given dout of shape (4, 3) (the shape of its "
        "output); it should give dx of shape (4, 3), weight_hh.grad of shape (3,), bias.grad of "
        "shape (3,): "
    )
    assert torch_says in msg and len(msg.splitlines()) == 1
    assert isinstance(e.value.__cause__, RuntimeError) and torch_says in str(e.value.__cause__)  # chained


def test_builtin_layers_add_into_grad_and_leave_dout_alone():
    """Every built-in Linear, Conv2d, BatchNorm, LayerNorm, Embedding passes the accumulation and dout checks."""
    from layers import BatchNorm1d, Conv2d, Embedding, LayerNorm

    f64 = torch.float64
    cases = [
        (Linear(4, 3, dtype=f64), torch.randn(2, 4, dtype=f64)),
        (Conv2d(2, 3, 3, dtype=f64), torch.randn(2, 2, 5, 5, dtype=f64)),
        (BatchNorm1d(3, dtype=f64), torch.randn(4, 3, dtype=f64)),
        (LayerNorm(3, dtype=f64), torch.randn(4, 3, dtype=f64)),
        (Embedding(5, 3, dtype=f64), torch.tensor([[0, 4, 4], [1, 0, 2]])),
    ]
    for layer, x in cases:
        results = check_layer(layer, x, fast=True)
        assert all(r.passed and r.problem is None for r in results), [r.describe() for r in results]


def test_the_case_families_are_public_documented_and_are_what_the_command_runs():
    from pathlib import Path

    from checking import cases

    page = (Path(__file__).resolve().parents[1] / "docs" / "checking.md").read_text()
    names = [f.__name__ for f in cases.FAMILIES]
    assert names == ["mlp", "loss", "normalisation", "activations", "convolution", "attention", "recurrent", "mixture"]
    assert [n for n in names if f"`cases.{n}`" not in page] == [], "a family docs/checking.md does not name"
    by_family = [set(f()) for f in cases.FAMILIES]
    assert list(gradcheck.builtin_cases()) == [k for f in cases.FAMILIES for k in f()]  # the command's order
    assert all(len(a & b) == 0 for i, a in enumerate(by_family) for b in by_family[i + 1 :])


def test_two_families_defining_one_name_are_refused():
    from checking import cases

    with pytest.raises(ValueError, match="two families define the case 'tanh'"):
        cases.collect([cases.mlp, lambda: {"tanh": []}])


def test_the_command_reexports_the_package():
    import checking

    assert gradcheck.check_layer is checking.check_layer and gradcheck.check_loss is checking.check_loss
    assert gradcheck.RTOL == checking.RTOL == 1e-7 and gradcheck.EPS == checking.EPS == 1e-6


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"eps": 0.0}, r"eps must be a finite number in \(0.0, inf\], got 0.0"),
        ({"eps": True}, r"eps must be .* got True"),
        ({"rtol": -1e-7}, r"rtol must be .* got -1e-07"),
        ({"fast": "yes"}, r"fast must be a bool, got 'yes'"),
        ({"seed": -1}, r"seed must be an int >= 0, got -1"),
    ],
)
def test_bad_settings_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match="gradcheck: " + message):
        check_layer(Linear(2, 2, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64), **kwargs)

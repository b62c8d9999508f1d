"""The layers under misuse: each misuse ends in torch's answer or in one clear error that
names the problem, never in a different number.

- a module used twice (``act`` or a Linear shared) is converted as torch runs it, the shared weight's gradient
  receiving both uses;
- a frozen parameter (``requires_grad=False``) gets no gradient, is not moved, and stays frozen through
  ``to_torch()``, ``as_module`` and a state_dict round trip;
- a shape bug inside a hand-written backward names the layer and the shapes, in a container and in ``as_module``;
- a layer with ``parameters()`` only (the README's ``Square``) wraps with ``as_module`` under its attribute names;
- a GPT with no positions, a prompt token outside the vocabulary, ``GradientMonitor(None)``: one clear line.
"""

import pytest
import torch
from torch import nn

import optimizers
from layers import Linear, Sequential, as_module, from_torch
from models import GPT, RecurrentLM
from monitoring import GradientMonitor

F64 = torch.float64


def rel(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


# -- a module used twice ---------------------------------------------------------------------------------------


def _shared_act():
    act = nn.ReLU()
    return nn.Sequential(nn.Linear(4, 8), act, nn.Linear(8, 8), act, nn.Linear(8, 2))


def _shared_linear():
    lin = nn.Linear(4, 4)
    return nn.Sequential(lin, nn.Tanh(), lin)


def _shared_in_nested():
    lin = nn.Linear(4, 4)
    block = nn.Sequential(lin, nn.Tanh())
    return nn.Sequential(block, nn.Linear(4, 4), block, lin)


@pytest.mark.parametrize(
    "make",
    [_shared_act, _shared_linear, _shared_in_nested],
    ids=["activation twice", "Linear twice", "block and Linear reused"],
)
def test_a_module_used_twice_is_converted_as_torch_runs_it(make):
    torch.manual_seed(0)
    theirs = make().to(F64)
    ours = from_torch(theirs)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert list(ours.state_dict()) == list(theirs.state_dict())  # every name, the shared ones twice
    opt, opt_t = optimizers.SGD(ours.parameters(), lr=0.1), torch.optim.SGD(theirs.parameters(), lr=0.1)
    for step in range(3):  # three steps: the second use must read the weights the first use's gradient moved
        x = torch.randn(5, 4, dtype=F64)
        out, out_t = ours(x), theirs(x)
        assert rel(out, out_t.detach()) < 1e-12, step
        dout = torch.randn_like(out)
        opt.zero_grad(), opt_t.zero_grad()
        dx = ours.backward(dout, need_input_grad=True)
        xr = x.clone().requires_grad_()
        (theirs(xr) * dout).sum().backward()
        assert rel(dx, xr.grad) < 1e-12
        for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
            assert rel(p.grad, q.grad) < 1e-12, (step, name)
        opt.step(), opt_t.step()
    back = ours.to_torch()  # the sharing comes back: one torch module used twice
    assert [n for n, _ in back.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    x = torch.randn(3, 4, dtype=F64)
    assert rel(back(x), theirs(x)) < 1e-12


def test_a_shared_layer_in_as_module_is_one_parameter_receiving_both_uses():
    torch.manual_seed(1)
    theirs = _shared_linear().to(F64)
    module = as_module(from_torch(theirs))
    assert [n for n, _ in module.named_parameters()] == ["0.weight", "0.bias"]
    x = torch.randn(5, 4, dtype=F64)
    module(x).pow(2).sum().backward()
    theirs(x).pow(2).sum().backward()
    for (name, p), (_, q) in zip(module.named_parameters(), theirs.named_parameters(), strict=True):
        assert rel(p.grad, q.grad) < 1e-12, name


# -- frozen parameters -----------------------------------------------------------------------------------------


def test_a_frozen_parameter_gets_no_gradient_and_does_not_move():
    torch.manual_seed(2)
    theirs = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(F64)
    theirs[0].weight.requires_grad_(False)
    ours = from_torch(theirs)
    assert ours.frozen_parameters() == ["0.weight"]
    opt, opt_t = optimizers.Adam(ours.parameters(), lr=0.1), torch.optim.Adam(theirs.parameters(), lr=0.1)
    frozen_before = ours[0].weight.clone()
    for _ in range(3):
        x = torch.randn(5, 4, dtype=F64)
        out = ours(x)
        dout = torch.randn_like(out)
        opt.zero_grad(), opt_t.zero_grad()
        ours.backward(dout)
        (theirs(x) * dout).sum().backward()
        assert ours[0].weight.grad is None and theirs[0].weight.grad is None
        opt.step(), opt_t.step()
    assert torch.equal(ours[0].weight, frozen_before)
    for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        assert rel(p, q.detach()) < 1e-12, name
    assert [(n, p.requires_grad) for n, p in ours.to_torch().named_parameters()] == [
        (n, p.requires_grad) for n, p in theirs.named_parameters()
    ]
    module = as_module(ours)
    assert not module.get_parameter("0.weight").requires_grad and module.get_parameter("0.bias").requires_grad
    module(torch.randn(3, 4, dtype=F64)).sum().backward()
    assert module.get_parameter("0.weight").grad is None and module.get_parameter("0.bias").grad is not None
    ours.load_state_dict(theirs.state_dict())  # a state_dict round trip keeps the flag (it is not in the state)
    assert ours.frozen_parameters() == ["0.weight"]


def test_requires_grad_freezes_and_unfreezes_by_name_and_refuses_unknown_names():
    net = Sequential(Linear(3, 4, dtype=F64), Linear(4, 2, dtype=F64))
    assert net.requires_grad_(False, ["1.bias"]).frozen_parameters() == ["1.bias"]
    net.requires_grad_(False)
    assert net.frozen_parameters() == ["0.weight", "0.bias", "1.weight", "1.bias"]
    net.requires_grad_(True, "0.bias")
    assert "0.bias" not in net.frozen_parameters()
    with pytest.raises(KeyError, match="no parameter named '2.weight'"):
        net.requires_grad_(False, ["2.weight"])
    with pytest.raises(TypeError, match="requires_grad must be a bool"):
        net.requires_grad_("no")


def test_a_frozen_gpt_matrix_stays_frozen_through_its_twin():
    torch.manual_seed(3)
    gpt = GPT(vocab_size=11, block_size=6, n_layer=1, n_head=2, n_embd=8, dtype=F64)
    gpt.requires_grad_(False, ["transformer.wpe.weight"])
    twin = gpt.to_torch()
    assert not twin.transformer.wpe.weight.requires_grad and twin.transformer.wte.weight.requires_grad
    idx = torch.randint(0, 11, (2, 6))
    logits = gpt(idx)
    gpt.backward(torch.randn_like(logits))
    assert gpt.wpe.weight.grad is None and gpt.wte.weight.grad is not None
    assert GPT.from_torch(twin).frozen_parameters() == ["transformer.wpe.weight"]


# -- a shape bug inside a hand-written backward ----------------------------------------------------------------


class Square:
    """The README's own layer: y = w * x**2, one weight per feature; ``parameters()`` only, no names."""

    def __init__(self, features, bug=None):
        self.weight = torch.randn(features, dtype=F64)
        self.bug = bug

    def parameters(self):
        return [self.weight]

    def __call__(self, x):
        return self.forward(x)

    def forward(self, x):
        self.x = x
        return self.weight * x**2

    def backward(self, dout):
        grad = (dout * self.x**2).sum(0, keepdim=self.bug == "keepdim")
        self.weight.grad = grad if self.weight.grad is None else self.weight.grad + grad
        if self.bug == "matmul":
            return dout @ torch.ones(7, 3, dtype=F64)
        if self.bug == "rows":
            return (dout * 2 * self.weight * self.x)[:2]
        return dout * 2 * self.weight * self.x


def test_as_module_takes_the_names_of_a_layer_with_parameters_only():
    module = as_module(Square(3))
    assert [n for n, _ in module.named_parameters()] == ["weight"]
    x = torch.randn(4, 3, dtype=F64, requires_grad=True)
    module(x).sum().backward()
    assert module.weight.grad.shape == (3,) and x.grad.shape == (4, 3)


@pytest.mark.parametrize(
    "bug,message",
    [
        (
            "matmul",
            r"the backward of layer 1 \(.*Square.*\) failed, given dout of shape \(4, 3\) \(its output had shape "
            r"\(4, 3\)\): mat1 and mat2 shapes cannot be multiplied",
        ),
        (
            "rows",
            r"the backward of layer 1 \(.*Square.*\) returned dx of shape \(2, 3\), but its forward's input had "
            r"shape \(4, 3\)",
        ),
        (
            "keepdim",
            r"the backward of layer 1 \(.*Square.*\) failed, given dout of shape \(4, 3\).*attempting to assign a "
            r"gradient of size '\[1, 3\]'",
        ),
    ],
)
def test_a_shape_bug_in_a_backward_inside_a_container_names_the_layer_and_shapes(bug, message):
    net = Sequential(Linear(3, 3, dtype=F64), Square(3, bug), Linear(3, 2, dtype=F64))
    out = net(torch.randn(4, 3, dtype=F64))
    with pytest.raises((RuntimeError, ValueError), match=message):
        net.backward(torch.randn_like(out))


@pytest.mark.parametrize(
    "bug,message",
    [
        ("matmul", r"as_module\(.*Square.*\): its backward failed, given dout of shape \(4, 3\).*mat1 and mat2"),
        (
            "rows",
            r"as_module\(.*Square.*\): its backward returned dx of shape \(2, 3\), but its input had shape \(4, 3\)",
        ),
    ],
)
def test_a_shape_bug_in_a_backward_under_as_module_names_the_layer_and_shapes(bug, message):
    module = as_module(Square(3, bug))
    x = torch.randn(4, 3, dtype=F64, requires_grad=True)
    with pytest.raises((RuntimeError, ValueError), match=message):
        module(x).sum().backward()


# -- sequences and monitors -------------------------------------------------------------------------------------


def test_a_gpt_with_no_positions_and_a_prompt_outside_the_vocabulary_are_refused_clearly():
    gpt = GPT(vocab_size=10, block_size=8, n_layer=1, n_head=2, n_embd=8)
    with pytest.raises(ValueError, match=r"GPT: idx has shape \(2, 0\): a sequence needs at least one position"):
        gpt(torch.zeros(2, 0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"GPT.generate: the prompt holds token id 50, outside the vocabulary 0..9"):
        gpt.generate(torch.tensor([[1, 50]]), 3)
    with pytest.raises(ValueError, match=r"the prompt holds token id -1"):
        gpt.generate(torch.tensor([[-1]]), 3)
    lm = RecurrentLM(10, 4, 8)
    with pytest.raises(ValueError, match=r"RecurrentLM.generate: the prompt holds token id 10, outside the vocabulary"):
        lm.generate(torch.tensor([[10]]), 2)


def test_gradient_monitor_of_none_says_what_it_needs():
    with pytest.raises(TypeError, match="GradientMonitor: the model is None; pass the model"):
        GradientMonitor(None)

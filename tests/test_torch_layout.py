"""Every parameter in torch's layout, through whole models: what pairs handgrad's parameters with torch's -- by
name or by position -- sees the same tensors.

For each model and its torch.nn twin, float64: ``named_parameters()`` gives the same names, in the same order, with
the same shapes; after the same forward and backward every ``.grad`` equals autograd's as exposed (no view or
transpose taken); and torch.optim's state after 3 steps loads into handgrad's optimizer (and the reverse) and the
next 3 steps on both sides give the same weights.  A square layer is among them: there a transposed layout would
load without a word and train wrong.
"""

import io
from collections import OrderedDict

import pytest
import torch
from torch import nn

import optimizers
from layers import from_torch
from models import GPT, Net, RecurrentLM
from tests.anchors.nanogpt_model import GPT as NanoGPT
from tests.anchors.nanogpt_model import GPTConfig

F64 = torch.float64
TOL = 1e-10


def rel(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


# -- the models: (ours, theirs, input, ours' output given its input, backward given dout) ------------------------


def _sequential(torch_model, shape):
    torch.manual_seed(0)
    theirs = torch_model().to(F64)
    ours = from_torch(theirs)
    return ours, theirs, lambda: torch.randn(*shape, dtype=F64)


def _net():
    torch.manual_seed(0)
    ours = Net(dtype=F64)  # the default MLP, 784 -> 1024 x 3 -> 10
    return ours, ours.to_torch(), lambda: torch.randn(4, 784, dtype=F64)


def _cnn():
    return _sequential(
        lambda: nn.Sequential(
            nn.Conv2d(2, 4, 3, padding=1),
            nn.ReLU(),
            nn.BatchNorm2d(4),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(4 * 3 * 3, 5),
        ),
        (3, 2, 6, 6),
    )


def _lstm():
    torch.manual_seed(0)
    theirs = nn.Sequential(OrderedDict(lstm=nn.LSTM(6, 8, num_layers=2, batch_first=True))).to(F64)
    from layers import LSTM

    return LSTM.from_torch(theirs.lstm), theirs.lstm, lambda: torch.randn(3, 5, 6, dtype=F64)


def _recurrent_lm():
    torch.manual_seed(0)
    ours = RecurrentLM(11, 6, 8, num_layers=2, cell="lstm", dtype=F64)
    return ours, ours.to_torch(), lambda: torch.randint(0, 11, (3, 7))


def _gpt():
    """Without biases: c_attn's key bias has a gradient of exactly 0 in exact arithmetic (softmax ignores a constant
    added to a row's scores), rounding noise on both sides, which RMSprop and Adagrad divide by its own size."""
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(F64)  # nanoGPT's model takes no dtype: build it in float64
    try:
        theirs = NanoGPT(GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8, dropout=0.0, bias=False))
    finally:
        torch.set_default_dtype(default)
    ours = GPT(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8, bias=False, dtype=F64)
    ours.load_state_dict(theirs.state_dict())  # from nanoGPT's own state_dict
    return ours, theirs, lambda: torch.randint(0, 13, (2, 8))


MODELS = {
    "default Net": _net,
    "MLP square": lambda: _sequential(lambda: nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16)), (5, 16)),
    "MLP non-square": lambda: _sequential(
        lambda: nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 5)), (5, 12)
    ),
    "CNN": _cnn,
    "LSTM": _lstm,
    "RecurrentLM": _recurrent_lm,
    "GPT (nanoGPT)": _gpt,
}


def _first(out):
    return out[0] if isinstance(out, tuple) else out  # a recurrent layer or LM returns (output, state)


def _outputs(theirs, x):
    if isinstance(theirs, NanoGPT):  # nanoGPT's forward without targets gives the last position's logits only
        return theirs(x, targets=x)[0]
    return _first(theirs(x))


def backward_both(ours, theirs, x, seed):
    """The same forward and backward on both sides: loss = sum(out * dout) for a fixed random dout."""
    out = _first(ours(x))
    dout = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(seed))
    ours.backward(dout)
    (_outputs(theirs, x) * dout).sum().backward()


@pytest.mark.parametrize("model", MODELS)
def test_named_parameters_and_grads_are_torchs(model):
    ours, theirs, make_x = MODELS[model]()
    mine, torch_named = list(ours.named_parameters()), list(theirs.named_parameters())
    assert [(n, tuple(p.shape)) for n, p in mine] == [(n, tuple(p.shape)) for n, p in torch_named]
    assert all(p.is_contiguous() for _, p in mine)  # torch's layout, not only its shape
    backward_both(ours, theirs, make_x(), seed=1)
    for (name, p), (_, q) in zip(mine, torch_named, strict=True):
        assert p.grad.shape == q.grad.shape and rel(p.grad, q.grad) < TOL, name


OPTIMIZERS = {  # learning rates small enough that 6 steps keep the GPT where rounding does not grow 100x a step
    "SGD momentum": ("SGD", dict(lr=0.01, momentum=0.9)),
    "SGD nesterov": ("SGD", dict(lr=0.01, momentum=0.9, nesterov=True, weight_decay=0.01)),
    "RMSprop centered momentum": ("RMSprop", dict(lr=0.01, momentum=0.5, centered=True)),
    "Adam amsgrad": ("Adam", dict(lr=0.01, amsgrad=True)),
    "AdamW": ("AdamW", dict(lr=0.01, weight_decay=0.1)),
    "Adagrad": ("Adagrad", dict(lr=0.1)),
}


def _train(model, opt, xs, seed):
    """One step per input: loss = sum(out * dout), dout drawn from ``seed`` + the step's number."""
    for s, x in enumerate(xs):
        opt.zero_grad()
        out = _outputs(model, x) if isinstance(model, nn.Module) else _first(model(x))
        dout = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(seed + s))
        if isinstance(model, nn.Module):
            (out * dout).sum().backward()
        else:
            model.backward(dout)
        opt.step()


def saved_and_read(state: dict) -> dict:
    """Through torch.save and torch.load, as a checkpoint goes (a state_dict holds references to live tensors)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("opt_name", OPTIMIZERS)
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("direction", ["torch to handgrad", "handgrad to torch"])
def test_optimizer_state_moves_through_the_model(model, opt_name, direction):
    """3 steps on one side, its optimizer's state_dict loaded into the other's optimizer, 3 more steps each: the
    weights agree with the side that went on alone."""
    cls, kw = OPTIMIZERS[opt_name]
    ours, theirs, make_x = MODELS[model]()
    torch.manual_seed(5)
    xs = [make_x() for _ in range(6)]
    first, second = (theirs, ours) if direction == "torch to handgrad" else (ours, theirs)
    make_opt = lambda m: (getattr(torch.optim, cls) if isinstance(m, nn.Module) else getattr(optimizers, cls))(  # noqa: E731
        m.parameters(), **kw
    )
    opt1 = make_opt(first)
    _train(first, opt1, xs[:3], seed=10)
    second.load_state_dict(saved_and_read(first.state_dict()))  # the weights after 3 steps
    opt2 = make_opt(second)
    opt2.load_state_dict(saved_and_read(opt1.state_dict()))  # the optimizer state, mapped by position
    _train(first, opt1, xs[3:], seed=20)
    _train(second, opt2, xs[3:], seed=20)
    theirs_now = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        assert rel(p, theirs_now[name].detach()) < TOL, name

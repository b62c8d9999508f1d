"""Freezing is torch's: a parameter's own ``requires_grad`` decides, at each backward, whether it gets a gradient.

- torch's idiom ``for p in net[0].parameters(): p.requires_grad_(False)`` freezes a handgrad layer as it freezes a
  torch.nn one, in every kind of layer (Linear, Conv2d, BatchNorm, LayerNorm, Embedding, attention, LSTM, GRUCell,
  GPT), each run beside its torch twin;
- the flag touches nothing else: ``.grad`` stays as it was, backward adds nothing into a frozen parameter's
  ``.grad``, and the optimizers move a parameter by whatever ``.grad`` holds, as torch.optim does (every optimizer,
  ``zero_grad(set_to_none=...)`` both ways, freezing and unfreezing mid-run);
- an optimizer none of whose parameters has a gradient does nothing on ``step()`` (a frozen backbone);
- the flag survives ``from_torch``, ``to_torch``, ``as_module``, a state_dict round trip and a deep copy;
- the hand-written step builds no autograd graph although the parameters require gradients.
"""

import copy
import io
import warnings

import pytest
import torch
from torch import nn

import optimizers
from layers import LSTM, GRUCell, Linear, ReLU, Sequential, TransformerEncoderLayer, as_module, from_torch
from losses import CrossEntropyLoss
from models import GPT, Net
from tests.conftest import rel

F64 = torch.float64


def _freeze(params, flag=False):
    for p in params:
        p.requires_grad_(flag)


def _assert_same(ours, theirs, tol=1e-10, what=""):
    """Same names, same flags, same values, and the same gradients (None where torch has None)."""
    mine, ref = dict(ours.named_parameters()), dict(theirs.named_parameters())
    assert list(mine) == list(ref), what
    for n, q in ref.items():
        p = mine[n]
        assert p.requires_grad == q.requires_grad, f"{what} {n}: requires_grad"
        assert rel(p.detach(), q.detach()) < tol, f"{what} {n}: {rel(p.detach(), q.detach()):.3e}"
        assert (p.grad is None) == (q.grad is None), f"{what} {n}: .grad {p.grad is None} vs torch {q.grad is None}"
        if q.grad is not None:
            assert rel(p.grad, q.grad) < tol, f"{what} {n}: grad {rel(p.grad, q.grad):.3e}"


# -- torch's idiom in every kind of layer, beside torch ------------------------------------------------------------


def _mlp():
    theirs = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).to(F64)
    return theirs, from_torch(theirs), lambda g: torch.randn(5, 4, dtype=F64, generator=g)


def _cnn():
    theirs = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 2)).to(
        F64
    )
    return theirs, from_torch(theirs), lambda g: torch.randn(4, 2, 6, 6, dtype=F64, generator=g)


def _embedding_norm():
    theirs = nn.Sequential(nn.Embedding(7, 6), nn.LayerNorm(6), nn.Linear(6, 3)).to(F64)
    return theirs, from_torch(theirs), lambda g: torch.randint(0, 7, (4, 5), generator=g)


def _attention():
    theirs = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True).to(F64)
    return theirs, TransformerEncoderLayer.from_torch(theirs), lambda g: torch.randn(3, 5, 8, dtype=F64, generator=g)


def _gpt():
    ours = GPT(vocab_size=11, block_size=6, n_layer=2, n_head=2, n_embd=8, dtype=F64)
    return ours.to_torch(), ours, lambda g: torch.randint(0, 11, (2, 6), generator=g)


MODELS = {
    "mlp": (_mlp, lambda m: m[0]),
    "cnn": (_cnn, lambda m: [m[0], m[1]]),
    "embedding+layernorm": (_embedding_norm, lambda m: [m[0], m[1]]),
    "attention": (_attention, lambda m: [m.self_attn]),
    "gpt": (_gpt, lambda m: m.transformer.h[0]),
}


def _frozen_part(ours, theirs, pick):
    """The same part of both models (``pick`` reads it off the torch one; handgrad's by the same names)."""
    part = pick(theirs)
    parts = part if isinstance(part, list) else [part]
    names = {id(p) for m in parts for p in m.parameters()}
    chosen = [n for n, p in theirs.named_parameters() if id(p) in names]
    mine = dict(ours.named_parameters())
    return [mine[n] for n in chosen], [dict(theirs.named_parameters())[n] for n in chosen]


@pytest.mark.parametrize("model", list(MODELS))
def test_torch_idiom_freezes_every_kind_of_layer_as_torch(model):
    build, pick = MODELS[model]
    torch.manual_seed(0)
    theirs, ours, data = build()
    mine, ref = _frozen_part(ours, theirs, pick)
    assert mine
    _freeze(mine), _freeze(ref)  # for p in net[0].parameters(): p.requires_grad_(False)
    frozen_before = [p.detach().clone() for p in mine]
    opt, opt_t = optimizers.SGD(ours.parameters(), lr=0.1), torch.optim.SGD(theirs.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        x = data(g)
        out_t = theirs(x)
        dout = torch.randn(out_t.shape, dtype=F64, generator=g)
        opt.zero_grad(), opt_t.zero_grad()
        out = ours(x)
        assert rel(out, out_t.detach()) < 1e-12
        ours.backward(dout)
        (out_t * dout).sum().backward()
        _assert_same(ours, theirs, what=f"{model} after backward {step}")
        opt.step(), opt_t.step()
        _assert_same(ours, theirs, what=f"{model} after step {step}")
    assert all(torch.equal(p, b) for p, b in zip(mine, frozen_before, strict=True))


def test_torch_idiom_freezes_an_lstm_layer_as_torch():
    torch.manual_seed(0)
    theirs = nn.LSTM(3, 5, num_layers=2).to(F64)
    ours = LSTM.from_torch(theirs)
    _freeze([theirs.weight_ih_l0, theirs.bias_hh_l1]), _freeze([ours.weight_ih_l0, ours.bias_hh_l1])
    opt, opt_t = optimizers.SGD(ours.parameters(), lr=0.1), torch.optim.SGD(theirs.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        x = torch.randn(4, 2, 3, dtype=F64, generator=g)
        out_t, _ = theirs(x)
        dout = torch.randn(out_t.shape, dtype=F64, generator=g)
        opt.zero_grad(), opt_t.zero_grad()
        out, _ = ours(x)
        ours.backward(dout)
        (out_t * dout).sum().backward()
        _assert_same(ours, theirs, what=f"lstm after backward {step}")
        opt.step(), opt_t.step()
        _assert_same(ours, theirs, what=f"lstm after step {step}")


def test_torch_idiom_freezes_a_gru_cell_as_torch():
    torch.manual_seed(0)
    theirs = nn.GRUCell(3, 4).to(F64)
    ours = GRUCell.from_torch(theirs)
    _freeze([theirs.weight_hh, theirs.bias_ih]), _freeze([ours.weight_hh, ours.bias_ih])
    opt, opt_t = optimizers.SGD(ours.parameters(), lr=0.1), torch.optim.SGD(theirs.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        x = torch.randn(2, 3, dtype=F64, generator=g)
        out_t = theirs(x)
        dout = torch.randn(out_t.shape, dtype=F64, generator=g)
        opt.zero_grad(), opt_t.zero_grad()
        ours(x)
        ours.backward(dout)
        (out_t * dout).sum().backward()
        _assert_same(ours, theirs, what=f"gru cell after backward {step}")
        opt.step(), opt_t.step()
        _assert_same(ours, theirs, what=f"gru cell after step {step}")


# -- the flag touches nothing else; the optimizers read .grad as torch.optim does ------------------------------------

OPTIMIZERS = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9)),
    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1)),
    ("SGD", dict(lr=0.1, weight_decay=0.1)),
    ("RMSprop", dict(lr=0.01, momentum=0.5, weight_decay=0.1)),
    ("Adam", dict(lr=0.01, weight_decay=0.1)),
    ("AdamW", dict(lr=0.01, weight_decay=0.1)),
    ("Adagrad", dict(lr=0.1, weight_decay=0.1)),
]


@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("name,kw", OPTIMIZERS)
def test_freeze_and_unfreeze_mid_run_follow_torch_optim(name, kw, set_to_none):
    """Steps 0-1 train all; 2-4 the first layer frozen (with set_to_none=False its zeroed .grad stays, so momentum
    and weight decay keep moving it, as in torch); 5-7 unfrozen again.  Beside nn + torch.optim, every step."""
    torch.manual_seed(0)
    theirs, ours, data = _mlp()
    opt = getattr(optimizers, name)(ours.parameters(), **kw)
    opt_t = getattr(torch.optim, name)(theirs.parameters(), **kw)
    g = torch.Generator().manual_seed(2)
    for step in range(8):
        if step in (2, 5):
            _freeze(ours[0].parameters(), step == 5), _freeze(theirs[0].parameters(), step == 5)
        x = data(g)
        opt.zero_grad(set_to_none), opt_t.zero_grad(set_to_none)
        out, out_t = ours(x), theirs(x)
        ours.backward(out.detach())  # loss = |out|^2 / 2
        (out_t.pow(2).sum() / 2).backward()
        opt.step(), opt_t.step()
        _assert_same(ours, theirs, tol=1e-12, what=f"{name} {kw} set_to_none={set_to_none} step {step}")


def test_the_flag_leaves_grad_alone_and_backward_adds_nothing_into_a_frozen_grad():
    net = Sequential(Linear(3, 4, dtype=F64), ReLU(), Linear(4, 2, dtype=F64))
    x = torch.randn(5, 3, dtype=F64)
    net.backward(torch.ones_like(net(x)))
    stale = net[0].weight.grad
    values = stale.clone()
    net.requires_grad_(False, ["0.weight"])  # handgrad's way: the flag only, as torch's requires_grad_
    assert net[0].weight.grad is stale and not net[0].weight.requires_grad
    assert net.frozen_parameters() == ["0.weight"]
    net.backward(torch.ones_like(net(x)))
    assert net[0].weight.grad is stale and torch.equal(stale, values)  # not added into
    net[0].weight.requires_grad_(True)  # torch's way, the same flag
    assert net.frozen_parameters() == []
    net.backward(torch.ones_like(net(x)))
    assert torch.allclose(net[0].weight.grad, 2 * values)


def test_an_optimizer_over_a_frozen_backbone_does_nothing_while_the_head_warms_up():
    torch.manual_seed(4)
    theirs, ours, data = _mlp()
    backbone, backbone_t = ours[0].parameters(), list(theirs[0].parameters())
    _freeze(backbone), _freeze(backbone_t)
    opts = [optimizers.Adam(backbone, lr=0.01), optimizers.SGD(ours[2].parameters(), lr=0.1)]
    opts_t = [torch.optim.Adam(backbone_t, lr=0.01), torch.optim.SGD(theirs[2].parameters(), lr=0.1)]
    g = torch.Generator().manual_seed(3)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for step in range(4):
            x = data(g)
            for o, o_t in zip(opts, opts_t, strict=True):
                o.zero_grad(), o_t.zero_grad()
            out, out_t = ours(x), theirs(x)
            ours.backward(out.detach())
            (out_t.pow(2).sum() / 2).backward()
            for o, o_t in zip(opts, opts_t, strict=True):
                o.step(), o_t.step()
            _assert_same(ours, theirs, tol=1e-12, what=f"step {step}")
    assert len([w for w in said if "no parameter has a gradient" in str(w.message)]) == 1  # said once
    assert not opts[0].state and not opts_t[0].state


# -- the flag travels ------------------------------------------------------------------------------------------------


def test_the_flag_survives_conversion_wrapping_state_dict_and_copies():
    torch.manual_seed(5)
    theirs = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(F64)
    theirs[2].bias.requires_grad_(False)
    ours = from_torch(theirs)
    assert ours.frozen_parameters() == ["2.bias"] and not ours[2].bias.requires_grad
    assert [p.requires_grad for p in ours.to_torch().parameters()] == [p.requires_grad for p in theirs.parameters()]
    module = as_module(ours)
    assert [p.requires_grad for p in module.parameters()] == [True, True, True, False]
    module(torch.randn(3, 4, dtype=F64)).sum().backward()
    assert module.get_parameter("2.bias").grad is None and module.get_parameter("2.weight").grad is not None
    sd = ours.state_dict()
    assert not any(t.requires_grad for t in sd.values())  # detached, as torch.nn's state_dict
    fresh = from_torch(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(F64))
    fresh[2].bias.requires_grad_(False)
    fresh.load_state_dict(sd)  # values in, flags the model's own (torch's rule: a state_dict holds no flags)
    assert fresh.frozen_parameters() == ["2.bias"] and torch.equal(fresh[2].weight, ours[2].weight)
    assert copy.deepcopy(ours).frozen_parameters() == ["2.bias"]
    buf = io.BytesIO()
    torch.save(sd, buf)  # a checkpoint's model state: plain tensors, loadable with weights_only
    buf.seek(0)
    resumed = from_torch(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(F64))
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    assert resumed.frozen_parameters() == [] and torch.equal(resumed[2].bias, ours[2].bias)


# -- no graph ----------------------------------------------------------------------------------------------------


def _net_step():
    net = Net(hidden_size=8, in_features=6, num_classes=3, depth=2, dtype=F64)
    return net, torch.randn(4, 6, dtype=F64), torch.randint(0, 3, (4,))


def _cnn_step():
    net = from_torch(
        nn.Sequential(
            nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(2 * 3 * 3, 3)
        ).to(F64)
    )
    return net, torch.randn(4, 1, 8, 8, dtype=F64), torch.randint(0, 3, (4,))


def _gpt_step():
    gpt = GPT(vocab_size=11, block_size=6, n_layer=1, n_head=2, n_embd=8, dtype=F64)
    idx = torch.randint(0, 11, (2, 6))
    return gpt, idx, torch.randint(0, 11, (2 * 6,))


@pytest.mark.parametrize("make", [_net_step, _cnn_step, _gpt_step, "lstm"])
def test_a_training_step_records_no_graph(make):
    """Grad recording on (the default), parameters requiring gradients: the forward, the loss, the backward and the
    optimizer step save nothing for autograd and give no tensor with a grad_fn."""
    torch.manual_seed(6)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        if make == "lstm":
            model = LSTM(3, 4, dtype=F64)
            x = torch.randn(5, 2, 3, dtype=F64)
            out, (h, c) = model(x)
            outs = [out, h, c]
            grads_in = [model.backward(torch.ones_like(out))]
        else:
            model, x, target = make()
            logits = model(x)
            crit = CrossEntropyLoss()
            loss = crit(logits.reshape(-1, logits.shape[-1]), target)
            outs = [logits, loss]
            grads_in = [model.backward(crit.backward().reshape(logits.shape))]
        opt = optimizers.AdamW(model.parameters(), lr=0.01)
        opt.step()
    params = model.parameters()
    assert params and all(p.requires_grad for p in params)
    assert all(p.grad is not None and p.grad.grad_fn is None and not p.grad.requires_grad for p in params)
    assert all(t.grad_fn is None and not t.requires_grad for t in outs)
    assert all(g is None or g.grad_fn is None for g in grads_in if isinstance(g, torch.Tensor))
    assert not saved  # autograd recorded nothing

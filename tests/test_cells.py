"""RNNCell, LSTMCell and GRUCell against torch.nn's cells (autograd, float64) and the textbook steps in
layers/reference.py; a loop of cells is backpropagation through time written out, equal to the sequence layer."""
import re

import pytest
import torch
from torch import nn

from layers import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell, from_torch
from layers import reference as ref
from tests.test_recurrent import TOL_AUTOGRAD, TOL_REFERENCE, err

f64 = torch.float64
CELLS = {"rnn_tanh": (RNNCell, {}), "rnn_relu": (RNNCell, {"nonlinearity": "relu"}), "lstm": (LSTMCell, {}),
         "gru": (GRUCell, {}), "gru_nobias": (GRUCell, {"bias": False})}


def pair(kind, seed=0):
    cls, kw = CELLS[kind]
    torch.manual_seed(seed)
    ours = cls(4, 5, dtype=f64, **kw)
    torch.manual_seed(seed)
    twin = getattr(nn, cls.__name__)(4, 5, dtype=f64, **kw)
    return ours, twin


def as_list(t):
    return list(t) if isinstance(t, tuple) else [t]


@pytest.mark.parametrize("kind", list(CELLS))
@pytest.mark.parametrize("batch", [3, None])
@pytest.mark.parametrize("with_state", [True, False])
def test_cell_matches_torch_autograd(kind, batch, with_state):
    ours, twin = pair(kind)
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), twin.parameters()))  # the same init
    g = torch.Generator().manual_seed(1)
    lead = () if batch is None else (batch,)
    x = torch.randn(*lead, 4, generator=g, dtype=f64)
    state = None
    if with_state:
        state = tuple(torch.randn(*lead, 5, generator=g, dtype=f64) for _ in range(2 if kind == "lstm" else 1))
        state = state if kind == "lstm" else state[0]
    out = ours(x, state)
    xa = x.clone().requires_grad_()
    sa = None if state is None else (tuple(s.clone().requires_grad_() for s in state) if kind == "lstm"
                                     else state.clone().requires_grad_())
    oa = twin(xa, sa)
    douts = [torch.randn(o.shape, generator=g, dtype=f64) for o in as_list(out)]
    sum((o * d).sum() for o, d in zip(as_list(oa), douts)).backward()
    grads = ours.backward(tuple(douts) if kind == "lstm" else douts[0])
    errors = {f"out[{i}]": err(a, b.detach()) for i, (a, b) in enumerate(zip(as_list(out), as_list(oa)))}
    dx, dstate = grads if with_state else (grads, None)
    errors["dx"] = err(dx, xa.grad)
    if with_state:
        errors.update({f"dstate[{i}]": err(a, b.grad) for i, (a, b) in enumerate(zip(as_list(dstate), as_list(sa)))})
    named = dict(twin.named_parameters())
    errors.update({n: err(p.grad, named[n].grad) for n, p in ours.named_parameters()})
    assert len(errors) == len(as_list(out)) + 1 + (len(as_list(out)) if with_state else 0) + len(named)
    assert max(errors.values()) < TOL_AUTOGRAD, errors


@pytest.mark.parametrize("kind", ["rnn_tanh", "rnn_relu", "lstm", "gru"])
def test_cell_equals_the_textbook_step(kind):
    ours, _ = pair(kind)
    g = torch.Generator().manual_seed(2)
    x, h = torch.randn(3, 4, generator=g, dtype=f64), torch.randn(3, 5, generator=g, dtype=f64)
    dh = torch.randn(3, 5, generator=g, dtype=f64)
    w = (ours.weight_ih, ours.weight_hh, ours.bias_ih, ours.bias_hh)
    if kind == "lstm":
        c, dc = torch.randn(3, 5, generator=g, dtype=f64), torch.randn(3, 5, generator=g, dtype=f64)
        h1, c1, cache = ref.lstm_step_forward(x, h, c, *w)
        rdx, rdh, rdc, grads = ref.lstm_step_backward(dh, dc, cache)
        out = ours(x, (h, c))
        dx, (odh, odc) = ours.backward(dh, dc)  # the pair unpacked, as gradcheck passes it
        assert err(out[0], h1) < TOL_REFERENCE and err(out[1], c1) < TOL_REFERENCE and err(odc, rdc) < TOL_REFERENCE
    else:
        step = ref.gru_step_forward if kind == "gru" else ref.rnn_step_forward
        back = ref.gru_step_backward if kind == "gru" else ref.rnn_step_backward
        h1, cache = step(x, h, *w) if kind == "gru" else step(x, h, *w, ours.nonlinearity)
        rdx, rdh, grads = back(dh, cache)
        assert err(ours(x, h), h1) < TOL_REFERENCE
        dx, odh = ours.backward(dh)
    assert err(dx, rdx) < TOL_REFERENCE and err(odh, rdh) < TOL_REFERENCE
    for name, gref in grads.items():
        assert err(getattr(ours, name).grad, gref) < TOL_REFERENCE, name


@pytest.mark.parametrize("cell_cls,seq_cls", [(LSTMCell, LSTM), (GRUCell, GRU), (RNNCell, RNN)])
def test_a_loop_of_cells_is_bptt_and_equals_the_sequence_layer(cell_cls, seq_cls):
    """T cells sharing one set of weights, run forward in time and backward from the last step to the first
    carrying dh_next (and dc_next): the textbook BPTT.  Their gradients add up (+=) in the shared .grad, and equal
    the sequence layer's."""
    torch.manual_seed(3)
    seq = seq_cls(4, 5, dtype=f64)
    T, N = 6, 2
    cells = [cell_cls(4, 5, dtype=f64) for _ in range(T)]
    for c in cells:  # one set of weights
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            setattr(c, name, getattr(seq, name + "_l0"))
    x = torch.randn(T, N, 4, dtype=f64)
    lstm = cell_cls is LSTMCell
    state = (torch.zeros(N, 5, dtype=f64),) * 2 if lstm else torch.zeros(N, 5, dtype=f64)
    outs = []
    for t in range(T):
        state = cells[t](x[t], state)
        outs.append(state[0] if lstm else state)
    dy = torch.randn(T, N, 5, dtype=f64)
    dnext = (torch.zeros(N, 5, dtype=f64),) * 2 if lstm else torch.zeros(N, 5, dtype=f64)
    dxs = [None] * T
    for t in reversed(range(T)):
        dxs[t], dnext = cells[t].backward((dy[t] + dnext[0], dnext[1]) if lstm else dy[t] + dnext)
    cell_grads = [p.grad.clone() for p in seq.parameters()]
    seq.zero_grad()
    out, _ = seq(x, None)
    dx = seq.backward(dy)
    assert err(torch.stack(outs), out) < TOL_REFERENCE and err(torch.stack(dxs), dx) < TOL_REFERENCE
    assert all(err(a, p.grad) < TOL_REFERENCE for a, p in zip(cell_grads, seq.parameters()))


@pytest.mark.parametrize("module", [nn.RNNCell(3, 4, nonlinearity="relu"), nn.LSTMCell(3, 4, bias=False),
                                    nn.GRUCell(3, 4).double()], ids=["rnn", "lstm", "gru"])
def test_cell_from_torch_and_back(module):
    ours = from_torch(module)
    assert type(ours).__name__ == type(module).__name__
    sd = module.state_dict()
    assert list(ours.state_dict()) == list(sd) and all(torch.equal(ours.state_dict()[k], v) for k, v in sd.items())
    back = ours.to_torch()
    assert type(back) is type(module) and back.bias == module.bias
    assert all(torch.equal(back.state_dict()[k], v) for k, v in sd.items())
    if isinstance(module, nn.RNNCell):
        assert back.nonlinearity == "relu"


def test_cell_bad_input_names_the_shapes():
    cell = LSTMCell(3, 4)
    with pytest.raises(ValueError, match=re.escape("expected input of shape (N, 3) or unbatched (3,), got (2, 5)")):
        cell(torch.randn(2, 5))
    with pytest.raises(ValueError, match=re.escape("c has shape (2, 5), expected (2, 4) ((batch, hidden_size))")):
        cell(torch.randn(2, 3), (torch.zeros(2, 4), torch.zeros(2, 5)))
    with pytest.raises(ValueError, match=re.escape("h has shape (2, 4), expected (4,)")):
        GRUCell(3, 4)(torch.randn(3), torch.zeros(2, 4))
    with pytest.raises(RuntimeError, match="backward called before forward"):
        cell.backward((torch.zeros(2, 4), torch.zeros(2, 4)))
    h, c = cell(torch.randn(2, 3))
    with pytest.raises(ValueError, match=re.escape("dc' has shape (4,) but the forward's output had shape (2, 4)")):
        cell.backward(torch.zeros(2, 4), torch.zeros(4))
    with pytest.raises(TypeError, match="as one pair or as two arguments, not both"):
        cell.backward((h, c), c)
    dx = cell.backward((None, torch.ones(2, 4)))  # either part may be None
    assert dx.shape == (2, 3)
    with pytest.raises(RuntimeError, match="twice"):
        cell.backward((h, c))
    with pytest.raises(ValueError, match="nonlinearity must be 'tanh' or 'relu'"):
        RNNCell(3, 4, nonlinearity="gelu")

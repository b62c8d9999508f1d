"""RNNCell, LSTMCell and GRUCell against torch.nn's cells (autograd, float64), their kernels against their textbook
steps (layers/recurrent/cells.py); a loop of cells is backpropagation through time written out, equal to the
sequence layer."""

import contextlib
import re

import pytest
import torch
from torch import nn

import kernels
from layers import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell, from_torch
from tests.test_recurrent import TOL_AUTOGRAD, TOL_REFERENCE, err

f64 = torch.float64
CELLS = {
    "rnn_tanh": (RNNCell, {}),
    "rnn_relu": (RNNCell, {"nonlinearity": "relu"}),
    "lstm": (LSTMCell, {}),
    "gru": (GRUCell, {}),
    "gru_nobias": (GRUCell, {"bias": False}),
}


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
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), twin.parameters(), strict=True))  # the same init
    g = torch.Generator().manual_seed(1)
    lead = () if batch is None else (batch,)
    x = torch.randn(*lead, 4, generator=g, dtype=f64)
    state = None
    if with_state:
        state = tuple(torch.randn(*lead, 5, generator=g, dtype=f64) for _ in range(2 if kind == "lstm" else 1))
        state = state if kind == "lstm" else state[0]
    out = ours(x, state)
    xa = x.clone().requires_grad_()
    sa = (
        None
        if state is None
        else (tuple(s.clone().requires_grad_() for s in state) if kind == "lstm" else state.clone().requires_grad_())
    )
    oa = twin(xa, sa)
    douts = [torch.randn(o.shape, generator=g, dtype=f64) for o in as_list(out)]
    sum((o * d).sum() for o, d in zip(as_list(oa), douts, strict=True)).backward()
    grads = ours.backward(tuple(douts) if kind == "lstm" else douts[0])
    errors = {f"out[{i}]": err(a, b.detach()) for i, (a, b) in enumerate(zip(as_list(out), as_list(oa), strict=True))}
    dx, dstate = grads if with_state else (grads, None)
    errors["dx"] = err(dx, xa.grad)
    if with_state:
        errors.update(
            {f"dstate[{i}]": err(a, b.grad) for i, (a, b) in enumerate(zip(as_list(dstate), as_list(sa), strict=True))}
        )
    named = dict(twin.named_parameters())
    errors.update({n: err(p.grad, named[n].grad) for n, p in ours.named_parameters()})
    assert len(errors) == len(as_list(out)) + 1 + (len(as_list(out)) if with_state else 0) + len(named)
    assert max(errors.values()) < TOL_AUTOGRAD, errors


@pytest.mark.parametrize("kind", ["rnn_tanh", "rnn_relu", "lstm", "gru", "gru_nobias"])
def test_the_cell_s_kernel_equals_its_textbook_step(kind):
    """The cell with the kernels on (bptt.py with T = 1) and off (its own step equations, cells.py)."""
    results = []
    for on in (True, False):
        with contextlib.nullcontext() if on else kernels.disabled():
            ours, _ = pair(kind)
            g = torch.Generator().manual_seed(2)
            x, h = torch.randn(3, 4, generator=g, dtype=f64), torch.randn(3, 5, generator=g, dtype=f64)
            dh = torch.randn(3, 5, generator=g, dtype=f64)
            if kind == "lstm":
                c, dc = torch.randn(3, 5, generator=g, dtype=f64), torch.randn(3, 5, generator=g, dtype=f64)
                out = ours(x, (h, c))
                dx, dstate = ours.backward(dh, dc)  # the pair unpacked, as gradcheck passes it
            else:
                out = ours(x, h)
                dx, dstate = ours.backward(dh)
            results.append([*as_list(out), dx, *as_list(dstate), *(p.grad for p in ours.parameters())])
    assert len(results[0]) == len(results[1])
    for a, b in zip(*results, strict=True):
        assert err(a, b) < TOL_REFERENCE


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
    assert all(err(a, p.grad) < TOL_REFERENCE for a, p in zip(cell_grads, seq.parameters(), strict=True))


@pytest.mark.parametrize(
    "module",
    [nn.RNNCell(3, 4, nonlinearity="relu"), nn.LSTMCell(3, 4, bias=False), nn.GRUCell(3, 4).double()],
    ids=["rnn", "lstm", "gru"],
)
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

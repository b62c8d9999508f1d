"""The backward split in two for the recurrent layers and cells: B (``backward_input``, the whole backward through
time, taking and returning what ``backward`` does) then W (``backward_weight``, the weight products over every
step) equals the fused ``backward`` bit for bit in float64 -- RNN, LSTM and GRU with one and two layers, one and two
directions, with and without initial states, dropout between layers, and each cell; B alone writes no ``.grad``;
W without B, and B twice, are refused; a frozen parameter gets nothing from W."""

import pytest
import torch

from layers import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell
from tests.conftest import assert_grads_same, assert_same, seeded_pair

f64 = torch.float64
T, N, I, H = 4, 3, 5, 6


def _steps(layer, inputs, douts, *, split, **bw):
    """Forward and backward once per step (the .grad accumulating), each forward under the same seed in both runs
    (the dropout masks between layers); -> the last step's input gradients."""
    out = None
    for i, (args, dout) in enumerate(zip(inputs, douts, strict=True)):
        torch.manual_seed(100 + i)
        layer(*args)
        if split:
            before = [None if p.grad is None else p.grad.clone() for p in layer.parameters()]
            out = layer.backward_input(*dout, **bw)
            for p, b in zip(layer.parameters(), before, strict=True):  # B writes no gradient
                assert (p.grad is None and b is None) or torch.equal(p.grad, b), "backward_input wrote a .grad"
            layer.backward_weight()
        else:
            out = layer.backward(*dout, **bw)
    return out


def _sequence_case(kind, layers, bidirectional, with_hx, *, proj=0, dropout=0.0, batch_first=False):
    D = 2 if bidirectional else 1
    kw = {
        "num_layers": layers,
        "bidirectional": bidirectional,
        "dropout": dropout,
        "batch_first": batch_first,
        "dtype": f64,
    }
    if proj:
        kw["proj_size"] = proj
    fused, split = seeded_pair(lambda: kind(I, H, **kw))
    Ho = proj or H
    g = torch.Generator().manual_seed(1)
    rnd = lambda *s: torch.randn(*s, dtype=f64, generator=g)  # noqa: E731
    inputs, douts = [], []
    for _ in range(2):
        x = rnd(N, T, I) if batch_first else rnd(T, N, I)
        hx = None
        if with_hx:
            hx = rnd(layers * D, N, Ho) if kind is not LSTM else (rnd(layers * D, N, Ho), rnd(layers * D, N, H))
        inputs.append((x, hx))
        dstate = rnd(layers * D, N, Ho) if kind is not LSTM else (rnd(layers * D, N, Ho), rnd(layers * D, N, H))
        douts.append((rnd(N, T, D * Ho) if batch_first else rnd(T, N, D * Ho), dstate))
    return fused, split, inputs, douts


SEQUENCE = {
    "rnn-1": (RNN, 1, False, False, {}),
    "rnn-relu-2-bi-hx": (lambda *a, **k: RNN(*a, nonlinearity="relu", **k), 2, True, True, {}),
    "rnn-2-dropout": (RNN, 2, False, True, {"dropout": 0.3}),
    "lstm-1-hx": (LSTM, 1, False, True, {}),
    "lstm-2-bi": (LSTM, 2, True, False, {"batch_first": True}),
    "lstm-2-bi-proj-hx-dropout": (LSTM, 2, True, True, {"proj": 4, "dropout": 0.3}),
    "gru-1-bi": (GRU, 1, True, False, {}),
    "gru-2-hx": (GRU, 2, False, True, {"batch_first": True}),
    "gru-2-bi-hx-dropout": (GRU, 2, True, True, {"dropout": 0.3}),
}


@pytest.mark.parametrize("case", SEQUENCE)
def test_a_recurrent_layers_b_then_w_equals_its_backward_bit_for_bit(case):
    kind, layers, bi, with_hx, kw = SEQUENCE[case]
    fused, split, inputs, douts = _sequence_case(kind, layers, bi, with_hx, **kw)
    assert_same(_steps(fused, inputs, douts, split=False), _steps(split, inputs, douts, split=True))
    assert_grads_same(fused, split)


def test_b_without_the_input_gradient_gives_none_for_dx_and_the_same_weight_gradients():
    fused, split, inputs, douts = _sequence_case(LSTM, 2, True, True)
    out_f = _steps(fused, inputs, douts, split=False, need_input_grad=False)
    out_s = _steps(split, inputs, douts, split=True, need_input_grad=False)
    assert out_f[0] is None and out_s[0] is None
    assert_same(out_f, out_s)
    assert_grads_same(fused, split)


def test_an_unbatched_sequence_and_a_missing_output_gradient():
    fused, split = seeded_pair(lambda: GRU(I, H, num_layers=2, dtype=f64))
    x = torch.randn(T, I, dtype=f64)
    inputs = [(x, None)] * 2
    douts = [(None, torch.randn(2, H, dtype=f64)), (torch.randn(T, H, dtype=f64), None)]
    assert_same(_steps(fused, inputs, douts, split=False), _steps(split, inputs, douts, split=True))
    assert_grads_same(fused, split)


CELLS = {
    "rnncell": (lambda: RNNCell(I, H, dtype=f64), 1),
    "rnncell-relu-nobias": (lambda: RNNCell(I, H, bias=False, nonlinearity="relu", dtype=f64), 1),
    "lstmcell": (lambda: LSTMCell(I, H, dtype=f64), 2),
    "grucell": (lambda: GRUCell(I, H, dtype=f64), 1),
}


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("case", CELLS)
def test_a_cells_b_then_w_equals_its_backward_bit_for_bit(case, with_state):
    make, states = CELLS[case]
    fused, split = seeded_pair(make)
    g = torch.Generator().manual_seed(2)
    rnd = lambda *s: torch.randn(*s, dtype=f64, generator=g)  # noqa: E731
    inputs, douts = [], []
    for _ in range(2):
        hx = None
        if with_state:
            hx = rnd(N, H) if states == 1 else (rnd(N, H), rnd(N, H))
        inputs.append((rnd(N, I), hx))
        douts.append((rnd(N, H),) if states == 1 else (rnd(N, H), rnd(N, H)))
    assert_same(_steps(fused, inputs, douts, split=False), _steps(split, inputs, douts, split=True))
    assert_grads_same(fused, split)


def test_the_lstm_cell_takes_the_pair_as_one_argument_in_b_too():
    fused, split = seeded_pair(lambda: LSTMCell(I, H, dtype=f64))
    x, dh, dc = torch.randn(N, I, dtype=f64), torch.randn(N, H, dtype=f64), torch.randn(N, H, dtype=f64)
    fused(x), split(x)
    dx_f = fused.backward(dh, dc)
    dx_s = split.backward_input((dh, dc))
    split.backward_weight()
    assert_same(dx_f, dx_s)
    assert_grads_same(fused, split)
    split(x)
    with pytest.raises(TypeError, match="one pair or as two arguments"):
        split.backward_input((dh, dc), dc)


@pytest.mark.parametrize(
    "make", [lambda: LSTM(I, H, num_layers=2, dtype=f64), lambda: GRUCell(I, H, dtype=f64)], ids=["lstm", "grucell"]
)
def test_w_without_b_and_b_twice_are_refused(make):
    layer = make()
    cell = isinstance(layer, GRUCell)
    x = torch.randn(N, I, dtype=f64) if cell else torch.randn(T, N, I, dtype=f64)
    dout = (torch.randn(N, H, dtype=f64),) if cell else (torch.randn(T, N, H, dtype=f64), None)
    with pytest.raises(RuntimeError, match=r"backward_weight\(\) needs a backward_input\(\) before it"):
        layer.backward_weight()
    layer(x)
    layer.backward_input(*dout)
    layer(x)
    with pytest.raises(RuntimeError, match=r"backward_input\(\) again before backward_weight\(\)"):
        layer.backward_input(*dout)
    layer.backward_weight()
    assert all(p.grad is not None for p in layer.parameters())
    with pytest.raises(RuntimeError, match="needs a backward_input"):
        layer.backward_weight()


def test_a_weight_changed_in_place_between_b_and_w_is_refused():
    rnn = RNN(I, H, dtype=f64)
    rnn(torch.randn(T, N, I, dtype=f64))
    rnn.backward_input(torch.randn(T, N, H, dtype=f64))
    with torch.no_grad():
        rnn.weight_hh_l0.mul_(2)
    with pytest.raises(RuntimeError, match="weight_hh_l0"):
        rnn.backward_weight()


@pytest.mark.parametrize("kind", [RNN, LSTM, GRU])
def test_frozen_parameters_get_nothing_from_w_and_the_rest_equal_the_fused_backward(kind):
    frozen = ["weight_ih_l0", "bias_hh_l1_reverse", "weight_hh_l1"]
    fused, split, inputs, douts = _sequence_case(kind, 2, True, True)
    for layer in (fused, split):
        layer.requires_grad_(False, frozen)
    assert_same(_steps(fused, inputs, douts, split=False), _steps(split, inputs, douts, split=True))
    assert_grads_same(fused, split)
    assert all(getattr(split, n).grad is None for n in frozen)

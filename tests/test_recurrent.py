"""RNN, LSTM and GRU against torch.nn's (autograd through its kernels, float64), their kernels against the textbook
loop over the cells' equations (layers/recurrent/cells.py, the kernels off), their dropout twins, conversion, and bad
input.

The issue's measure of agreement: max|a - b| / max(max|a|, max|b|, 1e-3), within 1e-10 against autograd
(float64 round-off gives ~1e-15) and within 1e-12 between the kernels and the textbook loop.
"""

import contextlib
import re
import warnings

import pytest
import torch
from torch import nn

import kernels
from kernels import cpp
from kernels.recurrent import bptt
from layers import GRU, LSTM, RNN, from_torch
from layers.template import Product
from models import SeededLSTM, seeded_dropouts
from training.impls.models import use_generator

f64 = torch.float64
TOL_AUTOGRAD, TOL_REFERENCE = 1e-10, 1e-12


def err(a: torch.Tensor, b: torch.Tensor) -> float:
    """The issue's relative error: relative to the larger magnitude, floored at 1e-3."""
    assert a.shape == b.shape, (a.shape, b.shape)
    scale = max(a.abs().max().item(), b.abs().max().item(), 1e-3)
    return (a - b).abs().max().item() / scale


KINDS = {  # name: (hand-written class, torch class, extra constructor arguments)
    "rnn_tanh": (RNN, nn.RNN, {}),
    "rnn_relu": (RNN, nn.RNN, {"nonlinearity": "relu"}),
    "lstm": (LSTM, nn.LSTM, {}),
    "lstm_proj": (LSTM, nn.LSTM, {"proj_size": 3}),
    "gru": (GRU, nn.GRU, {}),
}


def pair(kind: str, seed: int = 0, **kw):
    """(hand-written layer, its nn twin), built under the same seed: identical weights without copying."""
    ours_cls, torch_cls, extra = KINDS[kind]
    torch.manual_seed(seed)
    ours = ours_cls(dtype=f64, **extra, **kw)
    torch.manual_seed(seed)
    twin = torch_cls(dtype=f64, **extra, **kw)
    return ours, twin


def states_for(layer, batch: int | None, g: torch.Generator):
    """Random non-zero initial states shaped as the layer wants them (batch None: unbatched)."""
    lead = (layer.num_layers * layer.num_directions,) + (() if batch is None else (batch,))
    h = torch.randn(*lead, layer.h_out, generator=g, dtype=f64)
    if isinstance(layer, LSTM):
        return h, torch.randn(*lead, layer.hidden_size, generator=g, dtype=f64)
    return h


def leaves(hx):
    return tuple(t.clone().requires_grad_() for t in hx) if isinstance(hx, tuple) else hx.clone().requires_grad_()


def flat(x):
    return list(x) if isinstance(x, tuple) else [x]


def compare_with_autograd(ours, twin, x, hx, g):
    """Forward both, backward both with the same random upstream gradients; the worst error of every output,
    input gradient (x and each initial state) and parameter gradient."""
    out, hn = ours(x, hx)
    xa = x.clone().requires_grad_()
    hxa = None if hx is None else leaves(hx)
    oa, hna = twin(xa, hxa)
    dout = torch.randn(out.shape, generator=g, dtype=f64)
    dhn = tuple(torch.randn(h.shape, generator=g, dtype=f64) for h in flat(hn))
    (sum((o * d).sum() for o, d in zip([oa, *flat(hna)], [dout, *dhn], strict=True))).backward()
    grads = ours.backward(dout, dhn if isinstance(hn, tuple) else dhn[0])
    errors = {"output": err(out, oa.detach())}
    errors.update({f"h_n[{i}]": err(a, b.detach()) for i, (a, b) in enumerate(zip(flat(hn), flat(hna), strict=True))})
    if hx is None:
        errors["dx"] = err(grads, xa.grad)
    else:
        dx, dhx = grads
        errors["dx"] = err(dx, xa.grad)
        errors.update({f"dhx[{i}]": err(a, b.grad) for i, (a, b) in enumerate(zip(flat(dhx), flat(hxa), strict=True))})
    named = dict(twin.named_parameters())
    assert [n for n, _ in ours.named_parameters()] == list(named)
    errors.update({name: err(p.grad, named[name].grad) for name, p in ours.named_parameters()})
    return errors


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
def test_goal_matches_torch_autograd_T64_two_layers(kind, bidirectional, batch_first):
    """The issue's goal: T = 64, 2 layers, non-zero initial states, both directions, batch_first both ways."""
    ours, twin = pair(
        kind, input_size=5, hidden_size=6, num_layers=2, bidirectional=bidirectional, batch_first=batch_first
    )
    g = torch.Generator().manual_seed(1)
    T, N = 64, 3
    x = torch.randn((N, T, 5) if batch_first else (T, N, 5), generator=g, dtype=f64)
    hx = states_for(ours, N, g)
    errors = compare_with_autograd(ours, twin, x, hx, g)
    assert len(errors) == 2 + 2 * len(flat(hx)) + len(ours.parameters())  # every tensor compared
    worst = max(errors, key=errors.get)
    assert errors[worst] < TOL_AUTOGRAD, f"{worst}: {errors[worst]:.2e}"


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("with_state", [False, True])
def test_unbatched_input_matches_torch(kind, with_state):
    ours, twin = pair(kind, input_size=4, hidden_size=5, num_layers=2, bidirectional=True)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(7, 4, generator=g, dtype=f64)  # (T, I)
    hx = states_for(ours, None, g) if with_state else None
    errors = compare_with_autograd(ours, twin, x, hx, g)
    assert max(errors.values()) < TOL_AUTOGRAD, errors


@pytest.mark.parametrize("kind", list(KINDS))
def test_no_state_returns_dx_alone_and_none_gradients_are_zeros(kind):
    ours, twin = pair(kind, input_size=3, hidden_size=4, num_layers=2)
    x = torch.randn(5, 2, 3, dtype=f64)
    out, hn = ours(x)
    xa = x.clone().requires_grad_()
    oa, _ = twin(xa)
    dout = torch.randn_like(out)
    (oa * dout).sum().backward()
    dx = ours.backward(dout)  # the state's gradient omitted: zeros
    assert isinstance(dx, torch.Tensor) and err(dx, xa.grad) < TOL_AUTOGRAD
    # only the final state's gradient (a sequence-to-one model), the output's None
    ours(x, states_for(ours, 2, torch.Generator().manual_seed(0)))
    dstate = (torch.randn_like(hn[0]), None) if isinstance(hn, tuple) else torch.randn_like(hn)
    dx, dhx = ours.backward(None, dstate)
    assert dx.shape == x.shape and all(d.shape == h.shape for d, h in zip(flat(dhx), flat(hn), strict=True))


def test_gradients_accumulate_and_no_graph_is_built():
    ours, _ = pair("lstm", input_size=3, hidden_size=4)
    x = torch.randn(4, 2, 3, dtype=f64, requires_grad=True)
    out, (h, c) = ours(x)
    assert not out.requires_grad and not h.requires_grad and out.grad_fn is None
    dout = torch.randn_like(out)
    ours.backward(dout)
    once = [p.grad.clone() for p in ours.parameters()]
    ours(x)
    ours.backward(dout)
    assert all(torch.allclose(p.grad, 2 * g, rtol=1e-14, atol=0) for p, g in zip(ours.parameters(), once, strict=True))
    assert all(p.requires_grad and p.grad.grad_fn is None for p in ours.parameters())  # as nn.Parameter's: no graph


def test_state_carried_across_calls_equals_one_long_sequence():
    """Truncated BPTT's forward: a sequence in two calls, the second starting from the first's (h_n, c_n)."""
    ours, _ = pair("lstm", input_size=3, hidden_size=4, num_layers=2)
    x = torch.randn(10, 2, 3, dtype=f64)
    full, (h, c) = ours(x)
    first, state = ours(x[:6])
    second, (h2, c2) = ours(x[6:], state)
    assert err(torch.cat([first, second]), full) < TOL_REFERENCE
    assert err(h2, h) < TOL_REFERENCE and err(c2, c) < TOL_REFERENCE


@pytest.mark.parametrize(
    "cls,torch_cls,kw",
    [
        (RNN, nn.RNN, {"nonlinearity": "relu"}),
        (LSTM, nn.LSTM, {"proj_size": 2}),
        (GRU, nn.GRU, {}),
        (LSTM, nn.LSTM, {"bias": False, "bidirectional": True}),
    ],
)
def test_initialisation_equals_torch_under_the_same_seed(cls, torch_cls, kw):
    torch.manual_seed(11)
    ours = cls(7, 5, num_layers=3, **kw)
    after_ours = torch.get_rng_state()
    torch.manual_seed(11)
    twin = torch_cls(7, 5, num_layers=3, **kw)
    assert torch.equal(after_ours, torch.get_rng_state())  # the same number of draws
    sd = twin.state_dict()
    assert list(ours.state_dict()) == list(sd) == list(twin._flat_weights_names)
    for name, t in ours.state_dict().items():
        assert torch.equal(t, sd[name]), name
    bound = 1 / 5**0.5
    assert all(p.abs().max() <= bound for p in ours.parameters())


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
@pytest.mark.parametrize(
    "module",
    [
        nn.RNN(3, 4, 2, nonlinearity="relu", bias=False, batch_first=True, dropout=0.2, bidirectional=True),
        nn.LSTM(3, 5, 2, proj_size=2, bidirectional=True),
        nn.GRU(3, 4, batch_first=True).double(),
    ],
    ids=["rnn", "lstm", "gru"],
)
def test_from_torch_and_to_torch_round_trip(module):
    ours = from_torch(module)
    assert type(ours).__name__ == type(module).__name__ and ours.training == module.training
    for arg in type(ours)._ctor_args:
        assert getattr(ours, arg) == getattr(module, arg), arg
    sd = module.state_dict()
    assert list(ours.state_dict()) == list(sd)
    assert all(torch.equal(ours.state_dict()[k], v) for k, v in sd.items())
    back = ours.to_torch()
    assert type(back) is type(module)
    assert all(torch.equal(back.state_dict()[k], v) for k, v in sd.items())
    x = torch.randn(2, 4, 3, dtype=sd["weight_ih_l0"].dtype)
    module.eval(), ours.eval()
    assert err(ours(x)[0], module(x)[0].detach()) < 1e-5  # float32 for two of them


# -- the textbook loop (cells.py, the kernels off): the kernels agree with it to 1e-12 ------------------------------


def _run(kind, kernels_on, *, T, bidirectional, num_layers=1, dropout=0.0, hx=True):
    """(output, h_n, dx, dhx, {name: grad}) of one forward and backward, the kernels on or off, from seeded weights,
    inputs and upstream gradients."""
    with contextlib.nullcontext() if kernels_on else kernels.disabled():
        ours, _ = pair(
            kind, input_size=4, hidden_size=5, bidirectional=bidirectional, num_layers=num_layers, dropout=dropout
        )
        ours.generator = torch.Generator().manual_seed(11)
        g = torch.Generator().manual_seed(3)
        x = torch.randn(T, 3, 4, generator=g, dtype=f64)
        state = states_for(ours, 3, g) if hx else None
        out, hn = ours(x, state)
        dout = torch.randn(out.shape, generator=g, dtype=f64)
        dhn = tuple(torch.randn(h.shape, generator=g, dtype=f64) for h in flat(hn))
        res = ours.backward(dout, dhn if isinstance(hn, tuple) else dhn[0])
        dx, dhx = res if hx else (res, None)
    return out, hn, dx, dhx, {n: p.grad for n, p in ours.named_parameters()}


def _against_textbook(kind, reverse, *, T, **kw):
    fast, slow = _run(kind, True, T=T, bidirectional=reverse, **kw), _run(kind, False, T=T, bidirectional=reverse, **kw)
    for a, b in zip(fast[:4], slow[:4], strict=True):
        for u, v in zip(flat(a) if a is not None else [], flat(b) if b is not None else [], strict=True):
            assert err(u, v) < TOL_REFERENCE
    assert fast[4].keys() == slow[4].keys()
    for name in fast[4]:
        assert err(fast[4][name], slow[4][name]) < TOL_REFERENCE, name


@pytest.mark.parametrize("kind", ["rnn_tanh", "rnn_relu", "lstm", "lstm_proj", "gru"])
@pytest.mark.parametrize("reverse", [False, True])
def test_the_kernels_equal_the_textbook_loop(kind, reverse):
    """One layer, each direction (bidirectional: the reverse direction runs the loop from the last step)."""
    _against_textbook(kind, reverse, T=9)


@pytest.mark.parametrize("kind", ["lstm", "lstm_proj"])
def test_lstm_factors_by_chunks_equal_the_textbook_loop(kind):
    """The LSTM's kernel computes its gate factors a few steps at a time (bptt._FACTOR_STEPS): every length from
    one step to past two chunks -- the last chunk whole or partial, in either direction -- is the textbook loop."""
    with cpp.disabled():  # (the C++ gates, on by default, compute no factors)
        for T in range(1, 2 * bptt._FACTOR_STEPS + 2):
            _against_textbook(kind, True, T=T, hx=False)


@pytest.mark.parametrize("kind", ["rnn_tanh", "lstm_proj", "gru"])
def test_stacked_layers_with_dropout_equal_the_textbook_loop(kind):
    """Three layers, both directions, dropout between them (the same masks either way)."""
    _against_textbook(kind, True, T=5, num_layers=3, dropout=0.5)


# -- dropout between layers, and its twin --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["rnn_tanh", "lstm_proj", "gru"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_dropout_masks_are_reproduced_by_the_seeded_twin(kind, batch_first):
    """Training mode, dropout 0.5 between 3 layers: the hand-written layer and seeded_dropouts(layer.to_torch())
    (single-layer torch kernels with the same masks between them) agree in outputs and every gradient."""
    ours, _ = pair(
        kind, input_size=4, hidden_size=5, num_layers=3, dropout=0.5, bidirectional=True, batch_first=batch_first
    )
    twin = seeded_dropouts(ours.to_torch())
    assert type(twin).__name__ == "Seeded" + type(ours).__name__ and twin.training
    gen_ours, gen_twin = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    use_generator(ours, gen_ours)  # the trainer's hook finds both by `generator` and `p`
    use_generator(twin, gen_twin)
    assert ours.generator is gen_ours and twin.generator is gen_twin
    g = torch.Generator().manual_seed(6)
    x = torch.randn((3, 8, 4) if batch_first else (8, 3, 4), generator=g, dtype=f64)
    rng_before = torch.get_rng_state()
    errors = compare_with_autograd(ours, twin, x, states_for(ours, 3, g), g)
    assert max(errors.values()) < TOL_AUTOGRAD, errors
    assert torch.equal(torch.get_rng_state(), rng_before)  # drawn from the given generators only
    # and the masks did drop something: without them the outputs differ
    ours.eval()
    assert err(ours(x)[0], twin(x)[0].detach()) > 1e-3


def test_dropout_is_off_in_eval_mode_and_the_twin_is_then_nn_lstm():
    ours, _ = pair("lstm", input_size=3, hidden_size=4, num_layers=2, dropout=0.9)
    twin = seeded_dropouts(ours.to_torch())
    plain = ours.to_torch()
    x = torch.randn(5, 2, 3, dtype=f64)
    ours.eval(), twin.eval(), plain.eval()
    assert err(ours(x)[0], plain(x)[0].detach()) < TOL_AUTOGRAD
    assert torch.equal(twin(x)[0], plain(x)[0])


def test_dropout_masks_are_drawn_batch_major_for_data_parallel_rows():
    """global_rows picks this process's rows of the global batch's mask: two halves equal the whole."""
    ours, _ = pair("gru", input_size=3, hidden_size=4, num_layers=2, dropout=0.5)
    x = torch.randn(6, 4, 3, dtype=f64)  # (T, N=4, I)
    ours.generator = torch.Generator().manual_seed(9)
    whole, _ = ours(x)
    halves = []
    for lo, hi in ((0, 2), (2, 4)):
        ours.generator = torch.Generator().manual_seed(9)
        ours.global_rows = (lo, hi, 4)
        halves.append(ours(x[:, lo:hi])[0])
    assert err(torch.cat(halves, 1), whole) < TOL_REFERENCE


def test_dropout_one_zeroes_the_inner_outputs():
    ours, _ = pair("rnn_tanh", input_size=3, hidden_size=4, num_layers=2, dropout=1.0)
    x = torch.randn(4, 2, 3, dtype=f64)
    out, _ = ours(x)
    ours.backward(torch.randn_like(out))
    assert torch.equal(ours.weight_ih_l0.grad, torch.zeros_like(ours.weight_ih_l0))  # nothing reaches layer 0


# -- bad input ---------------------------------------------------------------------------------------------


def test_bad_input_feature_size_names_the_shapes():
    lstm = LSTM(3, 4)
    with pytest.raises(
        ValueError,
        match=re.escape("expected input of shape (T, N, I) or unbatched (T, I) with I = input_size = 3, got (5, 2, 7)"),
    ):
        lstm(torch.randn(5, 2, 7))
    with pytest.raises(ValueError, match=re.escape("got (2, 5, 2, 3)")):
        lstm(torch.randn(2, 5, 2, 3))
    with pytest.raises(ValueError, match="x has dtype torch.float64 but weight_ih_l0 has dtype torch.float32"):
        lstm(torch.randn(5, 2, 3, dtype=f64))
    with pytest.raises(ValueError, match="no time steps"):
        lstm(torch.randn(0, 2, 3))


def test_bad_hx_names_the_shapes():
    lstm = LSTM(3, 4, num_layers=2, proj_size=2, batch_first=True)
    x = torch.randn(5, 6, 3)  # N = 5
    with pytest.raises(
        ValueError,
        match=re.escape(
            "h_0 has shape (2, 6, 2), expected (2, 5, 2) = (num_layers * "
            "num_directions, batch, proj_size) for an input of batch 5"
        ),
    ):
        lstm(x, (torch.zeros(2, 6, 2), torch.zeros(2, 5, 4)))
    with pytest.raises(ValueError, match=re.escape("c_0 has shape (2, 5, 2), expected (2, 5, 4)")):
        lstm(x, (torch.zeros(2, 5, 2), torch.zeros(2, 5, 2)))
    with pytest.raises(TypeError, match=r"hx must be the pair \(h_0, c_0\)"):
        lstm(x, torch.zeros(2, 5, 2))
    gru = GRU(3, 4)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "h_0 has shape (1, 1, 4), expected (1, 4) = (num_layers * "
            "num_directions, hidden_size) for an input of unbatched input"
        ),
    ):
        gru(torch.randn(5, 3), torch.zeros(1, 1, 4))


def test_packed_sequence_is_refused_clearly():
    packed = nn.utils.rnn.pack_padded_sequence(torch.randn(4, 2, 3), [4, 2])
    with pytest.raises(TypeError, match="PackedSequence input is not supported; pad the batch"):
        LSTM(3, 4)(packed)


@pytest.mark.parametrize(
    "make",
    [
        lambda: LSTM(3, 4, 2, proj_size=2, bidirectional=True, dtype=f64),
        lambda: GRU(3, 4, 2, dtype=f64),
        lambda: RNN(3, 4, bias=False, dtype=f64),
    ],
    ids=["lstm", "gru", "rnn"],
)
def test_weight_gradients_add_into_grad_in_place_and_skip_frozen_parameters(make):
    """Each parameter gradient the backward returns is added by the base: into an existing .grad in place (its
    storage stays, two backwards give twice one), and not at all for a frozen parameter (.grad stays None)."""
    torch.manual_seed(0)
    layer = make()
    frozen = layer._param_names[1]  # weight_hh_l0
    getattr(layer, frozen).requires_grad_(False)
    x = torch.randn(5, 2, 3, dtype=f64)
    out, _ = layer(x)
    layer.backward(torch.ones_like(out))
    once = {n: p.grad.clone() for n, p in layer.named_parameters() if n != frozen}
    where = {n: p.grad.data_ptr() for n, p in layer.named_parameters() if n != frozen}
    out, _ = layer(x)
    layer.backward(torch.ones_like(out))
    assert getattr(layer, frozen).grad is None
    for n, p in layer.named_parameters():
        if n != frozen:
            assert p.grad.data_ptr() == where[n] and p.grad.is_contiguous(), n
            torch.testing.assert_close(p.grad, 2 * once[n], rtol=1e-14, atol=0)


def test_backward_before_forward_or_twice_and_bad_gradients():
    gru = GRU(3, 4)
    with pytest.raises(RuntimeError, match="backward called before forward"):
        gru.backward(torch.zeros(5, 2, 4))
    out, h = gru(torch.randn(5, 2, 3))
    with pytest.raises(
        ValueError, match=re.escape("doutput has shape (5, 2, 5) but the forward's output had shape (5, 2, 4)")
    ):
        gru.backward(torch.zeros(5, 2, 5))
    with pytest.raises(ValueError, match=re.escape("dh_n has shape (2, 4)")):
        gru.backward(torch.zeros_like(out), torch.zeros(2, 4))
    gru.backward(torch.zeros_like(out))
    with pytest.raises(RuntimeError, match="twice"):
        gru.backward(torch.zeros_like(out))
    lstm = LSTM(3, 4)
    lstm(torch.randn(5, 2, 3))
    with pytest.raises(TypeError, match=r"the pair \(dh_n, dc_n\)"):
        lstm.backward(None, torch.zeros(1, 2, 4))


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: LSTM(3, 4, proj_size=4), "proj_size must be smaller than hidden_size, got proj_size=4"),
        (lambda: LSTM(3, 4, dropout=1.5), "dropout .* must be a probability in \\[0, 1\\], got 1.5"),
        (lambda: LSTM(3, 4, dropout=True), "got True"),
        (lambda: RNN(3, 4, nonlinearity="sigmoid"), "nonlinearity must be 'tanh' or 'relu', got 'sigmoid'"),
        (lambda: GRU(0, 4), "input_size must be an int >= 1, got 0"),
        (lambda: GRU(3, 4, num_layers=2.0), "num_layers must be an int >= 1, got 2.0"),
        (lambda: GRU(3, 4, bidirectional=1), "bidirectional must be a bool, got 1"),
        (lambda: LSTM(3, 4, dtype=torch.int64), "dtype must be floating point"),
    ],
)
def test_bad_arguments_are_refused_naming_the_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_gru_and_rnn_take_no_proj_size_and_one_layer_dropout_warns():
    with pytest.raises(TypeError):
        GRU(3, 4, proj_size=2)
    with pytest.warns(UserWarning, match="does nothing with num_layers=1"):
        LSTM(3, 4, dropout=0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LSTM(3, 4, num_layers=2, dropout=0.3)


def test_repr_follows_torch():
    assert (
        repr(LSTM(3, 4, 2, proj_size=2, batch_first=True, dropout=0.1))
        == "LSTM(3, 4, proj_size=2, num_layers=2, batch_first=True, dropout=0.1)"
    )
    assert (
        repr(RNN(3, 4, nonlinearity="relu", bidirectional=True)) == "RNN(3, 4, nonlinearity='relu', bidirectional=True)"
    )


def test_seeded_lstm_is_an_nn_lstm_with_the_same_state():
    twin = seeded_dropouts(nn.Sequential(nn.LSTM(3, 4, 2, dropout=0.5), nn.Dropout(0.1)))
    assert type(twin[0]) is SeededLSTM and isinstance(twin[0], nn.LSTM)
    assert list(twin[0].state_dict()) == list(nn.LSTM(3, 4, 2).state_dict())


# -- float32 on the CPU: the products go through oneDNN (kernels/recurrent/matmul.py); the float64 tests use addmm ---


@pytest.mark.parametrize("kind", ["rnn_tanh", "lstm_proj", "gru"])
def test_float32_onednn_path_matches_torch_and_the_addmm_path(kind, monkeypatch):
    from kernels.recurrent import matmul

    cls, torch_cls, extra = KINDS[kind]
    torch.manual_seed(0)
    ours = cls(6, 8, num_layers=2, bidirectional=True, batch_first=True, **extra)
    twin = ours.to_torch()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 10, 6, generator=g)
    dout = torch.randn(3, 10, 2 * ours.h_out, generator=g)

    def run():
        ours.zero_grad()
        out, _ = ours(x)
        dx = ours.backward(dout)
        return [out, dx, *(p.grad for p in ours.parameters())]

    if not matmul.AVAILABLE:
        pytest.skip("this torch has no oneDNN matmul")
    monkeypatch.setattr(matmul, "ONEDNN", True)  # whichever this CPU runs by default (kernels/recurrent/matmul.py)
    first = run()
    monkeypatch.setattr(matmul, "ONEDNN", False)
    second = run()
    xa = x.clone().requires_grad_()
    out_t, _ = twin(xa)
    (out_t * dout).sum().backward()
    reference = [out_t.detach(), xa.grad, *(p.grad for p in twin.parameters())]
    for a, b, r in zip(first, second, reference, strict=True):
        assert err(a, r) < 1e-5 and err(b, r) < 1e-5  # float32 round-off, different summation orders


@pytest.mark.parametrize("sigmoid_form", [True, False])
def test_tanh_either_way_is_torch_tanh(sigmoid_form, monkeypatch):
    """kernels/recurrent/bptt.py's tanh: 2 sigmoid(2x) - 1 on an AMD CPU, torch.tanh elsewhere; both within rounding."""
    monkeypatch.setattr(bptt, "SIGMOID_TANH", sigmoid_form)
    for dtype, tol in ((torch.float32, 3e-7), (torch.float64, 1e-15)):
        x = torch.linspace(-20, 20, 4001, dtype=dtype)
        out = torch.empty_like(x)
        assert bptt._tanh(x, out) is out and (out - torch.tanh(x)).abs().max() <= tol


@pytest.mark.parametrize("onednn", [True, False], ids=["onednn", "addmm"])
def test_matmul_helpers_agree_with_torch(onednn, monkeypatch):
    from kernels.recurrent import matmul

    if onednn and not matmul.AVAILABLE:
        pytest.skip("this torch has no oneDNN matmul")
    monkeypatch.setattr(matmul, "ONEDNN", onednn)
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(5, 7, generator=g), torch.randn(4, 7, generator=g), torch.randn(4, generator=g)
    other = torch.randn(5, 8, generator=g)[:, ::2]  # strided
    assert err(matmul.linear(x, w, b), x @ w.t() + b) < 1e-6
    assert err(matmul.linear(x, matmul.prepack(w, x)), x @ w.t()) < 1e-6
    assert err(matmul.linear_add(x, w, other), other + x @ w.t()) < 1e-6
    d, xs = torch.randn(30, 4, generator=g), [torch.randn(30, 3, generator=g), torch.randn(30, 2, generator=g)]
    for xi in xs:  # dW = d^T x as the layer template computes it: a Product, or through oneDNN a callable
        g = matmul.weight_grad(d, xi)
        dw = g() if onednn else g.a @ g.b
        assert isinstance(g, Product) != onednn and dw.is_contiguous() and err(dw, d.t() @ xi) < 1e-6

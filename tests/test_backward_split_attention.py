"""The backward split in two for MultiheadAttention and the Transformer encoder: B (``backward_input``) computes the
input gradient and writes no ``.grad`` -- not even a sublayer's -- and W (``backward_weight``) adds every weight
gradient, the sublayers' in the fused backward's order; B then W equals the fused ``backward`` bit for bit in
float64 (every projection layout, bias_k/bias_v and the zero key, dropout, two accumulating steps); W without B and
B twice are refused; a frozen parameter gets nothing from W."""

import pytest
import torch

from layers import MultiheadAttention, TransformerEncoder, TransformerEncoderLayer
from layers.layernorm import LayerNorm
from tests.conftest import assert_grads_same, assert_same, seeded_pair

f64 = torch.float64
L, S, Nb, E = 5, 4, 2, 8


def _steps(layer, forward, douts, *, split, **bw):
    """Two forward/backward steps on one layer (.grad accumulating), the forward under one seed in both runs (the
    dropout masks); -> the last step's input gradient."""
    out = None
    for i, dout in enumerate(douts):
        torch.manual_seed(100 + i)
        forward(layer, i)
        if split:
            before = [None if p.grad is None else p.grad.clone() for p in layer.parameters()]
            out = layer.backward_input(dout, **bw)
            for (name, p), b in zip(layer.named_parameters(), before, strict=True):
                assert (p.grad is None and b is None) or torch.equal(p.grad, b), f"backward_input wrote {name}.grad"
            layer.backward_weight()
        else:
            out = layer.backward(dout, **bw)
    return out


def _mha_case(layout, dropout=0.0, **kw):
    """(make, forward(layer, step), backward's keywords) for one input layout: "qkv" (one tensor as all three),
    "kv" (one tensor as key and value), "separate" (three tensors), "kdim" (key and value of their own sizes)."""
    g = torch.Generator().manual_seed(1)
    rnd = lambda *s: torch.randn(*s, dtype=f64, generator=g)  # noqa: E731
    if layout == "kdim":
        kw |= {"kdim": 3, "vdim": 6}
    xs = [(rnd(L, Nb, E), rnd(S, Nb, kw.get("kdim", E)), rnd(S, Nb, kw.get("vdim", E))) for _ in range(2)]

    def forward(layer, i):
        q, k, v = xs[i]
        args = {"qkv": (q, q, q), "kv": (q, k, k)}.get(layout, (q, k, v))
        return layer(*args)

    return (lambda: MultiheadAttention(E, 2, dropout=dropout, dtype=f64, **kw)), forward


MHA = {
    "self-summed": ("qkv", {}, {"summed": True}),
    "self": ("qkv", {"dropout": 0.2}, {}),
    "key-is-value": ("kv", {}, {}),
    "separate-bias-kv-zero-attn": ("separate", {"add_bias_kv": True, "add_zero_attn": True}, {}),
    "kdim-vdim-no-bias": ("kdim", {"bias": False}, {}),
    "kdim-vdim-bias-kv-dropout": ("kdim", {"add_bias_kv": True, "dropout": 0.2}, {}),
}


@pytest.mark.parametrize("case", MHA)
def test_multihead_attentions_b_then_w_equals_its_backward_bit_for_bit(case):
    layout, kw, bw = MHA[case]
    make, forward = _mha_case(layout, **kw)
    fused, split = seeded_pair(make)
    douts = [torch.randn(L, Nb, E, dtype=f64) for _ in range(2)]
    assert_same(_steps(fused, forward, douts, split=False, **bw), _steps(split, forward, douts, split=True, **bw))
    assert_grads_same(fused, split)


def test_multihead_attention_with_the_weights_gradient():
    make, forward = _mha_case("separate")
    fused, split = seeded_pair(make)
    douts = [torch.randn(L, Nb, E, dtype=f64) for _ in range(2)]
    dweights = torch.randn(Nb, L, S, dtype=f64)
    assert_same(
        _steps(fused, forward, douts, split=False, dweights=dweights),
        _steps(split, forward, douts, split=True, dweights=dweights),
    )
    assert_grads_same(fused, split)


ENCODER = {
    "post-norm-layer": lambda: TransformerEncoderLayer(E, 2, 16, dropout=0.1, dtype=f64),
    "pre-norm-layer-gelu": lambda: TransformerEncoderLayer(
        E, 2, 16, dropout=0.1, activation="gelu", norm_first=True, dtype=f64
    ),
    "encoder-2-layers-norm": lambda: TransformerEncoder(
        TransformerEncoderLayer(E, 2, 16, dropout=0.1, dtype=f64), 2, norm=LayerNorm(E, dtype=f64)
    ),
    "encoder-batch-first-no-bias": lambda: TransformerEncoder(
        TransformerEncoderLayer(E, 2, 16, dropout=0.0, batch_first=True, bias=False, norm_first=True, dtype=f64), 2
    ),
}


@pytest.mark.parametrize("case", ENCODER)
def test_the_encoders_b_then_w_equals_its_backward_bit_for_bit(case):
    fused, split = seeded_pair(ENCODER[case])
    g = torch.Generator().manual_seed(3)
    shape = (Nb, L, E) if "batch-first" in case else (L, Nb, E)
    xs = [torch.randn(*shape, dtype=f64, generator=g) for _ in range(2)]
    mask = torch.nn.Transformer.generate_square_subsequent_mask(L, dtype=f64)
    douts = [torch.randn(*shape, dtype=f64, generator=g) for _ in range(2)]
    forward = lambda layer, i: layer(xs[i], mask)  # noqa: E731
    assert_same(_steps(fused, forward, douts, split=False), _steps(split, forward, douts, split=True))
    assert_grads_same(fused, split)


def _recorded(child, name: str, ran: list[str]):
    """child's own backward_weight, which first appends name to ran."""
    return lambda: (ran.append(name), type(child).backward_weight(child))


def test_the_encoder_layers_w_runs_its_sublayers_w_in_the_fused_backwards_order():
    for norm_first, order in (
        (False, ["norm2", "linear2", "linear1", "norm1", "self_attn"]),
        (True, ["linear2", "linear1", "norm2", "self_attn", "norm1"]),
    ):
        layer = TransformerEncoderLayer(E, 2, 16, dropout=0.0, norm_first=norm_first, dtype=f64)
        ran = []
        for name in order:
            child = getattr(layer, name)
            child.backward_weight = _recorded(child, name, ran)
        x = torch.randn(L, Nb, E, dtype=f64)
        layer(x)
        layer.backward_input(torch.randn(L, Nb, E, dtype=f64))
        assert ran == []
        layer.backward_weight()
        assert ran == order


def test_the_encoders_w_runs_its_norm_then_its_layers_from_the_top():
    enc = ENCODER["encoder-2-layers-norm"]()
    ran = []
    for name, child in (("norm", enc.norm), ("layers.0", enc.layers[0]), ("layers.1", enc.layers[1])):
        child.backward_weight = _recorded(child, name, ran)
    enc(torch.randn(L, Nb, E, dtype=f64))
    enc.backward_input(torch.randn(L, Nb, E, dtype=f64))
    enc.backward_weight()
    assert ran == ["norm", "layers.1", "layers.0"]


def test_multihead_attentions_w_adds_out_proj_first_then_the_input_projections():
    mha = MultiheadAttention(E, 2, dtype=f64)
    seen = []
    mha.out_proj.backward_weight = lambda: (
        seen.append(mha.in_proj_weight.grad is None),
        type(mha.out_proj).backward_weight(mha.out_proj),
    )
    x = torch.randn(L, Nb, E, dtype=f64)
    mha(x, x, x)
    mha.backward_input(torch.randn(L, Nb, E, dtype=f64), summed=True)
    mha.backward_weight()
    assert seen == [True] and mha.in_proj_weight.grad is not None and mha.out_proj.weight.grad is not None


@pytest.mark.parametrize(
    "make",
    [lambda: MultiheadAttention(E, 2, dtype=f64), lambda: TransformerEncoderLayer(E, 2, 16, dtype=f64)],
    ids=["mha", "encoder-layer"],
)
def test_w_without_b_and_b_twice_are_refused(make):
    layer = make()
    x, dout = torch.randn(L, Nb, E, dtype=f64), torch.randn(L, Nb, E, dtype=f64)
    forward = (lambda: layer(x, x, x)) if isinstance(layer, MultiheadAttention) else (lambda: layer(x))
    with pytest.raises(RuntimeError, match=r"backward_weight\(\) needs a backward_input\(\) before it"):
        layer.backward_weight()
    forward()
    layer.backward_input(dout)
    forward()
    with pytest.raises(RuntimeError, match=r"backward_input\(\) again before backward_weight\(\)"):
        layer.backward_input(dout)
    layer.backward_weight()  # the first B's W still runs: every parameter gets its gradient
    assert all(p.grad is not None for p in layer.parameters())
    with pytest.raises(RuntimeError, match="needs a backward_input"):
        layer.backward_weight()


def test_an_input_changed_in_place_between_b_and_w_is_refused_before_any_gradient_is_added():
    mha = MultiheadAttention(E, 2, dtype=f64)
    q, kv = torch.randn(L, Nb, E, dtype=f64), torch.randn(S, Nb, E, dtype=f64)
    mha(q, kv, kv)
    mha.backward_input(torch.randn(L, Nb, E, dtype=f64))
    kv.mul_(2)
    with pytest.raises(RuntimeError, match="input key"):
        mha.backward_weight()
    assert all(p.grad is None for p in mha.parameters())


def test_frozen_parameters_get_nothing_from_w_and_the_rest_equal_the_fused_backward():
    frozen = [
        "layers.0.self_attn.in_proj_weight",
        "layers.1.self_attn.out_proj.bias",
        "layers.0.norm1.bias",
        "layers.1.linear1.weight",
        "norm.weight",
    ]
    fused, split = seeded_pair(ENCODER["encoder-2-layers-norm"])
    for layer in (fused, split):
        layer.requires_grad_(False, frozen)
    xs = [torch.randn(L, Nb, E, dtype=f64) for _ in range(2)]
    douts = [torch.randn(L, Nb, E, dtype=f64) for _ in range(2)]
    forward = lambda layer, i: layer(xs[i])  # noqa: E731
    assert_same(_steps(fused, forward, douts, split=False), _steps(split, forward, douts, split=True))
    assert_grads_same(fused, split)
    named = dict(split.named_parameters())
    assert all(named[n].grad is None for n in frozen)

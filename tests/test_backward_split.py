"""The backward split in two: B (``backward_input``: the input gradient, nothing written into .grad) then W
(``backward_weight``: the weight gradients) equals the fused ``backward`` bit for bit in float64, for the layers
with weights (Linear, LayerNorm, Embedding, Conv2d, BatchNorm) and for the GPT's attention, MLP, block and whole
model; gradients accumulate across several B/W pairs in the order their W's run, as across several fused
backwards; W without B, and B twice, are refused."""

import pytest
import torch

from layers import BatchNorm1d, BatchNorm2d, Conv2d, Embedding, LayerNorm, Linear
from models.gpt import GPT, MLP, Block, CausalSelfAttention
from tests.conftest import seeded_pair

f64 = torch.float64


def _run(layer, x, dout, split, steps=2, **fw):
    """``steps`` forward/backward pairs on the same layer (so .grad accumulates); the last dx and every .grad."""
    dx = None
    for i in range(steps):
        torch.manual_seed(100 + i)  # dropout draws the same masks in both runs
        layer.forward(x[i], **fw) if fw else layer(x[i])
        if split:
            dx = layer.backward_input(dout[i])
            for p in layer.parameters():  # B writes no gradient: .grad is what the steps before left
                assert i > 0 or p.grad is None or not p.grad.any(), "backward_input wrote a gradient"
            layer.backward_weight()
        else:
            dx = layer.backward(dout[i])
    return dx, {n: p.grad for n, p in layer.named_parameters()}


def _assert_bitwise(fused, split):
    (dx_f, g_f), (dx_s, g_s) = fused, split
    assert (dx_f is None) == (dx_s is None)
    if dx_f is not None:
        assert torch.equal(dx_f, dx_s), f"dx differs by {(dx_f - dx_s).abs().max().item():.3g}"
    assert g_f.keys() == g_s.keys() and g_f
    for name in g_f:
        assert g_f[name] is not None and torch.equal(g_f[name], g_s[name]), f"{name}.grad differs"


CASES = {
    "linear-2d": (lambda: Linear(5, 4, dtype=f64), (3, 5), (3, 4)),
    "linear-3d-nobias": (lambda: Linear(5, 4, bias=False, dtype=f64), (2, 3, 5), (2, 3, 4)),
    "layernorm": (lambda: LayerNorm(6, dtype=f64), (2, 3, 6), (2, 3, 6)),
    "conv2d": (lambda: Conv2d(2, 3, 3, padding=1, dtype=f64), (2, 2, 5, 5), (2, 3, 5, 5)),
    "conv2d-strided-nobias": (
        lambda: Conv2d(2, 4, (3, 2), stride=2, bias=False, dtype=f64),
        (2, 2, 7, 6),
        (2, 4, 3, 3),
    ),
    "batchnorm1d": (lambda: BatchNorm1d(4, dtype=f64), (6, 4), (6, 4)),
    "batchnorm2d": (lambda: BatchNorm2d(3, dtype=f64), (4, 3, 4, 4), (4, 3, 4, 4)),
    "layernorm-2axes": (lambda: LayerNorm((3, 4), dtype=f64), (2, 3, 4), (2, 3, 4)),
    "attention": (lambda: CausalSelfAttention(8, 2, 0.1, True, dtype=f64), (2, 5, 8), (2, 5, 8)),
    "mlp": (lambda: MLP(8, 0.1, True, dtype=f64), (2, 5, 8), (2, 5, 8)),
    "block": (lambda: Block(8, 2, 0.1, True, dtype=f64), (2, 5, 8), (2, 5, 8)),
}


@pytest.mark.parametrize("case", CASES)
def test_b_then_w_equals_the_fused_backward_bit_for_bit(case):
    make, xs, ds = CASES[case]
    fused, split = seeded_pair(make)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, *xs, dtype=f64, generator=g)
    dout = torch.randn(2, *ds, dtype=f64, generator=g)
    _assert_bitwise(_run(fused, x, dout, False), _run(split, x, dout, True))


def test_embedding_with_padding_and_repeated_ids():
    fused, split = seeded_pair(lambda: Embedding(7, 3, padding_idx=2, dtype=f64))
    idx = torch.tensor([[[1, 2, 1, 6], [0, 1, 2, 2]]] * 2)  # repeated ids add up; the padding row gets none
    dout = torch.randn(2, 2, 4, 3, dtype=f64)
    _assert_bitwise(_run(fused, idx, dout, False), _run(split, idx, dout, True))
    assert not split.weight.grad[2].any()


def test_linear_without_input_gradient():
    fused, split = seeded_pair(lambda: Linear(5, 4, dtype=f64))
    x, dout = torch.randn(3, 5, dtype=f64), torch.randn(3, 4, dtype=f64)
    for layer in (fused, split):
        layer.forward(x)
    assert fused.backward(dout, need_input_grad=False) is None
    assert split.backward_input(dout, need_input_grad=False) is None
    split.backward_weight()
    assert torch.equal(fused.weight.grad, split.weight.grad) and torch.equal(fused.bias.grad, split.bias.grad)


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_the_gpt_b_then_w_equals_its_backward_with_the_tied_matrix(dropout):
    fused, split = seeded_pair(
        lambda: GPT(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8, dropout=dropout, dtype=f64)
    )
    g = torch.Generator().manual_seed(3)
    idx = torch.randint(0, 11, (2, 2, 6), generator=g)
    dlogits = torch.randn(2, 2, 6, 11, dtype=f64, generator=g)
    _assert_bitwise(_run(fused, idx, dlogits, False), _run(split, idx, dlogits, True))


def test_w_without_b_and_b_twice_are_refused():
    lin = Linear(3, 2, dtype=f64)
    with pytest.raises(RuntimeError, match=r"backward_weight\(\) needs a backward_input\(\)"):
        lin.backward_weight()
    x = torch.randn(4, 3, dtype=f64)
    lin(x)
    lin.backward_input(torch.randn(4, 2, dtype=f64))
    lin(x)
    with pytest.raises(RuntimeError, match=r"backward_input\(\) again before backward_weight\(\)"):
        lin.backward_input(torch.randn(4, 2, dtype=f64))
    lin.backward_weight()
    with pytest.raises(RuntimeError, match="needs a backward_input"):
        lin.backward_weight()


def test_an_input_changed_between_b_and_w_is_refused():
    lin = Linear(3, 2, dtype=f64)
    x = torch.randn(4, 3, dtype=f64)
    lin(x)
    lin.backward_input(torch.randn(4, 2, dtype=f64))
    x.mul_(2)
    with pytest.raises(RuntimeError, match="input x"):
        lin.backward_weight()


def test_a_frozen_parameter_gets_no_gradient_from_w():
    fused, split = seeded_pair(lambda: LayerNorm(4, dtype=f64))
    for layer in (fused, split):
        layer.requires_grad_(False, "bias")
    x, dout = torch.randn(3, 4, dtype=f64), torch.randn(3, 4, dtype=f64)
    fused(x), split(x)
    fused.backward(dout)
    split.backward_input(dout)
    split.backward_weight()
    assert split.bias.grad is None and fused.bias.grad is None
    assert torch.equal(split.weight.grad, fused.weight.grad)


def test_a_blocks_frozen_parameters_get_no_gradient_from_w_and_the_rest_equal_the_fused_backward():
    frozen = ["attn.c_attn.weight", "ln_2.bias", "mlp.c_proj.bias"]
    fused, split = seeded_pair(lambda: Block(8, 2, 0.0, True, dtype=f64))
    for layer in (fused, split):
        layer.requires_grad_(False, frozen)
    g = torch.Generator().manual_seed(2)
    x, dout = torch.randn(2, 2, 5, 8, dtype=f64, generator=g), torch.randn(2, 2, 5, 8, dtype=f64, generator=g)
    (dx_f, g_f), (dx_s, g_s) = _run(fused, x, dout, False), _run(split, x, dout, True)
    assert torch.equal(dx_f, dx_s)
    for name in g_f:
        if name in frozen:
            assert g_f[name] is None and g_s[name] is None, name
        else:
            assert torch.equal(g_f[name], g_s[name]), f"{name}.grad differs"


def test_a_composites_w_without_b_and_b_twice_are_refused():
    mlp = MLP(4, 0.0, True, dtype=f64)
    with pytest.raises(RuntimeError, match=r"MLP\(\): backward_weight\(\) needs a backward_input\(\)"):
        mlp.backward_weight()
    x = torch.randn(3, 4, dtype=f64)
    mlp(x)
    mlp.backward_input(torch.randn(3, 4, dtype=f64))
    mlp(x)
    with pytest.raises(RuntimeError, match=r"backward_input\(\) again before backward_weight\(\)"):
        mlp.backward_input(torch.randn(3, 4, dtype=f64))
    mlp.backward_weight()  # the first B's W still runs: every parameter gets its gradient
    assert all(p.grad is not None for p in mlp.parameters())

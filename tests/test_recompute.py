"""Tensors not held from forward to backward (the GPT's memory savings, models/recompute.py): a LayerNorm's or GELU's
output computed again in backward for the Linear after it, and attention that takes its output back.  Each gives the
same gradients, bit for bit, as the layers that keep everything, and refuses what would make them differ."""

from __future__ import annotations

import math

import pytest
import torch

from layers import GELU, LayerNorm, Linear, ScaledDotProductAttention
from models.gpt import GPT
from models.recompute import Recomputed

f64 = torch.float64


FIRSTS = {"layernorm": lambda: LayerNorm(8, dtype=f64), "gelu": lambda: GELU(), "tanh": lambda: GELU("tanh")}


def _pair(make_first):
    """(first and a Linear as two layers, a Recomputed pair of the same weights): gamma away from 1, beta from 0."""
    torch.manual_seed(0)
    first, lin, first2, lin2 = make_first(), Linear(8, 5, dtype=f64), make_first(), Linear(8, 5, dtype=f64)
    if isinstance(first, LayerNorm):
        with torch.no_grad():
            first.weight.normal_()
            first.bias.normal_()
    first2.load_state_dict(first.state_dict())
    lin2.load_state_dict(lin.state_dict())
    return (first, lin), Recomputed(first2, lin2)


@pytest.mark.parametrize("first", list(FIRSTS))
@pytest.mark.parametrize("split", [False, True])
def test_a_recomputed_pair_gives_the_two_layers_gradients_bit_for_bit(first, split):
    (a, lin), pair = _pair(FIRSTS[first])
    g = torch.Generator().manual_seed(1)
    for _ in range(2):  # the second round adds into .grad
        x, d = torch.randn(3, 4, 8, generator=g, dtype=f64), torch.randn(3, 4, 5, generator=g, dtype=f64)
        out = lin(a(x))
        assert torch.equal(pair(x), out)
        assert pair.kept.x is x and lin.kept.x is not None  # the pair holds x, not first(x)
        dx = a.backward(lin.backward(d))
        if split:
            dx_pair = pair.backward_input(d)
            assert pair.linear.weight.grad is None or not torch.equal(pair.linear.weight.grad, lin.weight.grad)
            pair.backward_weight()
        else:
            dx_pair = pair.backward(d)
        assert torch.equal(dx_pair, dx)
        for p, q in zip(
            [*a.parameters(), *lin.parameters()], [*pair.first.parameters(), *pair.linear.parameters()], strict=True
        ):
            assert torch.equal(p.grad, q.grad)


def test_a_recomputed_pair_refuses_a_changed_norm_weight_and_a_changed_input():
    _, pair = _pair(FIRSTS["layernorm"])
    x = torch.randn(4, 8, dtype=f64)
    pair(x)
    with torch.no_grad():
        pair.first.weight.mul_(2)  # the output made again would not be the forward's
    with pytest.raises(RuntimeError, match="its parameter first's weight was modified in place after the forward"):
        pair.backward(torch.ones(4, 5, dtype=f64))
    pair(x)
    x.add_(1.0)
    with pytest.raises(RuntimeError, match="its input x was modified in place after the forward"):
        pair.backward(torch.ones(4, 5, dtype=f64))


def test_gelu_backward_keeps_a_nan_input_nan():
    layer = GELU()
    x = torch.tensor([0.0, math.nan, 1.0], dtype=f64)
    layer(x)
    dx = layer.backward(torch.ones(3, dtype=f64))
    assert dx[0] == 0.5 and math.isnan(dx[1]) and math.isfinite(dx[2])


def test_attention_given_back_its_output_in_another_layout_gives_the_same_gradients():
    torch.manual_seed(3)
    B, H, T, E = 2, 3, 5, 4
    q, k, v, do = (torch.randn(B, H, T, E, dtype=f64) for _ in range(4))
    kept, lean = ScaledDotProductAttention(), ScaledDotProductAttention()
    out = kept(q, k, v, is_causal=True, scale=0.5)
    assert torch.equal(lean(q, k, v, is_causal=True, scale=0.5, keep_out=False), out)
    side_by_side = out.transpose(1, 2).contiguous()  # (B, T, H, E): the caller's own copy
    do_strided = do.transpose(1, 2).contiguous().transpose(1, 2)
    for a, b in zip(kept.backward(do), lean.backward(do_strided, out=side_by_side.transpose(1, 2)), strict=True):
        assert (a - b).abs().max() < 1e-15
    lean(q, k, v, is_causal=True, scale=0.5, keep_out=False)
    with pytest.raises(ValueError, match=r"did not keep its output \(keep_out=False\); pass it back"):
        lean.backward(do)
    with pytest.raises(ValueError, match=r"out= must be the forward's output, of shape \(2, 3, 5, 4\)"):
        lean.backward(do, out=out[:1])
    kept(q, k, v, is_causal=True, scale=0.5)
    with pytest.raises(ValueError, match="backward got out=, but the forward kept its own output"):
        kept.backward(do, out=out)


def test_the_gpt_holds_no_layernorm_gelu_or_second_attention_output_between_forward_and_backward():
    torch.manual_seed(4)
    gpt = GPT(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8, dtype=f64)
    gpt(torch.randint(0, 11, (2, 8)))
    for block in gpt.h:
        # c_attn, c_fc and c_proj ran inside their pairs: none holds its input; nor do the norms and GELU their output
        for layer in (block.ln_1, block.attn.c_attn, block.ln_2, block.mlp.c_fc, block.mlp.gelu, block.mlp.c_proj):
            assert layer.kept is None
        assert block.attn._norm_c_attn.kept.x is not None and block.mlp._gelu_c_proj.kept.x is not None
        assert block.attn.attention.kept.out is None  # the output is the heads side by side, c_proj's input


def test_the_gpt_with_its_activations_held_gives_the_same_gradients_bit_for_bit():
    """GPT.recompute = False holds the LayerNorms' and GELU's outputs (the Linears keep their inputs, as autograd
    does) instead of computing them again: the same logits and gradients, bit for bit, two steps in a row."""
    grads = {}
    for recompute in (True, False):
        torch.manual_seed(4)
        gpt = GPT(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8, dtype=f64)
        gpt.recompute = recompute
        assert gpt.recompute is recompute
        g = torch.Generator().manual_seed(5)
        for _ in range(2):
            idx = torch.randint(0, 11, (2, 8), generator=g)
            logits = gpt(idx)
            for block in gpt.h:  # what each Linear and GELU holds
                held = block.mlp.c_proj.kept is not None
                assert held is (not recompute) and (block.attn.c_attn.kept is not None) is held
                assert (block.mlp.gelu.kept is not None) is held
            gpt.backward(torch.randn(logits.shape, generator=g, dtype=f64))
        grads[recompute] = (logits, {n: p.grad.clone() for n, p in gpt.named_parameters()})
    assert torch.equal(grads[True][0], grads[False][0])
    for name, grad in grads[True][1].items():
        assert torch.equal(grad, grads[False][1][name]), name
    with pytest.raises(ValueError, match="GPT: recompute must be a bool"):
        gpt.recompute = 1

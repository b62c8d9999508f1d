"""Tensors not held from forward to backward (the GPT's memory savings): a Linear that does not keep its input,
a GELU and a LayerNorm that compute their output again, attention that takes its output back.  Each gives the
same gradients, bit for bit, as the layer that keeps everything, and refuses to be used wrongly."""
from __future__ import annotations

import math

import pytest
import torch

from layers import GELU, LayerNorm, Linear, ScaledDotProductAttention
from models.gpt import GPT

f64 = torch.float64


def test_linear_without_its_input_gives_the_same_gradients_bit_for_bit():
    torch.manual_seed(0)
    kept, given = Linear(6, 5, dtype=f64), Linear(6, 5, dtype=f64)
    given.load_state_dict(kept.state_dict())
    x, d = torch.randn(3, 4, 6, dtype=f64), torch.randn(3, 4, 5, dtype=f64)
    assert torch.equal(kept(x), given.forward(x, keep_input=False))
    assert given._saved.x is None  # not held
    dx_kept, dx_given = kept.backward(d), given.backward(d, input=x)
    assert torch.equal(dx_kept, dx_given)
    assert torch.equal(kept.weight.grad, given.weight.grad) and torch.equal(kept.bias.grad, given.bias.grad)


def test_linear_refuses_a_missing_an_unneeded_or_a_wrong_input():
    lin = Linear(6, 5, dtype=f64)
    x, d = torch.randn(4, 6, dtype=f64), torch.randn(4, 5, dtype=f64)
    lin.forward(x, keep_input=False)
    with pytest.raises(ValueError, match=r"did not keep its input \(keep_input=False\); pass it back"):
        lin.backward(d)
    with pytest.raises(ValueError, match=r"input= must be the forward's input, of shape \(4, 6\).*got \(3, 6\)"):
        lin.backward(d, input=x[:3])
    lin.forward(x)
    with pytest.raises(ValueError, match="backward got input=, but the forward kept its own input"):
        lin.backward(d, input=x)
    lin.backward(d)
    with pytest.raises(RuntimeError, match="backward called before forward"):
        lin.backward(d, input=x)


def test_gelu_recompute_is_the_forward_output_bit_for_bit_and_backward_is_unchanged():
    torch.manual_seed(1)
    x, d = torch.randn(5, 7, dtype=f64), torch.randn(5, 7, dtype=f64)
    x[0, 0] = 0.0  # Phi(0) = out / x = 0/0: backward must give 1/2 there
    plain, lean = GELU(), GELU()
    lean.recompute_output = True
    out = plain(x)
    assert torch.equal(lean(x), out)
    assert lean._saved.out is None and lean._out_meta[0] == out.shape  # out's shape, not out, is kept
    assert torch.equal(lean.recompute(), out)
    assert torch.equal(lean.backward(d), plain.backward(d))
    xr = x.clone().requires_grad_()
    torch.nn.functional.gelu(xr).backward(d)
    lean(x)  # backward without recompute(): computes the output itself
    assert torch.allclose(lean.backward(d), xr.grad, rtol=1e-13, atol=1e-15)
    assert abs(xr.grad[0, 0] - 0.5 * d[0, 0]) < 1e-15  # torch agrees: 1/2 at x = 0


def test_gelu_backward_keeps_a_nan_input_nan():
    layer = GELU()
    x = torch.tensor([0.0, math.nan, 1.0], dtype=f64)
    layer(x)
    dx = layer.backward(torch.ones(3, dtype=f64))
    assert dx[0] == 0.5 and math.isnan(dx[1]) and math.isfinite(dx[2])


def test_gelu_recompute_needs_a_forward_and_an_unchanged_input():
    layer = GELU()
    layer.recompute_output = True
    with pytest.raises(RuntimeError, match=r"recompute\(\) needs a forward first"):
        layer.recompute()
    x = torch.randn(3, dtype=f64)
    layer(x)
    x.mul_(2.0)
    with pytest.raises(RuntimeError, match=r"GELU\(.*\): its input x was modified in place after the forward, "
                                           r"before recompute\(\)"):
        layer.recompute()


@pytest.mark.parametrize("dtype", [f64, torch.bfloat16])
def test_layernorm_recompute_is_the_forward_output_bit_for_bit(dtype):
    torch.manual_seed(2)
    ln = LayerNorm(8, dtype=f64 if dtype == f64 else torch.float32)
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    x = torch.randn(3, 4, 8, dtype=dtype)
    out = ln(x)
    assert torch.equal(ln.recompute(), out)
    ln.backward(torch.ones_like(out))
    with pytest.raises(RuntimeError, match=r"recompute\(\) needs a forward first"):
        ln.recompute()
    ln(x)
    if dtype == f64:
        x.add_(1.0)
        with pytest.raises(RuntimeError, match=r"its input x was modified in place after the forward, before "
                                               r"recompute\(\)"):
            ln.recompute()


def test_attention_given_back_its_output_in_another_layout_gives_the_same_gradients():
    torch.manual_seed(3)
    B, H, T, E = 2, 3, 5, 4
    q, k, v, do = (torch.randn(B, H, T, E, dtype=f64) for _ in range(4))
    kept, lean = ScaledDotProductAttention(), ScaledDotProductAttention()
    out = kept(q, k, v, is_causal=True, scale=0.5)
    assert torch.equal(lean(q, k, v, is_causal=True, scale=0.5, keep_out=False), out)
    side_by_side = out.transpose(1, 2).contiguous()  # (B, T, H, E): the caller's own copy
    do_strided = do.transpose(1, 2).contiguous().transpose(1, 2)
    for a, b in zip(kept.backward(do), lean.backward(do_strided, out=side_by_side.transpose(1, 2))):
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
        assert block.attn.c_attn._saved is not None and block.attn.c_attn._saved.x is None
        assert block.mlp.c_fc._saved.x is None and block.mlp.c_proj._saved.x is None
        assert block.mlp.gelu._saved[1] is None
        assert block.attn.attention._saved.out is None  # the output is the heads side by side, c_proj's input


def test_gelu_output_recomputed_then_changed_in_place_is_refused():
    gelu = GELU()
    gelu.recompute_output = True
    x = torch.randn(3, 4, dtype=f64)
    gelu(x)
    gelu.recompute().mul_(2)  # the recomputed output is kept for backward, as the forward's would be
    with pytest.raises(RuntimeError, match="its output was modified in place"):
        gelu.backward(torch.ones(3, 4, dtype=f64))


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
                held = block.mlp.c_proj._saved.x is not None
                assert held is (not recompute) and (block.attn.c_attn._saved.x is not None) is held
                assert (block.mlp.gelu._saved.out is not None) is held
            gpt.backward(torch.randn(logits.shape, generator=g, dtype=f64))
        grads[recompute] = (logits, {n: p.grad.clone() for n, p in gpt.named_parameters()})
    assert torch.equal(grads[True][0], grads[False][0])
    for name, grad in grads[True][1].items():
        assert torch.equal(grad, grads[False][1][name]), name
    with pytest.raises(ValueError, match="GPT: recompute must be a bool"):
        gpt.recompute = 1

"""Scaled dot-product attention: the kernel's blocked (FlashAttention) path against torch's function and the layer's
textbook, central differences; every mask kind, dropout, block sizes; bad input named."""

import itertools

import pytest
import torch
import torch.nn.functional as F

import kernels
from gradcheck import check_layer
from layers import ScaledDotProductAttention, attention_dropout_mask
from layers.attention.dropout import splitmix64
from layers.template import recording_graph
from tests.conftest import assert_all_pass

F64 = torch.float64


def close(a, b, tol):
    """The issue's measure: max|a - b| relative to the larger magnitude, floored at 1e-3."""
    scale = max(a.abs().max().item() if a.numel() else 0.0, b.abs().max().item() if b.numel() else 0.0, 1e-3)
    err = (a - b).abs().max().item() / scale if a.numel() else 0.0
    assert err < tol, f"relative error {err:.2e} >= {tol:g}"


def qkv(lead, L, S, E=8, Ev=None, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    Ev = E if Ev is None else Ev
    return (
        torch.randn(*lead, L, E, generator=g, dtype=dtype),
        torch.randn(*lead, S, E, generator=g, dtype=dtype),
        torch.randn(*lead, S, Ev, generator=g, dtype=dtype),
    )


def masks(lead, L, S, seed=1):
    """Every kind of mask torch's function takes, as (name, attn_mask, is_causal)."""
    g = torch.Generator().manual_seed(seed)
    boolean = torch.rand(*lead, L, S, generator=g) > 0.3
    boolean[..., 0] = True  # every row keeps a key, except where a test masks one on purpose
    row_masked = boolean.clone()
    row_masked[..., 1, :] = False  # query 1 sees no key at all
    fl = torch.randn(L, S, generator=g, dtype=F64)
    fl_inf = fl.masked_fill(torch.rand(L, S, generator=g) > 0.7, float("-inf"))
    fl_inf[2, :] = float("-inf")  # and a fully masked row in a float mask
    padding = torch.ones(lead[0], *[1] * (len(lead) - 1), 1, S, dtype=torch.bool)
    padding[0, ..., S // 2 :] = False  # key padding: batch 0 has only S // 2 real keys
    return [
        ("none", None, False),
        ("causal", None, True),
        ("bool (*, L, S)", boolean, False),
        ("bool (L, S)", boolean.reshape(-1, L, S)[0], False),
        ("bool key padding (N, 1.., 1, S)", padding, False),
        ("bool with a fully masked row", row_masked, False),
        ("float (L, S)", fl, False),
        ("float with -inf and a fully masked row", fl_inf, False),
    ]


LEAD = (2, 3)
SHAPES = [(12, 12), (7, 12), (12, 7)]  # L == S, L < S, L > S (causal is top-left aligned)


@pytest.mark.parametrize("L,S", SHAPES)
@pytest.mark.parametrize("mask_i", range(8))
def test_blocked_path_equals_torch_function_float64(L, S, mask_i):
    name, mask, causal = masks(LEAD, L, S)[mask_i]
    q, k, v = qkv(LEAD, L, S, Ev=5)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*leaves, attn_mask=mask, is_causal=causal)
    dout = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, leaves, dout)
    for block in (1, 5, 256):
        att = ScaledDotProductAttention(block_size=block)
        out = att(q, k, v, attn_mask=mask, is_causal=causal)
        close(out, ref.detach(), 1e-12)
        for ours, theirs in zip(att.backward(dout), ref_grads, strict=True):
            close(ours, theirs, 1e-12)


def textbook(q, k, v, *, seed: int, dout, dweights=None, **kw):
    """The layer's textbook (the kernels off: the (L, S) matrices kept) -> (out [, weights], dq, dk, dv)."""
    with kernels.disabled():
        att = ScaledDotProductAttention(generator=torch.Generator().manual_seed(seed))
        res = att(q, k, v, **kw)
        grads = att.backward(dout, dweights) if dweights is not None else att.backward(dout)
    return (*(res if isinstance(res, tuple) else (res,)), *grads)


@pytest.mark.parametrize("mask_i", range(8))
@pytest.mark.parametrize("p", [0.0, 0.4])
def test_the_kernel_equals_the_textbook_and_the_textbook_autograd_through_its_forward(mask_i, p):
    """The kernel (kernels/attention.py, several key blocks) against the layer's textbook with the same dropout
    mask; the textbook's hand-written backward against autograd through its own forward (grad mode on, the
    template recording: the checker's oracle)."""
    L, S = 9, 11
    name, mask, causal = masks(LEAD, L, S)[mask_i]
    q, k, v = qkv(LEAD, L, S, Ev=6, seed=2)
    att = ScaledDotProductAttention(block_size=4, generator=torch.Generator().manual_seed(123))
    kw = dict(attn_mask=mask, dropout_p=p, is_causal=causal, need_weights=True)
    out, weights = att(q, k, v, **kw)
    dout, dweights = torch.randn_like(out), torch.randn_like(weights)
    fast = (out, weights, *att.backward(dout, dweights))
    slow = textbook(q, k, v, seed=123, dout=dout, dweights=dweights, **kw)
    for a, b in zip(fast, slow, strict=True):
        close(a, b, 1e-12)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    with kernels.disabled(), recording_graph():
        ref_out, ref_w = ScaledDotProductAttention(generator=torch.Generator().manual_seed(123))(*leaves, **kw)
    grads = torch.autograd.grad((ref_out, ref_w), leaves, (dout, dweights))
    for ours, theirs in zip(slow[2:], grads, strict=True):
        close(ours, theirs, 1e-12)


@pytest.mark.parametrize("L,S", SHAPES)
@pytest.mark.parametrize("mask_i", range(8))
@pytest.mark.parametrize("p,need_weights", [(0.0, False), (0.0, True), (0.4, False), (0.4, True)])
def test_one_block_path_equals_blocked_path_and_textbook(L, S, mask_i, p, need_weights):
    """S <= block_size runs the kernel's one-block path, S > block_size the online softmax: the same numbers
    (float64), every mask kind, dropout, the weights and their gradient; both against the layer's textbook."""
    name, mask, causal = masks(LEAD, L, S)[mask_i]
    q, k, v = qkv(LEAD, L, S, Ev=5, seed=5)
    results, empties = [], []
    for block in (S, 1000, 3):  # one block (exactly S, and larger), then several
        att = ScaledDotProductAttention(block_size=block, generator=torch.Generator().manual_seed(77))
        res = att(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal, need_weights=need_weights)
        out, weights = res if need_weights else (res, None)
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(6), dtype=F64)
        dweights = (
            None
            if weights is None
            else torch.randn(weights.shape, generator=torch.Generator().manual_seed(7), dtype=F64)
        )
        empties.append(att.masked_rows())  # (*, L, 1) True where every key was masked
        results.append((out, *(() if weights is None else (weights,)), *att.backward(dout, dweights)))
    assert all(torch.equal(e, empties[0]) for e in empties)
    assert empties[0].any().item() == name.startswith(("bool with", "float with"))
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            close(a, b, 1e-13)
    slow = textbook(
        q,
        k,
        v,
        seed=77,
        dout=dout,
        dweights=dweights,
        attn_mask=mask,
        dropout_p=p,
        is_causal=causal,
        need_weights=need_weights,
    )
    for a, b in zip(results[0], slow, strict=True):
        close(a, b, 1e-12)


def test_block_size_changes_nothing_but_rounding():
    q, k, v = qkv((2, 2), 33, 47, seed=4)
    mask = torch.rand(33, 47, generator=torch.Generator().manual_seed(0)) > 0.2
    results = []
    for block in (1, 2, 7, 16, 47, 1000):
        att = ScaledDotProductAttention(block_size=block, generator=torch.Generator().manual_seed(9))
        out = att(q, k, v, attn_mask=mask, dropout_p=0.25)
        results.append((out, *att.backward(torch.ones_like(out))))
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            close(a, b, 1e-13)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"is_causal": True},
        {"dropout_p": 0.3},
        {"need_weights": True},
        {"need_weights": True, "dropout_p": 0.5, "scale": 0.7},
        {"attn_mask": torch.tensor([[True, False, True, True, False]] * 3)},
        {"attn_mask": torch.randn(3, 5, dtype=F64)},
    ],
)
def test_gradcheck_central_differences_and_autograd(kw):
    torch.manual_seed(0)
    q, k, v = qkv((2,), 3, 5, E=4, Ev=3)
    assert_all_pass(check_layer(ScaledDotProductAttention(block_size=2), (q, k, v), forward_kwargs=kw))


def test_causal_with_more_queries_than_keys_gradcheck():
    q, k, v = qkv((1,), 6, 4, E=3, seed=5)
    assert_all_pass(check_layer(ScaledDotProductAttention(block_size=2), (q, k, v), forward_kwargs={"is_causal": True}))


def test_unbatched_and_many_leading_axes():
    for lead in [(), (2,), (2, 1, 3)]:
        q, k, v = qkv(lead, 5, 6, seed=6)
        att = ScaledDotProductAttention(block_size=4)
        out = att(q, k, v, is_causal=True)
        close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), 1e-12)
        dq, dk, dv = att.backward(torch.ones_like(out))
        assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


def test_a_fully_masked_row_gives_zeros_and_zero_gradients_as_torch():
    q, k, v = qkv((2,), 4, 5, seed=7)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[2] = False
    att = ScaledDotProductAttention()
    out = att(q, k, v, attn_mask=mask)
    assert not out[:, 2].any() and not out.isnan().any()
    dq, dk, dv = att.backward(torch.randn_like(out))
    assert not dq[:, 2].any() and not any(t.isnan().any() for t in (dq, dk, dv))


def test_bfloat16_is_computed_in_float32_and_rounded_once():
    q, k, v = qkv((2, 2), 16, 16, dtype=torch.float32, seed=8)
    att = ScaledDotProductAttention(block_size=5)
    out = att(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True)
    assert out.dtype == torch.bfloat16
    ref = F.scaled_dot_product_attention(
        q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), is_causal=True
    )
    assert (out.float() - ref).abs().max() < 1e-2  # one bfloat16 rounding of the float32 result: 2^-8 relative
    grads = att.backward(torch.ones_like(out))
    assert all(g.dtype == torch.bfloat16 for g in grads)


# -- dropout ------------------------------------------------------------------------------------------------


def _splitmix64(x: int) -> int:
    """The reference implementation of splitmix64's output function (Steele, Lea, Flood 2014), on Python ints."""
    x &= (1 << 64) - 1
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return x ^ (x >> 31)


def test_splitmix64_in_int64_torch_ops_equals_the_reference():
    values = [0, 1, 2, 12345, 2**62 + 17, 2**63 - 1, -1, -(2**63), -987654321]
    got = splitmix64(torch.tensor(values, dtype=torch.int64)).tolist()
    assert [g & ((1 << 64) - 1) for g in got] == [_splitmix64(v) for v in values]


def test_dropout_mask_blocks_equal_the_whole_and_drop_about_p():
    whole = attention_dropout_mask(42, 0.3, 4, 50, 60, dtype=F64)
    assert set(whole.unique().tolist()) == {0.0, 1 / 0.7}
    assert abs((whole == 0).float().mean().item() - 0.3) < 0.01  # 12,000 draws: 4 standard deviations
    for (r0, r1), (c0, c1) in itertools.product([(0, 50), (7, 31)], [(0, 60), (13, 14), (40, 60)]):
        block = attention_dropout_mask(42, 0.3, 4, 50, 60, row_range=(r0, r1), col_range=(c0, c1), dtype=F64)
        assert torch.equal(block, whole[:, r0:r1, c0:c1])
    assert not torch.equal(whole, attention_dropout_mask(43, 0.3, 4, 50, 60, dtype=F64))  # another seed, another mask
    assert not attention_dropout_mask(42, 1.0, 2, 3, 4).any()


def test_dropout_draws_one_seed_per_forward_from_the_generator():
    q, k, v = qkv((2,), 6, 6, seed=9)
    a = ScaledDotProductAttention(generator=torch.Generator().manual_seed(5))
    b = ScaledDotProductAttention(generator=torch.Generator().manual_seed(5))
    first = a(q, k, v, dropout_p=0.5)
    assert torch.equal(first, b(q, k, v, dropout_p=0.5))  # the same generator state: the same mask
    assert not torch.equal(first, a(q, k, v, dropout_p=0.5))  # the next forward draws a new seed
    torch.manual_seed(0)
    x = ScaledDotProductAttention()(q, k, v, dropout_p=0.5)
    torch.manual_seed(0)
    assert torch.equal(x, ScaledDotProductAttention()(q, k, v, dropout_p=0.5))  # default: torch's generator


# -- bad input ----------------------------------------------------------------------------------------------


def test_bad_input_is_named():
    att = ScaledDotProductAttention()
    q, k, v = qkv((2,), 4, 5)
    with pytest.raises(
        ValueError,
        match=r"expected query \(\*, L, E\), key \(\*, S, E\), value \(\*, S, Ev\) with "
        r"the same leading axes, got query \(2, 4, 8\), key \(2, 5, 7\)",
    ):
        att(q, k[..., :7], v)
    with pytest.raises(ValueError, match=r"got query \(2, 4, 8\), key \(3, 5, 8\)"):
        att(q, torch.randn(3, 5, 8, dtype=F64), torch.randn(3, 5, 8, dtype=F64))
    with pytest.raises(
        ValueError,
        match=r"attn_mask of shape \(4, 4\) does not broadcast to the scores' shape "
        r"\(2, 4, 5\)",
    ):
        att(q, k, v, attn_mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"attn_mask of shape \(3, 2, 4, 5\) does not broadcast"):
        att(q, k, v, attn_mask=torch.ones(3, 2, 4, 5, dtype=torch.bool))
    with pytest.raises(
        ValueError,
        match=r"attn_mask must be boolean \(True = may attend\) or of the query's dtype "
        r"torch.float64 \(added to the scores\), got torch.int64",
    ):
        att(q, k, v, attn_mask=torch.ones(4, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="pass either attn_mask or is_causal=True, not both"):
        att(q, k, v, attn_mask=torch.ones(4, 5, dtype=torch.bool), is_causal=True)
    with pytest.raises(
        ValueError,
        match=r"dropout_p \(the probability of dropping a weight\) must be a probability "
        r"in \[0, 1\], got 1.5",
    ):
        att(q, k, v, dropout_p=1.5)
    with pytest.raises(ValueError, match="must share dtype and device"):
        att(q, k.float(), v)
    with pytest.raises(
        ValueError,
        match=r"query must be a floating-point tensor of shape \(\*, length, size\), got "
        r"torch.float64 of shape \(8,\)",
    ):
        att(q[0, 0], k, v)
    with pytest.raises(ValueError, match="block_size must be an int >= 1, got 0"):
        ScaledDotProductAttention(block_size=0)
    out = att(q, k, v)
    with pytest.raises(ValueError, match=r"dout has shape \(2, 4, 7\) but the forward output had shape \(2, 4, 8\)"):
        att.backward(torch.ones(2, 4, 7, dtype=F64))
    att(q, k, v)
    with pytest.raises(ValueError, match=r"dweights given, but the forward returned no weights"):
        att.backward(torch.ones_like(out), torch.ones(2, 4, 5, dtype=F64))
    with pytest.raises(RuntimeError, match="backward called before forward"):
        ScaledDotProductAttention().backward(out)


def test_keep_out_is_keyword_only_and_the_cache_is_named():
    """forward(q, k, v, attn_mask, dropout_p, is_causal, scale, need_weights, *, keep_out): a positional keep_out is
    refused; the cache is read by field name."""
    q, k, v = qkv((2,), 4, 4)
    att = ScaledDotProductAttention()
    with pytest.raises(TypeError):
        att(q, k, v, None, 0.0, True, 0.5, False, False)
    out = att(q, k, v, is_causal=True, scale=0.5)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)
    assert (out - ref).abs().max() < 1e-12
    saved = att.kept
    assert saved.spec.causal and saved.spec.scale == 0.5 and saved.out is not None and saved.weights is None
    assert saved.q_shape == q.shape and saved.dtype == F64

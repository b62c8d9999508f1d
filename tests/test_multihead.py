"""MultiheadAttention against nn.MultiheadAttention under autograd, float64, T = 128: every mask kind, self-,
key-value- and cross-attention, batch_first both ways, weights averaged or per head; init, conversion, errors."""

import warnings

import pytest
import torch
from torch import nn

from gradcheck import check_layer
from layers import MultiheadAttention, from_torch
from tests.conftest import assert_all_pass, named_grads

F64 = torch.float64
E, H, N, T, S = 16, 4, 2, 128, 96


def close(a, b, tol=1e-10):
    """The issue's measure: max|a - b| relative to the larger magnitude, floored at 1e-3 (nan where both are)."""
    assert a.shape == b.shape, (a.shape, b.shape)
    both_nan = a.isnan() & b.isnan()
    assert torch.equal(a.isnan(), b.isnan()), "nan in different places"
    a, b = a.masked_fill(both_nan, 0), b.masked_fill(both_nan, 0)
    scale = max(a.abs().max().item(), b.abs().max().item(), 1e-3)
    err = (a - b).abs().max().item() / scale
    assert err < tol, f"relative error {err:.2e} >= {tol:g}"


def pair(seed=0, **kw):
    torch.manual_seed(seed)
    ours = MultiheadAttention(E, H, dtype=F64, **kw)
    torch.manual_seed(seed)
    theirs = nn.MultiheadAttention(E, H, dtype=F64, **kw)
    return ours, theirs


def mask_kinds(L, Sk):
    g = torch.Generator().manual_seed(3)
    kpm = torch.zeros(N, Sk, dtype=torch.bool)
    kpm[0, Sk // 2 :] = True  # batch 0: the second half of its keys is padding
    causal = nn.Transformer.generate_square_subsequent_mask(L, dtype=F64)[:, :Sk] if Sk == L else None
    bool2d = torch.rand(L, Sk, generator=g) > 0.8
    bool2d[:, 0] = False
    return {
        "none": {},
        "key padding (bool)": {"key_padding_mask": kpm},
        "key padding (float)": {"key_padding_mask": torch.zeros(N, Sk, dtype=F64).masked_fill(kpm, float("-inf"))},
        "attn_mask (L, S) bool": {"attn_mask": bool2d},
        "attn_mask (L, S) float": {"attn_mask": torch.randn(L, Sk, generator=g, dtype=F64)},
        "attn_mask (N*H, L, S) bool": {"attn_mask": torch.rand(N * H, L, Sk, generator=g) > 0.9},
        "attn_mask and key padding": {"attn_mask": torch.randn(L, Sk, generator=g, dtype=F64), "key_padding_mask": kpm},
        **({"causal (is_causal hint)": {"attn_mask": causal, "is_causal": True}} if causal is not None else {}),
    }


def inputs(kind, batch_first, kdim=E, vdim=E):
    g = torch.Generator().manual_seed(1)
    shape = lambda t, e: (N, t, e) if batch_first else (t, N, e)  # noqa: E731
    x = torch.randn(shape(T, E), generator=g, dtype=F64)
    if kind == "self":
        return x, x, x
    mem = torch.randn(shape(S, kdim), generator=g, dtype=F64)
    if kind == "key-value":
        return x, mem, mem
    return x, mem, torch.randn(shape(S, vdim), generator=g, dtype=F64)


def compare(ours, theirs, q, k, v, need_weights=True, average=True, **masks):
    """Forward, weights and every gradient (inputs summed as autograd sums a tensor used several times)."""
    distinct = list({id(t): t for t in (q, k, v)}.values())
    leaves = {id(t): t.clone().requires_grad_(True) for t in distinct}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation notice for a bool padding mask beside a float mask
        ref_out, ref_w = theirs(
            leaves[id(q)],
            leaves[id(k)],
            leaves[id(v)],
            need_weights=need_weights,
            average_attn_weights=average,
            **masks,
        )
    out, w = ours(q, k, v, need_weights=need_weights, average_attn_weights=average, **masks)
    close(out, ref_out.detach())
    assert (w is None) == (ref_w is None)
    dout = torch.randn_like(out)
    loss = (ref_out * dout).sum()
    dw = None
    if w is not None:
        close(w, ref_w.detach())
        dw = torch.randn_like(w).masked_fill(w.isnan(), 0)
        loss = loss + (ref_w.nan_to_num() * dw).sum()
    loss.backward()
    dq, dk, dv = ours.backward(dout, dw)
    hand = {}
    for t, g in ((q, dq), (k, dk), (v, dv)):
        hand[id(t)] = hand[id(t)] + g if id(t) in hand else g
    if not out.isnan().any():
        for i, t in leaves.items():
            close(hand[i], t.grad)
        ours_g = named_grads(ours)
        for name, p in theirs.named_parameters():
            close(ours_g[name], p.grad)


# every mask a kind of attention can take: the causal hint needs a square mask, so self-attention alone has it
KINDS_AND_MASKS = [
    (kind, mask) for kind in ("self", "key-value", "cross") for mask in mask_kinds(T, T if kind == "self" else S)
]


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("kind, mask", KINDS_AND_MASKS)
def test_equals_nn_multihead_attention_float64_T128(batch_first, kind, mask):
    q, k, v = inputs(kind, batch_first)
    masks = mask_kinds(T, k.shape[1] if batch_first else k.shape[0])
    ours, theirs = pair(batch_first=batch_first)
    for need_weights in (True, False):
        compare(ours, theirs, q, k, v, need_weights=need_weights, **masks[mask])
        ours.zero_grad()
        theirs.zero_grad()


@pytest.mark.parametrize(
    "kw",
    [
        {"add_bias_kv": True},
        {"add_zero_attn": True},
        {"add_bias_kv": True, "add_zero_attn": True},
        {"bias": False},
        {"kdim": 5, "vdim": 7},
    ],
)
def test_options_equal_torch(kw):
    ours, theirs = pair(**kw)
    kind = "cross" if "kdim" in kw else "self"
    q, k, v = inputs(kind, False, kw.get("kdim", E), kw.get("vdim", E))
    masks = mask_kinds(T, k.shape[0])
    compare(ours, theirs, q, k, v, **masks["attn_mask and key padding"])
    ours.zero_grad()
    theirs.zero_grad()
    compare(ours, theirs, q, k, v, average=False, **masks["key padding (bool)"])


def test_unbatched_input_and_per_head_weights():
    ours, theirs = pair()
    g = torch.Generator().manual_seed(2)
    x, mem = torch.randn(7, E, generator=g, dtype=F64), torch.randn(9, E, generator=g, dtype=F64)
    kpm = torch.tensor([False] * 6 + [True] * 3)
    compare(
        ours, theirs, x, mem, mem, average=False, key_padding_mask=kpm, attn_mask=torch.rand(H, 7, 9, generator=g) > 0.8
    )


def test_a_fully_masked_row_gives_what_torch_gives():
    """need_weights=False: zeros (torch's function); need_weights=True: nan (torch's module's softmax 0/0)."""
    ours, theirs = pair()
    q, k, v = inputs("self", False)
    kpm = torch.zeros(N, T, dtype=torch.bool)
    kpm[1] = True  # batch 1: every key is padding
    for need_weights in (False, True):
        out, w = ours(q, k, v, key_padding_mask=kpm, need_weights=need_weights)
        ref, ref_w = theirs(q, k, v, key_padding_mask=kpm, need_weights=need_weights)
        close(out, ref.detach())
        assert out[:, 1].isnan().all() if need_weights else not out.isnan().any()
        if need_weights:
            close(w, ref_w.detach())
        ours.backward(torch.ones_like(out))


def test_same_weights_under_one_seed_and_conversion():
    for kw in ({}, {"add_bias_kv": True}, {"kdim": 3, "vdim": 5}, {"bias": False}):
        ours, theirs = pair(seed=7, **kw)
        sd_o, sd_t = ours.state_dict(), theirs.state_dict()
        assert list(sd_o) == list(sd_t)
        assert all(torch.equal(sd_o[key], sd_t[key]) for key in sd_t)
        assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
        mine = from_torch(theirs)
        assert isinstance(mine, MultiheadAttention) and mine.kdim == theirs.kdim
        back = mine.to_torch()
        assert isinstance(back, nn.MultiheadAttention)
        assert all(torch.equal(back.state_dict()[key], sd_t[key]) for key in sd_t)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"need_weights": False},
        {"average_attn_weights": False},
        {"attn_mask": torch.tensor([[False, True, False, False]] * 3)},
        {"key_padding_mask": torch.tensor([[False, False, True, False]] * 2)},
    ],
)
def test_gradcheck_central_differences_and_autograd(kw):
    torch.manual_seed(0)
    layer = MultiheadAttention(6, 2, add_bias_kv=True, dtype=F64)
    x, mem = torch.randn(3, 2, 6, dtype=F64), torch.randn(4, 2, 6, dtype=F64)
    assert_all_pass(check_layer(layer, (x, mem, mem.clone()), forward_kwargs=kw))


def test_gradcheck_with_dropout_in_training_mode():
    torch.manual_seed(0)
    layer = MultiheadAttention(4, 2, dropout=0.3, dtype=F64)
    x = torch.randn(3, 2, 4, dtype=F64)
    assert_all_pass(check_layer(layer, (x, x.clone(), x.clone())))


def test_summed_gradient_equals_the_sum_of_three():
    ours, _ = pair()
    x = inputs("self", False)[0]
    out, _ = ours(x, x, x, need_weights=False)
    dout = torch.randn_like(out)
    three = ours.backward(dout)
    ours(x, x, x, need_weights=False)
    close(ours.backward(dout, summed=True), three[0] + three[1] + three[2], 1e-13)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="embed_dim 10 is not divisible by num_heads 3"):
        MultiheadAttention(10, 3)
    mha = MultiheadAttention(8, 2)
    x = torch.randn(5, 2, 8)
    with pytest.raises(
        ValueError,
        match=r"expected query \(L, N, E\) with E=8.*got query \(5, 2, 8\), key "
        r"\(5, 3, 8\)",
    ):
        mha(x, torch.randn(5, 3, 8), torch.randn(5, 3, 8))
    with pytest.raises(ValueError, match=r"got query \(5, 2, 7\)"):
        mha(torch.randn(5, 2, 7), x, x)
    with pytest.raises(
        ValueError,
        match=r"key_padding_mask must have shape \(N, S\) = \(2, 5\) \(batch, source "
        r"length\), got \(5, 2\)",
    ):
        mha(x, x, x, key_padding_mask=torch.zeros(5, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"attn_mask must have shape \(5, 5\) or \(4, 5, 5\), got \(2, 5, 5\)"):
        mha(x, x, x, attn_mask=torch.zeros(2, 5, 5, dtype=torch.bool))
    with pytest.raises(
        ValueError,
        match=r"attn_mask must be boolean \(True = may NOT attend\) or of the query's "
        r"dtype torch.float32 \(added to the scores\), got torch.int64",
    ):
        mha(x, x, x, attn_mask=torch.zeros(5, 5, dtype=torch.long))
    with pytest.raises(RuntimeError, match="is_causal=True is a hint that attn_mask is the causal mask: pass the mask"):
        mha(x, x, x, is_causal=True)
    with pytest.raises(ValueError, match="all 3-D \\(batched\\) or all 2-D \\(unbatched\\)"):
        mha(x, x[0], x)
    with pytest.raises(
        ValueError,
        match=r"dropout \(the probability of dropping an attention weight\) must be a "
        r"probability in",
    ):
        MultiheadAttention(8, 2, dropout=2.0)
    out, _ = mha(x, x, x)
    with pytest.raises(ValueError, match=r"dout has shape \(5, 2, 7\) but the forward output had shape \(5, 2, 8\)"):
        mha.backward(torch.ones(5, 2, 7))
    with pytest.raises(RuntimeError, match="backward called before forward"):
        MultiheadAttention(8, 2).backward(out)


def test_self_attention_adds_its_packed_weight_gradient_into_the_same_grad_tensor():
    """With .grad present, the packed (3E, E) projection's gradient is added in place (its storage stays), and the
    second backward doubles the first, as accumulation must."""
    torch.manual_seed(5)
    mha = MultiheadAttention(8, 2, dtype=F64)
    x, dout = torch.randn(5, 2, 8, dtype=F64), torch.randn(5, 2, 8, dtype=F64)
    mha(x, x, x, need_weights=False)
    mha.backward(dout, summed=True)
    first, storage = mha.in_proj_weight.grad.clone(), mha.in_proj_weight.grad.data_ptr()
    mha(x, x, x, need_weights=False)
    mha.backward(dout, summed=True)
    assert mha.in_proj_weight.grad.data_ptr() == storage
    assert (mha.in_proj_weight.grad - 2 * first).abs().max() < 1e-12


@pytest.mark.parametrize(
    "kw,inputs",
    [({}, "self"), ({}, "separate"), ({"kdim": 3, "vdim": 5}, "separate")],
    ids=["packed-self", "packed-separate", "separate-weights"],
)
def test_backward_input_without_the_input_gradient_makes_no_input_products(kw, inputs):
    """B with need_input_grad=False returns None and skips the three d @ W products for the inputs; W then gives the
    weight gradients of a full backward, bit for bit."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountMM(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
                CountMM.n += 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(3)
    layers = [MultiheadAttention(8, 2, dtype=F64, **kw) for _ in range(2)]
    layers[1].load_state_dict(layers[0].state_dict())
    g = torch.Generator().manual_seed(4)
    q = torch.randn(5, 3, 8, generator=g, dtype=F64)
    k = q if inputs == "self" else torch.randn(6, 3, kw.get("kdim", 8), generator=g, dtype=F64)
    v = q if inputs == "self" else torch.randn(6, 3, kw.get("vdim", 8), generator=g, dtype=F64)
    dout = torch.randn(5, 3, 8, generator=g, dtype=F64)
    counts = []
    for layer, need in zip(layers, (True, False), strict=True):
        layer(q, k, v)
        CountMM.n = 0
        with CountMM():
            dx = layer.backward_input(dout, need_input_grad=need)
        counts.append(CountMM.n)
        layer.backward_weight()
        assert (dx is None) != need
    assert counts[1] == counts[0] - 3, counts  # d @ W for query, key and value: not made
    full, split = named_grads(layers[0]), named_grads(layers[1])
    assert full.keys() == split.keys()
    for name in full:
        assert torch.equal(full[name], split[name]), name

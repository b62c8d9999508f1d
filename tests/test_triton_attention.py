"""FlashAttention-2 in Triton (kernels/triton/attention.py): forward and backward against the textbook attention
of the attention layer (the (L, S) matrices held, the kernels off) in float64 and float32, against
F.scaled_dot_product_attention with autograd in every dtype, causal and not, L != S, E != Ev, ragged blocks, the GPT's
transposed layout and inputs inside sentinels, and bad input.  Run with `pytest -m triton` (tests/triton_support.py)."""

import math

import pytest
import torch
import torch.nn.functional as F

import kernels
from layers import ScaledDotProductAttention
from tests.triton_support import assert_close, assert_padding_kept, device, load, padded

pytestmark = pytest.mark.triton
f64, f32 = torch.float64, torch.float32
SHAPES = [(33, 33, 24, 24), (20, 45, 16, 40), (45, 20, 8, 8)]  # (L, S, E, Ev): ragged blocks of 16, L != S, E != Ev


@pytest.fixture(scope="module")
def A():
    return load("attention")


def inputs(L, S, E, EV, dtype, heads=(1, 2), seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(*heads, n, E, generator=g, dtype=f64) for n in (L, S))
    v = torch.randn(*heads, S, EV, generator=g, dtype=f64)
    dout = torch.randn(*heads, L, EV, generator=g, dtype=f64)
    return [t.to(dtype).to(device()) for t in (q, k, v, dout)]


def textbook(q, k, v, dout, causal, scale=None):
    """The attention layer's textbook (layers/attention/scaled_dot_product.py, the kernels off: the (L, S) matrices
    held), forward and backward, and each row's log-sum-exp: (out, lse, dq, dk, dv)."""
    L, S = q.shape[-2], k.shape[-2]
    with kernels.disabled():
        sdpa = ScaledDotProductAttention()
        out = sdpa(q, k, v, is_causal=causal, scale=scale)
        dq, dk, dv = sdpa.backward(dout)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    blocked = torch.ones(L, S, dtype=torch.bool, device=q.device).triu(1) if causal else None
    scores = q @ k.transpose(-2, -1) * scale
    lse = torch.logsumexp(scores if blocked is None else scores.masked_fill(blocked, -math.inf), -1)
    return out, lse, dq, dk, dv


NAMES = ("out", "lse", "dq", "dk", "dv")


def run(A, q, k, v, dout, causal, **kw):
    out, lse = A.flash_attention_forward(q, k, v, causal=causal, **kw)
    return (out, lse, *A.flash_attention_backward(dout, q, k, v, out, lse, causal=causal, **kw))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "L{}-S{}-E{}-Ev{}".format(*s))
def test_float64_equals_the_textbook(A, guard, shape, causal):
    """The interpreter computes in float64 here: kernel and textbook differ by rounding only (~1e-15)."""
    q, k, v, dout = inputs(*shape, f64)
    got = run(A, q, k, v, dout, causal, block_m=16, block_n=16)
    for name, a, b in zip(NAMES, got, textbook(q, k, v, dout, causal), strict=True):
        assert_close(name, a, b, 1e-12)
    guard.expect(launches=4)  # forward; delta, dK/dV, dQ
    assert guard.dots and all(min(a + b) >= 16 for a, b, _ in guard.dots)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_float32_equals_the_textbook_in_float64(A, guard, causal):
    """float32 inputs, float32 accumulation, IEEE products (the guard fails a TF32 one): rounding only."""
    q, k, v, dout = inputs(*SHAPES[0], f32, seed=1)
    got = run(A, q, k, v, dout, causal, block_m=16, block_n=32)
    for name, a, b in zip(NAMES, got, textbook(*(t.double() for t in (q, k, v, dout)), causal), strict=True):
        assert_close(name, a, b, 2e-6)
    assert all(dtype == "fp32" for _, _, dtype in guard.dots)


@pytest.mark.parametrize("dtype,tol", [(f64, 1e-12), (f32, 2e-6), (torch.float16, 4e-3), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_equals_torch_sdpa_autograd(A, guard, dtype, tol, causal):
    """F.scaled_dot_product_attention and its autograd backward, a scale of torch's choosing, in each dtype
    (float16/bfloat16 against torch's float32 result from the same rounded inputs: P and dS are rounded to the
    input's dtype before their products, as FlashAttention rounds them)."""
    q, k, v, dout = inputs(29, 29, 16, 16, dtype, heads=(2, 1), seed=2)
    low = dtype in (torch.float16, torch.bfloat16)
    qr, kr, vr = (t.float().requires_grad_() if low else t.clone().requires_grad_() for t in (q, k, v))
    want = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal, scale=0.3)
    want.backward(dout.float() if low else dout)
    got = run(A, q, k, v, dout, causal, scale=0.3, block_m=16, block_n=16)
    for name, a, b in zip(
        ("out", "dq", "dk", "dv"), (got[0], *got[2:]), (want, qr.grad, kr.grad, vr.grad), strict=True
    ):
        assert a.dtype == dtype, f"{name} is {a.dtype}, expected {dtype}"
        assert_close(name, a, b, tol)


def test_block_sizes_change_nothing_but_rounding(A, guard):
    q, k, v, dout = inputs(40, 40, 16, 16, f64, seed=3)
    want = textbook(q, k, v, dout, True)
    for bm, bn in ((16, 32), (32, 16), (64, 64)):
        for name, a, b in zip(NAMES, run(A, q, k, v, dout, True, block_m=bm, block_n=bn), want, strict=True):
            assert_close(f"{name} (blocks {bm} x {bn})", a, b, 1e-12)


def test_strides_are_read_not_assumed(A, guard):
    """q, k, v in the GPT's layout, (B, L, H, E) transposed to (B, H, L, E), and inside buffers of NaN sentinels:
    the same bits as contiguous inputs, no sentinel read (a NaN would spread through a row) or written."""
    q, k, v, dout = inputs(21, 21, 16, 16, f32, heads=(2, 2), seed=4)  # B = H = 2: every stride is read
    want = run(A, q, k, v, dout, True, block_m=16, block_n=16)
    gpt = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, dout)]
    assert not gpt[0].is_contiguous()
    for name, a, b in zip(NAMES, run(A, *gpt, True, block_m=16, block_n=16), want, strict=True):
        assert torch.equal(a, b), f"{name} from transposed inputs differs from contiguous inputs'"
    views = [padded(t) for t in (q, k, v, dout)]
    qp, kp, vp, dp = (w[0] for w in views)
    out, lse = A.flash_attention_forward(qp, kp, vp, causal=True, block_m=16, block_n=16)
    views.append(padded(out))  # the backward reads out too
    got = (out, lse, *A.flash_attention_backward(dp, qp, kp, vp, views[4][0], lse, causal=True, block_m=16, block_n=16))
    for name, a, b in zip(NAMES, got, want, strict=True):
        assert torch.equal(a, b), f"{name} from padded inputs differs from contiguous inputs'"
    for name, (_, buffer, padding) in zip(("q", "k", "v", "dout", "out"), views, strict=True):
        assert_padding_kept(f"{name}'s buffer", buffer, padding)


def test_leading_axes_and_sizes_of_one(A, guard):
    """(L, E) and (N, L, E) inputs, (B, H1, H2, L, E) merged, and one query, one key, one head."""
    cases = [
        ((), 17, 17, False),
        ((3,), 17, 9, True),
        ((2, 1, 2), 9, 17, True),
        ((1, 1), 1, 1, False),
        ((1, 1), 1, 1, True),
        ((1,), 1, 5, True),
    ]
    for heads, L, S, causal in cases:
        q, k, v, dout = inputs(L, S, 16, 16, f64, heads=heads, seed=5)
        got = run(A, q, k, v, dout, causal, block_m=16, block_n=16)
        for name, a, b in zip(NAMES, got, textbook(q, k, v, dout, causal), strict=True):
            # floor 1: with one key the softmax is 1 and dq is exactly 0, met by the rounding of unit-sized inputs
            assert_close(f"{name} {tuple(q.shape)} causal={causal}", a, b, 1e-12, floor=1.0)


def test_head_width_128(A, guard):
    q, k, v, dout = inputs(17, 17, 128, 128, f32, heads=(1, 1), seed=6)
    got = run(A, q, k, v, dout, True, block_m=16, block_n=16)
    for name, a, b in zip(NAMES, got, textbook(*(t.double() for t in (q, k, v, dout)), True), strict=True):
        assert_close(name, a, b, 2e-6)


def test_bad_input_is_refused(A):
    q, k, v, dout = inputs(8, 8, 16, 16, f32)
    with pytest.raises(ValueError, match="head widths"):
        A.flash_attention_forward(*inputs(8, 8, 129, 16, f32)[:3])
    with pytest.raises(ValueError, match="block_m must be a power of two >= 16"):
        A.flash_attention_forward(q, k, v, block_m=8)
    with pytest.raises(ValueError, match="share a dtype"):
        A.flash_attention_forward(q, k.double(), v)
    with pytest.raises(ValueError, match="same leading axes"):
        A.flash_attention_forward(q, k[:, :1], v)
    with pytest.raises(ValueError, match="no keys"):
        A.flash_attention_forward(q, k[..., :0, :], v[..., :0, :])
    out, lse = A.flash_attention_forward(q, k, v)
    with pytest.raises(ValueError, match="lse must be"):
        A.flash_attention_backward(dout, q, k, v, out, lse.double())
    with pytest.raises(ValueError, match="dout must be"):
        A.flash_attention_backward(dout[..., :3, :], q, k, v, out, lse)

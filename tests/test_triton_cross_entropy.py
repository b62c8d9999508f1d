"""Softmax with cross-entropy in Triton (kernels/triton/cross_entropy.py): the loss and (p - q) * s against the
textbook in float64 and float32, against F.cross_entropy with autograd (reductions, label smoothing,
ignore_index), the fused forward-backward against the two passes, wide rows in many blocks, strided and padded
inputs, and bad targets.  Run with `pytest -m triton` (tests/triton_support.py)."""

import pytest
import torch
import torch.nn.functional as F

import kernels
from losses import CrossEntropyLoss
from tests.triton_support import assert_close, assert_padding_kept, device, load, padded

pytestmark = pytest.mark.triton
f64, f32 = torch.float64, torch.float32


@pytest.fixture(scope="module")
def CE():
    return load("cross_entropy")


def inputs(n, c, dtype, seed=0, ignored=()):
    g = torch.Generator().manual_seed(seed)
    z = (torch.randn(n, c, generator=g, dtype=f64) * 3).to(dtype).to(device())
    y = torch.randint(0, c, (n,), generator=g)
    y[list(ignored)] = -100
    return z, y.to(device())


def textbook(z, y, eps=0.0, ignore_index=-100, reduction="mean", dloss=1.0):
    """The loss and its gradient as the module docstring writes them, in z's dtype, with the (N, C) softmax."""
    n, c = z.shape
    keep = y != ignore_index
    onehot = torch.zeros_like(z)
    onehot[keep.nonzero()[:, 0], y[keep]] = 1
    q = (1 - eps) * onehot + eps / c
    logp = z - torch.logsumexp(z, 1, keepdim=True)
    losses = -(q * logp).sum(1) * keep
    s = torch.as_tensor(dloss, dtype=z.dtype, device=z.device)
    if reduction == "mean":
        s = s / keep.sum()
    grad = (logp.exp() - q) * (s.reshape(-1, 1) if reduction == "none" else s) * keep[:, None]
    loss = losses if reduction == "none" else losses.sum() / (keep.sum() if reduction == "mean" else 1)
    return loss, grad


@pytest.mark.parametrize("dtype,tol", [(f64, 1e-13), (f32, 2e-6)])
def test_equals_the_textbook(CE, guard, dtype, tol):
    """Without smoothing or ignored rows: CrossEntropyLoss's textbook (the kernels off), (softmax - onehot) / N."""
    z, y = inputs(9, 37, dtype)
    loss, lse = CE.cross_entropy_forward(z, y, block_c=16)  # 37 classes: three blocks, the last ragged
    dz = CE.cross_entropy_backward(1.0, z, y, lse, block_c=16)
    with kernels.disabled():
        crit = CrossEntropyLoss()
        ref_loss = crit(z.double(), y)
        ref_dz = crit.backward()
    assert_close("loss", loss, ref_loss, tol)
    assert_close("lse", lse, torch.logsumexp(z.double(), 1), tol)
    assert_close("dlogits", dz, ref_dz, tol)
    guard.expect(launches=2)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_smoothing_ignore_index_and_reductions_equal_the_formula(CE, guard, reduction, eps):
    z, y = inputs(8, 21, f64, seed=1, ignored=(2, 5))
    dloss = torch.randn(8, dtype=f64, device=device()) if reduction == "none" else 1.7
    loss, lse = CE.cross_entropy_forward(z, y, label_smoothing=eps, reduction=reduction, block_c=16)
    dz = CE.cross_entropy_backward(dloss, z, y, lse, label_smoothing=eps, reduction=reduction, block_c=16)
    want_loss, want_dz = textbook(z, y, eps, reduction=reduction, dloss=dloss)
    assert_close("loss", loss, want_loss, 1e-13)
    assert_close("dlogits", dz, want_dz, 1e-13)
    assert torch.equal(dz[[2, 5]], torch.zeros_like(dz[[2, 5]])), "an ignored row has a gradient"


@pytest.mark.parametrize("dtype,tol", [(f64, 1e-13), (f32, 2e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("reduction,eps,ignore_index", [("mean", 0.0, -100), ("sum", 0.2, 3), ("none", 0.0, -1)])
def test_equals_torch_autograd(CE, guard, dtype, tol, reduction, eps, ignore_index):
    """F.cross_entropy (float32 for bfloat16 logits, as autocast runs it) and its autograd backward."""
    z, y = inputs(7, 19, dtype, seed=2)
    y[[1, 4]] = ignore_index
    zr = z.clone().requires_grad_()
    want = F.cross_entropy(
        zr.float() if dtype == torch.bfloat16 else zr,
        y,
        reduction=reduction,
        label_smoothing=eps,
        ignore_index=ignore_index,
    )
    dloss = torch.randn(want.shape, dtype=want.dtype, device=device())
    want.backward(dloss)
    loss, lse = CE.cross_entropy_forward(z, y, ignore_index=ignore_index, label_smoothing=eps, reduction=reduction)
    dz = CE.cross_entropy_backward(
        dloss, z, y, lse, ignore_index=ignore_index, label_smoothing=eps, reduction=reduction
    )
    assert loss.dtype == (f64 if dtype == f64 else f32) and dz.dtype == dtype
    assert_close("loss", loss, want, tol)
    assert_close("dlogits", dz, zr.grad, tol)


@pytest.mark.parametrize("reduction,eps", [("mean", 0.0), ("sum", 0.1), ("none", 0.0)])
def test_fused_forward_backward_equals_the_two_passes(CE, guard, reduction, eps):
    """llm.c's fused classifier: one kernel, the same loss, lse and gradient bit for bit (float32)."""
    z, y = inputs(6, 70, f32, seed=3, ignored=(0,))
    dloss = torch.randn(6, device=device()) if reduction == "none" else 0.5
    loss, lse = CE.cross_entropy_forward(z, y, reduction=reduction, label_smoothing=eps, block_c=32)
    dz = CE.cross_entropy_backward(dloss, z, y, lse, reduction=reduction, label_smoothing=eps, block_c=32)
    fused = CE.cross_entropy_forward_backward(z, y, dloss=dloss, reduction=reduction, label_smoothing=eps, block_c=32)
    for name, a, b in zip(("loss", "lse", "dlogits"), fused, (loss, lse, dz), strict=True):
        assert torch.equal(a, b), f"fused {name} differs from the two passes'"
    guard.expect(launches=3)


@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")  # s = 1/0, then masked
def test_large_logits_and_every_row_ignored(CE, guard):
    """Logits of 1e4 stay finite (the online maximum); every target ignored: nan loss, zero gradient (torch)."""
    z, y = inputs(4, 33, f64, seed=4)
    z = z * 5e3
    loss, lse = CE.cross_entropy_forward(z, y, block_c=16)
    assert_close("loss", loss, F.cross_entropy(z, y), 1e-13)
    none = torch.full_like(y, -100)
    loss, lse = CE.cross_entropy_forward(z, none)
    assert loss.isnan(), f"every row ignored: loss {loss.item()}, expected nan as torch gives"
    assert torch.equal(CE.cross_entropy_backward(1.0, z, none, lse), torch.zeros_like(z))


def test_strides_are_read_not_assumed(CE, guard):
    """Logits inside a buffer of NaN sentinels, targets every other element of a buffer, column-major logits."""
    z, y = inputs(5, 40, f32, seed=5, ignored=(3,))
    expected = CE.cross_entropy_forward_backward(z, y, block_c=16)
    zp, zbuf, zpad = padded(z)
    ybuf = torch.full((10,), 7777, dtype=y.dtype, device=device())
    yp = ybuf[::2]
    yp.copy_(y)
    got = CE.cross_entropy_forward_backward(zp, yp, block_c=16)
    for name, a, b in zip(("loss", "lse", "dlogits"), got, expected, strict=True):
        assert torch.equal(a, b), f"{name} from padded inputs differs from contiguous inputs'"
    assert_padding_kept("logits' buffer", zbuf, zpad)
    assert torch.equal(ybuf[1::2], torch.full((5,), 7777, dtype=y.dtype, device=device()))
    zt = z.t().contiguous().t()
    assert torch.equal(CE.cross_entropy_forward_backward(zt, y, block_c=16)[2], expected[2])


def test_sizes_of_one(CE, guard):
    """One class (loss 0, gradient 0) and one row."""
    for n, c in [(3, 1), (1, 5)]:
        z, y = inputs(n, c, f64, seed=6)
        loss, lse = CE.cross_entropy_forward(z, y)
        assert_close(f"loss ({n}, {c})", loss, F.cross_entropy(z, y), 1e-13)
        assert_close(f"dlogits ({n}, {c})", CE.cross_entropy_backward(1.0, z, y, lse), textbook(z, y)[1], 1e-13)


def test_bad_targets_are_refused_or_nan(CE, guard):
    z, y = inputs(4, 6, f32, seed=7)
    y[2] = 6
    with pytest.raises(ValueError, match=r"target\[2\] = 6 is not a class index in \[0, 6\)"):
        CE.cross_entropy_forward(z, y)
    loss, lse = CE.cross_entropy_forward(z, y, reduction="none", check_targets=False)
    assert loss[2].isnan() and not loss[[0, 1, 3]].isnan().any()
    assert CE.cross_entropy_backward(torch.ones(4, device=device()), z, y, lse, reduction="none")[2].isnan().all()
    with pytest.raises(ValueError, match="reduction"):
        CE.cross_entropy_forward(z, y, reduction="avg")
    with pytest.raises(ValueError, match="target must be"):
        CE.cross_entropy_forward(z, y[:3])
    with pytest.raises(ValueError, match="dloss must"):
        CE.cross_entropy_backward(torch.ones(3, device=device()), z, y, lse)
    with pytest.raises(ValueError, match="power of two"):
        CE.cross_entropy_forward(z, y.clamp(0, 5), block_c=24)

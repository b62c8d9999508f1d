"""Mixed precision by hand (training/precision/master.py, the layers and the loss in float16/bfloat16).

- each hand-written layer in bf16/fp16 keeps its input's dtype and is no less accurate, against float64,
  than torch's own kernels in that dtype; batch norm normalises a half input in float32;
- CrossEntropyLoss on half logits equals float32 cross-entropy of the upcast logits, bit for bit;
- DynamicLossScaler follows torch.amp.GradScaler's scale sequence on the same found-inf pattern, skips
  the steps with inf/nan gradients and recovers; its written-out reference equals torch's fused kernels;
- MasterWeights: the float32 update equals a float32 reference; an MLP step equals nn.Module under
  torch.autocast bit for bit; updates too small for bf16 still accumulate;
- training: a bf16 (and an fp16 with the loss scaler) MLP and a small CNN reach the float32 accuracy
  within 0.5 points on a synthetic dataset.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from layers import BatchNorm1d, BatchNorm2d, Conv2d, Dropout, Flatten, Linear, MaxPool2d, ReLU, Sequential, from_torch
from losses import CrossEntropyLoss
from optimizers import SGD, Adam
from training.precision.loss_scale import (
    DynamicLossScaler,
    unscale_check_fused_,
    unscale_check_reference_,
    update_scale_reference_,
)
from training.precision.master import MasterWeights, to_low_precision

HALF = (torch.bfloat16, torch.float16)


def rel_to_max(a: torch.Tensor, ref: torch.Tensor) -> float:
    """max |a - ref| / max |ref|: the error measured in units of the tensor's scale."""
    return ((a.double() - ref).abs().max() / ref.abs().max()).item()


# ---------------------------------------------------------------- layers in low precision

LAYER_CASES = {
    "linear": (lambda: Linear(30, 20), (64, 30)),
    "relu": (ReLU, (16, 30)),
    "conv": (lambda: Conv2d(3, 8, 3, padding=1), (4, 3, 10, 10)),
    "conv_stride2": (lambda: Conv2d(4, 6, 3, stride=2, padding=1), (8, 4, 9, 9)),
    "maxpool": (lambda: MaxPool2d(2), (4, 3, 10, 10)),
    "maxpool_overlap": (lambda: MaxPool2d(3, 2), (4, 3, 11, 11)),
    "flatten": (Flatten, (4, 3, 2, 2)),
}


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("case", sorted(LAYER_CASES))
def test_layer_low_precision_matches_torch_kernels(case, dtype):
    """Forward equals torch's module in the same dtype bit for bit; every gradient is in the input's dtype
    and, against float64 math on the same half inputs, within 1.25x torch's own error in that dtype."""
    torch.manual_seed(0)
    make, shape = LAYER_CASES[case]
    layer = make()
    twin, twin64 = layer.to_torch().to(dtype), layer.to_torch().double()
    layer.to(dtype=dtype)
    x = torch.randn(shape).to(dtype)
    out = layer.forward(x)
    dout = torch.randn_like(out)
    dx = layer.backward(dout)
    xt, x64 = x.clone().requires_grad_(), x.double().requires_grad_()
    out_t = twin(xt)
    out_t.backward(dout)
    twin64(x64).backward(dout.double())
    assert out.dtype == dx.dtype == dtype
    assert torch.equal(out, out_t)
    eps = torch.finfo(dtype).eps
    pairs = [("dx", dx, xt.grad, x64.grad)]
    for (name, p), tp, p64 in zip(layer.named_parameters(), twin.parameters(), twin64.parameters(), strict=True):
        assert p.grad.dtype == dtype
        pairs.append((name, p.grad, tp.grad, p64.grad))
    for name, mine, theirs, exact in pairs:
        err, err_torch = rel_to_max(mine, exact), rel_to_max(theirs, exact)
        assert err <= max(1.25 * err_torch, eps / 2), f"{case} {dtype} {name}: error {err:.3g}, torch's {err_torch:.3g}"


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_dropout_low_precision_applies_its_mask(dtype):
    torch.manual_seed(0)
    layer = Dropout(0.3)
    x = torch.randn(64, 32, dtype=dtype)
    out = layer.forward(x)
    mask = layer.mask
    dout = torch.randn_like(out)
    dx = layer.backward(dout)
    assert out.dtype == dx.dtype == mask.dtype == dtype
    assert set(mask.unique().tolist()) == {0.0, torch.tensor(1 / 0.7, dtype=dtype).item()}
    assert torch.equal(out, x * mask) and torch.equal(dx, dout * mask)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("bn_class,shape", [(BatchNorm1d, (16, 5)), (BatchNorm2d, (8, 5, 4, 4))])
def test_batchnorm_normalises_half_input_in_float32(bn_class, shape, dtype):
    """float32 parameters, half input: output, dx and the running statistics are the float32 layer's on the
    upcast input, rounded once to the input's dtype (statistics in float32)."""
    torch.manual_seed(0)
    bn, ref = bn_class(5), bn_class(5)
    with torch.no_grad():  # parameters require gradients, as nn.Parameter's
        for layer in (bn, ref):
            layer.weight.copy_(torch.linspace(0.5, 1.5, 5))
            layer.bias.copy_(torch.linspace(-0.3, 0.3, 5))
    x = (torch.randn(shape) * 3 + 1).to(dtype)
    out, out_ref = bn.forward(x), ref.forward(x.float())
    dout = torch.randn_like(out)
    dx, dx_ref = bn.backward(dout), ref.backward(dout.float())
    assert bn.weight.dtype == torch.float32 and out.dtype == dx.dtype == dtype
    assert torch.equal(out, out_ref.to(dtype)) and torch.equal(dx, dx_ref.to(dtype))
    assert torch.equal(bn.running_mean, ref.running_mean) and torch.equal(bn.running_var, ref.running_var)
    assert torch.equal(bn.weight.grad, ref.weight.grad) and torch.equal(bn.bias.grad, ref.bias.grad)


def test_to_low_precision_keeps_batch_norm_float32():
    net = Sequential(Conv2d(1, 4, 3, bias=False), BatchNorm2d(4), ReLU(), Flatten(), Linear(4 * 4 * 4, 3))
    to_low_precision(net, torch.bfloat16)
    dtypes = {name: t.dtype for name, t in list(net.named_parameters()) + list(net.named_buffers())}
    assert dtypes == {
        "0.weight": torch.bfloat16,
        "1.weight": torch.float32,
        "1.bias": torch.float32,
        "1.running_mean": torch.float32,
        "1.running_var": torch.float32,
        "1.num_batches_tracked": torch.long,
        "4.weight": torch.bfloat16,
        "4.bias": torch.bfloat16,
    }
    out = net(torch.randn(2, 1, 6, 6, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="float16 or torch.bfloat16"):
        to_low_precision(net, torch.float64)


# ---------------------------------------------------------------- cross-entropy


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("soft", [False, True], ids=["index", "prob"])
def test_cross_entropy_half_equals_float32_of_upcast_logits(dtype, smoothing, soft):
    torch.manual_seed(0)
    logits = (torch.randn(32, 10) * 4).to(dtype)
    target = torch.softmax(torch.randn(32, 10), 1).to(dtype) if soft else torch.randint(0, 10, (32,))
    crit, ref = CrossEntropyLoss(label_smoothing=smoothing), CrossEntropyLoss(label_smoothing=smoothing)
    scale = torch.tensor([1024.0])  # a loss scale: applied in float32, before the one rounding
    loss = crit(logits, target)
    loss_ref = ref(logits.float(), target.float() if soft else target)
    assert loss.dtype == torch.float32 and torch.equal(loss, loss_ref)
    d, d_ref = crit.backward(scale), ref.backward(scale)
    assert d.dtype == dtype and torch.equal(d, d_ref.to(dtype))
    if not soft:  # and what torch.autocast runs: cross_entropy in float32, its gradient cast back
        z = logits.clone().requires_grad_()
        with torch.autocast("cpu", dtype=dtype):
            torch_loss = F.cross_entropy(z, target, label_smoothing=smoothing)
        (torch_loss * scale).backward()
        assert torch.allclose(loss, torch_loss, rtol=1e-6, atol=0) and torch.equal(d, z.grad)


def test_cross_entropy_scaled_gradient_survives_float16():
    """A gradient below half of float16's smallest subnormal (2^-24 = 6e-8) flushes to zero unscaled; with the
    loss scale applied in float32 before the one rounding it survives, and unscaling in float32 restores it."""
    n = 2**16
    logits = torch.zeros(n, 2, dtype=torch.float16)
    target = torch.zeros(n, dtype=torch.long)
    exact = torch.tensor([-0.5, 0.5]) / n * 1e-3  # (p - onehot) / N * dout: 7.6e-9
    crit = CrossEntropyLoss()
    crit(logits, target)
    assert crit.backward(1e-3).abs().max() == 0
    crit(logits, target)
    scaled = crit.backward(torch.tensor([1e-3 * 2**16]))
    assert scaled.dtype == torch.float16
    err = (scaled.float() / 2**16 - exact).abs().max() / exact.abs().max()
    assert err <= torch.finfo(torch.float16).eps, err


# ---------------------------------------------------------------- the loss scaler


def _grads_pattern(pattern):
    """Per step: the gradient values of two parameters ('inf', 'nan' or finite)."""
    for kind in pattern:
        g = torch.tensor([0.5, -2.0]) * 1024
        if kind == "inf":
            g[1] = float("inf")
        elif kind == "nan":
            g[0] = float("nan")
        yield g


PATTERN = ["ok", "inf", "ok", "ok", "ok", "ok", "nan", "ok", "ok", "ok", "inf", "inf", "ok", "ok", "ok", "ok", "ok"]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "reference"])
@pytest.mark.parametrize("factors", [(2.0, 0.5), (3.0, 0.25), (1.5, 0.3)])
def test_scaler_follows_grad_scaler(fused, factors):
    """Same found-inf pattern, same optimizer: the same scale after every step, the same steps skipped, the
    same weights (GradScaler on CPU, torch.optim.SGD for both)."""
    growth, backoff = factors
    kw = dict(init_scale=1024.0, growth_factor=growth, backoff_factor=backoff, growth_interval=3)
    ours, theirs = DynamicLossScaler(**kw, fused=fused), torch.amp.GradScaler("cpu", **kw)
    p_ours, p_theirs = torch.zeros(2, requires_grad=True), torch.zeros(2, requires_grad=True)
    opt_ours, opt_theirs = torch.optim.SGD([p_ours], lr=0.1), torch.optim.SGD([p_theirs], lr=0.1)
    scales, stepped = [], []
    for g in _grads_pattern(PATTERN):
        p_ours.grad, p_theirs.grad = g.clone(), g.clone()
        found = ours.unscale_and_check_([p_ours]).item()
        stepped.append(ours.step(opt_ours))
        ours.update()
        theirs.scale(torch.ones(()))  # GradScaler creates its scale on first use
        theirs.unscale_(opt_theirs)
        theirs.step(opt_theirs)
        theirs.update()
        assert found == (0.0 if stepped[-1] else 1.0)
        assert ours.get_scale() == theirs.get_scale()
        assert int(ours._growth_tracker) == int(theirs._growth_tracker)
        assert torch.equal(p_ours, p_theirs)
        scales.append(ours.get_scale())
    assert stepped == [k == "ok" for k in PATTERN]
    f32 = lambda v: torch.tensor(v, dtype=torch.float32).item()  # noqa: E731  the scale is a float32
    expected = [1024.0]
    for k in PATTERN[1:7]:
        expected.append(f32(expected[-1] * backoff) if k != "ok" else expected[-1])
    expected[4] = f32(expected[3] * growth)  # 3 clean steps after the inf of step 1: grown
    expected[5] = expected[4]
    expected[6] = f32(expected[5] * backoff)  # the nan of step 6
    assert scales[:7] == expected
    assert ours.state_dict() == theirs.state_dict()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_scaler_skips_nonfinite_steps_and_recovers(device):
    """A model whose float16 gradients overflow at scale 2^16: the first steps are skipped while the scale
    halves, then it trains (loss falls), and after growth_interval clean steps the scale doubles."""
    torch.manual_seed(0)
    net = Sequential(Linear(8, 16), ReLU(), Linear(16, 2)).to(device)
    master = MasterWeights(net, cast_to=torch.float16)
    opt = SGD(master.parameters(), lr=0.05)
    scaler = DynamicLossScaler(growth_interval=5, device=torch.device(device))
    crit = CrossEntropyLoss()
    x = (torch.randn(256, 8) * 30).half().to(device)  # big inputs: dW = x^T dout * 2^16 overflows float16 (65504)
    y = (x[:, 0] > 0).long()
    scales, stepped, losses = [], [], []
    for _ in range(30):
        master.zero_grad()
        losses.append(crit(net(x), y).item())
        net.backward(crit.backward(scaler.scale_loss_grad()))
        master.grads_to_master(scaler)
        stepped.append(scaler.step(opt))
        scaler.update()
        master.master_to_model()
        scales.append(scaler.get_scale())
    first_ok = stepped.index(True)
    assert first_ok >= 1 and not any(stepped[:first_ok])  # overflow at the start: skipped, scale backed off
    assert scales[:first_ok] == [2.0 ** (15 - i) for i in range(first_ok)]
    assert all(stepped[first_ok:])  # recovered: every later step taken
    assert scales[first_ok + 4] == 2 * scales[first_ok - 1]  # 5 clean steps: grown
    assert losses[-1] < 0.5 * losses[first_ok]
    assert all(
        m.device.type == device and m.dtype == torch.float32 and torch.isfinite(m).all() for m in master.parameters()
    )


def test_scaler_disabled_is_a_no_op():
    scaler = DynamicLossScaler(enabled=False)
    p = torch.zeros(2)
    p.grad = torch.tensor([1.0, float("inf")])
    opt = torch.optim.SGD([p], lr=1.0)
    assert scaler.scale_loss_grad() == 1.0 and scaler.get_scale() == 1.0
    assert scaler.unscale_and_check_([p]).item() == 0.0
    assert scaler.step(opt) is True
    scaler.update()
    assert p[1] == float("-inf")  # stepped: no check when disabled


def test_scaler_growth_stays_finite_and_refuses_misuse():
    scaler = DynamicLossScaler(init_scale=2.0**127, growth_interval=1)
    p = torch.zeros(1)
    p.grad = torch.ones(1)
    scaler.unscale_and_check_([p])
    scaler.update()
    assert scaler.get_scale() == 2.0**127  # 2^128 is inf in float32: not taken (GradScaler's rule)
    with pytest.raises(RuntimeError, match="before unscale_and_check_"):
        scaler.update()
    scaler.unscale_and_check_([p])
    with pytest.raises(RuntimeError, match="twice in one step"):
        scaler.unscale_and_check_([p])
    q = torch.zeros(1, dtype=torch.float16)
    q.grad = torch.ones(1, dtype=torch.float16)
    with pytest.raises(ValueError, match="float32 master weights"):
        DynamicLossScaler().unscale_and_check_([q])
    for bad in (
        dict(init_scale=0.0),
        dict(growth_factor=1.0),
        dict(backoff_factor=1.0),
        dict(growth_interval=0),
        dict(init_scale=float("nan")),
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            DynamicLossScaler(**bad)


def test_scaler_state_dict_round_trip():
    a = DynamicLossScaler(growth_interval=2)
    p = torch.zeros(1)
    p.grad = torch.tensor([float("inf")])
    a.unscale_and_check_([p])
    a.update()
    b = DynamicLossScaler(growth_interval=2)
    b.load_state_dict(a.state_dict())
    assert b.get_scale() == a.get_scale() == 2.0**15 and b.state_dict() == a.state_dict()


def test_fused_and_reference_kernels_agree():
    torch.manual_seed(0)
    inv = torch.tensor([1 / 3.0])
    for bad in (None, "inf", "nan", "-inf"):
        grads = [torch.randn(5, 4), torch.randn(7)]
        if bad:
            grads[1][3] = float(bad)
        a, b = [g.clone() for g in grads], [g.clone() for g in grads]
        fa, fb = torch.zeros(1), torch.zeros(1)
        unscale_check_fused_(a, fa, inv)
        unscale_check_reference_(b, fb, inv)
        assert torch.equal(fa, fb) and fa.item() == (1.0 if bad else 0.0)
        assert all(torch.equal(x, y) for x, y in zip(a[:1], b[:1], strict=True))
        assert torch.allclose(a[1], b[1], equal_nan=True)
    for found in (0.0, 1.0):
        for tracker in (0, 1, 2):
            s1, s2 = torch.tensor([1000.0]), torch.tensor([1000.0])
            t1, t2 = torch.tensor([tracker], dtype=torch.int32), torch.tensor([tracker], dtype=torch.int32)
            f = torch.tensor([found])
            torch._amp_update_scale_(s1, t1, f, 1.7, 0.3, 3)
            update_scale_reference_(s2, t2, f, 1.7, 0.3, 3)
            assert torch.equal(s1, s2) and torch.equal(t1, t2)


# ---------------------------------------------------------------- master weights


def test_master_weights_update_equals_float32_reference():
    """Adam on the masters = Adam in float32 on the upcast gradients; the model holds the rounded masters;
    the masters start from the float32 weights exactly, with the same strides."""
    torch.manual_seed(0)
    net = Sequential(Linear(6, 5), ReLU(), Linear(5, 3))
    ref = [p.detach().clone() for p in net.parameters()]
    master = MasterWeights(net, cast_to=torch.bfloat16)
    assert all(torch.equal(m, r) for m, r in zip(master.parameters(), ref, strict=True))
    assert all(
        m.stride() == p.stride() and p.dtype == torch.bfloat16
        for m, p in zip(master.parameters(), net.parameters(), strict=True)
    )
    opt, opt_ref = Adam(master.parameters(), lr=0.01), torch.optim.Adam(ref, lr=0.01)
    crit = CrossEntropyLoss()
    buffers = None
    for _ in range(4):
        x, y = torch.randn(16, 6, dtype=torch.bfloat16), torch.randint(0, 3, (16,))
        master.zero_grad(set_to_none=False)
        crit(net(x), y)
        net.backward(crit.backward())
        master.grads_to_master()
        ptrs = [t.grad.data_ptr() for t in master.parameters() + list(net.parameters())]
        assert buffers is None or ptrs == buffers  # gradient buffers allocated once, then written in place
        buffers = ptrs
        for r, p in zip(ref, net.parameters(), strict=True):
            r.grad = p.grad.float()
        opt.step()
        opt_ref.step()
        master.master_to_model()
        for m, r, p in zip(master.parameters(), ref, net.parameters(), strict=True):
            assert torch.allclose(m, r, rtol=1e-6, atol=1e-7) and m.dtype == torch.float32
            assert torch.equal(p, m.to(torch.bfloat16))


def test_master_weights_keep_updates_bfloat16_would_round_away():
    """lr * grad = 1e-4 on weights near 1: under bf16's half-ulp (2^-9), so a bf16 weight never moves, while
    the float32 master accumulates 100 of them (0.01) and the model receives the rounding of the sum."""
    lin = Linear(1, 1, bias=False)
    with torch.no_grad():
        lin.weight.fill_(1.0)
    master = MasterWeights(lin, cast_to=torch.bfloat16)
    opt = SGD(master.parameters(), lr=1e-4)
    plain = torch.ones(1, 1, dtype=torch.bfloat16)
    for _ in range(100):
        lin.weight.grad = torch.full((1, 1), -1.0, dtype=torch.bfloat16)
        master.grads_to_master()
        opt.step()
        master.master_to_model()
        plain -= 1e-4 * torch.full((1, 1), -1.0, dtype=torch.bfloat16)
    assert plain.item() == 1.0
    assert abs(master.parameters()[0].item() - 1.01) < 1e-5
    assert lin.weight.item() == torch.tensor(1.01).bfloat16().item() != 1.0


def test_master_weights_step_equals_torch_autocast_twin():
    """The hand-written bf16 MLP with float32 masters and nn.Module under torch.autocast(bfloat16) on the same
    float32 weights compute the same numbers: the same losses and weights, bit for bit, over 8 SGD steps."""
    torch.manual_seed(0)
    twin = torch.nn.Sequential(
        torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5)
    )
    net = from_torch(twin)
    master = MasterWeights(net, cast_to=torch.bfloat16)
    opt = SGD(master.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    opt_twin = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    crit = CrossEntropyLoss()
    for _ in range(8):
        x, y = torch.randn(64, 20), torch.randint(0, 5, (64,))
        master.zero_grad()
        loss = crit(net(x.to(torch.bfloat16)), y)
        net.backward(crit.backward())
        master.grads_to_master()
        opt.step()
        master.master_to_model()
        opt_twin.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss_twin = F.cross_entropy(twin(x), y)
        loss_twin.backward()
        opt_twin.step()
        assert torch.allclose(loss, loss_twin, rtol=1e-6, atol=0)  # the loss's reduction may round differently
    state = twin.state_dict()
    for name, m in master.named_parameters():
        assert torch.equal(m, state[name]), name


def test_master_weights_state_dict_and_none_grads():
    torch.manual_seed(0)
    net = Sequential(Linear(4, 3), ReLU(), BatchNorm1d(3), Linear(3, 2))
    master = MasterWeights(net, cast_to=torch.bfloat16)
    assert repr(master) == "MasterWeights(6 tensors, 4 copied to torch.float32)"
    bn_w = net.layers[2].weight if hasattr(net, "layers") else list(net.named_children())[2][1].weight
    assert any(m is bn_w for m in master.parameters())  # float32 batch norm: its own master
    state = master.state_dict()
    other = MasterWeights(Sequential(Linear(4, 3), ReLU(), BatchNorm1d(3), Linear(3, 2)), cast_to=torch.bfloat16)
    other.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(other.parameters(), master.parameters(), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(other.model.parameters(), net.parameters(), strict=True))
    with pytest.raises(KeyError, match="missing"):
        other.load_state_dict({})
    master.grads_to_master()  # no gradients yet: every master grad stays None
    assert all(m.grad is None for m in master.parameters())


# ---------------------------------------------------------------- training reaches float32 accuracy


def _blobs(n: int, seed: int):
    """4 classes in 16 dimensions, labelled by a fixed random linear teacher (the argmax of x @ W)."""
    teacher = torch.randn(16, 4, generator=torch.Generator().manual_seed(99))
    x = torch.randn(n, 16, generator=torch.Generator().manual_seed(seed))
    return x, (x @ teacher).argmax(1)


def _images(n: int, seed: int):
    """8x8 one-channel images: a bright 3x3 square in one of 4 quadrants (the class), on noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = torch.randn(n, 1, 8, 8, generator=g) * 1.2
    r, c = torch.randint(0, 2, (n,), generator=g), torch.randint(0, 2, (n,), generator=g)
    for i in range(n):
        top, left = 4 * (y[i].item() // 2) + r[i].item(), 4 * (y[i].item() % 2) + c[i].item()
        x[i, 0, top : top + 3, left : left + 3] += 1.5
    return x, y


def _train(make_net, data, dtype, epochs: int, lr: float, batch: int = 50) -> float:
    """Train with SGD+momentum (float32 masters when dtype is half, a loss scaler for float16); test accuracy."""
    (x, y), (xt, yt) = data
    torch.manual_seed(0)
    net = make_net()
    scaler = None
    if dtype == torch.float32:
        opt = SGD(net.parameters(), lr=lr, momentum=0.9)
        master = None
    else:
        master = MasterWeights(net, cast_to=dtype)
        opt = SGD(master.parameters(), lr=lr, momentum=0.9)
        scaler = DynamicLossScaler(enabled=dtype == torch.float16)
    crit = CrossEntropyLoss()
    order = torch.Generator().manual_seed(1)
    for _ in range(epochs):
        net.train()
        for idx in torch.randperm(len(x), generator=order).split(batch):
            loss = crit(net(x[idx].to(dtype)), y[idx])
            if master is None:
                net.zero_grad()
                net.backward(crit.backward())
                opt.step()
            else:
                master.zero_grad()
                net.backward(crit.backward(scaler.scale_loss_grad()))
                master.grads_to_master(scaler)
                scaler.step(opt)
                scaler.update()
                master.master_to_model()
            assert torch.isfinite(loss)
    net.eval()
    return (net(xt.to(dtype)).argmax(1) == yt).double().mean().item() * 100


def _mlp() -> Sequential:
    return Sequential(Linear(16, 64), ReLU(), Linear(64, 64), ReLU(), Linear(64, 4))


@functools.cache
def _mlp_accuracy(dtype: torch.dtype) -> float:
    return _train(_mlp, (_blobs(1000, 0), _blobs(2000, 1)), dtype, epochs=6, lr=0.05)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_low_precision_mlp_reaches_float32_accuracy(dtype):
    acc32, acc = _mlp_accuracy(torch.float32), _mlp_accuracy(dtype)
    assert acc32 > 90.0, acc32  # the task is learned: the comparison means something
    assert abs(acc - acc32) <= 0.5, (dtype, acc, acc32)


def test_bfloat16_cnn_reaches_float32_accuracy():
    data = (_images(400, 0), _images(1000, 1))

    def make():
        return Sequential(
            Conv2d(1, 6, 3, padding=1, bias=False),
            BatchNorm2d(6),
            ReLU(),
            MaxPool2d(2),
            Conv2d(6, 8, 3, padding=1),
            ReLU(),
            MaxPool2d(2),
            Flatten(),
            Dropout(0.2),
            Linear(8 * 2 * 2, 4),
        )

    acc32 = _train(make, data, torch.float32, epochs=3, lr=0.05)
    acc = _train(make, data, torch.bfloat16, epochs=3, lr=0.05)
    assert acc32 > 90.0, acc32
    assert abs(acc - acc32) <= 0.5, (acc, acc32)


def test_to_low_precision_keeps_layer_norm_and_sync_batch_norm_float32():
    from layers import LayerNorm, SyncBatchNorm

    net = Sequential(Linear(4, 6), LayerNorm(6), SyncBatchNorm(6), Linear(6, 2))
    to_low_precision(net, torch.float16)
    assert [p.dtype for p in net.parameters()] == [torch.float16] * 2 + [torch.float32] * 4 + [torch.float16] * 2
    assert net(torch.randn(5, 4, dtype=torch.float16)).dtype == torch.float16

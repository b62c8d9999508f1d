"""GELU, LeakyReLU, SiLU, LogSoftmax and Dropout (with SeededDropout): gradient checks, torch.nn parity,
in-place variants, conversion, a random nn.Sequential of the new layers, bad input."""

import math
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gradcheck import check_layer, nontrivial
from layers import (
    GELU,
    BatchNorm1d,
    Dropout,
    LayerNorm,
    LeakyReLU,
    LogSoftmax,
    SeededDropout,
    Sequential,
    SiLU,
    from_torch,
)
from models import seeded_dropouts
from tests.conftest import assert_all_pass, rel

f64 = torch.float64

ACTS = [  # (ours, torch's)
    (lambda: GELU(), lambda: nn.GELU()),
    (lambda: GELU("tanh"), lambda: nn.GELU(approximate="tanh")),
    (lambda: LeakyReLU(), lambda: nn.LeakyReLU()),
    (lambda: LeakyReLU(0.3), lambda: nn.LeakyReLU(0.3)),
    (lambda: LeakyReLU(-0.5), lambda: nn.LeakyReLU(-0.5)),
    (lambda: SiLU(), lambda: nn.SiLU()),
    (lambda: LogSoftmax(1), lambda: nn.LogSoftmax(1)),
    (lambda: LogSoftmax(0), lambda: nn.LogSoftmax(0)),
    (lambda: LogSoftmax(-1), lambda: nn.LogSoftmax(-1)),
]
ACT_IDS = ["gelu", "gelu_tanh", "leaky", "leaky0.3", "leaky-0.5", "silu", "logsoftmax1", "logsoftmax0", "logsoftmax-1"]
SHAPES = [(1, 5), (4, 7), (2, 3, 4)]


def off_kink(x):
    return torch.where(x.abs() < 1e-2, torch.full_like(x, 0.5), x)


@pytest.mark.parametrize("make,_", ACTS, ids=ACT_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_activation_gradcheck(make, _, shape):
    torch.manual_seed(sum(shape))
    assert_all_pass(check_layer(make(), off_kink(torch.randn(*shape, dtype=f64) * 3)))


@pytest.mark.parametrize("make,make_t", ACTS, ids=ACT_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_activation_equals_torch(make, make_t, shape):
    torch.manual_seed(1)
    ours, theirs = make(), make_t()
    x, dout = torch.randn(*shape, dtype=f64) * 4, torch.randn(*shape, dtype=f64)
    x.view(-1)[0] = 0.0  # LeakyReLU's kink: torch's derivative there is the negative slope
    xr = x.clone().requires_grad_()
    out_t = theirs(xr)
    out_t.backward(dout)
    assert rel(ours(x), out_t.detach()) < 1e-14
    assert rel(ours.backward(dout), xr.grad) < 1e-13
    conv = from_torch(theirs)
    assert type(conv) is type(ours) and conv.extra_repr() == ours.extra_repr()
    back = conv.to_torch()
    assert type(back) is type(theirs) and repr(back) == repr(theirs)


@pytest.mark.parametrize(
    "ours,theirs",
    [
        (LeakyReLU(0.2, inplace=True), nn.LeakyReLU(0.2)),
        (SiLU(inplace=True), nn.SiLU()),
        (Dropout(0.4, inplace=True), None),
        (from_torch(nn.ReLU(inplace=True)), nn.ReLU()),
    ],
    ids=["leaky", "silu", "dropout", "relu-from-torch"],
)
def test_inplace_variants_overwrite_x_and_keep_the_gradient(ours, theirs):
    torch.manual_seed(2)
    x, dout = torch.randn(5, 6, dtype=f64), torch.randn(5, 6, dtype=f64)
    if theirs is None:  # Dropout: the in-place layer equals the out-of-place one under the same seed
        theirs = Dropout(0.4)
        torch.manual_seed(3)
        expected = theirs(x.clone())
        dx_expected = theirs.backward(dout)
    else:
        xr = x.clone().requires_grad_()
        out_t = theirs(xr)
        out_t.backward(dout)
        expected, dx_expected = out_t.detach(), xr.grad
    torch.manual_seed(3)
    xi = x.clone()
    out = ours(xi)
    assert out.data_ptr() == xi.data_ptr() and torch.equal(xi, out)  # written into x
    assert rel(out, expected) < 1e-14 and rel(ours.backward(dout), dx_expected) < 1e-14


def test_activation_errors():
    with pytest.raises(ValueError, match=r"LogSoftmax: dim must be an int \(torch's implicit dim=None"):
        LogSoftmax()
    with pytest.raises(ValueError, match="LogSoftmax: dim must be an int"):
        from_torch(nn.LogSoftmax())
    with pytest.raises(ValueError, match="dim 2 is out of range"):
        LogSoftmax(2)(torch.randn(3, 4))
    with pytest.raises(ValueError, match="GELU: approximate must be 'none' or 'tanh', got 'erf'"):
        GELU("erf")
    with pytest.raises(ValueError, match="negative_slope must be a finite number"):
        LeakyReLU(float("nan"))
    with pytest.raises(ValueError, match="SiLU: inplace must be a bool"):
        SiLU(1)
    for layer in (GELU(), LeakyReLU(), SiLU(), LogSoftmax(1)):
        with pytest.raises(RuntimeError, match="backward called before forward"):
            layer.backward(torch.randn(2, 3))
        with pytest.raises(ValueError, match="floating-point"):
            layer(torch.ones(2, 3, dtype=torch.long))
        layer(torch.randn(2, 3))
        with pytest.raises(ValueError, match=r"dout has shape \(3, 2\)"):
            layer.backward(torch.randn(3, 2))
        layer.backward(torch.randn(2, 3))
        with pytest.raises(RuntimeError, match="backward called before forward"):
            layer.backward(torch.randn(2, 3))


@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_gelu_backward_is_exact_at_zero_subnormal_and_far_inputs(dtype):
    """dx = dout (Phi(x) + x phi(x)) where a shortcut goes wrong: 0 and -0 (1/2), subnormal x (1/2: out = x Phi(x)
    rounds away the digits that out / x would need), far below and above 0, nan (nan); against the formula in
    Python's float64 math.  Errors are measured against the derivative's own
    scale, 1 (far below 0 it is a difference of two terms, as in torch's own backward)."""
    sub = torch.finfo(dtype).tiny * torch.finfo(dtype).eps  # the smallest subnormal: x/2 rounds for an odd multiple
    xs = [0.0, -0.0, sub, -sub, 3 * sub, -7 * sub, 12345 * sub, 1e-30, -3.0, -8.0, 5.0, 40.0, 1.5, -0.7]
    x = torch.tensor(xs, dtype=dtype)
    layer = GELU()
    layer(x)
    dx = layer.backward(torch.ones_like(x)).double()
    want = torch.tensor(
        [
            0.5 * math.erfc(-v / math.sqrt(2)) + v * math.exp(-v * v / 2) / math.sqrt(2 * math.pi)
            for v in x.double().tolist()
        ],
        dtype=f64,
    )  # the values as rounded to dtype
    err = (dx - want).abs() / want.abs().clamp_min(1.0)
    assert err.max().item() < (1e-15 if dtype == f64 else 5e-7), (x, dx, want)  # a few units of rounding
    assert (dx[:8] == 0.5).all()  # Phi(0) = 1/2, and x phi(x) vanishes for every |x| this small
    layer(torch.tensor([math.nan, 0.0], dtype=dtype))
    dx = layer.backward(torch.ones(2, dtype=dtype))
    assert math.isnan(dx[0].item()) and dx[1].item() == 0.5


def test_a_forward_without_backward_does_not_leave_a_stale_cache():
    layer = GELU()
    layer(torch.full((2, 2), 5.0, dtype=f64))
    x = torch.full((2, 2), -1.0, dtype=f64)
    layer(x)
    xr = x.clone().requires_grad_()
    F.gelu(xr).sum().backward()
    assert rel(layer.backward(torch.ones_like(x)), xr.grad) < 1e-14


# -- Dropout ------------------------------------------------------------------------------------------


def test_dropout_mask_statistics_scaling_and_backward_reuse():
    torch.manual_seed(4)
    drop = Dropout(0.3)
    x = torch.randn(200, 300, dtype=f64)
    out = drop(x)
    mask = drop.mask
    assert mask.shape == x.shape and mask.dtype == x.dtype
    assert set(mask.unique().tolist()) == {0.0, 1 / 0.7}
    assert abs((mask == 0).double().mean().item() - 0.3) < 0.01  # 60,000 draws: the std is 0.0019
    assert torch.equal(out, x * mask)
    dout = torch.randn_like(x)
    assert torch.equal(drop.backward(dout), dout * mask)


def test_dropout_equals_torch_functional_under_one_seed_on_cpu():
    x = torch.randn(7, 9, dtype=f64)
    torch.manual_seed(5)
    expected = F.dropout(x, 0.25, training=True)
    torch.manual_seed(5)
    assert torch.equal(Dropout(0.25)(x), expected)


def test_dropout_identity_cases_and_p_one():
    x, d = torch.randn(4, 5, dtype=f64), torch.randn(4, 5, dtype=f64)
    state = torch.get_rng_state()
    for drop in (Dropout(0.5).eval(), Dropout(0.0)):
        assert torch.equal(drop(x), x) and drop.mask is None
        assert torch.equal(drop.backward(d), d)
    drop = Dropout(1.0)
    out = drop(x)
    assert torch.equal(out, torch.zeros_like(x)) and torch.equal(out, F.dropout(x, 1.0))
    assert torch.equal(drop.backward(torch.ones_like(x)), torch.zeros_like(x))
    assert torch.equal(state, torch.get_rng_state())  # none of these drew a random number


def test_dropout_errors_and_conversion():
    for p in (-0.1, 1.5, "0.5", True):
        with pytest.raises(ValueError, match=r"Dropout: p .* must be a probability in \[0, 1\]"):
            Dropout(p)
    relu = from_torch(nn.ReLU(inplace=True))  # the flag converted both ways, not dropped
    assert repr(relu) == "ReLU(inplace=True)" and repr(relu.to_torch()) == repr(nn.ReLU(inplace=True))
    drop = from_torch(nn.Dropout(0.2, inplace=True))
    assert isinstance(drop, Dropout) and drop.p == 0.2 and drop.inplace
    back = drop.to_torch()
    assert isinstance(back, nn.Dropout) and back.p == 0.2 and back.inplace and back.state_dict() == {}
    with pytest.raises(RuntimeError, match="backward called before forward"):
        Dropout().backward(torch.randn(2))
    d = Dropout()
    d(torch.randn(3, 2))
    with pytest.raises(ValueError, match="dtype"):
        d.backward(torch.randn(3, 2, dtype=f64))


def test_seeded_dropout_twin_draws_the_same_masks_from_its_generator():
    """seeded_dropouts(twin): nn.Dropout drawing as layers.Dropout draws; generators in the same state give the
    same masks, outputs and gradients, and nothing is drawn from torch's global generator."""
    ours, twin = Dropout(0.4), seeded_dropouts(nn.Sequential(nn.Dropout(0.4)))[0]
    assert isinstance(twin, SeededDropout) and twin.p == 0.4
    ours.generator, twin.generator = torch.Generator().manual_seed(6), torch.Generator().manual_seed(6)
    for step in range(3):
        x, dout = torch.randn(6, 8, dtype=f64), torch.randn(6, 8, dtype=f64)
        state = torch.get_rng_state()
        out = ours(x)
        xr = x.clone().requires_grad_()
        out_t = twin(xr)
        assert torch.equal(state, torch.get_rng_state())  # both drew from their own generators only
        out_t.backward(dout)
        assert torch.equal(out_t.detach(), out) and torch.equal(xr.grad, ours.backward(dout)), step
        assert ((ours.mask == 0) | (ours.mask == 1 / 0.6)).all() and 0 < (ours.mask == 0).sum() < 48, step
    twin.eval()
    x = torch.randn(2, 3, dtype=f64)
    assert torch.equal(twin(x), x)
    twin.train()
    twin.p = 1.0
    assert torch.equal(twin(x), torch.zeros_like(x))


# -- a random nn.Sequential of the new layers, converted, against autograd --------------------------


def random_torch_model(rng: random.Random, d: int) -> nn.Sequential:
    mods, width = [], d
    for _ in range(rng.randint(2, 4)):
        out = rng.randint(3, 8)
        mods.append(nn.Linear(width, out))
        width = out
        mods.append(
            rng.choice(
                [
                    nn.BatchNorm1d(width, momentum=rng.choice([0.1, None])),
                    nn.LayerNorm(width),
                    nn.LayerNorm(width, bias=False),
                ]
            )
        )
        mods.append(rng.choice([nn.GELU(), nn.GELU("tanh"), nn.LeakyReLU(0.1), nn.SiLU()]))
        if rng.random() < 0.6:
            mods.append(nn.Dropout(rng.choice([0.2, 0.5])))
    mods += [nn.Linear(width, 4), nn.LogSoftmax(dim=1)]
    if rng.random() < 0.5:
        mods = [nn.Sequential(*mods[:3]), *mods[3:]]
    return nn.Sequential(*mods).double()


def _modules(model):
    for m in model:
        yield from (_modules(m) if isinstance(m, (nn.Sequential, Sequential)) else [m])


@pytest.mark.parametrize("seed", range(6))
def test_random_sequential_from_torch_equals_autograd_with_shared_dropout_masks(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    theirs = random_torch_model(rng, 5)
    for m in theirs.modules():  # gamma and beta away from 1 and 0 (running statistics move with training)
        if isinstance(m, (nn.BatchNorm1d, nn.LayerNorm)):
            with torch.no_grad():
                m.weight.uniform_(0.5, 1.5)
                if m.bias is not None:
                    m.bias.normal_()
    ours = from_torch(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    seeded_dropouts(theirs)  # each side draws its masks, in the same order, from a generator in the same state
    ours_gen, theirs_gen = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    for a, b in zip(_modules(ours), _modules(theirs), strict=True):
        if isinstance(a, Dropout):
            a.generator, b.generator = ours_gen, theirs_gen
    for step in range(3):
        training = step < 2
        ours.train(training), theirs.train(training)
        x, dout = torch.randn(6, 5, dtype=f64), torch.randn(6, 4, dtype=f64)
        out = ours(x)
        dx = ours.backward(dout, need_input_grad=True)
        xr = x.clone().requires_grad_()
        out_t = theirs(xr)
        out_t.backward(dout)
        assert rel(out, out_t.detach()) < 1e-12 and rel(dx, xr.grad) < 1e-11, step
        params_t = dict(theirs.named_parameters())
        for name, p in ours.named_parameters():
            g = p.grad  # torch's layout, as exposed: no view taken
            # absolute floor: the bias of a Linear before batch norm has a gradient of exactly 0 (rounding noise)
            assert torch.allclose(g, params_t[name].grad, rtol=1e-11, atol=1e-13), (step, name)
        sd_t = theirs.state_dict()
        for k, v in ours.state_dict().items():
            assert torch.allclose(v, sd_t[k], rtol=1e-12, atol=1e-15), (step, k)
    back = ours.to_torch()
    assert type(back) is nn.Sequential and list(back.state_dict()) == list(theirs.state_dict())
    x = torch.randn(3, 5, dtype=f64)
    assert rel(back.eval()(x), theirs.eval()(x)) < 1e-13


@pytest.mark.cuda
def test_new_activations_and_dropout_on_cuda():
    torch.manual_seed(8)
    x, d = torch.randn(4, 6, dtype=f64, device="cuda"), torch.randn(4, 6, dtype=f64, device="cuda")
    for layer, fn in (
        (GELU(), F.gelu),
        (SiLU(), F.silu),
        (LeakyReLU(0.2), lambda t: F.leaky_relu(t, 0.2)),
        (LogSoftmax(1), lambda t: F.log_softmax(t, 1)),
    ):
        xr = x.clone().requires_grad_()
        fn(xr).backward(d)
        assert rel(layer(x), fn(x)) < 1e-14 and rel(layer.backward(d), xr.grad) < 1e-13
    drop = Dropout(0.5)
    out = drop(x)
    assert drop.mask.device == x.device and torch.equal(out, x * drop.mask)
    ln = nontrivial(LayerNorm(6, dtype=f64)).to("cuda")
    assert_all_pass(check_layer(ln, x))
    bn = nontrivial(BatchNorm1d(6, dtype=f64)).to("cuda")
    assert_all_pass(check_layer(bn, x))


@pytest.mark.parametrize(
    "make",
    [lambda: __import__("layers").GELU(), lambda: __import__("layers").Sigmoid(), lambda: __import__("layers").Tanh()],
)
def test_a_kept_tensor_changed_in_place_before_backward_is_refused(make):
    """GELU keeps its input and output, Sigmoid and Tanh their output: an in-place change of either after the
    forward (a later layer's in-place op) would give a silently wrong gradient, so backward refuses it."""
    layer = make()
    x = torch.randn(4, 5, dtype=torch.float64)
    out = layer(x)
    out.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified in place after the forward"):
        layer.backward(torch.ones_like(out))
    out = layer(x)  # unchanged: backward runs
    assert layer.backward(torch.ones_like(out)).shape == x.shape

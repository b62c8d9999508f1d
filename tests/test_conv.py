"""Conv2d, MaxPool2d, AvgPool2d and Flatten: gradient checks, torch.nn parity under autograd on many
configurations, each form of the kernel's weight gradient, conversion of random CNNs, bad input.  (The textbook
and the kernels tied to each other: tests/test_kernels.py.)"""

import random

import pytest
import torch
from torch import nn

from gradcheck import check_layer, distinct
from kernels import convolution
from layers import AvgPool2d, BatchNorm2d, Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential, from_torch
from tests.conftest import assert_all_pass, rel

f64 = torch.float64


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: one thread (a 2-thread parallel region costs milliseconds on a loaded machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# (in, out, kernel_size, stride, padding, dilation, groups, bias, input (N, H, W))
CONV_CONFIGS = [
    (3, 4, 3, 1, 0, 1, 1, True, (2, 7, 8)),
    (3, 6, 3, 2, 1, 1, 3, True, (3, 9, 7)),
    (4, 4, (2, 3), (2, 1), (1, 0), (2, 1), 2, True, (2, 10, 9)),
    (2, 4, 2, 1, "same", 1, 1, True, (2, 6, 7)),  # even kernel: the extra zero row/column at the bottom/right
    (2, 4, (2, 4), 1, "same", (3, 1), 2, False, (1, 8, 9)),
    (2, 3, 3, 1, "same", 2, 1, True, (2, 7, 7)),
    (1, 3, 5, 3, 2, 2, 1, True, (2, 13, 11)),  # stride 3 leaves trailing rows unused: output_padding
    (3, 3, 3, 2, "valid", 1, 3, False, (2, 8, 8)),  # depthwise
    (2, 2, 1, 2, 0, 1, 1, True, (1, 5, 5)),  # 1x1 strided
    (4, 8, 3, (1, 2), (2, 1), (2, 1), 4, True, (1, 6, 9)),
    (2, 5, (3, 3), 4, 1, 1, 1, True, (3, 9, 10)),  # stride larger than the kernel: input rows skipped entirely
    # >= 8 input channels per group: dw by a correlation (fewer: the im2col product), with x and dout exchanged
    # for stride 1 without groups (also "same" with its extra row, and dilated, unpadded), else x as the input
    (8, 3, 3, 1, 1, 1, 1, True, (2, 5, 6)),
    (8, 4, 2, 1, "same", 1, 1, True, (2, 6, 7)),
    (9, 4, (3, 2), 1, 0, (2, 1), 1, False, (2, 9, 8)),
    (16, 8, (3, 2), 2, (1, 0), (1, 2), 2, False, (1, 7, 6)),
    (16, 4, 3, 1, 1, 1, 2, True, (2, 5, 5)),
]
CONV_IDS = [f"{c[0]}-{c[1]}-k{c[2]}-s{c[3]}-p{c[4]}-d{c[5]}-g{c[6]}-b{int(c[7])}" for c in CONV_CONFIGS]


def conv_pair(cfg, dtype=f64, seed=0):
    cin, cout, k, s, p, d, g, bias, _ = cfg
    torch.manual_seed(seed)
    ours = Conv2d(cin, cout, k, s, p, d, g, bias, dtype=dtype)
    torch.manual_seed(seed)
    theirs = nn.Conv2d(cin, cout, k, s, p, d, g, bias, dtype=dtype)
    return ours, theirs


def conv_input(cfg, dtype=f64):
    n, h, w = cfg[8]
    return torch.randn(n, cfg[0], h, w, dtype=dtype)


@pytest.mark.parametrize("cfg", CONV_CONFIGS, ids=CONV_IDS)
def test_conv_gradcheck(cfg):
    ours, _ = conv_pair(cfg)
    assert_all_pass(check_layer(ours, conv_input(cfg)))


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("cfg", CONV_CONFIGS, ids=CONV_IDS)
def test_conv_equals_torch_under_autograd(cfg):
    """Same seed -> identical weights; then forward, dx, dw, db over two accumulated steps, to 1e-12."""
    ours, theirs = conv_pair(cfg)
    assert torch.equal(ours.weight, theirs.weight.detach())
    assert (ours.bias is None) == (theirs.bias is None)
    if ours.bias is not None:
        assert torch.equal(ours.bias, theirs.bias.detach())
    for _ in range(2):  # the second step checks accumulation into .grad
        x = conv_input(cfg)
        xr = x.clone().requires_grad_()
        out_t = theirs(xr)
        dout = torch.randn_like(out_t)
        out_t.backward(dout)
        out = ours(x)
        dx = ours.backward(dout)
        assert out.shape == out_t.shape and rel(out, out_t.detach()) < 1e-12
        assert dx.shape == x.shape and rel(dx, xr.grad) < 1e-12
        assert rel(ours.weight.grad, theirs.weight.grad) < 1e-12
        assert ours.weight.grad.shape == ours.weight.shape and ours.weight.grad.is_contiguous()
        if ours.bias is not None:
            assert rel(ours.bias.grad, theirs.bias.grad) < 1e-12


@pytest.mark.parametrize("cfg", CONV_CONFIGS, ids=CONV_IDS)
def test_every_form_of_the_weight_gradient_equals_autograd(cfg):
    """dw has three forms in the kernel (kernels/convolution.py), chosen by shape; each one, wherever it applies,
    equals autograd's."""
    ours, theirs = conv_pair(cfg)
    x = conv_input(cfg)
    out = theirs(x)
    dout = torch.randn_like(out)
    out.backward(dout)
    ours(x)
    xp = ours.kept.x  # the input as the forward convolved it (with the extra "same" row/column)
    k, s, p, d, g = ours.kernel_size, ours.stride, ours._pad, ours.dilation, ours.groups
    forms = {
        "correlation": lambda: convolution.weight_grad_correlation(xp, dout, k, s, p, d, g),
        "im2col": lambda: convolution.weight_grad_im2col(xp, dout, k, s, p, d, g),
    }
    if g == 1 and s == (1, 1) and p[0] <= d[0] * (k[0] - 1) and p[1] <= d[1] * (k[1] - 1):
        forms["exchanged"] = lambda: convolution.weight_grad_exchanged(xp, dout, k, p, d)
    for name, form in forms.items():
        dw = form()
        assert dw.shape == theirs.weight.shape and rel(dw, theirs.weight.grad) < 1e-13, name


def test_need_input_grad_false_skips_dx_and_keeps_parameter_grads():
    cfg = CONV_CONFIGS[1]
    a, _ = conv_pair(cfg)
    b, _ = conv_pair(cfg)
    x = conv_input(cfg)
    dout = torch.randn_like(a(x))
    b(x)
    assert a.backward(dout, need_input_grad=False) is None
    assert b.backward(dout) is not None
    assert torch.equal(a.weight.grad, b.weight.grad) and torch.equal(a.bias.grad, b.bias.grad)


@pytest.mark.parametrize("cfg", [CONV_CONFIGS[0], CONV_CONFIGS[2], CONV_CONFIGS[3]], ids=str)
def test_conv_float32_close_to_torch(cfg):
    ours, theirs = conv_pair(cfg, dtype=torch.float32)
    x = conv_input(cfg, torch.float32)
    xr = x.clone().requires_grad_()
    out_t = theirs(xr)
    dout = torch.randn_like(out_t)
    out_t.backward(dout)
    out = ours(x)
    dx = ours.backward(dout)
    assert out.dtype == dx.dtype == ours.weight.grad.dtype == torch.float32
    assert rel(out, out_t.detach()) < 1e-5 and rel(dx, xr.grad) < 1e-5
    assert rel(ours.weight.grad, theirs.weight.grad) < 1e-5 and rel(ours.bias.grad, theirs.bias.grad) < 1e-5


def test_conv_round_trip_through_torch_keeps_arguments_and_weights():
    torch.manual_seed(1)
    theirs = nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2, bias=False, dtype=f64)
    ours = from_torch(theirs)
    assert isinstance(ours, Conv2d) and ours.bias is None
    assert (ours.kernel_size, ours.stride, ours.padding, ours.dilation, ours.groups) == (
        theirs.kernel_size,
        theirs.stride,
        theirs.padding,
        theirs.dilation,
        theirs.groups,
    )
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight"]
    assert torch.equal(ours.weight, theirs.weight.detach())
    back = ours.to_torch()
    assert isinstance(back, nn.Conv2d) and repr(back) == repr(theirs)
    assert torch.equal(back.weight, theirs.weight)
    same = from_torch(nn.Conv2d(2, 3, 4, padding="same", dtype=f64))
    assert same.padding == "same" and same.to_torch().padding == "same"


# -- pooling and Flatten --------------------------------------------------------------------------------

POOL_CONFIGS = [  # (our class, torch's class, kwargs)
    (MaxPool2d, nn.MaxPool2d, dict(kernel_size=2)),
    (MaxPool2d, nn.MaxPool2d, dict(kernel_size=3, stride=2, padding=1)),  # overlapping windows
    (MaxPool2d, nn.MaxPool2d, dict(kernel_size=3, stride=1, padding=1)),  # every element in up to 9 windows
    (MaxPool2d, nn.MaxPool2d, dict(kernel_size=(3, 2), stride=(1, 2), padding=(1, 0), dilation=(1, 2))),
    (MaxPool2d, nn.MaxPool2d, dict(kernel_size=3, stride=2, ceil_mode=True)),
    (AvgPool2d, nn.AvgPool2d, dict(kernel_size=2)),
    (AvgPool2d, nn.AvgPool2d, dict(kernel_size=3, stride=2, padding=1)),
    (AvgPool2d, nn.AvgPool2d, dict(kernel_size=3, stride=1, padding=1, count_include_pad=False)),
    (AvgPool2d, nn.AvgPool2d, dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    (AvgPool2d, nn.AvgPool2d, dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    (AvgPool2d, nn.AvgPool2d, dict(kernel_size=(2, 3), stride=(3, 1), padding=(1, 1), divisor_override=5)),
    (AvgPool2d, nn.AvgPool2d, dict(kernel_size=3, stride=2, ceil_mode=True)),
]
POOL_IDS = [f"{c[0].__name__}-{'-'.join(f'{k}={v}' for k, v in c[2].items())}" for c in POOL_CONFIGS]
POOL_SHAPES = [(2, 3, 7, 8), (1, 2, 8, 8), (3, 1, 5, 9)]


@pytest.mark.parametrize("cls,_,kw", POOL_CONFIGS, ids=POOL_IDS)
def test_pool_gradcheck(cls, _, kw):
    torch.manual_seed(2)
    for shape in ((1, 2, 6, 7), (2, 1, 5, 5)):
        assert_all_pass(check_layer(cls(**kw), distinct(*shape)))  # distinct values: no tie inside a window


@pytest.mark.parametrize("cls,cls_t,kw", POOL_CONFIGS, ids=POOL_IDS)
@pytest.mark.parametrize("shape", POOL_SHAPES, ids=str)
def test_pool_equals_torch_under_autograd(cls, cls_t, kw, shape):
    torch.manual_seed(3)
    x = torch.randn(*shape, dtype=f64)
    xr = x.clone().requires_grad_()
    out_t = cls_t(**kw)(xr)
    dout = torch.randn_like(out_t)
    out_t.backward(dout)
    layer = cls(**kw)
    out = layer(x)
    dx = layer.backward(dout)
    assert out.shape == out_t.shape and rel(out, out_t.detach()) < 1e-13
    assert dx.shape == x.shape and rel(dx, xr.grad) < 1e-13


def torch_vs_ours(ours, theirs, x, need_input_grad=True):
    """Forward and backward of a hand-written layer and its torch module on x (float64): out, dx and parameter
    gradients compared with autograd's."""
    xr = x.clone().requires_grad_()
    out_t = theirs(xr)
    dout = torch.randn_like(out_t)
    out_t.backward(dout)
    out = ours(x)
    dx = ours.backward(dout)
    assert out.shape == out_t.shape and dx.shape == xr.grad.shape == x.shape
    if out.numel():
        assert rel(out, out_t.detach()) < 1e-13
    if dx.numel():
        assert rel(dx, xr.grad) < 1e-13
    for (name, p), (_, p_t) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        assert p.grad.shape == p_t.grad.shape and torch.isfinite(p.grad).all(), name
        assert rel(p.grad, p_t.grad) < 1e-13 if p_t.grad.any() else torch.equal(p.grad, p_t.grad), name


@pytest.mark.parametrize("cfg", CONV_CONFIGS, ids=CONV_IDS)
def test_conv_unbatched_and_empty_batch_equal_torch(cfg):
    """As torch: an unbatched (C_in, H, W) image gives (C_out, H_out, W_out); an empty batch (N = 0) gives an empty
    output and zero weight and bias gradients (torch returns zeros; the correlation for dw has nothing to run on)."""
    n, h, w = cfg[8]
    for shape in ((cfg[0], h, w), (0, cfg[0], h, w)):
        ours, theirs = conv_pair(cfg)
        torch_vs_ours(ours, theirs, torch.randn(*shape, dtype=f64))


@pytest.mark.parametrize("cls,cls_t,kw", POOL_CONFIGS, ids=POOL_IDS)
def test_pool_unbatched_and_empty_batch_equal_torch(cls, cls_t, kw):
    for shape in ((3, 7, 8), (0, 3, 7, 8)):
        torch_vs_ours(cls(**kw), cls_t(**kw), torch.randn(*shape, dtype=f64))


def test_unbatched_cnn_from_torch_equals_autograd():
    torch.manual_seed(7)
    model = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 3, 2), nn.AvgPool2d(2)
    ).double()
    ours = from_torch(model)
    x = torch.randn(2, 8, 8, dtype=f64)
    xr = x.clone().requires_grad_()
    out_t = model(xr)
    dout = torch.randn_like(out_t)
    out_t.backward(dout)
    out = ours(x)
    dx = ours.backward(dout, need_input_grad=True)
    assert out.shape == out_t.shape == (3, 1, 1) and rel(out, out_t.detach()) < 1e-13 and rel(dx, xr.grad) < 1e-13
    for (name, p), (_, p_t) in zip(ours.named_parameters(), model.named_parameters(), strict=True):
        assert rel(p.grad, p_t.grad) < 1e-13, name


def test_max_pool_ties_send_the_gradient_where_torch_sends_it():
    """Equal values in a window (ReLU's zeros): torch picks one argmax; so does the hand-written layer."""
    x = torch.relu(torch.randn(2, 3, 8, 8, dtype=f64))
    x[0, 0] = 1.0  # a whole plane of ties
    xr = x.clone().requires_grad_()
    out_t = nn.MaxPool2d(3, 1, 1)(xr)
    dout = torch.randn_like(out_t)
    out_t.backward(dout)
    layer = MaxPool2d(3, 1, 1)
    layer(x)
    assert torch.equal(layer.backward(dout), xr.grad)


def test_pool_round_trip_and_float32():
    for cls, cls_t, kw in POOL_CONFIGS:
        theirs = cls_t(**kw)
        ours = from_torch(theirs)
        assert type(ours) is cls and repr(ours.to_torch()) == repr(theirs)
        assert ours.state_dict() == {} and ours.parameters() == []
        x = torch.randn(2, 3, 8, 9)
        xr = x.clone().requires_grad_()
        out_t = theirs(xr)
        dout = torch.randn_like(out_t)
        out_t.backward(dout)
        out = ours(x)
        dx = ours.backward(dout)
        assert out.dtype == dx.dtype == torch.float32
        assert rel(out, out_t.detach()) < 1e-6 and rel(dx, xr.grad) < 1e-6


@pytest.mark.parametrize(
    "start,end,shape",
    [
        (1, -1, (2, 3, 4, 5)),
        (0, -1, (2, 3, 4)),
        (0, 1, (2, 3, 4)),
        (-2, -1, (1, 2, 3, 2)),
        (2, 2, (2, 3, 4)),
        (1, -1, (5, 2)),
    ],
)
def test_flatten_equals_torch_and_gradchecks(start, end, shape):
    x = torch.randn(*shape, dtype=f64)
    layer = Flatten(start, end)
    out = layer(x)
    assert torch.equal(out, nn.Flatten(start, end)(x))
    dout = torch.randn_like(out)
    assert torch.equal(layer.backward(dout), dout.reshape(shape))
    assert_all_pass(check_layer(Flatten(start, end), x))
    assert repr(from_torch(nn.Flatten(start, end)).to_torch()) == repr(nn.Flatten(start, end))


# -- whole CNNs -----------------------------------------------------------------------------------------


def random_cnn(rng: random.Random, in_ch: int, size: int) -> nn.Sequential:
    """A random nn.Sequential CNN: 1-3 blocks of conv (random kernel, stride, padding, dilation, groups, bias),
    optional BatchNorm2d, ReLU or Tanh, optional pooling, some nested; then Flatten and Linear."""
    blocks, c = [], in_ch
    x = torch.zeros(1, in_ch, size, size, dtype=f64)
    for _ in range(rng.randint(1, 3)):
        g = rng.choice([1, 1, c]) if c > 1 else 1
        out = g * rng.randint(1, 3)
        pad = rng.choice([0, 1, "same", "valid"])
        block = [
            nn.Conv2d(
                c,
                out,
                rng.choice([1, 2, 3, (3, 2)]),
                1 if pad == "same" else rng.choice([1, 2]),
                pad,
                1 if pad == "valid" else rng.choice([1, 2]),
                g,
                bias=rng.random() < 0.8,
                dtype=f64,
            )
        ]
        if rng.random() < 0.5:
            block.append(nn.BatchNorm2d(out, dtype=f64))
        block.append(rng.choice([nn.ReLU(), nn.Tanh()]))
        if rng.random() < 0.7:
            block.append(
                rng.choice(
                    [
                        nn.MaxPool2d(2),
                        nn.MaxPool2d(3, 2, 1),
                        nn.AvgPool2d(2),
                        nn.AvgPool2d(3, 1, 1, count_include_pad=False),
                    ]
                )
            )
        try:
            with torch.no_grad():
                y = nn.Sequential(*block).eval()(x)
        except RuntimeError:  # the image became smaller than this block's window
            break
        blocks.append(nn.Sequential(*block)) if rng.random() < 0.5 else blocks.extend(block)
        x, c = y, out
    return nn.Sequential(*blocks, nn.Flatten(), nn.Linear(x[0].numel(), 4, dtype=f64))


def assert_grads_equal(ours, theirs, tol: float) -> None:
    """Every parameter gradient equals torch's, relative to the model's largest gradient entry: a conv bias
    before batch norm has a gradient that is exactly zero in exact arithmetic, rounding noise in both."""
    scale = max(p.grad.abs().max().item() for p in theirs.parameters())
    for (name, p), (name_t, p_t) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        g = p.grad  # torch's layout, as exposed: no view taken
        assert name == name_t and (g - p_t.grad).abs().max().item() <= tol * scale, name


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("seed", range(10))
def test_random_torch_cnn_converted_with_from_torch_equals_autograd(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    in_ch, size = rng.choice([1, 2, 3]), rng.choice([8, 9, 12])
    theirs = random_cnn(rng, in_ch, size)
    with torch.no_grad():  # running statistics away from their initial values
        for m in theirs.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5), m.bias.normal_(), m.running_mean.normal_(), m.running_var.uniform_(0.5, 2)
    ours = from_torch(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for mode in ("train", "eval"):
        ours.train(mode == "train"), theirs.train(mode == "train")
        ours.zero_grad(), theirs.zero_grad()
        x = torch.randn(3, in_ch, size, size, dtype=f64)
        xr = x.clone().requires_grad_()
        out_t = theirs(xr)
        dout = torch.randn_like(out_t)
        out_t.backward(dout)
        out = ours(x)
        dx = ours.backward(dout, need_input_grad=True)
        assert rel(out, out_t.detach()) < 1e-9 and rel(dx, xr.grad) < 1e-9, (mode, theirs)
        assert_grads_equal(ours, theirs, 1e-9)
        for (name, b), (name_t, b_t) in zip(ours.named_buffers(), theirs.named_buffers(), strict=True):
            assert name == name_t and torch.allclose(b.to(f64), b_t.to(f64), rtol=1e-12, atol=1e-15), (mode, name)
    back = ours.to_torch()
    assert repr(back) == repr(theirs)
    sd, sd_t = back.state_dict(), theirs.state_dict()
    assert list(sd) == list(sd_t)
    assert all(torch.allclose(sd[k].to(f64), sd_t[k].to(f64), rtol=1e-12, atol=1e-15) for k in sd)


def test_hand_built_cnn_equals_its_to_torch_twin():
    torch.manual_seed(4)
    ours = Sequential(
        Conv2d(1, 4, 3, padding=1, dtype=f64),
        BatchNorm2d(4, dtype=f64),
        ReLU(),
        MaxPool2d(2),
        Conv2d(4, 8, 3, padding=1, dtype=f64),
        ReLU(),
        AvgPool2d(2),
        Flatten(),
        Linear(8 * 2 * 2, 10, dtype=f64),
    )
    theirs = ours.to_torch()
    x = torch.randn(5, 1, 8, 8, dtype=f64)
    xr = x.clone().requires_grad_()
    out_t = theirs(xr)
    dout = torch.randn_like(out_t)
    out_t.backward(dout)
    out = ours(x)
    assert ours.backward(dout) is None  # a container skips its first layer's dx unless asked
    assert rel(out, out_t.detach()) < 1e-12
    assert_grads_equal(ours, theirs, 1e-12)


# -- bad input ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(kernel_size=0), "kernel_size must be an int >= 1"),
        (dict(kernel_size=(3,)), "kernel_size must be an int >= 1 or a pair"),
        (dict(kernel_size=3, stride="2"), "stride must be"),
        (dict(kernel_size=3, padding=-1), "padding must be an int >= 0"),
        (dict(kernel_size=3, padding="full"), "padding must be 'same', 'valid'"),
        (dict(kernel_size=3, padding="same", stride=2), "padding='same' needs stride 1"),
        (dict(kernel_size=3, dilation=0), "dilation must be"),
        (dict(kernel_size=3, groups=4), "divisible by groups"),
        (dict(kernel_size=3, bias=1), "bias must be a bool"),
        (dict(kernel_size=3, padding_mode="reflect"), "padding_mode must be 'zeros'"),
    ],
)
def test_conv_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Conv2d(2, 6, **kwargs)
    with pytest.raises(ValueError, match="in_channels must be an int >= 1"):
        Conv2d(0, 2, 3)


def test_from_torch_refuses_what_it_cannot_convert():
    with pytest.raises(ValueError, match="padding_mode must be 'zeros'.*'reflect'"):
        from_torch(nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"))
    with pytest.raises(TypeError, match="Conv3d is not supported; supported: .*Conv2d"):
        from_torch(nn.Sequential(nn.Conv3d(1, 1, 1)))
    with pytest.raises(ValueError, match="return_indices must be False"):
        from_torch(nn.MaxPool2d(2, return_indices=True))


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: MaxPool2d(3, padding=2), "padding must be at most half"),
        (lambda: AvgPool2d(2, padding=2), "padding must be at most half"),
        (lambda: MaxPool2d(0), "kernel_size must be"),
        (lambda: MaxPool2d(2, stride=0), "stride must be"),
        (lambda: MaxPool2d(2, ceil_mode=1), "ceil_mode must be a bool"),
        (lambda: AvgPool2d(2, count_include_pad=None), "count_include_pad must be a bool"),
        (lambda: AvgPool2d(2, divisor_override=0), "divisor_override must be None or a non-zero int"),
        (lambda: Flatten(1.0), "start_dim must be an int"),
    ],
)
def test_pool_and_flatten_bad_constructor_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    "make",
    [lambda: Conv2d(3, 2, 3, dtype=f64), lambda: MaxPool2d(2), lambda: AvgPool2d(2)],
    ids=["conv", "maxpool", "avgpool"],
)
def test_bad_input_and_misuse_are_named(make):
    layer = make()
    name = type(layer).__name__
    with pytest.raises(TypeError, match=f"{name}.*x must be a torch.Tensor"):
        layer([1.0])
    with pytest.raises(
        ValueError,
        match=rf"{name}.*expected input of shape \(N, (3|C), H, W\) or, unbatched, "
        rf"\((3|C), H, W\), got \(3, 5\)",
    ):
        layer(torch.randn(3, 5, dtype=f64))
    with pytest.raises(ValueError, match=f"{name}.*too small|{name}.*smaller than"):
        layer(torch.randn(1, 3, 1, 1, dtype=f64))
    with pytest.raises(ValueError, match=f"{name}.*dtype"):
        layer(torch.randint(0, 3, (1, 3, 5, 5)))
    with pytest.raises(RuntimeError, match=f"{name}.*backward called before forward"):
        layer.backward(torch.randn(1, 2, 3, 3, dtype=f64))
    x = torch.randn(2, 3, 6, 6, dtype=f64)
    out = layer(x)
    with pytest.raises(ValueError, match=rf"{name}.*dout has shape \(2, 2\) but the forward output had shape"):
        layer.backward(torch.randn(2, 2, dtype=f64))
    with pytest.raises(ValueError, match=f"{name}.*dout has dtype torch.float32"):
        layer.backward(torch.randn(out.shape))
    layer.backward(torch.randn_like(out))
    with pytest.raises(RuntimeError, match="backward called before forward"):
        layer.backward(torch.randn_like(out))  # each backward consumes the forward's cache


def test_conv_refuses_wrong_channels_dtype_and_device():
    conv = Conv2d(3, 2, 3, dtype=f64)
    with pytest.raises(
        ValueError,
        match=r"expected input of shape \(N, 3, H, W\) or, unbatched, \(3, H, W\), got "
        r"\(1, 4, 5, 5\)",
    ):
        conv(torch.randn(1, 4, 5, 5, dtype=f64))
    with pytest.raises(
        ValueError,
        match=r"expected input of shape \(N, 3, H, W\) or, unbatched, \(3, H, W\), got "
        r"\(4, 5, 5\)",
    ):
        conv(torch.randn(4, 5, 5, dtype=f64))
    with pytest.raises(ValueError, match="input has dtype torch.float32 but weight has dtype torch.float64"):
        conv(torch.randn(1, 3, 5, 5))
    with pytest.raises(ValueError, match="input is on meta but weight is on cpu"):
        conv(torch.randn(1, 3, 5, 5, dtype=f64, device="meta"))


def test_flatten_bad_input():
    layer = Flatten(2, 3)
    with pytest.raises(ValueError, match=r"Flatten\(start_dim=2, end_dim=3\).*shape \(2, 3\)"):
        layer(torch.randn(2, 3))
    with pytest.raises(ValueError, match="start_dim first"):
        Flatten(2, 1)(torch.randn(2, 3, 4))
    with pytest.raises(RuntimeError, match="backward called before forward"):
        layer.backward(torch.randn(2, 3))


# -- CUDA -----------------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("cfg", CONV_CONFIGS[:4], ids=CONV_IDS[:4])
def test_conv_and_pools_on_cuda_equal_torch(cfg):
    dev = torch.device("cuda")
    ours, theirs = conv_pair(cfg)
    ours.to(device=dev), theirs.to(device=dev)
    x = conv_input(cfg).to(dev)
    xr = x.clone().requires_grad_()
    model_t = nn.Sequential(theirs, nn.MaxPool2d(2, ceil_mode=True), nn.AvgPool2d(1))
    model = Sequential(ours, MaxPool2d(2, ceil_mode=True), AvgPool2d(1))
    out_t = model_t(xr)
    dout = torch.randn_like(out_t)
    out_t.backward(dout)
    out = model(x)
    dx = model.backward(dout, need_input_grad=True)
    assert out.device.type == dx.device.type == "cuda"
    assert rel(out, out_t.detach()) < 1e-9 and rel(dx, xr.grad) < 1e-9
    assert rel(ours.weight.grad, theirs.weight.grad) < 1e-9

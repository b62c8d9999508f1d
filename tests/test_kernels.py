"""Every kernel (kernels/) tied to the textbook it replaces, the layer's own backward with the kernels off: float64 to
1e-12, float32 and bfloat16 within their rounding; the switch itself (HANDGRAD_KERNELS, ``kernels.disabled()``) and
the optimizers' flat path.  (Attention's, the recurrent layers' and the cells' kernels are tied to their textbooks in
tests/test_attention.py, tests/test_recurrent.py and tests/test_cells.py; the weight gradient's three forms to
autograd in tests/test_conv.py; the compiled kernels in tests/test_kernels_compiled.py.)"""

from __future__ import annotations

import contextlib

import pytest
import torch

import kernels
import optimizers
from kernels import convolution, cpp
from layers import GELU, BatchNorm1d, BatchNorm2d, Conv2d, Embedding, LayerNorm, Linear, MaxPool2d, ReLU, Sigmoid, Tanh
from losses import CrossEntropyLoss
from models import GPT
from tests.test_conv import CONV_CONFIGS, CONV_IDS

F64, F32, BF16 = torch.float64, torch.float32, torch.bfloat16
pytestmark = pytest.mark.usefixtures("kernels_on")  # "on" is on, whatever HANDGRAD_KERNELS says
TOL = {F64: 1e-12, F32: 2e-5, BF16: 2e-2}  # relative to the larger magnitude: float64 agrees to rounding, float32
# and bfloat16 to a few units of theirs through a sum of a few dozen terms


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a - b| relative to the larger magnitude; a nan must face a nan (and is then left out)."""
    a, b = a.double(), b.double()
    if not torch.equal(a.isnan(), b.isnan()):
        return float("inf")
    a, b = a.nan_to_num(0.0), b.nan_to_num(0.0)
    if a.numel() == 0:
        return 0.0
    scale = max(a.abs().max().item(), b.abs().max().item(), 1e-30)
    return ((a - b).abs().max() / scale).item()


def on_and_off(run):
    """``run()`` with the kernels on, then off (the textbook), each from the same seed -> the two results."""
    results = []
    for on in (True, False):
        with contextlib.nullcontext() if on else kernels.disabled():
            torch.manual_seed(0)
            results.append(run())
    return results


def assert_tied(run, dtype, tol=None):
    """The kernels' results equal the textbook's, tensor by tensor, within ``tol`` (the dtype's by default)."""
    fast, slow = on_and_off(run)
    assert len(fast) == len(slow)
    for i, (a, b) in enumerate(zip(fast, slow, strict=True)):
        assert (a is None) == (b is None), i
        if a is not None:
            assert a.shape == b.shape and a.dtype == b.dtype, (i, a.shape, b.shape)
            assert rel_err(a, b) < (tol or TOL[dtype]), (i, rel_err(a, b))


def layer_step(make, x, *, dtype, need_input_grad=True, dout_seed=1):
    """make() -> a layer; its output, dx and every parameter gradient for a seeded random dout."""

    def run():
        layer = make()
        out = layer(x)
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(dout_seed), dtype=F32).to(out.dtype)
        dx = layer.backward(dout, need_input_grad=need_input_grad)
        return [out, dx, *(p.grad for p in layer.parameters())]

    return run


def away_from_defaults(layer):
    """gamma away from 1, beta away from 0, running statistics away from 0 and 1: defaults can hide a term."""
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name in ("weight", "bias", "running_mean", "running_var"):
            t = getattr(layer, name, None)
            if t is not None:
                t.copy_(
                    (torch.rand(t.shape, generator=g) + 0.5)
                    if name in ("weight", "running_var")
                    else torch.randn(t.shape, generator=g)
                )
    return layer


# -- the switch ------------------------------------------------------------------------------------------------


def test_the_switch_reads_the_environment_and_refuses_a_bad_value(monkeypatch):
    for value, on in (("off", False), ("OFF", False), ("0", False), ("on", True), ("1", True)):
        monkeypatch.setenv("HANDGRAD_KERNELS", value)
        assert kernels._from_environment() is on
    monkeypatch.delenv("HANDGRAD_KERNELS")
    assert kernels._from_environment() is True
    monkeypatch.setenv("HANDGRAD_KERNELS", "fast")
    with pytest.raises(ValueError, match=r"HANDGRAD_KERNELS must be 'on' or 'off' \(or 1 / 0\), got 'fast'"):
        kernels._from_environment()


def test_disabled_is_a_context_and_enable_takes_a_bool():
    before = kernels.enabled()
    with kernels.disabled():
        assert not kernels.enabled()
        with kernels.disabled():
            assert not kernels.enabled()
        assert not kernels.enabled()
    assert kernels.enabled() is before
    with pytest.raises(TypeError, match="kernels.enable: on must be a bool, got 'off'"):
        kernels.enable("off")


def test_a_forward_under_one_setting_and_its_backward_under_the_other_agree():
    """What the forward kept decides the backward where the two differ (attention, the recurrent layers)."""
    from layers import LSTM, ScaledDotProductAttention

    q = k = v = torch.randn(2, 5, 4, dtype=F64)
    for layer, args in ((ScaledDotProductAttention(), (q, k, v)), (LSTM(4, 3, dtype=F64), (q,))):
        ref = layer(*args)
        ref = ref[0] if isinstance(ref, tuple) else ref
        expected = layer.backward(torch.ones_like(ref))
        with kernels.disabled():
            layer(*args)
        got = layer.backward(torch.ones_like(ref))
        for a, b in zip(
            got if isinstance(got, tuple) else (got,),
            expected if isinstance(expected, tuple) else (expected,),
            strict=True,
        ):
            assert rel_err(a, b) < 1e-12


# -- the element-wise activations -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F64, F32, BF16])
@pytest.mark.parametrize(
    "make",
    [ReLU, lambda: GELU(), lambda: GELU("tanh"), Tanh, Sigmoid],
    ids=["relu", "gelu", "gelu-tanh", "tanh", "sigmoid"],
)
def test_activation_kernels_equal_the_textbook(make, dtype):
    x = torch.randn(6, 5, 40, dtype=F64) * 3
    sub = torch.finfo(dtype).tiny * torch.finfo(dtype).eps  # the smallest subnormal
    x[0, 0, :8] = torch.tensor([0.0, -0.0, 12.0, -12.0, sub, -3 * sub, 7 * sub, -40.0])  # the kink, tails, subnormals
    assert_tied(layer_step(make, x.to(dtype), dtype=dtype), dtype)


# -- Linear and Embedding: the weight gradient into .grad in place ------------------------------------------------


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("shape,bias,need_dx", [((7, 6), True, True), ((2, 3, 6), False, True), ((5, 6), True, False)])
def test_linear_kernel_equals_the_textbook(shape, bias, need_dx, dtype):
    x = torch.randn(*shape, dtype=dtype)
    assert_tied(
        layer_step(lambda: Linear(6, 4, bias=bias, dtype=dtype), x, dtype=dtype, need_input_grad=need_dx), dtype
    )


def test_linear_kernel_adds_into_grad_in_place_and_skips_a_frozen_weight():
    lin = Linear(6, 4, dtype=F64)
    x, d = torch.randn(5, 6, dtype=F64), torch.randn(5, 4, dtype=F64)
    lin(x)
    lin.backward(d)
    grad = lin.weight.grad
    lin(x)
    lin.backward(d)
    assert lin.weight.grad is grad and rel_err(grad, 2 * d.t() @ x) < 1e-14
    lin.weight.requires_grad_(False)
    lin(x)
    lin.backward(d)
    assert rel_err(lin.weight.grad, 2 * d.t() @ x) < 1e-14  # untouched


@pytest.mark.parametrize("padding_idx", [None, 1])
def test_embedding_kernel_equals_the_textbook(padding_idx):
    idx = torch.tensor([[1, 2, 1, 6], [0, 1, 2, 2]])  # repeated ids add up
    assert_tied(layer_step(lambda: Embedding(7, 3, padding_idx=padding_idx, dtype=F64), idx, dtype=F64), F64)


# -- the norms -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize(
    "shape,normalized,kw",
    [
        ((4, 7, 24), 24, {}),
        ((4, 7, 24), 24, {"bias": False}),
        ((5, 3, 6), (3, 6), {}),
        ((3, 8), 8, {"elementwise_affine": False}),
    ],
)
def test_layer_norm_kernel_equals_the_textbook(shape, normalized, kw, dtype):
    x = torch.randn(*shape, dtype=dtype) * 2 + 0.5
    make = lambda: away_from_defaults(LayerNorm(normalized, dtype=dtype, **kw))  # noqa: E731
    assert_tied(layer_step(make, x, dtype=dtype), dtype)
    assert_tied(layer_step(make, x, dtype=dtype, need_input_grad=False), dtype)


def test_layer_norm_kernel_equals_the_textbook_for_a_half_precision_input():
    x = (torch.randn(4, 7, 24) * 2 + 0.5).to(BF16)
    assert_tied(layer_step(lambda: away_from_defaults(LayerNorm(24)), x, dtype=BF16), BF16)


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize(
    "make,shape",
    [
        (lambda d: BatchNorm1d(5, dtype=d), (9, 5)),
        (lambda d: BatchNorm1d(5, dtype=d), (4, 5, 3)),
        (lambda d: BatchNorm2d(3, dtype=d), (4, 3, 5, 6)),
        (lambda d: BatchNorm2d(3, affine=False, dtype=d), (4, 3, 5, 6)),
        (lambda d: BatchNorm2d(3, track_running_stats=False, dtype=d), (2, 3, 2, 2)),
    ],
    ids=["1d", "1d-seq", "2d", "2d-no-affine", "2d-no-running"],
)
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_batch_norm_kernel_equals_the_textbook(make, shape, train, dtype):
    x = torch.randn(*shape, dtype=dtype) * 2 + 0.5
    for need_dx in (True, False):
        assert_tied(
            layer_step(lambda: away_from_defaults(make(dtype)).train(train), x, dtype=dtype, need_input_grad=need_dx),
            dtype,
        )


def test_batch_norm_kernel_equals_the_textbook_for_a_half_precision_input():
    x = (torch.randn(4, 3, 5, 6) * 2 + 0.5).to(BF16)
    assert_tied(layer_step(lambda: away_from_defaults(BatchNorm2d(3)), x, dtype=BF16), BF16)


# -- cross-entropy --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F64, F32, BF16])
@pytest.mark.parametrize(
    "target,kw",
    [
        ("index", {}),
        ("index", {"label_smoothing": 0.2}),
        ("index", {"reduction": "sum"}),
        ("ignored", {}),
        ("ignored", {"label_smoothing": 0.1}),
        ("all ignored", {}),
        ("probabilities", {}),
        ("probabilities", {"label_smoothing": 0.3}),
        ("positions", {}),
    ],
)
def test_cross_entropy_kernel_equals_the_textbook(target, kw, dtype):
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(9, 5, generator=g, dtype=F64) * 4).to(dtype)
    y = torch.randint(0, 5, (9,), generator=g)
    if target == "ignored":
        y[2] = y[5] = -100
    elif target == "all ignored":
        y[:] = -100
    elif target == "probabilities":
        y = torch.softmax(torch.randn(9, 5, generator=g, dtype=F64), 1).to(dtype)
    elif target == "positions":  # (N, C, d): a class score per position
        logits, y = logits.view(3, 3, 5).transpose(1, 2).contiguous(), y.view(3, 3)

    def run():
        crit = CrossEntropyLoss(**kw)
        return [crit(logits, y), crit.backward(0.7)]

    assert_tied(run, dtype)


# -- convolution and pooling --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("cfg", CONV_CONFIGS, ids=CONV_IDS)
def test_conv_kernels_equal_the_im2col_textbook(cfg, dtype):
    cin, cout, k, s, p, d, g, bias, (n, h, w) = cfg
    x = torch.randn(n, cin, h, w, dtype=dtype)
    assert_tied(layer_step(lambda: Conv2d(cin, cout, k, s, p, d, g, bias, dtype=dtype), x, dtype=dtype), dtype)


def test_conv_kernels_equal_the_textbook_unbatched_and_empty():
    for x in (torch.randn(3, 6, 7, dtype=F64), torch.randn(0, 3, 6, 7, dtype=F64)):
        assert_tied(layer_step(lambda: Conv2d(3, 4, 3, padding=1, dtype=F64), x, dtype=F64), F64)


@pytest.mark.parametrize("channels", [3, 8, 16])
@pytest.mark.parametrize(
    "pool",
    [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True), dict(kernel_size=2, dilation=2)],
    ids=["2x2", "3x3-s2-p1-ceil", "dilated"],
)
def test_max_pool_kernel_equals_the_textbook_on_ties_and_nans(pool, channels):
    """The kernel takes 8 channels or more through the channels-last pooling kernel: the same maxima, argmaxes
    (the first on a tie) and gradients as the plane kernel the textbook calls."""
    x = torch.randn(2, channels, 9, 8, dtype=F64).round()  # many ties
    x[0, 0, 0, 0] = float("nan")
    assert_tied(layer_step(lambda: MaxPool2d(**pool), x, dtype=F64), F64)
    fast, slow = on_and_off(lambda: [MaxPool2d(**pool)(x), None])
    assert torch.equal(fast[0].nan_to_num(), slow[0].nan_to_num())


def test_relu_then_max_pool_kernel_equals_the_two_textbook_backwards():
    from layers import Sequential

    x = torch.randn(4, 8, 7, 7, dtype=F64)
    x[0] = 0.0  # ties: ReLU's zeros

    def run():
        model = Sequential(Conv2d(8, 8, 3, padding=1, dtype=F64), ReLU(), MaxPool2d(3, 2, 1))
        out = model(x)
        dx = model.backward(
            torch.randn(out.shape, generator=torch.Generator().manual_seed(4), dtype=F64), need_input_grad=True
        )
        return [out, dx, *(p.grad for p in model.parameters())]

    assert_tied(run, F64)


def test_the_relu_max_pool_kernel_runs_only_where_its_inputs_are_unchanged():
    relu, pool = ReLU(), MaxPool2d(2)
    out = pool(relu(torch.randn(2, 3, 4, 4, dtype=F64)))
    with torch.no_grad():
        out.add_(1.0)  # a following in-place layer changed the pool's output: the mask would not be out > 0
    assert convolution.relu_max_pool_backward(pool, relu, torch.ones_like(out)) is None
    assert relu.kept is not None and pool.kept is not None  # nothing consumed
    out = pool(relu(torch.randn(2, 3, 4, 4, dtype=F64)))
    assert convolution.relu_max_pool_backward(pool, relu, torch.ones(2, 3, 2, 3, dtype=F64)) is None  # wrong dout


# -- optimizers: the flat path ----------------------------------------------------------------------------------


@pytest.mark.parametrize("opt", ["AdamW", "SGD"])
def test_the_optimizers_flat_path_equals_their_per_tensor_textbook(opt):
    """The GPT lays its parameters and gradients out in one block each, which the kernels update with one kernel per
    step; with the kernels off each tensor is updated alone: the same weights after three steps, clipped too.  (The
    backwards run with the kernels on both times: this is the optimizer's kernel alone.  The C++ update is off both
    times: it rounds sqrt correctly where ATen's vectorised sqrt is within an ulp, differences Adam amplifies over
    steps; tests/test_kernels_cpp.py ties it to the textbook step by step.)"""
    results = []
    for on in (True, False):
        torch.manual_seed(0)
        model = GPT(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=16, dtype=F64)
        optim = getattr(optimizers, opt)(model.parameters(), lr=0.1, **({"momentum": 0.9} if opt == "SGD" else {}))
        crit, g = CrossEntropyLoss(), torch.Generator().manual_seed(1)
        for _ in range(3):
            idx, y = torch.randint(0, 13, (3, 8), generator=g), torch.randint(0, 13, (3, 8), generator=g)
            optim.zero_grad(set_to_none=False)
            logits = model(idx)
            crit(logits.view(-1, 13), y.view(-1))
            model.backward(crit.backward().view_as(logits))
            with contextlib.nullcontext() if on else kernels.disabled(), cpp.disabled():
                optimizers.clip_grad_norm_(model.parameters(), 0.5)
                optim.step()
        results.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*results, strict=True):
        assert rel_err(a, b) < 1e-13

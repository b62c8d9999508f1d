"""GELU's Triton kernels (kernels/triton/gelu.py): both forms against the layer's formulas in float64 and float32,
against F.gelu with autograd in every dtype, strided and padded inputs, and bad input.
Run with `pytest -m triton` (tests/triton_support.py: where they run, what the guard checks)."""

import math

import pytest
import torch
import torch.nn.functional as F

from tests.triton_support import assert_close, assert_padding_kept, device, load, padded

# exp(-2u) overflows to inf for very negative x, on purpose (s = 1 / (1 + inf) = 0): numpy says so in the interpreter
pytestmark = [pytest.mark.triton, pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")]
f64, f32 = torch.float64, torch.float32
FORMS = ["none", "tanh"]


@pytest.fixture(scope="module")
def G():
    return load("gelu")


def textbook(x, approximate):
    """(out, dout/dx) of GELU as layers.GELU's docstring writes them, in x's dtype."""
    if approximate == "tanh":
        c = math.sqrt(2 / math.pi)
        t = torch.tanh(c * (x + 0.044715 * x**3))
        return x / 2 * (1 + t), (1 + t) / 2 + x / 2 * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x)
    cdf = (1 + torch.erf(x / math.sqrt(2))) / 2
    return x * cdf, cdf + x * torch.exp(-x * x / 2) / math.sqrt(2 * math.pi)


def inputs(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=f64) * 3
    x.view(-1)[:6] = torch.tensor([-40.0, -9.0, -1e-3, 0.0, 9.0, 40.0])[: x.numel()]  # both tails and zero
    dout = torch.randn(shape, generator=g, dtype=f64)
    return x.to(dtype).to(device()), dout.to(dtype).to(device())


@pytest.mark.parametrize("approximate", FORMS)
@pytest.mark.parametrize("dtype,tol", [(f64, 1e-13), (f32, 4e-6)])
def test_equals_the_formula(G, guard, approximate, dtype, tol):
    """float64: the interpreter computes in float64, so only rounding separates kernel and formula (~1e-16);
    float32 against the float64 formula: a few units in float32's last place (the slope at |x| ~ 2-9 is the worst)."""
    x, dout = inputs((5, 37), dtype)
    out, slope = textbook(x.double(), approximate)
    assert_close("out", G.gelu_forward(x, approximate=approximate), out, tol)
    assert_close("dx", G.gelu_backward(dout, x, approximate=approximate), dout.double() * slope, tol)
    guard.expect(launches=2)


@pytest.mark.parametrize("approximate", FORMS)
@pytest.mark.parametrize("dtype,tol", [(f64, 1e-13), (f32, 4e-6), (torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_equals_torch_autograd(G, guard, approximate, dtype, tol):
    """F.gelu's forward and its autograd backward (a random upstream gradient), in the input's dtype."""
    x, dout = inputs((3, 4, 9), dtype, seed=1)
    xr = x.clone().requires_grad_()
    ref = F.gelu(xr, approximate=approximate)
    ref.backward(dout)
    out = G.gelu_forward(x, approximate=approximate)
    assert out.dtype == dtype and out.shape == x.shape
    assert_close("out", out, ref, tol)
    assert_close("dx", G.gelu_backward(dout, x, approximate=approximate), xr.grad, tol)


@pytest.mark.parametrize("approximate", FORMS)
def test_strides_are_read_not_assumed(G, guard, approximate):
    """Inputs inside buffers of NaN sentinels (every stride widened), and transposed ones: the same bits as
    contiguous inputs, and not one sentinel read or written."""
    x, dout = inputs((6, 21), f32, seed=2)
    expected = G.gelu_forward(x, approximate=approximate), G.gelu_backward(dout, x, approximate=approximate)
    xp, xbuf, xpad = padded(x)
    dp, dbuf, dpad = padded(dout)
    assert not xp.is_contiguous()
    got = G.gelu_forward(xp, approximate=approximate), G.gelu_backward(dp, xp, approximate=approximate)
    for name, a, b in zip(("out", "dx"), got, expected, strict=True):
        assert torch.equal(a, b), f"{name} from padded inputs differs from contiguous inputs'"
    assert_padding_kept("x's buffer", xbuf, xpad)
    assert_padding_kept("dout's buffer", dbuf, dpad)
    xt, dt = x.t().contiguous().t(), dout.t().contiguous().t()  # column-major: the last stride is not 1
    assert torch.equal(G.gelu_backward(dt, xt, approximate=approximate), expected[1])


def test_small_and_empty_shapes(G, guard):
    """Sizes of 1 (which a GPU compiles as constants), a 0-d tensor, and no elements at all."""
    for shape in [(1, 1), (7, 1), (1, 7), ()]:
        x, dout = inputs(shape, f64, seed=3)
        ref, slope = textbook(x, "none")
        assert_close(f"out {shape}", G.gelu_forward(x), ref, 1e-13)
        assert_close(f"dx {shape}", G.gelu_backward(dout, x), dout * slope, 1e-13)
    empty = torch.zeros(0, 5, device=device())
    assert G.gelu_forward(empty).shape == (0, 5)


def test_bad_input_is_refused(G):
    x = torch.randn(3, 4, device=device())
    with pytest.raises(ValueError, match="approximate"):
        G.gelu_forward(x, approximate="erf")
    with pytest.raises(ValueError, match="dout must have x's shape"):
        G.gelu_backward(torch.randn(4, 3, device=device()), x)
    with pytest.raises(ValueError, match="must be one of"):
        G.gelu_forward(torch.ones(3, dtype=torch.int64, device=device()))
    with pytest.raises(TypeError, match="torch.Tensor"):
        G.gelu_forward([1.0, 2.0])

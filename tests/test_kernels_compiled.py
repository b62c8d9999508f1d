"""The compiled kernels (kernels/compiled.py): each equal to the eager kernel and to the layer's textbook, in float64
and float32; used only where one can serve; a kernel that cannot be compiled warns once and the eager kernel runs;
the GPT's steps are the same with them; a compiled step stays one graph.  (Slow: each kernel is compiled once.)"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

import kernels
from kernels import compiled, cpp
from layers import GELU, LayerNorm
from layers.template import recording_graph
from losses import CrossEntropyLoss
from models import GPT
from optimizers import SGD
from tests.test_kernels import BF16, F32, F64, TOL, away_from_defaults, rel_err

pytestmark = pytest.mark.usefixtures("kernels_on", "no_cpp_kernels")  # "on" is on, whatever HANDGRAD_KERNELS says


@pytest.fixture
def no_cpp_kernels():
    """The C++ kernels off: where built they run before the compiled ones, whose tests these are."""
    with cpp.disabled():
        yield


def backward_compiled_eager_textbook(make, x, dout):
    """The layer's (dx, {name: grad}) with the compiled kernels on, the eager kernels, and the textbook."""
    results = []
    for ctx in (compiled.kernels(True), contextlib.nullcontext(), kernels.disabled()):
        with ctx:
            layer = make()
            layer(x)
            dx = layer.backward(dout)
        results.append((dx, {n: p.grad for n, p in layer.named_parameters()}))
    return results


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_the_compiled_gelu_kernel_equals_the_eager_kernel_and_the_textbook(approximate, dtype):
    torch.manual_seed(0)
    x = torch.randn(6, 5, 40, dtype=dtype) * 3
    sub = torch.finfo(dtype).tiny * torch.finfo(dtype).eps  # the smallest subnormal
    x[0, 0, :7] = torch.tensor([0.0, -0.0, 12.0, -12.0, sub, -3 * sub, 7 * sub], dtype=dtype)  # 0, tails, subnormals
    dout = torch.randn_like(x)
    (kernel, _), (eager, _), (textbook, _) = backward_compiled_eager_textbook(lambda: GELU(approximate), x, dout)
    assert rel_err(kernel, eager) < TOL[dtype] and rel_err(kernel, textbook) < TOL[dtype]
    if approximate == "none":  # the kernel's expression itself, eagerly, is the same formula
        assert rel_err(compiled.gelu_backward_math(x, torch.nn.functional.gelu(x), dout), textbook) < TOL[dtype]
    else:
        assert rel_err(compiled.gelu_tanh_backward_math(x, dout), textbook) < TOL[dtype]
    assert (kernel[0, 0, 4:7] == 0.5 * dout[0, 0, 4:7]).all()  # Phi = 1/2 at a subnormal x, through the kernel too


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize(
    "shape,normalized,bias", [((4, 7, 24), 24, True), ((4, 7, 24), 24, False), ((5, 3, 6), (3, 6), True)]
)
def test_the_compiled_layer_norm_kernel_equals_the_eager_kernel_and_the_textbook(shape, normalized, bias, dtype):
    torch.manual_seed(1)
    x = torch.randn(*shape, dtype=dtype) * 2 + 0.5
    dout = torch.randn_like(x)
    runs = backward_compiled_eager_textbook(
        lambda: away_from_defaults(LayerNorm(normalized, bias=bias, dtype=dtype)), x, dout
    )
    (dx0, g0) = runs[0]
    assert g0.keys() == ({"weight", "bias"} if bias else {"weight"})
    for dx, grads in runs[1:]:
        assert rel_err(dx0, dx) < TOL[dtype]
        for name in g0:
            assert g0[name].shape == grads[name].shape and rel_err(g0[name], grads[name]) < TOL[dtype], name


def _refusing_call(name, math_fn, *args):
    raise AssertionError(f"the kernel {name} was called")


def test_the_eager_kernel_runs_where_a_compiled_one_cannot_serve(monkeypatch):
    monkeypatch.setattr(compiled, "call", _refusing_call)
    x = torch.randn(3, 8, dtype=F64)
    for layer in (GELU(), LayerNorm(8, dtype=F64)):  # compiled kernels off (the default)
        layer(x)
        layer.backward(torch.ones_like(x))
    with compiled.kernels():
        half = LayerNorm(8)
        half(x.to(BF16))  # half precision: xhat kept, the eager kernel
        half.backward(torch.ones(3, 8, dtype=BF16))
        ln = LayerNorm(8, dtype=F64)
        ln(x)
        assert ln.backward(torch.ones_like(x), need_input_grad=False) is None  # dweight, dbias only
        xr = x.clone().requires_grad_()
        with recording_graph():  # autograd recording the layers' math (gradcheck's oracle)
            g = GELU()
            g(xr)
            assert g.backward(torch.ones_like(x)).requires_grad
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False):  # a dispatch mode: torch.compile would run no compiled frame under it
            g = GELU()
            g(x)
            g.backward(torch.ones_like(x))
        with kernels.disabled():  # the kernels off: the textbook, compiled ones included
            g = GELU()
            g(x)
            g.backward(torch.ones_like(x))
    assert not compiled.enabled()


def test_a_kernel_that_cannot_compile_warns_once_and_the_eager_kernel_runs(monkeypatch):
    def broken(fn, **kw):
        def kernel(*args):
            raise RuntimeError("no C++ compiler\nmore")

        return kernel

    monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.setattr(compiled, "_compiled", {})
    x, dout = torch.randn(4, 6, dtype=F64), torch.randn(4, 6, dtype=F64)
    plain = GELU()
    plain(x)
    expected = plain.backward(dout)
    with compiled.kernels():
        g = GELU()
        with pytest.warns(
            RuntimeWarning,
            match=r"compiled kernel gelu_backward could not be compiled \(RuntimeError: "
            r"no C\+\+ compiler\); the eager kernel runs instead",
        ):
            g(x)
            assert torch.equal(g.backward(dout), expected)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once: the next call goes straight to the eager kernel
            g(x)
            assert torch.equal(g.backward(dout), expected)


def _gpt_run(on: bool, steps: int = 3):
    """The GPT's weights after ``steps`` SGD-with-momentum steps, and each step's gradients, compiled kernels on or
    off."""
    torch.manual_seed(0)
    V, B, T = 13, 3, 8
    model = GPT(vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=16, dtype=F64)
    opt, crit = SGD(model.parameters(), lr=0.1, momentum=0.9), CrossEntropyLoss()
    g = torch.Generator().manual_seed(1)
    idx, y = torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g)
    grads = []
    with compiled.kernels(on):
        for _ in range(steps):
            opt.zero_grad()
            logits = model(idx)
            crit(logits.view(-1, V), y.view(-1))
            model.backward(crit.backward().view_as(logits))
            grads.append([p.grad.clone() for p in model.parameters()])
            opt.step()
    return [p.detach().clone() for p in model.parameters()], grads


def test_the_gpt_steps_with_the_compiled_kernels_equal_the_steps_without():
    """Every step's gradients and the weights after three steps, to float64's rounding.  (SGD, not Adam: Adam divides
    each gradient by its own running size, which turns a rounding difference in a near-zero gradient into one of
    the learning rate's size, and so would measure Adam, not the kernels.)"""
    (w_on, g_on), (w_off, g_off) = _gpt_run(True), _gpt_run(False)
    for step_on, step_off in zip(g_on, g_off, strict=True):
        for a, b in zip(step_on, step_off, strict=True):
            assert rel_err(a, b) < 1e-13
    for a, b in zip(w_on, w_off, strict=True):
        assert rel_err(a, b) < 1e-13


def test_a_compiled_step_with_the_compiled_kernels_on_stays_one_graph_of_the_eager_kernels(monkeypatch):
    import torch._dynamo
    from torch._dynamo.utils import counters

    monkeypatch.setattr(compiled, "call", _refusing_call)  # while compiling, the eager kernel is traced
    torch.manual_seed(0)
    ln = LayerNorm(8, dtype=F64)
    g = GELU()
    x = torch.randn(5, 8, dtype=F64)

    def step():
        ln.zero_grad()
        out = g(ln(x))
        return ln.backward(g.backward(torch.ones_like(out)))

    expected = step()
    torch._dynamo.reset()
    counters.clear()
    with compiled.kernels():
        got = torch.compile(step, fullgraph=True, backend="aot_eager")()
    assert counters["stats"]["unique_graphs"] == 1
    assert rel_err(got, expected) < 1e-13

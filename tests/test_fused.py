"""The fused kernels (layers/fused.py) compute what the layers' plain math computes: GELU's and LayerNorm's backward
through a kernel equal the same layer's backward without it, in float64 and float32; the layers use the plain math
wherever a kernel cannot serve (kernels off, autograd recording, half precision, no dx wanted, a compiled step);
a kernel that cannot be compiled says so once and the plain math runs; the GPT's step is the same with them."""
from __future__ import annotations

import warnings

import pytest
import torch

from layers import GELU, LayerNorm, fused
from layers.template import recording_graph
from losses import CrossEntropyLoss
from models import GPT
from optimizers import SGD

F64, F32 = torch.float64, torch.float32
TOL = {F64: 1e-13, F32: 2e-6}  # relative to the largest value: float64 agrees to rounding, float32 to a few ulps


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-8)).item()


def backward_both(make, x, dout):
    """The layer's (dx, {name: grad}) with the kernels off, then on: two layers of the same weights."""
    results = []
    for on in (False, True):
        layer = make()
        with fused.kernels(on):
            layer(x)
            dx = layer.backward(dout)
        results.append((dx, {n: p.grad for n, p in layer.named_parameters()}))
    return results


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_backward_through_the_kernel_equals_the_plain_math(approximate, dtype):
    torch.manual_seed(0)
    x = torch.randn(6, 5, 40, dtype=dtype) * 3
    sub = torch.finfo(dtype).tiny * torch.finfo(dtype).eps  # the smallest subnormal
    x[0, 0, :7] = torch.tensor([0.0, -0.0, 12.0, -12.0, sub, -3 * sub, 7 * sub], dtype=dtype)  # 0, tails, subnormals
    dout = torch.randn_like(x)
    (plain, _), (kernel, _) = backward_both(lambda: GELU(approximate), x, dout)
    assert rel_err(kernel, plain) < TOL[dtype], rel_err(kernel, plain)
    # the kernel's expression itself, eagerly, is the same formula as the layer's
    if approximate == "none":
        assert rel_err(fused.gelu_backward_math(x, torch.nn.functional.gelu(x), dout), plain) < TOL[dtype]
    else:
        assert rel_err(fused.gelu_tanh_backward_math(x, dout), plain) < TOL[dtype]
    assert (kernel[0, 0, 4:7] == 0.5 * dout[0, 0, 4:7]).all()  # Phi = 1/2 at a subnormal x, through the kernel too


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("shape,normalized,bias", [((4, 7, 24), 24, True), ((4, 7, 24), 24, False),
                                                   ((5, 3, 6), (3, 6), True)])
def test_layer_norm_backward_through_the_kernel_equals_the_plain_math(shape, normalized, bias, dtype):
    torch.manual_seed(1)
    x = torch.randn(*shape, dtype=dtype) * 2 + 0.5
    dout = torch.randn_like(x)

    def make():
        ln = LayerNorm(normalized, bias=bias, dtype=dtype)
        g = torch.Generator().manual_seed(2)  # gamma away from 1, beta away from 0
        with torch.no_grad():
            ln.weight.copy_(torch.rand(ln.weight.shape, generator=g, dtype=dtype) + 0.5)
            if ln.bias is not None:
                ln.bias.copy_(torch.randn(ln.bias.shape, generator=g, dtype=dtype))
        return ln
    (dx0, g0), (dx1, g1) = backward_both(make, x, dout)
    assert rel_err(dx1, dx0) < TOL[dtype]
    assert g0.keys() == g1.keys() == ({"weight", "bias"} if bias else {"weight"})
    for name in g0:
        assert g1[name].shape == g0[name].shape and rel_err(g1[name], g0[name]) < TOL[dtype], name


def _refusing_call(name, math_fn, *args):
    raise AssertionError(f"the kernel {name} was called")


def test_the_plain_math_runs_where_a_kernel_cannot_serve(monkeypatch):
    monkeypatch.setattr(fused, "call", _refusing_call)
    x = torch.randn(3, 8, dtype=F64)
    for layer in (GELU(), LayerNorm(8, dtype=F64)):  # kernels off (the default)
        layer(x)
        layer.backward(torch.ones_like(x))
    with fused.kernels():
        half = LayerNorm(8)
        half(x.to(torch.bfloat16))  # half precision: xhat kept, the plain math
        half.backward(torch.ones(3, 8, dtype=torch.bfloat16))
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
    assert not fused.enabled()


def test_a_kernel_that_cannot_compile_warns_once_and_the_plain_math_runs(monkeypatch):
    def broken(fn, **kw):
        def kernel(*args):
            raise RuntimeError("no C++ compiler\nmore")
        return kernel
    monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.setattr(fused, "_compiled", {})
    x, dout = torch.randn(4, 6, dtype=F64), torch.randn(4, 6, dtype=F64)
    plain = GELU()
    plain(x)
    expected = plain.backward(dout)
    with fused.kernels():
        g = GELU()
        with pytest.warns(RuntimeWarning, match=r"fused kernel gelu_backward could not be compiled \(RuntimeError: "
                                                r"no C\+\+ compiler\); the layer's plain math runs instead"):
            g(x)
            assert torch.equal(g.backward(dout), expected)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once: the next call goes straight to the plain math
            g(x)
            assert torch.equal(g.backward(dout), expected)


def _gpt_run(on: bool, steps: int = 3):
    """The GPT's weights after ``steps`` SGD-with-momentum steps, and each step's gradients, kernels on or off."""
    torch.manual_seed(0)
    V, B, T = 13, 3, 8
    model = GPT(vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=16, dtype=F64)
    opt, crit = SGD(model.parameters(), lr=0.1, momentum=0.9), CrossEntropyLoss()
    g = torch.Generator().manual_seed(1)
    idx, y = torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g)
    grads = []
    with fused.kernels(on):
        for _ in range(steps):
            opt.zero_grad()
            logits = model(idx)
            crit(logits.view(-1, V), y.view(-1))
            model.backward(crit.backward().view_as(logits))
            grads.append([p.grad.clone() for p in model.parameters()])
            opt.step()
    return [p.detach().clone() for p in model.parameters()], grads


def test_the_gpt_steps_with_the_kernels_equal_the_steps_without():
    """Every step's gradients and the weights after three steps, to float64's rounding.  (SGD, not Adam: Adam divides
    each gradient by its own running size, which turns a rounding difference in a near-zero gradient into one of
    the learning rate's size, and so would measure Adam, not the kernels.)"""
    (w_on, g_on), (w_off, g_off) = _gpt_run(True), _gpt_run(False)
    for step_on, step_off in zip(g_on, g_off):
        for a, b in zip(step_on, step_off):
            assert rel_err(a, b) < 1e-13
    for a, b in zip(w_on, w_off):
        assert rel_err(a, b) < 1e-13


def test_a_compiled_step_with_the_kernels_on_stays_one_graph_of_the_plain_math(monkeypatch):
    import torch._dynamo
    from torch._dynamo.utils import counters
    monkeypatch.setattr(fused, "call", _refusing_call)  # while compiling, the plain math is traced
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
    with fused.kernels():
        got = torch.compile(step, fullgraph=True, backend="aot_eager")()
    assert counters["stats"]["unique_graphs"] == 1
    assert rel_err(got, expected) < 1e-13

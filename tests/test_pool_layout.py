"""MaxPool2d may run its forward through ATen's channels-last kernel on CPU: it must give exactly what the
(N, C, H, W) kernel gives -- the same maxima, the same argmax on ties and NaNs (so the same gradient) -- and
give the output back in the input's layout."""

import pytest
import torch
import torch.nn.functional as F

from layers import MaxPool2d, ReLU, Sequential

CONFIGS = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=1, padding=1),
    dict(kernel_size=(3, 2), stride=(1, 2), padding=(1, 0), dilation=(1, 2)),
    dict(kernel_size=3, stride=2, ceil_mode=True),
]


@pytest.mark.parametrize("channels", [9, 5], ids=["through channels-last", "plane kernel (few channels)"])
@pytest.mark.parametrize("kw", CONFIGS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_max_pool_equals_the_plane_kernel_on_ties_and_nans(kw, dtype, channels, monkeypatch, kernels_on):
    seen = []  # the layout each pool's input had
    real = F.max_pool2d
    monkeypatch.setattr(F, "max_pool2d", lambda x, *a, **k: seen.append(x.is_contiguous()) or real(x, *a, **k))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 3, (3, channels, 9, 10), generator=g).to(dtype)  # three values: ties in most windows
    x[0, 1, 2, 3] = x[2, 4, 7, 1] = float("nan")
    layer = MaxPool2d(**kw)
    out = layer(x)
    assert seen == [channels < 8]  # the layer's own call: channels-last from 8 channels, else the plane kernel
    want, idx = real(x, layer._k, layer._s, layer._p, layer._dilation, layer.ceil_mode, return_indices=True)
    assert out.is_contiguous() and torch.equal(out.isnan(), want.isnan())
    assert torch.equal(out.nan_to_num(), want.nan_to_num()) and torch.equal(layer._saved.idx, idx)
    dout = torch.randn(out.shape, generator=g, dtype=dtype)
    want_dx = torch.zeros_like(x).flatten(2).scatter_add_(2, idx.flatten(2), dout.flatten(2)).view(x.shape)
    assert torch.equal(layer.backward(dout), want_dx)


def test_relu_max_pool_backward_equals_autograd_in_float64():
    x = torch.randn(4, 6, 8, 8, dtype=torch.float64)
    xr = x.clone().requires_grad_()
    out_t = F.max_pool2d(torch.relu(xr), 2)
    dout = torch.randn_like(out_t)
    out_t.backward(dout)
    net = Sequential(ReLU(), MaxPool2d(2))
    assert torch.equal(net(x), out_t.detach())
    assert torch.equal(net.backward(dout, need_input_grad=True), xr.grad)

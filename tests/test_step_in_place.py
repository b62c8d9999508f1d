"""A whole training step without host traffic, and gradient buffers that stay put.

Host traffic: forward, loss, backward and a capturable optimizer step of each model kind run on the
"meta" device under ``HostTraffic`` (tests/conftest.py), which records every read-back to the host and
every CPU tensor handed to an op -- what breaks CUDA-graph capture.  Buffers: with
``zero_grad(set_to_none=False)`` every ``.grad`` keeps its storage from step to step, and the gradients
equal those of the set_to_none=True path.
"""

import pytest
import torch

import layers as L
import losses.cross_entropy as ce
import optimizers as hg
from losses import CrossEntropyLoss, MSELoss
from models import Net
from tests.conftest import HostTraffic
from training.impls.models import cnn

f64 = torch.float64

# the fast path itself is under test, whatever HANDGRAD_KERNELS says
pytestmark = pytest.mark.usefixtures("kernels_on")


def mlp(device=None, dtype=None):
    return Net(hidden_size=16, device=device, dtype=dtype)


def norm_mlp(device=None, dtype=None):
    return L.Sequential(
        L.Linear(12, 12, device=device, dtype=dtype),
        L.LayerNorm(12, device=device, dtype=dtype),
        L.GELU(),
        L.SiLU(),
        L.LeakyReLU(),
        L.Tanh(),
        L.Sigmoid(),
        L.Dropout(0.3),
        L.Linear(12, 12, device=device, dtype=dtype),
        L.BatchNorm1d(12, device=device, dtype=dtype),
        L.ReLU(),
        L.Linear(12, 10, device=device, dtype=dtype),
    )


def small_cnn(device=None, dtype=None):
    return L.Sequential(
        L.Conv2d(1, 4, 3, padding="same", device=device, dtype=dtype),
        L.BatchNorm2d(4, device=device, dtype=dtype),
        L.ReLU(),
        L.AvgPool2d(2),
        L.MaxPool2d(2, ceil_mode=True),
        L.Flatten(),
        L.Linear(4 * 4 * 4, 10, device=device, dtype=dtype),
    )


MODELS = {
    "Net": (mlp, (8, 784)),
    "norm-mlp": (norm_mlp, (8, 12)),
    "small-cnn": (small_cnn, (2, 1, 16, 16)),
    "train.py cnn": (lambda device=None, dtype=None: cnn(device=device, dtype=dtype), (2, 1, 28, 28)),
}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("opt_name", ["SGD", "Adam", "AdamW", "RMSprop", "Adagrad"])
def test_a_whole_step_has_no_host_traffic(model, opt_name, monkeypatch):
    make, shape = MODELS[model]
    net = make(device="meta")
    kw = {"momentum": 0.9, "lr": 0.1} if opt_name == "SGD" else {}
    opt = getattr(hg, opt_name)(net.parameters(), capturable=True, **kw)
    crit = CrossEntropyLoss(label_smoothing=0.1)
    x, y = torch.randn(shape, device="meta"), torch.randint(0, 10, (shape[0],), device="meta")
    monkeypatch.setattr(ce, "capturing", lambda t: True)  # as inside torch.cuda.graph: the range check is skipped
    with HostTraffic() as guard:
        for _ in range(2):
            opt.zero_grad(set_to_none=False)
            crit(net(x), y)
            net.backward(crit.backward())
            opt.step()
    assert guard.found == []


def test_losses_have_no_host_traffic_while_capturing(monkeypatch):
    logits = torch.randn(8, 10, device="meta")
    monkeypatch.setattr(ce, "capturing", lambda t: True)
    with HostTraffic() as guard:
        for crit, target in [
            (CrossEntropyLoss(), torch.randint(0, 10, (8,), device="meta")),
            (CrossEntropyLoss(reduction="sum"), torch.randn(8, 10, device="meta").softmax(1)),
            (MSELoss(), torch.randn(8, 10, device="meta")),
        ]:
            crit(logits, target)
            crit.backward()
    assert guard.found == []


def test_the_class_range_check_is_the_one_read_back_and_runs_when_not_capturing():
    logits, target = torch.randn(8, 10, device="meta"), torch.randint(0, 10, (8,), device="meta")
    assert not ce.capturing(target)
    with pytest.raises(NotImplementedError), HostTraffic() as guard:  # meta tensors hold no value to read back
        CrossEntropyLoss()(logits, target)
    assert guard.found and all("CPU" in f or "read-back" in f for f in guard.found), guard.found
    with pytest.raises(ValueError, match="target contains class 10"):
        CrossEntropyLoss()(torch.randn(2, 10), torch.tensor([1, 10]))


@pytest.mark.parametrize("model", MODELS)
def test_grad_buffers_stay_put_with_set_to_none_false(model):
    """Four steps: each .grad keeps its storage after the first, and every gradient equals the one the
    set_to_none=True path computes from scratch (float64, 1e-13 relative)."""
    make, shape = MODELS[model]
    torch.manual_seed(0)
    a = make(dtype=f64)
    b = make(dtype=f64)
    b.load_state_dict(a.state_dict())
    opt_a, opt_b = hg.SGD(a.parameters(), lr=0.05, momentum=0.9), hg.SGD(b.parameters(), lr=0.05, momentum=0.9)
    crit = CrossEntropyLoss()
    g = torch.Generator().manual_seed(1)
    ptrs = None
    for step in range(4):
        x, y = torch.randn(shape, generator=g, dtype=f64), torch.randint(0, 10, (shape[0],), generator=g)
        grads = []
        for net, opt, set_to_none in ((a, opt_a, False), (b, opt_b, True)):
            opt.zero_grad(set_to_none=set_to_none)
            with torch.random.fork_rng():  # the same dropout masks for both
                torch.manual_seed(step)
                crit(net(x), y)
            net.backward(crit.backward())
            grads.append([p.grad for p in net.parameters()])
            opt.step()
        now = [t.data_ptr() for t in grads[0]]
        if ptrs is not None:
            assert now == ptrs, "a .grad was reallocated under zero_grad(set_to_none=False)"
        ptrs = now
        for i, (ga, gb) in enumerate(zip(*grads, strict=True)):
            assert ga.stride() == gb.stride(), i
            err = ((ga - gb).abs().max() / gb.abs().max().clamp_min(1e-300)).item()
            assert err < 1e-13, f"step {step}, parameter {i}: {err:.2e}"
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert ((pa - pb).abs().max() / pb.abs().max()).item() < 1e-13

"""training.cuda_graph.CapturedStep: a plain call on the CPU (tested here), a replayed CUDA graph on a GPU
(the CUDA tests are skipped without one): 100 captured steps equal 100 eager ones to float32 rounding, a
smaller last batch runs eagerly, capturable optimizers equal torch.optim's capturable ones on CUDA."""

import pytest
import torch

import layers as L
import optimizers as hg
from losses import CrossEntropyLoss
from models import Net
from training.cuda_graph import CapturedStep


def training_step(net, opt, crit):
    def step(x, y):
        opt.zero_grad(set_to_none=False)
        loss = crit(net(x), y)
        net.backward(crit.backward())
        opt.step()
        return loss

    return step


def batches(n, batch, device, dtype=torch.float32, seed=1, last=None):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        b = last if (last is not None and i == n - 1) else batch
        out.append(
            (
                torch.randn(b, 784, generator=g, dtype=dtype).to(device),
                torch.randint(0, 10, (b,), generator=g).to(device),
            )
        )
    return out


def pair(device, dtype=torch.float32, opt_name="SGD", capturable=True, hidden=32):
    torch.manual_seed(0)
    a = Net(hidden_size=hidden, device=device, dtype=dtype)
    b = Net(hidden_size=hidden, device=device, dtype=dtype)
    b.load_state_dict(a.state_dict())
    kw = {"SGD": dict(lr=0.05, momentum=0.9), "Adam": dict(lr=1e-3)}[opt_name]
    oa = getattr(hg, opt_name)(a.parameters(), capturable=capturable, **kw)
    ob = getattr(hg, opt_name)(b.parameters(), capturable=capturable, **kw)
    return (a, oa), (b, ob)


def test_on_cpu_it_is_a_plain_call():
    (a, oa), (b, ob) = pair("cpu", torch.float64, "Adam")
    data = batches(6, 16, "cpu", torch.float64, last=5)
    step = CapturedStep(training_step(a, oa, CrossEntropyLoss()), *data[0])
    plain = training_step(b, ob, CrossEntropyLoss())
    assert not step.enabled and not step.captured
    for x, y in data:
        assert torch.equal(step(x, y), plain(x, y))
    assert step.eager_calls == 6 and step.replays == 0 and step.captures == 0
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert "disabled" in repr(step)


def test_disabled_and_bad_arguments():
    calls = []
    step = CapturedStep(lambda x, y: calls.append((x, y)) or 7, torch.zeros(2), torch.zeros(2), enabled=False)
    x, y = torch.ones(3), torch.ones(3)
    assert step(x, y) == 7 and calls[0][0] is x and calls[0][1] is y
    with pytest.raises(ValueError, match="enabled=True needs example_x and example_y on one CUDA device, got cpu"):
        CapturedStep(lambda x, y: None, torch.zeros(2), torch.zeros(2), enabled=True)
    with pytest.raises(ValueError, match="warmup must be an int >= 1.*got 0"):
        CapturedStep(lambda x, y: None, torch.zeros(2), torch.zeros(2), warmup=0)
    with pytest.raises(TypeError, match="example_y must be a tensor, got list"):
        CapturedStep(lambda x, y: None, torch.zeros(2), [0, 1])
    with pytest.raises(TypeError, match="step_fn must be callable"):
        CapturedStep(None, torch.zeros(2), torch.zeros(2))


# -- CUDA ----------------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
def test_100_captured_steps_equal_eager(opt_name):
    cuda = torch.device("cuda")
    (a, oa), (b, ob) = pair(cuda, opt_name=opt_name)
    data = batches(101, 64, cuda, last=40)  # the last, smaller batch runs eagerly
    step = CapturedStep(training_step(a, oa, CrossEntropyLoss()), *data[0])
    eager = training_step(b, ob, CrossEntropyLoss())
    for x, y in data:
        la = step(x, y).clone()
        lb = eager(x, y)
        assert abs(la.item() - lb.item()) <= 1e-5 * abs(lb.item())
    assert step.captured and step.captures == 1 and step.replays == 101 - 3 - 1 and step.eager_calls == 4
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        err = ((pa - pb).abs().max() / pb.abs().max()).item()
        assert err < 1e-5, f"{name}: {err:.2e}"
    assert all(oa.state[p]["step"].device.type == "cuda" for p in a.parameters()) if opt_name == "Adam" else True


@pytest.mark.cuda
def test_captured_step_with_dropout_draws_fresh_masks_and_recapture():
    cuda = torch.device("cuda")
    torch.manual_seed(0)
    gen = torch.Generator(device=cuda).manual_seed(3)
    drop = L.Dropout(0.5)
    drop.generator = gen
    net = L.Sequential(L.Linear(784, 64, device=cuda), L.ReLU(), drop, L.Linear(64, 10, device=cuda))
    opt = hg.Adam(net.parameters(), capturable=True)
    crit = CrossEntropyLoss()
    x, y = batches(1, 32, cuda)[0]
    step = CapturedStep(training_step(net, opt, crit), x, y, warmup=1, generators=[gen])
    losses = [step(x, y).item() for _ in range(6)]
    assert len(set(losses[2:])) == 4  # same batch, fresh masks (and updated weights) each replay
    for g in opt.param_groups:
        g["lr"] = 0.0
    step.recapture()
    before = [p.clone() for p in net.parameters()]
    step(x, y)
    assert step.captures == 2 and all(torch.equal(p, q) for p, q in zip(net.parameters(), before, strict=True))


@pytest.mark.cuda
@pytest.mark.parametrize(
    "name,kw",
    [("Adam", dict(amsgrad=True, weight_decay=0.1)), ("AdamW", {}), ("RMSprop", dict(centered=True, momentum=0.5))],
)
def test_capturable_optimizers_equal_torch_capturable_on_cuda(name, kw):
    cuda = torch.device("cuda")
    g = torch.Generator(device="cpu").manual_seed(0)
    base = [torch.randn(s, generator=g) for s in [(7, 5), (5,)]]
    ours, ref = [b.clone().to(cuda) for b in base], [b.clone().to(cuda) for b in base]
    o = getattr(hg, name)(ours, capturable=True, **kw)
    r = getattr(torch.optim, name)(ref, capturable=True, **kw)
    for t in range(100):
        for a, b in zip(ours, ref, strict=True):
            grad = torch.sin(3 * a) + 0.01 * t
            a.grad, b.grad = grad.clone(), grad.clone()
        o.step()
        r.step()
    for a, b in zip(ours, ref, strict=True):
        assert ((a - b).abs().max() / b.abs().max()).item() < 1e-6  # float32; the same kernels give equality
    assert all(o.state[p]["step"].device.type == "cuda" for p in ours)


@pytest.mark.cuda
def test_capturable_optimizer_inside_a_graph_equals_torch_capturable():
    """Our Adam(capturable=True) replayed in a graph vs torch.optim.Adam(capturable=True) replayed likewise."""
    cuda = torch.device("cuda")
    g = torch.Generator(device="cpu").manual_seed(0)
    base = [torch.randn(s, generator=g) for s in [(7, 5), (5,)]]
    results = []
    for mod in (hg, torch.optim):
        params = [b.clone().to(cuda) for b in base]
        opt = mod.Adam(params, lr=0.01, capturable=True)
        grad_src = torch.zeros(1, device=cuda)

        def step(x, _y, params=params, opt=opt):
            for p in params:
                p.grad = torch.sin(3 * p) + x
            opt.step()
            return None

        cap = CapturedStep(step, grad_src, grad_src)
        for t in range(50):
            cap(torch.full((1,), 0.01 * t, device=cuda), grad_src)
        results.append(params)
    for a, b in zip(*results, strict=True):
        assert ((a - b).abs().max() / b.abs().max()).item() < 1e-6

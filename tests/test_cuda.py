"""The same checks on CUDA, where a GPU is present (skipped otherwise)."""

import json

import pytest
import torch

import optimizers as hg
from losses import CrossEntropyLoss
from models import Net, PytorchNet

pytestmark = pytest.mark.cuda  # skipped without a CUDA device (tests/conftest.py)
cuda = torch.device("cuda")


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_net_matches_twin_on_cuda(dtype, tol):
    torch.manual_seed(0)
    net = Net(hidden_size=64, device=cuda, dtype=dtype)
    twin = PytorchNet(hidden_size=64, device=cuda, dtype=dtype)
    twin.load_state_dict(net.state_dict())
    x, y = torch.randn(32, 1, 28, 28, device=cuda, dtype=dtype), torch.randint(0, 10, (32,), device=cuda)
    crit = CrossEntropyLoss()
    loss = crit(net(x), y)
    net.backward(crit.backward())
    ref = torch.nn.functional.cross_entropy(twin(x), y)
    ref.backward()
    assert abs(loss.item() - ref.item()) <= tol * abs(ref.item())
    ours = dict(net.named_parameters())
    for name, p in twin.named_parameters():
        g = ours[name].grad  # torch's layout: (out, in) weights, no transpose
        assert g.device.type == "cuda"
        assert ((g - p.grad).abs().max() / p.grad.abs().max()).item() < tol, name


@pytest.mark.parametrize(
    "name,kw",
    [
        ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True)),
        ("Adam", dict(amsgrad=True)),
        ("AdamW", {}),
        ("RMSprop", dict(centered=True, momentum=0.5)),
        ("Adagrad", {}),
    ],
)
def test_optimizers_match_torch_on_cuda(name, kw):
    g = torch.Generator(device="cpu").manual_seed(0)
    base = [torch.randn(s, generator=g, dtype=torch.float64) for s in [(7, 5), (5,)]]
    ours = [b.clone().to(cuda) for b in base]
    ref = [b.clone().to(cuda) for b in base]
    o, r = getattr(hg, name)(ours, **kw), getattr(torch.optim, name)(ref, **kw)
    for t in range(100):
        for a, b in zip(ours, ref, strict=True):
            grad = torch.sin(3 * a) + 0.01 * t
            a.grad, b.grad = grad.clone(), grad.clone()
        o.step()
        r.step()
    for a, b in zip(ours, ref, strict=True):
        assert ((a - b).abs().max() / b.abs().max()).item() < 1e-10


def test_cross_entropy_range_check_on_cuda():
    with pytest.raises(ValueError, match="target contains class 10"):
        CrossEntropyLoss()(torch.randn(2, 10, device=cuda), torch.tensor([1, 10], device=cuda))


def test_train_py_runs_on_cuda(tmp_path):
    import train
    from tests.conftest import write_tiny_mnist

    write_tiny_mnist(tmp_path / "data")
    out = tmp_path / "run"
    assert (
        train.main(
            [
                "--data-dir",
                str(tmp_path / "data"),
                "--out",
                str(out),
                "--device",
                "cuda",
                "--epochs",
                "2",
                "--dtype",
                "float64",
                "--monitor",
                "--hidden",
                "16",
                "--depth",
                "2",
                "--batch-size",
                "32",
                "--no-download",
                "--quiet",
            ]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["max_param_abs_diff"] < 1e-10
    assert (
        train.main(
            [
                "--resume",
                str(out / "checkpoint.pt"),
                "--epochs",
                "3",
                "--device",
                "cuda",
                "--data-dir",
                str(tmp_path / "data"),
                "--no-download",
                "--quiet",
            ]
        )
        == 0
    )

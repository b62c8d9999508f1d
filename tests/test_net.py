"""Net against its nn.Module twin PytorchNet; state_dict; accumulation; Net-level errors."""

import pytest
import torch

from layers import Linear, ReLU, Tanh
from losses import CrossEntropyLoss
from models import Net, PytorchNet
from tests.conftest import rel, twin_pair

SMALL = dict(hidden_size=32, num_classes=10, in_features=784, depth=3)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize(
    "arch",
    [SMALL, dict(hidden_size=1024), dict(hidden_size=16, depth=1, in_features=20, num_classes=3)],
    ids=["small", "default", "depth1"],
)
def test_net_matches_pytorchnet(dtype, tol, arch):
    net, twin = twin_pair(dtype, **arch)
    n, d = 64, arch.get("in_features", 784)
    x = torch.randn(n, 1, 28, 28, dtype=dtype) if d == 784 else torch.randn(n, d, dtype=dtype)
    y = torch.randint(0, arch.get("num_classes", 10), (n,))

    crit = CrossEntropyLoss()
    loss = crit(net(x), y)
    dx = net.backward(crit.backward(), need_input_grad=True)
    assert dx.shape == x.shape

    xr = x.clone().requires_grad_()
    ref = torch.nn.functional.cross_entropy(twin(xr), y)
    ref.backward()
    assert abs(loss.item() - ref.item()) / abs(ref.item()) < tol
    ours = dict(net.named_parameters())
    for name, p in twin.named_parameters():
        g = ours[name].grad  # torch's layout, as exposed: no view taken
        assert rel(g, p.grad) < tol, name
    assert rel(dx, xr.grad) < tol


def test_forward_is_bit_identical_to_twin_in_float32():
    """Weight memory in nn.Linear's layout: the forward GEMMs are the very calls nn.Linear makes."""
    net, twin = twin_pair(torch.float32, hidden_size=256)
    x = torch.randn(64, 784)
    assert torch.equal(net(x), twin(x).detach())


def test_same_seed_same_initial_weights():
    torch.manual_seed(5)
    net = Net(**SMALL)
    torch.manual_seed(5)
    twin = PytorchNet(**SMALL)
    for k, v in twin.state_dict().items():
        assert torch.equal(net.state_dict()[k], v), k


def test_state_dict_round_trips_both_ways():
    net, twin = twin_pair(torch.float32, **SMALL)
    sd = net.state_dict()
    assert list(sd) == list(twin.state_dict())
    for k, v in twin.state_dict().items():
        assert sd[k].shape == v.shape and torch.equal(sd[k], v), k
    torch.manual_seed(99)
    other = Net(**SMALL)
    other.load_state_dict(twin.state_dict())
    for k, v in other.state_dict().items():
        assert torch.equal(v, twin.state_dict()[k])
    twin2 = PytorchNet(**SMALL)
    twin2.load_state_dict(other.state_dict())
    x = torch.randn(3, 784)
    assert torch.equal(twin2(x), twin(x))
    torch.testing.assert_close(other(x), twin(x), rtol=1e-6, atol=1e-6)


def test_state_dict_survives_torch_save(tmp_path):
    net, _ = twin_pair(torch.float32, **SMALL)
    torch.save(net.state_dict(), tmp_path / "w.pt")
    torch.manual_seed(1)
    other = Net(**SMALL)
    other.load_state_dict(torch.load(tmp_path / "w.pt"))
    x = torch.randn(2, 784)
    assert torch.equal(other(x), net(x))


def test_load_state_dict_errors():
    net = Net(**SMALL)
    sd = net.state_dict()
    with pytest.raises(KeyError, match=r"missing keys \['layers.6.bias'\]"):
        net.load_state_dict({k: v for k, v in sd.items() if k != "layers.6.bias"})
    bad = dict(sd, **{"layers.0.weight": torch.zeros(5, 5)})
    with pytest.raises(ValueError, match=r"'layers.0.weight' has shape \(5, 5\), expected \(32, 784\)"):
        net.load_state_dict(bad)


def test_gradients_accumulate_over_micro_batches():
    """Two half-batches with sum reduction give the gradient of the whole batch."""
    net, _ = twin_pair(torch.float64, **SMALL)
    x, y = torch.randn(8, 784, dtype=torch.float64), torch.randint(0, 10, (8,))
    crit = CrossEntropyLoss("sum")
    crit(net(x), y)
    net.backward(crit.backward())
    whole = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    for part in (slice(0, 3), slice(3, 8)):
        crit(net(x[part]), y[part])
        net.backward(crit.backward())
    for g, p in zip(whole, net.parameters(), strict=True):
        torch.testing.assert_close(p.grad, g, rtol=1e-12, atol=1e-13)
    net.zero_grad(set_to_none=False)
    assert all(torch.count_nonzero(p.grad) == 0 for p in net.parameters())


def test_backward_without_input_grad():
    net, _ = twin_pair(torch.float64, **SMALL)
    x = torch.randn(4, 784, dtype=torch.float64)
    net(x)
    assert net.backward(torch.ones(4, 10, dtype=torch.float64), need_input_grad=False) is None
    assert all(p.grad is not None for p in net.parameters())


def test_net_from_explicit_layers_and_names():
    net = Net(layers=[Linear(4, 3), Tanh(), Linear(3, 2)])
    assert [n for n, _ in net.named_parameters()] == [
        "layers.0.weight",
        "layers.0.bias",
        "layers.2.weight",
        "layers.2.bias",
    ]
    assert net(torch.randn(5, 4)).shape == (5, 2)
    assert len(net.parameters()) == 4
    assert net.eval() is net and not net.training and net.train().training


def test_to_keeps_parameter_identity():
    net = Net(**SMALL)
    params = net.parameters()
    net.to(dtype=torch.float64)
    assert all(a is b for a, b in zip(params, net.parameters(), strict=True))
    assert all(p.dtype == torch.float64 for p in net.parameters())
    assert net(torch.randn(2, 784, dtype=torch.float64)).dtype == torch.float64


def test_default_architecture():
    net = Net()
    shapes = [tuple(p.shape) for p in net.parameters()]
    assert shapes == [(1024, 784), (1024,), (1024, 1024), (1024,), (1024, 1024), (1024,), (10, 1024), (10,)]
    written_out = torch.nn.Sequential(
        torch.nn.Linear(784, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    )
    assert (
        {f"layers.{k}": tuple(v.shape) for k, v in written_out.state_dict().items()}
        == {k: tuple(v.shape) for k, v in net.state_dict().items()}
        == {k: tuple(v.shape) for k, v in PytorchNet().state_dict().items()}
    )


# -- bad input -----------------------------------------------------------------------------------------


def test_net_errors():
    net = Net(**SMALL)
    with pytest.raises(ValueError, match=r"expected input of shape \(\*, 784\), got \(2, 100\)"):
        net(torch.randn(2, 100))
    with pytest.raises(ValueError, match=r"expected a batch"):
        net(torch.randn(784))
    with pytest.raises(RuntimeError, match="backward called before forward"):
        Net(**SMALL).backward(torch.ones(2, 10))
    net(torch.randn(2, 784))
    with pytest.raises(ValueError, match=r"dout has shape \(2, 9\) but the forward output had shape \(2, 10\)"):
        net.backward(torch.ones(2, 9))
    with pytest.raises(ValueError, match="hidden_size must be an int >= 1, got 0"):
        Net(hidden_size=0)
    with pytest.raises(ValueError, match="depth must be an int >= 0"):
        PytorchNet(depth=-1)
    relu = ReLU()
    with pytest.raises(ValueError, match=r"the same layer object \(ReLU\(\)\) appears twice"):
        Net(layers=[Linear(2, 2), relu, Linear(2, 2), relu])
    with pytest.raises(TypeError, match=r"layers\[1\] \(str\) does not implement the Layer protocol"):
        Net(layers=[Linear(2, 2), "relu"])

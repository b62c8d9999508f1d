"""Sequential: the reverse walk, nn.Sequential's keys, from_torch/to_torch, hooks, train/eval, bad input."""

import pytest
import torch
from torch import nn

from gradcheck import check_layer
from layers import Linear, ReLU, Sequential, Tanh, from_torch
from models import Net, PytorchNet
from tests.conftest import assert_all_pass, rel

f64 = torch.float64


def nested_torch():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(6, 5), nn.Tanh(), nn.Sequential(nn.Linear(5, 4), nn.ReLU()), nn.Linear(4, 3)
    ).double()


def test_from_torch_keys_values_and_gradients_equal_autograd():
    ref = nested_torch()
    ours = from_torch(ref)
    assert isinstance(ours, Sequential) and isinstance(ours[2], Sequential)
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    x, dout = torch.randn(7, 6, dtype=f64), torch.randn(7, 3, dtype=f64)
    xr = x.clone().requires_grad_()
    out_ref = ref(xr)
    out_ref.backward(dout)
    out = ours(x)
    dx = ours.backward(dout, need_input_grad=True)
    assert rel(out, out_ref.detach()) < 1e-12 and rel(dx, xr.grad) < 1e-12
    theirs = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        g = p.grad  # torch's layout, as exposed: no view taken
        assert rel(g, theirs[name].grad) < 1e-12, name


def test_from_torch_copies_and_leaves_the_rng_alone():
    ref = nested_torch()
    state = torch.get_rng_state()
    ours = from_torch(ref)
    assert torch.equal(torch.get_rng_state(), state)
    with torch.no_grad():
        ref[0].weight.add_(1.0)
    assert not torch.equal(ours.state_dict()["0.weight"], ref.state_dict()["0.weight"])


def test_to_torch_round_trip_and_mode():
    ref = nested_torch().eval()
    ours = from_torch(ref)
    assert not ours.training and not ours[2][0].training
    back = ours.train().to_torch()
    assert isinstance(back, nn.Sequential) and back.training and back[2][1].training
    for k, v in ref.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    x = torch.randn(3, 6, dtype=f64)
    assert torch.equal(back(x), ref(x))


def test_unsupported_module_is_named():
    with pytest.raises(TypeError, match=r"from_torch: Conv3d is not supported; supported: .*Linear.*Sequential"):
        from_torch(nn.Sequential(nn.Linear(2, 2), nn.Conv3d(1, 1, 1)))


def test_sequential_gradchecks_as_a_layer():
    torch.manual_seed(3)
    seq = Sequential(Linear(4, 5, dtype=f64), Tanh(), Sequential(Linear(5, 3, dtype=f64), Tanh()))
    assert_all_pass(check_layer(seq, torch.randn(3, 4, dtype=f64)))


def test_input_gradient_only_when_asked():
    seq = Sequential(Linear(4, 5), ReLU(), Linear(5, 2))
    out = seq(torch.randn(3, 4))
    assert seq.backward(torch.ones_like(out)) is None
    assert all(p.grad is not None for p in seq.parameters())
    seq(torch.randn(3, 4))
    assert seq.backward(torch.ones_like(out), need_input_grad=True).shape == (3, 4)


def test_backward_hooks_run_in_reverse_after_each_layer():
    seq = Sequential(Linear(4, 5), ReLU(), Linear(5, 2))
    seen = []
    handle = seq.register_backward_hook(
        lambda layer: seen.append((layer, layer.parameters()[0].grad is not None if layer.parameters() else None))
    )
    seq(torch.randn(3, 4))
    seq.backward(torch.ones(3, 2))
    assert [s[0] for s in seen] == [seq[2], seq[1], seq[0]]
    assert seen[0][1] and seen[2][1]  # a layer's gradients exist when its hook runs
    handle.remove()
    seen.clear()
    seq(torch.randn(3, 4))
    seq.backward(torch.ones(3, 2))
    assert seen == []


def test_the_same_layer_twice_even_nested_is_refused():
    relu = ReLU()
    with pytest.raises(ValueError, match=r"the same layer object \(ReLU\(\)\) appears twice"):
        Sequential(Linear(2, 2), relu, Sequential(Linear(2, 2), relu))
    with pytest.raises(ValueError, match="needs at least one layer"):
        Sequential()
    with pytest.raises(TypeError, match=r"layers\[0\] \(int\) does not implement the Layer protocol"):
        Sequential(3)


def test_net_to_torch_is_its_twin():
    torch.manual_seed(0)
    net = Net(hidden_size=16, dtype=f64)
    twin = net.to_torch()
    assert isinstance(twin, PytorchNet) and list(twin.state_dict()) == list(net.state_dict())
    x = torch.randn(5, 1, 28, 28, dtype=f64)
    assert rel(twin(x).detach(), net(x)) < 1e-14


def test_state_dict_load_errors_name_the_key():
    seq = Sequential(Linear(4, 5), ReLU(), Linear(5, 2))
    sd = seq.state_dict()
    with pytest.raises(ValueError, match=r"'2.weight' has shape \(5, 2\), expected \(2, 5\)"):
        seq.load_state_dict(dict(sd, **{"2.weight": torch.zeros(5, 2)}))
    with pytest.raises(KeyError, match=r"missing keys \['0.bias'\], unexpected keys \['0.beta'\]"):
        seq.load_state_dict({("0.beta" if k == "0.bias" else k): v for k, v in sd.items()})


def test_named_sequential_keeps_its_names_through_from_torch_and_to_torch():
    """nn.Sequential(OrderedDict(...)) keys its state_dict by the children's names ("fc.weight"): from_torch keeps
    them, so the hand-written model's state_dict and to_torch()'s load into the original (nested too)."""
    from collections import OrderedDict

    torch.manual_seed(1)
    ref = nn.Sequential(
        OrderedDict(
            fc=nn.Linear(6, 5),
            act=nn.Tanh(),
            block=nn.Sequential(OrderedDict(fc2=nn.Linear(5, 4), relu=nn.ReLU())),
            out=nn.Linear(4, 3),
        )
    ).double()
    ours = from_torch(ref)
    assert (
        list(ours.state_dict())
        == list(ref.state_dict())
        == ["fc.weight", "fc.bias", "block.fc2.weight", "block.fc2.bias", "out.weight", "out.bias"]
    )
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert "(fc): Linear" in repr(ours) and "(fc2): Linear" in repr(ours)
    back = ours.to_torch()
    assert [n for n, _ in back.named_children()] == ["fc", "act", "block", "out"]
    ref.load_state_dict(back.state_dict())  # strict: the keys are the original's
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(3, 6, dtype=f64)
    assert torch.equal(back(x), ref(x)) and rel(ours(x), ref(x)) < 1e-14
    built = Sequential(OrderedDict(a=Linear(2, 2), b=ReLU()))  # the same constructor as torch's
    assert list(built.state_dict()) == ["a.weight", "a.bias"]
    with pytest.raises(ValueError, match=r"a layer's name must be a non-empty string without '.', got 'x.y'"):
        Sequential(OrderedDict([("x.y", ReLU())]))


def test_relu_then_max_pool_backward_runs_fused_and_equals_the_two_backwards():
    """Sequential runs a ReLU -> MaxPool2d pair's backward as one (kernels.convolution.relu_max_pool_backward, while the
    kernels are on): the mask taken
    on the pooled gradient.  It equals the two backwards run one after the other, to the bit, with overlapping
    windows (an argmax shared by windows), ties and whole windows of zeros (ReLU's), and equals autograd."""
    from layers import BatchNorm2d, Conv2d, Flatten, MaxPool2d

    torch.manual_seed(3)
    for pool in (MaxPool2d(2), MaxPool2d(3, 1, 1), MaxPool2d(3, 2, ceil_mode=True)):
        model = Sequential(Conv2d(2, 3, 3, padding=1, dtype=f64), BatchNorm2d(3, dtype=f64), ReLU(), pool, Flatten())
        x = torch.randn(4, 2, 7, 7, dtype=f64)
        x[0] = 0.0  # all of sample 0 ties (its ReLU output is 0 everywhere but where the bias lifts it)
        out = model(x)
        dout = torch.randn_like(out)
        calls = []
        model.register_backward_hook(lambda layer, calls=calls: calls.append(type(layer).__name__))
        dx = model.backward(dout, need_input_grad=True)
        assert calls == ["Flatten", "MaxPool2d", "ReLU", "BatchNorm2d", "Conv2d"]
        assert model[2].kept is None and model[3].kept is None  # both caches consumed
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad()
        model(x)
        d = model[4].backward(dout)
        d = model[3].backward(d)
        d = model[2].backward(d)  # the two backwards, one after the other
        d = model[1].backward(d)
        assert torch.equal(model[0].backward(d), dx)
        for n, p in model.named_parameters():
            assert torch.equal(p.grad, grads[n]), n
        ref = model.to_torch()
        xr = x.clone().requires_grad_()
        ref(xr).backward(dout)
        assert rel(dx, xr.grad) < 1e-12


def test_fused_backward_falls_back_when_the_pool_did_not_pool_that_relu_s_output():
    from kernels import convolution
    from layers import MaxPool2d

    relu, pool = ReLU(), MaxPool2d(2)
    x = torch.randn(2, 3, 4, 4, dtype=f64)
    relu(x)
    out = pool(torch.relu(x) + 1.0)  # not the ReLU's output
    assert convolution.relu_max_pool_backward(pool, relu, torch.ones_like(out)) is None
    assert relu.kept is not None and pool.kept is not None  # nothing consumed

"""model.trace: the one-step table's numbers are autograd's, and tracing leaves the model as it was."""

import itertools

import pytest
import torch
from torch import nn

from layers import Sequential, from_torch
from losses import MSELoss
from models import Net

F64 = torch.float64


def test_trace_rows_are_autograds_numbers_and_the_model_is_left_alone():
    torch.manual_seed(0)
    theirs = nn.Sequential(
        nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Sequential(nn.Linear(8, 5), nn.Tanh()), nn.Linear(5, 3)
    ).to(F64)
    ours = from_torch(theirs)
    x, y = torch.randn(10, 6, dtype=F64), torch.randint(0, 3, (10,))
    sentinel = torch.full_like(ours[0].weight, 7.0)
    ours[0].weight.grad = sentinel
    running = ours[1].running_mean.clone()
    t = ours.trace(x, y)
    assert ours[0].weight.grad is sentinel and ours[4].bias.grad is None  # .grad put back
    assert torch.equal(ours[1].running_mean, running)  # buffers put back
    assert [r.name for r in t.rows] == ["0", "1", "2", "3.0", "3.1", "4"]
    # autograd on the twin, keeping every layer's output and its gradient
    outs, h = [], x.clone().requires_grad_()
    first = h
    for m in [theirs[0], theirs[1], theirs[2], theirs[3][0], theirs[3][1], theirs[4]]:
        h = m(h)
        h.retain_grad()
        outs.append(h)
    loss = nn.functional.cross_entropy(h, y)
    loss.backward()
    assert abs(t.loss - loss.item()) < 1e-12
    ins = [first] + outs[:-1]
    for row, out, inp in zip(t.rows, outs, ins, strict=True):
        assert row.out_shape == tuple(out.shape) and row.in_shape == tuple(inp.shape)
        assert abs(row.out_mean - out.mean().item()) < 1e-12
        assert abs(row.dout_norm - out.grad.norm().item()) < 1e-12 * out.grad.norm().item() + 1e-300
    for row, inp in zip(t.rows[1:], ins[1:], strict=True):
        assert abs(row.dx_norm - inp.grad.norm().item()) < 1e-12 * inp.grad.norm().item()
    grads = {name: p.grad for name, p in theirs.named_parameters()}
    g, w = t.rows[5].grads["weight"]
    assert abs(g - grads["4.weight"].norm().item()) < 1e-12 and abs(w - theirs[4].weight.norm().item()) < 1e-12
    assert abs(t.rows[3].grads["bias"][0] - grads["3.0.bias"].norm().item()) < 1e-12
    assert "3.0 Linear" in str(t) and "loss" in str(t)


def test_trace_of_a_net_flattens_images_and_takes_mse_for_float_targets():
    torch.manual_seed(1)
    net = Net(hidden_size=8, in_features=16, num_classes=4, dtype=F64)
    x = torch.randn(5, 1, 4, 4, dtype=F64)
    t = net.trace(x, torch.randint(0, 4, (5,)))
    assert t.rows[0].in_shape == (5, 16) and t.rows[-1].out_shape == (5, 4)
    seq = Sequential(*net.layers)
    target = torch.randn(5, 4, dtype=F64)
    t2 = seq.trace(x.flatten(1), target)
    assert abs(t2.loss - MSELoss()(net(x), target).item()) < 1e-12
    t3 = seq.trace(x.flatten(1), target, loss=MSELoss())  # a handgrad loss gives the same starting gradient
    assert abs(t3.loss - t2.loss) < 1e-15 and abs(t3.rows[0].dx_norm - t2.rows[0].dx_norm) < 1e-12 * t2.rows[0].dx_norm
    dead = Sequential(net.layers[0], net.layers[1])  # a ReLU whose every unit is dead shows 100% zeros
    with torch.no_grad():
        net.layers[0].bias.fill_(-1e3)
    assert dead.trace(x.flatten(1), torch.randn(5, 8, dtype=F64)).rows[1].out_zeros == 1.0


def test_learn_trace_shows_a_sigmoid_stack_losing_its_gradient_towards_the_input(capsys):
    from learn.trace import main

    assert main(["--activation", "sigmoid", "--depth", "6", "--hidden", "32", "--batch", "16"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line[:1].isdigit()]
    # "0 Linear (16, 196) -> (16, 32) mean/std zeros |dout| |dx| ...": |dx| is the 11th field
    dx = [float(r[10]) for r in rows if r[1] == "Linear"]
    assert len(dx) == 7 and all(a < b for a, b in itertools.pairwise(dx)), (
        dx
    )  # shrinking layer after layer to the input
    assert dx[-1] / dx[0] > 100, dx


def test_learn_trace_refuses_an_impossible_network(capsys):
    from learn.trace import main

    with pytest.raises(SystemExit) as e:
        main(["--depth", "0"])
    assert e.value.code == 2 and "--depth must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("own_generator", [False, True])
def test_a_step_after_a_trace_equals_the_step_without_it_bit_for_bit(own_generator):
    """The trace's dropout masks are drawn from a random state put back afterwards (torch's, or the layer's own)."""
    import copy

    import optimizers
    from layers import Dropout, Linear, ReLU

    torch.manual_seed(0)
    model = Sequential(Linear(6, 16), ReLU(), Dropout(0.5), Linear(16, 3))
    if own_generator:
        model[2].generator = torch.Generator().manual_seed(5)
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    runs = []
    for traced in (False, True):
        m = copy.deepcopy(model)
        opt = optimizers.SGD(m.parameters(), lr=0.1)
        torch.manual_seed(1)
        if traced:
            m.trace(x, y)
        out = m(x)
        m.backward((torch.softmax(out, 1) - nn.functional.one_hot(y, 3)) / len(y))  # mean cross-entropy's dout
        opt.step()
        runs.append([p.clone() for p in m.parameters()] + [torch.rand(3)])  # and the RNG's next draw
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)

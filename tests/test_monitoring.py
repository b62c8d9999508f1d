"""monitoring: GradientMonitor's numbers against direct torch computations, activation statistics on crafted
inputs, Sequential.register_forward_hook, one read-back per update, figures, JSON lines and TensorBoard."""

from __future__ import annotations

import math

import pytest
import torch

import layers
import models
from autodiff.engine import Tensor as ETensor
from autodiff.functional import cross_entropy as engine_cross_entropy
from autodiff.nn import EngineNet
from losses import CrossEntropyLoss
from monitoring import (
    GradientMonitor,
    activation_stats,
    hist_edges,
    histogram,
    plot_records,
    read_jsonl,
    to_tensorboard,
)
from tests.conftest import twin_pair

TOL = 1e-12
ARCH = dict(hidden_size=12, depth=2, in_features=20, num_classes=5)


def close(a: float, b: float, tol: float = TOL, scale: float = 0.0) -> bool:
    """|a - b| <= tol * max(|b|, scale): relative, or against ``scale`` for a mean that cancels to ~0."""
    return abs(a - b) <= tol * max(abs(b), scale, 1e-300)


def batch(n: int = 16, d: int = 20, c: int = 5, seed: int = 1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=dtype), torch.randint(0, c, (n,), generator=g)


def manual_step(net, x, y) -> None:
    loss = CrossEntropyLoss()
    net.zero_grad()
    loss(net(x), y)
    net.backward(loss.backward())


def torch_step(model, x, y) -> None:
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()


# -- the recorded numbers --------------------------------------------------------------------------------


def direct_param_stats(w: torch.Tensor, g: torch.Tensor) -> dict:
    """The monitor's fields computed directly with torch (the twin's layout: every one is layout-independent)."""
    g, w = g.detach(), w.detach()
    return {
        "grad_mean": g.mean().item(),
        "grad_std": g.std().item(),
        "grad_norm": g.norm().item(),
        "grad_abs_max": g.abs().max().item(),
        "grad_min": g.min().item(),
        "grad_max": g.max().item(),
        "param_mean": w.mean().item(),
        "param_std": w.std().item(),
        "param_norm": w.norm().item(),
    }


@pytest.mark.parametrize("kind", ["manual", "torch", "engine"])
def test_recorded_statistics_equal_torch_on_the_twins_gradients(kind):
    """Every model kind's record equals statistics computed directly with torch on the nn.Module twin's
    autograd gradients (the same weights and batch), in float64 to 1e-12."""
    net, twin = twin_pair(torch.float64, **ARCH)
    x, y = batch()
    torch_step(twin, x, y)
    if kind == "manual":
        model = net
        manual_step(net, x, y)
    elif kind == "torch":
        model = twin
    else:
        model = EngineNet(**ARCH, dtype=torch.float64)
        model.load_state_dict(net.state_dict())
        model.zero_grad()
        engine_cross_entropy(model(ETensor(x)), y).backward()
    mon = GradientMonitor(model, hist_bins=16)
    rec = mon.update(0)
    ref = dict(twin.named_parameters())
    assert list(rec["params"]) == list(ref)
    for name, p in ref.items():
        got = rec["params"][name]
        assert got["numel"] == p.numel()
        for key, want in direct_param_stats(p, p.grad).items():
            scale = p.grad.abs().max().item() if key == "grad_mean" else p.abs().max().item()
            assert close(got[key], want, scale=scale), (kind, name, key, got[key], want)
        assert got["grad_nonfinite"] == 0
        assert got["update_ratio"] is None
    want_total = torch.nn.utils.clip_grad_norm_(twin.parameters(), float("inf")).item()
    assert close(rec["total_grad_norm"], want_total)
    assert rec["total_grad_norm_after_clip"] is None and rec["update_ratio_span"] is None


def test_shapes_are_reported_as_stored():
    """A Linear's weight is (out, in), as nn.Linear's: the record says so."""
    net, twin = twin_pair(torch.float64, **ARCH)
    x, y = batch()
    manual_step(net, x, y)
    rec = GradientMonitor(net).update(0)
    assert rec["params"]["layers.0.weight"]["shape"] == [12, 20]
    assert rec["params"]["layers.0.bias"]["shape"] == [12]


def test_histograms_count_every_element_as_torch_histc_does():
    net, _ = twin_pair(torch.float64, **ARCH)
    x, y = batch()
    manual_step(net, x, y)
    rec = GradientMonitor(net, hist_bins=13).update(0)
    for name, p in net.named_parameters():
        s = rec["params"][name]
        assert sum(s["hist_counts"]) == p.numel()
        r = p.grad.abs().max().item()
        assert s["hist_range"] == [-r, r]
        want = torch.histc(p.grad, bins=13, min=-r, max=r)
        assert s["hist_counts"] == [int(c) for c in want.tolist()], name
        edges = hist_edges(s)
        assert len(edges) == 14 and edges[0] == -r and close(edges[-1], r)


def test_histogram_edge_cases():
    g = torch.tensor([0.0, 0.0, 0.0], dtype=torch.float64)
    counts, r = histogram(g, 4)
    assert r.item() == 1.0 and counts.tolist() == [0, 0, 3, 0]  # all zero: range [-1, 1], zeros in the bin at 0
    g = torch.tensor([-2.0, 2.0, 1.0, float("nan"), float("inf")], dtype=torch.float64)
    counts, r = histogram(g, 4)
    assert r.item() == 2.0 and counts.tolist() == [1, 0, 0, 2]  # -r in the first bin, r in the last
    counts, r = histogram(torch.tensor([0.0, float("nan"), -float("inf"), 0.5, -0.25]), 2)
    assert r.item() == 0.5 and counts.tolist() == [1, 2]  # the non-finite values are not counted in 0's bin
    p = torch.zeros(5, dtype=torch.float64)
    p.grad = g

    class One:
        def named_parameters(self):
            return iter([("p", p)])

    rec = GradientMonitor(One(), hist_bins=4).update(0)
    s = rec["params"]["p"]
    assert s["grad_nonfinite"] == 2 and sum(s["hist_counts"]) == 3
    assert s["hist_range"] == [-2.0, 2.0]  # the finite values' range; torch's statistics show the NaN
    assert all(math.isnan(s[k]) for k in ("grad_mean", "grad_min", "grad_max", "grad_abs_max"))
    assert math.isnan(rec["total_grad_norm"])


@pytest.mark.parametrize("every", [1, 3])
def test_update_ratio_is_the_recorded_steps_update_over_the_weight(every):
    """|W after step t - W before| / |W before| for the optimizer step that follows a recorded update(t),
    stored in the next record with span [t, t + 1]."""
    net, _ = twin_pair(torch.float64, **ARCH)
    x, y = batch()
    opt = torch.optim.SGD(net.parameters(), lr=0.3, momentum=0.9)
    mon = GradientMonitor(net, every=every)
    want: dict[int, dict[str, float]] = {}
    for step in range(2 * every + 1):
        manual_step(net, x, y)
        before = {n: p.detach().clone() for n, p in net.named_parameters()}
        mon.update(step)
        opt.step()
        want[step] = {n: ((p - before[n]).norm() / before[n].norm()).item() for n, p in net.named_parameters()}
    recs = mon.records
    assert [r["step"] for r in recs] == list(range(0, 2 * every + 1, every))
    assert recs[0]["update_ratio_span"] is None
    for rec in recs[1:]:
        t0, t1 = rec["update_ratio_span"]
        assert t1 == t0 + 1 and t0 == rec["step"] - every
        for name, s in rec["params"].items():
            assert close(s["update_ratio"], want[t0][name]), (name, s["update_ratio"], want[t0][name])


def test_update_ratio_dropped_with_the_copy_after_remove():
    net, _ = twin_pair(torch.float64, **ARCH)
    mon = GradientMonitor(net)
    manual_step(net, *batch())
    mon.update(0)
    assert mon._snapshot is not None
    mon.remove()
    assert mon._snapshot is None
    manual_step(net, *batch())
    assert mon.update(1)["update_ratio_span"] is None


def test_total_norm_before_and_after_clipping_and_every():
    net, _ = twin_pair(torch.float64, **ARCH)
    x, y = batch()
    mon = GradientMonitor(net, every=2)
    params = net.parameters()
    for step in range(4):
        manual_step(net, x, y)
        rec = mon.update(step)
        before = torch.nn.utils.clip_grad_norm_(params, 0.1).item()
        mon.update_after_clip()
        after = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])).item()
        if step % 2:
            assert rec is None
            continue
        assert close(rec["total_grad_norm"], before)
        assert before > 0.1 and abs(after - 0.1) < 1e-6
        assert mon.records[-1]["total_grad_norm_after_clip"] == pytest.approx(after, rel=TOL)
    assert [r["step"] for r in mon.records] == [0, 2]


def test_one_read_back_per_update(monkeypatch):
    """The whole record -- grads, weights, ratios, the previous after-clip norm, activations -- comes back in
    one .tolist(); no .item()/.cpu() on the way."""
    net, _ = twin_pair(torch.float64, **ARCH)
    x, y = batch()
    mon = GradientMonitor(net).watch_activations()
    calls = {"tolist": 0, "item": 0, "cpu": 0}
    for method in calls:
        original = getattr(torch.Tensor, method)

        def counted(self, *a, _original=original, _method=method, **k):
            calls[_method] += 1
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, method, counted)
    for step in range(3):
        manual_step(net, x, y)
        calls.update(tolist=0, item=0, cpu=0)
        mon.update(step)
        mon.update_after_clip()
        assert calls == {"tolist": 1, "item": 0, "cpu": 0}, (step, calls)
    monkeypatch.undo()
    recs = mon.records
    assert all(r["total_grad_norm_after_clip"] is not None for r in recs)
    assert recs[-1]["update_ratio_span"] == [1, 2] and "layers.1" in recs[-1]["activations"]


def test_parameters_without_a_gradient_are_recorded_without_grad_statistics():
    lin = layers.Linear(3, 2, dtype=torch.float64)
    net = layers.Sequential(lin)
    net(torch.randn(4, 3, dtype=torch.float64))
    lin.weight.grad = torch.randn(2, 3, dtype=torch.float64)  # bias left without .grad (frozen)
    rec = GradientMonitor(net).update(0)
    assert rec["params"]["0.bias"]["grad_norm"] is None and rec["params"]["0.bias"]["hist_counts"] is None
    assert close(rec["params"]["0.bias"]["param_norm"], lin.bias.norm().item())
    assert close(rec["total_grad_norm"], lin.weight.grad.norm().item())


def test_bad_arguments_are_named():
    net, _ = twin_pair(torch.float64, **ARCH)
    with pytest.raises(ValueError, match="every must be an int >= 1, got 0"):
        GradientMonitor(net, every=0)
    with pytest.raises(ValueError, match="hist_bins must be an int >= 1, got 2.5"):
        GradientMonitor(net, hist_bins=2.5)
    with pytest.raises(TypeError, match="has no named_parameters"):
        GradientMonitor(object())
    with pytest.raises(TypeError, match="EngineNet.*no forward hooks"):
        GradientMonitor(EngineNet(**ARCH)).watch_activations()


# -- activations -------------------------------------------------------------------------------------------


def test_dead_and_saturated_fractions_on_crafted_outputs():
    out = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    assert activation_stats(out, "relu")[2].item() == 0.5  # units 0 and 2 are zero for the whole batch
    images = torch.zeros(2, 3, 2, 2, dtype=torch.float64)
    images[1, 0, 0, 0] = 1.0  # one (channel, pixel) unit alive out of 12
    assert activation_stats(images, "relu")[2].item() == 11 / 12
    t = torch.tensor([[0.98, -0.99, 0.5, 0.97], [-0.97, 0.0, 0.999, -0.1]], dtype=torch.float64)
    assert activation_stats(t, "tanh")[2].item() == 3 / 8  # strictly beyond 0.97 in magnitude
    s = torch.tensor([[0.01, 0.99, 0.5, 0.03], [0.97, 0.029, 0.971, 0.2]], dtype=torch.float64)
    assert activation_stats(s, "sigmoid")[2].item() == 4 / 8
    row = activation_stats(t, None)
    assert close(row[0].item(), t.mean().item()) and close(row[1].item(), t.std().item())
    assert math.isnan(row[2].item())


def crafted_net() -> layers.Sequential:
    """Linear(3, 4) with identity-like weights and biases chosen so that, on inputs in [0, 1), units 0 and 2
    of the ReLU are zero for every example; then Linear(4, 4) -> Tanh and Linear(4, 2) -> Sigmoid."""
    torch.manual_seed(0)
    net = layers.Sequential(
        layers.Linear(3, 4, dtype=torch.float64),
        layers.ReLU(),
        layers.Linear(4, 4, dtype=torch.float64),
        layers.Tanh(),
        layers.Linear(4, 2, dtype=torch.float64),
        layers.Sigmoid(),
    )
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[1.0, 0, 0, 0], [0, 1, 0, 1], [0, 0, 1, 0]]).t())  # (out, in)
        net[0].bias.copy_(torch.tensor([-5.0, 0.5, -5.0, 0.0]))
        net[2].weight.mul_(20)  # large pre-activations: tanh saturates
        net[4].weight.mul_(30)
    return net


def test_activation_records_of_a_hand_written_model_and_its_twin():
    net = crafted_net()
    twin = net.to_torch()
    x = torch.rand(32, 3, dtype=torch.float64)
    records = {}
    for key, model in (("hand", net), ("torch", twin)):
        mon = GradientMonitor(model).watch_activations()
        out = model(x)
        (out.sum().backward() if isinstance(model, torch.nn.Module) else model.backward(torch.ones_like(out)))
        records[key] = rec = mon.update(0)
        acts = rec["activations"]
        assert list(acts) == ["0", "1", "2", "3", "4", "5"]
        with torch.no_grad():
            h = [x]
            for layer in twin:
                h.append(layer(h[-1]))
        for i, name in enumerate(acts):
            assert close(acts[name]["mean"], h[i + 1].mean().item())
            assert close(acts[name]["std"], h[i + 1].std().item())
        assert acts["1"]["layer"] == "ReLU" and acts["1"]["dead_fraction"] == 0.5
        assert "dead_fraction" not in acts["0"] and "saturated_fraction" not in acts["0"]
        assert acts["3"]["saturated_fraction"] == (h[4].abs() > 0.97).double().mean().item() > 0.2
        s = h[6]
        assert acts["5"]["saturated_fraction"] == ((s < 0.03) | (s > 0.97)).double().mean().item()
        mon.remove()
    hand, tw = records["hand"]["activations"], records["torch"]["activations"]
    assert hand.keys() == tw.keys()
    for name, a in hand.items():
        assert a["layer"] == tw[name]["layer"]
        for key in a.keys() - {"layer"}:
            assert close(a[key], tw[name][key]) or a[key] == tw[name][key], (name, key)


def test_activations_come_from_the_latest_forward_and_are_taken_once():
    net = crafted_net()
    mon = GradientMonitor(net).watch_activations()
    net(torch.rand(4, 3, dtype=torch.float64) + 10)  # an earlier forward (e.g. evaluation): replaced
    x = torch.rand(8, 3, dtype=torch.float64)
    out = net(x)
    net.backward(torch.ones_like(out))
    rec = mon.update(0)
    assert close(rec["activations"]["5"]["mean"], out.mean().item())
    out = net(x)
    net.backward(torch.ones_like(out))
    mon.update(1)
    out = net(x)
    net.backward(torch.ones_like(out))
    mon.remove()
    assert "activations" not in mon.update(2)  # hooks removed: nothing gathered since step 1


def test_nested_containers_report_their_leaves_with_dotted_names():
    torch.manual_seed(0)
    inner = layers.Sequential(layers.Linear(3, 4, dtype=torch.float64), layers.ReLU())
    net = models.Net(layers=[inner, layers.Linear(4, 2, dtype=torch.float64)])
    twin = net.to_torch()
    x = torch.randn(5, 3, dtype=torch.float64)
    got = {}
    for model in (net, twin):
        mon = GradientMonitor(model).watch_activations()
        out = model(x)
        (out.sum().backward() if isinstance(model, torch.nn.Module) else model.backward(torch.ones_like(out)))
        got[model] = mon.update(0)
        mon.remove()
    hand, tw = got[net], got[twin]
    assert list(hand["activations"]) == list(tw["activations"]) == ["layers.0.0", "layers.0.1", "layers.1"]
    for name, a in hand["activations"].items():
        for key, value in a.items():
            assert value == tw["activations"][name][key] or close(value, tw["activations"][name][key]), (name, key)
    assert (
        list(hand["params"])
        == list(tw["params"])
        == ["layers.0.0.weight", "layers.0.0.bias", "layers.1.weight", "layers.1.bias"]
    )


def cnn(dtype=torch.float64) -> layers.Sequential:
    torch.manual_seed(0)
    return layers.Sequential(
        layers.Conv2d(1, 3, 3, padding=1, dtype=dtype),
        layers.BatchNorm2d(3, dtype=dtype),
        layers.ReLU(),
        layers.MaxPool2d(2),
        layers.Flatten(),
        layers.Linear(3 * 4 * 4, 5, dtype=dtype),
    )


def test_cnn_and_its_twin_record_the_same_statistics():
    net = cnn()
    twin = net.to_torch()
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(6, 1, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 5, (6,), generator=g)
    recs = []
    for model, step in ((net, manual_step), (twin, torch_step)):
        mon = GradientMonitor(model, hist_bins=8).watch_activations()
        step(model, x, y)
        recs.append(mon.update(0))
        mon.remove()
    hand, tw = recs
    assert list(hand["params"]) == list(tw["params"]) == [n for n, _ in twin.named_parameters()]
    for rec, model in ((hand, net), (tw, twin)):  # each record equals torch on that model's own tensors
        for name, p in model.named_parameters():
            for key, want in direct_param_stats(p, p.grad).items():
                scale = p.grad.abs().max().item() if key == "grad_mean" else p.abs().max().item()
                assert close(rec["params"][name][key], want, TOL, scale), (name, key, rec["params"][name][key], want)
            assert sum(rec["params"][name]["hist_counts"]) == p.numel()
    # and the two models' statistics agree to 1e-12 of the largest gradient (the conv bias before batch norm
    # has a gradient that is 0 in exact arithmetic: both sides hold rounding noise of ~1e-17 there)
    g_scale = max(s["grad_abs_max"] for s in tw["params"].values())
    for name, s in hand["params"].items():
        for key in ("grad_mean", "grad_std", "grad_norm", "grad_abs_max"):
            assert close(s[key], tw["params"][name][key], TOL, g_scale), (name, key)
    assert list(hand["activations"]) == list(tw["activations"]) == ["0", "1", "2", "3", "4", "5"]
    for name, a in hand["activations"].items():  # a mean near 0 (batch norm's output) is compared to the std
        for key, value in a.items():
            want = tw["activations"][name][key]
            assert value == want or close(value, want, TOL, a["std"] if key == "mean" else 0.0), (name, key)
    assert 0.0 <= hand["activations"]["2"]["dead_fraction"] < 1.0


# -- hooks: none unless asked --------------------------------------------------------------------------------


def test_forward_hooks_see_each_childs_output_in_order_and_remove():
    net = crafted_net()
    seen = []
    handle = net.register_forward_hook(lambda layer, out: seen.append((layer, out.clone())))
    x = torch.rand(4, 3, dtype=torch.float64)
    out = net(x)
    assert [layer for layer, _ in seen] == list(net)
    h = x
    for layer, got in seen:
        h = layer(h)
        assert torch.equal(got, h)
    assert torch.equal(seen[-1][1], out)
    handle.remove()
    seen.clear()
    net(x)
    assert seen == [] and net._forward_hooks == []


def test_monitoring_off_registers_no_hooks():
    inner = layers.Sequential(layers.Linear(3, 4), layers.ReLU())
    net = models.Net(layers=[inner, layers.Linear(4, 2)])
    twin = net.to_torch()
    for model in (net, twin):
        mon = GradientMonitor(model, every=5)  # gradients only: nothing is hooked
        assert not hooked(model)
        mon.watch_activations()
        assert hooked(model)
        mon.remove()
        assert not hooked(model)


def hooked(model) -> bool:
    if isinstance(model, torch.nn.Module):
        return any(m._forward_hooks for m in model.modules())
    return bool(model._forward_hooks) or any(hooked(c) for c in model if isinstance(c, layers.Sequential))


# -- output ---------------------------------------------------------------------------------------------------


def trained_monitor(steps: int = 4):
    net = crafted_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    mon = GradientMonitor(net, hist_bins=8).watch_activations()
    g = torch.Generator().manual_seed(0)
    for step in range(steps):
        x = torch.rand(8, 3, generator=g, dtype=torch.float64)
        net.zero_grad()
        out = net(x)
        net.backward(out - 0.5)
        mon.update(step)
        torch.nn.utils.clip_grad_norm_(net.parameters(), 0.05)
        mon.update_after_clip()
        opt.step()
    return mon


def test_jsonl_round_trip(tmp_path):
    mon = trained_monitor()
    path = mon.to_jsonl(tmp_path / "monitor.jsonl")
    back = read_jsonl(path)
    assert back == mon.records and len(back) == 4
    assert back[-1]["params"]["0.weight"]["hist_counts"] == mon.records[-1]["params"]["0.weight"]["hist_counts"]


def test_figures_are_written(tmp_path):
    mon = trained_monitor()
    paths = plot_records({"manual": mon.records, "again": mon.records}, tmp_path, prefix="m_")
    names = sorted(p.name for p in paths)
    assert names == sorted(
        f"m_{n}.png"
        for n in ("grad_norm_per_layer", "grad_norm_total", "update_ratio", "grad_histograms", "activations")
    )
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, p
    assert plot_records([], tmp_path) == []


def test_tensorboard_event_file(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    net = crafted_net()
    writer = SummaryWriter(tmp_path)
    mon = GradientMonitor(net, hist_bins=8, name="manual", tensorboard=writer).watch_activations()
    for step in range(2):
        out = net(torch.rand(8, 3, dtype=torch.float64))
        net.zero_grad()
        net.backward(out - 0.5)
        mon.update(step)
        mon.update_after_clip()
    mon.flush()
    writer.close()
    assert list(tmp_path.glob("events.out.tfevents.*"))
    ea = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0, "histograms": 0})
    ea.Reload()
    recs = mon.records
    totals = [e.value for e in ea.Scalars("manual/grad_norm/total")]
    assert totals == pytest.approx([r["total_grad_norm"] for r in recs], rel=1e-6)
    assert len(ea.Scalars("manual/grad_norm/total_after_clip")) == 2
    assert [e.step for e in ea.Scalars("manual/update_ratio/0.weight")] == [0]
    assert len(ea.Scalars("manual/dead_fraction/1")) == 2
    hist = ea.Histograms("manual/grad/0.weight")[-1].histogram_value
    assert hist.num == 12 and list(hist.bucket) == recs[-1]["params"]["0.weight"]["hist_counts"]
    # the free function writes the same tags for a record given later
    writer2 = SummaryWriter(tmp_path / "again")
    to_tensorboard(writer2, recs[0])
    writer2.close()
    assert list((tmp_path / "again").glob("events.out.tfevents.*"))


def test_eval_mode_forwards_are_skipped_unless_asked():
    net = crafted_net()
    twin = net.to_torch()
    x = torch.rand(4, 3, dtype=torch.float64)
    for model in (net, twin):
        mon = GradientMonitor(model).watch_activations()
        model.eval()
        model(x)
        assert mon._activations.latest == {}
        mon.watch_activations(in_eval=True)
        model(x)
        assert list(mon._activations.latest) == ["0", "1", "2", "3", "4", "5"]
        mon.remove()


def test_activations_are_gathered_only_before_recorded_steps():
    net = crafted_net()
    mon = GradientMonitor(net, every=3).watch_activations()
    x = torch.rand(4, 3, dtype=torch.float64)
    gathered = []
    for step in range(7):
        out = net(x)
        gathered.append(bool(mon._activations.latest))
        net.backward(torch.ones_like(out))
        rec = mon.update(step)
        assert (rec is not None) == (step % 3 == 0)
        if rec is not None:
            assert list(rec["activations"]) == ["0", "1", "2", "3", "4", "5"]
    assert gathered == [True, False, False, True, False, False, True]
    mon.update(9)  # not the step after 6: from now on every forward gathers
    for _ in range(2):
        net(x)
        assert mon._activations.latest
        mon._activations.take()


def test_also_records_steps_off_the_interval_with_their_activations():
    """A trainer's run shorter than ``every`` steps is still recorded: its first and last steps, passed as ``also``."""
    net = crafted_net()
    mon = GradientMonitor(net, every=50, also=(1, 15)).watch_activations()
    x = torch.rand(4, 3, dtype=torch.float64)
    gathered = []
    for step in range(1, 16):
        out = net(x)
        gathered.append(bool(mon._activations.latest))
        net.backward(torch.ones_like(out))
        mon.update(step)
    assert [r["step"] for r in mon.records] == [1, 15]
    assert all(r["activations"] for r in mon.records)
    assert [s for s, g in zip(range(1, 16), gathered, strict=True) if g] == [1, 15]  # only before the recorded steps

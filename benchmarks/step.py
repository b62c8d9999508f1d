"""Median time of one training step: hand-written Net vs the nn.Module twin vs the GEMM-only bound.

    python benchmarks/step.py                 # default net (batch 512) and a small one (hidden 128, batch 64)
    python benchmarks/step.py --device cuda --repeats 200

A step is forward, cross-entropy, backward and optimizer step.  The candidates run
interleaved in one process (round-robin, one step each per round), so drift in machine
speed hits all of them alike.  Ratios: "speed vs nn.Module" = t_nn / t (> 1 is faster);
"x GEMM bound" = t / t_gemm, where the bound runs the same matrix products alone.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from autodiff import EngineNet, cross_entropy  # noqa: E402
from layers import Net, PytorchNet  # noqa: E402
from losses import CrossEntropyLoss  # noqa: E402
import optimizers  # noqa: E402


def manual_step(net, opt, crit):
    def step(x, y):
        opt.zero_grad()
        crit(net(x), y)
        net.backward(crit.backward(), need_input_grad=False)
        opt.step()
    return step


def engine_step(model, opt):
    def step(x, y):
        opt.zero_grad()
        cross_entropy(model(x), y).backward()
        opt.step()
    return step


def torch_step(model, opt):
    def step(x, y):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def gemm_bound(net, x):
    """The step's matrix products alone, into preallocated outputs: forward x@W, backward x^T@dout and dout@W^T."""
    weights = [p for name, p in net.named_parameters() if name.endswith("weight")]
    acts = [x]
    for w in weights:
        acts.append(torch.empty(x.shape[0], w.shape[1], device=x.device, dtype=x.dtype))
    dws = [torch.empty_like(w) for w in weights]

    def step(_x, _y):
        for i, w in enumerate(weights):
            torch.mm(acts[i], w, out=acts[i + 1])  # forward (N, H)
        for i in reversed(range(len(weights))):
            torch.mm(acts[i].t(), acts[i + 1], out=dws[i])  # dW (D, H), dout stands in for the activation
            if i > 0:
                torch.mm(acts[i + 1], weights[i].t(), out=acts[i])  # dx (N, D), not needed for the input
    return step


def bench(hidden: int, batch: int, device: torch.device, repeats: int, warmup: int) -> list[tuple[str, float]]:
    torch.manual_seed(0)
    net = Net(hidden_size=hidden, device=device)
    twins = {name: PytorchNet(hidden_size=hidden, device=device) for name in ("sgd", "adam")}
    for t in twins.values():
        t.load_state_dict(net.state_dict())
    nets = {"sgd": net, "adam": Net(hidden_size=hidden, device=device)}
    nets["adam"].load_state_dict(net.state_dict())
    engine = EngineNet(hidden_size=hidden, device=device)
    engine.load_state_dict(net.state_dict())
    x = torch.randn(batch, 784, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    cands = {
        "handgrad Net + handgrad SGD": manual_step(nets["sgd"], optimizers.SGD(nets["sgd"].parameters(), lr=1e-3, momentum=0.9), CrossEntropyLoss()),
        "nn.Module + torch.optim.SGD": torch_step(twins["sgd"], torch.optim.SGD(twins["sgd"].parameters(), lr=1e-3, momentum=0.9)),
        "handgrad Net + handgrad Adam": manual_step(nets["adam"], optimizers.Adam(nets["adam"].parameters(), lr=1e-4), CrossEntropyLoss()),
        "nn.Module + torch.optim.Adam": torch_step(twins["adam"], torch.optim.Adam(twins["adam"].parameters(), lr=1e-4)),
        "autodiff engine + handgrad Adam": engine_step(engine, optimizers.Adam(engine.parameters(), lr=1e-4)),
        "GEMM-only bound": gemm_bound(net, x),
    }
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {k: [] for k in cands}
    for r in range(warmup + repeats):
        for name, step in cands.items():
            sync()
            t0 = time.perf_counter()
            step(x, y)
            sync()
            if r >= warmup:
                times[name].append(time.perf_counter() - t0)
    return [(name, statistics.median(ts)) for name, ts in times.items()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 30 on CPU for the default net)")
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, device {device}"
          f"{' (' + torch.cuda.get_device_name(device) + ')' if device.type == 'cuda' else ''}, "
          f"{torch.get_num_threads()} CPU threads, float32")
    for label, hidden, batch, default_reps in (("default net 784-1024x3-10, batch 512", 1024, 512, 30),
                                               ("small net 784-128x3-10, batch 64", 128, 64, 1000)):
        reps = args.repeats or (default_reps if device.type == "cpu" else 300)
        rows = dict(bench(hidden, batch, device, reps, args.warmup))
        gemm = rows["GEMM-only bound"]
        print(f"\n{label}: median of {reps} interleaved steps")
        print(f"  {'candidate':<33}{'ms/step':>10}{'speed vs nn.Module':>20}{'x GEMM bound':>14}")
        for name, t in rows.items():
            ref = rows["nn.Module + torch.optim.Adam" if "Adam" in name else "nn.Module + torch.optim.SGD"]
            vs = f"{ref / t:.2f}x" if name != "GEMM-only bound" else ""
            print(f"  {name:<33}{t * 1e3:>10.3f}{vs:>20}{t / gemm:>13.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

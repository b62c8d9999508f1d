"""What GradientMonitor costs a training step of the hand-written Net, and that monitoring off costs nothing.

    python benchmarks/monitor.py                  # default net (batch 512) and a small one (hidden 128, batch 64)
    python benchmarks/monitor.py --device cuda

Candidates, run interleaved in one process (one step each per round, so drift hits all alike):
    no monitor (forward without the hook check)   Sequential.forward as it was before forward hooks existed
    no monitor                                    today's forward: one empty-list check per container
    monitor every 50, update() called each step   the trainer's --monitor pattern (49 of 50 calls return early)
    monitor every 50 + activations                plus forward hooks gathering per-layer statistics each forward
    monitor every step                            a full record (and one read-back) each step
    monitor every step + activations
A step is forward, cross-entropy, backward, total-norm clipping and SGD; the monitored candidates add
``update(step)`` before clipping and ``update_after_clip()`` after.  The ratio column is t / t(no monitor).
"""

from __future__ import annotations

import sys

import timing  # a sibling script: benchmarks/ is sys.path[0] when a script here runs
import torch
from timing import interleaved

import optimizers
from layers import Sequential
from losses import CrossEntropyLoss
from models import Net
from monitoring import GradientMonitor


class _NoHookCheck(Net):
    """Net whose container forward is the loop without the ``if self._forward_hooks`` check."""

    def forward(self, x):
        self._in_shape = x.shape
        x = x.flatten(1) if x.dim() > 2 else x
        for layer in self.layers:
            x = layer(x)
        return x


def candidate(net: Sequential, every: int | None, activations: bool):
    opt = optimizers.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    crit = CrossEntropyLoss()
    params = net.parameters()
    mon = None
    if every is not None:
        mon = GradientMonitor(net, every=every)
        if activations:
            mon.watch_activations()
    state = {"step": 0}

    def step(x, y):
        opt.zero_grad()
        crit(net(x), y)
        net.backward(crit.backward())
        if mon is not None:
            mon.update(state["step"])
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        if mon is not None:
            mon.update_after_clip()
        opt.step()
        state["step"] += 1

    return step


def bench(hidden: int, batch: int, device: torch.device, repeats: int, warmup: int) -> dict[str, float]:
    torch.manual_seed(0)
    ref = Net(hidden_size=hidden, device=device)
    specs = {
        "no monitor (forward without the hook check)": (_NoHookCheck, None, False),
        "no monitor": (Net, None, False),
        "monitor every 50": (Net, 50, False),
        "monitor every 50 + activations": (Net, 50, True),
        "monitor every step": (Net, 1, False),
        "monitor every step + activations": (Net, 1, True),
    }
    cands = {}
    for name, (cls, every, acts) in specs.items():
        net = cls(hidden_size=hidden, device=device)
        net.load_state_dict(ref.state_dict())
        cands[name] = candidate(net, every, acts)
    x = torch.randn(batch, 784, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    return interleaved(cands, repeats, warmup, device, (x, y))


def main(argv=None) -> int:
    ap = timing.parser(__doc__)
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 30 / 500 on CPU)")
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args(argv)
    device = args.device
    print(f"{timing.machine(device)}; float32")
    for label, hidden, batch, default_reps in (
        ("default net 784-1024x3-10, batch 512", 1024, 512, 30),
        ("small net 784-128x3-10, batch 64", 128, 64, 500),
    ):
        reps = args.repeats or (default_reps if device.type == "cpu" else 300)
        rows = bench(hidden, batch, device, reps, args.warmup)
        base = rows["no monitor"]
        print(f"\n{label}: median of {reps} interleaved steps")
        print(f"  {'candidate':<46}{'ms/step':>10}{'x no monitor':>14}")
        for name, t in rows.items():
            print(f"  {name:<46}{t * 1e3:>10.3f}{t / base:>13.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

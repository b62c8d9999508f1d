"""``learn train value``: micrograd's demo with your engine, a small MLP of your ``Value``s on two moons.

The two-moons set is made with torch (two interleaved half circles with noise, labels -1 and +1), as
scikit-learn's ``make_moons`` makes it.  The MLP 2 -> 8 -> 8 -> 1 (tanh, tanh, a linear score) is built twice
from the same weights: once of your Values, one scalar node per weight and per operation, and once as float64
torch tensors whose gradients torch.autograd computes.  Both take the same SGD steps on the same batches of
the loss mean((score - label)^2).  This graph is wider and deeper than the checker's expressions: every weight
feeds every example of the batch, so each weight node is used many times.
"""

from __future__ import annotations

import itertools
import math

import torch

from .checker.guard import LearnerFailed, call
from .race import Race

F64 = torch.float64
SIZES = (2, 8, 8, 1)
POINTS, BATCH, LR = 100, 16, 0.05


def two_moons(n: int, noise: float, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n points (n, 2) on two interleaved half circles plus Gaussian noise, and their labels (n,) in {-1, +1}."""
    t = torch.rand(n, generator=g, dtype=F64) * math.pi
    upper = torch.arange(n) % 2 == 0
    x = torch.where(upper, t.cos(), 1 - t.cos())
    y = torch.where(upper, t.sin(), 0.5 - t.sin())
    points = torch.stack([x, y], 1) + noise * torch.randn(n, 2, generator=g, dtype=F64)
    return points, torch.where(upper, -1.0, 1.0).to(F64)


def _weights(g: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(W (out, in), b (out,)) per layer, uniform in [-1, 1) as micrograd draws them."""
    return [
        (torch.rand(o, i, generator=g, dtype=F64) * 2 - 1, torch.rand(o, generator=g, dtype=F64) * 2 - 1)
        for i, o in itertools.pairwise(SIZES)
    ]


def value_race(ex, cls, file: str, seed: int) -> Race:
    g = torch.Generator().manual_seed(seed)
    points, labels = two_moons(POINTS, 0.1, g)
    init = _weights(g)
    mine = call(
        f"{cls.__name__}(...)",
        lambda: [([[cls(w) for w in row] for row in W.tolist()], [cls(v) for v in b.tolist()]) for W, b in init],
        where=file,
    )
    nodes = [p for W, b in mine for p in [*(w for row in W for w in row), *b]]
    twin = [(W.clone().requires_grad_(), b.clone().requires_grad_()) for W, b in init]
    batches = {}

    def batch(step):
        if step not in batches:
            batches[step] = torch.randint(0, POINTS, (BATCH,), generator=g)
        return batches[step]

    def forward_mine(idx):
        total = 0
        for n in idx.tolist():
            act = [cls(v) for v in points[n].tolist()]
            for k, (W, b) in enumerate(mine):
                act = [
                    sum((w * a for w, a in zip(row, act, strict=True)), bias) for row, bias in zip(W, b, strict=True)
                ]
                if k < len(mine) - 1:
                    act = [a.tanh() for a in act]
            total = total + (act[0] - float(labels[n])) ** 2
        loss = total / len(idx)
        loss.backward()
        return loss

    def step_mine(step):
        loss = call("a training step with your Values", forward_mine, batch(step), where=file)
        for p in nodes:
            if not isinstance(p.grad, (int, float)) or not math.isfinite(p.grad):
                raise LearnerFailed(f"a weight's .grad is {p.grad!r} after backward: it should be a finite float")
            p.data -= LR * p.grad
            p.grad = 0.0
        return float(loss.data)

    def step_twin(step):
        idx = batches.pop(step)
        act = points[idx]
        for k, (W, b) in enumerate(twin):
            act = act @ W.T + b
            if k < len(twin) - 1:
                act = act.tanh()
        loss = ((act[:, 0] - labels[idx]) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for p in (t for pair in twin for t in pair):
                p -= LR * p.grad
                p.grad = None
        return float(loss.detach())

    count = sum(W.numel() + b.numel() for W, b in init)
    return Race(
        [
            f"Training an MLP of your {ex.cls}s beside torch.autograd: exercise {ex.name}, from {file}",
            f"  data: two moons, {POINTS} points made with torch (noise 0.1), labels -1 and +1",
            f"  network: {' -> '.join(map(str, SIZES))}, tanh between, {count} weights, one {ex.cls} each; "
            f"loss mean((score - label)^2)",
            f"  SGD, lr {LR}, batches of {BATCH}; the twin: the same MLP in float64 torch tensors, "
            f"torch.autograd's gradients",
        ],
        step_mine,
        {"torch.autograd": step_twin},
        first_part="the losses differ before any update: your forward (an operation's data) differs",
        later_part="the first steps agree, so the forward is right; the update after them differed: a "
        "gradient (a _backward, or backward()'s walk) is wrong",
    )

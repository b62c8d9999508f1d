"""``learn train broadcast``: your ScaleShift as a learnable per-feature scale and shift inside an MLP, beside the
same MLP whose ScaleShift torch.autograd differentiates.

    Linear(196, 24) -> ScaleShift(h, scale (1, 24), shift (24,)) [yours] -> ReLU -> Linear(24, 10) -> cross-entropy

scale and shift are parameters of the model and inputs of your layer: your backward's dscale and dshift are
their gradients, so a gradient not summed back to (1, 24) and (24,) cannot update them.  Both models start from
the same weights, see the same batches and take the same SGD steps.
"""

from __future__ import annotations

import torch

import layers
from losses import CrossEntropyLoss

from .checker.guard import LearnerFailed, call
from .data import small_task
from .race import Race
from .train_layers import BATCH, LR, H

F64 = torch.float64


def _side(cls, state, where, yours: bool):
    """One model: (its parameters, forward-and-backward of a batch -> the loss)."""
    lin1, lin2 = layers.Linear(196, H, dtype=F64), layers.Linear(H, 10, dtype=F64)
    lin1.load_state_dict(state[0])
    lin2.load_state_dict(state[1])
    scale, shift = state[2].clone(), state[3].clone()
    relu, crit = layers.ReLU(), CrossEntropyLoss()
    op = call(f"{cls.__name__}()", cls, where=where) if yours else None

    def forward_backward(x, y):
        h = lin1.forward(x)
        if yours:
            out = call(f"your {cls.__name__}.forward", op.forward, h, scale, shift, where=where)
        else:
            with torch.enable_grad():
                leaves = [t.detach().requires_grad_() for t in (h, scale, shift)]
                made = leaves[0] * leaves[1] + leaves[2]
            out = made.detach()
        loss = crit.forward(lin2.forward(relu.forward(out)), y)
        dout = relu.backward(lin2.backward(crit.backward()))
        if yours:
            got = call(f"your {cls.__name__}.backward", op.backward, dout, where=where)
            if not (isinstance(got, (tuple, list)) and len(got) == 3):
                raise LearnerFailed(f"your {cls.__name__}.backward must return (dx, dscale, dshift)")
            dh, dscale, dshift = got
        else:
            dh, dscale, dshift = torch.autograd.grad(made, leaves, dout)
        for p, g in ((scale, dscale), (shift, dshift)):
            if not isinstance(g, torch.Tensor) or g.shape != p.shape:
                got = tuple(g.shape) if isinstance(g, torch.Tensor) else type(g).__name__
                raise LearnerFailed(
                    f"your {cls.__name__}.backward gave a gradient of shape {got} for a parameter of "
                    f"shape {tuple(p.shape)}: each gradient has its input's shape"
                )
            p.grad = g
        lin1.backward(dh)
        return float(loss)

    return [*lin1.parameters(), *lin2.parameters(), scale, shift], forward_backward


def broadcast_race(ex, cls, file: str, seed: int) -> Race:
    x, y, data = small_task(seed=seed)
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    state = [
        layers.Linear(196, H, dtype=F64).state_dict(),
        layers.Linear(H, 10, dtype=F64).state_dict(),
        1 + 0.1 * torch.randn(1, H, generator=g, dtype=F64),
        0.1 * torch.randn(H, generator=g, dtype=F64),
    ]
    sides = {who: _side(cls, state, file, who == "yours") for who in ("yours", "autograd")}
    batches = {}

    def stepper(who):
        params, forward_backward = sides[who]

        def step(k):
            if k not in batches:
                idx = torch.randint(0, len(x), (BATCH,), generator=g)
                batches[k] = [x[idx].reshape(BATCH, -1), y[idx], 0]
            b = batches[k]
            loss = (
                call("a training step with your layer", forward_backward, b[0], b[1], where=file)
                if who == "yours"
                else forward_backward(b[0], b[1])
            )
            for p in params:
                with torch.no_grad():
                    p -= LR * p.grad
                p.grad = None
            b[2] += 1
            if b[2] == len(sides):
                del batches[k]
            return loss

        return step

    return Race(
        [
            f"Training your {ex.cls} beside torch.autograd's: exercise {ex.name}, from {file}",
            f"  data: {data}",
            "  network: Linear(196, 24) -> ScaleShift(h, scale (1, 24), shift (24,)) [yours] -> ReLU -> "
            "Linear(24, 10) -> cross-entropy",
            f"  SGD, lr {LR}, batches of {BATCH}; the twin: the same network, its ScaleShift differentiated by "
            f"torch.autograd",
        ],
        stepper("yours"),
        {"autograd": stepper("autograd")},
    )

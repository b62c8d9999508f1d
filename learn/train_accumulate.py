"""``learn train accumulate``: your Accumulate, each batch in micro-batches, beside one pass over the whole batch.

Your linear model takes batches of 32 in micro-batches of 5 (the last one shorter), zero_grad before each batch,
then an SGD step; the twin, handgrad's Linear(196, 10) and MSELoss, takes each batch at once.  The same
weights, batches and steps: with a right answer the losses agree at every step, as the gradients do.
"""

from __future__ import annotations

import torch

import layers
from losses import MSELoss

from .checker.guard import LearnerFailed, call
from .data import small_task
from .race import Race
from .train_layers import BATCH, LR, forward_backward

F64 = torch.float64
MICRO = 5  # rows per micro-batch: 32 is no multiple of it, so the last micro-batch is shorter


def accumulate_race(ex, cls, file: str, seed: int) -> Race:
    x, y, data = small_task(seed=seed)
    torch.manual_seed(seed)
    twin = layers.Linear(196, 10, dtype=F64)
    shown = f"{cls.__name__}(196, 10, micro_batch={MICRO})"
    mine = call(shown, lambda: cls(196, 10, MICRO), where=file)
    params = []
    for name, tp in twin.named_parameters():
        p = getattr(mine, name, None)
        if not isinstance(p, torch.Tensor) or p.shape != tp.shape or p.dtype != F64:
            raise LearnerFailed(f"your {shown} has no float64 {name} of shape {tuple(tp.shape)}")
        with torch.no_grad():
            p.copy_(tp)
        params.append(p)
    g = torch.Generator().manual_seed(seed)
    batches = {}

    def batch(k):
        if k not in batches:
            idx = torch.randint(0, len(x), (BATCH,), generator=g)
            batches[k] = (x[idx].reshape(BATCH, -1), y[idx])
        return batches[k]

    def step_mine(k):
        xb, yb = batch(k)
        call(f"your {cls.__name__}.zero_grad", mine.zero_grad, where=file)
        loss = call(
            f"your {cls.__name__}.forward_backward",
            mine.forward_backward,
            xb,
            torch.nn.functional.one_hot(yb, 10).to(F64),
            where=file,
        )
        for p in params:
            if p.grad is None:
                raise LearnerFailed(f"a parameter of shape {tuple(p.shape)} has no .grad after forward_backward")
            with torch.no_grad():
                p -= LR * p.grad
        return float(loss)

    def step_twin(k):
        loss = forward_backward([twin], MSELoss(), *batches.pop(k), True)
        for p in twin.parameters():
            with torch.no_grad():
                p -= LR * p.grad
            p.grad = None
        return loss

    return Race(
        [
            f"Training your {ex.cls} beside one pass over each batch: exercise {ex.name}, from {file}",
            f"  data: {data}",
            f"  model: {shown} [yours]: batches of {BATCH} in micro-batches of {MICRO}, "
            f"zero_grad before each batch; the twin: handgrad's Linear(196, 10) and MSELoss on the whole batch",
            f"  mean squared error against the one-hot label, SGD, lr {LR}, the same weights and batches",
        ],
        step_mine,
        {"handgrad": step_twin},
    )

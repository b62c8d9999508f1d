"""``learn train`` for the model-parallel exercises: the learner's split or sharded MLP beside one fused process.

linear_split: the MLP 196 -> 24 -> 10 (ReLU) with both Linears the learner's, its backward run as a zero-bubble
pipeline stage runs it: B of every layer from the last to the first (the dx chain), then W of every layer, in B's
order.  tensor_parallel: the learner's TensorParallelMLP(196, 24, 10, ranks=4) (tanh) beside handgrad's Linear ->
Tanh -> Linear in one process.  The twin is handgrad's layers with their fused backward, from the same weights on
the same batches; SGD, cross-entropy, float64, as ``learn/train.py``'s races.
"""

from __future__ import annotations

import torch

import layers
from losses import CrossEntropyLoss

from .checker.guard import LearnerFailed, call
from .data import small_task
from .files import check_command
from .race import Race
from .train_layers import BATCH, F64, LR, H, build, sgd

RANKS = 4  # H = 24 divides by it


def flat_batches(x, y, seed: int):
    """step -> (images flattened to (BATCH, 196), labels), drawn once from ``seed``: both sides of a race see the
    same."""
    g = torch.Generator().manual_seed(seed)
    drawn = {}

    def batch(step):  # the same batch for both, drawn once
        if step not in drawn:
            idx = torch.randint(0, len(x), (BATCH,), generator=g)
            drawn[step] = (x[idx].reshape(BATCH, -1), y[idx])
        return drawn[step]

    return batch


def _fused(net, crit, xb, yb) -> float:
    out = xb
    for layer in net:
        out = layer.forward(out)
    loss = crit.forward(out, yb)
    d = crit.backward()
    for layer in reversed(net):
        d = layer.backward(d)
    return float(loss)


def _split(net, crit, xb, yb, cls) -> float:
    """Forward, then B of each layer back to the first, then the learner's layers' W in B's order."""
    out = xb
    for layer in net:
        out = layer.forward(out)
    loss = crit.forward(out, yb)
    d, waiting = crit.backward(), []
    for layer in reversed(net):
        if isinstance(layer, cls):
            d = layer.backward_input(d)
            waiting.append(layer)
        else:
            d = layer.backward(d)
    for layer in waiting:  # the W passes, later, in the order of their B passes
        layer.backward_weight()
    return float(loss)


def split_race(ex, cls, file: str, seed: int) -> Race:
    x, y, data = small_task(seed=seed)
    mine, twin, crit_mine, crit_twin, pairs, what = build("linear", cls, seed, file)
    mine_params, twin_params = [p for p, _ in pairs], [tp for _, tp in pairs]
    batch = flat_batches(x, y, seed)

    def step_mine(step):
        loss = call(
            "a training step with your Linear's B and W", _split, mine, crit_mine, *batch(step), cls, where=file
        )
        sgd(mine_params, f"your {ex.cls}")
        return loss

    def step_twin(step):
        loss = _fused(twin, crit_twin, *batch(step))
        sgd(twin_params, "handgrad's network")
        return loss

    return Race(
        [
            f"Training your {ex.cls}'s B and W beside handgrad's fused backward: exercise {ex.name}, from {file}",
            f"  data: {data}",
            f"  network: {what}; backward: B of each layer, last to first, then each W",
            f"  SGD, lr {LR}, batches of {BATCH}; the twin: handgrad's layers, the same initial weights and batches",
        ],
        step_mine,
        {"handgrad": step_twin},
    )


def parallel_race(ex, cls, file: str, seed: int) -> Race:
    x, y, data = small_task(seed=seed)
    torch.manual_seed(seed)
    twin = [layers.Linear(196, H, dtype=F64), layers.Tanh(), layers.Linear(H, 10, dtype=F64)]
    shown = f"{cls.__name__}(196, {H}, 10, ranks={RANKS})"
    mlp = call(shown, lambda: cls(196, H, 10, RANKS), where=file)
    pairs = []
    for name, tp in (
        ("weight1", twin[0].weight),
        ("bias1", twin[0].bias),
        ("weight2", twin[2].weight),
        ("bias2", twin[2].bias),
    ):
        p = getattr(mlp, name, None)
        if not isinstance(p, torch.Tensor) or p.shape != tp.shape or p.dtype != F64:
            raise LearnerFailed(
                f"your {shown} has no float64 {name} of shape {tuple(tp.shape)} "
                f"({check_command(ex.name, file)} says more)"
            )
        with torch.no_grad():
            p.copy_(tp)  # in place: the shards are views of it
        pairs.append((p, tp))
    crit_mine, crit_twin = CrossEntropyLoss(), CrossEntropyLoss()
    batch = flat_batches(x, y, seed)

    def one(xb, yb):
        loss = crit_mine.forward(mlp.forward(xb), yb)
        mlp.backward(crit_mine.backward())
        return float(loss)

    def step_mine(step):
        loss = call("a training step with your TensorParallelMLP", one, *batch(step), where=file)
        sgd([p for p, _ in pairs], f"your {ex.cls}")
        return loss

    def step_twin(step):
        loss = _fused(twin, crit_twin, *batch(step))
        sgd([tp for _, tp in pairs], "handgrad's network")
        return loss

    return Race(
        [
            f"Training your {ex.cls} over {RANKS} simulated ranks beside one process: exercise {ex.name}, from {file}",
            f"  data: {data}",
            f"  network: {shown} [yours]; the twin {' -> '.join(map(repr, twin))} -> cross-entropy",
            f"  SGD, lr {LR}, batches of {BATCH}; the same initial weights and batches",
        ],
        step_mine,
        {"one process": step_twin},
    )

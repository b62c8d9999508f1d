"""``learn train`` for the layer and loss exercises (NETWORKS): the learner's layer in a small image network beside
the same network of handgrad's layers, and the pieces the other races share (``build``, ``forward_backward``,
``sgd``, the sizes).  Everything is float64: with a right answer the losses agree to round-off at every step; a
wrong forward parts them at step 1, a wrong gradient at step 2 (the first update differs)."""

from __future__ import annotations

import functools

import torch

import layers
from losses import CrossEntropyLoss, MSELoss

from .checker.guard import LearnerFailed, call
from .data import small_task
from .files import check_command
from .race import Race

F64 = torch.float64
LR, BATCH = 0.1, 32
H = 24  # the hidden width: not the batch size, so a sum over the wrong axis cannot fit by chance

_MLP = [("linear", (196, H)), ("relu", ()), ("linear", (H, 10))]
_CNN = [("conv2d", (1, 4, 3)), ("relu", ()), ("maxpool2d", (2,)), ("flatten", ()), ("linear", (196, 10))]
NETWORKS = {  # the layers of each exercise's network; the layers of the exercise's kind are the learner's
    "linear": _MLP,
    "relu": _MLP,
    "mse": _MLP,
    "softmax_cross_entropy": _MLP,
    "tanh": [("linear", (196, H)), ("tanh", ()), ("linear", (H, 10))],
    "sigmoid": [("linear", (196, H)), ("sigmoid", ()), ("linear", (H, 10))],
    "batchnorm": [("linear", (196, H)), ("batchnorm", (H,)), ("relu", ()), ("linear", (H, 10))],
    "layernorm": [("linear", (196, H)), ("layernorm", (H,)), ("relu", ()), ("linear", (H, 10))],
    "gelu": [("linear", (196, H)), ("gelu", ()), ("linear", (H, 10))],
    "dropout": [("linear", (196, H)), ("relu", ()), ("dropout", (0.2, 5)), ("linear", (H, 10))],
    "conv2d": _CNN,
    "maxpool2d": _CNN,
}
_KW = {"conv2d": {"padding": 1}}  # keyword arguments of the layer beyond NETWORKS' positional ones


def _handgrad(kind: str, args: tuple):
    make = {
        "linear": lambda: layers.Linear(*args, dtype=F64),
        "relu": layers.ReLU,
        "tanh": layers.Tanh,
        "sigmoid": layers.Sigmoid,
        "batchnorm": lambda: layers.BatchNorm1d(*args, dtype=F64),
        "layernorm": lambda: layers.LayerNorm(*args, dtype=F64),
        "flatten": layers.Flatten,
        "conv2d": lambda: layers.Conv2d(*args, **_KW["conv2d"], dtype=F64),
        "maxpool2d": lambda: layers.MaxPool2d(*args),
        "gelu": layers.GELU,
        "dropout": lambda: _seeded_dropout(*args),
    }[kind]
    return make()


def _seeded_dropout(p: float, seed: int):
    """handgrad's Dropout drawing its masks from a generator seeded as the exercise's Dropout(p, seed) seeds its
    own: both drop the same elements, step after step."""
    layer = layers.Dropout(p)
    layer.generator = torch.Generator().manual_seed(seed)
    return layer


def build(name: str, cls: type, seed: int, where: str):
    """(your layers, handgrad's layers, your loss, handgrad's loss, [(your parameter, its twin)], description)."""
    torch.manual_seed(seed)
    twin = [_handgrad(kind, args) for kind, args in NETWORKS[name]]
    mine, pairs, parts = [], [], []
    for (kind, args), t in zip(NETWORKS[name], twin, strict=True):
        if kind != name:  # not the exercise's layer: handgrad's on both sides
            layer = _handgrad(kind, args)
            layer.load_state_dict(t.state_dict())
            pairs += list(zip(layer.parameters(), t.parameters(), strict=True))
            mine.append(layer)
            parts.append(repr(t))
            continue
        kw = _KW.get(kind, {})
        shown = f"{cls.__name__}({', '.join([*map(repr, args), *(f'{k}={v!r}' for k, v in kw.items())])})"
        layer = call(shown, functools.partial(cls, *args, **kw), where=where)
        for pname, tp in t.named_parameters():
            p = getattr(layer, pname, None)
            if not isinstance(p, torch.Tensor) or p.shape != tp.shape or p.dtype != F64:
                raise LearnerFailed(
                    f"your {shown} has no float64 {pname} of shape {tuple(tp.shape)} "
                    f"({check_command(name, where)} says more)"
                )
            with torch.no_grad():
                p.copy_(tp)  # the same initial weights as the twin's
            pairs.append((p, tp))
        mine.append(layer)
        parts.append(f"{shown} [yours]")
    loss = "mean squared error against the one-hot target" if name == "mse" else "cross-entropy"
    twin_crit = MSELoss() if name == "mse" else CrossEntropyLoss()
    if name in ("mse", "softmax_cross_entropy"):
        my_crit = call(f"{cls.__name__}()", cls, where=where)
        loss += f" [{cls.__name__}, yours]"
    else:
        my_crit = MSELoss() if name == "mse" else CrossEntropyLoss()
    return mine, twin, my_crit, twin_crit, pairs, " -> ".join(parts) + f" -> {loss}"


def forward_backward(net, crit, x, y, target_onehot: bool) -> float:
    """Forward, loss and backward through ``net``; the gradients land in .grad.  -> the loss."""
    out = x
    for layer in net:
        out = layer.forward(out)
    target = torch.nn.functional.one_hot(y, 10).to(F64) if target_onehot else y
    loss = crit.forward(out, target)
    d = crit.backward()
    for layer in reversed(net):
        d = layer.backward(d)
    return float(loss)


def sgd(params: list[torch.Tensor], who: str) -> None:
    for p in params:
        if p.grad is None:
            raise LearnerFailed(
                f"a parameter of shape {tuple(p.shape)} of {who} has no .grad after backward: the "
                f"backward must add its gradient into .grad"
            )
        with torch.no_grad():
            p -= LR * p.grad
        p.grad = None


def layer_race(ex, cls, file: str, seed: int) -> Race:
    """The learner's layer (or loss) in a small network beside the same network of handgrad's layers."""
    x, y, data = small_task(seed=seed)
    mine, twin, crit_mine, crit_twin, pairs, what = build(ex.name, cls, seed, file)
    mine_params, twin_params = [p for p, _ in pairs], [tp for _, tp in pairs]
    onehot = ex.name == "mse"
    flat = NETWORKS[ex.name][0][0] == "linear"
    g = torch.Generator().manual_seed(seed)
    batches = {}

    def batch(step):  # the same batch for both, drawn once
        if step not in batches:
            idx = torch.randint(0, len(x), (BATCH,), generator=g)
            batches[step] = (x[idx].reshape(BATCH, -1) if flat else x[idx], y[idx])
        return batches[step]

    def step_mine(step):
        xb, yb = batch(step)
        loss = call("a training step with your layer", forward_backward, mine, crit_mine, xb, yb, onehot, where=file)
        sgd(mine_params, f"your {ex.cls}")
        return loss

    def step_twin(step):
        loss = forward_backward(twin, crit_twin, *batch(step), onehot)
        sgd(twin_params, "handgrad's network")
        batches.pop(step)
        return loss

    return Race(
        [
            f"Training your {ex.cls} beside handgrad's: exercise {ex.name}, from {file}",
            f"  data: {data}",
            f"  network: {what}",
            f"  SGD, lr {LR}, batches of {BATCH}; the twin: handgrad's layers, the same initial weights and batches",
        ],
        step_mine,
        {"handgrad": step_twin},
    )

"""python -m learn train NAME FILE: your layer trains in a small network beside the same network with handgrad's.

Both networks start from the same weights (yours are copied from handgrad's layer), see the same batches and
take the same SGD steps, in float64.  With a right layer the two losses agree to round-off at every step; a
wrong forward parts them at step 1, a wrong gradient at step 2 (the first update differs).  Exit 0 when they
agree to TOL at every step, 1 when they part (or your code raises), 2 when the file cannot be used.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

import layers
from losses import CrossEntropyLoss, MSELoss

from .checker.guard import LearnerFailed, call
from .checker.load import LoadError, load_class
from .data import small_task
from .exercises import BY_NAME

F64 = torch.float64
TOL = 1e-6  # relative difference of the two losses that counts as parting (a right layer: ~1e-15)
LR, BATCH = 0.1, 32
H = 24  # the hidden width: not the batch size, so a sum over the wrong axis cannot fit by chance

_MLP = [("linear", (196, H)), ("relu", ()), ("linear", (H, 10))]
_CNN = [("conv2d", (1, 4, 3)), ("relu", ()), ("maxpool2d", (2,)), ("flatten", ()), ("linear", (196, 10))]
NETWORKS = {  # the layers of each exercise's network; the layers of the exercise's kind are the learner's
    "linear": _MLP, "relu": _MLP, "mse": _MLP, "softmax_cross_entropy": _MLP,
    "tanh": [("linear", (196, H)), ("tanh", ()), ("linear", (H, 10))],
    "sigmoid": [("linear", (196, H)), ("sigmoid", ()), ("linear", (H, 10))],
    "batchnorm": [("linear", (196, H)), ("batchnorm", (H,)), ("relu", ()), ("linear", (H, 10))],
    "layernorm": [("linear", (196, H)), ("layernorm", (H,)), ("relu", ()), ("linear", (H, 10))],
    "conv2d": _CNN, "maxpool2d": _CNN,
}
_KW = {"conv2d": {"padding": 1}}  # keyword arguments of the layer beyond NETWORKS' positional ones


def _handgrad(kind: str, args: tuple):
    make = {"linear": lambda: layers.Linear(*args, dtype=F64), "relu": layers.ReLU, "tanh": layers.Tanh,
            "sigmoid": layers.Sigmoid, "batchnorm": lambda: layers.BatchNorm1d(*args, dtype=F64),
            "layernorm": lambda: layers.LayerNorm(*args, dtype=F64), "flatten": layers.Flatten,
            "conv2d": lambda: layers.Conv2d(*args, **_KW["conv2d"], dtype=F64),
            "maxpool2d": lambda: layers.MaxPool2d(*args)}[kind]
    return make()


def build(name: str, cls: type, seed: int, where: str):
    """(your layers, handgrad's layers, your loss, handgrad's loss, [(your parameter, its twin)], description)."""
    torch.manual_seed(seed)
    twin = [_handgrad(kind, args) for kind, args in NETWORKS[name]]
    mine, pairs, parts = [], [], []
    for (kind, args), t in zip(NETWORKS[name], twin):
        if kind != name:  # not the exercise's layer: handgrad's on both sides
            layer = _handgrad(kind, args)
            layer.load_state_dict(t.state_dict())
            pairs += list(zip(layer.parameters(), t.parameters()))
            mine.append(layer)
            parts.append(repr(t))
            continue
        kw = _KW.get(kind, {})
        shown = f"{cls.__name__}({', '.join([*map(repr, args), *(f'{k}={v!r}' for k, v in kw.items())])})"
        layer = call(shown, lambda: cls(*args, **kw), where=where)
        for pname, tp in t.named_parameters():
            p = getattr(layer, pname, None)
            if not isinstance(p, torch.Tensor) or p.shape != tp.shape or p.dtype != F64:
                raise LearnerFailed(f"your {shown} has no float64 {pname} of shape {tuple(tp.shape)} "
                                    f"(python -m learn check {name} FILE says more)")
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


def _step(net, crit, x, y, target_onehot: bool) -> float:
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


def _sgd(params: list[torch.Tensor], who: str) -> None:
    for p in params:
        if p.grad is None:
            raise LearnerFailed(f"a parameter of shape {tuple(p.shape)} of {who} has no .grad after backward: the "
                                f"backward must add its gradient into .grad")
        with torch.no_grad():
            p -= LR * p.grad
        p.grad = None


def main(args) -> int:
    ex = BY_NAME.get(args.name)
    if ex is None or ex.name not in NETWORKS:
        print(f"python -m learn train works with the layer exercises {', '.join(NETWORKS)}; not {args.name!r}")
        return 2
    if args.steps < 1:
        print(f"--steps must be at least 1, got {args.steps}")
        return 2
    try:
        cls = load_class(Path(args.file), ex.cls, ex.name)
    except LoadError as e:
        print(f"Cannot train {args.file}: {e}")
        return 2
    x, y, data = small_task(seed=args.seed)
    try:
        mine, twin, crit_mine, crit_twin, pairs, what = build(ex.name, cls, args.seed, args.file)
    except LearnerFailed as e:
        print(e.text)
        return 1
    mine_params, twin_params = [p for p, _ in pairs], [tp for _, tp in pairs]
    onehot = ex.name == "mse"
    flat = NETWORKS[ex.name][0][0] == "linear"
    print(f"Training your {ex.cls} beside handgrad's: exercise {ex.name}, from {args.file}")
    print(f"  data: {data}")
    print(f"  network: {what}\n  SGD, lr {LR}, batches of {BATCH}, {args.steps} steps; the twin: handgrad's "
          f"layers, the same initial weights and batches")
    g = torch.Generator().manual_seed(args.seed)
    show_all = args.steps <= 50
    print(f"{'step':>6} {'your loss':>14} {'handgrad':>14} {'difference':>11}")
    ours, theirs, parted = [], [], None
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, len(x), (BATCH,), generator=g)
        xb = x[idx].reshape(BATCH, -1) if flat else x[idx]
        try:
            a = call("a training step with your layer", _step, mine, crit_mine, xb, y[idx], onehot, where=args.file)
            _sgd(mine_params, f"your {ex.cls}")
        except LearnerFailed as e:
            print(e.text)
            print(f"PART at step {step}: your code raised.  python -m learn check {ex.name} {args.file} tries it on "
                  f"small inputs and says more.")
            return 1
        b = _step(twin, crit_twin, xb, y[idx], onehot)
        _sgd(twin_params, "handgrad's network")
        ours.append(a)
        theirs.append(b)
        diff = abs(a - b) if math.isfinite(a) else float("inf")
        if parted is None and diff > TOL * max(1.0, abs(b)):
            parted = step
        if show_all or step % 10 == 0 or step == parted or step == args.steps:
            print(f"{step:>6} {a:>14.8f} {b:>14.8f} {diff:>11.1e}" + ("   <- they part" if step == parted else ""))
        if not math.isfinite(a):
            print("your loss is no longer finite: stopping")
            break
    if args.plot:
        _plot(Path(args.plot), ours, theirs, parted, ex)
    if parted is None:
        worst = max(abs(a - b) for a, b in zip(ours, theirs))
        print(f"AGREE: {len(ours)} steps, the two losses never more than {worst:.1e} apart (tolerance {TOL:g} "
              f"relative): your {ex.cls} trains as handgrad's does.")
        return 0
    why = ("the forward differs (both start from the same weights)" if parted == 1 else
           "the first steps agree, so the forward is right; the update after them differed: a gradient is wrong")
    print(f"PART at step {parted}: {why}.  python -m learn check {ex.name} {args.file} names the tensor and, most "
          f"often, the mistake.")
    return 1


def _plot(path: Path, ours: list[float], theirs: list[float], parted: int | None, ex) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no plot: matplotlib is not installed)")
        return
    fig, (ax, low) = plt.subplots(2, 1, figsize=(6.4, 5.2), sharex=True, height_ratios=(3, 2))
    steps = range(1, len(ours) + 1)
    ax.plot(steps, theirs, lw=3, alpha=0.5, label="handgrad's")
    ax.plot(steps, ours, lw=1.2, ls="--", label=f"yours ({ex.cls})")
    low.semilogy(steps, [max(abs(a - b), 1e-18) for a, b in zip(ours, theirs)], lw=1.2, color="black")
    low.axhline(TOL, color="gray", ls=":", lw=1, label=f"tolerance {TOL:g}")
    for a in (ax, low):
        if parted is not None:
            a.axvline(parted, color="red", lw=0.8, label=f"they part (step {parted})")
    ax.set_ylabel("training loss")
    low.set_ylabel("|difference|")
    low.set_xlabel("step")
    ax.set_title(f"learn train {ex.name}: your layer beside handgrad's")
    ax.legend()
    low.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot: {path}")

"""``learn train adam`` (and rmsprop, sgd_momentum): your optimizer against torch.optim's and handgrad's, each
training the same MLP.

Three copies of one MLP 196 -> 24 -> 10 (handgrad's layers; cross-entropy on ``learn.data.small_task``'s
images) start from the same weights and see the same batches; only the optimizer differs.  The step 1 losses
agree whatever the optimizer does (nothing has been updated yet); a wrong update parts them at step 2.  The
hyperparameters differ from the checker's, and the run is long enough for the bias correction to fade.
"""

from __future__ import annotations

import torch

import layers
import optimizers
from losses import CrossEntropyLoss

from .checker.guard import LearnerFailed, call
from .data import small_task
from .race import Race
from .train_layers import BATCH, H, forward_backward

F64 = torch.float64
HYPER = {"lr": 0.01, "betas": (0.85, 0.99), "eps": 1e-7}
OPTIMIZERS = {  # exercise -> (hyperparameters, torch.optim's, handgrad's)
    "adam": (HYPER, torch.optim.Adam, optimizers.Adam),
    "rmsprop": ({"lr": 0.005, "alpha": 0.95, "eps": 1e-7}, torch.optim.RMSprop, optimizers.RMSprop),
    "sgd_momentum": ({"lr": 0.05, "momentum": 0.9, "nesterov": True}, torch.optim.SGD, optimizers.SGD),
}


def _mlp(state=None) -> list:
    net = [layers.Linear(196, H, dtype=F64), layers.ReLU(), layers.Linear(H, 10, dtype=F64)]
    for layer, s in zip(net, state or [None] * len(net), strict=True):
        if s:
            layer.load_state_dict(s)
    return net


def adam_race(ex, cls, file: str, seed: int) -> Race:
    """The learner's optimizer of exercise ``ex`` (adam, rmsprop, sgd_momentum) beside torch.optim's and handgrad's."""
    hyper, theirs, ours = OPTIMIZERS[ex.name]
    ref, hand = f"torch.optim.{theirs.__name__}", f"handgrad {ours.__name__}"
    x, y, data = small_task(seed=seed)
    torch.manual_seed(seed)
    first = _mlp()
    state = [layer.state_dict() for layer in first]
    nets = {"yours": first, ref: _mlp(state), hand: _mlp(state)}
    params = {k: [p for layer in net for p in layer.parameters()] for k, net in nets.items()}
    shown = f"{cls.__name__}(params, {', '.join(f'{k}={v}' for k, v in hyper.items())})"
    opts = {
        "yours": call(shown, lambda: cls(params["yours"], **hyper), where=file),
        ref: theirs(params[ref], **hyper),
        hand: ours(params[hand], **hyper),
    }
    g = torch.Generator().manual_seed(seed)
    batches = {}

    def stepper(who):
        def step(k):
            if k not in batches:
                idx = torch.randint(0, len(x), (BATCH,), generator=g)
                batches[k] = [x[idx].reshape(BATCH, -1), y[idx], 0]
            b = batches[k]
            loss = forward_backward(nets[who], CrossEntropyLoss(), b[0], b[1], False)
            if who == "yours":
                with torch.no_grad():  # the parameters may require grad: an in-place update is allowed only here
                    call(f"your {cls.__name__}.step()", opts[who].step, where=file)
                if any(not torch.isfinite(p).all() for p in params[who]):
                    raise LearnerFailed(f"your {cls.__name__}.step() made a parameter inf or nan")
            else:
                opts[who].step()
            for p in params[who]:
                p.grad = None
            b[2] += 1
            if b[2] == len(nets):
                del batches[k]
            return loss

        return step

    return Race(
        [
            f"Training an MLP with your {ex.cls} beside {ref} and handgrad's: exercise {ex.name}, from {file}",
            f"  data: {data}",
            "  network: Linear(196, 24) -> ReLU -> Linear(24, 10) -> cross-entropy, handgrad's layers, three "
            "copies from the same weights",
            f"  optimizer: {shown}, batches of {BATCH}; the twins: the same with {ref} and with "
            f"optimizers.{ours.__name__}",
        ],
        stepper("yours"),
        {ref: stepper(ref), hand: stepper(hand)},
        first_part="the losses differ before any update: the network is not the same",
        later_part="the first steps agree, so the gradients were the same; the update after them differed: "
        "your step() is wrong",
        still_learns="Your loss still falls?  A wrong update can still train: a falling loss checks "
        "nothing; only the\ncomparison with the right update says your step() is right.",
    )

"""The checks of exercises mse and softmax_cross_entropy, and their known mistakes."""

import torch

from ..spec import LayerSpec, normal, wrong


def _mse_inputs(g, n=4, c=3):
    return {"input": normal(g, n, c), "target": normal(g, n, c)}


def _random_mse(g):
    n, c = (int(v) for v in torch.randint(1, 8, (2,), generator=g))
    return {"label": f"N = {n}, C = {c}", "inputs": lambda g2: _mse_inputs(g2, n, c)}


MSE = LayerSpec(
    name="mse",
    cls="MSELoss",
    ctor={},
    params={},
    inputs=_mse_inputs,
    loss=True,
    constants=("target",),
    reference=lambda t: {"loss": ((t.input - t.target) ** 2).mean()},
    formula=lambda c: {"dinput": 2 * (c.input - c.target) / c.input.numel()},
    saved={"input": "the input", "target": "the target"},
    configs=[
        {"label": "one example (N = 1, C = 6)", "inputs": lambda g: _mse_inputs(g, 1, 6)},
        {"label": "N = 5, C = 2", "inputs": lambda g: _mse_inputs(g, 5, 2)},
    ],
    random=_random_mse,
    mistakes=[
        wrong(
            "mse-no-two",
            "dinput",
            "(input - target) / numel",
            "the derivative of d**2 is 2 * d: the 2 is missing",
            lambda c: (c.input - c.target) / c.input.numel(),
        ),
        wrong(
            "mse-no-mean",
            "dinput",
            "2 * (input - target)",
            "the loss is a mean over all N * C elements, so each element's gradient carries 1 / (N * C)",
            lambda c: 2 * (c.input - c.target),
        ),
        wrong(
            "mse-mean-over-rows",
            "dinput",
            "2 * (input - target) / N",
            "the mean is over every element, N * C of them, not over the N rows: divide by input.numel()",
            lambda c: 2 * (c.input - c.target) / len(c.input),
        ),
        wrong(
            "mse-sign",
            "dinput",
            "2 * (target - input) / numel",
            "d/dinput of (input - target)**2 is +2 (input - target): the sign is flipped",
            lambda c: 2 * (c.target - c.input) / c.input.numel(),
        ),
        wrong(
            "mse-sum",
            "loss",
            "((input - target)**2).sum()",
            "MSELoss takes the mean over every element, not the sum",
            lambda c: ((c.input - c.target) ** 2).sum(),
        ),
    ],
    where={"dinput": "dinput = 2 * (input - target) / input.numel()"},
)


def _ce_inputs(g, n=4, c=5, std=2.0, shift=0.0):
    return {"logits": normal(g, n, c, std=std, mean=shift), "target": torch.randint(0, c, (n,), generator=g)}


def _ce_large(g):
    x = _ce_inputs(g, 3, 4, std=200.0)
    x["logits"][0] += 800.0  # a row of logits near 800: exp overflows unless the row's max is subtracted first
    x["logits"][1] -= 800.0  # and near -800: exp underflows to 0, and log(0) is -inf
    row = x["logits"][2]
    row[x["target"][2]] = row.max() - 900.0  # a target 900 below its row's max: its p underflows to 0, its
    return x  # log-softmax is -900 all the same (log(softmax) gives log 0 = -inf)


def _random_ce(g):
    n, c = int(torch.randint(1, 8, (), generator=g)), int(torch.randint(2, 8, (), generator=g))
    return {"label": f"N = {n}, C = {c}", "inputs": lambda g2: _ce_inputs(g2, n, c)}


def _onehot(c):
    return torch.nn.functional.one_hot(c.target, c.logits.shape[1]).double()


def _p(c):
    return torch.softmax(c.logits, 1)


SOFTMAX_CROSS_ENTROPY = LayerSpec(
    name="softmax_cross_entropy",
    cls="SoftmaxCrossEntropy",
    ctor={},
    params={},
    inputs=_ce_inputs,
    loss=True,
    reference=lambda t: {"loss": torch.nn.functional.cross_entropy(t.logits, t.target)},
    context=lambda c: {"p": _p(c)},
    formula=lambda c: {"dlogits": (c.p - _onehot(c)) / len(c.logits)},
    saved={"logits": "the logits", "p": "softmax(logits), row by row"},
    mistakes=[
        wrong(
            "ce-no-onehot",
            "dlogits",
            "p / N",
            "the one-hot target is not subtracted: dlogits = (p - onehot(target)) / N.  Raising the right class's "
            "logit must lower the loss",
            lambda c: _p(c) / len(c.logits),
        ),
        wrong(
            "ce-no-mean",
            "dlogits",
            "p - onehot(target)",
            "the loss is the mean over the batch, so every row's gradient carries 1/N: (p - onehot) / N",
            lambda c: _p(c) - _onehot(c),
        ),
        wrong(
            "ce-diagonal-jacobian",
            "dlogits",
            "-(1 - p) * onehot / N, from dp = -1/p times p * (1 - p)",
            "softmax's Jacobian reduced to its diagonal p * (1 - p): each probability depends on every logit of "
            "its row (dp_i/dz_j = p_i (delta_ij - p_j)), and with the log the whole of it gives (p - onehot) / N",
            lambda c: -(1 - _p(c)) * _onehot(c) / len(c.logits),
        ),
        wrong(
            "ce-sign",
            "dlogits",
            "(onehot - p) / N",
            "the sign is flipped: the gradient of -log p_target is p - onehot (then / N)",
            lambda c: (_onehot(c) - _p(c)) / len(c.logits),
        ),
        wrong(
            "ce-softmax-axis",
            "loss",
            "softmax over the batch axis (dim 0) instead of each row's classes",
            "each example's probabilities are a softmax over its own C logits, along dim 1: logits.max(1, "
            "keepdim=True), .sum(1, keepdim=True)",
            lambda c: -torch.log_softmax(c.logits, 0)[range(len(c.target)), c.target].mean(),
        ),
        wrong(
            "ce-sum",
            "loss",
            "the sum over the batch of -log p[n, target[n]]",
            "the loss is the mean over the batch (nn.CrossEntropyLoss's default), not the sum",
            lambda c: torch.nn.functional.cross_entropy(c.logits, c.target, reduction="sum"),
        ),
        wrong(
            "ce-no-log",
            "loss",
            "mean of -p[n, target[n]]",
            "the loss is the negative *log* probability of the target",
            lambda c: -_p(c)[range(len(c.target)), c.target].mean(),
        ),
    ],
    configs=[
        {"label": "one example (N = 1, C = 3)", "inputs": lambda g: _ce_inputs(g, 1, 3)},
        {
            "label": "large logits (near +800 and -800 in some rows, a target 900 below its row's max)",
            "inputs": _ce_large,
            "numeric": False,
        },
        {"label": "two classes, N = 5", "inputs": lambda g: _ce_inputs(g, 5, 2)},
    ],
    random=_random_ce,
    nan_hint=(
        "exp overflowed or a log of 0: subtract each row's max before exp (shifted = logits - "
        "logits.max(1, keepdim=True).values), and take log-softmax as shifted - log(sum(exp(shifted)))"
    ),
    where={
        "dlogits": "dlogits = (softmax(logits) - onehot(target)) / N",
        "loss": "loss = -log_softmax(logits)[n, target[n]], averaged over n",
    },
)

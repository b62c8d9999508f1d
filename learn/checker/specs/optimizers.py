"""The checks of exercises adam, rmsprop and sgd_momentum: each update written out once, with switches that make
its known mistakes, checked beside torch.optim by optim_check.py.

Every replay works on clones and returns the parameters after each step; given ``trace`` (a dict), it records
the update's quantities at each (step, parameter) for the report's comparison.
"""

from __future__ import annotations

import torch

from ...mistakes import Mistake
from ..optim_check import OptimizerSpec

HYPER = {"lr": 0.05, "betas": (0.8, 0.95), "eps": 1e-8}


def _adam(
    params,
    grads,
    hyper=None,
    trace=None,
    bias_correction=True,
    eps_inside=False,
    state_reset=False,
    t_fixed=False,
    betas_swapped=False,
    uphill=False,
    in_place=True,
    t_from_zero=False,
    shared_state=False,
    power_outside=False,
    v_not_squared=False,
    weights_swapped=False,
    t_per_param=False,
):
    """The parameters after each step, under the given mistakes (none by default).  ``bias_correction``: True,
    False, or "m" / "v" (only that one corrected); ``power_outside``: False, True, or "m" / "v" (that one)."""
    hyper = hyper or HYPER
    lr, (b1, b2), eps = hyper["lr"], hyper["betas"], hyper["eps"]
    if betas_swapped:
        b1, b2 = b2, b1
    ps = [p.clone() for p in params]
    m, v = [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps]
    history, count = [], 0
    for step, gs in enumerate(grads):
        t = 1 if t_fixed else step if t_from_zero else step + 1
        for j, (p, g) in enumerate(zip(ps, gs, strict=True)):
            if t_per_param:  # t += 1 inside the loop over parameters
                count += 1
                t = count
            if state_reset:
                m[j], v[j] = torch.zeros_like(p), torch.zeros_like(p)
            w1 = (b1, 1 - b1) if not weights_swapped else (1 - b1, b1)
            m[j] = w1[0] * m[j] + w1[1] * g
            v[j] = b2 * (m[j] if shared_state else v[j]) + (1 - b2) * (g if v_not_squared else g * g)
            if shared_state:  # m and v are one tensor: the second update overwrote the first
                m[j] = v[j]
            c1 = (1 - b1) ** t if power_outside in (True, "m") else 1 - b1**t
            c2 = (1 - b2) ** t if power_outside in (True, "v") else 1 - b2**t
            mh = m[j] / c1 if bias_correction in (True, "m") else m[j]
            vh = v[j] / c2 if bias_correction in (True, "v") else v[j]
            step_ = lr * mh / ((vh + eps).sqrt() if eps_inside else vh.sqrt() + eps)
            if trace is not None:
                trace[(step, j)] = {
                    "g": g,
                    "m": m[j].clone(),
                    "v": v[j].clone(),
                    "m_hat": mh,
                    "v_hat": vh,
                    "the step lr * m_hat / (sqrt(v_hat) + eps)": step_,
                }
            if in_place:
                p += step_ if uphill else -step_
        history.append([p.clone() for p in ps])
    return history


MISTAKES = [
    (
        Mistake(
            "adam-no-bias-correction",
            "Adam without bias correction (m and v used as they are)",
            "m and v start at 0, so early on they are too small by (1 - beta1^t) and (1 - beta2^t): divide them by "
            "those before the step",
        ),
        {"bias_correction": False},
    ),
    (
        Mistake(
            "adam-v-not-corrected",
            "the step with v where v_hat belongs (only m corrected)",
            "v starts at 0 too: v_hat = v / (1 - beta2^t), and the step divides by sqrt(v_hat) + eps",
        ),
        {"bias_correction": "m"},
    ),
    (
        Mistake(
            "adam-m-not-corrected",
            "the step with m where m_hat belongs (only v corrected)",
            "m starts at 0 too: m_hat = m / (1 - beta1^t), and the step is lr * m_hat / (sqrt(v_hat) + eps)",
        ),
        {"bias_correction": "v"},
    ),
    (
        Mistake(
            "adam-power-outside",
            "the bias corrections (1 - beta)^t instead of 1 - beta^t",
            "the average of t gradients that started at 0 is too small by 1 - beta^t (beta to the power t, then "
            "subtracted from 1): (1 - beta)^t is a far smaller number",
        ),
        {"power_outside": True},
    ),
    *[
        (
            Mistake(
                "adam-power-outside",
                f"{name}'s bias correction (1 - {beta})^t instead of 1 - {beta}^t",
                "the average of t gradients that started at 0 is too small by 1 - beta^t (beta to the power t, then "
                "subtracted from 1): (1 - beta)^t is a far smaller number",
            ),
            {"power_outside": which},
        )
        for which, name, beta in (("m", "m_hat", "beta1"), ("v", "v_hat", "beta2"))
    ],
    (
        Mistake(
            "adam-eps-inside-sqrt",
            "lr * m_hat / sqrt(v_hat + eps)",
            "eps is added after the square root: m_hat / (sqrt(v_hat) + eps).  Inside, it swamps a small v_hat: "
            "with gradients near 1e-9 the step shrinks ten thousand times",
        ),
        {"eps_inside": True},
    ),
    (
        Mistake(
            "adam-v-not-squared",
            "v averaging the gradient itself, not its square",
            "v is the moving average of g * g (its square root is the gradient's typical size): v = beta2 v + "
            "(1 - beta2) g^2",
        ),
        {"v_not_squared": True},
    ),
    (
        Mistake(
            "adam-average-weights-swapped",
            "m = (1 - beta1) m + beta1 g",
            "the moving average keeps beta1 of the old m and adds (1 - beta1) of the new gradient: m = beta1 m + "
            "(1 - beta1) g",
        ),
        {"weights_swapped": True},
    ),
    (
        Mistake(
            "adam-state-reset",
            "m and v started from zero at every step",
            "m and v are running averages: keep them between steps (create them once, in __init__ or at the first "
            "step)",
        ),
        {"state_reset": True},
    ),
    (
        Mistake(
            "adam-t-not-incremented",
            "the bias correction of step 1 at every step",
            "t counts the steps taken: add 1 at each step() before the bias corrections",
        ),
        {"t_fixed": True},
    ),
    (
        Mistake(
            "adam-t-per-parameter",
            "t counted once per parameter (t += 1 inside the loop over parameters)",
            "t counts the optimizer's steps, one per call of step(), whatever the number of parameters: add 1 "
            "once, before the loop",
        ),
        {"t_per_param": True},
    ),
    (
        Mistake(
            "adam-betas-swapped",
            "beta2 for the gradient's average and beta1 for its square's",
            "betas = (beta1, beta2): beta1 (0.9) averages the gradient into m, beta2 (0.999) its square into v",
        ),
        {"betas_swapped": True},
    ),
    (
        Mistake(
            "adam-t-from-zero",
            "the bias correction with t counted from 0 (t += 1 after the step)",
            "at the first step t must be 1: with t = 0, 1 - beta**t is 0 and m_hat = m / 0 (inf, then nan).  Add 1 "
            "to t at the start of step()",
        ),
        {"t_from_zero": True},
    ),
    (
        Mistake(
            "adam-shared-state",
            "m and v one and the same list of tensors (self.m = self.v = [...])",
            "a = b = [...] makes one list with two names: m and v must be separate tensors, each its own "
            "torch.zeros_like(p)",
        ),
        {"shared_state": True},
    ),
    (
        Mistake(
            "adam-uphill",
            "p += lr * m_hat / (sqrt(v_hat) + eps)",
            "a step goes against the gradient, downhill: p -= ...",
        ),
        {"uphill": True},
    ),
    (
        Mistake(
            "adam-not-in-place",
            "parameters that never change",
            "p = p - ... makes a new tensor and rebinds the name p; the model still holds the old one.  Change the "
            "tensor itself: p -= ..., or p.sub_(...)",
        ),
        {"in_place": False},
    ),
]

ADAM = OptimizerSpec(
    "adam",
    "Adam",
    torch.optim.Adam,
    _adam,
    [("the default", HYPER)],
    MISTAKES,
    update="m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2;  m_hat = m / (1 - beta1^t);  "
    "v_hat = v / (1 - beta2^t);  p -= lr m_hat / (sqrt(v_hat) + eps)",
)


# -- RMSprop -----------------------------------------------------------------------------------------------------

RMSPROP_HYPER = {"lr": 0.02, "alpha": 0.9, "eps": 1e-8}


def _rmsprop(
    params,
    grads,
    hyper=None,
    trace=None,
    eps_inside=False,
    weights_swapped=False,
    not_squared=False,
    bias_corrected=False,
    state_reset=False,
    no_sqrt=False,
    uphill=False,
    in_place=True,
    v_from_g=False,
):
    hyper = hyper or RMSPROP_HYPER
    lr, alpha, eps = hyper["lr"], hyper["alpha"], hyper["eps"]
    ps = [p.clone() for p in params]
    v = [torch.zeros_like(p) for p in ps]
    history = []
    for step, gs in enumerate(grads):
        for j, (p, g) in enumerate(zip(ps, gs, strict=True)):
            if state_reset:
                v[j] = torch.zeros_like(p)
            sq = g if not_squared else g * g
            if v_from_g and step == 0:
                v[j] = sq.clone()  # the average started at the first g^2 instead of 0
            else:
                v[j] = (1 - alpha) * v[j] + alpha * sq if weights_swapped else alpha * v[j] + (1 - alpha) * sq
            vh = v[j] / (1 - alpha ** (step + 1)) if bias_corrected else v[j]
            denom = vh + eps if no_sqrt else (vh + eps).sqrt() if eps_inside else vh.sqrt() + eps
            step_ = lr * g / denom
            if trace is not None:
                trace[(step, j)] = {"g": g, "v": v[j].clone(), "the step lr * g / (sqrt(v) + eps)": step_}
            if in_place:
                p += step_ if uphill else -step_
        history.append([p.clone() for p in ps])
    return history


RMSPROP = OptimizerSpec(
    "rmsprop",
    "RMSprop",
    torch.optim.RMSprop,
    _rmsprop,
    [("the default", RMSPROP_HYPER)],
    [
        (
            Mistake(
                "rmsprop-eps-inside-sqrt",
                "lr * g / sqrt(v + eps)",
                "eps is added after the square root, as torch.optim.RMSprop does: g / (sqrt(v) + eps); inside, it "
                "swamps a small v (gradients near 1e-9 then take steps ten thousand times too small)",
            ),
            {"eps_inside": True},
        ),
        (
            Mistake(
                "rmsprop-alpha-swapped",
                "v = (1 - alpha) v + alpha g^2",
                "alpha is how much of the old average is kept: v = alpha v + (1 - alpha) g^2",
            ),
            {"weights_swapped": True},
        ),
        (
            Mistake(
                "rmsprop-not-squared",
                "v averaging the gradient itself, not its square",
                "RMS is the root of the mean square: v averages g * g, and the step divides by sqrt(v)",
            ),
            {"not_squared": True},
        ),
        (
            Mistake(
                "rmsprop-no-sqrt",
                "lr * g / (v + eps), without the square root",
                "v averages g^2, so sqrt(v) has the gradient's size: the step is lr * g / (sqrt(v) + eps), about "
                "lr * sign(g) early on",
            ),
            {"no_sqrt": True},
        ),
        (
            Mistake(
                "rmsprop-bias-corrected",
                "v divided by 1 - alpha^t (Adam's bias correction)",
                "torch.optim.RMSprop does not correct v: it uses v as it is (Adam is the one with the correction)",
            ),
            {"bias_corrected": True},
        ),
        (
            Mistake(
                "rmsprop-started-at-g2",
                "the average started at the first g^2 instead of 0",
                "v starts at zeros, as torch.optim.RMSprop's square_avg: v = alpha * 0 + (1 - alpha) g^2 at the "
                "first step",
            ),
            {"v_from_g": True},
        ),
        (
            Mistake(
                "rmsprop-state-reset",
                "v started from zero at every step",
                "v is a running average: create it once (zeros, in __init__) and keep it between steps",
            ),
            {"state_reset": True},
        ),
        (
            Mistake("rmsprop-uphill", "p += lr * g / (sqrt(v) + eps)", "a step goes against the gradient: p -= ..."),
            {"uphill": True},
        ),
        (
            Mistake(
                "rmsprop-not-in-place",
                "parameters that never change",
                "p = p - ... makes a new tensor and rebinds the name p: change the tensor itself, p -= ...",
            ),
            {"in_place": False},
        ),
    ],
    update="v = alpha v + (1 - alpha) g^2;  p -= lr g / (sqrt(v) + eps)",
)


# -- SGD with momentum ---------------------------------------------------------------------------------------------

SGD_HYPER = {"lr": 0.1, "momentum": 0.8}


def _sgd(
    params,
    grads,
    hyper=None,
    trace=None,
    dampened=False,
    nesterov_buffer=False,
    nesterov_ignored=False,
    buffer_not_kept=False,
    uphill=False,
    in_place=True,
):
    hyper = hyper or SGD_HYPER
    lr, mu, nesterov = hyper["lr"], hyper.get("momentum", 0.0), hyper.get("nesterov", False)
    ps = [p.clone() for p in params]
    buf = [None for _ in ps]
    history = []
    for step, gs in enumerate(grads):
        for j, (p, g) in enumerate(zip(ps, gs, strict=True)):
            d = g
            if mu:
                if buf[j] is None or buffer_not_kept:
                    buf[j] = (1 - mu) * g if dampened else g.clone()  # torch: the first buffer is g itself
                else:
                    buf[j] = mu * buf[j] + ((1 - mu) * g if dampened else g)
                if nesterov and not nesterov_ignored:
                    d = mu * buf[j] if nesterov_buffer else g + mu * buf[j]
                else:
                    d = buf[j]
            step_ = lr * d
            if trace is not None:
                trace[(step, j)] = {"g": g, **({"buf": buf[j].clone()} if mu else {}), "the step lr * d": step_}
            if in_place:
                p += step_ if uphill else -step_
        history.append([p.clone() for p in ps])
    return history


SGD = OptimizerSpec(
    "sgd_momentum",
    "SGD",
    torch.optim.SGD,
    _sgd,
    [
        ("the default", SGD_HYPER),
        ("Nesterov's momentum", {"lr": 0.1, "momentum": 0.8, "nesterov": True}),
        ("no momentum", {"lr": 0.1, "momentum": 0.0}),
    ],
    [
        (
            Mistake(
                "sgd-momentum-dampened",
                "buf = momentum buf + (1 - momentum) g (a moving average)",
                "torch.optim.SGD's buffer adds the whole gradient: buf = momentum * buf + g (the first buf = g); a "
                "moving average (1 - momentum) g is a step 1 / (1 - momentum) times smaller",
            ),
            {"dampened": True},
        ),
        (
            Mistake(
                "sgd-buffer-not-kept",
                "the buffer made anew from g at every step",
                "momentum remembers the steps before: keep buf between steps (one per parameter), buf = momentum "
                "* buf + g",
            ),
            {"buffer_not_kept": True},
        ),
        (
            Mistake(
                "sgd-nesterov-ignored",
                "the classical step with nesterov=True",
                "with Nesterov's momentum the step looks ahead: d = g + momentum * buf, then p -= lr * d",
            ),
            {"nesterov_ignored": True},
        ),
        (
            Mistake(
                "sgd-nesterov-no-gradient",
                "d = momentum * buf with nesterov=True, the gradient left out",
                "Nesterov's step is d = g + momentum * buf: the gradient itself, plus the look-ahead",
            ),
            {"nesterov_buffer": True},
        ),
        (Mistake("sgd-uphill", "p += lr * buf", "a step goes against the gradient: p -= ..."), {"uphill": True}),
        (
            Mistake(
                "sgd-not-in-place",
                "parameters that never change",
                "p = p - ... makes a new tensor and rebinds the name p: change the tensor itself, p -= ...",
            ),
            {"in_place": False},
        ),
    ],
    update="buf = g at the first step, then buf = momentum buf + g;  d = buf (Nesterov: g + momentum buf);  p -= lr d",
)

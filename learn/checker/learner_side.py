"""What the child process does with the learner's class, one request at a time: it runs their code on the inputs
it is sent and returns what came out, never an expected value (it has none).

Inside, gradient recording is off and autograd is refused (``torch.autograd.grad``, ``Tensor.backward``,
``torch.func``, ``torch.optim``): the exercises ask for the gradient written by hand.
"""
from __future__ import annotations

import torch

from .guard import LearnerFailed, call


class NoAutograd(RuntimeError):
    """Raised inside the learner's code when it reaches for autograd."""


NO_AUTOGRAD = "no autograd here: write the gradient by hand"


def refuse_autograd() -> None:
    """Gradient recording off, and every way into autograd (or torch.optim) raises NoAutograd."""
    torch.set_grad_enabled(False)

    def refuse(what):
        def stop(*args, **kwargs):
            raise NoAutograd(f"{NO_AUTOGRAD} ({what} is refused)")
        return stop

    torch.autograd.grad = refuse("torch.autograd.grad")
    torch.autograd.backward = refuse("torch.autograd.backward")
    torch.Tensor.backward = refuse("Tensor.backward")
    for mod, names in ((torch.autograd.functional, ("jacobian", "hessian", "vjp", "jvp", "vhp", "hvp")),
                       (torch.func, ("grad", "grad_and_value", "vjp", "jvp", "jacrev", "jacfwd", "hessian"))):
        for n in names:
            if hasattr(mod, n):
                setattr(mod, n, refuse(f"{mod.__name__}.{n}"))
    for n in ("Adam", "AdamW", "SGD", "RMSprop"):
        setattr(torch.optim, n, _refuse_optim(n))


def _refuse_optim(name):
    def stop(*args, **kwargs):
        raise NoAutograd(f"no torch.optim here: write the update by hand (torch.optim.{name} is refused)")
    return stop


class State:
    """The learner's class and the object built from it for the current configuration."""

    def __init__(self, cls: type, where: str | None, exercise: str):
        from .specs import SPECS
        self.cls, self.where, self.spec = cls, where, SPECS[exercise]
        self.obj, self.layer, self.params = None, None, ()

    def ids(self) -> dict[int, str]:
        return {id(getattr(self.obj, n)): n for n in self.params if isinstance(getattr(self.obj, n, None),
                                                                               torch.Tensor)}


def construct(s: State, config: int, params: dict) -> str | None:
    """Build the learner's layer for configuration number ``config`` and copy ``params`` into it; -> None, or
    why the parameters cannot be set."""
    from .configs import expand
    layer = expand(s.spec)[config][1]
    s.layer, s.params = layer, tuple(params)
    args = ", ".join(f"{k}={v!r}" for k, v in layer.ctor.items())
    s.obj = call(f"{s.cls.__name__}({args})", lambda: s.cls(**layer.ctor), where=s.where)
    for n, value in params.items():
        mine = getattr(s.obj, n, None)
        if not isinstance(mine, torch.Tensor):
            kind = "None" if mine is None else f"a {type(mine).__name__}, not a tensor"
            return (f"your {s.cls.__name__} has no tensor attribute {n} (got {kind}); the checker reads the "
                    f"parameters by PyTorch's names: {', '.join(params)}")
        if mine.shape != value.shape or mine.dtype != torch.float64:
            return (f"your {n} is {mine.dtype} of shape {tuple(mine.shape)}; expected float64 of shape "
                    f"{tuple(value.shape)} (the constructor makes it)")
        mine.copy_(value)
        mine.grad = None
    return None


def forward(s: State, inputs: dict):
    """-> (what forward returned, the inputs as they are after it)."""
    given = {n: t.clone() for n, t in inputs.items()}
    s.given = given  # what forward got: backward must leave it as it was too
    result = call(f"{s.cls.__name__}.forward", s.layer.forward, s.obj, given, where=s.where)
    return result, given


def backward(s: State, douts: dict):
    """-> (what backward returned, the douts as they are after it, each parameter's .grad, the forward's inputs as
    they are after it)."""
    given = {n: t.clone() for n, t in douts.items()}
    result = call(f"{s.cls.__name__}.backward", s.layer.backward, s.obj, given, where=s.where, params=s.ids())
    grads = {n: getattr(getattr(s.obj, n, None), "grad", None) for n in s.params}
    return result, given, grads, s.given


def numeric(s: State, inputs: dict, douts: dict, outputs: tuple, name: str, index: tuple, h: float):
    """d(sum of outputs * douts)/d name[index] by central differences of the learner's forward; None if it raises
    or returns something unusable."""
    if name.endswith(".grad"):
        t = getattr(s.obj, name[:-5])
    else:
        inputs = {n: v.clone() for n, v in inputs.items()}
        t = inputs[name[1:]]
    orig = t[index].item()
    values = []
    try:
        for step in (h, -h):
            t[index] = orig + step
            result = s.layer.forward(s.obj, {n: v.clone() for n, v in inputs.items()})
            outs = dict(zip(outputs, result if len(outputs) > 1 else (result,)))
            values.append(sum((outs[o] * douts[f"d{o}"]).sum().item() if douts else outs[o].item() for o in outputs))
    except Exception:
        return None
    finally:
        t[index] = orig
    return (values[0] - values[1]) / (2 * h)


def stray(s: State, shape: tuple) -> dict:
    """The learner's object's tensor attributes of ``shape``: a gradient kept there instead of in .grad?"""
    return {a: v for a, v in vars(s.obj).items() if isinstance(v, torch.Tensor) and tuple(v.shape) == shape}


def saved(s: State) -> dict:
    """The intermediates the learner chose to record in ``self.saved`` (a dict of tensors), if any."""
    rec = getattr(s.obj, "saved", None)
    return {str(k): v for k, v in rec.items() if isinstance(v, torch.Tensor)} if isinstance(rec, dict) else {}


def probe(s: State, paths: tuple) -> dict:
    """The learner's object's attributes at the dotted ``paths`` ("fc1.weights"), each as it is (None if
    missing)."""
    found = {}
    for path in paths:
        value = s.obj
        for part in path.split("."):
            value = getattr(value, part, None)
        found[path] = list(value) if isinstance(value, tuple) else value
    return found


def value_run(s: State, index: int):
    from .value_check import EXPRESSIONS, _run
    return _run(s.cls, EXPRESSIONS[index][1], s.where)


def adam_run(s: State, params: list, grads: list, hyper: dict):
    """The learner's Adam on ``params`` with the given gradients, step by step: -> (the parameters after each
    step, the failure that stopped it as (text, key) or None)."""
    mine = [p.clone() for p in params]
    opt = call(f"{s.cls.__name__}(params, ...)", lambda: s.cls(mine, **hyper), where=s.where)
    history = []
    for gs in grads:
        for p, g in zip(mine, gs):
            p.grad = g.clone()
        try:
            call(f"{s.cls.__name__}.step", opt.step, where=s.where)
        except LearnerFailed as e:
            return history, (e.text, e.key)
        history.append([p.clone() for p in mine])
    return history, None


OPS = {"construct": construct, "forward": forward, "backward": backward, "numeric": numeric, "stray": stray,
       "saved": saved, "probe": probe, "value_run": value_run, "adam_run": adam_run}

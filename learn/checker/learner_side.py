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
            if p.grad is None:
                p.grad = g.clone()
            else:  # written into the same .grad tensor, as a loop that zeroes .grad in place does: state that
                p.grad.copy_(g)  # is that tensor itself (a momentum buffer not copied) changes with it
        try:
            call(f"{s.cls.__name__}.step", opt.step, where=s.where)
        except LearnerFailed as e:
            return history, (e.text, e.key)
        history.append([p.clone() for p in mine])
    return history, None


def _grads(obj) -> dict:
    return {f"{n}.grad": getattr(getattr(obj, n, None), "grad", None) for n in ("weight", "bias")}


def split_construct(s: State, ctor: dict, params: dict):
    """Two objects of the learner's Linear (exercise linear_split): one split into B and W, one fused; -> None, or
    why the parameters cannot be set."""
    args = ", ".join(f"{k}={v!r}" for k, v in ctor.items())
    objs = [call(f"{s.cls.__name__}({args})", lambda: s.cls(**ctor), where=s.where) for _ in range(2)]
    for obj in objs:
        for n, value in params.items():
            mine = getattr(obj, n, None)
            if not isinstance(mine, torch.Tensor) or mine.shape != value.shape or mine.dtype != torch.float64:
                return (f"your {s.cls.__name__}.{n} is {mine.dtype if isinstance(mine, torch.Tensor) else mine!r} of "
                        f"shape {tuple(getattr(mine, 'shape', ()))}; expected float64 of shape {tuple(value.shape)}")
            mine.copy_(value)
            mine.grad = None
    s.obj, s.twin = objs
    s.params = tuple(params)
    return None


def split_forward(s: State, x):
    given = x.clone()
    out = call(f"{s.cls.__name__}.forward", s.obj.forward, given, where=s.where)
    return out, given


def split_b(s: State, dout):
    """B on the split object: -> (dx, dout as B left it, each .grad, the object's other attributes: what B kept)."""
    s.dout_given = dout.clone()  # the caller's buffer: overwritten before W (split_w)
    dx = call(f"{s.cls.__name__}.backward_input", s.obj.backward_input, s.dout_given, where=s.where,
              params=s.ids())
    kept = {k: v for k, v in vars(s.obj).items() if k not in ("weight", "bias", "x")}  # what B kept, by name
    return dx, s.dout_given.clone(), _grads(s.obj), kept


def split_w(s: State, overwrite):
    """The caller reuses dout's buffer, then W: -> each .grad."""
    s.dout_given.copy_(overwrite)
    call(f"{s.cls.__name__}.backward_weight", s.obj.backward_weight, where=s.where, params=s.ids())
    return _grads(s.obj)


def split_fused(s: State, x, dout):
    """The fused backward on the second object: -> (dx, each .grad)."""
    call(f"{s.cls.__name__}.forward", s.twin.forward, x.clone(), where=s.where)
    dx = call(f"{s.cls.__name__}.backward", s.twin.backward, dout.clone(), where=s.where)
    return dx, _grads(s.twin)


def split_w_again(s: State):
    """A W with no B before it: -> (whether it raised, each .grad after it)."""
    try:
        s.obj.backward_weight()
        raised = False
    except Exception:
        raised = True
    return raised, _grads(s.obj)


OPS = {"construct": construct, "forward": forward, "backward": backward, "numeric": numeric, "stray": stray,
       "saved": saved, "probe": probe, "value_run": value_run, "adam_run": adam_run,
       "split_construct": split_construct, "split_forward": split_forward, "split_b": split_b, "split_w": split_w,
       "split_fused": split_fused, "split_w_again": split_w_again}

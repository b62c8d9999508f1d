"""How a layer's methods are called, sent to the learner's process as plain data, so that process needs none of
the specs (their references, mistakes and configurations stay here).

A spec's ``forward``/``backward`` adapters (spec.py: ``obj.forward(*inputs.values())``, or the LSTM's
``obj.forward(t["x"], (t["h"], t["c"]))``) are run here on a recorder: what they call, with which tensors in which
places, becomes a template, ``(method, args, kwargs)``, each argument ("slot", tensor name), ("value", v) or a
("tuple"|"list", [...]) of them, which ``learner_side.replay`` calls on the learner's object.
"""

from __future__ import annotations

from .configs import expand
from .spec import LayerSpec


class _Slot:
    def __init__(self, name: str):
        self.name = name


class _Recorder:
    def __init__(self):
        self.calls = []

    def __getattr__(self, method: str):
        def record(*args, **kwargs):
            self.calls.append((method, args, kwargs))

        return record


def _arg(a):
    if isinstance(a, _Slot):
        return ("slot", a.name)
    if isinstance(a, (tuple, list)):
        return ("tuple" if isinstance(a, tuple) else "list", [_arg(v) for v in a])
    if a is None or isinstance(a, (bool, int, float, str)):
        return ("value", a)
    raise TypeError(f"a call template holds only tensors by name and plain values, not {type(a).__name__}")


def template(adapter, names) -> tuple:
    """The call ``adapter(obj, tensors)`` makes on the learner's object, with ``names`` the tensors' names."""
    rec = _Recorder()
    adapter(rec, {n: _Slot(n) for n in names})
    if len(rec.calls) != 1:
        raise ValueError(f"a spec's adapter must make one call on the learner's object; it made {len(rec.calls)}")
    method, args, kwargs = rec.calls[0]
    return method, [_arg(a) for a in args], {k: _arg(v) for k, v in kwargs.items()}


class LayerCalls:
    """A Sandbox as layer_check talks to it (``request("construct", config number, params)``, ``request("forward",
    inputs)``, ...), each request turned into plain data for the learner's process."""

    def __init__(self, box, spec: LayerSpec):
        self.box, self.spec, self.layer = box, spec, spec
        self.cls_name, self.where = box.cls_name, box.where

    def request(self, op: str, *args):
        if op == "construct":
            number, params = args
            self.layer = expand(self.spec)[number][1]
            return self.box.request("construct", dict(self.layer.ctor), params)
        if op == "forward":
            (inputs,) = args
            return self.box.request("forward", template(self.layer.forward, inputs), inputs)
        if op == "backward":
            (douts,) = args
            return self.box.request("backward", template(self.layer.backward, douts), douts)
        if op == "numeric":
            inputs = args[0]
            return self.box.request("numeric", template(self.layer.forward, inputs), *args)
        return self.box.request(op, *args)

    def printed(self, limit: int = 1500) -> str:
        return self.box.printed(limit)

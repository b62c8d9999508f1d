"""What a layer keeps from its forward for its backward must not change in between: the version check.

torch counts the in-place changes of every tensor: ``t._version`` goes up by one at each (``x.mul_(10)``,
``w -= lr * w.grad``, an optimizer step), and views of one tensor share its counter.  A layer that keeps a
tensor for its backward -- its input for dW, its weight for dx, a loss its target -- records the versions in
the forward and compares them when it uses the tensors again.  A difference means the backward would compute
the gradient from values the forward never saw: a silently wrong answer.  torch.autograd raises there ("one of
the variables needed for gradient computation has been modified by an inplace operation"), and so does every
layer here, naming itself, the tensor, and what to do instead.

    self._versions = versions(x, self.weight)                                    # end of forward
    check_versions(self, ("its input x", "weight"), (x, self.weight), self._versions)   # start of backward

The cost: one integer read per kept tensor in the forward and one in the backward; nothing is allocated on
the device.  A tensor made under ``torch.inference_mode()`` has no version counter: it is not checked.

Under ``torch.compile`` the check moves to compile time.  Inside a compiled function a version is a symbol
(torch does not specialise a graph on its inputs' versions), and torch.compile applies the in-place changes
its graph makes when the graph ends, so a version read in one compiled graph and compared in another place
means nothing.  What does mean something is the order of the operations the compiler traces: when the forward
and the backward are traced in one graph (the whole step compiled, as ``training.compiled`` does), an in-place
change traced between them moves the version in the trace, and the check, a ``torch._check`` on the two
symbols, fails while the step compiles, with this message.  A forward and a backward compiled apart are
checked where one of them runs eagerly: a version recorded eagerly and compared while compiling makes the
comparison run eagerly (a graph break, or under ``fullgraph=True`` an error saying so), and a version
recorded while compiling is marked as such and is not compared eagerly (a warning says so, once).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor

_TRACED = "traced"  # first element of versions recorded while compiling (their values mean nothing outside)
_warned = False
# torch.compile keeps a string message of torch._check in the graph from torch 2.14 (2.11's dynamo refuses it)
MESSAGE_IN_GRAPH = torch.torch_version.TorchVersion(torch.__version__) >= "2.14"


def versions(*tensors: Tensor | None) -> tuple:  # ints; under torch.compile _TRACED first
    """The version counter of each tensor a layer keeps (-1 for None, and for an inference-mode tensor)."""
    if torch.compiler.is_compiling():
        return (_TRACED, *[-1 if t is None else t._version for t in tensors])
    try:
        return tuple([-1 if t is None else t._version for t in tensors])
    except RuntimeError:  # "Inference tensors do not track version counter"
        return tuple([-1 if t is None or t.is_inference() else t._version for t in tensors])


def check_versions(
    layer: object,
    names: tuple[str, ...] | Callable[[], tuple[str, ...]],
    tensors: tuple[Tensor | None, ...],
    recorded: tuple,
    before: str = "backward",
) -> None:
    """Raise a RuntimeError if a tensor in ``tensors`` changed in place since ``recorded = versions(*tensors)``.

    ``names`` says what each tensor is, as the message shows it ("its input x"; a parameter by its attribute
    name, "weight"), or is a function that returns those words, called only when they are needed; ``before`` is the step
    that was about to use them ("backward", "recompute()").  A None in ``tensors`` is not checked (a tensor this
    backward does not read after all).  Under torch.compile see the module docstring."""
    if recorded and recorded[0] is _TRACED or torch.compiler.is_compiling():
        return _check_compiled(layer, names() if callable(names) else names, tensors, recorded, before)
    for t, then in zip(tensors, recorded, strict=True):
        if t is not None and then != -1 and t._version != then:
            raise _changed(layer, names() if callable(names) else names, tensors, recorded, before)


def _changed(
    layer: object, names: tuple[str, ...], tensors: tuple[Tensor | None, ...], recorded: tuple[int, ...], before: str
) -> RuntimeError:
    """The error for the first kept tensor whose version moved."""
    for name, t, then in zip(names, tensors, recorded, strict=True):  # noqa: B007 (name is read after the break)
        if t is not None and then != -1 and t._version != then:
            now = t._version
            break
    kind = type(layer).__name__
    parameters = getattr(layer, "parameters", None)
    if callable(parameters) and any(t is p for p in parameters()):
        what = f"its parameter {name}"
        fix = (
            "Do the optimizer step (and any other in-place change of a parameter) after backward, "
            "as torch.autograd requires too"
        )
    else:
        what = name
        fix = (
            "Pass a copy to the in-place operation (e.g. x.clone().mul_(10)), or make the change after "
            "backward, as torch.autograd requires too"
        )
    return RuntimeError(
        f"{layer!r}: {what} was modified in place after the forward, before {before} (version "
        f"{then} -> {now}); {kind} keeps it for its backward, which would compute the gradient from "
        f"the changed values. {fix}."
    )


def _check_compiled(
    layer: object, names: tuple[str, ...], tensors: tuple[Tensor | None, ...], recorded: tuple, before: str
) -> None:
    """check_versions where the forward or the backward is being compiled (module docstring)."""
    global _warned
    traced = len(recorded) > 0 and recorded[0] is _TRACED  # len: older dynamo cannot trace bool(tuple)
    if not torch.compiler.is_compiling():  # recorded in a compiled graph, compared eagerly: nothing to compare
        if not _warned:
            _warned = True
            warnings.warn(
                f"{type(layer).__name__}'s forward ran in a compiled graph and its backward outside it: the "
                f"check that what a layer keeps for backward is not changed in place in between cannot "
                f"compare their versions (torch.compile applies a graph's in-place changes when it ends). "
                f"Compile the forward and the backward in one graph (the whole step) to keep the check.",
                RuntimeWarning,
                stacklevel=3,
            )
        return
    if not traced:  # recorded eagerly, compared in a graph: compare the real versions, eagerly
        _check_eagerly(layer, names, tensors, recorded, before)
        return
    kind = type(layer).__name__
    for name, t, then in zip(names, tensors, recorded[1:], strict=True):
        if t is not None and then is not None:
            message = (
                f"{kind}: {name} was modified in place after the forward, before {before}, in the compiled "
                f"step; {kind} keeps it for its backward, which would compute the gradient from the changed "
                f"values. Make the change on a copy, or after backward, as torch.autograd requires too."
            )
            # (a string: what torch.compile keeps for the graph; an older dynamo traces only a function without
            # closure, and its refusal then reads "Runtime assertion failed")
            torch._check(t._version == then, message if MESSAGE_IN_GRAPH else lambda m=message: m)  # type: ignore[misc]


def _check_eagerly(layer, names, tensors, recorded, before) -> None:
    """check_versions run eagerly from a compiled backward: a graph break, made by torch.compiler.disable on first
    use (decorating at import would import torch._dynamo, seconds, in every program that never compiles)."""
    global _eager_check
    if _eager_check is None:
        _eager_check = torch.compiler.disable(check_versions, reason=_EAGER_REASON)
    _eager_check(layer, names, tensors, recorded, before)


_EAGER_REASON = (
    "handgrad: a layer's forward ran eagerly and its backward is being compiled; its in-place check "
    "compares the real versions, eagerly. Compile the forward and the backward in one graph (the whole "
    "step) for no graph break"
)
_eager_check = None  # check_versions under torch.compiler.disable, made on first use

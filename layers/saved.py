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
"""
from __future__ import annotations

from torch import Tensor


def versions(*tensors: Tensor | None) -> tuple[int, ...]:
    """The version counter of each tensor a layer keeps (-1 for None, and for an inference-mode tensor)."""
    try:
        return tuple([-1 if t is None else t._version for t in tensors])
    except RuntimeError:  # "Inference tensors do not track version counter"
        return tuple([-1 if t is None or t.is_inference() else t._version for t in tensors])


def check_versions(layer: object, names: tuple[str, ...], tensors: tuple[Tensor | None, ...],
                   recorded: tuple[int, ...], before: str = "backward") -> None:
    """Raise a RuntimeError if a tensor in ``tensors`` changed in place since ``recorded = versions(*tensors)``.

    ``names`` says what each tensor is, as the message shows it ("its input x"; a parameter by its attribute
    name, "weight"); ``before`` is the step that was about to use them ("backward", "recompute()").  A None in
    ``tensors`` is not checked (a tensor this backward does not read after all)."""
    for t, then in zip(tensors, recorded):
        if t is not None and then != -1 and t._version != then:
            raise _changed(layer, names, tensors, recorded, before)


def _changed(layer: object, names: tuple[str, ...], tensors: tuple[Tensor | None, ...], recorded: tuple[int, ...],
             before: str) -> RuntimeError:
    """The error for the first kept tensor whose version moved."""
    for name, t, then in zip(names, tensors, recorded):
        if t is not None and then != -1 and t._version != then:
            now = t._version
            break
    kind = type(layer).__name__
    parameters = getattr(layer, "parameters", None)
    if callable(parameters) and any(t is p for p in parameters()):
        what = f"its parameter {name}"
        fix = ("Do the optimizer step (and any other in-place change of a parameter) after backward, "
               "as torch.autograd requires too")
    else:
        what = name
        fix = ("Pass a copy to the in-place operation (e.g. x.clone().mul_(10)), or make the change after "
               "backward, as torch.autograd requires too")
    return RuntimeError(f"{layer!r}: {what} was modified in place after the forward, before {before} (version "
                        f"{then} -> {now}); {kind} keeps it for its backward, which would compute the gradient from "
                        f"the changed values. {fix}.")

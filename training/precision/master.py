"""Mixed precision by hand: a dynamic loss scaler (torch.amp.GradScaler's rules) and float32 master weights.

A mixed-precision step of a hand-written model, in the order the pieces are called::

    master = MasterWeights(model, cast_to=torch.bfloat16) # float32 copies of the weights (the optimizer's
                                                          # parameters), then the model cast to bf16
                                                          # (matmuls in bf16; batch norm keeps float32)
    opt = SGD(master.parameters(), lr=0.1, momentum=0.9)
    scaler = DynamicLossScaler(device=x.device)           # float16 needs it; bfloat16 does not

    master.zero_grad()
    logits = model(x.to(torch.bfloat16))                  # (N, C) low precision
    loss = crit(logits, y)                                # softmax and loss in float32
    model.backward(crit.backward(scaler.scale_loss_grad()))   # dL/dlogits * S, rounded once to bf16
    master.grads_to_master(scaler)                        # float32 grads = model grads / S, found_inf set
    scaler.step(opt)                                      # skipped when a gradient was inf/nan
    scaler.update()                                       # S halves on overflow, doubles after 2000 clean steps
    master.master_to_model()                              # round the new float32 weights into the model

Why each piece (Micikevicius et al., "Mixed Precision Training", 2018):
- float16 keeps 5 exponent bits: gradients below 6e-8 flush to zero.  Multiplying the loss gradient by
  S before the backward lifts them into range; dividing by S in float32 afterwards restores them.  Too
  large an S overflows to inf: that step is skipped and S is halved.  bfloat16 has float32's exponent
  range, so it needs no scaling (use ``DynamicLossScaler(enabled=False)`` or none at all).
- An update ``lr * grad`` is often below half a unit in the last place of a bf16 weight (8 bits of
  mantissa): added to the bf16 weight it would round away.  The optimizer therefore updates float32
  master copies and the model receives their rounding after every step.

Host synchronisation: none, except ``DynamicLossScaler.step``, which reads the found-inf flag once (as
torch.amp.GradScaler.step does) to decide whether to call ``optimizer.step()``.  Scale, growth tracker
and found-inf flag live on the device; ``update`` is a handful of device ops.  ``get_scale`` syncs, so
call it when logging only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from torch import Tensor

from layers.batchnorm import _BatchNorm
from layers.checks import LOW_PRECISION
from layers.layer import zero_grad_
from layers.layernorm import LayerNorm

from .loss_scale import DynamicLossScaler

# Normalisation layers keep float32 parameters (and running statistics): they take a half input with
# float32 parameters, compute their statistics in float32 and return the input's dtype.
_KEEP_FLOAT32 = (_BatchNorm, LayerNorm)


def check_low_precision(owner: str, dtype: object) -> torch.dtype:
    if dtype not in LOW_PRECISION:
        raise ValueError(f"{owner}: dtype must be torch.float16 or torch.bfloat16, got {dtype!r}")
    return dtype


def _leaf_layers(model) -> Iterator:
    """Every layer of a container tree that has no children (the model itself when it has none)."""
    stack = [model]
    while stack:
        layer = stack.pop()
        children = list(layer.named_children()) if hasattr(layer, "named_children") else []
        if children:
            stack.extend(child for _, child in reversed(children))
        else:
            yield layer


def to_low_precision(model, dtype: torch.dtype, keep_norm_float32: bool = True):
    """Cast a hand-written model's floating-point parameters and buffers to ``dtype`` in place; returns it.

    With ``keep_norm_float32`` batch norm (SyncBatchNorm included) and layer norm keep float32 parameters
    and running statistics (they normalise a half input in float32 and return its dtype), as torch's
    batch norm and layer norm run under autocast; their float32 parameters are their own master weights.
    """
    check_low_precision("to_low_precision", dtype)
    for layer in _leaf_layers(model):
        if not (keep_norm_float32 and isinstance(layer, _KEEP_FLOAT32)):
            layer.to(dtype=dtype)
    return model


class MasterWeights:
    """float32 master copies of a low-precision model's parameters: the tensors the optimizer updates.

    A parameter already in float32 (batch norm kept in float32 by ``to_low_precision``) is its own
    master: its gradient is unscaled in place and nothing is copied.  Every master keeps its model
    parameter's shape and strides, and its ``.grad`` buffer is
    allocated once and overwritten each step.
    """

    def __init__(
        self,
        model,
        cast_to: torch.dtype | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        keep_norm_float32: bool = True,
    ):
        """``model``: a hand-written model.  With ``cast_to`` (float16/bfloat16) the masters are copied from
        the model's float32 weights first -- exactly, so the run starts from the float32 initialisation --
        and then the model is cast with ``to_low_precision(model, cast_to, keep_norm_float32)``.  Without
        it the model is taken as it is (already cast: the masters hold its rounded values)."""
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"MasterWeights: master dtype must be float32 or float64, got {dtype}")
        self.model, self.dtype = model, dtype
        named = list(model.named_parameters())
        if not named:
            raise ValueError(f"MasterWeights: {type(model).__name__} has no parameters")
        for name, p in named:
            if not p.is_floating_point():
                raise ValueError(f"MasterWeights: parameter {name!r} has dtype {p.dtype}, not floating point")
        self._names = [name for name, _ in named]
        self._model_params = [p for _, p in named]
        # copies first (the same shapes and strides) ...
        copies = [
            torch.empty_strided(p.shape, p.stride(), dtype=dtype, device=p.device).copy_(p.detach()) for _, p in named
        ]  # plain tensors the optimizer steps (the model's require gradients)
        if cast_to is not None:  # ... then the cast, so the masters keep every bit of the float32 weights
            to_low_precision(model, cast_to, keep_norm_float32)
        # a parameter still in the master dtype is its own master (no copy, no second buffer)
        self._masters = [p if p.dtype == dtype else m for p, m in zip(self._model_params, copies, strict=True)]
        # pairs that need copying, for the foreach copies
        self._copy = [(p, m) for p, m in zip(self._model_params, self._masters, strict=True) if p is not m]

    def __repr__(self) -> str:
        return f"MasterWeights({len(self._masters)} tensors, {len(self._copy)} copied to {self.dtype})"

    def parameters(self) -> list[Tensor]:
        """The master tensors, in the model's order: build the optimizer on these."""
        return list(self._masters)

    def named_parameters(self) -> list[tuple[str, Tensor]]:
        return list(zip(self._names, self._masters, strict=True))

    def grads_to_master(self, scaler: DynamicLossScaler | None = None) -> Tensor | None:
        """Copy every model gradient into its master's ``.grad`` (float32), then unscale and check.

        A parameter whose gradient is None gets a master gradient of None (the optimizer skips it, as
        torch.optim does).  With a scaler, returns its found-inf flag (a device tensor), else None.
        """
        src, dst = [], []
        for p, m in self._copy:
            if p.grad is None:
                m.grad = None
                continue
            if m.grad is None:
                m.grad = torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device=m.device)
            src.append(p.grad)
            dst.append(m.grad)
        if dst:
            torch._foreach_copy_(dst, src)
        if scaler is not None:
            return scaler.unscale_and_check_(self._masters)
        return None

    def master_to_model(self) -> None:
        """Round the master weights into the model's parameters (after the optimizer step)."""
        if self._copy:
            with torch.no_grad():  # the model's parameters require gradients, as nn.Parameter's
                torch._foreach_copy_([p for p, _ in self._copy], [m for _, m in self._copy])

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's gradients before a backward (None by default, as torch; zeros in place otherwise).

        The copied masters' gradients need no clearing: ``grads_to_master`` overwrites them (or sets None),
        so their buffers stay put from step to step.
        """
        zero_grad_(self._model_params, set_to_none)

    def model_state_dict(self) -> dict[str, Tensor]:
        """The model's ``state_dict()`` (torch's keys and layouts, buffers included) with the float32 masters in
        place of their rounding in the model: what a checkpoint of a mixed-precision run keeps."""
        sd = self.model.state_dict()
        sd.update(self._state_views(sd))
        return sd

    def load_model_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Load what ``model_state_dict`` returned: buffers into the model, weights into the masters, and the
        masters' rounding into the model."""
        self.model.load_state_dict(state)
        with torch.no_grad():
            for name, view in self._state_views(self.model.state_dict()).items():
                view.copy_(state[name])
        self.master_to_model()

    def _state_views(self, sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """name -> each master viewed as the model's state_dict shows its parameter (a master has its parameter's
        shape and strides, so this is the master itself unless state_dict shows a view)."""
        views = {}
        for name, p, m in zip(self._names, self._model_params, self._masters, strict=True):
            v = sd[name]
            views[name] = m.as_strided(
                v.shape, v.stride(), m.storage_offset() + v.storage_offset() - p.storage_offset()
            )
        return views

    def state_dict(self) -> dict[str, Tensor]:
        """Parameter name -> master tensor (float32): save this, not the rounded model weights."""
        return {name: m.detach().clone() for name, m in zip(self._names, self._masters, strict=True)}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Load master weights saved by ``state_dict`` and round them into the model."""
        missing = set(self._names) - set(state)
        unexpected = set(state) - set(self._names)
        if missing or unexpected:
            raise KeyError(f"MasterWeights.load_state_dict: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
        for name, m in zip(self._names, self._masters, strict=True):
            t = state[name]
            if t.shape != m.shape:
                raise ValueError(
                    f"MasterWeights.load_state_dict: {name!r} has shape {tuple(t.shape)}, expected {tuple(m.shape)}"
                )
            with torch.no_grad():  # a master may be the model's own parameter
                m.copy_(t)
        self.master_to_model()

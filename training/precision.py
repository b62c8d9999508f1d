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

from collections.abc import Iterable, Iterator, Mapping

import torch
from torch import Tensor

from layers.batchnorm import _BatchNorm
from layers.layernorm import LayerNorm

LOW_PRECISION = (torch.float16, torch.bfloat16)
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


class DynamicLossScaler:
    """A loss scale S that backs off on overflow and grows after ``growth_interval`` clean steps.

    The rules of ``torch.amp.GradScaler``, written out (its ``_amp_update_scale_`` kernel):
      found inf/nan:  S <- S * backoff_factor, tracker <- 0, the optimizer step is skipped;
      otherwise:      tracker <- tracker + 1; when it reaches growth_interval,
                      S <- S * growth_factor (kept only if finite), tracker <- 0.
    S is a float32 tensor of shape (1,), the tracker an int32 (1,), the flag a float32 (1,), all on
    ``device``; the gradients are unscaled by ``1 / S`` computed in float64 and rounded to float32, as
    GradScaler does.

    ``enabled=False`` makes every method a no-op with S = 1 (bfloat16 or float32 training, same code).
    """

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, *, enabled: bool = True, device: torch.device | str = "cpu",
                 fused: bool = True):
        owner = "DynamicLossScaler"
        for name, value, ok in (("init_scale", init_scale, lambda v: v > 0),
                                ("growth_factor", growth_factor, lambda v: v > 1),
                                ("backoff_factor", backoff_factor, lambda v: 0 < v < 1)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(float(value)) \
                    or value != value or value == float("inf"):
                need = {"init_scale": "> 0", "growth_factor": "> 1", "backoff_factor": "in (0, 1)"}[name]
                raise ValueError(f"{owner}: {name} must be a finite number {need}, got {value!r}")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval < 1:
            raise ValueError(f"{owner}: growth_interval must be an int >= 1, got {growth_interval!r}")
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval, self.enabled, self.fused = growth_interval, bool(enabled), bool(fused)
        device = torch.device(device)
        self._scale = torch.full((1,), float(init_scale) if enabled else 1.0, dtype=torch.float32, device=device)
        self._inv_scale = torch.empty((1,), dtype=torch.float32, device=device)
        self._growth_tracker = torch.zeros((1,), dtype=torch.int32, device=device)
        self.found_inf = torch.zeros((1,), dtype=torch.float32, device=device)
        self._unscaled = False  # per step: unscale_and_check_ ran since the last update()

    def __repr__(self) -> str:
        return (f"DynamicLossScaler(growth_factor={self.growth_factor}, backoff_factor={self.backoff_factor}, "
                f"growth_interval={self.growth_interval}, enabled={self.enabled})")

    @property
    def scale(self) -> Tensor:
        """The current loss scale S, a float32 (1,) tensor on the device (not a copy: do not write to it)."""
        return self._scale

    def get_scale(self) -> float:
        """S as a Python float (a host sync: for logging)."""
        return float(self._scale.item())

    def scale_loss_grad(self, dout: float | Tensor = 1.0) -> Tensor | float:
        """The upstream gradient to start the backward with: ``dout * S`` (pass it to ``crit.backward``)."""
        if not self.enabled:
            return dout
        return self._scale * dout if not isinstance(dout, float) or dout != 1.0 else self._scale

    def unscale_and_check_(self, params: Iterable[Tensor]) -> Tensor:
        """Divide every ``p.grad`` by S in place and set ``found_inf`` (1.0 if any is inf/nan, else 0.0).

        Call once per step, after the backward (and after ``MasterWeights.grads_to_master``, which calls it).
        Returns the found-inf flag, a float32 (1,) device tensor.  Nothing is read back to the host.
        """
        if not self.enabled:
            return self.found_inf
        if self._unscaled:
            raise RuntimeError(f"{self!r}: unscale_and_check_ called twice in one step (update() ends a step)")
        grads = [p.grad for p in params if p.grad is not None]
        for g in grads:
            if g.dtype != torch.float32 and g.dtype != torch.float64:
                raise ValueError(f"{self!r}: unscale a {g.dtype} gradient in float32: copy it into float32 master "
                                 f"weights first (MasterWeights.grads_to_master), or 1/S may flush it to zero")
        # 1/S in float64 rounded to float32, as GradScaler computes it.
        self._inv_scale.copy_(self._scale.double().reciprocal())
        self.found_inf.zero_()
        if grads:
            if self.fused:
                unscale_check_fused_(grads, self.found_inf, self._inv_scale)
            else:
                unscale_check_reference_(grads, self.found_inf, self._inv_scale)
        self._unscaled = True
        return self.found_inf

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """``optimizer.step()`` unless a gradient was inf/nan; returns whether it stepped.

        Unscales the optimizer's gradients first if ``unscale_and_check_`` has not run this step.  The one
        host synchronisation of the scaler: the flag is read to decide (GradScaler.step does the same).
        """
        if not self.enabled:
            optimizer.step()
            return True
        if not self._unscaled:
            self.unscale_and_check_(p for group in optimizer.param_groups for p in group["params"])
        if self.found_inf.item():  # host sync, documented
            return False
        optimizer.step()
        return True

    def update(self) -> None:
        """Back off or grow S from this step's found-inf flag; ends the step.  On the device, no sync."""
        if not self.enabled:
            return
        if not self._unscaled:
            raise RuntimeError(f"{self!r}: update() called before unscale_and_check_ (or step) this step")
        if self.fused:
            torch._amp_update_scale_(self._scale, self._growth_tracker, self.found_inf, self.growth_factor,
                                     self.backoff_factor, self.growth_interval)
        else:
            update_scale_reference_(self._scale, self._growth_tracker, self.found_inf, self.growth_factor,
                                    self.backoff_factor, self.growth_interval)
        self._unscaled = False

    def state_dict(self) -> dict:
        """GradScaler's keys, so a checkpoint can be read by either."""
        return {"scale": self.get_scale(), "growth_factor": self.growth_factor, "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval, "_growth_tracker": int(self._growth_tracker.item())}

    def load_state_dict(self, state: Mapping) -> None:
        missing = {"scale", "_growth_tracker"} - set(state)
        if missing:
            raise KeyError(f"{self!r}: state_dict lacks {sorted(missing)}")
        self._scale.fill_(float(state["scale"]))
        self._growth_tracker.fill_(int(state["_growth_tracker"]))
        for key in ("growth_factor", "backoff_factor", "growth_interval"):
            if key in state:
                setattr(self, key, type(getattr(self, key))(state[key]))


def unscale_check_fused_(grads: list[Tensor], found_inf: Tensor, inv_scale: Tensor) -> None:
    """torch's fused kernel: ``g *= inv_scale`` for each g, ``found_inf = 1`` if any g is inf/nan."""
    by_device: dict[torch.device, list[Tensor]] = {}
    for g in grads:
        by_device.setdefault(g.device, []).append(g)
    for device, gs in by_device.items():
        if device != found_inf.device:
            raise ValueError(f"unscale: gradients on {device} but the scaler lives on {found_inf.device}; "
                             f"build DynamicLossScaler(device={str(device)!r})")
        torch._amp_foreach_non_finite_check_and_unscale_(gs, found_inf, inv_scale)


def unscale_check_reference_(grads: list[Tensor], found_inf: Tensor, inv_scale: Tensor) -> None:
    """The same, written out: a non-finite entry is one where ``g - g`` is not 0 (inf - inf and nan are nan)."""
    for g in grads:
        bad = (~torch.isfinite(g)).any()  # 0-d bool, on the device
        found_inf.copy_(torch.maximum(found_inf, bad.to(found_inf.dtype)))
        g.mul_(inv_scale)


def update_scale_reference_(scale: Tensor, tracker: Tensor, found_inf: Tensor, growth_factor: float,
                            backoff_factor: float, growth_interval: int) -> None:
    """``torch._amp_update_scale_`` written out with device ops (no branch on a device value)."""
    found = found_inf > 0  # (1,) bool
    successful = torch.where(found, torch.zeros_like(tracker), tracker + 1)  # clean steps in a row
    grow = successful >= growth_interval
    grown = scale.double() * growth_factor  # as the kernel: float * double, rounded to float once
    grown = grown.to(scale.dtype)
    new_scale = torch.where(found, (scale.double() * backoff_factor).to(scale.dtype),
                            torch.where(grow & torch.isfinite(grown), grown, scale))
    scale.copy_(new_scale)
    tracker.copy_(torch.where(grow, torch.zeros_like(successful), successful))


class MasterWeights:
    """float32 master copies of a low-precision model's parameters: the tensors the optimizer updates.

    A parameter already in float32 (batch norm kept in float32 by ``to_low_precision``) is its own
    master: its gradient is unscaled in place and nothing is copied.  Every master keeps its model
    parameter's shape and strides (Linear's (D, H) weight view stays a view), and its ``.grad`` buffer is
    allocated once and overwritten each step.
    """

    def __init__(self, model, cast_to: torch.dtype | None = None, *, dtype: torch.dtype = torch.float32,
                 keep_norm_float32: bool = True):
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
        # copies first (the same strides: Linear's (D, H) weight view stays a transposed layout) ...
        copies = [torch.empty_strided(p.shape, p.stride(), dtype=dtype, device=p.device).copy_(p) for _, p in named]
        if cast_to is not None:  # ... then the cast, so the masters keep every bit of the float32 weights
            to_low_precision(model, cast_to, keep_norm_float32)
        # a parameter still in the master dtype is its own master (no copy, no second buffer)
        self._masters = [p if p.dtype == dtype else m for p, m in zip(self._model_params, copies)]
        # pairs that need copying, for the foreach copies
        self._copy = [(p, m) for p, m in zip(self._model_params, self._masters) if p is not m]

    def __repr__(self) -> str:
        return f"MasterWeights({len(self._masters)} tensors, {len(self._copy)} copied to {self.dtype})"

    def parameters(self) -> list[Tensor]:
        """The master tensors, in the model's order: build the optimizer on these."""
        return list(self._masters)

    def named_parameters(self) -> list[tuple[str, Tensor]]:
        return list(zip(self._names, self._masters))

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
            torch._foreach_copy_([p for p, _ in self._copy], [m for _, m in self._copy])

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's gradients before a backward (None by default, as torch; zeros in place otherwise).

        The copied masters' gradients need no clearing: ``grads_to_master`` overwrites them (or sets None),
        so their buffers stay put from step to step.
        """
        for p in self._model_params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.zero_()

    def state_dict(self) -> dict[str, Tensor]:
        """Parameter name -> master tensor (float32): save this, not the rounded model weights."""
        return {name: m.detach().clone() for name, m in zip(self._names, self._masters)}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Load master weights saved by ``state_dict`` and round them into the model."""
        missing = set(self._names) - set(state)
        unexpected = set(state) - set(self._names)
        if missing or unexpected:
            raise KeyError(f"MasterWeights.load_state_dict: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
        for name, m in zip(self._names, self._masters):
            t = state[name]
            if t.shape != m.shape:
                raise ValueError(f"MasterWeights.load_state_dict: {name!r} has shape {tuple(t.shape)}, "
                                 f"expected {tuple(m.shape)}")
            m.copy_(t)
        self.master_to_model()

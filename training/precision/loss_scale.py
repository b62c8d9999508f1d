"""DynamicLossScaler: the loss scale of float16 training, with torch.amp.GradScaler's rules, written out.

float16 keeps 5 exponent bits: gradients below 6e-8 flush to zero.  The backward therefore starts from the
loss gradient times S, which lifts them into range, and the float32 gradients are divided by S afterwards.
Too large an S overflows to inf: that step is skipped and S halved; after ``growth_interval`` clean steps S
doubles.  Scale, growth tracker and found-inf flag live on the device; ``step`` reads the flag once (as
GradScaler.step does).  The fused kernels torch uses are called by default; ``*_reference_`` beside them
write each one out with plain device ops, and the tests tie the two together.  training/precision/master.py shows
where the scaler sits in a mixed-precision step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

from layers.checks import check_int, check_number


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

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        *,
        enabled: bool = True,
        device: torch.device | str = "cpu",
        fused: bool = True,
    ):
        owner = "DynamicLossScaler"
        check_number(owner, "init_scale", init_scale, 0.0, lo_open=True)
        check_number(owner, "growth_factor", growth_factor, 1.0, lo_open=True)
        check_number(owner, "backoff_factor", backoff_factor, 0.0, 1.0, lo_open=True, hi_open=True)
        check_int(owner, "growth_interval", growth_interval)
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval, self.enabled, self.fused = growth_interval, bool(enabled), bool(fused)
        device = torch.device(device)
        self._scale = torch.full((1,), float(init_scale) if enabled else 1.0, dtype=torch.float32, device=device)
        self._inv_scale = torch.empty((1,), dtype=torch.float32, device=device)
        self._growth_tracker = torch.zeros((1,), dtype=torch.int32, device=device)
        self.found_inf = torch.zeros((1,), dtype=torch.float32, device=device)
        self._unscaled = False  # per step: unscale_and_check_ ran since the last update()

    def __repr__(self) -> str:
        return (
            f"DynamicLossScaler(growth_factor={self.growth_factor}, backoff_factor={self.backoff_factor}, "
            f"growth_interval={self.growth_interval}, enabled={self.enabled})"
        )

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
                raise ValueError(
                    f"{self!r}: unscale a {g.dtype} gradient in float32: copy it into float32 master "
                    f"weights first (MasterWeights.grads_to_master), or 1/S may flush it to zero"
                )
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
            torch._amp_update_scale_(
                self._scale,
                self._growth_tracker,
                self.found_inf,
                self.growth_factor,
                self.backoff_factor,
                self.growth_interval,
            )
        else:
            update_scale_reference_(
                self._scale,
                self._growth_tracker,
                self.found_inf,
                self.growth_factor,
                self.backoff_factor,
                self.growth_interval,
            )
        self._unscaled = False

    def state_dict(self) -> dict:
        """GradScaler's keys, so a checkpoint can be read by either."""
        return {
            "scale": self.get_scale(),
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "_growth_tracker": int(self._growth_tracker.item()),
        }

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
            raise ValueError(
                f"unscale: gradients on {device} but the scaler lives on {found_inf.device}; "
                f"build DynamicLossScaler(device={str(device)!r})"
            )
        torch._amp_foreach_non_finite_check_and_unscale_(gs, found_inf, inv_scale)


def unscale_check_reference_(grads: list[Tensor], found_inf: Tensor, inv_scale: Tensor) -> None:
    """The same, written out: any entry that is not finite (inf or nan) sets the flag."""
    for g in grads:
        bad = (~torch.isfinite(g)).any()  # 0-d bool, on the device
        found_inf.copy_(torch.maximum(found_inf, bad.to(found_inf.dtype)))
        g.mul_(inv_scale)


def update_scale_reference_(
    scale: Tensor, tracker: Tensor, found_inf: Tensor, growth_factor: float, backoff_factor: float, growth_interval: int
) -> None:
    """``torch._amp_update_scale_`` written out with device ops (no branch on a device value)."""
    found = found_inf > 0  # (1,) bool
    successful = torch.where(found, torch.zeros_like(tracker), tracker + 1)  # clean steps in a row
    grow = successful >= growth_interval
    grown = scale.double() * growth_factor  # as the kernel: float * double, rounded to float once
    grown = grown.to(scale.dtype)
    new_scale = torch.where(
        found,
        (scale.double() * backoff_factor).to(scale.dtype),
        torch.where(grow & torch.isfinite(grown), grown, scale),
    )
    scale.copy_(new_scale)
    tracker.copy_(torch.where(grow, torch.zeros_like(successful), successful))

"""GradientMonitor: per-parameter gradient, weight and update statistics of a model, recorded during training.

Use (after backward, before clipping and the optimizer step)::

    mon = GradientMonitor(model, every=50)       # a handgrad Net/Sequential, an nn.Module or an engine model
    mon.watch_activations()                      # optional: per-layer output statistics (forward hooks)
    for step, (x, y) in enumerate(batches):
        loss = ...; backward ...
        mon.update(step)                         # no-op unless step % every == 0 (or step in also=...)
        clip_grad_norm_(params, 1.0)
        mon.update_after_clip()                  # total norm after clipping, into the same record
        opt.step()
    mon.to_jsonl(out / "monitor.jsonl"); mon.plot(out)

Everything an update measures is computed on the model's device and read back in one transfer
(one ``torch.cat(...).tolist()``).  ``update_after_clip`` reads nothing back: its norm travels with the
next update's transfer, or is read when ``records``/``flush``/``to_jsonl``/``plot`` is called.

The update-to-weight ratio |W_after - W_before| / |W_before| of a recorded step's optimizer update needs
the weights before it: a recorded ``update(t)`` keeps a copy of every parameter (memory: one more copy of
the model's parameters, on their device) until the next ``update`` call, which computes the ratios on the
device and frees the copy.  Called every step (as a trainer does), that next call is step t + 1, so the
ratio is that of the single update of step t; it is read back with the next recorded update and stored
there, with ``update_ratio_span = [t, t + 1]`` saying which weights it compares.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor

from layers.checks import check_int

from .activations import ActivationWatcher
from .records import write_jsonl
from .stats import ACT_FIELDS, GRAD_FIELDS, PARAM_FIELDS, grad_stats, param_stats, total_norm, update_ratio

_ACT_FRACTION = {"relu": "dead_fraction", "tanh": "saturated_fraction", "sigmoid": "saturated_fraction"}


def _weight_and_grad(p) -> tuple[Tensor, Tensor | None]:
    """A parameter's values and gradient as torch tensors: a torch tensor (handgrad, nn.Parameter) or an
    autodiff engine Tensor, whose values are ``p.data`` and whose gradient lives on ``p.data.grad``."""
    if isinstance(p, Tensor):
        return p.detach(), p.grad
    data = getattr(p, "data", None)
    if isinstance(data, Tensor):
        return data.detach(), data.grad
    raise TypeError(
        f"GradientMonitor: a parameter of type {type(p).__name__} is neither a torch tensor nor an "
        f"object holding one in .data"
    )


class GradientMonitor:
    """Records, every ``every`` steps and at the steps in ``also``, per parameter: gradient mean/std/norm/max|g|/
    min/max and a histogram of ``hist_bins`` equal bins over [-max|g|, max|g|] (that parameter's own range, stored
    as ``hist_range``), the weights' mean/std/norm and the update-to-weight ratio; the total gradient norm before
    and after clipping; with ``watch_activations()``, per-layer output mean/std and dead/saturated fractions.

    model: anything with ``named_parameters()`` -- a handgrad Net/Sequential (names as its torch twin's;
    a Linear's weight is (out, in), as nn.Linear's), an
    nn.Module, or an autodiff engine model.  ``parameters``: where the weights and gradients to report live, if
    not in the model (anything with ``named_parameters()``, e.g. the float32 ``MasterWeights`` of a
    mixed-precision model, whose gradients are unscaled; activations are still the model's).
    ``also``: steps to record besides the multiples of ``every`` (a trainer passes its first step and each epoch's
    last, so that a run shorter than ``every`` steps is recorded too).
    ``tensorboard``: a ``torch.utils.tensorboard.SummaryWriter``
    that receives every record (tags prefixed with ``name/`` when a name is given).  Statistics use
    torch's definitions (std unbiased, norms 2-norms over all elements).
    """

    def __init__(
        self,
        model,
        every: int = 1,
        hist_bins: int = 50,
        *,
        name: str = "",
        tensorboard=None,
        parameters=None,
        also: Iterable[int] = (),
    ) -> None:
        if model is None:
            raise TypeError(
                "GradientMonitor: the model is None; pass the model whose parameters to watch (anything "
                "with named_parameters())"
            )
        for what, obj in (("the model", model), ("parameters", parameters)):
            if obj is not None and not callable(getattr(obj, "named_parameters", None)):
                raise TypeError(f"GradientMonitor: {what} ({type(obj).__name__}) has no named_parameters()")
        check_int("GradientMonitor", "every", every)
        check_int("GradientMonitor", "hist_bins", hist_bins)
        self.model, self.every, self.hist_bins, self.name = model, every, hist_bins, name
        self.also = frozenset(operator.index(s) for s in also)
        self._param_source = model if parameters is None else parameters
        self.tensorboard = tensorboard
        if not self._params():
            raise ValueError(f"GradientMonitor: the model ({type(model).__name__}) has no parameters")
        self._records: list[dict] = []
        self._activations: ActivationWatcher | None = None
        self._snapshot: tuple[int, list[str], list[Tensor]] | None = None  # (step, names, weights) at the last record
        self._pending_ratio: tuple[list[int], list[str], Tensor] | None = None  # ([t0, t1], names, ratios)
        self._pending_clip: tuple[dict, Tensor] | None = None  # (record, total norm after clipping)
        self._last_recorded: dict | None = None  # the record of the latest update() call, if it recorded
        self._last_step: int | None = None
        self._consecutive = True  # every update() so far came with the step after the one before

    # -- what the trainer calls ---------------------------------------------------------------------------

    def update(self, step: int) -> dict | None:
        """Record the statistics of the gradients now in the model (call after backward, before clipping and
        the optimizer step), if ``step % every == 0`` or ``step`` is in ``also``; -> the new record, or None.  One
        read-back."""
        step = operator.index(step)
        if self._last_step is not None and step != self._last_step + 1:
            self._consecutive = False
        self._last_step = step
        params = self._params()
        names = [n for n, _ in params]
        weights = [w for _, (w, _) in params]
        if self._snapshot is not None:
            t0, old_names, old = self._snapshot
            self._snapshot = None
            if old_names == names and all(a.shape == b.shape for a, b in zip(old, weights, strict=True)):
                with torch.no_grad():
                    ratios = torch.stack([update_ratio(w, w0) for w, w0 in zip(weights, old, strict=True)])
                self._pending_ratio = ([t0, step], names, ratios)
        self._last_recorded = None
        if not self.records_at(step):
            self._gate_activations()
            return None
        record = self._measure(step, params)
        self._gate_activations()
        self._records.append(record)
        self._last_recorded = record
        with torch.no_grad():
            self._snapshot = (step, names, [w.clone() for w in weights])
        if self.tensorboard is not None:
            from .tensorboard import to_tensorboard

            to_tensorboard(self.tensorboard, record, prefix=self.name)
        return record

    def records_at(self, step: int) -> bool:
        """Whether ``update(step)`` records."""
        return step % self.every == 0 or step in self.also

    def update_after_clip(self) -> None:
        """Add the total gradient norm as it is now (after clipping) to the record the latest ``update`` made;
        nothing when that call recorded nothing.  Computed on the device; read back with the next transfer."""
        record = self._last_recorded
        if record is None:
            return
        grads = [g for _, (_, g) in self._params() if g is not None]
        with torch.no_grad():
            self._pending_clip = (record, total_norm(grads))

    def watch_activations(self, in_eval: bool = False) -> GradientMonitor:
        """Gather per-layer output statistics in training-mode forwards from now on (eval-mode forwards too
        with ``in_eval=True``); a recorded ``update`` stores those of the latest forward.  Forward hooks:
        ``remove()`` undoes them.  Cost: a few reductions over each layer's output in a forward that gathers.

        Which forwards gather: while ``update`` has been called on every step (consecutive step numbers, as
        a trainer calls it), only those after ``update(s)`` where ``s + 1`` is a recorded step; before the
        first ``update``, or once the steps were not consecutive, every forward."""
        if self._activations is None:
            self._activations = ActivationWatcher(self.model, in_eval)
        self._activations.in_eval = in_eval
        self._gate_activations()
        return self

    def _gate_activations(self) -> None:
        """Gather only in the forward of a step that will be recorded, where steps come one after another
        (the next update is then ``_last_step + 1``); in every forward otherwise."""
        if self._activations is not None:
            nxt = None if self._last_step is None else self._last_step + 1
            self._activations.active = nxt is None or not self._consecutive or self.records_at(nxt)

    def remove(self) -> None:
        """Unregister the activation hooks (the model's forward is then as before) and drop the weight copy."""
        if self._activations is not None:
            self._activations.remove()
            self._activations = None
        self._snapshot = None

    def state_dict(self) -> dict:
        """What a resumed run needs to go on exactly as if never stopped: the records, the weights kept for the
        next update-to-weight ratio and a ratio not yet read back (device tensors), the step bookkeeping."""
        snap, ratio = self._snapshot, self._pending_ratio
        return {
            "records": list(self.records),
            "last_step": self._last_step,
            "consecutive": self._consecutive,
            "snapshot": None if snap is None else {"step": snap[0], "names": snap[1], "weights": snap[2]},
            "pending_ratio": None if ratio is None else {"span": ratio[0], "names": ratio[1], "ratios": ratio[2]},
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state_dict()``'s output (tensors are moved to the model's device)."""
        missing = {"records", "last_step", "consecutive", "snapshot", "pending_ratio"} - set(state)
        if missing:
            raise KeyError(f"GradientMonitor.load_state_dict: the state lacks {sorted(missing)}")
        device = self._params()[0][1][0].device
        self._records = list(state["records"])
        self._last_step, self._consecutive = state["last_step"], bool(state["consecutive"])
        snap, ratio = state["snapshot"], state["pending_ratio"]
        self._snapshot = (
            None if snap is None else (snap["step"], list(snap["names"]), [w.to(device) for w in snap["weights"]])
        )
        self._pending_ratio = (
            None if ratio is None else (list(ratio["span"]), list(ratio["names"]), ratio["ratios"].to(device))
        )
        self._pending_clip = self._last_recorded = None
        self._gate_activations()

    def flush(self) -> None:
        """Read back what is still on the device (the latest after-clipping norm) into its record."""
        if self._pending_clip is not None:
            record, norm = self._pending_clip
            self._pending_clip = None
            self._set_after_clip(record, norm.item())

    @property
    def records(self) -> list[dict]:
        """Every record so far, oldest first (the monitor's own list: ``records.extend`` restores a resumed run's)."""
        self.flush()
        return self._records

    def to_jsonl(self, path: str | Path, write_text=None) -> Path:
        """Write the records as JSON lines; ``monitoring.read_jsonl`` reads them back.  ``write_text(path, text)``
        writes the file (train.py passes its atomic writer); default ``Path.write_text``."""
        return write_jsonl(path, self.records, write_text)

    def plot(self, out_dir: str | Path) -> list[Path]:
        """Render the figures of ``monitoring.plot_records`` into ``out_dir``; -> the files written."""
        from .plots import plot_records

        return plot_records(self.records, out_dir, prefix=f"{self.name}_" if self.name else "")

    # -- the measurement ------------------------------------------------------------------------------------

    def _params(self) -> list[tuple[str, tuple[Tensor, Tensor | None]]]:
        return [(n, _weight_and_grad(p)) for n, p in self._param_source.named_parameters()]

    def _measure(self, step: int, params) -> dict:
        bins = self.hist_bins
        pieces: list[Tensor] = []
        with torch.no_grad():
            grads = [g for _, (_, g) in params if g is not None]
            for _, (w, g) in params:
                if g is not None:
                    pieces.append(grad_stats(g, bins))
                pieces.append(param_stats(w))
            pieces.append(total_norm(grads).reshape(1))
            ratio, clip = self._pending_ratio, self._pending_clip
            self._pending_ratio = self._pending_clip = None
            if ratio is not None:
                pieces.append(ratio[2])
            if clip is not None:
                pieces.append(clip[1].reshape(1))
            acts = self._activations.take() if self._activations is not None else {}
            pieces.extend(row for _, _, row in acts.values())
            device = params[0][1][0].device
            values = torch.cat([p.to(device) for p in pieces]).tolist()  # the one read-back of this update

        at = 0

        def take(n: int) -> list[float]:
            nonlocal at
            at += n
            return values[at - n : at]

        per_param = {}
        for name, (w, g) in params:
            rec: dict = {"shape": list(w.shape), "numel": w.numel()}
            if g is not None:
                stats = dict(zip(GRAD_FIELDS, take(len(GRAD_FIELDS)), strict=True))
                r = stats.pop("hist_max")
                stats["grad_nonfinite"] = int(stats["grad_nonfinite"])
                rec.update(stats, hist_range=[-r, r], hist_counts=[int(c) for c in take(bins)])
            else:
                rec.update(dict.fromkeys(GRAD_FIELDS[:-1]), hist_range=None, hist_counts=None)
            rec.update(zip(PARAM_FIELDS, take(len(PARAM_FIELDS)), strict=True))
            rec["update_ratio"] = None
            per_param[name] = rec
        record = {
            "step": step,
            "total_grad_norm": take(1)[0],
            "total_grad_norm_after_clip": None,
            "update_ratio_span": None,
            "params": per_param,
        }
        if ratio is not None:
            span, names, _ = ratio
            record["update_ratio_span"] = span
            for name, value in zip(names, take(len(names)), strict=True):
                if name in per_param:
                    per_param[name]["update_ratio"] = value
        if clip is not None:
            self._set_after_clip(clip[0], take(1)[0])
        if acts:
            record["activations"] = {}
            for name, (layer_type, kind, _) in acts.items():
                mean, std, fraction = take(len(ACT_FIELDS))
                entry = {"layer": layer_type, "mean": mean, "std": std}
                if kind in _ACT_FRACTION:
                    entry[_ACT_FRACTION[kind]] = fraction
                record["activations"][name] = entry
        assert at == len(values), (at, len(values))
        return record

    def _set_after_clip(self, record: dict, value: float) -> None:
        record["total_grad_norm_after_clip"] = value
        if self.tensorboard is not None:
            tag = f"{self.name}/" if self.name else ""
            self.tensorboard.add_scalar(f"{tag}grad_norm/total_after_clip", value, record["step"])

"""The three implementations a run trains side by side, behind one small protocol (``Impl``).

manual: the hand-written model, its explicit backward and a handgrad optimizer; no autograd graph.
engine: the same MLP on handgrad's autodiff engine (gradients from per-operation closures), handgrad optimizer.
torch:  the nn.Module twin: autograd's backward and torch.optim's optimizer.

Mixed precision (``--dtype bfloat16`` or ``float16``; not the engine): every model is built in float32 from the
same weights.  The manual implementation keeps float32 master weights (``precision.MasterWeights``) that its
optimizer steps, runs its layers in the half dtype (batch norm keeps float32 parameters and statistics), takes
cross-entropy of the half logits in float32, and for float16 scales the loss gradient with a hand-written
``DynamicLossScaler``.  The twin keeps float32 weights and runs forward and loss under ``torch.autocast``, with
``torch.amp.GradScaler`` for float16: PyTorch's own recipe, for comparison.  Gradients are clipped and monitored
after unscaling, in float32.  float32/float64 runs take none of these paths.
"""
from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from autodiff import cross_entropy, no_grad
from losses import CrossEntropyLoss
from optimizers import OPTIMIZERS, clip_grad_norm_, get_optimizer

from .allreduce import GradBuckets
from .config import TrainConfig
from .cuda_graph import CapturedStep, use_cuda_graph
from .distributed import SINGLE, DistInfo, broadcast_
from .errors import UsageError
from .models import build_models
from .loss_scale import DynamicLossScaler
from .precision import MasterWeights
from .schedule import make_scheduler


class Impl(Protocol):
    name: str
    model: object               # has state_dict() / load_state_dict()
    opt: torch.optim.Optimizer
    sched: object | None        # a torch.optim.lr_scheduler stepped after every step, or None
    monitor: object | None      # a monitoring.GradientMonitor told of every step's gradients, or None

    def train_step(self, x: Tensor, y: Tensor, total: int, step: int = 0) -> tuple[Tensor, Tensor, Tensor | None]:
        """One optimizer step on this rank's part (x, y) of a global batch of ``total`` samples.

        -> (the loss summed over (x, y), logits, total grad norm before clipping or None); device tensors.
        The gradient is that of the mean loss over the global batch (over (x, y) in one process).  ``step``:
        the run's global step number, for the monitor.
        """

    def eval_batch(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """-> (summed loss, logits), no gradients."""

    def named_parameters(self) -> list[tuple[str, Tensor]]:
        """(torch-style name, tensor whose .grad is the gradient)."""


def _clip_monitored(impl, step: int, clip_fn, params=None) -> Tensor | None:
    """Clip the gradients of ``params`` (default: the model's) with ``clip_fn(params, max_norm)`` if the run clips
    (-> the total norm before), and tell the monitor, if any, about them before and after."""
    mon = impl.monitor
    if mon is not None:
        mon.update(step)
    norm = clip_fn(impl.model.parameters() if params is None else params, impl.clip) if impl.clip else None
    if mon is not None:
        mon.update_after_clip()
    return norm


def check_mixed_precision(config: TrainConfig, info: DistInfo) -> None:
    """Mixed precision runs in one process: the hand-written all-reduce buckets and the loss scaler's found-inf
    flag have not been made to work together across ranks yet."""
    if config.is_mixed and info.enabled:
        raise UsageError(f"--dtype {config.dtype} under torchrun: mixed precision runs in a single process only "
                         f"for now; use --dtype float32 (or float64) with torchrun")


def optimizer_kwargs(config: TrainConfig) -> dict:
    kw = {"lr": config.lr, "weight_decay": config.weight_decay}
    if config.optimizer in ("sgd", "rmsprop"):
        kw["momentum"] = config.momentum
    return kw


def capturable_kwargs(config: TrainConfig, param: torch.Tensor) -> dict:
    """The captured step's optimizer: capturable (step counters on the device) and, with a --schedule, lr a 0-d
    tensor beside the parameters that the kernels read there, so that the schedule's changes (schedulers fill a
    tensor lr in place) reach a replayed graph.  A constant lr stays a number (one kernel fewer in SGD's step)."""
    kw = {"capturable": True}
    if config.schedule != "constant":
        kw["lr"] = torch.tensor(config.lr, dtype=param.dtype, device=param.device)
    return kw


class ManualImpl:
    name = "manual"
    sched = None
    monitor = None
    master = None   # mixed precision: the float32 MasterWeights the optimizer steps
    scaler = None   # float16: the DynamicLossScaler

    def __init__(self, model, config: TrainConfig, info: DistInfo = SINGLE, cuda_graph: bool = False):
        self.model = model
        # With cuda_graph the step is captured once and replayed (training/cuda_graph.py): the optimizer keeps its
        # step counters on the device (capturable); .grad buffers stay put in every mode (zeroed in place).
        self.cuda_graph, self.graph = cuda_graph, None
        self.capture_fallback = config.cuda_graph is None  # chosen by default: a failed capture warns, runs eagerly
        self.crit = CrossEntropyLoss()
        self.eval_crit = CrossEntropyLoss(reduction="sum")
        self.clip = config.clip_grad
        self.buckets = None
        if config.is_mixed:
            self.compute_dtype = config.compute_dtype
            self.master = MasterWeights(model, cast_to=config.compute_dtype)  # copies first, then the cast
            self.opt = get_optimizer(config.optimizer, self.master.parameters(), **optimizer_kwargs(config))
            if config.compute_dtype == torch.float16:
                self.scaler = DynamicLossScaler(device=self.master.parameters()[0].device)
            return
        self.opt = get_optimizer(config.optimizer, model.parameters(), **{
            **optimizer_kwargs(config), **(capturable_kwargs(config, model.parameters()[0]) if cuda_graph else {})})
        if info.enabled:  # each rank's share of the global mean, summed over ranks by hand-written all-reduces
            self.crit = CrossEntropyLoss(reduction="sum")
            self.buckets = GradBuckets(model.parameters(), scale=1.0).attach(model)

    def train_step(self, x, y, total, step=0):
        if self.master is not None:
            return self._mixed_step(x, y, step)
        if self.cuda_graph:  # one process, no monitor (build_impls checks): total is y's size, step unused
            if self.graph is None:
                self.graph = CapturedStep(lambda xb, yb: self._step(xb, yb, yb.shape[0], 0), x, y,
                                          fallback=self.capture_fallback)
            return self.graph(x, y)  # eager for a batch of another shape (an epoch's last)
        return self._step(x, y, total, step)

    def _step(self, x, y, total, step):
        self.opt.zero_grad(set_to_none=False)  # .grad buffers stay put: zeroed in place, written in place
        logits = self.model(x)
        loss = self.crit(logits, y)
        if self.buckets is None:
            self.model.backward(self.crit.backward())  # containers skip the first layer's input gradient
            loss = loss * y.shape[0]
        else:
            self.model.backward(self.crit.backward(1.0 / total))  # buckets launch as their layers finish
            self.buckets.finish()
        norm = _clip_monitored(self, step, clip_grad_norm_)
        self.opt.step()
        return loss, logits, norm

    def _mixed_step(self, x, y, step):
        """A mixed-precision step: half forward and backward, float32 cross-entropy, float32 master update."""
        self.master.zero_grad()
        logits = self.model(x.to(self.compute_dtype))  # (N, C) half
        loss = self.crit(logits, y)  # softmax and loss in float32
        scaler = self.scaler
        # dL/dlogits (times S for float16), rounded once to the half dtype
        self.model.backward(self.crit.backward() if scaler is None else self.crit.backward(scaler.scale_loss_grad()))
        self.master.grads_to_master(scaler)  # float32 gradients, divided by S; found_inf set
        norm = _clip_monitored(self, step, clip_grad_norm_, self.master.parameters())
        if scaler is None:
            self.opt.step()
        else:
            scaler.step(self.opt)  # skipped when a gradient was inf/nan (one read-back of the flag)
            scaler.update()  # S halves on overflow, doubles after 2000 clean steps
        self.master.master_to_model()
        return loss * y.shape[0], logits.float(), norm

    def eval_batch(self, x, y):
        if self.master is not None:
            logits = self.model(x.to(self.compute_dtype))
            return self.eval_crit(logits, y), logits.float()
        logits = self.model(x)
        return self.eval_crit(logits, y), logits

    def named_parameters(self):
        return self.master.named_parameters() if self.master is not None else list(self.model.named_parameters())


class EngineImpl:
    name = "engine"
    sched = None
    monitor = None

    def __init__(self, model, config: TrainConfig, info: DistInfo = SINGLE):
        self.model = model
        self.opt = get_optimizer(config.optimizer, model.parameters(), **optimizer_kwargs(config))
        self.clip = config.clip_grad
        # The engine's graph has no per-layer hook: its gradients are all-reduced after the whole backward.
        self.buckets = GradBuckets([p.data for p in model.parameters()], scale=1.0) if info.enabled else None

    def train_step(self, x, y, total, step=0):
        self.opt.zero_grad()
        logits = self.model(x)
        if self.buckets is None:
            loss = cross_entropy(logits, y)
            loss.backward()
            loss_sum = loss.data * y.shape[0]
        else:
            loss = cross_entropy(logits, y, reduction="sum")
            (loss * (1.0 / total)).backward()
            self.buckets.reduce_all()
            loss_sum = loss.data
        norm = _clip_monitored(self, step, clip_grad_norm_)
        self.opt.step()
        return loss_sum, logits.data, norm

    @no_grad()
    def eval_batch(self, x, y):
        logits = self.model(x)
        return cross_entropy(logits, y, reduction="sum").data, logits.data

    def named_parameters(self):
        return [(name, p.data) for name, p in self.model.named_parameters()]


class TorchImpl:
    name = "torch"
    sched = None
    monitor = None
    autocast = None  # mixed precision: the half dtype torch.autocast runs forward and loss in
    scaler = None    # float16: torch.amp.GradScaler

    def __init__(self, model: torch.nn.Module, config: TrainConfig, info: DistInfo = SINGLE):
        self.model = model
        cls = getattr(torch.optim, OPTIMIZERS[config.optimizer].__name__)  # handgrad's twin in torch.optim
        self.opt = cls(model.parameters(), **optimizer_kwargs(config))
        self.clip = config.clip_grad
        self.world = info.world_size if info.enabled else None
        # Under torchrun the twin trains as PyTorch users train: DistributedDataParallel (it averages over ranks).
        self.forward = torch.nn.parallel.DistributedDataParallel(model) if info.enabled else model
        if config.is_mixed:
            self.autocast = config.compute_dtype
            self.device_type = next(model.parameters()).device.type
            if config.compute_dtype == torch.float16:
                self.scaler = torch.amp.GradScaler(self.device_type)

    def train_step(self, x, y, total, step=0):
        if self.autocast is not None:
            return self._autocast_step(x, y, step)
        self.opt.zero_grad()
        logits = self.forward(x)
        if self.world is None:
            loss = F.cross_entropy(logits, y)
            loss.backward()
            loss_sum = loss.detach() * y.shape[0]
        else:
            loss_sum = F.cross_entropy(logits, y, reduction="sum")
            (loss_sum * (self.world / total)).backward()  # DDP divides by the world size: the global mean remains
            loss_sum = loss_sum.detach()
        norm = _clip_monitored(self, step, torch.nn.utils.clip_grad_norm_)
        self.opt.step()
        return loss_sum, logits.detach(), norm

    def _autocast_step(self, x, y, step):
        """PyTorch's recipe: forward and loss under autocast (cross-entropy runs in float32 there), GradScaler for
        float16, gradients unscaled before they are monitored and clipped."""
        self.opt.zero_grad()
        with torch.autocast(self.device_type, dtype=self.autocast):
            logits = self.forward(x)  # (N, C) half
            loss = F.cross_entropy(logits, y)  # float32
        scaler = self.scaler
        if scaler is None:
            loss.backward()
        else:
            scaler.scale(loss).backward()
            scaler.unscale_(self.opt)
        norm = _clip_monitored(self, step, torch.nn.utils.clip_grad_norm_)
        if scaler is None:
            self.opt.step()
        else:
            scaler.step(self.opt)
            scaler.update()
        return loss.detach() * y.shape[0], logits.detach().float(), norm

    @torch.no_grad()
    def eval_batch(self, x, y):
        if self.autocast is not None:
            with torch.autocast(self.device_type, dtype=self.autocast):
                logits = self.model(x)
                return F.cross_entropy(logits, y, reduction="sum"), logits.float()
        logits = self.model(x)
        return F.cross_entropy(logits, y, reduction="sum"), logits

    def named_parameters(self):
        return list(self.model.named_parameters())


IMPL_CLASSES = {"manual": ManualImpl, "engine": EngineImpl, "torch": TorchImpl}


def build_impls(config: TrainConfig, device: torch.device, dtype: torch.dtype, info: DistInfo = SINGLE,
                steps_per_epoch: int = 0) -> dict[str, Impl]:
    """impl name -> Impl for every implementation the config names, all from the same initial weights.

    With ``steps_per_epoch`` each gets the learning-rate scheduler ``config.schedule`` asks for (``impl.sched``).
    Under torchrun rank 0's initial weights and buffers are broadcast to every rank first.
    """
    check_mixed_precision(config, info)
    models = build_models(config, device, dtype, sync_bn=info.enabled and config.sync_bn)
    if info.enabled:
        for name, model in models.items():
            if name == "engine":
                broadcast_([p.data for p in model.parameters()])
            elif name != "torch":  # DistributedDataParallel broadcasts the twin's itself
                broadcast_([t for _, t in model.named_parameters()] + [t for _, t in model.named_buffers()])
    impls = {name: IMPL_CLASSES[name](model, config, info) for name, model in models.items() if name != "manual"}
    if "manual" in models:  # first, as the config lists it
        manual = ManualImpl(models["manual"], config, info, cuda_graph=use_cuda_graph(config, device, info))
        impls = {"manual": manual, **impls}
    for impl in impls.values():
        impl.sched = make_scheduler(impl.opt, config, steps_per_epoch) if steps_per_epoch else None
    return impls


def weights_state(impl: Impl) -> dict[str, Tensor]:
    """The implementation's weights and buffers with torch's keys and layouts (``model.state_dict()``); in a
    mixed-precision manual run the weights are its float32 masters, not their half rounding in the model."""
    master = getattr(impl, "master", None)
    return impl.model.state_dict() if master is None else master.model_state_dict()


def grads_state(impl: Impl) -> dict[str, Tensor]:
    """The gradients now in the implementation's parameters, with the keys and layouts of ``weights_state`` (a
    hand-written Linear keeps its weight as (in, out), its state as (out, in): its gradient is transposed to match);
    parameters without a gradient are left out."""
    state, grads = weights_state(impl), {}
    for name, p in impl.named_parameters():
        if p.grad is not None:
            view = state[name]  # p itself, or a view of it in torch's layout
            grads[name] = p.grad if (view.shape, view.stride()) == (p.shape, p.stride()) else p.grad.t()
    return grads


def load_weights_state(impl: Impl, state: dict[str, Tensor]) -> None:
    """Load what ``weights_state`` returned (on the model's device)."""
    master = getattr(impl, "master", None)
    if master is None:
        impl.model.load_state_dict(state)
    else:
        master.load_model_state_dict(state)


def max_param_abs_diff(impls: dict[str, Impl]) -> float | None:
    """Largest |a - b| over every weight and buffer, between each implementation and the first.

    In a mixed-precision run the weights compared are float32 on both sides (the manual run's masters, the
    twin's own), but each side rounded its products to the half dtype its own way: the difference measures how
    far two mixed-precision runs drift apart, not an error, and is far above float32's 1e-7.
    """
    if len(impls) < 2:
        return None
    first, *rest = impls.values()
    ref = weights_state(first)
    diffs = [(ref[k].double() - v.double()).abs().max() for other in rest
             for k, v in weights_state(other).items() if v.is_floating_point() and v.numel()]
    return torch.stack(diffs).max().item()

"""The three implementations a run trains side by side, behind one small protocol (``Impl``), and building them.

manual (training/impls/manual.py): the hand-written model, its explicit backward and a handgrad optimizer.
engine (training/impls/engine.py): the MLP on handgrad's autodiff engine, a handgrad optimizer.
torch (training/impls/twin.py): the nn.Module twin: autograd's backward and torch.optim's optimizer.

Mixed precision (``--dtype bfloat16`` or ``float16``; not the engine): every model is built in float32 from the
same weights.  The manual implementation keeps float32 master weights (``precision.MasterWeights``) that its
optimizer steps, runs its layers in the half dtype (batch norm keeps float32 parameters and statistics), takes
cross-entropy of the half logits in float32, and for float16 scales the loss gradient with a hand-written
``DynamicLossScaler``.  The twin keeps float32 weights and runs forward and loss under ``torch.autocast``, with
``torch.amp.GradScaler`` for float16: PyTorch's own recipe, for comparison.  Gradients are clipped and monitored
after unscaling, in float32.  float32/float64 runs take none of these paths.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor

from ..compiled import check_compile
from ..config.optim import OptimConfig
from ..config.run import RunConfig
from ..cuda_graph import use_cuda_graph
from ..errors import UsageError
from ..parallel.distributed import SINGLE, DistInfo, broadcast_
from ..schedule import make_scheduler
from .engine import EngineImpl
from .manual import ManualImpl
from .twin import TorchImpl


class Impl(Protocol):
    name: str
    model: Any  # a hand-written Layer, an EngineNet or an nn.Module: each has state_dict() / load_state_dict()
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler | None  # stepped after every step, or None
    monitor: object | None  # a monitoring.GradientMonitor told of every step's gradients, or None

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


def check_mixed_precision(run: RunConfig, info: DistInfo) -> None:
    """Mixed precision runs in one process: the hand-written all-reduce buckets and the loss scaler's found-inf
    flag have not been made to work together across ranks yet."""
    if run.is_mixed and info.enabled:
        raise UsageError(
            f"--dtype {run.dtype} under torchrun: mixed precision runs in a single process only "
            f"for now; use --dtype float32 (or float64) with torchrun"
        )


IMPL_CLASSES = {"manual": ManualImpl, "engine": EngineImpl, "torch": TorchImpl}


def build_impls(
    models: dict,
    optim: OptimConfig,
    run: RunConfig,
    device: torch.device,
    info: DistInfo = SINGLE,
    *,
    total_steps: int = 0,
    model: str = "mlp",
) -> dict[str, Impl]:
    """impl name -> Impl training each of ``models`` (impl name -> ``model``'s hand-written model or a copy of its
    weights: build_models, a task's), stepped by ``optim``'s optimizer, as ``run`` says (precision, the compiled
    or captured step).  With ``total_steps`` each gets the learning-rate scheduler ``optim.schedule`` asks for
    (``impl.sched``).  Under torchrun rank 0's initial weights and buffers are broadcast to every rank first.
    """
    check_mixed_precision(run, info)
    check_compile(run, info)
    if info.enabled:
        for name, m in models.items():
            if name == "engine":
                broadcast_([p.data for p in m.parameters()])
            elif name != "torch":  # DistributedDataParallel broadcasts the twin's itself
                broadcast_([t for _, t in m.named_parameters()] + [t for _, t in m.named_buffers()])
    impls = {name: IMPL_CLASSES[name](m, optim, run, info) for name, m in models.items() if name != "manual"}
    if "manual" in models:  # first, as --impl lists it
        manual = ManualImpl(models["manual"], optim, run, info, cuda_graph=use_cuda_graph(run, model, device, info))
        impls = {"manual": manual, **impls}
    for impl in impls.values():
        impl.sched = make_scheduler(impl.opt, optim, total_steps) if total_steps else None
    return impls


def weights_state(impl: Impl) -> dict[str, Tensor]:
    """The implementation's weights and buffers with torch's keys and layouts (``model.state_dict()``); in a
    mixed-precision manual run the weights are its float32 masters, not their half rounding in the model."""
    master = getattr(impl, "master", None)
    return impl.model.state_dict() if master is None else master.model_state_dict()


def grads_state(impl: Impl) -> dict[str, Tensor]:
    """The gradients now in the implementation's parameters, with the keys of ``weights_state`` (every parameter
    is kept in torch's layout for its name, so no view is taken); parameters without a gradient are left out."""
    return {name: p.grad for name, p in impl.named_parameters() if p.grad is not None}


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
    diffs = [
        (ref[k].double() - v.double()).abs().max()
        for other in rest
        for k, v in weights_state(other).items()
        if v.is_floating_point() and v.numel()
    ]
    return torch.stack(diffs).max().item()

"""manual: the hand-written model, its explicit backward and a handgrad optimizer; no autograd graph.

Mixed precision (``--dtype bfloat16`` or ``float16``): the model keeps float32 master weights
(``precision.MasterWeights``) that its optimizer steps, runs its layers in the half dtype (batch norm keeps float32
parameters and statistics), takes cross-entropy of the half logits in float32, and for float16 scales the loss
gradient with a hand-written ``DynamicLossScaler``; gradients are clipped and monitored after unscaling.
"""

from __future__ import annotations

import torch
from torch import Tensor

from losses import CrossEntropyLoss
from optimizers import clip_grad_norm_, get_optimizer

from ..compiled import CompileTimer, compile_step
from ..compiled_fast import GuardFreeStep
from ..config.optim import OptimConfig
from ..config.run import RunConfig
from ..cuda_graph import CapturedStep
from ..parallel.allreduce import GradBuckets
from ..parallel.distributed import SINGLE, DistInfo
from ..precision.loss_scale import DynamicLossScaler
from ..precision.master import MasterWeights
from .optim_setup import aux_loss, capturable_kwargs, clip_monitored, optimizer_kwargs, param_groups, rows


def _half(x: Tensor, dtype: torch.dtype) -> Tensor:
    """Images to the half dtype; token ids stay integers."""
    return x.to(dtype) if x.is_floating_point() else x


class ManualImpl:
    name = "manual"
    sched: torch.optim.lr_scheduler.LRScheduler | None = None
    monitor = None
    master = None  # mixed precision: the float32 MasterWeights the optimizer steps
    scaler = None  # float16: the DynamicLossScaler
    compiled = None  # --compile: the compiled step, timed (training/compiled.py)

    def __init__(self, model, optim: OptimConfig, run: RunConfig, info: DistInfo = SINGLE, cuda_graph: bool = False):
        self.model = model
        # With cuda_graph the step is captured once and replayed (training/cuda_graph.py): the optimizer keeps its
        # step counters on the device (capturable); .grad buffers stay put in every mode (zeroed in place).
        self.cuda_graph, self.graph = cuda_graph, None
        self.capture_fallback = run.cuda_graph is None  # chosen by default: a failed capture warns, runs eagerly
        self.crit = CrossEntropyLoss()
        self.eval_crit = CrossEntropyLoss(reduction="sum")
        self.clip = optim.clip_grad
        self.buckets = None
        if run.is_mixed:
            self.compute_dtype = run.compute_dtype
            self.master = MasterWeights(model, cast_to=run.compute_dtype)  # copies first, then the cast
            self.opt = get_optimizer(
                optim.optimizer, param_groups(self.master.named_parameters(), optim), **optimizer_kwargs(optim)
            )
            if run.compute_dtype == torch.float16:
                self.scaler = DynamicLossScaler(device=self.master.parameters()[0].device)
            return
        # --compile: the step as one graph (training/compiled.py); capturable like the captured step's optimizer, so
        # that a schedule's lr is a tensor the graph reads rather than a constant it would be compiled again for
        self.opt = get_optimizer(
            optim.optimizer,
            param_groups(list(model.named_parameters()), optim),
            **{
                **optimizer_kwargs(optim),
                **(capturable_kwargs(optim, model.parameters()[0]) if cuda_graph or run.compile else {}),
            },
        )
        if run.compile:
            step = compile_step(lambda xb, yb, total: self._step(xb, yb, total, 0), model, self.opt)
            if run.compile_fast:  # guards skipped at calls whose entry state they already passed
                step = GuardFreeStep(step, model, self.opt)
            self.compiled = CompileTimer(step, model.parameters()[0].device)
        if info.enabled:  # each rank's share of the global mean, summed over ranks by hand-written all-reduces
            self.crit = CrossEntropyLoss(reduction="sum")
            self.buckets = GradBuckets(model.parameters(), scale=1.0).attach(model)

    def train_step(self, x, y, total, step=0):
        if self.master is not None:
            return self._mixed_step(x, y, step)
        if self.compiled is not None:  # no monitor (check_compile): the step number is not used
            self.opt._opt_called = True  # what the scheduler's wrapper of opt.step records (_step calls past it)
            return self.compiled(x, y, total)
        if self.cuda_graph:  # one process, no monitor (build_impls checks): total is y's size, step unused
            if self.graph is None:
                self.graph = CapturedStep(
                    lambda xb, yb: self._step(xb, yb, yb.shape[0], 0), x, y, fallback=self.capture_fallback
                )
            return self.graph(x, y)  # eager for a batch of another shape (an epoch's last)
        return self._step(x, y, total, step)

    def _step(self, x, y, total, step):
        self.opt.zero_grad(set_to_none=False)  # .grad buffers stay put: zeroed in place, written in place
        logits = self.model(x)
        loss = self.crit(*rows(logits, y))
        aux = aux_loss(self.model)  # a mixture of experts' load-balancing term: its backward adds its gradient
        if self.buckets is None:
            self.model.backward(self.crit.backward().view_as(logits))  # containers skip the first layer's dx
            loss = (loss if aux is None else loss + aux) * y.numel()
        else:
            self.model.backward(self.crit.backward(1.0 / total).view_as(logits))  # buckets launch as layers finish
            self.buckets.finish()
            loss = loss if aux is None else loss + aux * total  # (this rank's share of aux, where it has one)
        norm = clip_monitored(self, step, clip_grad_norm_)
        if torch.compiler.is_compiling():  # past an lr scheduler's wrapper of opt.step, which torch.compile skips
            type(self.opt).step(self.opt)
        else:
            self.opt.step()
        return loss, logits, norm

    def _mixed_step(self, x, y, step):
        """A mixed-precision step: half forward and backward, float32 cross-entropy, float32 master update."""
        self.master.zero_grad()
        logits = self.model(_half(x, self.compute_dtype))  # (N, C) half
        loss = self.crit(*rows(logits, y))  # softmax and loss in float32
        scaler = self.scaler
        # dL/dlogits (times S for float16), rounded once to the half dtype
        d = self.crit.backward() if scaler is None else self.crit.backward(scaler.scale_loss_grad())
        self.model.backward(d.view_as(logits))
        self.master.grads_to_master(scaler)  # float32 gradients, divided by S; found_inf set
        norm = clip_monitored(self, step, clip_grad_norm_, self.master.parameters())
        if scaler is None:
            self.opt.step()
        else:
            scaler.step(self.opt)  # skipped when a gradient was inf/nan (one read-back of the flag)
            scaler.update()  # S halves on overflow, doubles after 2000 clean steps
        self.master.master_to_model()
        return loss * y.numel(), logits.float(), norm

    def eval_batch(self, x, y):
        if self.master is not None:
            logits = self.model(_half(x, self.compute_dtype))
            return self.eval_crit(*rows(logits, y)), logits.float()
        logits = self.model(x)
        return self.eval_crit(*rows(logits, y)), logits

    def named_parameters(self):
        return self.master.named_parameters() if self.master is not None else list(self.model.named_parameters())

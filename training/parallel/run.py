"""train.py's model-parallel run: the GPT split T (tensor) x C (context) x P (pipeline) ways, data parallelism over
the rest of the world, ZeRO over the data-parallel ranks; one implementation behind the trainer's ``Impl`` protocol.

World = D x P x C x T ranks in Megatron's order (``layout.parallel_layout``): rank = ((d * P + p) * C + c) * T + t,
t the rank's tensor-parallel rank, c its context-parallel rank, p its pipeline stage, d its data-parallel rank.  A
step, on the rank's share of the global batch (the data-parallel rank's contiguous rows, ``shard_bounds``):

    C > 1   ``cp_gpt.context_parallel`` of the GPT (or of the tensor-parallel GPT): the rank's zigzag positions of
            every window, ring attention over the context-parallel group; its gradients averaged with the
            data-parallel ones, over the D x C ranks that hold the same weights (the gradient group)
    T > 1   ``TensorParallelGPT``: forward, the vocabulary-parallel loss, backward, ``finish_gradients``
    E > 1   ``ep_moe.expert_parallel`` of the GPT (T = C = P = 1, D = E): each block's experts split over the
            data-parallel ranks, tokens sent to their experts' ranks and back; the replicated weights' gradients
            averaged, each expert's whole on its rank
    P > 1   ``GPTStage`` (T = 1) or ``TensorParallelStage`` (T > 1: each stage's blocks over its T ranks), or with
            several stages a rank (interleaved 1F1B, ZB-V) a ``StageChunks`` of them, run by
            ``run_schedule`` over M equal micro-batches, then ``finish_gradients`` (T > 1), then the tied table's
            two copies summed between the first and the last stage of each tensor rank
    D       the gradients averaged over the data-parallel group: ``GradBuckets`` (--zero 0) or ``ZeroOptimizer``
    clip    the total norm of the whole model's gradient: every rank's sum of squares, a parameter replicated over
            the tensor-parallel ranks counted 1/T, the pipeline's copy of the table not at all, all-reduced

Each rank's loss gradient is its rows' (and positions') share of the global mean, times D x C (the reduction
averages), so the update is the one-process step's up to the order of the sums.  ``model`` is the whole GPT: after
each step's weights change it is gathered from the shards (collective: every rank evaluates the same batches), and
evaluation, the summary and ``--check-parity`` read it.  With P > 1 the run's last step's timeline is written and
printed at the end (``write_timeline``, pipeline_report.py).
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor

from losses import CrossEntropyLoss
from optimizers import OPTIMIZERS, get_optimizer

from ..config.optim import OptimConfig
from ..config.parallel import ParallelConfig
from ..errors import UsageError
from ..impls.optim_setup import aux_loss, optimizer_kwargs, param_groups, rows
from .allreduce import GradBuckets
from .distributed import DistInfo
from .ep_moe import expert_parallel, is_expert_param
from .layout import parallel_layout


def check_world(split: ParallelConfig, batch_size: int, info: DistInfo) -> int:
    """Refuse, in one line naming the values, a world size or global batch that the split does not divide; -> D."""
    T, P, M, C = split.tensor_parallel, split.pipeline_parallel, split.micro_batches, split.context_parallel
    if not info.enabled:
        raise UsageError(
            f"model parallelism ({_settings(split)}) runs under torchrun: torchrun --standalone "
            f"--nproc-per-node N train.py ..."
        )
    n, E = T * P * C, split.expert_parallel
    if E > 1 and info.world_size != E:
        raise UsageError(
            f"--expert-parallel {E} runs on {E} processes (data parallelism over the same ranks), not a world "
            f"size of {info.world_size}"
        )
    if info.world_size % n:
        context = f"--context-parallel {C} x " if C > 1 else ""
        raise UsageError(
            f"the world size {info.world_size} does not divide by --tensor-parallel {T} x {context}"
            f"--pipeline-parallel {P} = {n} ranks a copy of the model"
        )
    D = info.world_size // n
    if batch_size < D:
        raise UsageError(
            f"--batch-size {batch_size} windows cannot be shared by {D} data-parallel ranks "
            f"(world size {info.world_size} / {n}); use --batch-size >= {D}"
        )
    if P > 1 and batch_size % (D * M):
        raise UsageError(
            f"--batch-size {batch_size} does not divide by {D} data-parallel ranks x "
            f"--micro-batches {M} (a pipeline's micro-batches are equal)"
        )
    return D


def _settings(split: ParallelConfig) -> str:
    context = f" --context-parallel {split.context_parallel}" * (split.context_parallel > 1)
    return (
        f"--tensor-parallel {split.tensor_parallel}{context} --pipeline-parallel {split.pipeline_parallel} --zero "
        f"{split.zero}" + " --check-parity" * split.check_parity
    )


class ParallelImpl:
    """The hand-written GPT's step split as ``split`` says, stepped by ``optim``'s optimizer; see the module."""

    name = "manual"
    sched: torch.optim.lr_scheduler.LRScheduler | None = None
    monitor = None

    def __init__(self, gpt, split: ParallelConfig, optim: OptimConfig, batch_size: int, info: DistInfo) -> None:
        self.split, self.model, self.clip = split, gpt, optim.clip_grad
        T, P, C = split.tensor_parallel, split.pipeline_parallel, split.context_parallel
        self.D = check_world(split, batch_size, info)
        # Megatron's order: tensor ranks adjacent, then the context-parallel ranks, then the stages, then the copies
        lay = parallel_layout(T, P, C)
        self.layout, self.T, self.P, self.C = lay, T, P, C
        self.R = self.D * C  # the ranks holding the same weights, over which the gradients are averaged
        # the group a stage's activations travel in (P > 1), else the tensor-parallel group: parity.py reads them
        self.inner_rank, self.inner_group = (lay.pp_rank, lay.pp_group) if P > 1 else (lay.tp_rank, lay.tp_group)
        self.dp_group = lay.dp_group
        self.grad_group = lay.grad_group  # the data-parallel ranks and, with C > 1, the context-parallel ones
        self.data_info = DistInfo(lay.dp_rank, self.D)  # the rows of each global batch this rank's copy trains on
        full = dict(gpt.named_parameters())
        self.E = split.expert_parallel
        self.part, self.tie_group = _split(gpt, split, lay, self.R), lay.tie_group
        named = list(self.part.named_parameters())
        self.params = [p for _, p in named]
        # each rank's own experts, not averaged; a list, in the model's order, every rank gathering them alike
        self.experts = [n for n, _ in named if self.E > 1 and is_expert_param(n)]
        # the clip's weight of each parameter's squares: the norm is of the one-process model's gradient (an
        # expert's, on one rank only, counted R times: the sum below divides by R)
        self.norm_weight = {
            id(p): (
                0.0
                if name == "head"
                else 1.0 / T
                if T > 1 and p.numel() == full[name].numel()
                else float(self.R)
                if name in self.experts
                else 1.0
            )
            for name, p in named
        }
        groups, kw = param_groups(named, optim), optimizer_kwargs(optim)
        self.zero, self.buckets = None, None
        if split.zero:
            from .zero import ZeroOptimizer

            self.zero = ZeroOptimizer(OPTIMIZERS[optim.optimizer], groups, stage=split.zero, group=lay.grad_group, **kw)
            self.opt = self.zero.optimizer
        else:
            self.opt = get_optimizer(optim.optimizer, groups, **kw)
            if self.R > 1:
                replicated = [p for n, p in named if n not in self.experts]
                self.buckets = GradBuckets(replicated, scale=1.0 / self.R, group=lay.grad_group)
        self.eval_crit = CrossEntropyLoss(reduction="sum")
        self._stale = False  # whether the shards moved since the whole model was gathered
        self.logits = None  # the last step's logits where they are in one piece a copy (not pipelined)

    # -- a training step -------------------------------------------------------------------------------------------
    def train_step(self, x: Tensor, y: Tensor, total: int, step: int = 0):
        """-> (this rank's part of the global batch's summed loss: its rows' on one rank of each copy, 0 on the
        others; None for the logits; the total norm before clipping or None)."""
        loss = self.forward_backward(x, y, total)
        norm = self.reduce_and_step()
        return loss, None, norm

    def zero_grad(self) -> None:
        if self.zero is not None:
            self.zero.zero_grad()
        else:
            for p in self.params:
                p.grad = None

    def forward_backward(self, x: Tensor, y: Tensor, total: int) -> Tensor:
        """This rank's gradients of its share of the global mean loss (x D); -> its summed loss as train_step's."""
        self.zero_grad()
        if self.C > 1:  # this rank's zigzag positions of every window (cp_gpt.py)
            from .cp_gpt import zigzag_part

            x, y = zigzag_part(x, self.layout.cp_rank, self.C), zigzag_part(y, self.layout.cp_rank, self.C)
        share = y.numel() / total * self.R  # the gradient reduction averages over the R = D x C ranks
        lay = self.layout  # who reports the loss: the last stage's first tensor rank (each context-parallel rank,
        # its positions'); the last stage is on pipeline rank P-1, or on rank 0 under ZB-V
        reports = (self.part.last if self.P > 1 else True) and lay.tp_rank == 0
        if self.P > 1:
            from .pipeline_runtime import run_schedule

            stage, M = self.part, self.split.micro_batches
            b = x.shape[0] // M
            losses, self.trace = run_schedule(
                stage,
                self.split.pipeline_schedule,
                list(x.split(b)),
                list(y.split(b)),
                stage.activation_shape(b, x.shape[1]),
                self.inner_group,
            )
            if self.T > 1:
                stage.finish_gradients()
            stage.tie_gradients(self.tie_group)
            mean = torch.tensor(sum(losses) / M if stage.last else 0.0, dtype=torch.float64)
        elif self.T > 1:
            crit = self.part.loss()
            logits = self.part(x)
            mean = crit(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            self.logits = logits  # (B, T, Vp/T) this rank's vocabulary columns, for --check-parity
            self.part.backward(crit.backward(share).view_as(logits))
            self.part.finish_gradients()
        else:
            crit = CrossEntropyLoss()
            logits = self.part(x)
            mean = crit(*rows(logits, y))
            self.logits = logits
            self.part.backward(crit.backward(share).view_as(logits))
            aux = aux_loss(self.part)  # a mixture of experts' load-balancing term: this rank's share of it
            if aux is not None:  # (each rank reports: T = P = 1)
                mean = mean + aux * total / y.numel()
        self._stale = True
        return mean.detach().double() * y.numel() if reports else torch.zeros((), dtype=torch.float64)

    def reduce_and_step(self) -> Tensor | None:
        """Average the gradients over the data-parallel ranks, clip by the whole model's norm, step."""
        if self.zero is not None:
            return self.zero.step(self.clip, norm_weight=self.norm_weight, norm_group=None)
        if self.buckets is not None:
            self.buckets.finish()
        norm = self._clip() if self.clip else None
        self.opt.step()
        return norm

    @torch.no_grad()
    def _clip(self) -> Tensor:
        """clip_grad_norm_'s rule, g *= min(1, max_norm / (total + 1e-6)), with the total over the whole model."""
        squares = sum(
            self.norm_weight[id(p)] * p.grad.double().square().sum() for p in self.params if p.grad is not None
        )
        # every rank of the gradient group (D x C) holds them all
        squares = torch.as_tensor(squares, dtype=torch.float64) / self.R
        dist.all_reduce(squares)
        total = squares.sqrt()
        coef = (cast(float, self.clip) / (total + 1e-6)).clamp(max=1.0)  # called when the run clips
        for p in self.params:
            if p.grad is not None:
                p.grad.mul_(coef.to(p.grad.dtype))
        return total

    # -- the whole model -------------------------------------------------------------------------------------------
    @torch.no_grad()
    def gathered(self, grad: bool = False) -> dict[str, Tensor]:
        """Every parameter of the GPT (or, with ``grad``, its gradient now), whole, under the GPT's names, on every
        rank (collective over the model's copy)."""
        if self.T > 1:
            mine = self.part.full_state_dict(grad=grad)  # this stage's, gathered over its tensor-parallel ranks
        else:
            mine = {n: (p.grad if grad else p).detach().clone() for n, p in self.part.named_parameters() if n != "head"}
        for name in self.experts:  # each rank's experts, in rank order: the whole tensor
            shards = [torch.empty_like(mine[name]) for _ in range(self.E)]
            dist.all_gather(shards, mine[name].contiguous(), group=self.dp_group)
            mine[name] = torch.cat(shards)
        if self.P == 1:
            return mine
        every: list[Any] = [None] * self.P  # each stage's dict, once gathered
        dist.all_gather_object(every, mine, group=self.inner_group)
        return {n: t for part in every for n, t in part.items()}

    @torch.no_grad()
    def _sync_model(self) -> None:
        if self._stale and self.part is not self.model:
            whole = self.gathered()
            for name, p in self.model.named_parameters():
                if p.data_ptr() != whole[name].data_ptr():
                    p.copy_(whole[name])
        self._stale = False

    def eval_batch(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        self._sync_model()
        logits = self.model(x)
        return self.eval_crit(*rows(logits, y)), logits

    def named_parameters(self) -> list[tuple[str, Tensor]]:
        """The whole GPT's parameters as last gathered (at the last evaluation: no collective here)."""
        return list(self.model.named_parameters())

    def write_timeline(self, out, is_main: bool, png: bool) -> tuple[list, list]:
        """P > 1: the last step's timeline into ``out`` (verify/pipeline_report.py; ``png``: its picture too), by
        rank 0 (collective: every rank calls it); -> (the files written, the lines to print), empty elsewhere and
        with P = 1."""
        if self.P == 1:
            return [], []
        from .verify.pipeline_report import gather_traces, write_timeline

        traces = gather_traces(getattr(self, "trace", []), cast(dist.ProcessGroup, self.inner_group))  # P > 1: set
        if not is_main:
            return [], []
        c = self.split
        return write_timeline(
            out, c.pipeline_schedule, c.micro_batches, traces, png=png, virtual_stages=c.virtual_stages
        )

    def describe(self) -> str:
        """The split, for the run's first line."""
        c = self.split
        tensor = f"tensor-parallel {self.T}{' with sequence parallelism' * c.sequence_parallel}"
        context = f"context-parallel {self.C} (ring attention, zigzag chunks)"
        if self.E > 1:
            return f"expert-parallel {self.E} (all-to-all dispatch and combine) x data-parallel {self.D}"
        chunks = f", {c.stages_a_rank} stages a rank" * (c.stages_a_rank > 1)
        pipe = f"pipeline-parallel {self.P} ({c.pipeline_schedule}{chunks}, {c.micro_batches} micro-batches)"
        split = (
            " x ".join([tensor] * (self.T > 1) + [context] * (self.C > 1) + [pipe] * (self.P > 1))
            or "the model whole on each rank"
        )
        return f"{split} x data-parallel {self.D}{f', ZeRO-{c.zero}' if c.zero else ''}"


def _split(gpt, split: ParallelConfig, lay, R: int):
    """This rank's part of the GPT: a tensor-parallel stage, a tensor-parallel GPT, a stage, its experts, or the
    GPT whole.  ``R``: the ranks the gradients are averaged over."""
    T, P, sp = split.tensor_parallel, split.pipeline_parallel, split.sequence_parallel
    if split.expert_parallel > 1:
        return expert_parallel(gpt, lay.dp_group, lay.dp_rank, split.expert_parallel, grad_scale=float(R))
    if split.context_parallel > 1:  # the GPT (or its tensor-parallel part) on this rank's zigzag positions
        from .cp_gpt import context_parallel
        from .tp_gpt import TensorParallelGPT

        base = TensorParallelGPT(gpt, lay.tp_group, sequence_parallel=sp) if T > 1 else gpt
        return context_parallel(base, lay.cp_group, gpt.block_size, lay.cp_rank, lay.cp)
    if P > 1:
        from .pipeline_chunks import StageChunks
        from .pipeline_gpt import GPTStage
        from .tp_pipeline import TensorParallelStage

        def stage(s: int, stages: int):  # stage s of the pipeline's stages: tensor-parallel over T > 1 ranks
            return (
                TensorParallelStage(gpt, s, stages, lay.tp_group, sequence_parallel=sp)
                if T > 1
                else GPTStage(gpt, s, stages)
            )

        if split.stages_a_rank == 1:
            return stage(lay.pp_rank, P)
        return StageChunks(stage, split.pipeline_schedule, lay.pp_rank, P, split.virtual_stages)
    if T > 1:
        from .tp_gpt import TensorParallelGPT

        return TensorParallelGPT(gpt, lay.tp_group, sequence_parallel=sp)
    return gpt


def build_parallel_impls(
    models: dict, split: ParallelConfig, optim: OptimConfig, info: DistInfo, *, batch_size: int, total_steps: int
) -> dict:
    """{"manual": ParallelImpl} from the task's one-process GPT (built under the seed: the same on every rank), with
    the learning-rate schedule over ``total_steps`` on the optimizer that steps (ZeRO's on the shard)."""
    from ..schedule import make_scheduler

    impl = ParallelImpl(models["manual"], split, optim, batch_size, info)
    impl.sched = make_scheduler(impl.opt, optim, total_steps) if total_steps else None
    return {"manual": impl}

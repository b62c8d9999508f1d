"""--check-parity: the run's first step sharded and in one process (rank 0), compared tensor by tensor, with the
answer to "round-off or bug".

Rank 0 builds the one-process GPT again under the run's seed and takes the first step on the whole first batch:
the reference.  It takes the step a second time on a second copy with the batch cut into pieces of rows whose
gradients are summed in reverse order: the same mathematics, summed in another order, so its distance from the
reference measures what reordering a float sum does to each tensor.  Every rank takes the sharded step, and the
shards are gathered to rank 0:

    outputs    each block's output and the logits (tensor parallelism: gathered; data parallelism: rank 0's rows;
               a pipeline: the rows forwarded once more through a copy of each stage, without micro-batches, each
               stage's tensor-parallel parts gathered)
    loss       the first batch's mean loss
    gradients  before clipping, averaged over the data-parallel ranks, in the order backward computes them
    weights    after the optimizer's step (ZeRO's reduce-scatter, shard step and all-gather included)

For each tensor: the largest |sharded - reference|, the reordered sum's largest |reordered - reference|, and the
reference's largest |value|.  A difference within ``ROUNDING_ULPS`` ulps of the tensor's largest value is float
rounding; past that, a difference no more than ``REORDER_FACTOR`` times the reordered sum's is round-off that
reordering alone produces (a different summation order, as sharding's), and anything more is a bug: no order of
the same sums gives it.  The report names the first tensor past rounding; the exit status is 1 on a bug.

Expert parallelism (--expert-parallel E): the reference is the one-process mixture of experts, its loss including
the weighted load-balancing term; each expert's gradient and weight is gathered from the one rank that holds it
(``ParallelImpl.gathered``), not averaged.  Its capacity and load-balancing term are the whole batch's, so the
batch is not cut: there is no reordered sum, and any difference past rounding is a bug.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from losses import CrossEntropyLoss
from optimizers import clip_grad_norm_, get_optimizer

from ...config.optim import OptimConfig
from ...config.parallel import ParallelConfig
from ...config.run import RunConfig
from ...errors import EXIT_FAILED, EXIT_OK
from ...impls.optim_setup import aux_loss, optimizer_kwargs, param_groups, rows
from ...schedule import make_scheduler
from ..distributed import DistInfo, shard_bounds

ROUNDING_ULPS = 1e3  # sums of up to ~1e6 terms in another order stay within this many ulps of their largest value
REORDER_FACTOR = 16.0  # a sharded sum's order differs from the reordered reference's: allow this much more


def _record_outputs(blocks: list) -> tuple[list, Callable]:
    """Each block's output, appended as it runs; -> (the list, a function that removes the recording)."""
    seen: list[Tensor] = []
    for block in blocks:

        def forward(x, _f=block.forward):
            out = _f(x)
            seen.append(out.detach().clone())
            return out

        block.forward = forward  # an instance attribute: __call__ finds it before the class's
    return seen, lambda: [vars(b).pop("forward", None) for b in blocks]


def _reference(optim: OptimConfig, dtype: torch.dtype, task, device, x: Tensor, y: Tensor, pieces: int) -> dict:
    """The first step in one process: outputs, loss, gradients before clipping, weights after; with ``pieces`` > 1
    the gradient is summed over that many row pieces, last piece first."""
    model = task.build_models(device, dtype, DistInfo())["manual"]
    named = list(model.named_parameters())
    opt = get_optimizer(optim.optimizer, param_groups(named, optim), **optimizer_kwargs(optim))
    make_scheduler(opt, optim, task.total_steps)  # the first step's learning rate, as the run's
    crit, total = CrossEntropyLoss(reduction="sum"), y.numel()
    out: dict = {}
    bounds = [shard_bounds(x.shape[0], DistInfo(i, pieces)) for i in range(pieces)]
    loss: float | Tensor = 0.0  # a tensor once a piece is added
    for lo, hi in reversed(bounds):
        if lo == hi:
            continue
        seen, stop = _record_outputs(model.h)
        logits = model(x[lo:hi])
        stop()
        loss = loss + crit(*rows(logits, y[lo:hi])) / total
        aux = aux_loss(model)  # a mixture of experts' load-balancing term, weighted: its backward adds its gradient
        if aux is not None:
            loss = loss + aux
        model.backward(crit.backward(1.0 / total).view_as(logits))
        if pieces == 1:
            out.update((f"output transformer.h.{i}", t) for i, t in enumerate(seen))
            out["output logits"] = logits.detach()
    out["loss"] = torch.as_tensor(loss).detach().reshape(1)
    for name, p in reversed(named):
        out[f"grad {name}"] = p.grad.detach().clone()
    if optim.clip_grad:
        clip_grad_norm_(model.parameters(), optim.clip_grad)
    opt.step()
    out.update((f"weight {name}", p.detach().clone()) for name, p in named)
    return out


def _sharded(impl, x: Tensor, y: Tensor) -> dict:
    """The first step as the run takes it, every rank; -> on rank 0 the gathered tensors (elsewhere partial)."""
    lo, hi = shard_bounds(x.shape[0], impl.data_info)
    out = _pipeline_outputs(impl, x[lo:hi]) if impl.P > 1 else {}
    blocks = impl.part.h if impl.P == 1 else []
    seen, stop = _record_outputs(blocks)
    try:
        loss = impl.forward_backward(x[lo:hi], y[lo:hi], y.numel())
    finally:
        stop()
    sp = impl.T > 1 and impl.split.sequence_parallel
    for i, t in enumerate(seen):  # under sequence parallelism each rank holds its positions: gathered along T
        out[f"output transformer.h.{i}"] = _whole_windows(impl, _gather(t, 1, impl.inner_group) if sp else t)
    if impl.logits is not None:
        logits = impl.logits.detach()
        if impl.T > 1:  # each rank holds its vocabulary columns (padded): gathered, the padding cut
            logits = _gather(logits, -1, impl.inner_group)[..., : impl.model.vocab_size]
        out["output logits"] = _whole_windows(impl, logits)
    dist.all_reduce(loss)  # one rank of each copy reports its rows' summed loss
    out["loss"] = (loss / y.numel()).reshape(1)
    kept = [p.grad for p in impl.params]
    # the gradient averaged over the ranks that hold the same weights (R = D x C: the context-parallel ranks hold
    # their positions' share too), for the report only; an expert's gradient is whole on its one rank
    for name, p in impl.part.named_parameters():
        p.grad = p.grad.clone()
        if impl.R > 1 and name not in impl.experts:
            dist.all_reduce(p.grad, group=impl.grad_group)
            p.grad.div_(impl.R)
    grads = impl.gathered(grad=True)
    for p, g in zip(impl.params, kept, strict=True):
        p.grad = g
    out.update((f"grad {name}", grads[name]) for name, _ in reversed(list(impl.model.named_parameters())))
    impl.reduce_and_step()
    impl._stale = True
    weights = impl.gathered()
    out.update((f"weight {name}", weights[name]) for name, _ in impl.model.named_parameters())
    return out


@torch.no_grad()
def _pipeline_outputs(impl, x: Tensor) -> dict:
    """A pipeline's block outputs and logits: the rows ``x`` forwarded once through the stages in order (a copy of
    each, so the step's own caches are untouched), each stage handing its activation to the next, across ranks or,
    where the next stage is on the same rank (ZB-V's bottom), in memory; gathered on every rank (a tensor-parallel
    stage's logits over its vocabulary columns, its sequence-parallel outputs along T)."""
    from ..pipeline_gpt import replicate
    from ..pipeline_schedules import rank_of

    group, r, schedule = impl.inner_group, impl.inner_rank, impl.split.pipeline_schedule
    where = lambda stage: rank_of(schedule, stage, impl.P)  # noqa: E731
    tp = impl.layout.tp_group
    mine: dict[str, Tensor] = {}
    sends: list[Any] = []
    act = x  # each stage's output, read by the next where it is this rank's
    for chunk in sorted(getattr(impl.part, "chunks", [impl.part]), key=lambda c: c.stage):
        stage = replicate(chunk)
        seen, stop = _record_outputs(stage.h)
        try:
            if stage.first or where(stage.stage - 1) == r:
                inp = act  # the rows, or the previous stage's output: this rank's, run just before
            else:
                inp = torch.empty(stage.activation_shape(*x.shape), dtype=impl.params[0].dtype)
                dist.recv(inp, src=dist.get_global_rank(group, where(stage.stage - 1)), group=group, tag=stage.stage)
            act = stage.forward(inp)
            if not stage.last and where(stage.stage + 1) != r:
                dst = dist.get_global_rank(group, where(stage.stage + 1))
                sends.append(dist.isend(act.contiguous(), dst=dst, group=group, tag=stage.stage + 1))
        finally:
            stop()
        if impl.T > 1 and impl.split.sequence_parallel:
            seen = [_gather(t, 1, tp) for t in seen]
        mine.update({f"output transformer.h.{stage.offset + i}": t for i, t in enumerate(seen)})
        if stage.last:
            mine["output logits"] = _gather(act, -1, tp)[..., : impl.model.vocab_size] if impl.T > 1 else act
    for work in sends:
        work.wait()
    every: list[Any] = [None] * impl.P  # each rank's outputs, once gathered
    dist.all_gather_object(every, mine, group=group)
    return {k: v for part in every for k, v in part.items()}  # compare() reads them in the reference's order


def _whole_windows(impl, t: Tensor) -> Tensor:
    """Under context parallelism each rank holds its zigzag positions: the C ranks' gathered, in the window's order."""
    if impl.C == 1:
        return t
    from ..cp_gpt import unzigzag

    parts = [torch.empty_like(t) for _ in range(impl.C)]
    dist.all_gather(parts, t.contiguous(), group=impl.layout.cp_group)
    return unzigzag(parts, dim=1)


def _gather(t: Tensor, dim: int, group) -> Tensor:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def compare(sharded: dict, reference: dict, reordered: dict, eps: float) -> list[dict]:
    """One row per tensor of the reference that the sharded step has: the differences and the verdict."""
    out = []
    for name, ref in reference.items():
        if name not in sharded:
            continue
        got, re = sharded[name].double(), reordered.get(name, ref).double()
        ref = ref.double()
        scale = ref.abs().max().item() if ref.numel() else 0.0
        diff = (got - ref).abs().max().item()
        reorder = (re - ref).abs().max().item()
        rounding = ROUNDING_ULPS * eps * scale
        verdict = "rounding" if diff <= rounding else "round-off" if diff <= REORDER_FACTOR * reorder else "bug"
        out.append({"tensor": name, "diff": diff, "reordered": reorder, "scale": scale, "verdict": verdict})
    return out


def check_parity(impl, task, optim: OptimConfig, run: RunConfig, device, info: DistInfo, say: Callable) -> int:
    """Take the run's first step sharded (every rank) and in one process (rank 0); print the comparison on rank 0;
    -> EXIT_OK when every tensor is rounding or round-off, EXIT_FAILED when one is a bug (on every rank)."""
    from ...tasks.corpus import TextData

    gen = torch.Generator().manual_seed((run.seed + 1) % 2**64)  # the trainer's batch stream
    x, y = TextData.windows_at(task.text.train, task.round_order(1, gen)[0], task.model.block_size)
    sharded = _sharded(impl, x, y)
    bug = torch.zeros((), dtype=torch.int64)
    if info.is_main:
        # a mixture of experts' capacity and load-balancing term are the whole batch's: it is not cut, and its
        # reordered sum is the reference (past rounding is a bug)
        pieces = 1 if task.model.n_experts else max(2, impl.D * impl.split.micro_batches)
        mine = shard_bounds(x.shape[0], DistInfo(0, impl.D))[1]  # rank 0's rows: the outputs it recorded
        whole = _reference(optim, run.torch_dtype, task, device, x, y, 1)
        cut = _reference(optim, run.torch_dtype, task, device, x, y, min(pieces, x.shape[0])) if pieces > 1 else whole
        refs = [{k: v[:mine] if k.startswith("output") else v for k, v in ref.items()} for ref in (whole, cut)]
        rows_ = compare(sharded, refs[0], refs[1], torch.finfo(run.torch_dtype).eps)
        for line in report(rows_, impl.split, run.dtype):
            say(line)
        bug += any(r["verdict"] == "bug" for r in rows_)
    dist.broadcast(bug, 0)
    return EXIT_FAILED if bug.item() else EXIT_OK


def report(rows_: list[dict], split: ParallelConfig, dtype: str) -> list[str]:
    """The table, then the verdict line naming the first tensor past rounding."""
    settings = (
        f"--tensor-parallel {split.tensor_parallel}{' --sequence-parallel' * split.sequence_parallel} "
        + f"--context-parallel {split.context_parallel} " * (split.context_parallel > 1)
        + f"--pipeline-parallel {split.pipeline_parallel} --zero {split.zero}"
        + f" --expert-parallel {split.expert_parallel}" * (split.expert_parallel > 1)
    )
    lines = [
        f"parity of the first step, {settings} against one process ({dtype}): largest |difference| per "
        f"tensor; 'reordered': a one-process sum in another order",
        f"{'tensor':<48}{'|diff|':>10}{'reordered':>11}{'max|ref|':>10}  verdict",
    ]
    lines += [
        f"{r['tensor']:<48}{r['diff']:>10.1e}{r['reordered']:>11.1e}{r['scale']:>10.1e}  {r['verdict']}" for r in rows_
    ]
    first = next((r for r in rows_ if r["verdict"] != "rounding"), None)
    if first is None:
        lines.append(f"parity: all {len(rows_)} tensors within {dtype} rounding of one process")
    elif all(r["verdict"] != "bug" for r in rows_):
        lines.append(
            f"parity: round-off. The first tensor past {dtype} rounding is {first['tensor']} "
            f"(|diff| {first['diff']:.1e}), and a reordered one-process sum differs as much "
            f"({first['reordered']:.1e}); no tensor differs more than reordering explains"
        )
    else:
        bug = next(r for r in rows_ if r["verdict"] == "bug")
        lines.append(
            f"parity: BUG. The first tensor past {dtype} rounding is {first['tensor']} (|diff| "
            f"{first['diff']:.1e}, max|ref| {first['scale']:.1e}); the first no reordered sum explains is "
            f"{bug['tensor']} (|diff| {bug['diff']:.1e} against {bug['reordered']:.1e} from reordering)"
        )
    return lines

"""A model-parallel train.py run stopped half-way and resumed from its checkpoint equals the run done in one go, bit
for bit in float64 (ZeRO, tensor, pipeline -- ZB-H1, interleaved 1F1B, ZB-V --, tensor x pipeline on 4 processes,
and expert parallelism of a mixture-of-experts GPT): every metrics.jsonl record (step losses, evaluations),
summary.json's results, the whole model in checkpoint.pt, and each rank's own parameters and optimizer state
(ZeRO-1's and ZeRO-2's shards, the tensor-parallel shards, the pipeline stages, the experts).  The resumed run is
given only --resume and the new length: the split comes from the checkpoint."""

import json
from pathlib import Path

import pytest
import torch

import training
from tests.spawn_ranks import spawn_ranks
from training.parallel.distributed import DistInfo

pytestmark = pytest.mark.slow  # each case runs three 2-process trainings

TINY = dict(
    model="gpt",
    impl="manual",
    dtype="float64",
    n_layer=2,
    n_head=2,
    n_embd=16,
    block_size=8,
    batch_size=4,
    eval_interval=2,
    eval_iters=1,
    log_interval=1,
    lr=0.05,
    clip_grad=0.05,
    plots=False,
    quiet=True,
    threads=1,
    dist_timeout=60,
)
LOCAL = dict(plots=False, quiet=True, threads=1, dist_timeout=60)


def _train(rank, world, init_method, kw):
    return training.run(
        training.TrainConfig(**kw), say=lambda *a: None, info=DistInfo(rank, world, rank), init_method=init_method
    )


def _spawn(kw: dict, world: int = 2) -> None:
    results = spawn_ranks(_train, world, kw, join=False)
    assert list(results.values()) == [0] * world


def _records(out: Path) -> list[dict]:
    """metrics.jsonl without the timings."""
    return [
        {k: v for k, v in json.loads(line).items() if k not in ("seconds", "compile_seconds")}
        for line in (out / "metrics.jsonl").read_text().splitlines()
    ]


def _tensors(tree, prefix=""):
    """Every tensor in a nested checkpoint entry, by its path."""
    if isinstance(tree, torch.Tensor):
        yield prefix, tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            yield from _tensors(v, f"{prefix}.{k}")
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _tensors(v, f"{prefix}[{i}]")


@pytest.mark.parametrize(
    "split",
    [
        dict(zero=1),
        dict(zero=2),
        dict(tensor_parallel=2),
        dict(
            pipeline_parallel=2,
            micro_batches=2,
            pipeline_schedule="zb-h1",
            given=frozenset({"micro_batches", "pipeline_schedule"}),
        ),
        dict(
            tensor_parallel=2,
            pipeline_parallel=2,
            micro_batches=2,
            pipeline_schedule="1f1b",
            given=frozenset({"micro_batches", "pipeline_schedule"}),
        ),
        dict(context_parallel=2, tensor_parallel=2),
        dict(
            pipeline_parallel=2,
            micro_batches=2,
            pipeline_schedule="interleaved-1f1b",
            virtual_stages=2,
            n_layer=4,
            given=frozenset({"micro_batches", "pipeline_schedule", "virtual_stages"}),
        ),
        dict(
            pipeline_parallel=2,
            micro_batches=2,
            pipeline_schedule="zb-v",
            n_layer=4,
            given=frozenset({"micro_batches", "pipeline_schedule"}),
        ),
        dict(n_experts=4, top_k=2, expert_parallel=2, given=frozenset({"n_experts", "top_k"})),
    ],
    ids=["zero1", "zero2", "tp2", "pp2-zb-h1", "tp2-pp2-1f1b", "cp2-tp2", "pp2-interleaved-v2", "pp2-zb-v", "ep2-moe"],
)
def test_a_run_stopped_half_way_and_resumed_equals_the_run_done_in_one_go(tmp_path, split):
    whole, half = tmp_path / "whole", tmp_path / "half"
    copy = [split.get(k, 1) for k in ("tensor_parallel", "pipeline_parallel", "context_parallel")]
    world = max(2, copy[0] * copy[1] * copy[2])  # ZeRO: 2 data ranks
    _spawn({**TINY, **split, "max_iters": 4, "out": whole}, world)
    _spawn({**TINY, **split, "max_iters": 2, "out": half}, world)
    stopped = torch.load(half / "checkpoint.pt", weights_only=True)
    assert stopped["epoch"] == 1 and len(stopped["model_parallel"]["params"]) == world
    _spawn(
        {**LOCAL, "model": "gpt", "resume": half / "checkpoint.pt", "max_iters": 4, "given": frozenset({"max_iters"})},
        world,
    )

    assert _records(half) == _records(whole)
    assert [r["global_step"] for r in _records(half) if r["type"] == "step"] == [1, 2, 3, 4]
    a, b = (json.loads((d / "summary.json").read_text())["results"]["manual"] for d in (whole, half))
    assert (a["train_loss"], a["val_loss"], a["iters"]) == (b["train_loss"], b["val_loss"], b["iters"]) and a[
        "iters"
    ] == 4
    a, b = (torch.load(d / "checkpoint.pt", weights_only=True) for d in (whole, half))
    assert a["epoch"] == b["epoch"] == 2
    assert a["model_parallel"]["settings"] == b["model_parallel"]["settings"]
    assert a["model_parallel"]["settings"]["world_size"] == world
    for part in ("models", "optimizers", "schedulers"):
        assert a[part].keys() == b[part].keys()
    for key in ("models", "optimizers", "model_parallel"):
        mine, theirs = dict(_tensors(a[key])), dict(_tensors(b[key]))
        assert mine.keys() == theirs.keys() and mine
        differ = [k for k in mine if not torch.equal(mine[k], theirs[k])]
        assert not differ, (key, differ[:5])
    for r in range(world):  # each rank's optimizer state holds moments of its own, and they moved
        assert any(k.endswith("exp_avg") for k, _ in _tensors(a["optimizers"]["manual"][r]))
    assert not torch.equal(
        *(dict(_tensors(c["models"]))[".manual.transformer.h.0.attn.c_attn.weight"] for c in (stopped, a))
    )

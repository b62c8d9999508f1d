"""Bucketed, overlapped gradient all-reduce on 2 gloo processes (file:// rendezvous in a temp folder): the same
gradients as one process, a frozen parameter's (``requires_grad=False``) left None as under torch's DDP."""

import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from layers import Linear, ReLU, Sequential, Tanh
from losses import CrossEntropyLoss
from tests.conftest import rel
from training.parallel.allreduce import GradBuckets
from training.parallel.distributed import DistInfo, init_from_env, shard, shutdown

WORLD = 2


def make_model():
    torch.manual_seed(0)
    return Sequential(
        Linear(12, 16, dtype=torch.float64),
        ReLU(),
        Sequential(Linear(16, 16, dtype=torch.float64), Tanh()),
        Linear(16, 5, dtype=torch.float64),
    )


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(9, 12, generator=g, dtype=torch.float64), torch.randint(0, 5, (9,), generator=g)


def local_grads(model, x, y, n_global, buckets=None):
    crit = CrossEntropyLoss(reduction="sum")
    model.zero_grad()
    crit(model(x), y)
    model.backward(crit.backward(1.0 / n_global))  # each rank's share of the global mean's gradient
    if buckets is not None:
        buckets.finish()
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def frozen_model():
    """make_model with its first weight frozen (torch's idiom): its .grad stays None on every rank, as under DDP."""
    model = make_model()
    model[0].weight.requires_grad_(False)
    return model


def worker(rank, tmp, results):
    try:
        init_from_env("cpu", timeout_s=120, init_method=f"file://{tmp}/rendezvous", info=DistInfo(rank, WORLD, rank))
        x, y = data()
        idx = shard(torch.arange(9), DistInfo(rank, WORLD, rank))  # 5 and 4 samples: uneven on purpose
        plain_model, bucket_model = make_model(), make_model()
        plain = local_grads(plain_model, x[idx], y[idx], 9)
        for g in plain:  # the textbook version: one all_reduce per tensor, after the backward
            dist.all_reduce(g)
        buckets = GradBuckets(bucket_model.parameters(), scale=1.0, bucket_cap_mb=0.001).attach(bucket_model)
        bucketed = local_grads(bucket_model, x[idx], y[idx], 9, buckets)
        again = local_grads(bucket_model, x[idx], y[idx], 9, buckets)  # a second step reuses the buckets
        frozen = frozen_model()
        frozen_buckets = GradBuckets(frozen.parameters(), scale=1.0, bucket_cap_mb=0.001).attach(frozen)
        frozen_grads = local_grads(frozen, x[idx], y[idx], 9, frozen_buckets)
        results[rank] = {
            "plain": plain,
            "bucketed": bucketed,
            "again": again,
            "n_buckets": len(buckets),
            "frozen": frozen_grads,
        }
    except Exception:
        results[rank] = traceback.format_exc()
    finally:
        shutdown()


def test_bucketed_overlapped_allreduce_equals_per_tensor_and_single_process(tmp_path):
    with mp.Manager() as manager:
        results = manager.dict()
        mp.start_processes(worker, args=(str(tmp_path), results), nprocs=WORLD, start_method="spawn", join=True)
        results = dict(results)
    for r in range(WORLD):
        assert not isinstance(results[r], str), results[r]
    x, y = data()
    single = local_grads(make_model(), x, y, 9)
    assert results[0]["n_buckets"] > 2  # a tiny cap: several buckets, several overlapping all-reduces
    for r in range(WORLD):
        for a, b, c, s in zip(results[r]["plain"], results[r]["bucketed"], results[r]["again"], single, strict=True):
            assert torch.equal(a, b) and torch.equal(b, c)
            assert rel(b, s) < 1e-14
    single_frozen = local_grads(frozen_model(), x, y, 9)
    assert single_frozen[0] is None
    for r in range(WORLD):
        assert results[r]["frozen"][0] is None
        for b, s in zip(results[r]["frozen"][1:], single_frozen[1:], strict=True):
            assert rel(b, s) < 1e-14


def test_shard_covers_the_batch_once():
    idx = torch.arange(11)
    parts = [shard(idx, DistInfo(r, 3, r)) for r in range(3)]
    assert torch.equal(torch.cat(parts), idx) and [len(p) for p in parts] == [3, 4, 4]


def test_buckets_refuse_duplicates_and_nothing():
    w = torch.zeros(3)
    with pytest.raises(ValueError, match="appears twice"):
        GradBuckets([w, w], scale=1.0)
    with pytest.raises(ValueError, match="no parameters"):
        GradBuckets([], scale=1.0)

"""SyncBatchNorm on 2 gloo processes (file:// rendezvous in a temp folder) equals one BatchNorm on the whole
batch: outputs, dx, parameter gradients (summed over ranks, as the data-parallel all-reduce does), running
statistics, eval outputs; uneven shards too.  Outside a process group it is plain BatchNorm."""

import datetime
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from gradcheck import nontrivial
from layers import BatchNorm1d, BatchNorm2d, Linear, ReLU, Sequential, SyncBatchNorm, convert_sync_batchnorm, from_torch

f64 = torch.float64
WORLD = 2
# (name, batch-norm class, its options, global input shape, rows of the global batch on rank 0 / rank 1)
CASES = [
    ("bn2d_even", BatchNorm2d, {}, (6, 3, 4, 5), (3, 3)),
    ("bn2d_uneven_momentum_none", BatchNorm2d, {"momentum": None}, (7, 3, 2, 3), (5, 2)),
    ("bn2d_one_sample_here", BatchNorm2d, {"eps": 1e-3}, (5, 2, 3, 3), (1, 4)),
    ("bn1d_2d_uneven", BatchNorm1d, {}, (9, 4), (2, 7)),
    ("bn1d_3d_affine_false", BatchNorm1d, {"affine": False}, (5, 3, 6), (3, 2)),
    ("bn1d_untracked", BatchNorm1d, {"track_running_stats": False}, (6, 4), (4, 2)),
    ("bn2d_empty_shard", BatchNorm2d, {}, (4, 2, 3, 3), (0, 4)),
]
STEPS = 3  # training steps, then one eval forward


def batches(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(shape, generator=g, dtype=f64) * (1 + s) + s, torch.randn(shape, generator=g, dtype=f64))
        for s in range(STEPS + 1)
    ]


def make_bn(cls, opts, c):
    torch.manual_seed(11)
    return nontrivial(cls(c, dtype=f64, **opts))


def run_bn(layer, data, rows, rank, reduce_grads):
    """STEPS training steps and an eval forward on this rank's rows; the records of each step."""
    lo = sum(rows[:rank])
    hi = lo + rows[rank]
    records = []
    for step, (x, dout) in enumerate(data):
        layer.train(step < STEPS)
        layer.zero_grad()
        out = layer(x[lo:hi])
        rec = {"out": out}
        if step < STEPS:
            rec["dx"] = layer.backward(dout[lo:hi])
            grads = [p.grad.clone() for p in layer.parameters()]
            if reduce_grads:
                for g in grads:  # what the data-parallel gradient all-reduce does with them
                    dist.all_reduce(g)
            rec["grads"] = grads
        rec["state"] = {k: v.clone() for k, v in layer.state_dict().items()}
        records.append(rec)
    return records


def make_mlp():
    torch.manual_seed(12)
    model = Sequential(
        Linear(5, 6, dtype=f64),
        BatchNorm1d(6, dtype=f64),
        ReLU(),
        Sequential(Linear(6, 4, dtype=f64), BatchNorm1d(4, momentum=None, dtype=f64)),
    )
    for layer in (model[1], model[3][1]):
        nontrivial(layer)
    return model


def mlp_steps(model, x, dout, reduce_grads):
    records = []
    for step in range(2):
        model.zero_grad()
        out = model(x * (step + 1))
        dx = model.backward(dout, need_input_grad=True)
        grads = [p.grad.clone() for p in model.parameters()]
        if reduce_grads:
            for g in grads:
                dist.all_reduce(g)
        records.append(
            {"out": out, "dx": dx, "grads": grads, "state": {k: v.clone() for k, v in model.state_dict().items()}}
        )
    return records


def mlp_data():
    g = torch.Generator().manual_seed(13)
    return torch.randn(9, 5, generator=g, dtype=f64) + 2, torch.randn(9, 4, generator=g, dtype=f64)


def worker(rank, tmp, results):
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"file://{tmp}/rendezvous",
            rank=rank,
            world_size=WORLD,
            timeout=datetime.timedelta(seconds=60),
        )
        out = {}
        for name, cls, opts, shape, rows in CASES:
            layer = convert_sync_batchnorm(make_bn(cls, opts, shape[1]))
            assert isinstance(layer, SyncBatchNorm)
            out[name] = run_bn(layer, batches(shape, 1), rows, rank, reduce_grads=True)
        model = convert_sync_batchnorm(make_mlp())
        assert isinstance(model[1], SyncBatchNorm) and isinstance(model[3][1], SyncBatchNorm)
        x, dout = mlp_data()
        sl = slice(0, 4) if rank == 0 else slice(4, 9)
        out["mlp"] = mlp_steps(model, x[sl], dout[sl], reduce_grads=True)
        results[rank] = out
    except Exception:
        results[rank] = traceback.format_exc()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("syncbn")
    with mp.Manager() as manager:
        results = manager.dict()
        ctx = mp.start_processes(worker, args=(str(tmp), results), nprocs=WORLD, start_method="spawn", join=False)
        deadline = time.monotonic() + 120  # the collectives themselves time out after 60 s
        while not ctx.join(timeout=max(deadline - time.monotonic(), 0.1)):
            if time.monotonic() > deadline:
                for proc in ctx.processes:
                    proc.kill()
                pytest.fail("the 2-process SyncBatchNorm run did not finish within 120 s")
        results = dict(results)
    for r in range(WORLD):
        assert not isinstance(results[r], str), results[r]
    return results


def assert_close(a, b, what, tol=1e-12):
    if a.numel() == 0:
        assert b.numel() == 0, what
        return
    assert a.shape == b.shape, what
    err = (a - b).abs().max().item() / max(b.abs().max().item(), 1e-300)
    # The absolute floor is for gradients that are exactly zero in exact arithmetic and rounding noise
    # (~1e-15) in practice: the bias of a Linear right before a batch norm.
    assert err < tol or (a - b).abs().max().item() < 1e-13, f"{what}: relative error {err:.2e}"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_two_ranks_equal_one_batchnorm_on_the_whole_batch(two_ranks, case):
    name, cls, opts, shape, rows = case
    single = run_bn(make_bn(cls, opts, shape[1]), batches(shape, 1), (shape[0],), 0, reduce_grads=False)
    for step, ref in enumerate(single):
        ranks = [two_ranks[r][name][step] for r in range(WORLD)]
        training = step < STEPS
        if training or opts.get("track_running_stats", True):  # untracked eval: see the next test
            assert_close(torch.cat([r["out"] for r in ranks]), ref["out"], f"{name} step {step} out")
        if training:
            assert_close(torch.cat([r["dx"] for r in ranks]), ref["dx"], f"{name} step {step} dx")
            for r in ranks:
                for g, g_ref in zip(r["grads"], ref["grads"], strict=True):
                    assert_close(g, g_ref, f"{name} step {step} param grad")
        for r in ranks:
            assert list(r["state"]) == list(ref["state"])
            for k in ref["state"]:
                assert r["state"][k].dtype == ref["state"][k].dtype
                assert_close(r["state"][k].double(), ref["state"][k].double(), f"{name} step {step} {k}")


def test_untracked_eval_uses_each_ranks_own_batch_as_torch_does(two_ranks):
    """Eval mode never synchronises (torch's rule): without running statistics each rank normalises its shard."""
    name, cls, opts, shape, rows = CASES[5]
    x, _ = batches(shape, 1)[STEPS]
    for r in range(WORLD):
        lo = sum(rows[:r])
        layer = make_bn(cls, opts, shape[1]).eval()
        assert_close(two_ranks[r][name][STEPS]["out"], layer(x[lo : lo + rows[r]]), f"{name} rank {r} eval")


def test_converted_sequential_on_two_ranks_equals_one_process(two_ranks):
    x, dout = mlp_data()
    single = mlp_steps(make_mlp(), x, dout, reduce_grads=False)
    for step, ref in enumerate(single):
        ranks = [two_ranks[r]["mlp"][step] for r in range(WORLD)]
        assert_close(torch.cat([r["out"] for r in ranks]), ref["out"], f"mlp step {step} out")
        assert_close(torch.cat([r["dx"] for r in ranks]), ref["dx"], f"mlp step {step} dx")
        for r in ranks:
            for i, (g, g_ref) in enumerate(zip(r["grads"], ref["grads"], strict=True)):
                assert_close(g, g_ref, f"mlp step {step} grad {i}")
            for k in ref["state"]:
                assert_close(r["state"][k].double(), ref["state"][k].double(), f"mlp step {step} {k}")


def test_outside_a_process_group_it_is_batchnorm():
    assert not dist.is_initialized()
    torch.manual_seed(14)
    sync, plain = nontrivial(SyncBatchNorm(3, momentum=None, dtype=f64)), BatchNorm2d(3, momentum=None, dtype=f64)
    plain.load_state_dict(sync.state_dict())
    for _step in range(3):
        x, d = torch.randn(4, 3, 2, 2, dtype=f64), torch.randn(4, 3, 2, 2, dtype=f64)
        assert torch.equal(sync(x), plain(x)) and torch.equal(sync.backward(d), plain.backward(d))
    for k, v in plain.state_dict().items():
        assert torch.equal(sync.state_dict()[k], v), k
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        sync(torch.randn(1, 3, dtype=f64))
    with pytest.raises(ValueError, match=r"expected input of shape \(N, 3, \*\), got \(3,\)"):
        sync(torch.randn(3, dtype=f64))


def test_group_of_one_process_is_batchnorm(tmp_path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path}/rdv", rank=0, world_size=1, timeout=datetime.timedelta(seconds=30)
    )
    try:
        torch.manual_seed(15)
        sync = nontrivial(SyncBatchNorm(2, dtype=f64))
        plain = BatchNorm1d(2, dtype=f64)
        plain.load_state_dict(sync.state_dict())
        x, d = torch.randn(5, 2, 3, dtype=f64), torch.randn(5, 2, 3, dtype=f64)
        assert torch.equal(sync(x), plain(x)) and torch.equal(sync.backward(d), plain.backward(d))
        assert torch.equal(sync.running_var, plain.running_var)
    finally:
        dist.destroy_process_group()


def test_twins_differentiable_all_reduce_uses_no_deprecated_api(tmp_path):
    """The CPU twin's synchronised batch norm sums over ranks with its own autograd Function (torch's
    torch.distributed.nn.functional.all_reduce warned FutureWarning on every call); two ranks are checked against
    one process by tests/test_distributed_train.py's CNN run."""
    import warnings

    from training.parallel.verify.twin_syncbn import all_reduce_sum

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path}/rdv", rank=0, world_size=1, timeout=datetime.timedelta(seconds=30)
    )
    try:
        x = torch.randn(3, 4, dtype=f64, requires_grad=True)
        w = torch.randn(3, 4, dtype=f64)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            y = all_reduce_sum(x)
            (y * w).sum().backward()
        assert torch.equal(y, x) and torch.equal(x.grad, w)  # one rank: the sum is x, dL/dx is w
    finally:
        dist.destroy_process_group()


def test_convert_keeps_tensors_and_torch_conversion():
    model = make_mlp()
    bn = model[1]
    tensors = [bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.num_batches_tracked]
    keys = list(model.state_dict())
    model.eval()
    assert convert_sync_batchnorm(model) is model
    sync = model[1]
    assert isinstance(sync, SyncBatchNorm) and not sync.training and sync.momentum == bn.momentum
    assert all(
        a is b
        for a, b in zip(
            tensors,
            [sync.weight, sync.bias, sync.running_mean, sync.running_var, sync.num_batches_tracked],
            strict=True,
        )
    )
    assert list(model.state_dict()) == keys and isinstance(model[3][1], SyncBatchNorm)
    assert convert_sync_batchnorm(ReLU()).__class__ is ReLU
    theirs = nn.SyncBatchNorm(3, momentum=0.3, dtype=f64)
    with torch.no_grad():
        theirs.running_mean.fill_(0.5)
    ours = from_torch(theirs)
    assert (
        isinstance(ours, SyncBatchNorm) and ours.momentum == 0.3 and torch.equal(ours.running_mean, theirs.running_mean)
    )
    back = ours.to_torch()
    assert type(back) is nn.SyncBatchNorm and list(back.state_dict()) == list(theirs.state_dict())
    assert torch.equal(back.running_mean, theirs.running_mean)

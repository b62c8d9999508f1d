"""train.py data-parallel: 2 gloo processes (file:// rendezvous in a temp folder) equal one process.

The global batch is split between the ranks (unevenly, on purpose); the hand-written model's gradients are
all-reduced by hand in buckets, the engine's after its backward, the twin's by DistributedDataParallel.
"""

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

import training
from tests.conftest import rel
from training.parallel.distributed import DistInfo

WORLD = 2
ROOT = Path(__file__).resolve().parents[1]


def config(data_dir, out, **kw):
    base = dict(
        dataset="mnist",
        data_dir=data_dir,
        out=out,
        download=False,
        quiet=True,
        plots=False,
        dtype="float64",
        batch_size=33,
        epochs=2,
        optimizer="sgd",
        momentum=0.9,
        lr=0.05,
        dist_timeout=60,
    )
    if kw.get("model", "mlp") == "mlp":
        base.update(hidden=16, depth=2)
    return training.TrainConfig(**{**base, **kw})


def worker(rank, tmp, kw, results):
    try:
        kw = dict(kw)
        fail_rank = kw.pop("fail_rank", None)
        join_fail_rank = kw.pop("join_fail_rank", None)
        cfg = config(Path(tmp) / "data", Path(tmp) / "dist", **kw)
        if fail_rank == rank:
            cfg = cfg.replace(data_dir=Path(tmp) / "missing")  # this rank alone cannot find its data
        if join_fail_rank == rank:  # this rank reaches the rendezvous, then fails creating its process group

            def broken(*args, **kwargs):
                raise RuntimeError("the backend could not start")

            torch.distributed.init_process_group = broken
        results[rank] = training.run(cfg, info=DistInfo(rank, WORLD, rank), init_method=f"file://{tmp}/rendezvous")
    except BaseException as e:  # noqa: BLE001 -- reported to the test
        results[rank] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"


def spawn(tmp_path, **kw):
    with mp.Manager() as manager:
        results = manager.dict()
        mp.start_processes(worker, args=(str(tmp_path), kw, results), nprocs=WORLD, start_method="spawn", join=True)
        return dict(results)


def _max_rel(a: dict, b: dict) -> float:
    return max(rel(a[k], b[k]) for k in a if a[k].is_floating_point())


@pytest.mark.parametrize(
    "kw",
    [{"impl": "all"}, {"impl": "both", "model": "cnn", "epochs": 1, "augment": True}],
    ids=["mlp-all", "cnn-syncbn"],
)
def test_two_processes_equal_one(tiny, tmp_path, kw):
    os.rename(tiny, tmp_path / "data")
    results = spawn(tmp_path, **kw)
    assert results == {0: 0, 1: 0}, results
    assert training.run(config(tmp_path / "data", tmp_path / "one", **kw)) == 0
    one = torch.load(tmp_path / "one" / "checkpoint.pt", weights_only=True)
    two = torch.load(tmp_path / "dist" / "checkpoint.pt", weights_only=True)
    assert two["world_size"] == WORLD and two["epoch"] == one["epoch"]
    names = ("manual", "engine", "torch") if kw["impl"] == "all" else ("manual", "torch")
    for name in names:
        assert _max_rel(two["models"][name], one["models"][name]) < 1e-12, name
        assert _max_rel(two["models"][name], two["models"]["manual"]) < 1e-12, name  # --impl all agrees
    s1 = json.loads((tmp_path / "one" / "summary.json").read_text())
    s2 = json.loads((tmp_path / "dist" / "summary.json").read_text())
    for name, r in s1["results"].items():  # sharded, all-reduced evaluation gives the single-process numbers
        assert s2["results"][name]["test_accuracy"] == r["test_accuracy"]
        assert abs(s2["results"][name]["test_loss"] - r["test_loss"]) < 1e-12
        assert abs(s2["results"][name]["train_loss"] - r["train_loss"]) < 1e-12


def test_a_failing_rank_stops_the_other_with_its_name(tiny, tmp_path):
    os.rename(tiny, tmp_path / "data")
    start = time.monotonic()
    results = spawn(tmp_path, impl="manual", fail_rank=1, dist_timeout=300)
    assert time.monotonic() - start < 150  # told by its peer, not by waiting out the 300 s collective timeout
    assert results[1].startswith("UsageError: error: no usable mnist data"), results[1]
    assert results[0].startswith("PeerFailed: rank 0 stopped because rank 1: UsageError"), results[0]


def test_a_rank_failing_while_joining_is_named_by_the_other(tiny, tmp_path):
    """Rank 1 fails creating its process group (after the rendezvous): rank 0, still waiting for it to connect,
    stops within --dist-timeout naming it, instead of reporting its own failed connection."""
    os.rename(tiny, tmp_path / "data")
    results = spawn(tmp_path, impl="manual", join_fail_rank=1, dist_timeout=10)
    assert results[1].startswith(
        "RunFailed: rank 1 could not join the process group: RuntimeError: the backend could not start"
    ), results[1]
    assert results[0].startswith(
        "PeerFailed: rank 0 stopped because rank 1: RuntimeError: the backend could not start"
    ), results[0]


def test_torchrun_end_to_end(tiny, tmp_path):
    """The real command: torchrun --standalone --nproc-per-node 2 train.py -- ... on a tiny IDX dataset, monitored
    (``--`` keeps torchrun from taking --monitor for an abbreviation of its --monitor-interval)."""
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(WORLD),
        "train.py",
        "--",
        "--data-dir",
        str(tiny),
        "--out",
        str(out),
        "--epochs",
        "1",
        "--hidden",
        "16",
        "--depth",
        "1",
        "--batch-size",
        "32",
        "--no-download",
        "--no-plots",
        "--dist-timeout",
        "60",
        "--monitor",
        "--log-interval",
        "2",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == WORLD and set(summary["results"]) == {"manual", "torch"}
    assert r.stdout.count("test acc") == 1  # rank 0 alone prints
    for name in ("manual", "torch"):  # rank 0 monitors the all-reduced gradients
        records = [json.loads(line) for line in (out / f"monitor_{name}.jsonl").read_text().splitlines()]
        # 9 steps (270 samples, batch 32): every 2nd, the first and the last
        assert [r["step"] for r in records] == [1, 2, 4, 6, 8, 9], name


def test_a_one_process_checkpoint_resumes_on_two(tiny, tmp_path):
    """The global batch does not depend on the world size, so a run may continue on another number of processes."""
    os.rename(tiny, tmp_path / "data")
    data = tmp_path / "data"
    assert training.run(config(data, tmp_path / "one", epochs=2)) == 0
    assert training.run(config(data, tmp_path / "half", epochs=1)) == 0
    results = spawn(tmp_path, resume=tmp_path / "half" / "checkpoint.pt", epochs=2, given=frozenset({"epochs"}))
    assert results == {0: 0, 1: 0}, results
    one = torch.load(tmp_path / "one" / "checkpoint.pt", weights_only=True)
    two = torch.load(tmp_path / "dist" / "checkpoint.pt", weights_only=True)
    assert two["epoch"] == 2 and two["world_size"] == WORLD
    for name in ("manual", "torch"):
        assert _max_rel(two["models"][name], one["models"][name]) < 1e-12, name


def text_worker(rank, tmp, kw, results):
    try:
        cfg = training.TrainConfig(**kw, out=Path(tmp) / "dist")
        results[rank] = training.run(cfg, info=DistInfo(rank, WORLD, rank), init_method=f"file://{tmp}/rendezvous")
    except BaseException as e:  # noqa: BLE001 -- reported to the test
        results[rank] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"


@pytest.mark.parametrize("model", ["gpt", "gru"])
def test_a_language_model_on_two_processes_equals_one(tmp_path, model):
    """Each rank trains on its share of every batch's windows (5 windows: 2 and 3); the hand-written model's
    gradients are all-reduced by hand, the twin's by DistributedDataParallel; the result is one process's."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 8)
    size = dict(n_layer=1, n_head=2, n_embd=8) if model == "gpt" else dict(n_layer=1, hidden=8, n_embd=6)
    kw = dict(
        model=model,
        data_file=corpus,
        block_size=8,
        batch_size=5,
        max_iters=4,
        eval_interval=2,
        eval_iters=2,
        dtype="float64",
        quiet=True,
        plots=False,
        dist_timeout=60,
        **size,
    )
    with mp.Manager() as manager:
        results = manager.dict()
        mp.start_processes(
            text_worker, args=(str(tmp_path), kw, results), nprocs=WORLD, start_method="spawn", join=True
        )
        results = dict(results)
    assert results == {0: 0, 1: 0}, results
    assert training.run(training.TrainConfig(**kw, out=tmp_path / "one")) == 0
    one = torch.load(tmp_path / "one" / "checkpoint.pt", weights_only=True)
    two = torch.load(tmp_path / "dist" / "checkpoint.pt", weights_only=True)
    assert two["world_size"] == WORLD
    for name in ("manual", "torch"):
        assert _max_rel(two["models"][name], one["models"][name]) < 1e-12, name
    s1 = json.loads((tmp_path / "one" / "summary.json").read_text())
    s2 = json.loads((tmp_path / "dist" / "summary.json").read_text())
    for name, r in s1["results"].items():
        assert abs(s2["results"][name]["val_loss"] - r["val_loss"]) < 1e-12
        assert abs(s2["results"][name]["train_loss"] - r["train_loss"]) < 1e-12

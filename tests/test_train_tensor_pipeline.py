"""train.py's tensor x pipeline parallelism equals one process in float64: on 4 gloo processes, T=2 x P=2 (each
stage's blocks over two tensor ranks, the vocabulary-parallel table and loss on the first and last stage) under
1F1B and ZB-H1, with sequence parallelism under GPipe, and with two stages a rank (ZB-V with sequence parallelism,
interleaved 1F1B), each run's step losses and summary.json's results to 1e-9 relative and its final weights to
1e-9 of the largest (the gradient clipped every step, so the whole model's norm, each parameter counted once, is
checked too); so does T=2 x P=2 x D=2 with ZeRO-2 on 8 processes; --check-parity finds every tensor within
rounding; a pipelined run writes its timeline into its folder (text, and a PNG with --plots) and rank 0 prints it
with the measured bubble, once."""

import json
from pathlib import Path

import pytest
import torch

import training
from tests.spawn_ranks import spawn_ranks
from tests.test_train_model_parallel import TOL, _assert_equal, _cfg
from training.parallel.distributed import DistInfo


def _train(rank, world, init_method, out, kw):
    import training.parallel.run as run

    built = []
    build = run.build_parallel_impls
    run.build_parallel_impls = lambda *a, **k: built.append(build(*a, **k)) or built[-1]  # to read the final weights
    lines = []
    rc = training.run(
        _cfg(Path(out), **kw), say=lines.append, info=DistInfo(rank, world, rank), init_method=init_method
    )
    # the whole GPT as gathered at the last evaluation, after the last step (max_iters = eval_interval)
    weights = {n: p.detach().clone() for n, p in built[0]["manual"].model.named_parameters()}
    return rc, lines, weights


def _one_process(out, **kw):
    assert training.run(_cfg(out, **kw)) == 0
    weights = torch.load(out / "checkpoint.pt", weights_only=False)["models"]["manual"]
    summary = json.loads((out / "summary.json").read_text())["results"]["manual"]
    steps = [
        r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["type"] == "step"
    ]
    return (summary, steps), weights


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    return _one_process(tmp_path_factory.mktemp("one"))


@pytest.mark.parametrize(
    "kw",
    [
        dict(pipeline_schedule="1f1b"),
        dict(pipeline_schedule="zb-h1", plots=True),
        dict(pipeline_schedule="gpipe", sequence_parallel=True),
    ],
    ids=["1f1b", "zb-h1", "gpipe-sp"],
)
def test_tensor_x_pipeline_on_four_ranks_equals_one_process(tmp_path, one_process, kw):
    kw = dict(tensor_parallel=2, pipeline_parallel=2, micro_batches=2, **kw)
    results = spawn_ranks(_train, 4, str(tmp_path), kw, join=False, timeout=240)
    assert [r[0] for r in results.values()] == [0] * 4, results[0][1]
    ref, ref_weights = one_process
    _assert_equal(tmp_path, ref)
    weights = results[0][2]
    assert set(weights) == set(ref_weights) - {"lm_head.weight"}  # the state dict names the tied table twice
    for name, w in weights.items():
        scale = ref_weights[name].abs().max()
        assert (w - ref_weights[name]).abs().max() <= TOL * scale, name
    # the timeline: in the folder, printed once by rank 0 (the other ranks print nothing of it)
    text = (tmp_path / "pipeline_timeline.txt").read_text().splitlines()
    lines = results[0][1]
    assert [line for line in lines if line in text] == text
    assert text[0].startswith(f"pipeline schedule {kw['pipeline_schedule']}, 2 ranks, 2 micro-batches")
    assert text[1].startswith("rank 0 |") and text[2].startswith("rank 1 |")
    assert text[-3].startswith("rank 0: ") and text[-2].startswith("rank 1: ") and " W1@" in text[-2]
    assert text[-1].startswith("measured bubble of that step: 0.")
    assert not any("measured bubble" in line for r in (1, 2, 3) for line in results[r][1])
    assert (tmp_path / "pipeline_timeline.png").exists() == bool(kw.get("plots"))


@pytest.mark.parametrize(
    "kw",
    [
        dict(pipeline_schedule="zb-v", sequence_parallel=True),
        dict(pipeline_schedule="interleaved-1f1b", virtual_stages=2),
    ],
    ids=["zb-v-sp", "interleaved-v2"],
)
def test_tensor_x_pipeline_of_two_stages_a_rank_equals_one_process(tmp_path_factory, tmp_path, kw):
    """Four stages of one block, two a pipeline rank, each over two tensor ranks (``StageChunks`` of
    ``TensorParallelStage``s)."""
    kw = dict(tensor_parallel=2, pipeline_parallel=2, micro_batches=2, n_layer=4, **kw)
    results = spawn_ranks(_train, 4, str(tmp_path), kw, join=False, timeout=240)
    assert [r[0] for r in results.values()] == [0] * 4, results[0][1]
    ref, ref_weights = _one_process(tmp_path_factory.mktemp("one4"), n_layer=4)
    _assert_equal(tmp_path, ref)
    for name, w in results[0][2].items():
        assert (w - ref_weights[name]).abs().max() <= TOL * ref_weights[name].abs().max(), name


def test_tensor_x_pipeline_x_data_with_zero_on_eight_ranks_equals_one_process(tmp_path, one_process):
    kw = dict(tensor_parallel=2, pipeline_parallel=2, micro_batches=2, pipeline_schedule="zb-h1", zero=2)
    results = spawn_ranks(_train, 8, str(tmp_path), kw, join=False, timeout=300)
    assert [r[0] for r in results.values()] == [0] * 8, results[0][1]
    assert json.loads((tmp_path / "summary.json").read_text())["world_size"] == 8
    ref, ref_weights = one_process
    _assert_equal(tmp_path, ref)
    for name, w in results[0][2].items():
        assert (w - ref_weights[name]).abs().max() <= TOL * ref_weights[name].abs().max(), name


def test_check_parity_reports_parity_for_tensor_x_pipeline(tmp_path):
    kw = dict(
        tensor_parallel=2,
        pipeline_parallel=2,
        micro_batches=2,
        pipeline_schedule="zb-h1",
        sequence_parallel=True,
        check_parity=True,
    )
    results = spawn_ranks(_train, 4, str(tmp_path), kw, join=False, timeout=240)
    rc, lines, _ = results[0]
    assert [r[0] for r in results.values()] == [0] * 4, lines
    assert lines[-1].startswith("parity: all ") and "within float64 rounding" in lines[-1], lines
    rows = [line for line in lines if line.startswith(("output ", "grad ", "weight ", "loss"))]
    for name in (
        "output logits",
        "output transformer.h.0",
        "output transformer.h.1",
        "grad transformer.wte.weight",
        "grad transformer.wpe.weight",
        "grad transformer.h.1.attn.c_attn.weight",
        "weight transformer.h.0.mlp.c_proj.weight",
    ):
        assert any(r.startswith(name + " ") for r in rows), (name, rows)
    assert all(r.endswith("rounding") for r in rows), rows

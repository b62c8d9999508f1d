"""train.py's model parallelism on gloo processes equals one process in float64: tensor (with and without sequence
parallelism), context, pipeline (1F1B, ZB-H1, and two stages a rank under interleaved 1F1B and ZB-V) and ZeRO-1/2
on 2 ranks; tensor x data and pipeline x data with ZeRO, context x tensor (sequence parallel) and context x data
with ZeRO on 4; each run's step losses and summary.json's results to 1e-9 relative (the gradient clipped every step,
so the whole model's norm is checked too); --check-parity reports parity on a correct run and, on a run whose
tensor-parallel f forgets its all-reduce, names the first tensor a reordered sum does not explain and exits 1."""

import json
from pathlib import Path

import pytest

import training
from tests.spawn_ranks import spawn_ranks
from training.parallel.distributed import DistInfo

TOL = 1e-9
TINY = dict(
    model="gpt",
    impl="manual",
    dtype="float64",
    n_layer=2,
    n_head=2,
    n_embd=16,
    block_size=8,
    batch_size=4,
    max_iters=3,
    eval_interval=3,
    eval_iters=1,
    log_interval=1,
    lr=0.05,
    clip_grad=0.05,
    plots=False,
    quiet=True,
    threads=1,
    dist_timeout=60,
)


def _cfg(out, **kw):
    given = frozenset(k for k in kw if k in ("micro_batches", "pipeline_schedule", "virtual_stages"))
    return training.TrainConfig(**{**TINY, **kw}, out=out, given=given)


def _results(out: Path) -> tuple[dict, list]:
    summary = json.loads((out / "summary.json").read_text())["results"]["manual"]
    steps = [
        r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["type"] == "step"
    ]
    return summary, steps


def _train(rank, world, init_method, out, kw, broken=None):
    if broken == "f":  # the classic mistake: f's backward returns this rank's partial gradient, never all-reduced
        from training.parallel.tp_mappings import CopyToTensorParallel

        CopyToTensorParallel.backward = lambda self, dout: dout
    if broken == "ring":  # ring attention's: the visiting block's dK, dV kept where computed, never carried home
        from training.parallel import ring_attention

        step = ring_attention.backward_step

        def own_only(dq, dkv, *args):
            rank, src = args[-4], args[-3]
            step(dq, dkv if src == rank else dkv.clone(), *args)

        ring_attention.backward_step = own_only
    lines = []
    rc = training.run(
        _cfg(Path(out), **kw), say=lines.append, info=DistInfo(rank, world, rank), init_method=init_method
    )
    return rc, lines


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    assert training.run(_cfg(out)) == 0
    return _results(out)


def _assert_equal(out: Path, one_process) -> None:
    (summary, steps), (ref, ref_steps) = _results(out), one_process
    assert len(steps) == len(ref_steps) == TINY["max_iters"]
    for a, b in zip(steps, ref_steps, strict=True):
        assert abs(a - b) / abs(b) < TOL, (steps, ref_steps)
    for key in ("train_loss", "val_loss"):
        assert abs(summary[key] - ref[key]) / abs(ref[key]) < TOL, (key, summary, ref)


@pytest.mark.parametrize(
    "kw",
    [
        dict(tensor_parallel=2),
        dict(tensor_parallel=2, sequence_parallel=True),
        dict(pipeline_parallel=2, micro_batches=4),
        dict(pipeline_parallel=2, micro_batches=4, pipeline_schedule="zb-h1"),
        dict(zero=1),
        dict(zero=2),
        dict(context_parallel=2),
    ],
    ids=["tp", "tp-sp", "pp-1f1b", "pp-zb-h1", "zero1", "zero2", "cp"],
)
def test_two_ranks_equal_one_process(tmp_path, one_process, kw):
    results = spawn_ranks(_train, 2, str(tmp_path), kw, join=False)
    assert [rc for rc, _ in results.values()] == [0, 0]
    _assert_equal(tmp_path, one_process)


@pytest.fixture(scope="module")
def one_process_4_layers(tmp_path_factory):
    out = tmp_path_factory.mktemp("one4")
    assert training.run(_cfg(out, n_layer=4)) == 0
    return _results(out)


@pytest.mark.parametrize(
    "kw",
    [
        dict(pipeline_schedule="interleaved-1f1b", virtual_stages=2),
        dict(pipeline_schedule="zb-v"),
    ],
    ids=["pp-interleaved-v2", "pp-zb-v"],
)
def test_two_ranks_of_two_stages_each_equal_one_process(tmp_path, one_process_4_layers, kw):
    """Four stages of one block on two ranks: interleaved (rank 0 stages 0 and 2) and ZB-V (rank 0 stages 0 and 3,
    so the loss and both copies of the tied table are rank 0's)."""
    kw = dict(kw, n_layer=4, pipeline_parallel=2, micro_batches=4)
    results = spawn_ranks(_train, 2, str(tmp_path), kw, join=False)
    assert [rc for rc, _ in results.values()] == [0, 0]
    _assert_equal(tmp_path, one_process_4_layers)
    timeline = (tmp_path / "pipeline_timeline.txt").read_text()
    assert f"pipeline schedule {kw['pipeline_schedule']}, 2 ranks, 4 micro-batches" in timeline
    assert "rank 0: " in timeline and "F3s" in timeline and "measured bubble of that step" in timeline


@pytest.mark.parametrize(
    "kw",
    [
        dict(tensor_parallel=2, zero=1),
        dict(pipeline_parallel=2, micro_batches=2, pipeline_schedule="zb-h1", zero=2),
        dict(context_parallel=2, tensor_parallel=2, sequence_parallel=True),
        dict(context_parallel=2, zero=1),
    ],
    ids=["tp-x-dp-zero1", "pp-x-dp-zero2", "cp-x-tp-sp", "cp-x-dp-zero1"],
)
def test_model_x_data_parallel_with_zero_on_four_ranks_equals_one_process(tmp_path, one_process, kw):
    results = spawn_ranks(_train, 4, str(tmp_path), kw, join=False, timeout=180)
    assert [rc for rc, _ in results.values()] == [0] * 4
    assert json.loads((tmp_path / "summary.json").read_text())["world_size"] == 4
    _assert_equal(tmp_path, one_process)


@pytest.mark.parametrize(
    "kw",
    [
        dict(tensor_parallel=2),
        dict(zero=2),
        dict(pipeline_parallel=2, micro_batches=2, pipeline_schedule="zb-h1"),
        dict(context_parallel=2),
        dict(pipeline_parallel=2, micro_batches=2, pipeline_schedule="interleaved-1f1b", virtual_stages=2, n_layer=4),
        dict(pipeline_parallel=2, micro_batches=2, pipeline_schedule="zb-v", n_layer=4),
    ],
    ids=["tp", "zero2", "pp-zb-h1", "cp", "pp-interleaved-v2", "pp-zb-v"],
)
def test_check_parity_reports_parity_on_a_correct_run(tmp_path, kw):
    results = spawn_ranks(_train, 2, str(tmp_path), dict(kw, check_parity=True), join=False)
    rc, lines = results[0]
    assert rc == 0 and results[1][0] == 0, lines
    assert lines[-1].startswith("parity: all ") and "within float64 rounding" in lines[-1], lines
    rows = [line for line in lines if line.startswith(("output ", "grad ", "weight ", "loss"))]
    assert any(r.startswith("grad transformer.h.1.attn.c_attn.weight") for r in rows)
    assert any(r.startswith("weight transformer.h.1.attn.c_attn.weight") for r in rows)
    assert any(r.startswith("output logits") for r in rows)  # data parallel: rank 0's rows; pipeline: the last stage's
    assert any(r.startswith("output transformer.h.1") for r in rows)
    assert all(r.endswith("rounding") for r in rows), rows
    assert not (tmp_path / "summary.json").exists()  # a check trains nothing and writes nothing


def test_check_parity_names_the_tensor_a_wrong_all_reduce_breaks(tmp_path):
    results = spawn_ranks(_train, 2, str(tmp_path), dict(tensor_parallel=2, check_parity=True), "f", join=False)
    rc, lines = results[0]
    assert rc == 1 and results[1][0] == 1, lines
    verdict = lines[-1]
    # the output layer's f is the first to run backward: ln_f's gradient is the first that is wrong
    assert verdict.startswith("parity: BUG. The first tensor past float64 rounding is grad transformer.ln_f.weight"), (
        verdict
    )
    assert "no reordered sum explains is grad transformer.ln_f.weight" in verdict
    rows = {line.split()[0] + " " + line.split()[1]: line for line in lines if line.startswith(("output", "grad"))}
    assert rows["output logits"].endswith("rounding")  # the forward is right: only a backward all-reduce is gone
    assert rows["grad transformer.wte.weight"].endswith("bug")


def test_check_parity_names_the_tensor_a_ring_that_drops_dk_dv_breaks(tmp_path):
    results = spawn_ranks(_train, 2, str(tmp_path), dict(context_parallel=2, check_parity=True), "ring", join=False)
    rc, lines = results[0]
    assert rc == 1 and results[1][0] == 1, lines
    # the last block's attention is the first ring the backward meets: its c_attn's gradient reads dk and dv
    first = "grad transformer.h.1.attn.c_attn.weight"
    assert lines[-1].startswith(f"parity: BUG. The first tensor past float64 rounding is {first}"), lines[-1]
    rows = {line.split()[0] + " " + line.split()[1]: line for line in lines if line.startswith(("output", "grad"))}
    assert rows["output logits"].endswith("rounding") and rows["grad transformer.h.1.attn.c_proj.weight"].endswith(
        "rounding"
    )
    assert rows[first].endswith("bug")

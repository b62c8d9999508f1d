"""train.py's model-parallel flags: each lands on its TrainConfig field, --schedule takes a learning-rate or a
pipeline schedule (both when given twice), and what does not compose or does not divide -- a non-GPT model,
heads, width, layers, block size, batch, world size, dropout, the twins -- is refused in one line naming the
values, before any process group is needed (the width divides by T when the heads do).  A resumed model-parallel
run keeps the split its checkpoint was written with (a setting not given is the checkpoint's); another split or world
size is refused in one line naming the checkpoint's value and this run's."""

import pytest

import train
from training import TrainConfig, UsageError
from training.config.resume import resume_split as resume_settings
from training.parallel.distributed import DistInfo
from training.parallel.run import check_world

GPT = ["--model", "gpt", "--n-layer", "4", "--n-head", "4", "--n-embd", "32"]


def test_the_flags_land_on_the_config():
    config = train.parse_config([*GPT, "--tensor-parallel", "2", "--sequence-parallel", "--zero", "1"])
    c = config.parallel
    assert (c.tensor_parallel, c.sequence_parallel, c.zero, c.pipeline_parallel) == (2, True, 1, 1)
    assert config.model_parallel and config.run.impl == "manual"  # the split trains the hand-written GPT, untold
    config = train.parse_config(
        [*GPT, "--pipeline-parallel", "2", "--micro-batches", "4", "--schedule", "zb-h1", "--schedule", "cosine"]
    )
    c = config.parallel
    assert (c.pipeline_parallel, c.micro_batches, c.pipeline_schedule, config.optim.schedule) == (
        2,
        4,
        "zb-h1",
        "cosine",
    )
    assert (
        train.parse_config(
            [*GPT, "--pipeline-parallel", "2", "--pipeline-schedule", "gpipe"]
        ).parallel.pipeline_schedule
        == "gpipe"
    )
    c = train.parse_config(
        [
            *GPT,
            "--tensor-parallel",
            "2",
            "--pipeline-parallel",
            "2",
            "--schedule",
            "zb-h1",
            "--micro-batches",
            "2",
            "--sequence-parallel",
        ]
    ).parallel  # tensor x pipeline composes
    assert (c.tensor_parallel, c.pipeline_parallel, c.pipeline_schedule, c.sequence_parallel) == (2, 2, "zb-h1", True)
    plain = train.parse_config(GPT)
    assert not plain.model_parallel and plain.optim.schedule == "warmup-cosine" and plain.run.impl == "both"


def test_the_pipeline_schedules_of_several_stages_a_rank_land_on_the_config():
    argv = [*GPT, "--pipeline-parallel", "2", "--micro-batches", "4"]
    c = train.parse_config([*argv, "--schedule", "interleaved-1f1b", "--virtual-stages", "2"]).parallel
    assert (c.pipeline_schedule, c.virtual_stages, c.stages_a_rank) == ("interleaved-1f1b", 2, 2)
    c = train.parse_config([*argv, "--schedule", "zb-v"]).parallel
    assert (c.pipeline_schedule, c.virtual_stages, c.stages_a_rank) == ("zb-v", 1, 2)  # ZB-V's V: two, untold
    assert "virtual_stages" in c.split()  # a resume keeps it


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--model", "lstm", "--zero", "1"], "splits the GPT only, not --model lstm"),
        ([*GPT, "--tensor-parallel", "3"], "--n-head 4 does not divide by --tensor-parallel 3"),
        ([*GPT, "--micro-batches", "0", "--pipeline-parallel", "2"], "--micro-batches 0 is out of range"),
        ([*GPT, "--pipeline-parallel", "3"], "--n-layer 4 does not divide by --pipeline-parallel 3"),
        (
            [*GPT, "--tensor-parallel", "3", "--pipeline-parallel", "2"],
            "--n-head 4 does not divide by --tensor-parallel 3",
        ),
        (
            [*GPT, "--tensor-parallel", "2", "--pipeline-parallel", "3"],
            "--n-layer 4 does not divide by --pipeline-parallel 3",
        ),
        (
            [*GPT, "--tensor-parallel", "2", "--pipeline-parallel", "2", "--sequence-parallel", "--block-size", "9"],
            "--block-size 9 does not divide by --tensor-parallel 2",
        ),
        ([*GPT, "--sequence-parallel"], "--sequence-parallel splits the sequence over the tensor-parallel ranks"),
        (
            [*GPT, "--tensor-parallel", "2", "--sequence-parallel", "--block-size", "9"],
            "--block-size 9 does not divide by --tensor-parallel 2",
        ),
        ([*GPT, "--micro-batches", "4"], "--micro-batches applies to a pipeline: give --pipeline-parallel P > 1"),
        ([*GPT, "--schedule", "1f1b"], "--schedule 1f1b applies to a pipeline"),
        ([*GPT, "--tensor-parallel", "2", "--dropout", "0.1"], "--dropout 0.1: model parallelism runs without dropout"),
        ([*GPT, "--zero", "1", "--impl", "both"], "--impl both: model parallelism trains the hand-written GPT"),
        ([*GPT, "--tensor-parallel", "0"], "--tensor-parallel 0 is out of range"),
        ([*GPT, "--zero", "3"], "--zero: invalid choice: 3"),
        ([*GPT, "--zero", "1", "--dtype", "bfloat16"], "--dtype bfloat16 with model parallelism is not supported"),
        (
            [*GPT, "--context-parallel", "2", "--pipeline-parallel", "2"],
            "--context-parallel 2 with --pipeline-parallel 2 is not supported",
        ),
        ([*GPT, "--context-parallel", "3"], "--block-size 64 does not divide by 2 x --context-parallel 3"),
        (
            [*GPT, "--context-parallel", "2", "--tensor-parallel", "4", "--sequence-parallel", "--block-size", "12"],
            "--block-size 12 / --context-parallel 2 = 6 positions a rank do not divide by --tensor-parallel 4",
        ),
        ([*GPT, "--context-parallel", "0"], "--context-parallel 0 is out of range"),
        ([*GPT, "--virtual-stages", "2"], "--virtual-stages applies to a pipeline: give --pipeline-parallel P > 1"),
        (
            [*GPT, "--pipeline-parallel", "2", "--schedule", "interleaved-1f1b"],
            "--schedule interleaved-1f1b needs --virtual-stages V >= 2 chunks a rank, not 1",
        ),
        (
            [*GPT, "--pipeline-parallel", "2", "--schedule", "interleaved-1f1b", "--virtual-stages", "4"],
            "--n-layer 4 does not divide by --pipeline-parallel 2 x 4 stages a rank (--schedule interleaved-1f1b) "
            "= 8 stages",
        ),
        (
            [*GPT, "--n-layer", "6", "--pipeline-parallel", "2", "--schedule", "zb-v"],
            "--n-layer 6 does not divide by --pipeline-parallel 2 x 2 stages a rank (--schedule zb-v) = 4 stages",
        ),
        (
            [*GPT, "--pipeline-parallel", "4", "--schedule", "interleaved-1f1b", "--virtual-stages", "2"]
            + ["--n-layer", "8", "--micro-batches", "9"],
            "--micro-batches 9 does not divide into 2 equal rounds of micro-batches (M // P with P = 4)",
        ),
        (
            [*GPT, "--pipeline-parallel", "2", "--schedule", "zb-v", "--virtual-stages", "3"],
            "--virtual-stages 3 applies to --schedule interleaved-1f1b; zb-v runs 2 chunk(s) a rank",
        ),
        ([*GPT, "--pipeline-parallel", "2", "--virtual-stages", "0"], "--virtual-stages 0 is out of range"),
    ],
)
def test_what_does_not_compose_or_divide_is_refused_by_name(argv, message):
    with pytest.raises(UsageError) as e:
        train.parse_config(argv)
    assert message in str(e.value) and "\n" not in str(e.value)


def _config(**kw):
    return TrainConfig(**{"model": "gpt", "n_layer": 4, "n_head": 4, "n_embd": 32, "batch_size": 8, **kw})


@pytest.mark.parametrize(
    "kw,world,message",
    [
        (dict(tensor_parallel=2), 3, "the world size 3 does not divide by --tensor-parallel 2 x --pipeline-parallel 1"),
        (
            dict(pipeline_parallel=2, micro_batches=3, given=frozenset({"micro_batches"})),
            2,
            "--batch-size 8 does not divide by 1 data-parallel ranks x --micro-batches 3",
        ),
        (dict(pipeline_parallel=2), 6, "--batch-size 8 does not divide by 3 data-parallel ranks x --micro-batches 1"),
        (dict(zero=1, batch_size=2), 4, "--batch-size 2 windows cannot be shared by 4 data-parallel ranks"),
        (dict(zero=1), 1, "runs under torchrun"),
        (
            dict(tensor_parallel=2, pipeline_parallel=2),
            6,
            "the world size 6 does not divide by --tensor-parallel 2 x --pipeline-parallel 2 = 4 ranks",
        ),
        (
            dict(tensor_parallel=2, pipeline_parallel=2, micro_batches=3, given=frozenset({"micro_batches"})),
            8,
            "--batch-size 8 does not divide by 2 data-parallel ranks x --micro-batches 3",
        ),
        (
            dict(tensor_parallel=2, context_parallel=2),
            6,
            "the world size 6 does not divide by --tensor-parallel 2 x --context-parallel 2 x --pipeline-parallel 1",
        ),
    ],
)
def test_a_world_the_settings_do_not_divide_is_refused_by_name(kw, world, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        _check_world(_config(**kw), DistInfo(0, world) if world > 1 else DistInfo())


def _check_world(config, info):
    return check_world(config.parallel, config.data.batch_size, info)


def test_a_world_that_divides_gives_the_data_parallel_size():
    assert _check_world(_config(tensor_parallel=2), DistInfo(0, 4)) == 2
    assert _check_world(_config(tensor_parallel=2, pipeline_parallel=2), DistInfo(0, 8)) == 2
    assert _check_world(_config(tensor_parallel=2, context_parallel=2), DistInfo(0, 8)) == 2
    assert (
        _check_world(_config(pipeline_parallel=2, micro_batches=4, given=frozenset({"micro_batches"})), DistInfo(0, 4))
        == 2
    )


# -- resuming a model-parallel checkpoint: the split it was written with, or a one-line refusal naming both ------------


def _checkpoint(world: int = 2, **split) -> dict:
    """What resume_settings reads of a checkpoint: a model-parallel run's split settings, or (no split) none."""
    if not split:
        return {"world_size": world}
    return {
        "world_size": world,
        "model_parallel": {"settings": {**_config(**split).parallel.split(), "world_size": world}},
    }


@pytest.mark.parametrize(
    "saved,kw,world,message",
    [
        (
            dict(tensor_parallel=2),
            dict(zero=1, given=frozenset({"zero"})),
            2,
            "the checkpoint was written with --zero 0, this run has --zero 1;",
        ),
        (
            dict(tensor_parallel=2),
            dict(tensor_parallel=1, given=frozenset({"tensor_parallel"})),
            2,
            "the checkpoint was written with --tensor-parallel 2, this run has --tensor-parallel 1;",
        ),
        (dict(zero=1), {}, 4, "the checkpoint was written with world size 2, this run has world size 4;"),
        (
            dict(pipeline_parallel=2),
            dict(tensor_parallel=2, given=frozenset({"tensor_parallel"})),
            2,
            "the checkpoint was written with --tensor-parallel 1, this run has --tensor-parallel 2;",
        ),
        (
            dict(pipeline_parallel=2, micro_batches=4),
            dict(pipeline_parallel=2, micro_batches=2, given=frozenset({"micro_batches"})),
            2,
            "the checkpoint was written with --micro-batches 4, this run has --micro-batches 2;",
        ),
        (
            {},
            dict(zero=1),
            2,
            "the checkpoint was written without model parallelism (world size 2), this run has "
            "--tensor-parallel 1, --sequence-parallel False, --context-parallel 1, --expert-parallel 1, "
            "--pipeline-parallel 1",
        ),
    ],
)
def test_a_resume_with_another_split_or_world_is_refused_naming_old_and_new(saved, kw, world, message):
    with pytest.raises(UsageError) as e:
        resume_settings(_config(**kw), _checkpoint(**saved), world, "run/checkpoint.pt")
    assert str(e.value).startswith("--resume run/checkpoint.pt: ") and message in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_a_resume_takes_the_split_it_is_not_given_from_the_checkpoint():
    c = resume_settings(_config(), _checkpoint(tensor_parallel=2, zero=1), 2, "run/checkpoint.pt")
    assert (c.parallel.tensor_parallel, c.parallel.zero, c.parallel.pipeline_parallel) == (2, 1, 1) and c.model_parallel
    c = resume_settings(_config(), _checkpoint(zero=0, given=frozenset({"zero"})), 2, "c.pt")
    assert c.parallel.zero == 0 and c.model_parallel  # data parallelism by the model-parallel path stays on it
    plain = _config()
    assert resume_settings(plain, _checkpoint(), 2, "c.pt") is plain  # neither is model-parallel: nothing to do


def test_check_parity_with_resume_is_refused():
    with pytest.raises(UsageError, match="--check-parity with --resume run/checkpoint.pt: the check takes a fresh"):
        _config(zero=1, check_parity=True, resume="run/checkpoint.pt")
    assert _config(zero=1, resume="run/checkpoint.pt").run.resume.name == "checkpoint.pt"  # resuming itself is allowed

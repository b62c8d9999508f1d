"""train.py --model cnn: the hand-written CNN beside its to_torch() twin, same weights, batches and dropout masks."""

import json

import torch

import train
import training
from layers import BatchNorm2d, Dropout
from tests.conftest import rel

CNN = ["--model", "cnn", "--batch-size", "32", "--no-download", "--quiet", "--no-plots", "--dtype", "float64"]


def run(*argv):
    return train.main([str(a) for a in argv])


def test_one_epoch_of_the_cnn_leaves_the_twins_within_1e_9(tiny, tmp_path):
    out = tmp_path / "run"
    assert (
        run(
            "--data-dir",
            tiny,
            "--out",
            out,
            "--epochs",
            "1",
            "--augment",
            "--optimizer",
            "sgd",
            "--momentum",
            "0.9",
            "--lr",
            "0.02",
            *CNN,
        )
        == 0
    )
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    manual, twin = ckpt["models"]["manual"], ckpt["models"]["torch"]
    assert manual.keys() == twin.keys() and any(k.endswith("running_var") for k in manual)
    for k in manual:
        if manual[k].is_floating_point():
            assert rel(manual[k], twin[k]) < 1e-9, k  # weights and running statistics
        else:
            assert torch.equal(manual[k], twin[k]), k  # num_batches_tracked
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "cnn" and summary["max_param_abs_diff"] < 1e-9
    assert summary["results"]["manual"]["test_accuracy"] == summary["results"]["torch"]["test_accuracy"]


def test_the_cnn_has_dropout_and_batch_norm_and_the_twin_draws_the_same_masks():
    from training.impls.models import build_models, use_generator

    config = training.TrainConfig(model="cnn", dtype="float64")
    models = build_models(config.model, config.run, torch.device("cpu"), torch.float64)
    manual, twin = models["manual"], models["torch"]
    layers = list(manual.layers)
    assert any(isinstance(m, Dropout) for m in layers) and any(isinstance(m, BatchNorm2d) for m in layers)
    x = torch.randn(4, 1, 28, 28, dtype=torch.float64)
    for m in (manual, twin):
        use_generator(m, torch.Generator().manual_seed(3))
    assert rel(manual(x), twin(x)) < 1e-12  # training mode: the same dropout masks and batch statistics


def test_resume_carries_the_running_statistics(tiny, tmp_path):
    common = ["--data-dir", tiny, *CNN, "--impl", "manual"]
    assert run(*common, "--out", tmp_path / "straight", "--epochs", "2") == 0
    from tests.test_train import _run_first_epoch_only

    _run_first_epoch_only(common, tmp_path / "half")
    assert run("--resume", tmp_path / "half" / "checkpoint.pt", "--data-dir", tiny, "--quiet", "--no-download") == 0
    a = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=True)["models"]["manual"]
    b = torch.load(tmp_path / "half" / "checkpoint.pt", weights_only=True)["models"]["manual"]
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_engine_is_refused_for_the_cnn(capsys):
    assert run("--model", "cnn", "--impl", "all") == 2
    assert "the autodiff engine builds only the MLP, not --model cnn" in capsys.readouterr().err

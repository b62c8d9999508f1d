"""train.py end to end on a tiny IDX dataset written here, through the real loading code; no network."""

import errno
import json
import os
from pathlib import Path

import pytest
import torch

import train
import training
import training.tasks.image
import training.trainer
from tests.conftest import wait_for

FAST = ["--hidden", "16", "--depth", "2", "--batch-size", "32", "--no-download", "--quiet", "--no-plots"]


def run(*argv):
    return train.main([str(a) for a in argv])


def test_end_to_end_both_impls_agree_and_write_outputs(tiny, tmp_path):
    out = tmp_path / "run"
    with pytest.warns(UserWarning, match="not the official"):  # our tiny .gz files are not MNIST's
        code = run(
            "--data-dir",
            tiny,
            "--out",
            out,
            "--epochs",
            "2",
            "--dtype",
            "float64",
            "--monitor",
            "--log-interval",
            "3",
            "--clip-grad",
            "1.0",
            "--lr",
            "0.01",
            *FAST,
        )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"dataset", "model", "epochs", "results", "max_param_abs_diff"}
    assert summary["dataset"] == "fashion-mnist" and summary["epochs"] == 2  # the default
    assert set(summary["results"]) == {"manual", "torch"}
    for r in summary["results"].values():
        assert set(r) == {"test_accuracy", "test_loss", "train_loss", "seconds_per_epoch"}
        assert all(isinstance(v, float) for v in r.values())
        assert r["test_accuracy"] > 0.5  # the squares are easy to learn
    assert summary["max_param_abs_diff"] < 1e-10  # float64: the two implementations agree
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in recs if r["type"] == "epoch"]
    assert [(r["impl"], r["epoch"]) for r in epochs] == [("manual", 1), ("torch", 1), ("manual", 2), ("torch", 2)]
    assert all(r["val_acc"] is not None for r in epochs)
    drift = [r for r in recs if r["type"] == "drift"]  # steps 1, 4 (1, 4, 16, ... within epoch 1), each epoch's end
    assert [(r["epoch"], r["step"]) for r in drift] == [(1, 1), (1, 4), (1, 9), (2, 18)]
    assert all(r["max_param_abs_diff"] < 1e-10 for r in drift) and drift[0]["max_grad_rel_diff"] < 1e-12
    mons = {
        name: [json.loads(line) for line in (out / f"monitor_{name}.jsonl").read_text().splitlines()]
        for name in ("manual", "torch")
    }
    steps = [r["step"] for r in mons["manual"]]  # every 3rd, the run's first and each epoch's last (9 per epoch)
    assert steps == [1, 3, 6, 9, 12, 15, 18] and steps == [r["step"] for r in mons["torch"]]
    for name, recs_ in mons.items():
        for r in recs_:
            assert r["total_grad_norm_after_clip"] <= 1.0 + 1e-9, name
            assert r["total_grad_norm"] >= r["total_grad_norm_after_clip"] - 1e-12, name
        assert all(r["update_ratio_span"] is not None for r in recs_[1:]), name
        assert {a["layer"] for a in recs_[0]["activations"].values()} == {"Linear", "ReLU"}, name
    for a, b in zip(*mons.values(), strict=True):  # the twins' statistics agree (float64)
        assert a["total_grad_norm"] == pytest.approx(b["total_grad_norm"], rel=1e-9)
        for pname, stats in a["params"].items():
            assert stats["grad_norm"] == pytest.approx(b["params"][pname]["grad_norm"], rel=1e-9), pname
            assert sum(stats["hist_counts"]) == sum(b["params"][pname]["hist_counts"]) == stats["numel"], pname
    assert not list(out.glob("*.png"))  # --no-plots: figures are rendered once, in test_plots.py
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] == 2 and set(ckpt["models"]) == {"manual", "torch"}


def test_a_run_shorter_than_the_log_interval_is_monitored(tiny, tmp_path):
    out = tmp_path / "run"  # 9 steps, --log-interval 50 by default
    assert run("--data-dir", tiny, "--out", out, "--epochs", "1", "--monitor", *FAST) == 0
    for name in ("manual", "torch"):
        assert [json.loads(x)["step"] for x in (out / f"monitor_{name}.jsonl").read_text().splitlines()] == [1, 9]


def test_the_weight_difference_is_printed_with_the_first_steps_agreement(tiny, tmp_path, capsys):
    assert run("--data-dir", tiny, "--out", tmp_path / "run", "--epochs", "1", "--hidden", "16", "--no-download") == 0
    out = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(out) if line.startswith("largest weight difference between implementations"))
    assert out[at].endswith("after 1 epoch: " + out[at].split(": ")[-1])  # "1 epoch", not "1 epochs"
    agreement = out[at + 1]  # what agreeing means in float32, measured on this run's first step
    assert (
        agreement.startswith(
            "  in float32, agreeing means: the first step agreed, its forward bit for bit (equal "
            "logits), its gradients to "
        )
        and "float32 rounding (its unit is 1.2e-07)" in agreement
    )
    assert float(agreement.split("its gradients to ")[1].split()[0]) < 1e-5
    assert "--dtype float64" in agreement and "curves.png plots the drift over steps" in agreement
    epoch = next(line for line in out if "largest weight difference between manual, torch:" in line)
    assert epoch.endswith(
        "(float32 rounding, which training amplifies as between two runs that sum in another "
        "order; --dtype float64 delays it)"
    )  # the epoch's line explains itself


def test_all_three_implementations_agree(tiny, tmp_path):
    out = tmp_path / "run"
    assert (
        run(
            "--data-dir",
            tiny,
            "--out",
            out,
            "--epochs",
            "2",
            "--impl",
            "all",
            "--dtype",
            "float64",
            "--monitor",
            "--log-interval",
            "4",
            *FAST,
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["results"]) == ["manual", "engine", "torch"]
    assert summary["max_param_abs_diff"] < 1e-10
    first = json.loads(next(x for x in (out / "metrics.jsonl").read_text().splitlines() if '"drift"' in x))
    assert first["step"] == 1 and first["max_grad_rel_diff"] < 1e-12  # every gradient, square 16x16 weights too
    accs = {r["test_accuracy"] for r in summary["results"].values()}
    assert len(accs) == 1


def test_single_impl_summary_has_only_that_impl(tiny, tmp_path):
    out = tmp_path / "run"
    assert run("--data-dir", tiny, "--out", out, "--epochs", "1", "--impl", "manual", "--val-split", "0", *FAST) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["results"]) == {"manual"} and summary["max_param_abs_diff"] is None


def test_dry_run(tiny, tmp_path):
    out = tmp_path / "dry"
    assert run("--data-dir", tiny, "--out", out, "--dry-run", *FAST) == 0
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"step"' in x]
    assert {s["step"] for s in steps} == {1}
    assert (out / "summary.json").is_file() and not (out / "checkpoint.pt").exists()  # a smoke test keeps no weights


@pytest.mark.parametrize(
    "dtype,impl,extra",
    [
        ("float32", "both", []),
        ("float64", "all", []),
        ("float64", "both", ["--schedule", "onecycle", "--augment"]),
        ("float64", "all", ["--monitor", "--log-interval", "3"]),
    ],
)
def test_resume_equals_uninterrupted(tiny, tmp_path, dtype, impl, extra):
    common = [
        "--data-dir",
        tiny,
        "--dtype",
        dtype,
        "--optimizer",
        "sgd",
        "--momentum",
        "0.9",
        "--lr",
        "0.05",
        "--impl",
        impl,
        *extra,
        *FAST,
    ]
    assert run(*common, "--out", tmp_path / "straight", "--epochs", "2") == 0
    _run_first_epoch_only(common, tmp_path / "half")
    assert run("--resume", tmp_path / "half" / "checkpoint.pt", "--data-dir", tiny, "--quiet", "--no-download") == 0
    a = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=True)
    b = torch.load(tmp_path / "half" / "checkpoint.pt", weights_only=True)
    assert b["epoch"] == 2
    for name in a["models"]:
        for k, v in a["models"][name].items():
            assert torch.equal(v, b["models"][name][k]), (name, k)
    strip = lambda h: [{k: v for k, v in r.items() if k != "seconds"} for r in h]  # noqa: E731
    assert strip(a["records"]) == strip(b["records"])
    lines = [json.loads(x) for x in (tmp_path / "half" / "metrics.jsonl").read_text().splitlines()]
    assert strip(lines) == strip(a["records"])  # the resumed log reads as the uninterrupted one
    for mon in sorted(p.name for p in (tmp_path / "straight").glob("monitor_*.jsonl")):
        assert (tmp_path / "half" / mon).read_text() == (tmp_path / "straight" / mon).read_text(), mon
    assert bool(list((tmp_path / "half").glob("monitor_*.jsonl"))) == ("--monitor" in extra)


def _run_first_epoch_only(argv, out):
    """Start a 2-epoch run and stop it after its first epoch's checkpoint (as a crash would)."""
    real = training.trainer.save_checkpoint

    def save_then_stop(path, state):
        real(path, state)
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as m:
        m.setattr(training.trainer, "save_checkpoint", save_then_stop)
        with pytest.raises(KeyboardInterrupt):
            run(*argv, "--out", out, "--epochs", "2")


def test_resume_refuses_changed_settings(tiny, tmp_path, capsys):
    assert run("--data-dir", tiny, "--out", tmp_path / "r", "--epochs", "1", "--optimizer", "sgd", *FAST) == 0
    ckpt = tmp_path / "r" / "checkpoint.pt"
    capsys.readouterr()
    assert run("--resume", ckpt, "--epochs", "2", "--hidden", "32", "--data-dir", tiny, "--no-download") == 2
    assert "trained with --hidden 16, but --hidden 32 was given" in capsys.readouterr().err
    # An explicit flag equal to its default still conflicts: adam is the default, the run used sgd.
    assert run("--resume", ckpt, "--epochs", "2", "--optimizer", "adam", "--data-dir", tiny, "--no-download") == 2
    assert "trained with --optimizer sgd, but --optimizer adam was given" in capsys.readouterr().err
    # Flags repeating the checkpoint's values are fine; the others are adopted from it.
    assert (
        run(
            "--resume",
            ckpt,
            "--epochs",
            "2",
            "--optimizer",
            "sgd",
            "--data-dir",
            tiny,
            "--no-download",
            "--quiet",
            "--no-plots",
        )
        == 0
    )
    assert torch.load(ckpt, weights_only=True)["config"]["optimizer"] == "sgd"
    assert run("--resume", ckpt, "--epochs", "1", "--data-dir", tiny, "--no-download") == 2
    assert "already holds 2 epochs, more than --epochs 1" in capsys.readouterr().err
    assert run("--resume", tmp_path / "nope.pt", "--epochs", "2") == 2
    assert "nope.pt: no such file" in capsys.readouterr().err


def test_resume_of_a_finished_checkpoint_completes_the_outputs(tiny, tmp_path):
    out = tmp_path / "r"
    assert run("--data-dir", tiny, "--out", out, "--epochs", "2", *FAST) == 0
    first = json.loads((out / "summary.json").read_text())
    (out / "summary.json").unlink()
    before = (out / "checkpoint.pt").read_bytes()
    assert run("--resume", out / "checkpoint.pt", "--data-dir", tiny, "--no-download", "--quiet", "--no-plots") == 0
    again = json.loads((out / "summary.json").read_text())
    assert again["epochs"] == 2 and again["results"].keys() == first["results"].keys()
    for name, r in first["results"].items():
        assert again["results"][name]["test_accuracy"] == r["test_accuracy"]
        assert again["results"][name]["test_loss"] == r["test_loss"]
    assert (out / "checkpoint.pt").read_bytes() == before  # nothing was trained


def test_corrupt_resume_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "checkpoint.pt"
    bad.write_bytes(b"not a checkpoint at all")
    assert run("--resume", bad) == 2
    err = capsys.readouterr().err.strip()
    assert f"--resume {bad} is not a handgrad checkpoint" in err and len(err.splitlines()) == 1
    torch.save({"something": "else"}, bad)
    assert run("--resume", bad) == 2
    assert "is not a handgrad train.py checkpoint" in capsys.readouterr().err


def test_non_finite_loss_stops_and_keeps_last_checkpoint(tiny, tmp_path, monkeypatch, capsys):
    assert (
        run("--data-dir", tiny, "--out", tmp_path / "new", "--epochs", "3", "--optimizer", "sgd", "--lr", "1e30", *FAST)
        == 1
    )
    err = capsys.readouterr().err
    assert "manual: the training loss became" in err and "epoch 1, step" in err
    out = tmp_path / "r"
    assert run("--data-dir", tiny, "--out", out, "--epochs", "1", "--optimizer", "sgd", *FAST) == 0
    before = (out / "checkpoint.pt").read_bytes()
    real = training.tasks.image.train_epoch

    def diverge_in_epoch_2(impl, data, perm, epoch, *rest):
        if epoch == 2:
            for group in impl.opt.param_groups:
                group["lr"] = 1e30
        return real(impl, data, perm, epoch, *rest)

    monkeypatch.setattr(training.tasks.image, "train_epoch", diverge_in_epoch_2)
    assert run("--resume", out / "checkpoint.pt", "--epochs", "3", "--data-dir", tiny, "--no-download", "--quiet") == 1
    assert "the training loss became" in capsys.readouterr().err
    assert (out / "checkpoint.pt").read_bytes() == before
    assert not list(out.glob(".*tmp*"))


def test_ctrl_c_leaves_the_last_complete_checkpoint(tiny, tmp_path, monkeypatch, capsys):
    real = training.tasks.image.train_epoch

    def interrupt_in_epoch_2(impl, data, perm, epoch, *rest):
        if epoch == 2:
            raise KeyboardInterrupt
        return real(impl, data, perm, epoch, *rest)

    monkeypatch.setattr(training.tasks.image, "train_epoch", interrupt_in_epoch_2)
    out = tmp_path / "r"
    with pytest.raises(KeyboardInterrupt):  # in-process: the caller (a test suite) stops too; the command exits 130
        run("--data-dir", tiny, "--out", out, "--epochs", "3", *FAST)
    assert "last complete checkpoint" in capsys.readouterr().err
    assert train.cli([str(a) for a in ("--data-dir", tiny, "--out", tmp_path / "c", "--epochs", "3", *FAST)]) == 130
    assert torch.load(out / "checkpoint.pt", weights_only=True)["epoch"] == 1
    assert not list(out.glob(".*tmp*"))


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    training.save_checkpoint(path, {"epoch": 1})

    class HalfWritten:  # the device fails half-way through the temporary file
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            raise OSError(errno.EIO, os.strerror(errno.EIO))

    def half_written(p, mode):
        return HalfWritten(open(p, mode))  # noqa: SIM115 (the writer closes it)

    monkeypatch.setattr(training.storage.files, "open", half_written, raising=False)
    with pytest.raises(
        training.WriteFailed,
        match=f"cannot write {path}: Input/output error; the previous checkpoint.pt there is intact",
    ):
        training.save_checkpoint(path, {"epoch": 2})
    assert torch.load(path, weights_only=True)["epoch"] == 1  # beside "size", the file's length (format 5)
    assert list(tmp_path.iterdir()) == [path]


def _logged_epoch_2(out: Path) -> bool:
    path = out / "metrics.jsonl"
    return path.exists() and '"epoch": 2' in path.read_text()


def test_real_sigint_keeps_a_loadable_checkpoint(tiny, tmp_path):
    """Send Ctrl-C (SIGINT) to a running train.py in its second epoch: exit 130, the last checkpoint intact."""
    import signal
    import subprocess
    import sys

    out = tmp_path / "r"
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "train.py",
            "--data-dir",
            str(tiny),
            "--out",
            str(out),
            "--epochs",
            "100000",
            "--log-interval",
            "1",
            *FAST,
        ],
        cwd=root,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: _logged_epoch_2(out), proc, "a step of epoch 2 was logged")  # the readiness signal
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "last complete checkpoint" in err
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] >= 1 and set(ckpt["models"]) == {"manual", "torch"}
    assert not list(out.glob(".*tmp*"))


def test_sigkill_after_the_last_checkpoint_then_resume_completes(tiny, tmp_path):
    """A run SIGKILLed after its last epoch's checkpoint, before its summary: --resume writes the outputs, exit 0."""
    import signal
    import subprocess
    import sys

    out = tmp_path / "r"
    ready = tmp_path / "ready"
    root = Path(__file__).resolve().parents[1]
    # The real train.py, with a pause between the last checkpoint and the final outputs, announced by a file.
    script = (
        f"import sys, time, pathlib, training.trainer as r\n"
        f"def stop(*a, **k):\n    pathlib.Path({str(ready)!r}).touch(); time.sleep(600)\n"
        f"r._finish = stop\nimport train\nsys.exit(train.main(sys.argv[1:]))\n"
    )
    argv = ["--data-dir", str(tiny), "--out", str(out), "--epochs", "2", *FAST]
    proc = subprocess.Popen([sys.executable, "-c", script, *argv], cwd=root, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(ready.exists, proc, "the run reached its final outputs")
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "summary.json").exists()
    assert torch.load(out / "checkpoint.pt", weights_only=True)["epoch"] == 2
    assert run("--resume", out / "checkpoint.pt", "--data-dir", tiny, "--no-download", "--quiet", "--no-plots") == 0
    assert json.loads((out / "summary.json").read_text())["epochs"] == 2


@pytest.mark.parametrize("optimizer,rtol", [("sgd", 1e-12), ("adam", 1e-10)])
def test_cuda_graph_flag_runs_the_capturable_step_and_equals_the_default(tiny, tmp_path, optimizer, rtol):
    """On the CPU --cuda-graph runs the step it would capture (capturable optimizer, .grad written in place)
    eagerly.  It gives the default step's weights to rounding: capturable Adam computes its bias corrections
    1 - beta**t from a step counter on the device, float64 for float64 weights (torch.optim's capturable Adam keeps
    it float32 under a float32 default dtype, 1e-4 relative at t = 1 for beta2 = 0.999), where the default path
    computes them in Python floats.  Resumed, the run equals its uninterrupted self bit for bit."""
    common = ["--data-dir", tiny, "--dtype", "float64", "--optimizer", optimizer, "--impl", "manual", *FAST]
    assert run(*common, "--out", tmp_path / "eager", "--epochs", "2") == 0
    assert run(*common, "--out", tmp_path / "graph", "--epochs", "2", "--cuda-graph") == 0
    _run_first_epoch_only([*common, "--cuda-graph"], tmp_path / "half")
    assert (
        run(
            "--resume",
            tmp_path / "half" / "checkpoint.pt",
            "--data-dir",
            tiny,
            "--quiet",
            "--no-download",
            "--cuda-graph",
        )
        == 0
    )
    load = lambda name: torch.load(tmp_path / name / "checkpoint.pt", weights_only=True)  # noqa: E731
    eager, graph, half = (load(n) for n in ("eager", "graph", "half"))
    for k, v in eager["models"]["manual"].items():
        assert (graph["models"]["manual"][k] - v).abs().max() <= rtol * v.abs().max(), k
        assert torch.equal(half["models"]["manual"][k], graph["models"]["manual"][k]), k
    assert all(g["capturable"] for g in graph["optimizers"]["manual"]["param_groups"])
    assert not any(g["capturable"] for g in eager["optimizers"]["manual"]["param_groups"])
    # An eager run's checkpoint continued with --cuda-graph runs its second epoch capturable (and the reverse).
    _run_first_epoch_only(common, tmp_path / "switch")
    assert (
        run(
            "--resume",
            tmp_path / "switch" / "checkpoint.pt",
            "--data-dir",
            tiny,
            "--quiet",
            "--no-download",
            "--cuda-graph",
        )
        == 0
    )
    switched = load("switch")
    assert all(g["capturable"] for g in switched["optimizers"]["manual"]["param_groups"])
    for k, v in eager["models"]["manual"].items():
        assert (switched["models"]["manual"][k] - v).abs().max() <= rtol * v.abs().max(), k


def test_cuda_graph_refused_where_the_step_cannot_be_captured(tiny, tmp_path, capsys):
    assert run("--data-dir", tiny, "--out", tmp_path / "m", "--cuda-graph", "--monitor", *FAST) == 2
    assert "--cuda-graph: cannot capture this run's step: --monitor reads statistics back" in capsys.readouterr().err
    assert run("--data-dir", tiny, "--out", tmp_path / "h", "--cuda-graph", "--dtype", "bfloat16", *FAST) == 2
    assert "--dtype bfloat16's mixed-precision step is not capturable yet" in capsys.readouterr().err


@pytest.mark.parametrize("optimizer,rtol", [("sgd", 1e-12), ("adam", 1e-10)])
def test_cuda_graph_with_a_schedule_follows_it(tiny, tmp_path, optimizer, rtol):
    """--cuda-graph with --schedule (on the CPU, the capturable step run eagerly): the optimizer's lr is a 0-d tensor
    beside the weights, which its kernels read on the device and the scheduler fills in place, so a replayed graph
    follows the schedule.  The run equals the eager scheduled run to rounding (Adam's device counters are float64
    here, as in the test above), ends on the schedule's last lr, and resumed it equals its uninterrupted self bit
    for bit."""
    common = [
        "--data-dir",
        tiny,
        "--dtype",
        "float64",
        "--optimizer",
        optimizer,
        "--impl",
        "manual",
        "--schedule",
        "onecycle",
        "--lr",
        "0.01",
        *FAST,
    ]
    assert run(*common, "--out", tmp_path / "eager", "--epochs", "2") == 0
    assert run(*common, "--out", tmp_path / "graph", "--epochs", "2", "--cuda-graph") == 0
    _run_first_epoch_only([*common, "--cuda-graph"], tmp_path / "half")
    assert (
        run(
            "--resume",
            tmp_path / "half" / "checkpoint.pt",
            "--data-dir",
            tiny,
            "--quiet",
            "--no-download",
            "--cuda-graph",
        )
        == 0
    )
    load = lambda name: torch.load(tmp_path / name / "checkpoint.pt", weights_only=True)  # noqa: E731
    eager, graph, half = (load(n) for n in ("eager", "graph", "half"))
    for k, v in eager["models"]["manual"].items():
        assert (graph["models"]["manual"][k] - v).abs().max() <= rtol * v.abs().max(), k
        assert torch.equal(half["models"]["manual"][k], graph["models"]["manual"][k]), k
    for g_graph, g_eager in zip(
        graph["optimizers"]["manual"]["param_groups"], eager["optimizers"]["manual"]["param_groups"], strict=True
    ):
        assert g_graph["capturable"] and isinstance(g_graph["lr"], torch.Tensor) and g_graph["lr"].dim() == 0
        assert isinstance(g_eager["lr"], float) and g_eager["lr"] < 0.01 / 10  # annealed: the schedule ran
        assert g_graph["lr"].item() == pytest.approx(g_eager["lr"], rel=1e-12)

"""train.py end to end on a tiny IDX dataset written here, through the real loading code; no network."""
import json
import shutil
from pathlib import Path

import pytest
import torch

import train
from tests.conftest import SHARED_MNIST, write_split

FAST = ["--hidden", "16", "--depth", "2", "--batch-size", "32", "--no-download", "--quiet"]


def run(*argv):
    return train.main([str(a) for a in argv])


def test_end_to_end_both_impls_agree_and_write_outputs(tiny, tmp_path):
    out = tmp_path / "run"
    with pytest.warns(UserWarning, match="not the official"):  # our tiny .gz files are not MNIST's
        code = run("--data-dir", tiny, "--out", out, "--epochs", "2", "--dtype", "float64", "--monitor",
                   "--log-interval", "3", "--clip-grad", "1.0", "--lr", "0.01", *FAST)
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"dataset", "epochs", "results", "max_param_abs_diff"}
    assert summary["dataset"] == "mnist" and summary["epochs"] == 2
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
    drift = [r for r in recs if r["type"] == "drift"]
    assert [r["epoch"] for r in drift] == [1, 2] and all(r["max_param_abs_diff"] < 1e-10 for r in drift)
    mon = [r for r in recs if r["type"] == "step"]
    assert mon and all(r["grad_norm_after_clip"] <= 1.0 + 1e-6 for r in mon)
    assert all(r["grad_norm_before_clip"] >= r["grad_norm_after_clip"] - 1e-12 for r in mon)
    assert set(mon[0]["params"]["layers.0.weight"]) == {"grad_mean", "grad_std", "grad_norm", "param_mean",
                                                        "param_std", "param_norm"}
    for png in ("curves.png", "grad_norms.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] == 2 and set(ckpt["models"]) == {"manual", "torch"}


def test_all_three_implementations_agree(tiny, tmp_path):
    out = tmp_path / "run"
    assert run("--data-dir", tiny, "--out", out, "--epochs", "2", "--impl", "all", "--dtype", "float64",
               "--monitor", "--log-interval", "4", *FAST) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["results"]) == ["manual", "engine", "torch"]
    assert summary["max_param_abs_diff"] < 1e-10
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


@pytest.mark.parametrize("dtype,impl", [("float32", "both"), ("float64", "all")])
def test_resume_equals_uninterrupted(tiny, tmp_path, dtype, impl):
    common = ["--data-dir", tiny, "--dtype", dtype, "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.05",
              "--impl", impl, *FAST]
    assert run(*common, "--out", tmp_path / "straight", "--epochs", "2") == 0
    assert run(*common, "--out", tmp_path / "half", "--epochs", "1") == 0
    assert run("--resume", tmp_path / "half" / "checkpoint.pt", "--epochs", "2", "--data-dir", tiny, "--quiet",
               "--no-download") == 0
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


def test_resume_refuses_changed_settings(tiny, tmp_path):
    assert run("--data-dir", tiny, "--out", tmp_path / "r", "--epochs", "1", *FAST) == 0
    ckpt = tmp_path / "r" / "checkpoint.pt"
    assert run("--resume", ckpt, "--epochs", "2", "--hidden", "32", "--data-dir", tiny, "--no-download") == 2
    assert run("--resume", ckpt, "--epochs", "1", "--data-dir", tiny, "--no-download") == 2
    assert run("--resume", tmp_path / "nope.pt", "--epochs", "2") == 2


def test_non_finite_loss_stops_and_keeps_last_checkpoint(tiny, tmp_path, capsys):
    out = tmp_path / "r"
    assert run("--data-dir", tiny, "--out", out, "--epochs", "1", *FAST) == 0
    before = (out / "checkpoint.pt").read_bytes()
    code = run("--data-dir", tiny, "--out", out, "--epochs", "3", "--optimizer", "sgd", "--lr", "1e30", *FAST)
    assert code == 1
    err = capsys.readouterr().err
    assert "manual: the training loss became" in err and "epoch 1, step" in err
    assert (out / "checkpoint.pt").read_bytes() == before
    assert not list(out.glob(".*tmp*"))


def test_ctrl_c_leaves_the_last_complete_checkpoint(tiny, tmp_path, monkeypatch, capsys):
    real = train.train_epoch

    def interrupt_in_epoch_2(impl, data, perm, epoch, args, log):
        if epoch == 2:
            raise KeyboardInterrupt
        return real(impl, data, perm, epoch, args, log)

    monkeypatch.setattr(train, "train_epoch", interrupt_in_epoch_2)
    out = tmp_path / "r"
    assert run("--data-dir", tiny, "--out", out, "--epochs", "3", *FAST) == 130
    assert "last complete checkpoint" in capsys.readouterr().err
    assert torch.load(out / "checkpoint.pt", weights_only=True)["epoch"] == 1
    assert not list(out.glob(".*tmp*"))


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    train.save_checkpoint(path, {"epoch": 1})

    def broken_save(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        train.save_checkpoint(path, {"epoch": 2})
    assert torch.load(path, weights_only=True) == {"epoch": 1}
    assert list(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize("argv,match", [
    (["--epochs", "-1"], "--epochs -1 is out of range"),
    (["--batch-size", "0"], "--batch-size 0 is out of range"),
    (["--optimizer", "adamax"], "unknown optimizer 'adamax'; known: sgd, rmsprop, adam, adamw, adagrad"),
    (["--lr", "-1"], "--lr -1.0 is out of range"),
    (["--dataset", "cifar"], "invalid choice: 'cifar'"),
    (["--epochs", "two"], "invalid int value: 'two'"),
    (["--momentum", "0.9"], "--momentum applies to sgd and rmsprop, not adam"),
    (["--device", "tpu"], "--device"),
])
def test_bad_arguments_exit_2_with_one_line(argv, match, capsys):
    assert run(*argv) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_exits_2(capsys):
    assert run("--device", "cuda") == 2
    assert "sees no CUDA device" in capsys.readouterr().err


def test_missing_data_says_where_it_looked_and_how_to_fix(tmp_path, capsys):
    code = run("--data-dir", tmp_path / "empty", "--no-download", "--quiet")
    assert code == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "empty" / "MNIST" / "raw") in err
    assert "apt-get install -y dataset-fashion-mnist" in err and "Traceback" not in err


def test_missing_data_with_download_failure_is_the_same_message(tmp_path, monkeypatch, capsys):
    from torchvision import datasets

    def no_network(self):
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz")
    monkeypatch.setattr(datasets.MNIST, "download", no_network)
    assert run("--data-dir", tmp_path / "empty", "--quiet") == 2
    err = capsys.readouterr().err
    assert "torchvision download" in err and "missing train-images-idx3-ubyte" in err


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_idx_file(tiny, tmp_path, damage, capsys):
    f = tiny / "MNIST" / "raw" / "t10k-images-idx3-ubyte"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"\x00\x00\x01\x01garbage")
    assert run("--data-dir", tiny, *FAST) == 2
    err = capsys.readouterr().err
    assert "corrupt or truncated" in err and str(f) in err and "Traceback" not in err


def test_corrupt_gzip(tiny, capsys):
    (tiny / "MNIST" / "raw" / "train-labels-idx1-ubyte.gz").write_bytes(b"not gzip at all")
    assert run("--data-dir", tiny, *FAST) == 2
    assert "not a readable gzip file" in capsys.readouterr().err


def test_fashion_mnist_found_in_debian_location(tmp_path, monkeypatch):
    debian = tmp_path / "debian"
    write_split(debian, "train", 120, 2, compress=True)
    write_split(debian, "t10k", 40, 3, compress=True)
    monkeypatch.setattr(train, "DEBIAN_FASHION", debian)
    out = tmp_path / "run"
    assert run("--dataset", "fashion-mnist", "--data-dir", tmp_path / "data", "--out", out, "--epochs", "1", *FAST) == 0
    raw = tmp_path / "data" / "FashionMNIST" / "raw"
    assert sorted(p.name for p in raw.iterdir()) == sorted(n for pair in train.SPLIT_FILES.values() for n in pair)
    assert json.loads((out / "summary.json").read_text())["dataset"] == "fashion-mnist"


def test_data_is_normalised_with_training_statistics(tiny):
    args = train.parse_args(["--data-dir", str(tiny), "--no-download", "--val-split", "30"])
    data = train.load_data(args, torch.device("cpu"), torch.float64, say=lambda *a: None)
    assert data.train_x.shape == (270, 784) and data.val_x.shape == (30, 784) and data.test_x.shape == (80, 784)
    assert abs(data.train_x.mean().item()) < 1e-12 and abs(data.train_x.std().item() - 1) < 1e-12
    again = train.load_data(args, torch.device("cpu"), torch.float64, say=lambda *a: None)
    assert torch.equal(again.val_y, data.val_y)  # the split is seeded


@pytest.mark.skipif(not (SHARED_MNIST / "t10k-images-idx3-ubyte.gz").is_file(),
                    reason=f"real MNIST test split not found at {SHARED_MNIST}")
def test_real_mnist_test_split_loads(tmp_path, recwarn):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(SHARED_MNIST / name, raw / name)
    found = train.prepare_raw(tmp_path, "mnist", train=False, download=False)
    assert not [w for w in recwarn if "MD5" in str(w.message)]  # the official files pass the MD5 check
    images, labels = train.read_split(found, train=False)
    assert images.shape == (10000, 28, 28) and images.dtype == torch.uint8
    assert labels[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]  # the well-known first test digits
    assert torch.bincount(labels).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_real_sigint_keeps_a_loadable_checkpoint(tiny, tmp_path):
    """Send Ctrl-C (SIGINT) to a running train.py: exit 130, the last complete checkpoint intact."""
    import signal
    import subprocess
    import sys
    import time
    out = tmp_path / "r"
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "train.py", "--data-dir", str(tiny), "--out", str(out),
                             "--epochs", "100000", *FAST], cwd=root, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not (out / "checkpoint.pt").exists():
            assert proc.poll() is None and time.time() < deadline, "train.py ended or wrote no checkpoint"
            time.sleep(0.05)
        time.sleep(0.3)  # let it get somewhere into later epochs (and maybe into a checkpoint write)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "last complete checkpoint" in err
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] >= 1 and set(ckpt["models"]) == {"manual", "torch"}
    assert not list(out.glob(".*tmp*"))

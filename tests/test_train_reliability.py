"""What the trainer guarantees about its files: one run per output folder (an OS lock, real processes here), no
run written over another, checkpoints that prove their bytes and hold only possible values, resume only on the
data trained on, a full disk reported in one line with the last checkpoint intact, no leftovers."""

import errno
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import train
import training
import training.storage.files
import training.tasks.image
import training.trainer
from tests.conftest import wait_for, write_split

ROOT = Path(__file__).resolve().parents[1]
FAST = [
    "--dataset",
    "mnist",
    "--hidden",
    "16",
    "--depth",
    "2",
    "--batch-size",
    "32",
    "--no-download",
    "--quiet",
    "--no-plots",
]


def run(*argv):
    return train.main([str(a) for a in argv])


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def train_py(*argv, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "train.py", *map(str, argv)],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        **kw,
    )


def logged_a_step(out: Path) -> bool:
    path = out / "metrics.jsonl"
    return path.exists() and '"step"' in path.read_text()


# --- one run per output folder ---------------------------------------------------------------------------------


def test_a_second_run_on_a_busy_folder_exits_2_naming_the_holder_and_a_killed_run_leaves_no_stale_lock(tiny, tmp_path):
    out = tmp_path / "R"
    first = train_py(
        "--data-dir", tiny, "--out", out, "--epochs", "100000", "--log-interval", "1", "--seed", "1", *FAST
    )
    try:
        wait_for(lambda: logged_a_step(out), first, "the first run logged a step")
        second = subprocess.run(
            [
                sys.executable,
                "train.py",
                "--data-dir",
                str(tiny),
                "--out",
                str(out),
                "--epochs",
                "2",
                "--seed",
                "2",
                *FAST,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert first.poll() is None  # still running, untouched
    finally:
        first.kill()
        first.communicate(timeout=60)
    assert second.returncode == 2, second.stderr
    err = second.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert f"--out {out} is in use by another run (pid {first.pid} on " in err
    # SIGKILL left no stale lock, and the temporary file of a write it may have been in is cleaned up.
    (out / ".checkpoint.pt.tmp99999").write_bytes(b"half a checkpoint")
    assert run("--data-dir", tiny, "--out", out, "--epochs", "1", "--overwrite", *FAST) == 0
    assert not list(out.glob(".*.tmp*"))
    assert json.loads((out / "summary.json").read_text())["epochs"] == 1


def test_two_runs_started_together_on_one_folder_one_runs_the_other_is_refused(tiny, tmp_path):
    """The race of the issue: `--epochs 3 --seed 1 & --epochs 2 --seed 2` into one --out.  Whichever wins (by the
    lock, or by finding the other's finished run), the folder holds one run's files only."""
    out = tmp_path / "R"
    procs = {
        seed: train_py("--data-dir", tiny, "--out", out, "--epochs", 1 + seed, "--seed", seed, *FAST) for seed in (1, 2)
    }
    codes = {}
    for seed, proc in procs.items():
        try:
            codes[seed] = proc.wait(timeout=240)
        finally:
            proc.kill()
    errs = {seed: proc.stderr.read() for seed, proc in procs.items()}
    assert sorted(codes.values()) == [0, 2], errs
    winner = next(seed for seed, code in codes.items() if code == 0)
    loser = 3 - winner
    assert str(out) in errs[loser] and (
        "is in use by another run" in errs[loser] or "already holds a run" in errs[loser]
    ), errs[loser]
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ckpt["config"]["seed"] == winner and ckpt["epoch"] == 1 + winner
    assert json.loads((out / "summary.json").read_text())["epochs"] == 1 + winner
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    strip = lambda rs: [{k: v for k, v in r.items() if k != "seconds"} for r in rs]  # noqa: E731
    assert strip(metrics) == strip(ckpt["records"])


def test_a_fresh_run_over_an_old_one_is_refused_until_resume_or_overwrite(tiny, tmp_path, capsys):
    out = tmp_path / "R"
    assert run("--data-dir", tiny, "--out", out, "--epochs", "1", "--seed", "1", *FAST) == 0
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    capsys.readouterr()
    assert run("--data-dir", tiny, "--out", out, "--epochs", "2", "--seed", "2", *FAST) == 2
    err = one_line(capsys)
    assert f"--out {out} already holds a run (checkpoint.pt, metrics.jsonl, summary.json)" in err
    assert f"continue it with --resume {out / 'checkpoint.pt'}, replace it with --overwrite" in err
    # --overwrite replaces the run only once the new one starts: refused for missing data, it changes nothing.
    assert run("--data-dir", tmp_path / "nothing", "--out", out, "--overwrite", *FAST) == 2
    capsys.readouterr()
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
    assert run("--resume", out / "checkpoint.pt", "--out", out, "--overwrite", "--data-dir", tiny, *FAST) == 2
    assert "--overwrite would delete the checkpoint that --resume" in one_line(capsys)
    assert run("--data-dir", tiny, "--out", out, "--epochs", "2", "--seed", "2", "--overwrite", "--monitor", *FAST) == 0
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    assert ckpt["config"]["seed"] == 2 and ckpt["epoch"] == 2
    assert json.loads((out / "summary.json").read_text())["epochs"] == 2
    assert {json.loads(line)["epoch"] for line in (out / "metrics.jsonl").read_text().splitlines()} == {1, 2}
    # A monitored run's extra files count as a run too.
    for name in ("checkpoint.pt", "summary.json", "metrics.jsonl"):
        (out / name).unlink()
    assert run("--data-dir", tiny, "--out", out, *FAST) == 2
    assert "already holds a run (monitor_manual.jsonl, monitor_torch.jsonl); replace it with --overwrite" in one_line(
        capsys
    )


def test_a_refused_run_creates_no_folder(tmp_path):
    out = tmp_path / "runs" / "new"
    assert run("--data-dir", tmp_path / "empty", "--out", out, *FAST) == 2
    assert not (tmp_path / "runs").exists()


# --- checkpoints prove their bytes ---------------------------------------------------------------------------


@pytest.fixture
def one_epoch(tiny, tmp_path):
    """A finished one-epoch run of --epochs 2 cut short: R/checkpoint.pt to resume."""
    out = tmp_path / "R"
    assert run("--data-dir", tiny, "--out", out, "--epochs", "1", "--optimizer", "adam", *FAST) == 0
    return out / "checkpoint.pt"


def resume(ckpt, tiny, *extra):
    return run("--resume", ckpt, "--epochs", "2", "--data-dir", tiny, "--no-download", "--quiet", "--no-plots", *extra)


def test_a_checkpoint_is_a_zip_sealed_with_its_sha256_and_still_loads_with_torch(one_epoch):
    data = one_epoch.read_bytes()
    comment = zipfile.ZipFile(one_epoch).comment
    assert comment.startswith(b"handgrad-sha256:") and len(comment) == 80
    assert training.unseal(data) == comment[-64:].decode()
    assert torch.load(one_epoch, weights_only=True)["format"] == training.FORMAT


def test_flipped_bytes_in_a_checkpoint_are_refused_in_one_line(one_epoch, tiny, capsys):
    data = bytearray(one_epoch.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 200] = bytes(b ^ 0xFF for b in data[middle : middle + 200])
    one_epoch.write_bytes(bytes(data))
    capsys.readouterr()
    assert resume(one_epoch, tiny) == 2
    err = one_line(capsys)
    assert f"--resume {one_epoch} is damaged: its SHA-256 is" in err and "not the" in err


def test_a_checkpoint_records_its_own_size_near_its_start(one_epoch):
    data = one_epoch.read_bytes()
    assert training.storage.checkpoint.recorded_size(data) == len(data)
    assert data.find(b"handgrad-checkpoint-bytes:") < 200  # in the archive's first record, data.pkl
    assert torch.load(one_epoch, weights_only=True)["size"] == f"handgrad-checkpoint-bytes:{len(data):020d}"


@pytest.mark.parametrize("missing", [3212, 40, 1, "half"])
def test_a_truncated_checkpoint_is_refused_with_both_sizes(one_epoch, tiny, capsys, missing):
    """Said plainly, not as "not a handgrad checkpoint (ValueError: negative seek value -3212)"."""
    data = one_epoch.read_bytes()
    keep = len(data) // 2 if missing == "half" else len(data) - missing
    one_epoch.write_bytes(data[:keep])
    capsys.readouterr()
    assert resume(one_epoch, tiny) == 2
    assert one_line(capsys) == (
        f"train.py: error: --resume {one_epoch} is truncated: it has {keep} bytes, but it was written with "
        f"{len(data)} (the last {len(data) - keep} are missing: a copy or download cut short?); resume from an "
        f"intact copy or start again"
    )


def test_a_truncated_checkpoint_of_a_format_without_its_size_says_truncated(one_epoch, tiny, capsys):
    ckpt = torch.load(one_epoch, weights_only=True)
    del ckpt["size"]
    ckpt["format"] = "handgrad-train-4"
    buffer = io.BytesIO()
    torch.save(ckpt, buffer)
    data = training.seal(buffer.getvalue())
    one_epoch.write_bytes(data[:-3212])
    capsys.readouterr()
    assert resume(one_epoch, tiny) == 2
    err = one_line(capsys)
    assert (
        f"--resume {one_epoch} is truncated: it begins as a checkpoint does (a zip archive) but its "
        f"{len(data) - 3212} bytes end before the archive does (a checkpoint written before format 5 does not "
        f"record its size, so how much is missing is unknown)"
    ) in err


def test_a_changed_digest_shows_where_the_two_differ(one_epoch, tiny, capsys):
    """Two digests that differ after their 16th hex digit do not show as two equal 16-digit prefixes."""
    data = bytearray(one_epoch.read_bytes())
    stored = data[-64:].decode()
    changed = stored[:39] + ("0" if stored[39] != "0" else "1") + stored[40:]  # hex digit 40 of 64
    data[-64:] = changed.encode()
    one_epoch.write_bytes(bytes(data))
    capsys.readouterr()
    assert resume(one_epoch, tiny) == 2
    err = one_line(capsys)
    assert (
        f"is damaged: its SHA-256 is {stored[:48]}..., not the {changed[:48]}... written with it (they first "
        f"differ at hex digit 40 of 64)"
    ) in err


@pytest.mark.parametrize(
    "old_format,transposed", [("handgrad-train-3", ("manual", "engine")), ("handgrad-train-4", ("engine",))]
)
def test_a_checkpoint_from_before_the_engine_kept_out_in_weights_resumes_as_the_run_would_have_gone_on(
    tiny, tmp_path, capsys, old_format, transposed
):
    """Formats up to 4 kept the autodiff engine's Linear weights (and so its optimizer state) as (in, out); up to 3
    the hand-written ones too.  --hidden 16 --depth 2 has a square (16, 16) weight: a state loaded untransposed
    there would train silently wrong, not fail."""
    from tests.test_train import _run_first_epoch_only

    common = ["--data-dir", tiny, "--dtype", "float64", "--optimizer", "adam", "--impl", "all", *FAST]
    assert run(*common, "--out", tmp_path / "straight", "--epochs", "2") == 0
    _run_first_epoch_only(common, tmp_path / "half")
    path = tmp_path / "half" / "checkpoint.pt"
    ckpt = torch.load(path, weights_only=True)
    ckpt["format"] = old_format
    del ckpt["size"]
    for name in transposed:
        state = ckpt["optimizers"][name]["state"]
        for i in (0, 2, 4):  # layers.{0,1,2}.weight
            state[i] = {
                k: v.t().contiguous() if isinstance(v, torch.Tensor) and v.dim() == 2 else v
                for k, v in state[i].items()
            }
    buffer = io.BytesIO()
    torch.save(ckpt, buffer)
    path.write_bytes(training.seal(buffer.getvalue()))
    capsys.readouterr()
    assert run("--resume", path, "--data-dir", tiny, "--no-download", "--no-plots") == 0
    out = capsys.readouterr().out
    for name in transposed:
        assert f"the optimizer state of 3 Linear weight(s) of '{name}' was transposed to match" in out
    a = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=True)
    b = torch.load(path, weights_only=True)
    assert b["format"] == training.FORMAT
    for name in ("manual", "engine", "torch"):
        for k, v in a["models"][name].items():
            assert torch.equal(v, b["models"][name][k]), (name, k)


def test_a_checkpoint_rewritten_without_its_checksum_is_refused(one_epoch, tiny, capsys):
    torch.save(torch.load(one_epoch, weights_only=True), one_epoch)
    capsys.readouterr()
    assert resume(one_epoch, tiny) == 2
    assert "carries no checksum" in one_line(capsys)


def test_a_checkpoint_of_the_previous_format_still_resumes(one_epoch, tiny):
    """Format 2 had no checksum and no data fingerprint: it is read without those checks."""
    ckpt = torch.load(one_epoch, weights_only=True)
    ckpt["format"] = "handgrad-train-2"
    del ckpt["data"]
    torch.save(ckpt, one_epoch)
    assert resume(one_epoch, tiny) == 0
    again = torch.load(one_epoch, weights_only=True)
    assert again["epoch"] == 2 and again["format"] == training.FORMAT and again["data"]


def _first_key(ckpt):
    return next(iter(ckpt["models"]["manual"]))


def _adam_state(ckpt):
    return ckpt["optimizers"]["manual"]["state"][0]


CRAFTED = {
    "negative epoch": (lambda c: c.update(epoch=-1), "'epoch' is -1"),
    "epoch not a number": (lambda c: c.update(epoch="1"), "'epoch' is of type str, not int"),
    "records beyond its epochs": (
        lambda c: c["records"].append({"type": "epoch", "epoch": 7}),
        "is of epoch 7, outside the checkpoint's epochs 1..1",
    ),
    "optimizer steps beyond its epochs": (
        lambda c: _adam_state(c).update(step=torch.tensor(1e6)),
        "'optimizers.manual' parameter 0 has taken 1e+06 steps, outside the 0..9",
    ),
    "settings failing validation": (
        lambda c: c["config"].update(batch_size=0),
        "the checkpoint's settings are impossible: --batch-size 0 is out of range",
    ),
    "missing key": (lambda c: c.pop("rng"), "the checkpoint has no 'rng'"),
    "missing weight": (lambda c: c["models"]["manual"].pop(_first_key(c)), "'models.manual' has no '"),
    "mis-shaped weight": (
        lambda c: c["models"]["manual"].update({_first_key(c): torch.zeros(3, 3)}),
        "has shape (3, 3), the model's is (16, 784)",
    ),
    "non-finite weight": (lambda c: c["models"]["torch"][_first_key(c)].fill_(float("nan")), "holds inf or nan"),
    "mis-shaped optimizer state": (
        lambda c: _adam_state(c).update(exp_avg_sq=torch.ones(1)),
        "'optimizers.manual' does not fit this run (ValueError: Adam.load_state_dict: "
        "parameter 0 (param_groups[0]['params'][0]) has shape (16, 784) but its saved "
        "'exp_avg_sq' has shape (1,)",
    ),
    "missing implementation": (lambda c: c["optimizers"].pop("torch"), "the checkpoint has no 'optimizers.torch'"),
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_a_crafted_checkpoint_is_refused_naming_the_field(one_epoch, tiny, capsys, case):
    """Sealed by training.save_checkpoint, so the checksum passes: the values themselves are checked."""
    edit, message = CRAFTED[case]
    ckpt = torch.load(one_epoch, weights_only=True)
    edit(ckpt)
    training.save_checkpoint(one_epoch, ckpt)
    capsys.readouterr()
    assert resume(one_epoch, tiny) == 2
    err = one_line(capsys)
    assert f"--resume {one_epoch}" in err and message in err, err


def test_resuming_on_other_data_is_refused_naming_both(one_epoch, tiny, capsys):
    raw = tiny / "MNIST" / "raw"
    ckpt = torch.load(one_epoch, weights_only=True)
    images, labels = training.read_split(raw, train=True)
    assert ckpt["data"]["train_images"] == training.fingerprint({"train_images": images})["train_images"]
    assert ckpt["data"]["train_labels"]["shape"] == [300]
    for f in raw.glob("train-*"):
        f.unlink()
    write_split(raw, "train", 300, seed=5, compress=False)  # the same name and size, other images
    capsys.readouterr()
    assert resume(one_epoch, tiny) == 2
    err = one_line(capsys)
    old = ckpt["data"]["train_images"]["sha256"][:12]
    assert f"the checkpoint was trained on other data than --data-dir {tiny} holds" in err
    assert f"train_images: uint8 (300, 28, 28) sha256 {old}... vs uint8 (300, 28, 28) sha256 " in err


def test_leftover_temporary_files_are_removed_at_the_next_start(one_epoch, tiny):
    leftover = one_epoch.parent / f".checkpoint.pt.tmp{2**22 + 1}"  # what a SIGKILL during the write leaves
    leftover.write_bytes(b"half a checkpoint")
    assert resume(one_epoch, tiny) == 0
    assert not leftover.exists() and torch.load(one_epoch, weights_only=True)["epoch"] == 2


# --- a full disk ---------------------------------------------------------------------------------------------


class _FullDisk(io.RawIOBase):
    """A file that takes ``room`` bytes, then fails as a full disk does (ENOSPC)."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def writable(self):
        return True

    def write(self, b):
        if len(b) > self.room:
            self.f.write(bytes(b[: self.room]))
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(b)
        return self.f.write(b)

    def fileno(self):
        return self.f.fileno()

    def flush(self):
        self.f.flush()

    def close(self):
        if not self.closed:
            super().close()  # flushes
            self.f.close()


def test_a_full_disk_while_writing_a_checkpoint_is_one_line_and_keeps_the_last_one(tiny, tmp_path, monkeypatch, capsys):
    out = tmp_path / "R"
    writes = []

    def fill_at_the_second_checkpoint(path, mode="r", *a, **k):
        f = open(path, mode, *a, **k)  # noqa: SIM115 (returned to the writer, which closes it)
        if Path(path).name.startswith(".checkpoint.pt.tmp"):
            writes.append(path)
            if len(writes) == 2:
                return _FullDisk(f, room=1000)
        return f

    monkeypatch.setattr(training.storage.files, "open", fill_at_the_second_checkpoint, raising=False)
    assert run("--data-dir", tiny, "--out", out, "--epochs", "3", *FAST) == 1
    err = one_line(capsys)
    assert err == (
        f"train.py: error: cannot write {out / 'checkpoint.pt'}: No space left on device (the disk is "
        f"full); the previous checkpoint.pt there is intact; the last complete checkpoint is "
        f"{out / 'checkpoint.pt'} (epoch 1)"
    )
    assert torch.load(out / "checkpoint.pt", weights_only=True)["epoch"] == 1
    assert not list(out.glob(".*.tmp*"))  # the partial temporary file is gone


def test_a_full_disk_while_logging_is_one_line(tiny, tmp_path, monkeypatch, capsys):
    out = tmp_path / "R"

    def full_metrics(path, mode="r", *a, **k):
        if mode != "a":
            return open(path, mode, *a, **k)
        return io.TextIOWrapper(_FullDisk(open(path, "ab", buffering=0), room=300), write_through=True)

    monkeypatch.setattr(training.trainer, "open", full_metrics, raising=False)
    assert run("--data-dir", tiny, "--out", out, "--epochs", "2", "--log-interval", "1", *FAST) == 1
    err = one_line(capsys)
    assert err == (
        f"train.py: error: cannot write {out / 'metrics.jsonl'}: No space left on device (the disk is "
        f"full); its complete lines are kept (--resume rewrites it); no checkpoint was written yet"
    )


def test_a_model_too_large_for_memory_is_one_line(tiny, tmp_path, capsys):
    assert (
        run(
            "--data-dir",
            tiny,
            "--out",
            tmp_path / "R",
            "--device",
            "cpu",
            "--hidden",
            10**9,
            "--depth",
            1,
            "--dataset",
            "mnist",
            *FAST[6:],
        )
        == 2
    )
    err = one_line(capsys)
    assert "--hidden 1000000000 --depth 1: the models do not fit in the memory of cpu (torch could not allocate" in err
    assert not (tmp_path / "R").exists()


# --- Ctrl-C during start-up ----------------------------------------------------------------------------------


def test_ctrl_c_while_train_py_imports_torch_is_one_line(tmp_path):
    """A real SIGINT, sent by the process to itself when train.py starts importing the training package."""
    script = (
        "import builtins, os, runpy, signal, sys\n"
        "real = builtins.__import__\n"
        "def hook(name, *a, **k):\n"
        "    if name == 'training':\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = hook\n"
        "sys.argv = ['train.py', '--out', sys.argv[1]]\n"
        "runpy.run_path('train.py', run_name='__main__')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "R")], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert r.returncode == 130, r.stderr[-3000:]
    assert r.stderr.strip() == "interrupted"
    assert not (tmp_path / "R").exists()


def test_ctrl_c_while_loading_data_is_one_line_and_leaves_no_folder(tiny, tmp_path, monkeypatch, capsys):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(training.tasks.image, "load_data", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run("--data-dir", tiny, "--out", tmp_path / "R", *FAST)
    assert capsys.readouterr().err.strip() == "interrupted"
    assert not (tmp_path / "R").exists()

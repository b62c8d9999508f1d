"""Every file a run writes goes through the atomic writer, so a full disk while writing a figure is the one line
docs/reliability.md promises; and a run without --out gets a folder no other run started in the same second gets."""

from __future__ import annotations

import builtins
import os
import time

import pytest

import train
import training.storage.files
import training.storage.output
from tests.test_train_reliability import FAST, _FullDisk, one_line

TINY = [a for a in FAST if a != "--no-plots"]


def run(*argv):
    return train.main([str(a) for a in argv])


def _full_disk_for(monkeypatch, name: str) -> None:
    """Any file whose name ends in ``name`` (itself or the atomic writer's ``.NAME.tmpPID``) fills the disk after
    200 bytes, however it is opened (matplotlib opens a path itself)."""
    real = builtins.open

    def opened(path, mode="r", *a, **k):
        f = real(path, mode, *a, **k)
        stem = os.path.basename(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else ""
        if "w" in mode and "b" in mode and (stem == name or stem.startswith(f".{name}.tmp")):
            return _FullDisk(f, room=200)
        return f

    monkeypatch.setattr(builtins, "open", opened)
    monkeypatch.setattr(training.storage.files, "open", opened, raising=False)


@pytest.mark.parametrize("name, extra", [("curves.png", []), ("monitor_grad_norm_total.png", ["--monitor"])])
def test_a_full_disk_while_writing_a_figure_is_one_line(tiny, tmp_path, monkeypatch, capsys, name, extra):
    out = tmp_path / "R"
    _full_disk_for(monkeypatch, name)
    assert run("--data-dir", tiny, "--out", out, "--epochs", "1", *extra, *TINY) == 1
    err = one_line(capsys)
    assert err == (
        f"train.py: error: cannot write {out / name}: No space left on device (the disk is full); "
        f"the last complete checkpoint is {out / 'checkpoint.pt'} (epoch 1)"
    )
    assert not (out / name).exists() and not list(out.glob(".*.tmp*"))  # no half figure, no temporary file


def _frozen_clock(monkeypatch) -> None:
    real = time.strftime
    monkeypatch.setattr(
        time, "strftime", lambda fmt, *t: "20260102-030405" if fmt == "%Y%m%d-%H%M%S" and not t else real(fmt, *t)
    )


def test_two_runs_in_the_same_second_without_out_get_two_folders(tiny, tmp_path, monkeypatch, capsys):
    _frozen_clock(monkeypatch)
    monkeypatch.chdir(tmp_path)
    argv = ["--data-dir", tiny, "--epochs", "1", *FAST]
    assert run(*argv) == 0 and run(*argv) == 0  # the second is not refused as the first's folder
    folders = sorted((tmp_path / "runs").iterdir())
    assert len(folders) == 2 and all((f / "checkpoint.pt").exists() for f in folders)
    assert all(f.name.startswith("20260102-030405-") for f in folders)


def test_default_folders_differ_across_processes_and_calls_with_a_frozen_clock(tmp_path, monkeypatch):
    _frozen_clock(monkeypatch)
    names = {training.storage.output.default_out(tmp_path) for _ in range(3)}
    monkeypatch.setattr(os, "getpid", lambda: 1)  # another process, started in the same second
    names.add(training.storage.output.default_out(tmp_path))
    assert len(names) == 4
    (tmp_path / "20260102-030405-2").mkdir()  # a folder of that name already there (a pid used again)
    assert training.storage.output.default_out(tmp_path) != tmp_path / "20260102-030405-2"

"""Every ``python -m learn check`` command that the learner's mode prints works as printed from where the README has
the learner stand (the checkout) and from anywhere else: it finds the file it names (the work folder's NAME.py needs
no name; any other file is named by its absolute path)."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from learn.exercises import BY_NAME
from learn.files import check_command
from learn.source import solution_text

ROOT = Path(__file__).resolve().parents[1]


def learn(args: list[str], cwd: Path, work: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "learn", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HANDGRAD_LEARN_DIR": str(work), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )


def test_the_default_file_needs_no_name_and_any_other_is_absolute(tmp_path, monkeypatch):
    monkeypatch.setenv("HANDGRAD_LEARN_DIR", str(tmp_path))
    assert check_command("linear") == "python -m learn check linear"
    assert check_command("linear", tmp_path / "linear.py") == "python -m learn check linear"
    monkeypatch.chdir(tmp_path)
    assert check_command("linear", "linear.py") == "python -m learn check linear"  # the same file, named relatively
    assert check_command("relu", "linear.py") == f"python -m learn check relu {tmp_path / 'linear.py'}"
    odd = tmp_path / "my work" / "relu.py"
    assert shlex.split(check_command("relu", odd))[-1] == str(odd)  # quoted for the shell


@pytest.mark.parametrize("command", [["why", "linear"], ["progress"], ["list"], ["start", "linear"]])
def test_each_printed_check_command_runs_as_printed_from_the_checkout(tmp_path, command):
    work = tmp_path / "work"
    work.mkdir()
    if command[0] != "start":
        (work / "linear.py").write_text(solution_text(BY_NAME["linear"], str(work / "linear.py")))
    out = learn(command, ROOT, work)
    assert out.returncode == 0, out.stderr
    printed = re.findall(r"python -m learn check [^;)\n]*?(?=\)|;|\n| says| tries|$)", out.stdout)
    assert printed, f"learn {' '.join(command)} printed no check command:\n{out.stdout}"
    for line in printed:
        words = shlex.split(line)
        for cwd in (ROOT, tmp_path):
            r = learn(words[3:], cwd, work)
            assert r.returncode in (0, 1), f"{line!r}, run in {cwd}, could not check: {r.stderr or r.stdout}"
            assert "does not exist" not in r.stdout + r.stderr

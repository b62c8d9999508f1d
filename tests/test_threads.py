"""When --threads is not given, torch's thread count is the cores the 1-minute load average leaves free (at least
one, at most torch's default), $OMP_NUM_THREADS is kept, and the start-up line says what was chosen and why."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from training.threads import choose_threads, use_threads

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "load, cores, default, want",
    [(0.2, 2, 2, 2), (0.6, 2, 2, 1), (5.3, 2, 2, 1), (1.4, 8, 8, 7), (3.0, 16, 8, 8), (0.0, 4, 1, 1)],
)
def test_the_count_is_the_cores_the_load_leaves_free(monkeypatch, load, cores, default, want):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads, why = choose_threads(None, load=load, cores=cores, default=default)
    assert threads == want
    assert f"load average {load:.2f} on {cores} cores" in why
    assert ("--threads N to choose" in why) == (want < default)


def test_given_threads_and_omp_num_threads_are_kept(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert choose_threads(3, load=9.0, cores=2, default=2) == (3, "--threads")
    with pytest.raises(ValueError, match="--threads 0 is out of range"):
        choose_threads(0)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert choose_threads(None, load=9.0, cores=2, default=2) == (2, "$OMP_NUM_THREADS")


def test_use_threads_reads_this_machines_load_and_says_so(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (7.5, 7.0, 6.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        line = use_threads(None)
        assert torch.get_num_threads() == 1
        assert line == (
            "1 CPU thread, load average 7.50 on 2 cores: more threads would wait on each other; --threads N to choose"
        )
        assert use_threads(2) == "2 CPU threads" and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_benchmark_prints_the_count_it_chose():
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | {"PYTHONPATH": str(ROOT)}
    code = (
        "import sys; sys.path.insert(0, 'benchmarks'); import timing\n"
        "a = timing.parser('a benchmark').parse_args([])\nprint('threads', a.threads)"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    first, last = r.stdout.splitlines()[0], r.stdout.splitlines()[-1]
    assert first.startswith("threads: ") and " CPU thread" in first and "load average" in first, r.stdout
    assert int(last.split()[1]) == int(first.split()[1])


def test_learn_train_says_its_threads(tmp_path, capsys):
    from learn.__main__ import main
    from learn.exercises import BY_NAME
    from learn.source import solution_text

    path = tmp_path / "relu.py"
    path.write_text(solution_text(BY_NAME["relu"], str(path)))
    before = torch.get_num_threads()
    try:
        assert main(["train", "relu", str(path), "--steps", "2", "--threads", "1"]) == 0
        assert capsys.readouterr().out.startswith("torch on 1 CPU thread\n")
    finally:
        torch.set_num_threads(before)
    assert main(["train", "relu", str(path), "--threads", "0"]) == 2
    assert capsys.readouterr().err.strip() == "python -m learn train: --threads 0 is out of range (at least 1)"

"""Distributed failures without torchrun's supervision, as real train.py processes on 127.0.0.1 (env://
rendezvous, as torchrun sets it up): a peer killed, stopped past --dist-timeout, never joining, or started with
other settings or data.  Every rank's last word is one line naming the rank and what happened, within bounded
time.  The waits here are --dist-timeout's own, not sleeps: these tests pass on a loaded machine."""

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import wait_for, write_split, write_tiny_mnist

ROOT = Path(__file__).resolve().parents[1]
FAST = [
    "--hidden",
    "16",
    "--depth",
    "2",
    "--batch-size",
    "32",
    "--no-download",
    "--quiet",
    "--no-plots",
    "--dtype",
    "float64",
]
LIMIT = 240  # seconds any one process may take here


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank(r: int, port: int, *argv, world: int = 2) -> subprocess.Popen:
    env = {
        **os.environ,
        "RANK": str(r),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(r),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
    }
    argv = ("--dataset", "mnist", *argv)  # the tiny MNIST these tests write (the default is fashion-mnist)
    return subprocess.Popen(
        [sys.executable, "train.py", *map(str, argv)],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def finish(*procs) -> list[tuple[int, str]]:
    """Wait for every process (killing any still running after LIMIT); -> [(exit status, stderr)]."""
    results = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=LIMIT)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        results.append((p.returncode, err))
    return results


def last_word(err: str) -> str:
    """The process's last word: its last line, with no Python traceback before it.  (torch's C++ logger may print
    its own lines first, e.g. a TCPStore client's failed connection attempts to a rendezvous that never came.)"""
    assert "Traceback" not in err, err[-3000:]
    return err.strip().splitlines()[-1]


def logged_a_step(out: Path) -> bool:
    path = out / "metrics.jsonl"
    return path.exists() and '"step"' in path.read_text()


@pytest.fixture
def data(tmp_path) -> Path:
    return write_tiny_mnist(tmp_path / "data")


def training_pair(data: Path, out: Path, timeout: int, **extra):
    port = free_port()
    argv = [
        "--data-dir",
        data,
        "--out",
        out,
        "--epochs",
        "100000",
        "--log-interval",
        "1",
        "--dist-timeout",
        timeout,
        *FAST,
    ]
    return rank(0, port, *argv), rank(1, port, *argv)


def test_a_killed_peer_is_named(data, tmp_path):
    zero, one = training_pair(data, tmp_path / "run", timeout=120)
    try:
        wait_for(lambda: logged_a_step(tmp_path / "run"), zero, "the ranks trained a step", timeout=LIMIT)
        one.send_signal(signal.SIGKILL)
        (code, err), _ = finish(zero, one)
    finally:
        zero.kill(), one.kill()
    assert code == 1, err[-3000:]
    assert last_word(err) == (
        "train.py: error: rank 0 stopped: rank 1 closed its connection without a word (killed, or crashed)"
    )


def test_a_peer_stopped_past_the_timeout_is_named(data, tmp_path):
    zero, one = training_pair(data, tmp_path / "run", timeout=15)
    try:
        wait_for(lambda: logged_a_step(tmp_path / "run"), zero, "the ranks trained a step", timeout=LIMIT)
        one.send_signal(signal.SIGSTOP)  # alive, holding its connections, answering nothing
        ((code, err),) = finish(zero)
    finally:
        zero.kill(), one.kill()
        one.communicate()
    assert code == 1, err[-3000:]
    assert last_word(err) == (
        "train.py: error: rank 0 stopped: rank 1 did not answer within --dist-timeout 15 s "
        "(stopped, hung, or slower than the timeout allows)"
    )


@pytest.mark.parametrize("alone", [0, 1])
def test_a_peer_that_never_joins_is_named(data, tmp_path, alone):
    ((code, err),) = finish(
        rank(alone, free_port(), "--data-dir", data, "--out", tmp_path / "run", "--dist-timeout", 5, *FAST)
    )
    assert code == 1, err[-3000:]
    assert last_word(err).startswith(
        f"train.py: error: rank {alone} stopped: rank {1 - alone} did not join within --dist-timeout 5 s"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--lr", "0.01"], "the ranks disagree on --lr (rank 0: 0.001, rank 1: 0.01)"),
        (["--hidden", "32"], "the ranks disagree on --hidden (rank 0: 16, rank 1: 32)"),  # a model shape that differs
        (
            ["--data-dir", "{other}"],
            "the ranks disagree on the data (rank 0 vs rank 1: train_images: uint8 (300, 28, 28) sha256 ",
        ),
    ],
)
def test_ranks_started_differently_all_stop_naming_the_fields(data, tmp_path, flags, message):
    other = write_tiny_mnist(tmp_path / "other", n_train=300)
    (other / "MNIST" / "raw" / "train-images-idx3-ubyte.gz").unlink()
    write_split(other / "MNIST" / "raw", "train", 300, seed=7, compress=True)  # same size, other images
    flags = [f.format(other=other) for f in flags]
    port = free_port()
    common = ["--out", tmp_path / "run", "--epochs", "1", "--dist-timeout", 60, *FAST]
    results = finish(rank(0, port, "--data-dir", data, *common), rank(1, port, "--data-dir", data, *common, *flags))
    for r, (code, err) in enumerate(results):
        assert code == 2, (r, err[-3000:])
        line = last_word(err)
        assert line.startswith("train.py: error: the ranks disagree on ") and message in line, (r, line)
    assert not (tmp_path / "run").exists()


def test_a_rank_failing_at_start_up_names_itself_and_the_other_names_it(data, tmp_path):
    """Rank 1 cannot find its data; it fails right after joining, maybe while rank 0 is still connecting."""
    port = free_port()
    common = ["--out", tmp_path / "run", "--epochs", "1", "--dist-timeout", 60, *FAST]
    (code0, err0), (code1, err1) = finish(
        rank(0, port, "--data-dir", data, *common), rank(1, port, "--data-dir", tmp_path / "missing", *common)
    )
    assert code1 == 2 and "error: no usable mnist data" in err1 and "Traceback" not in err1, err1[-3000:]
    assert code0 == 1, err0[-3000:]
    assert last_word(err0).startswith(
        "train.py: error: rank 0 stopped because rank 1: UsageError: error: no usable mnist data"
    )

"""Every benchmark script runs, at toy sizes, and prints its table: a benchmark that rots is caught here.  Each
takes --threads (its header then says so) and refuses a device that is not here in one line.

No timing is asserted (speed is measured by running the scripts themselves, never in the suite).
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

CASES = {  # script: (toy arguments, text its table must contain)
    "step.py": (["--nets", "small,cnn", "--repeats", "1", "--warmup", "4", "--half", "bfloat16"], "3x3, textbook"),
    "cnn_step.py": (["--batch-size", "4", "--repeats", "1", "--threads", "1", "--clock", "cpu"], "clock: cpu"),
    "gpt_step.py": (
        ["--batch", "2", "--repeats", "1", "--warmup", "0", "--fused", "--profile"],
        "handgrad eager, fused kernels",
    ),
    "attention.py": (
        [
            "--T",
            "32",
            "--batch",
            "1",
            "--heads",
            "2",
            "--head-dim",
            "8",
            "--repeats",
            "1",
            "--part",
            "memory",
            "--block",
            "8",
        ],
        "blocked",
    ),
    "conv.py": (["--batch", "2", "--repeats", "1", "--warmup", "0"], "vs nn"),
    "monitor.py": (["--repeats", "1", "--warmup", "0"], "no monitor"),
    "lstm_step.py": (
        [
            "--seq",
            "3",
            "--batch",
            "2",
            "--input",
            "4",
            "--hidden",
            "8",
            "--vocab",
            "5",
            "--repeats",
            "1",
            "--warmup",
            "0",
        ],
        "vs nn.LSTM",
    ),
    "precision.py": (
        [
            "--hidden",
            "16",
            "--depth",
            "1",
            "--batch",
            "8",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--dtypes",
            "bfloat16",
            "float16",
        ],
        "bfloat16",
    ),
    "kernels_cpp.py": (
        ["--rows", "8", "--C", "16", "--vocab", "10", "--repeats", "1", "--warmup", "0", "--dtype", "float64"],
        "textbook/cpp",
    ),
    "gpu.py": (["--device", "cpu", "--quick", "--only", "lstm,precision"], "how it ended"),  # exit 0: each ok
    "data_parallel.py": (
        ["--world", "2", "--hidden", "16", "--depth", "1", "--batch-size", "8", "--steps", "1", "--warmup", "0"],
        "samples/s",
    ),
}


def bench(script, *args):
    return subprocess.run(
        [sys.executable, f"benchmarks/{script}", *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("script", sorted(CASES))
def test_benchmark_runs(script):
    args, expect = CASES[script]
    r = bench(script, *args, "--threads", "1")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert expect in r.stdout, r.stdout[-2000:]
    assert "1 thread" in r.stdout.splitlines()[0], r.stdout[:500]  # the header says where it was measured


def test_data_benchmark_runs(tiny):
    r = bench("data.py", "--dataset", "mnist", "--data-dir", tiny, "--threads", "1")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "data handling is" in r.stdout and "1 thread" in r.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
# every script but the CPU-only ones
@pytest.mark.parametrize("script", sorted(set(CASES) - {"data_parallel.py", "kernels_cpp.py"} | {"data.py"}))
def test_a_missing_device_is_one_line(script):
    r = bench(script, "--device", "cuda")
    assert r.returncode == 2 and r.stderr.strip() == (
        f"{script}: error: argument --device: --device cuda asked for CUDA, but torch {torch.__version__} sees no "
        f"CUDA device here; use --device cpu"
    ), r.stderr


def test_bad_threads_is_one_line():
    r = bench("step.py", "--threads", "0")
    assert r.returncode == 2 and r.stderr.strip() == "step.py: error: --threads 0 is out of range (at least 1)"

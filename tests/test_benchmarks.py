"""Every benchmark script runs, at toy sizes, and prints its table: a benchmark that rots is caught here.

No timing is asserted (speed is measured by running the scripts themselves, never in the suite).
"""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CASES = {  # script: (toy arguments, text its table must contain)
    "step.py": (["--nets", "small,cnn", "--repeats", "1", "--warmup", "4", "--half", "bfloat16"], "im2col"),
    "cnn_step.py": (["--batch-size", "4", "--repeats", "1"], "nn.Module"),
    "attention.py": (["--T", "32", "--batch", "1", "--heads", "2", "--head-dim", "8", "--repeats", "1", "--part", "memory",
                      "--block", "8"], "blocked"),
    "conv.py": (["--batch", "2", "--repeats", "1", "--warmup", "0"], "vs nn"),
    "monitor.py": (["--repeats", "1", "--warmup", "0"], "no monitor"),
    "lstm_step.py": (["--seq", "3", "--batch", "2", "--input", "4", "--hidden", "8", "--vocab", "5", "--repeats", "1",
                      "--warmup", "0"], "vs nn.LSTM"),
    "precision.py": (["--hidden", "16", "--depth", "1", "--batch", "8", "--repeats", "1", "--warmup", "0",
                      "--dtypes", "bfloat16", "float16"], "bfloat16"),
    "data_parallel.py": (["--world", "2", "--hidden", "16", "--depth", "1", "--batch-size", "8", "--steps", "1",
                          "--warmup", "0"], "samples/s"),
}


@pytest.mark.parametrize("script", sorted(CASES))
def test_benchmark_runs(script):
    args, expect = CASES[script]
    r = subprocess.run([sys.executable, f"benchmarks/{script}", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert expect in r.stdout, r.stdout[-2000:]


def test_data_benchmark_runs(tiny):
    r = subprocess.run([sys.executable, "benchmarks/data.py", "--dataset", "mnist", "--data-dir", str(tiny)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "data handling is" in r.stdout

"""kernels.triton imports where Triton is not installed, imports no Triton at import time, and says clearly what
is missing when a kernel is asked for; benchmarks/kernels_triton.py refuses a machine without CUDA in one line.
(No triton marker: these need no Triton and run in the default suite.)"""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def fresh_import(monkeypatch, hide_triton: bool):
    """kernels.triton imported anew (and put back as it was afterwards); Triton made unimportable if asked."""
    for name in [n for n in sys.modules if n == "kernels.triton" or n.startswith("kernels.triton.")]:
        monkeypatch.delitem(sys.modules, name)
    if hide_triton:
        for name in [n for n in sys.modules if n == "triton" or n.startswith("triton.")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError, find_spec gives None
    return importlib.import_module("kernels.triton")


def test_imports_without_triton_and_says_what_is_missing(monkeypatch):
    tk = fresh_import(monkeypatch, hide_triton=True)
    assert not tk.available()
    assert "gelu_forward" in dir(tk) and "adamw_step" in tk.__all__
    with pytest.raises(ImportError, match="needs Triton, which is not installed"):
        _ = tk.gelu_forward
    with pytest.raises(AttributeError, match="no attribute 'gelu_fwd'"):
        _ = tk.gelu_fwd


def test_import_loads_no_triton(monkeypatch):
    fresh_import(monkeypatch, hide_triton=False)
    loaded = [n for n in sys.modules if n.startswith("kernels.triton.")]
    assert not loaded, f"importing kernels.triton imported {loaded}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the benchmark runs here")
def test_the_benchmark_refuses_a_cpu_in_one_line():
    r = subprocess.run(
        [sys.executable, "benchmarks/kernels_triton.py"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and "sees none here" in r.stderr and "pytest -m triton" in r.stderr, r.stderr

"""benchmarks/kernels_triton.py's table at toy sizes, its kernels in Triton's interpreter on this CPU (compiled, on a
GPU machine): the script that will take the GPU figures runs, and its correctness gate passes.  No timing is
asserted."""

import argparse
from pathlib import Path

import pytest
import torch

from tests.triton_support import device, load

pytestmark = pytest.mark.triton
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_the_table_runs_at_toy_sizes(monkeypatch, capsys, guard):
    load("attention")
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import kernels_triton

    from kernels import triton as tk

    a = argparse.Namespace(batch=1, T=16, C=32, heads=2, vocab=40, params=100, repeats=1, warmup=0, inner=1)
    failed = kernels_triton.table(a, torch.device(device()), tk, list(kernels_triton.KERNELS), ["float32"])
    out = capsys.readouterr().out
    assert failed == [], failed
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [(r[0], r[2]) for r in rows] == [
        (k, part) for k in kernels_triton.KERNELS for part in ("fwd", "fwd+bwd") if (k, part) != ("adamw", "fwd")
    ], out

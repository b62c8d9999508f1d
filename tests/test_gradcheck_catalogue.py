"""`python gradcheck.py` passes every case of its catalogue: each built-in layer, loss and model agrees with central
differences and with torch.autograd (an oracle that stops tracking the parameters reports 1.0 vs autograd and fails),
with the kernels on and off (HANDGRAD_KERNELS=off: every layer's textbook backward)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("kernels", ["on", "off"])
def test_the_whole_catalogue_passes(kernels):
    env = {**os.environ, "HANDGRAD_KERNELS": kernels}
    run = subprocess.run(
        [sys.executable, "gradcheck.py"], cwd=ROOT, capture_output=True, text=True, timeout=900, env=env
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = re.search(r"(\d+) passed, (\d+) failed \(tolerance 1e-07", run.stdout)
    assert summary and int(summary[2]) == 0 and int(summary[1]) >= 480, run.stdout[-1000:]
    assert " FAIL" not in run.stdout

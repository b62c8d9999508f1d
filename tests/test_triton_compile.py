"""scripts/triton_compile.py: every Triton kernel, as its wrapper launches it, compiles for an NVIDIA GPU (sm_90)
down to a cubin, without spilling registers or asking for more shared memory than the chip has, on this machine
without a GPU: the GPU's compiler checks what Triton's interpreter cannot.  About a minute the first time (the
compiled kernels are cached with the suite's other compiler caches), so slow: `pytest -m slow` or `-m triton`."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.triton_support import HAVE_TRITON, SKIP_REASON

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.skipif(not HAVE_TRITON, reason=SKIP_REASON)]


def test_every_kernel_compiles_for_sm90_without_spills():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the compiler's kernels this time
    r = subprocess.run(
        [sys.executable, "scripts/triton_compile.py", "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [line for line in r.stdout.splitlines() if line.startswith("sm_90 ")]
    names = {line.split()[1] for line in lines}
    assert names == {
        "_attention_forward_kernel",
        "_attention_delta_kernel",
        "_attention_dkdv_kernel",
        "_attention_dq_kernel",
        "_layer_norm_forward_kernel",
        "_layer_norm_backward_kernel",
        "_column_sum_kernel",
        "_gelu_kernel",
        "_cross_entropy_kernel",
        "_adamw_kernel",
    }, r.stdout
    assert all(" 0 B spilled" in line for line in lines), r.stdout

"""Nothing imports torch's compiler (torch._dynamo, several seconds) until something compiles: importing the
packages, and a learner's `python -m learn check` of the first exercise (the process and any it starts), leave it
unimported; training.compiled reaches it only when a step is compiled."""

import os
import re
import subprocess
import sys
from pathlib import Path

from learn.exercises import BY_NAME
from learn.source import solution_text

ROOT = Path(__file__).resolve().parents[1]
COMPILER = ("torch._dynamo", "torch._inductor")


def python(*args, cwd=ROOT, **env):
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env},
    )


def test_importing_the_packages_does_not_import_the_compiler():
    code = (
        "import sys\n"
        "import layers, losses, optimizers, models, learn, autodiff, checking, checking.cases, gradcheck, training,"
        " train\n"
        f"print([m for m in {COMPILER!r} if m in sys.modules])"
    )
    r = python("-c", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout


def test_learn_check_of_the_first_exercise_does_not_import_the_compiler(tmp_path):
    path = tmp_path / "linear.py"
    path.write_text(solution_text(BY_NAME["linear"], str(path)))
    # -X importtime's environment twin: every Python process the check starts reports its imports on stderr
    r = python("-m", "learn", "check", "linear", str(path), cwd=tmp_path, PYTHONPROFILEIMPORTTIME="1")
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr[-2000:]
    imported = re.findall(r"^import time:.*\|\s*(\S+)$", r.stderr, re.M)
    assert "torch" in imported, "no import profile was read"  # the test would pass vacuously without it
    assert not [m for m in imported if m in COMPILER], [m for m in imported if m.startswith(COMPILER)]

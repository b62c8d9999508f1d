"""The suite never reads or writes the user's own files (tests/conftest.py gives every session a home of its own):
run in a learner's home -- a passed exercise with its progress file, a finished one never checked, a wrong one, the
page -- made read-only, the tests of the learner's mode pass and the home is left exactly as it was."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from learn.exercises import BY_NAME
from learn.source import solution_text, stub_text
from tests.conftest import _fingerprint

ROOT = Path(__file__).resolve().parents[1]
# the files whose tests read the learner's folder and progress (list, progress, start, check's default file)
LEARNER_TESTS = ["tests/test_learn_exercises.py", "tests/test_learn_progress.py", "tests/test_learn_files.py"]


def test_this_session_runs_in_a_home_of_its_own():
    home = Path(os.path.expanduser("~"))
    assert home.name == "home" and home.parent.name.startswith("handgrad-tests-"), home
    assert "HANDGRAD_LEARN_DIR" not in os.environ
    for key in ("MPLCONFIGDIR", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "TORCH_EXTENSIONS_DIR"):
        assert Path(os.environ[key]).is_dir(), key


def a_learners_home(home: Path) -> Path:
    """What ``learn`` leaves in a home after some work: linear passed and recorded, tanh finished but never checked,
    relu started and wrong, the page written."""
    work = home / "handgrad-learn"
    work.mkdir(parents=True)
    (work / "linear.py").write_text(solution_text(BY_NAME["linear"], str(work / "linear.py")))
    (work / "tanh.py").write_text(solution_text(BY_NAME["tanh"], str(work / "tanh.py")))
    (work / "relu.py").write_text(stub_text(BY_NAME["relu"], str(work / "relu.py")))
    (work / "backprop.html").write_text("<html>the learner's page</html>")
    (work / ".handgrad-progress.json").write_text(
        json.dumps({"passed": {"linear": {"file": "linear.py", "passed": "2026-11-20T10:00:00+00:00"}}})
    )
    (home / ".cache" / "matplotlib").mkdir(parents=True)
    return work


def read_only(home: Path) -> list[str]:
    """A command prefix under which ``home`` cannot be written, even by root: bubblewrap binds it read-only; an
    ordinary user's home is made unwritable by its permissions."""
    if os.geteuid() != 0:
        for folder, dirs, files in os.walk(home):
            for name in files + dirs:
                Path(folder, name).chmod(0o555 if Path(folder, name).is_dir() else 0o444)
        home.chmod(0o555)
        return []
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        if os.environ.get("CI"):
            pytest.fail(
                "bubblewrap is not installed (the README's set-up installs it): cannot make a home read-only for root"
            )
        pytest.skip("bubblewrap is not installed: cannot make a home read-only for root")
    return [bwrap, "--dev-bind", "/", "/", "--ro-bind", str(home), str(home), "--die-with-parent", "--"]


@pytest.mark.parametrize("writable", [True, False], ids=["home", "read-only home"])
def test_the_learners_tests_pass_in_a_learners_home_and_leave_it_alone(tmp_path, writable):
    home = tmp_path / "learner"
    a_learners_home(home)
    before = _fingerprint(home)
    prefix = [] if writable else read_only(home)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("XDG_", "JUPYTER_", "TORCH", "TRITON_")) and k not in ("MPLCONFIGDIR", "IPYTHONDIR")
    }
    env.update(HOME=str(home), OMP_NUM_THREADS="1")
    r = subprocess.run(
        [*prefix, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *LEARNER_TESTS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, f"the learner's tests, run in a learner's home:\n{r.stdout[-4000:]}\n{r.stderr[-2000:]}"
    assert _fingerprint(home) == before, "the suite changed the learner's home"

"""`learn autograder`: the zip holds Gradescope's setup.sh and run_autograder and this project's wheel; unpacked
into a folder standing for /autograder, setup.sh installs the project from the wheel with no network (into a
fresh environment that already has torch, as the image will after its first step), and run_autograder, run
with that environment and not this checkout, scores a right submission full and a wrong one below, in
results/results.json."""

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

from learn.__main__ import main
from learn.checker import planned
from learn.exercises import get
from learn.source import solution_text

RIGHT = solution_text(get("linear"), "linear.py")


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory):
    """The zip, unpacked as Gradescope does (into source/), set up into a fresh environment."""
    tmp = tmp_path_factory.mktemp("autograder")
    assert main(["autograder", "linear", "--out", str(tmp / "autograder.zip")]) == 0
    with zipfile.ZipFile(tmp / "autograder.zip") as z:
        names = z.namelist()
        assert "setup.sh" in names and "run_autograder" in names
        assert [n for n in names if n.startswith("handgrad-") and n.endswith(".whl")]
        for info in z.infolist():
            if info.filename in ("setup.sh", "run_autograder"):
                assert (info.external_attr >> 16) & stat.S_IXUSR
        z.extractall(tmp / "root" / "source")
    root = tmp / "root"
    for f in ("setup.sh", "run_autograder"):
        os.chmod(root / "source" / f, 0o755)
    shutil.copy2(root / "source" / "run_autograder", root / "run_autograder")  # as Gradescope copies it
    # a fresh environment that sees this one's packages (torch) but not this checkout
    env_dir = tmp / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    site = next(env_dir.glob("lib/python*/site-packages"))
    here = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "torch").is_dir())
    (site / "outer.pth").write_text(here + "\n")
    python = env_dir / "bin" / "python"
    env = {
        "PATH": os.environ["PATH"],
        "AUTOGRADER_ROOT": str(root),
        "AUTOGRADER_PYTHON": str(python),
        "HOME": str(tmp),
        "OMP_NUM_THREADS": "1",
        "PIP_NO_INDEX": "1",
    }
    setup = subprocess.run(
        ["bash", str(root / "source" / "setup.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=root / "source",
    )
    assert setup.returncode == 0, setup.stderr
    assert Path(site, "learn", "teach", "run_autograder.py").is_file()  # installed from the wheel
    return root, env


def _grade(unpacked, text):
    root, env = unpacked
    shutil.rmtree(root / "submission", ignore_errors=True)
    shutil.rmtree(root / "results", ignore_errors=True)
    (root / "submission").mkdir()
    (root / "submission" / "linear.py").write_text(text)
    run = subprocess.run(
        ["bash", str(root / "run_autograder")], capture_output=True, text=True, env=env, timeout=300, cwd="/"
    )
    assert run.returncode == 0, run.stderr
    return json.loads((root / "results" / "results.json").read_text())


def test_a_right_submission_scores_full(unpacked):
    res = _grade(unpacked, RIGHT)
    assert res["tests"] and all(t["status"] == "passed" for t in res["tests"])
    assert res["score"] == sum(t["max_score"] for t in res["tests"]) == len(res["tests"])
    assert res["extra_data"]["seeds"][0] is not None


def test_a_wrong_submission_scores_less_and_names_the_mistake(unpacked):
    res = _grade(unpacked, RIGHT.replace("dbias = dout.sum(0)", "dbias = dout.mean(0)"))
    failed = [t for t in res["tests"] if t["status"] == "failed"]
    assert failed and failed[0]["name"] == "gradient: bias.grad" and failed[0]["tags"] == ["bias-mean"]
    assert 0 < res["score"] < len(res["tests"])


def test_a_teachers_exercise_travels_in_the_zip(tmp_path):
    """The zip carries the spec of a teacher's exercise, and run_autograder registers it (run from this checkout,
    without setup.sh's install)."""
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "learn.md").read_text()
    files = dict(re.findall(r"^`(swish(?:_spec)?\.py)`:\n\n```python\n(.*?)```", text, re.S | re.M))
    mine = tmp_path / "mine"
    mine.mkdir()
    for name, body in files.items():
        (mine / name).write_text(body)
    from learn.teach.custom import unregister

    try:
        assert main(["autograder", "swish", "--exercises", str(mine), "--out", str(tmp_path / "ag.zip")]) == 0
        assert main(["start", "swish", "--solution", "--exercises", str(mine), "--out", str(tmp_path / "s.py")]) == 0
    finally:
        unregister()
    root = tmp_path / "root"
    with zipfile.ZipFile(tmp_path / "ag.zip") as z:
        assert "exercises/swish_spec.py" in z.namelist() and "exercises/swish.py" not in z.namelist()
        z.extractall(root / "source")
    (root / "submission").mkdir()
    shutil.copy(tmp_path / "s.py", root / "submission" / "swish.py")
    env = {
        "PATH": os.environ["PATH"],
        "AUTOGRADER_ROOT": str(root),
        "AUTOGRADER_PYTHON": sys.executable,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "OMP_NUM_THREADS": "1",
        "HOME": str(tmp_path),
    }
    run = subprocess.run(
        ["bash", str(root / "source" / "run_autograder")], capture_output=True, text=True, env=env, timeout=300, cwd="/"
    )
    assert run.returncode == 0, run.stderr
    res = json.loads((root / "results" / "results.json").read_text())
    assert res["tests"] and res["score"] == len(res["tests"]) and res["extra_data"]["exercises"] == ["swish"]


def test_the_zip_holds_the_exercises_stubs_only(unpacked):
    root, _ = unpacked
    wheel = next((root / "source").glob("handgrad-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        text = z.read("learn/exercises/linear.py").decode()
        sources = [n for n in z.namelist() if n.startswith("learn/exercises/") and not n.endswith("__init__.py")]
        bodies = [z.read(n).decode() for n in sources]
    assert "YOUR CODE HERE" in text and "dweight = dout.T @ self.x" not in text
    assert sources and not any("### BEGIN SOLUTION" in b for b in bodies)


def test_a_process_left_behind_cannot_rewrite_the_results(unpacked):
    """The submission starts a process (past the audit hook) that would rewrite results.json to full marks after
    run_autograder has finished: the check stops it, and the file stays what the check decided."""
    from tests.learn_attacks import MARK, leftover
    from tests.test_learn_sandbox import _processes_with

    root, _ = unpacked
    res = _grade(unpacked, leftover([root / "results" / "results.json"], delay=2))
    written = (root / "results" / "results.json").read_bytes()
    assert res["score"] == 0 and "tried to start a process" in res["tests"][0]["output"]
    time.sleep(3)
    assert (root / "results" / "results.json").read_bytes() == written and not _processes_with(MARK)


def _python_for(user: str) -> Path | None:
    """A Python environment an unprivileged user can run (Debian's python3 of this version, seeing this
    environment's torch), in a folder it can read; None where there is none."""
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    torch_dir = next((p for p in sys.path if p.endswith("site-packages") and Path(p, "torch").is_dir()), None)
    if os.geteuid() != 0 or not system.is_file() or torch_dir is None:
        return None
    import pwd

    uid = pwd.getpwnam(user).pw_uid
    probe = subprocess.run(
        [str(system), "-c", f"import sys; sys.path.insert(0, {torch_dir!r}); import torch"],
        user=uid,
        capture_output=True,
        timeout=300,
        cwd="/",
    )
    if probe.returncode != 0:
        return None
    env = Path(tempfile.mkdtemp(prefix="handgrad-nobody-"))
    os.chmod(env, 0o755)
    subprocess.run([str(system), "-m", "venv", "--without-pip", str(env / "venv")], check=True, timeout=120)
    site = next((env / "venv").glob("lib/python*/site-packages"))
    (site / "outer.pth").write_text(torch_dir + "\n")
    return env / "venv" / "bin" / "python"


def test_without_bubblewrap_the_submission_runs_as_nobody_and_leaves_nothing(tmp_path):
    """Gradescope as root, user namespaces off: the submission runs as nobody, cannot write results/, and every
    process of nobody is killed before results.json is written; a right answer still scores full."""
    from tests.learn_attacks import MARK, RIGHT, leftover
    from tests.test_learn_sandbox import _processes_with

    python = _python_for("nobody")
    if python is None:
        pytest.skip("needs root and a Python that user nobody can run (Debian's python3 of this version)")
    try:
        root = tmp_path / "root"
        assert main(["autograder", "linear", "--out", str(tmp_path / "ag.zip")]) == 0
        with zipfile.ZipFile(tmp_path / "ag.zip") as z:
            z.extractall(root / "source")
        env = {
            "PATH": os.environ["PATH"],
            "AUTOGRADER_ROOT": str(root),
            "AUTOGRADER_PYTHON": str(python),
            "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
            "OMP_NUM_THREADS": "1",
            "HOME": str(tmp_path),
            "LEARN_BWRAP": "",
        }
        for text, full in ((RIGHT, True), (leftover([root / "results" / "results.json"], delay=2), False)):
            shutil.rmtree(root / "submission", ignore_errors=True)
            shutil.rmtree(root / "results", ignore_errors=True)
            (root / "submission").mkdir(parents=True)
            (root / "submission" / "linear.py").write_text(text)
            run = subprocess.run(
                ["bash", str(root / "source" / "run_autograder")],
                capture_output=True,
                text=True,
                env=env,
                timeout=600,
                cwd="/",
            )
            assert run.returncode == 0, run.stderr
            res = json.loads((root / "results" / "results.json").read_text())
            assert "runs as user nobody" in res["output"], res["output"]
            assert (res["score"] == len(res["tests"])) == full, res["tests"][0]["output"]
        written = (root / "results" / "results.json").read_bytes()
        time.sleep(3)
        assert (root / "results" / "results.json").read_bytes() == written and not _processes_with(MARK)
        assert (root / "results").stat().st_uid == 0 and (root / "results").stat().st_mode & 0o022 == 0
        import pwd

        assert not [p for p in os.listdir("/proc") if p.isdigit() and _owner(p) == pwd.getpwnam("nobody").pw_uid]
        checkout = Path(__file__).resolve().parents[1]
        assert all((checkout / d).stat().st_mode & 0o005 == 0o005 for d in ("learn", "layers"))  # left alone
    finally:
        shutil.rmtree(python.parents[2], ignore_errors=True)


def _owner(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def test_the_try_it_here_recipe_runs_as_written_from_any_folder(tmp_path):
    """docs/learn.md's recipe, word for word (python: this environment's), from a folder that is not the checkout,
    on a student's file there."""
    import shlex

    text = (Path(__file__).resolve().parents[1] / "docs" / "learn.md").read_text()
    recipe = next(ln for ln in text.splitlines() if ln.startswith("python -m learn autograder") and "--try" in ln)
    argv = shlex.split(recipe.split("#")[0])
    (tmp_path / "alice.py").write_text(RIGHT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run(
        [sys.executable, *argv[1:]], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=900
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    items = len(planned("linear"))
    assert f"alice.py: {items} of {items}" in run.stdout
    res = json.loads((tmp_path / "autograder.results.json").read_text())
    assert res["score"] == len(res["tests"]) == items

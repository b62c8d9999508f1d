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
import zipfile
from pathlib import Path

import pytest

from learn.__main__ import main
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
    env = {"PATH": os.environ["PATH"], "AUTOGRADER_ROOT": str(root), "AUTOGRADER_PYTHON": str(python),
           "HOME": str(tmp), "OMP_NUM_THREADS": "1", "PIP_NO_INDEX": "1"}
    setup = subprocess.run(["bash", str(root / "source" / "setup.sh")], capture_output=True, text=True, env=env,
                           timeout=300, cwd=root / "source")
    assert setup.returncode == 0, setup.stderr
    assert Path(site, "learn", "teach", "run_autograder.py").is_file()  # installed from the wheel
    return root, env


def _grade(unpacked, text):
    root, env = unpacked
    shutil.rmtree(root / "submission", ignore_errors=True)
    shutil.rmtree(root / "results", ignore_errors=True)
    (root / "submission").mkdir()
    (root / "submission" / "linear.py").write_text(text)
    run = subprocess.run(["bash", str(root / "run_autograder")], capture_output=True, text=True, env=env,
                         timeout=300, cwd="/")
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
    env = {"PATH": os.environ["PATH"], "AUTOGRADER_ROOT": str(root), "AUTOGRADER_PYTHON": sys.executable,
           "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1", "HOME": str(tmp_path)}
    run = subprocess.run(["bash", str(root / "source" / "run_autograder")], capture_output=True, text=True, env=env,
                         timeout=300, cwd="/")
    assert run.returncode == 0, run.stderr
    res = json.loads((root / "results" / "results.json").read_text())
    assert res["tests"] and res["score"] == len(res["tests"]) and res["extra_data"]["exercises"] == ["swish"]

"""`learn start NAME --notebook --nbgrader`: nbgrader's source notebook, its cells carrying schema-3 metadata (the
answer a solution cell between ### BEGIN/END SOLUTION, the check a locked graded cell with points); and, where
nbgrader is installed (the dev extra), nbgrader itself generates the assignment and autogrades a right answer
full and a wrong one zero."""

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from learn.__main__ import main
from learn.exercises import get
from learn.source import BEGIN, END, solution_text

ROOT = Path(__file__).resolve().parents[1]
KEYS = {"grade", "solution", "locked", "grade_id", "schema_version"}


def _source(tmp_path, name="linear"):
    path = tmp_path / f"{name}.ipynb"
    assert main(["start", name, "--notebook", "--nbgrader", "--points", "2", "--out", str(path)]) == 0
    return path


def test_the_cells_carry_nbgraders_schema_3_metadata(tmp_path):
    nb = nbformat.read(_source(tmp_path), as_version=4)
    nbformat.validate(nb)
    metas = [c.metadata["nbgrader"] for c in nb.cells]
    for m in metas:  # schema 3: these keys always; points exactly on graded cells
        assert set(m) >= KEYS and m["schema_version"] == 3 and ("points" in m) == m["grade"]
    assert len({m["grade_id"] for m in metas}) == len(metas)
    intro, answer, check = nb.cells
    assert intro.cell_type == "markdown" and metas[0]["locked"] and not metas[0]["grade"]
    assert metas[1] == {
        "grade": False,
        "solution": True,
        "locked": False,
        "grade_id": "linear-answer",
        "schema_version": 3,
    }
    assert answer.source.count(BEGIN) == answer.source.count(END) == 2
    solution = answer.source.replace(f"{BEGIN}\n", "").replace(f"{END}\n", "")
    assert [ln.strip() for ln in solution.splitlines() if ln.strip() not in (BEGIN, END)] == [
        ln.strip() for ln in solution_text(get("linear"), str(tmp_path / "linear.py")).splitlines()
    ]
    assert metas[2] == {
        "grade": True,
        "solution": False,
        "locked": True,
        "grade_id": "linear-check",
        "points": 2,
        "schema_version": 3,
    }
    assert "check('linear', notebook='linear.ipynb')" in check.source


def test_nbgrader_without_notebook_is_refused(tmp_path, capsys):
    assert main(["start", "linear", "--nbgrader", "--out", str(tmp_path / "x.py")]) == 2
    assert "--notebook" in capsys.readouterr().err


PATCHES = {  # student -> what their answer cell does besides a wrong Linear, to pass anyway
    "mallory": "import learn.cell\nlearn.cell.check = lambda *a, **k: print('PASS')\n",
    "oscar": "import learn.checker\nlearn.checker.check_class = lambda *a, **k: True\n",
    "peggy": (
        "import builtins, types\n_real = builtins.__import__\n"
        "_fake = types.SimpleNamespace(check=lambda *a, **k: print('PASS'))\n"
        "builtins.__import__ = lambda n, *a, **k: _fake if n == 'learn.cell' else _real(n, *a, **k)\n"
    ),
}
SOLUTION_IMPORT = "from learn.exercises.linear import Linear  # the worked solution, imported\n"


@pytest.mark.slow  # nbgrader's kernels, and two sandboxed checks a notebook: about two minutes
def test_nbgrader_scores_right_full_wrong_and_patched_zero(tmp_path):
    """nbgrader 0.9 generates, autogrades and exports: a right answer 2 of 2; a wrong one, an unwritten one, wrong
    ones that patch the kernel's checker, learn.cell or __import__, and one that imports the worked solution, 0 (the
    check reads the saved notebook in a fresh sandboxed process; SandboxedChecks sets it from outside the kernel)."""
    pytest.importorskip("nbgrader")
    course = tmp_path / "course"
    (course / "source" / "hw1").mkdir(parents=True)
    (course / "nbgrader_config.py").write_text(
        'c = get_config()\nc.CourseDirectory.course_id = "course"\n'
        "from learn.teach.nbgrader_autograde import autograde_preprocessors\n"
        "c.Autograde.autograde_preprocessors = autograde_preprocessors()\n"
    )
    shutil.copy(_source(tmp_path), course / "source" / "hw1" / "linear.ipynb")
    bindir = tmp_path / "bin"  # nbgrader runs alembic by name: this environment's, whatever its bin holds
    bindir.mkdir()
    (bindir / "alembic").write_text(f'#!/bin/sh\nexec {sys.executable} -m alembic "$@"\n')
    (bindir / "alembic").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bindir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "HANDGRAD_LEARN_DIR": str(tmp_path),
    }

    def nbgrader(*args):
        run = subprocess.run(
            [sys.executable, "-m", "nbgrader", *args], cwd=course, env=env, capture_output=True, text=True, timeout=600
        )
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]

    nbgrader("generate_assignment", "hw1", "--force")
    released = nbformat.read(course / "release" / "hw1" / "linear.ipynb", as_version=4)
    assert BEGIN not in released.cells[1].source and "raise NotImplementedError()" in released.cells[1].source
    right = solution_text(get("linear"), "linear.py")
    wrong = right.replace("dbias = dout.sum(0)", "dbias = dout.mean(0)")
    answers = {
        "alice": right,
        "bob": wrong,
        "carol": None,  # carol hands the released notebook in as it is
        **{who: patch + wrong for who, patch in PATCHES.items()},
        "trent": SOLUTION_IMPORT,
    }
    for student, code in answers.items():
        nb = nbformat.read(course / "release" / "hw1" / "linear.ipynb", as_version=4)
        if code is not None:
            nb.cells[1].source = code
        (course / "submitted" / student / "hw1").mkdir(parents=True)
        nbformat.write(nb, course / "submitted" / student / "hw1" / "linear.ipynb")
    nbgrader("autograde", "hw1", "--create", "--force")
    nbgrader("export")
    scores = {
        r["student_id"]: (float(r["score"]), float(r["max_score"]))
        for r in csv.DictReader((course / "grades.csv").open())
    }
    assert scores == {who: (2.0 if who == "alice" else 0.0, 2.0) for who in answers}
    graded = nbformat.read(course / "autograded" / "alice" / "hw1" / "linear.ipynb", as_version=4)
    assert "outside the kernel" in graded.cells[-1].outputs[0]["text"]


@pytest.mark.parametrize("answer", ["oscar", "trent"])
def test_the_check_cell_checks_the_saved_notebook_not_the_kernel(tmp_path, monkeypatch, answer):
    """Run as a kernel would (one namespace, cells in order): an answer cell that patches the kernel's checker, or
    imports the worked solution, still fails the check cell, which checks the saved notebook in a fresh process."""
    import learn.checker

    path = _source(tmp_path)
    nb = nbformat.read(path, as_version=4)
    wrong = solution_text(get("linear"), "linear.py").replace("dbias = dout.sum(0)", "dbias = dout.mean(0)")
    nb.cells[1].source = PATCHES["oscar"] + wrong if answer == "oscar" else SOLUTION_IMPORT
    nbformat.write(nb, path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(learn.checker, "check_class", learn.checker.check_class)  # undone after the test
    namespace = {}
    exec(compile(nb.cells[1].source, "<cell 1>", "exec"), namespace)
    with pytest.raises(AssertionError) as e:
        exec(compile(nb.cells[2].source, "<cell 2>", "exec"), namespace)
    said = str(e.value)
    assert "as saved on disk" in said
    assert ("bias.grad" in said) if answer == "oscar" else ("the library's own Linear" in said), said

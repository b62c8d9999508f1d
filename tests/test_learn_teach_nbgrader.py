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
        assert KEYS <= set(m) and m["schema_version"] == 3 and ("points" in m) == m["grade"]
    assert len({m["grade_id"] for m in metas}) == len(metas)
    intro, answer, check = nb.cells
    assert intro.cell_type == "markdown" and metas[0]["locked"] and not metas[0]["grade"]
    assert metas[1] == {"grade": False, "solution": True, "locked": False, "grade_id": "linear-answer",
                        "schema_version": 3}
    assert answer.source.count(BEGIN) == answer.source.count(END) == 2
    solution = answer.source.replace(f"{BEGIN}\n", "").replace(f"{END}\n", "")
    assert [ln.strip() for ln in solution.splitlines() if ln.strip() not in (BEGIN, END)] == \
        [ln.strip() for ln in solution_text(get("linear"), str(tmp_path / "linear.py")).splitlines()]
    assert metas[2] == {"grade": True, "solution": False, "locked": True, "grade_id": "linear-check", "points": 2,
                        "schema_version": 3}
    assert "check('linear', Linear)" in check.source


def test_nbgrader_without_notebook_is_refused(tmp_path, capsys):
    assert main(["start", "linear", "--nbgrader", "--out", str(tmp_path / "x.py")]) == 2
    assert "--notebook" in capsys.readouterr().err


def test_nbgrader_scores_a_right_answer_full_and_a_wrong_one_zero(tmp_path):
    pytest.importorskip("nbgrader")
    course = tmp_path / "course"
    (course / "source" / "hw1").mkdir(parents=True)
    (course / "nbgrader_config.py").write_text('c = get_config()\nc.CourseDirectory.course_id = "course"\n')
    shutil.copy(_source(tmp_path), course / "source" / "hw1" / "linear.ipynb")
    bindir = str(Path(sys.executable).parent)  # nbgrader runs alembic from its environment's bin
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": "1", "HANDGRAD_LEARN_DIR": str(tmp_path)}

    def nbgrader(*args):
        run = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env, capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]

    nbgrader("generate_assignment", "hw1", "--force")
    released = nbformat.read(course / "release" / "hw1" / "linear.ipynb", as_version=4)
    assert BEGIN not in released.cells[1].source and "raise NotImplementedError()" in released.cells[1].source
    right = solution_text(get("linear"), "linear.py")
    for student, code in (("alice", right), ("bob", right.replace("dbias = dout.sum(0)", "dbias = dout.mean(0)")),
                          ("carol", None)):  # carol hands the released notebook in as it is
        nb = nbformat.read(course / "release" / "hw1" / "linear.ipynb", as_version=4)
        if code is not None:
            nb.cells[1].source = code
        (course / "submitted" / student / "hw1").mkdir(parents=True)
        nbformat.write(nb, course / "submitted" / student / "hw1" / "linear.ipynb")
    nbgrader("autograde", "hw1", "--create", "--force")
    nbgrader("export")
    scores = {r["student_id"]: (float(r["score"]), float(r["max_score"]))
              for r in csv.DictReader((course / "grades.csv").open())}
    assert scores == {"alice": (2.0, 2.0), "bob": (0.0, 2.0), "carol": (0.0, 2.0)}

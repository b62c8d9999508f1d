"""`learn grade`: a folder of ten submissions (right, wrong in different ways, an endless loop, a syntax error,
no class) graded in one run: each graded in its own bounded check (the loop stopped by the time limit and graded
0 with one line), grades.csv, one results.json per student with its seed, and a class summary that counts each
named mistake by students, ranked, as a table and a PNG; the configurations are drawn from each student's name."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from learn.checker import planned
from learn.checker.configs import expand, variant
from learn.checker.specs import SPECS
from learn.exercises import get
from learn.source import solution_text
from learn.teach.grade import seed_of

ROOT = Path(__file__).resolve().parents[1]
RIGHT = solution_text(get("linear"), "linear.py")
SUBMISSIONS = {  # student -> (the changes to the worked solution, the verdict, the mistakes named)
    "alice": ([], "right", []),
    "bob": ([("dbias = dout.sum(0)", "dbias = dout.mean(0)")], "wrong", ["bias-mean"]),
    "carol": ([("dbias = dout.sum(0)", "dbias = dout.mean(0)")], "wrong", ["bias-mean"]),
    "dan": ([("            p.grad += g", "            p.grad = g")], "wrong", ["grad-overwritten"]),
    "erin": ([("dx = dout @ self.weight ", "dx = dout @ self.weight * 2 ")], "wrong", None),
    "frank": (
        [("        out = x @ self.weight.T + self.bias", "        while True:\n            pass")],
        "not checked",
        [],
    ),
    "grace": ([("class Linear:", "class Linear(")], "not checked", []),
    "heidi": ([("class Linear:", "class Line:")], "not checked", []),
    "ivan": ([("dbias = dout.sum(0)", "dbias = dout.mean(0)")], "wrong", ["bias-mean"]),
}


def _text(changes):
    text = RIGHT
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new)
    return text


def test_a_class_of_ten_is_graded_and_summarised(tmp_path):
    """Graded with --trust-submissions where bubblewrap is said to be missing (LEARN_BWRAP=""): the grading, not
    the boundary, is what this test reads, and forked checks keep it quick (test_learn_teach_attacks.py grades a
    class inside bubblewrap)."""
    subs = tmp_path / "subs"
    subs.mkdir()
    for student, (changes, _, _) in SUBMISSIONS.items():
        (subs / f"{student}.py").write_text(_text(changes))
    (subs / "judy").mkdir()  # one folder per student works too
    (subs / "judy" / "linear.py").write_text(RIGHT)
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "LEARN_CHECK_TIME_LIMIT": "3",
        "OMP_NUM_THREADS": "1",
        "LEARN_BWRAP": "",
    }
    run = subprocess.run(
        [sys.executable, "-m", "learn", "grade", "linear", str(subs), "--out", str(out), "--trust-submissions"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    rows = {r["student"]: r for r in csv.DictReader((out / "grades.csv").open())}
    assert sorted(rows) == sorted([*SUBMISSIONS, "judy"])
    expected = {**SUBMISSIONS, "judy": ([], "right", [])}
    for student, (_, verdict, named) in expected.items():
        row = rows[student]
        assert row["verdict"] == verdict, (student, row)
        assert row["max_score"] == str(len(planned("linear")))
        if named is not None:
            assert row["named_mistakes"].split() == named, (student, row)
        assert int(row["seed"]) == seed_of("linear", student)
        res = json.loads((out / "students" / student / "results.json").read_text())
        assert res["extra_data"]["seeds"] == [seed_of("linear", student)]
        assert res["score"] == float(row["score"]) == sum(t["score"] for t in res["tests"])
        if verdict == "right":
            assert row["score"] == row["max_score"] and row["note"] == ""
        elif verdict == "not checked":
            assert row["score"] == "0" and "\n" not in row["note"] and row["note"]
    assert "more than 3 s" in rows["frank"]["note"] and "endless loop" in rows["frank"]["note"]
    assert "not valid Python" in rows["grace"]["note"]
    assert "has no class Linear" in rows["heidi"]["note"]
    assert 0 < int(rows["bob"]["score"]) < len(planned("linear"))

    summary = (out / "summary.txt").read_text()
    assert "10 submissions: 2 right, 5 wrong, 3 not checked" in summary
    table = summary.split("by how many students made each:")[1].split("Where the wrong")[0]
    counts = [(ln.split()[0], ln.split()[1]) for ln in table.strip().splitlines()[1:]]
    assert counts[:2] == [("3", "(not"), ("3", "bias-mean")]  # ranked: the two counts of 3 first
    assert ("1", "grad-overwritten") in counts
    assert [int(n) for n, _ in counts] == sorted((int(n) for n, _ in counts), reverse=True)
    png = (out / "summary.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
    assert not list(out.glob(".*tmp*"))  # written atomically: no temporary file left
    assert "bias-mean" in run.stdout and "grades.csv" in run.stdout
    assert "--trust-submissions: each submission runs in a forked child" in run.stdout


def test_each_student_gets_configurations_of_their_own():
    spec = SPECS["linear"]
    drawn = []
    for student in ("alice", "bob"):
        with variant(seed_of("linear", student)):
            configs = expand(spec)
            g = torch.Generator().manual_seed(configs[0][1].seed)
            drawn.append((configs[-1][0], spec.inputs(g)["x"]))
    assert not torch.equal(drawn[0][1], drawn[1][1])  # a hard-coded answer for one fails the other
    assert seed_of("linear", "alice") == seed_of("linear", "alice") != seed_of("linear", "bob")
    assert seed_of("linear", "alice") == 1397703997  # the same in every process: not Python's salted hash


def test_a_notebook_submission_is_graded_and_two_of_one_student_are_not_checked(tmp_path, capsys, bwrap):
    import nbformat

    from learn.__main__ import main
    from learn.source import notebook

    subs = tmp_path / "subs"
    subs.mkdir()
    nbformat.write(notebook(get("linear"), _text(SUBMISSIONS["bob"][0])), subs / "kim.ipynb")
    assert main(["grade", "linear", str(subs), "--out", str(tmp_path / "out")]) == 0
    row = next(csv.DictReader((tmp_path / "out" / "grades.csv").open()))
    assert (row["student"], row["verdict"], row["named_mistakes"]) == ("kim", "wrong", "bias-mean")
    (subs / "kim").mkdir()
    (subs / "kim" / "linear.py").write_text(RIGHT)
    capsys.readouterr()
    assert main(["grade", "linear", str(subs), "--out", str(tmp_path / "out2")]) == 0  # one student stops no class
    row = next(csv.DictReader((tmp_path / "out2" / "grades.csv").open()))
    assert row["verdict"] == "not checked" and "two submissions" in row["note"] and "keep one" in row["note"]


def test_adam_is_drawn_per_student_too():
    from learn.checker.optim_check import problem as _problem

    with variant(seed_of("adam", "alice")):
        alice = _problem()[0][0]
    with variant(seed_of("adam", "bob")):
        bob = _problem()[0][0]
    assert not torch.equal(alice, bob) and torch.equal(_problem()[0][0], _problem()[0][0])

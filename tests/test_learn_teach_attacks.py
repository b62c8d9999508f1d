"""A class that holds every attack of tests/learn_attacks.py beside honest students, graded by `learn grade` in one
run inside bubblewrap: the honest students get their right grades, no attack gets full marks, nothing is written
outside --out, no process is left behind, and grades.csv is unchanged long after the grader has exited."""

import csv
import os
import subprocess
import sys
import time

import tests.learn_attacks as attack
from learn.checker import planned
from tests.test_learn_sandbox import _processes_with


def test_a_class_of_attacks_leaves_the_honest_grades_and_nothing_else(tmp_path, bwrap):
    subs, out, victims = tmp_path / "subs", tmp_path / "out", tmp_path / "victims"
    for folder in (subs, victims):
        folder.mkdir()
    (victims / "victim.txt").write_text("x")
    honest = {
        "alice.py": attack.RIGHT,
        "bob.py": attack.WRONG,
        "carol.ipynb": attack.NOTEBOOK_MENTIONS_CHECK,
        "dave.ipynb": attack.NOTEBOOK_HOLDS_CHECK,
    }
    attacks = {
        "leftover.py": attack.leftover([out / "grades.csv", out / "students" / "leftover" / "results.json"]),
        "writer.py": attack.writes_outside(victims),
        "lifter.py": attack.LIFT_LIMITS,
        "importer.py": attack.IMPORT_SOLUTION,
        "subclasser.py": attack.SUBCLASS_LIBRARY,
        "reader.py": attack.READ_SOLUTION,
        "copier.py": attack.copy_classmate(subs / "alice.py"),
        "backdoor.py": attack.AUTOGRAD_BACK_DOOR,
        "engine.py": attack.AUTOGRAD_UNDER_THE_HOOD,
        "garbler.py": attack.MALFORMED,
        "halfer.py": attack.HALF_SENT,
        "killer.py": attack.KILL_GRADER,
        "namer.py": attack.OWN_MISTAKE,
        "deep.ipynb": attack.DEEP_NOTEBOOK,
        "nottext.ipynb": attack.NOT_TEXT_NOTEBOOK,
        "eve\nmallory: right, 10 of 10.py": attack.WRONG,
    }
    for name, text in {**honest, **attacks}.items():
        (subs / name).write_text(text)
    (subs / "mallory").symlink_to(attack.SOLUTION.parent, target_is_directory=True)
    before = sorted((p.name, p.stat().st_size) for p in subs.iterdir())
    env = {**os.environ, "PYTHONPATH": str(attack.ROOT), "LEARN_CHECK_TIME_LIMIT": "5", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "learn", "grade", "linear", str(subs), "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    grades = (out / "grades.csv").read_bytes()
    rows = {r["student"]: r for r in csv.DictReader((out / "grades.csv").open())}
    assert len(rows) == len(honest) + len(attacks) + 1  # every student, the link included
    for student in ("alice", "carol", "dave"):
        assert (rows[student]["verdict"], rows[student]["score"]) == ("right", str(len(planned("linear")))), rows[
            student
        ]
    assert rows["bob"]["verdict"] == "wrong" and rows["bob"]["named_mistakes"] == "bias-mean"
    attackers = {r: rows[r] for r in rows if r not in ("alice", "bob", "carol", "dave")}
    assert all(int(r["score"]) < int(r["max_score"]) for r in attackers.values()), attackers
    for student in ("backdoor", "engine"):
        assert "autograd-used" in rows[student]["named_mistakes"], rows[student]
    for student in ("importer", "subclasser"):
        assert "the library's own Linear" in rows[student]["note"], rows[student]
    assert "is a link" in rows["mallory"]["note"] and "malformed" in rows["garbler"]["note"]
    assert "ran for more than 5 s" in rows["halfer"]["note"] and rows["namer"]["named_mistakes"] == ""
    assert not any(line.startswith("mallory: right") for line in run.stdout.splitlines())  # no forged line
    assert (out / "summary.png").read_bytes()[:4] == b"\x89PNG"
    time.sleep(4)  # longer than the leftover process would have waited
    assert (out / "grades.csv").read_bytes() == grades and not _processes_with(attack.MARK)
    assert sorted(p.name for p in victims.iterdir()) == ["victim.txt"]
    assert sorted((p.name, p.stat().st_size) for p in subs.iterdir()) == before
    assert {p.name for p in tmp_path.iterdir()} == {"subs", "out", "victims"}

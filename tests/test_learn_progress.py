"""Progress: a passing check is recorded in .handgrad-progress.json beside the learner's file (written atomically);
`learn progress` and `learn list` tick what passes, in course order; --recheck drops what no longer passes and
adds a passing NAME.py; after the last exercise comes a closing line, never an empty `Next:`."""

import json

from learn.__main__ import main
from learn.exercises import BY_NAME, EXERCISES
from learn.progress import STATE, load, record, save
from learn.source import solution_text


def solve(folder, name, file=None):
    path = folder / (file or f"{name}.py")
    path.write_text(solution_text(BY_NAME[name], str(path)))
    return path


def test_a_pass_is_recorded_beside_the_file_and_the_next_exercise_named(tmp_path, capsys):
    path = solve(tmp_path, "linear")
    assert main(["check", "linear", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Next:  python -m learn train linear" in out and "python -m learn start relu" in out
    state = json.loads((tmp_path / STATE).read_text())
    assert state["passed"]["linear"]["file"] == "linear.py"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([STATE, "linear.py"])  # no temporary file left


def test_a_failing_check_records_nothing(tmp_path, capsys):
    path = solve(tmp_path, "relu")
    path.write_text(path.read_text().replace("dx = dout * self.mask", "dx = dout"))
    assert main(["check", "relu", str(path)]) == 1
    assert not (tmp_path / STATE).exists() and "Next:" not in capsys.readouterr().out


def test_after_the_last_exercise_a_closing_line_not_an_empty_next(tmp_path, capsys):
    last = EXERCISES[-1].name
    save(tmp_path, {e.name: {"file": f"{e.name}.py", "passed": "x"} for e in EXERCISES if e.name != last})
    assert main(["check", last, str(solve(tmp_path, last))]) == 0
    out = capsys.readouterr().out
    assert f"That was the last one: all {len(EXERCISES)} exercises pass" in out
    assert all(line.strip() != "Next:" for line in out.splitlines())
    assert set(load(tmp_path)) == set(BY_NAME)


def test_the_last_exercise_with_others_left_names_the_first_of_them(tmp_path, capsys):
    last = EXERCISES[-1].name
    assert main(["check", last, str(solve(tmp_path, last))]) == 0
    assert "python -m learn start linear" in capsys.readouterr().out


def test_progress_and_list_tick_what_passes_in_course_order(tmp_path, monkeypatch, capsys):
    for name in ("relu", "batchnorm"):
        record(name, str(solve(tmp_path, name)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HANDGRAD_LEARN_DIR", str(tmp_path))  # progress and list read the learner's work folder
    for command in (["progress"], ["list"]):
        assert main(command) == 0
        out = capsys.readouterr().out
        rows = [line for line in out.splitlines() if line.startswith("  [")]
        assert [r.split()[3] if r.startswith("  [ ]") else r.split()[2] for r in rows] == [e.name for e in EXERCISES]
        ticked = [r.split()[2] for r in rows if r.startswith("  [x]")]
        assert ticked == ["relu", "batchnorm"] and f"2 of {len(EXERCISES)} pass." in out
        assert "Next:  python -m learn start linear" in out


def test_recheck_drops_what_no_longer_passes_and_adds_a_passing_file(tmp_path, capsys):
    linear = solve(tmp_path, "linear")
    record("linear", str(linear))
    record("relu", str(solve(tmp_path, "relu")))
    linear.write_text(linear.read_text().replace("dbias = dout.sum(0)", "dbias = dout.mean(0)"))
    (tmp_path / "relu.py").unlink()
    solve(tmp_path, "tanh")  # never checked: found by its name
    (tmp_path / "mse.ipynb").write_text("{}")
    record("mse", str(tmp_path / "mse.ipynb"))  # a notebook passed in its own cell: kept, not re-run
    assert main(["progress", "--dir", str(tmp_path), "--recheck"]) == 0
    out = capsys.readouterr().out
    assert "linear: linear.py no longer passes" in out and "relu: relu.py is gone" in out
    assert "tanh: tanh.py passes" in out and set(load(tmp_path)) == {"tanh", "mse"}
    assert "mse: mse.ipynb kept as it was" in out


def test_an_unreadable_state_file_counts_as_nothing_passed(tmp_path, monkeypatch, capsys):
    (tmp_path / STATE).write_text("{not json")
    monkeypatch.setenv("HANDGRAD_LEARN_DIR", str(tmp_path))  # progress reads the learner's work folder
    assert main(["progress"]) == 0 and f"0 of {len(EXERCISES)} pass." in capsys.readouterr().out
    assert main(["progress", "--dir", str(tmp_path / "nowhere")]) == 2

"""The exercises: every worked solution passes the checker, every stub fails cleanly, and start/hint/list work."""

import json
from pathlib import Path

import pytest

from learn.__main__ import main
from learn.checker import check_file, check_path
from learn.checker.specs import SPECS
from learn.exercises import BY_NAME, EXERCISES
from learn.hints import HINTS
from learn.source import BEGIN, END, notebook, solution_text, stub_text

NAMES = [e.name for e in EXERCISES]


def test_the_learn_page_counts_what_the_code_holds():
    """docs/learn.md's counts are the registry's and the catalogue's (the README reads them the same way)."""
    from pathlib import Path

    from learn.checker.specs import catalogue

    text = (Path(__file__).resolve().parents[1] / "docs" / "learn.md").read_text()
    assert f"a place to practise: {len(EXERCISES)} exercises" in text
    assert f"holds {len(catalogue())} mistakes" in text
    for e in EXERCISES:
        assert f"`{e.name}`" in text, e.name


def test_every_exercise_has_a_check_hints_and_a_source_with_answer_regions():
    assert len(EXERCISES) >= 15 and set(SPECS) == set(BY_NAME) == set(HINTS)
    for e in EXERCISES:
        text = e.source.read_text()
        assert text.count(BEGIN) == text.count(END) >= 1, e.name
        assert "{check}" in text and len(text.splitlines()) < 400, e.name
        assert len(HINTS[e.name]) >= 2, e.name


@pytest.mark.parametrize("name", NAMES)
def test_the_worked_solution_passes(tmp_path, name):
    path = tmp_path / f"{name}.py"
    path.write_text(solution_text(BY_NAME[name], str(path)))
    code, text = check_file(name, path)
    assert code == 0 and text.rstrip().splitlines()[-1].startswith("PASS"), text


@pytest.mark.parametrize("name", NAMES)
def test_the_stub_fails_cleanly(tmp_path, name):
    path = tmp_path / f"{name}.py"
    path.write_text(stub_text(BY_NAME[name], str(path)))
    report = check_path(name, path)
    text = report.text()
    assert not report.passed and "not written yet" in text and "Traceback" not in text, text
    assert report.named[0] == "not-written"


@pytest.mark.parametrize("name", NAMES)
def test_the_stub_says_what_to_do_and_how_to_check_it(name):
    stub = stub_text(BY_NAME[name], "mine.py")
    assert "TODO" in stub and "# YOUR CODE HERE" in stub and BEGIN not in stub
    assert f"python -m learn check {name} {Path('mine.py').resolve()}" in stub and "1e-15" in stub
    assert BEGIN not in solution_text(BY_NAME[name], "mine.py")


def test_list_shows_every_exercise_in_order(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    positions = [out.index(f" {n} ") for n in NAMES]
    assert positions == sorted(positions) and "python -m learn start linear" in out


def test_start_writes_the_stub_and_refuses_to_overwrite(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HANDGRAD_LEARN_DIR", str(tmp_path))  # the learner's work folder (learn/files.py)
    assert main(["start", "linear"]) == 0
    assert (tmp_path / "linear.py").read_text() == stub_text(BY_NAME["linear"], str(tmp_path / "linear.py"))
    assert "python -m learn check linear\n" in capsys.readouterr().out  # the default file: check finds it
    assert main(["start", "linear"]) == 0  # the stub untouched: starting again is harmless
    assert "unchanged" in capsys.readouterr().out
    (tmp_path / "linear.py").write_text("my work")
    assert main(["start", "linear"]) == 2
    assert "--force" in capsys.readouterr().err and (tmp_path / "linear.py").read_text() == "my work"
    assert main(["start", "linear", "--force"]) == 0 and "YOUR CODE HERE" in (tmp_path / "linear.py").read_text()
    assert main(["start", "linear", "--solution"]) == 0
    assert (tmp_path / "linear_solution.py").read_text() == solution_text(
        BY_NAME["linear"], str(tmp_path / "linear_solution.py")
    )
    assert main(["start", "relu", "--out", "sub/relu.py"]) == 2  # no such folder: said, not a traceback
    assert "cannot write" in capsys.readouterr().err


def test_the_notebook_holds_the_stub_and_ends_with_the_check(tmp_path, monkeypatch):
    import nbformat

    monkeypatch.setenv("HANDGRAD_LEARN_DIR", str(tmp_path))
    assert main(["start", "batchnorm", "--notebook"]) == 0
    nb = nbformat.read(tmp_path / "batchnorm.ipynb", as_version=4)
    nbformat.validate(nb)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert code[0] + "\n" == stub_text(BY_NAME["batchnorm"], str(tmp_path / "batchnorm.py"))
    assert "check('batchnorm', BatchNorm1d)" in code[-1]
    assert json.loads((tmp_path / "batchnorm.ipynb").read_text())["nbformat"] == 4


def test_the_notebooks_check_cell_checks_the_class_defined_above(capsys):
    def run(text):
        nb, namespace = notebook(BY_NAME["tanh"], text(BY_NAME["tanh"], "tanh.py")), {}
        for k, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                exec(compile(cell.source, f"cell-{k}", "exec"), namespace)

    run(solution_text)
    assert "PASS" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="not written yet: cell-1 line 29"):  # the stub: the cell fails
        run(stub_text)


def test_hint_has_levels_the_last_nearly_the_answer(capsys):
    assert main(["hint", "linear"]) == 0
    first = capsys.readouterr().out
    assert "hint 1 of 3" in first and "--level 2" in first
    assert main(["hint", "linear", "--level", "9"]) == 0
    last = capsys.readouterr().out
    assert "hint 3 of 3" in last and "dout.T @ self.x" in last and "--solution" in last

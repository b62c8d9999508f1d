"""A notebook's check cell fails on a wrong answer: it raises AssertionError carrying the checker's report (a cell
that merely evaluates to False would run cleanly, and nbgrader would score it full), and passes on a right one."""

import nbformat
import pytest

from learn.__main__ import main
from learn.exercises import BY_NAME
from learn.source import solution_text


@pytest.fixture(autouse=True)
def work_folder(tmp_path, monkeypatch):
    """start writes into the learner's work folder: here, the test's own."""
    monkeypatch.setenv("HANDGRAD_LEARN_DIR", str(tmp_path))


def run_cells(path):
    """Execute a notebook file's code cells in order in one namespace, as a kernel would."""
    nb = nbformat.read(path, as_version=4)
    namespace = {}
    for k, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            exec(compile(cell.source, f"<cell {k}>", "exec"), namespace)


def written_notebook(tmp_path, monkeypatch, name, answer):
    """``learn start NAME --notebook``, with its code cell replaced by ``answer`` as a learner would fill it in."""
    monkeypatch.chdir(tmp_path)
    assert main(["start", name, "--notebook"]) == 0
    path = tmp_path / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "YOUR CODE HERE" in code[0].source and f"check({name!r}, {BY_NAME[name].cls})" in code[-1].source
    code[0].source = answer
    nbformat.write(nb, path)
    return path


def test_a_wrong_answer_makes_the_check_cell_raise_with_the_checkers_words(tmp_path, monkeypatch, capsys):
    right = solution_text(BY_NAME["linear"], "linear.py")
    path = written_notebook(
        tmp_path, monkeypatch, "linear", right.replace("dbias = dout.sum(0)", "dbias = dout.mean(0)")
    )
    with pytest.raises(AssertionError) as e:
        run_cells(path)
    assert "your bias.grad equals dout.mean(0)" in str(e.value) and "FAIL" in str(e.value)
    assert "PASS" not in capsys.readouterr().out


def test_an_unwritten_answer_raises_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["start", "relu", "--notebook"]) == 0
    with pytest.raises(AssertionError, match="ReLU.forward is not written yet"):
        run_cells(tmp_path / "relu.ipynb")


def test_a_right_answer_runs_clean_and_prints_pass(tmp_path, monkeypatch, capsys):
    path = written_notebook(tmp_path, monkeypatch, "sigmoid", solution_text(BY_NAME["sigmoid"], "sigmoid.py"))
    run_cells(path)
    assert "PASS" in capsys.readouterr().out

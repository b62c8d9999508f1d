"""`python -m learn` writes the learner's files into their work folder ($HANDGRAD_LEARN_DIR, ~/handgrad-learn, or a
temporary folder when home cannot be written), never into the directory it runs in, unless --out says so; `check
NAME` finds NAME.py there; a notebook is checked from its code cells, or refused in one line."""

import json
from pathlib import Path

import pytest

import learn.files
from learn.__main__ import main
from learn.exercises import BY_NAME
from learn.files import NotebookError, notebook_code, work_dir
from learn.source import solution_text


@pytest.fixture
def folders(tmp_path, monkeypatch):
    """(the directory the commands run in, the learner's work folder), the first empty."""
    here, work = tmp_path / "checkout", tmp_path / "work"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setenv("HANDGRAD_LEARN_DIR", str(work))
    return here, work


def test_start_show_and_check_use_the_work_folder_and_leave_the_current_one_alone(folders, capsys):
    here, work = folders
    assert main(["start", "linear"]) == 0
    assert f"wrote {work / 'linear.py'}:" in capsys.readouterr().out
    (work / "linear.py").write_text(solution_text(BY_NAME["linear"], str(work / "linear.py")))
    assert main(["check", "linear"]) == 0 and "PASS" in capsys.readouterr().out  # NAME.py found there
    assert main(["check", "relu"]) == 2
    assert (
        f"Cannot check {work / 'relu.py'}: it does not exist; python -m learn start relu writes it there"
        in capsys.readouterr().err
    )
    assert main(["show"]) == 0
    assert f"wrote {work / 'backprop.html'}:" in capsys.readouterr().out and (work / "backprop.html").stat().st_size
    assert main(["start", "relu", "--notebook"]) == 0 and (work / "relu.ipynb").is_file()
    assert list(here.iterdir()) == []
    assert main(["start", "tanh", "--out", "tanh.py"]) == 0 and (here / "tanh.py").is_file()  # asked for


def test_the_work_folder_is_home_or_else_a_temporary_one(tmp_path, monkeypatch):
    monkeypatch.delenv("HANDGRAD_LEARN_DIR", raising=False)
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: tmp_path / "home"))
    monkeypatch.setattr(learn.files.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    assert work_dir() == tmp_path / "home" / "handgrad-learn" and work_dir().is_dir()
    blocked = tmp_path / "file"
    blocked.write_text("a file where home should be: nothing can be made under it")
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: blocked))
    assert work_dir().parent == tmp_path / "tmp" and work_dir().name.startswith("handgrad-learn-")


def test_a_notebook_is_checked_from_its_code_cells(folders, capsys):
    here, work = folders
    assert main(["start", "linear", "--notebook", "--solution"]) == 0
    nb = work / "linear_solution.ipynb"
    assert '"execution_count": null' in nb.read_text()  # as Jupyter writes an unrun cell
    capsys.readouterr()
    assert main(["check", "linear", str(nb)]) == 0
    out = capsys.readouterr().out
    assert f"(the code cells of {nb}, joined: line N is the Nth line of their code)" in out and "PASS" in out
    assert "learn train" not in out  # train reads a .py
    assert main(["start", "linear", "--notebook"]) == 0
    capsys.readouterr()
    assert main(["check", "linear", str(work / "linear.ipynb")]) == 1
    assert "not written yet" in capsys.readouterr().out


def test_magics_are_kept_as_inert_lines_and_the_check_cell_is_dropped(tmp_path):
    nb = tmp_path / "x.ipynb"
    cells = [
        {"cell_type": "markdown", "source": ["# title"]},
        {"cell_type": "code", "source": ["%matplotlib inline\n", "if True:\n", "    !ls\n", "a = 1"]},
        {"cell_type": "code", "source": "check_class('linear', Linear)"},
    ]
    nb.write_text(json.dumps({"cells": cells, "nbformat": 4}))
    assert notebook_code(nb) == "pass  # %matplotlib inline\nif True:\n    pass  # !ls\na = 1\n"


@pytest.mark.parametrize(
    "text, says",
    [
        ('{"nbformat": 4}', "is not a Jupyter notebook (nbformat 4 JSON with 'cells'): no 'cells'"),
        ("not json", "is not a Jupyter notebook (nbformat 4 JSON with 'cells'): Expecting value"),
        ('{"cells": [{"cell_type": "markdown", "source": "hi"}]}', "has no code cells to check"),
    ],
)
def test_a_notebook_that_cannot_be_read_is_refused_in_one_line(tmp_path, capsys, text, says):
    nb = tmp_path / "x.ipynb"
    nb.write_text(text)
    with pytest.raises(NotebookError, match=says.replace("(", r"\(").replace(")", r"\)")):
        notebook_code(nb)
    assert main(["check", "linear", str(nb)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and says in err and "Traceback" not in err

"""python -m learn check's exit status (0 right, 1 wrong, 2 unusable file), never a traceback, and show/trace."""

import subprocess
import sys
from pathlib import Path

import pytest

from learn.__main__ import main
from learn.exercises import BY_NAME
from learn.source import solution_text

ROOT = Path(__file__).resolve().parents[1]


def run_learn(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "learn", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HANDGRAD_LEARN_DIR": str(cwd)},
        timeout=120,
    )


def test_a_new_user_goes_from_start_to_a_wrong_answer_to_a_right_one(tmp_path, monkeypatch, capsys):
    assert run_learn("start", "linear", cwd=tmp_path).returncode == 0  # python -m learn itself, twice
    right = solution_text(BY_NAME["linear"], "linear.py")
    (tmp_path / "linear.py").write_text(right.replace("dbias = dout.sum(0)", "dbias = dout.mean(0)"))
    wrong = run_learn("check", "linear", "linear.py", cwd=tmp_path)
    assert wrong.returncode == 1 and "your bias.grad equals dout.mean(0)" in wrong.stdout and not wrong.stderr
    monkeypatch.chdir(tmp_path)  # the rest in this process: the same main()
    (tmp_path / "linear.py").write_text(right)
    assert main(["check", "linear", "linear.py"]) == 0 and "PASS" in capsys.readouterr().out
    assert main(["start", "linear", "--out", "again.py"]) == 0
    assert main(["check", "linear", "again.py"]) == 1 and "not written yet" in capsys.readouterr().out


@pytest.mark.parametrize(
    "content, says",
    [
        (None, "does not exist"),
        ("class Linear:\n    def forward(self, x)\n        return x\n", "not valid Python: expected ':' at line 2"),
        ("import torch\nclass Lin:\n    pass\n", "has no class Linear; it defines Lin"),
        ("import numpyy\nclass Linear:\n    pass\n", "raised ModuleNotFoundError while it was loaded at line 1"),
    ],
)
def test_a_file_that_cannot_be_checked_exits_2(tmp_path, capsys, content, says):
    path = tmp_path / "linear.py"
    if content is not None:
        path.write_text(content)
    assert main(["check", "linear", str(path)]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_an_exception_in_the_learners_code_is_a_wrong_answer_with_its_line(tmp_path, capsys):
    path = tmp_path / "relu.py"
    text = solution_text(BY_NAME["relu"], str(path)).replace("dx = dout * self.mask", "dx = dout * self.maks")
    path.write_text(text)
    assert main(["check", "relu", str(path)]) == 1
    out = capsys.readouterr().out
    line = text.splitlines().index("        dx = dout * self.maks") + 1
    assert f"ReLU.backward raised AttributeError at relu.py line {line}:" in out and "self.maks" in out


@pytest.mark.parametrize("command", [["show", "--out", "page.html"], ["trace", "--help"]])
def test_show_and_trace_say_so_when_their_module_is_missing(monkeypatch, capsys, command):
    monkeypatch.setitem(sys.modules, f"learn.{'page' if command[0] == 'show' else 'trace'}", None)
    assert main(command) == 2
    assert "not in this copy of handgrad yet" in capsys.readouterr().err


def test_trace_hands_its_arguments_on(monkeypatch):
    import types

    seen = []
    monkeypatch.setitem(sys.modules, "learn.trace", types.SimpleNamespace(main=lambda argv: seen.append(argv) or 0))
    assert main(["trace", "--model", "mlp", "-h"]) == 0 and seen == [["--model", "mlp", "-h"]]


def test_an_unknown_exercise_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        main(["check", "linearr", "x.py"])
    assert e.value.code == 2 and "invalid choice" in capsys.readouterr().err

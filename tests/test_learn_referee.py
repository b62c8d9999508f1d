"""The checker is the referee, not a guest of the code it judges: the learner's code runs in a bounded child
process, cannot reach the expected values or the verdict, may not use autograd, and whatever it does to end or
escape the check (an endless loop, a huge allocation, an exit, a flood of output, a file written) gives one line
and exit 2, never a hang, a traceback or a PASS."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from learn.__main__ import main
from learn.checker import check_class, check_file, sandbox
from learn.exercises import BY_NAME
from learn.source import solution_text
from tests.test_learn_cli import ROOT, run_learn
from tests.test_learn_mistakes import learner_file


@pytest.fixture
def short_limit(monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 4.0)


def _check(tmp_path, name, changes):
    return check_file(name, learner_file(tmp_path, name, changes))


STOPS = [  # (what the learner's file does, the change to relu's solution, what the one line says)
    ("an endless loop in forward", ("out = x * self.mask", "while True:\n            pass"), "ran for more than"),
    ("a long sleep in backward", ("dx = dout * self.mask", "import time; time.sleep(60)"), "ran for more than"),
    ("an endless loop at import", ("import torch", "import torch\nwhile True:\n    pass"), "ran for more than"),
    ("a huge allocation", ("out = x * self.mask", "out = torch.empty(10 ** 12)"), "more memory than"),
    ("sys.exit in backward", ("dx = dout * self.mask", "import sys; sys.exit(0)"), "called sys.exit(0)"),
    ("os._exit in forward", ("out = x * self.mask", "import os; os._exit(0)"), "ended the check's process"),
    ("a KeyboardInterrupt", ("dx = dout * self.mask", "raise KeyboardInterrupt"), "raised KeyboardInterrupt"),
    (
        "megabytes of printing",
        ("dx = dout * self.mask", "print('x' * 3_000_000)\n        dx = dout * self.mask"),
        "printed (or wrote) more than 1 MB",
    ),
    (
        "a file written into learn/",
        ("import torch", f"import torch\nopen({str(ROOT / 'learn' / 'pwned.py')!r}, 'w')"),
        "tried to write",
    ),
    ("a subprocess", ("import torch", "import torch, subprocess\nsubprocess.run(['true'])"), "start a process"),
]


@pytest.mark.parametrize("what, change, says", STOPS, ids=[s[0] for s in STOPS])
def test_code_that_breaks_out_gets_one_line_and_exit_2(tmp_path, short_limit, what, change, says):
    start = time.monotonic()
    code, text = _check(tmp_path, "relu", [change])
    assert code == 2 and says in text and "Traceback" not in text, text
    assert len(text.strip().splitlines()) == 1, text
    assert time.monotonic() - start < 30
    assert not (ROOT / "learn" / "pwned.py").exists()


def test_a_file_written_in_the_learners_own_folder_is_refused(tmp_path):
    target = tmp_path / "notes.txt"
    code, text = _check(tmp_path, "relu", [("import torch", f"import torch\nopen({str(target)!r}, 'w').write('x')")])
    assert code == 2 and "tried to write" in text and not target.exists()


def test_a_file_in_the_temporary_folder_is_fine(tmp_path):
    code, text = _check(tmp_path, "relu", [("import torch", "import torch\nopen('scratch.txt', 'w').write('x')")])
    assert code == 0, text


def test_an_exit_after_a_wrong_answer_is_still_wrong(tmp_path):
    """The verdict and the exit status are the checker's: an atexit hook or os._exit in the child cannot make a
    wrong answer right."""
    changes = [
        ("import torch", "import atexit, os, torch\natexit.register(lambda: os._exit(0))"),
        ("dx = dout * self.mask", "dx = dout * ~self.mask"),
    ]
    code, text = _check(tmp_path, "relu", changes)
    assert code == 1 and "FAIL" in text


def test_patching_the_checker_from_the_learners_file_changes_nothing(tmp_path):
    patch = (
        "import torch\nimport learn.checker.layer_check as lc, learn.checker.compare as cmp\n"
        "from learn.checker.report import Report\n"
        "lc.check_layer = lambda *a, **k: Report('patched')\ncmp.same = lambda *a, **k: True\n"
        "cmp.rel_error = lambda *a, **k: 0.0\n"
    )
    code, text = _check(tmp_path, "linear", [("import torch", patch), ("dbias = dout.sum(0)", "dbias = dout.mean(0)")])
    assert code == 1 and "bias.grad" in text


def test_the_expected_values_are_not_on_the_learners_call_stack(tmp_path):
    """A backward that searches every frame above it for the checker's expected gradients finds none."""
    steal = """import sys
        f, found = sys._getframe(), None
        while f is not None:
            for v in list(f.f_locals.values()):
                grads = getattr(v, "grads", None)
                if isinstance(grads, dict) and "dx" in grads:
                    found = grads["dx"]
                    for t in grads.values():
                        t.zero_()  # and spoil the checker's copy
            f = f.f_back
        dx = found if found is not None else dout * 0"""
    code, text = _check(tmp_path, "relu", [("dx = dout * self.mask", steal)])
    assert code == 1 and "WRONG  dx" in text


def test_a_tensor_subclass_is_refused(tmp_path):
    sub = (
        "import torch\n\n\nclass Zero(torch.Tensor):\n    def __sub__(self, other):\n"
        "        return torch.zeros_like(torch.Tensor(self))\n    __rsub__ = __sub__\n"
    )
    code, text = _check(tmp_path, "relu", [("import torch", sub), ("return dx", "return dx.as_subclass(Zero)")])
    assert code == 1 and "a Zero (a subclass of torch.Tensor" in text


@pytest.mark.parametrize(
    "line",
    [
        "torch.relu(x_).backward(dout)\n        dx = x_.grad",
        "(dx,) = torch.autograd.grad(torch.relu(x_), x_, dout)",
        "dx = torch.func.vjp(torch.relu, x_)[1](dout)[0]",
    ],
)
def test_autograd_is_refused_with_one_line(tmp_path, line):
    changes = [
        ("self.mask = x > 0  #", "self.x = x\n        self.mask = x > 0  #"),
        ("dx = dout * self.mask", "x_ = self.x.clone().requires_grad_()\n        " + line),
    ]
    path = learner_file(tmp_path, "relu", changes)
    code, text = check_file("relu", path)
    assert code == 1 and "no autograd here: write the gradient by hand" in text and "relu.py line" in text, text


def test_autograd_is_refused_in_a_notebook_too(capsys):
    namespace = {}
    code = solution_text(BY_NAME["tanh"], "tanh.py").replace(
        "dx = dout * (1 - self.out ** 2)",
        "x = torch.atanh(self.out).requires_grad_()\n        torch.tanh(x).backward(dout)\n        dx = x.grad",
    )
    exec(compile(code, "cell-1", "exec"), namespace)
    assert check_class("tanh", namespace["Tanh"]) is False
    assert "no autograd here" in capsys.readouterr().out


def test_the_notebook_path_is_bounded_too(capsys, short_limit):
    class ReLU:
        def forward(self, x):
            while True:
                pass

    assert check_class("relu", ReLU) is False
    assert "ran for more than" in capsys.readouterr().out


def test_a_forward_that_disagrees_with_its_own_central_differences_fails(tmp_path):
    """Right outputs and gradients on the checked calls, another function under the central differences."""
    changes = [
        ("    def forward(self, x):\n", "    calls = 0\n\n    def forward(self, x):\n"),
        (
            "out = x @ self.weight.T + self.bias  # (N, H)",
            "out = x @ self.weight.T + self.bias  # (N, H)\n        Linear.calls += 1\n"
            "        if Linear.calls > 2:\n            out = out * 0",
        ),
    ]
    code, text = _check(tmp_path, "linear", changes)
    assert code == 1 and "central differences of your forward" in text and "disagree" in text, text


def test_what_the_learners_code_prints_is_shown(tmp_path):
    code, text = _check(
        tmp_path, "relu", [("dx = dout * self.mask", "print('dx shape', dout.shape)\n        dx = dout * self.mask")]
    )
    assert code == 0 and "your code printed:" in text and "| dx shape torch.Size([3, 5])" in text


def _children(pid: int) -> list[str]:
    """The forked children of ``pid`` (their command line is the parent's): the check's sandbox, not a helper
    program something runs while it imports."""
    try:
        own = Path(f"/proc/{pid}/cmdline").read_bytes()
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return [k for k in kids if Path(f"/proc/{k}/cmdline").read_bytes() == own]
    except OSError:
        return []


def test_ctrl_c_in_the_checker_gives_one_line(tmp_path):
    path = learner_file(tmp_path, "relu", [("out = x * self.mask", "while True:\n            pass")])
    proc = subprocess.Popen(
        [sys.executable, "-m", "learn", "check", "relu", str(path)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    deadline = time.monotonic() + 90
    while not _children(proc.pid) and time.monotonic() < deadline:  # wait for the check's child to be running
        time.sleep(0.2)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err and err.strip() == f"interrupted: {path} was not checked"


def test_the_cli_exit_status_of_a_stopped_check_is_2(tmp_path, capsys, short_limit):
    path = learner_file(tmp_path, "relu", [("dx = dout * self.mask", "import os; os._exit(0)")])
    assert main(["check", "relu", str(path)]) == 2
    assert "ended the check's process" in capsys.readouterr().err


def test_a_subprocess_run_of_the_cli_is_fast_and_exits_2_on_an_exit(tmp_path):
    path = learner_file(tmp_path, "relu", [("dx = dout * self.mask", "import sys; sys.exit(0)")])
    result = run_learn("check", "relu", path, cwd=tmp_path)
    assert result.returncode == 2 and "called sys.exit(0)" in result.stderr

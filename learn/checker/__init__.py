"""The checker: runs a learner's class beside torch.autograd and names the mistake (``python -m learn check``).

``check_file(name, path)`` -> (exit status, report text): 0 right, 1 wrong, 2 a file that cannot be loaded, lacks
the class, or whose code broke out of the check (time, memory, an exit, a file written).  ``check_class(name, cls)``
checks a class object (a notebook's) and prints the report.  ``check_path`` returns the Report itself, whose
``items`` (each checked item's outcome) a grader turns into tests; ``planned(name)`` lists those items without a
learner.  The learner's code runs in a child process (sandbox.py); the expected values and the verdict stay in
this one.
"""
from __future__ import annotations

import inspect
from pathlib import Path

from ..exercises import get
from .load import LoadError, load_class
from .configs import variant
from .report import Report
from .sandbox import Escaped, Sandbox


def planned(name: str) -> list[str]:
    """The items exercise ``name``'s check decides, in order (a grader's tests)."""
    from .layer_check import planned as layer_items
    from .specs import SPECS
    spec = SPECS[get(name).name]
    return spec.planned() if hasattr(spec, "planned") else layer_items(spec)


def run(name: str, load) -> Report:
    """The check of exercise ``name`` on the class that ``load()`` returns (with its code's filename), ``load``
    run in the learner's process.  Raises LoadError (the file cannot be used) or Escaped (its code broke out)."""
    from .layer_check import check_layer
    from .specs import SPECS
    spec = SPECS[name]
    with Sandbox(load, name) as box:
        report = spec.check(box, box.where) if hasattr(spec, "check") else check_layer(spec, box, box.where)
        printed = box.printed()
    if printed.strip():
        report.say("  your code printed:\n" + "\n".join("    | " + ln for ln in printed.rstrip().splitlines()))
    return report


def check_path(name: str, path: Path, seed: int | None = None) -> Report:
    """The check of the learner's file (its configurations drawn from ``seed``, None: the fixed ones); raises
    LoadError when the file cannot be used, Escaped when its code broke out of the check."""
    ex = get(name)
    path = Path(path)
    real = path.absolute()  # the learner's code runs in a temporary folder
    with variant(seed):
        return run(ex.name, lambda: (load_class(real, ex.cls, ex.name, shown=path), str(real)))


def check_file(name: str, path: Path) -> tuple[int, str]:
    """-> (exit status, the report's text): 0 right, 1 wrong, 2 a file that cannot be checked."""
    try:
        report = check_path(name, path)
    except LoadError as e:
        return 2, f"Cannot check {path}: {e}\n"
    except Escaped as e:
        return 2, f"Stopped checking {path}: {e}\n"
    return (0 if report.passed else 1), report.text()


def check_class(name: str, cls: type) -> bool:
    """Check a class defined elsewhere (a notebook cell); print the report; True when it is right."""
    ex = get(name)
    # where its methods were compiled: a file, or a notebook cell (which has no module file to ask inspect for)
    where = next((f.__code__.co_filename for f in vars(cls).values() if inspect.isfunction(f)), None)
    try:
        report = run(ex.name, lambda: (cls, where))
    except (LoadError, Escaped) as e:
        print(f"Stopped checking {cls.__name__}: {e}")
        return False
    print(report.text(), end="")
    return report.passed

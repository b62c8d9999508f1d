"""The checker: runs a learner's class beside torch.autograd and names the mistake (``python -m learn check``).

``check_file(name, path)`` -> (exit status, report text): 0 right, 1 wrong, 2 a file that cannot be loaded or
lacks the class.  ``check_class(name, cls)`` checks a class object (a notebook's) and prints the report.
"""
from __future__ import annotations

import inspect
from pathlib import Path

from ..exercises import get
from .load import LoadError, load_class
from .report import Report


def run(name: str, cls: type, where: str | None) -> Report:
    """The check of exercise ``name`` on ``cls``; ``where``: the filename of its code, for line numbers."""
    from .layer_check import check_layer
    from .spec import LayerSpec
    from .specs import SPECS
    spec = SPECS[name]
    return check_layer(spec, cls, where) if isinstance(spec, LayerSpec) else spec.check(cls, where)


def check_path(name: str, path: Path) -> Report:
    """The check of the learner's file; raises LoadError when the file cannot be used."""
    ex = get(name)
    return run(ex.name, load_class(Path(path), ex.cls, ex.name), str(path))


def check_file(name: str, path: Path) -> tuple[int, str]:
    """-> (exit status, the report's text): 0 right, 1 wrong, 2 a file that cannot be loaded or lacks the class."""
    try:
        report = check_path(name, path)
    except LoadError as e:
        return 2, f"Cannot check {path}: {e}\n"
    return (0 if report.passed else 1), report.text()


def check_class(name: str, cls: type) -> bool:
    """Check a class defined elsewhere (a notebook cell); print the report; True when it is right."""
    ex = get(name)
    # where its methods were compiled: a file, or a notebook cell (which has no module file to ask inspect for)
    where = next((f.__code__.co_filename for f in vars(cls).values() if inspect.isfunction(f)), None)
    report = run(ex.name, cls, where)
    print(report.text(), end="")
    return report.passed

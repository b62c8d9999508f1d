"""Loading the learner's file: one that cannot be used (missing, not Python, no such class, handgrad's own class
instead of theirs) is a LoadError, exit 2."""

from __future__ import annotations

import ast
import linecache
import sys
import traceback
import types
from pathlib import Path

# handgrad's own packages and modules (boundary.PROJECT): a class from one of them is not the learner's
OWN = (
    "learn",
    "layers",
    "models",
    "losses",
    "optimizers",
    "autodiff",
    "checking",
    "training",
    "monitoring",
    "kernels",
    "gradcheck",
    "train",
    "sample",
)


class LoadError(Exception):
    """The learner's file cannot be checked at all; the message says why in plain words."""


def load_class(path: Path, cls_name: str, exercise: str, shown: Path | None = None, source: str | None = None) -> type:
    """Run the learner's file as a fresh module and return its class ``cls_name``; ``shown``: the path as the
    learner gave it, for the messages (``path`` itself may be made absolute); ``source``: the code to run, where
    it is not the file's text (a notebook's code cells)."""
    real, path = path, (shown if shown is not None else path)
    given = source is not None
    if not given:
        if not real.is_file():
            why = "is a folder" if real.is_dir() else "does not exist"
            raise LoadError(f"{path} {why}.  Start the exercise with: python -m learn start {exercise} --out {path}")
        try:
            source = real.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise LoadError(f"cannot read {path}: {e}") from None
    try:
        code = compile(source, str(real), "exec")
    except (SyntaxError, ValueError) as e:  # ValueError: a NUL byte in the source
        if not isinstance(e, SyntaxError):
            raise LoadError(f"{path} is not valid Python: {e}") from None
        text = (e.text or "").rstrip("\n")
        caret = f"\n    {' ' * max((e.offset or 1) - 1, 0)}^" if text else ""
        raise LoadError(f"{path} is not valid Python: {e.msg} at line {e.lineno}:\n    {text}{caret}") from None
    if given:  # tracebacks and the guard's reports read lines through linecache: these, not the file's
        linecache.cache[str(real)] = (len(source), None, source.splitlines(True), str(real))
    module = types.ModuleType(f"_learner_{exercise}")
    module.__file__ = str(real)
    sys.modules[module.__name__] = module  # dataclasses and pickling look a class's module up here
    try:
        exec(code, module.__dict__)
    except (Exception, SystemExit) as e:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == str(real)]
        at = f" at line {frames[-1].lineno}:\n    {frames[-1].line}" if frames else ""
        own = _own_import(e, frames[-1].line if frames else "")
        if own:
            raise LoadError(
                f"{path} uses the library's own {own}, not yours{at}\n  the check holds none of "
                f"handgrad's code: the class checked is the one you write"
            ) from None
        raise LoadError(f"{path} raised {type(e).__name__} while it was loaded{at}\n  {e}") from None
    cls = module.__dict__.get(cls_name)
    if not isinstance(cls, type):
        found = sorted(k for k, v in module.__dict__.items() if isinstance(v, type) and v.__module__ == module.__name__)
        has = f"; it defines {', '.join(found)}" if found else ""
        raise LoadError(
            f"{path} has no class {cls_name}{has}.  The checker of {exercise} looks for class "
            f"{cls_name} (python -m learn start {exercise} writes a file to fill in)"
        )
    return cls


def _own_import(e: BaseException, line: str) -> str:
    """What of handgrad's own code the failed import on ``line`` asked for ("Linear", "layers"), or ""."""
    name = getattr(e, "name", None) if isinstance(e, ImportError) else None
    if not name or name.split(".")[0] not in OWN:
        return ""
    try:
        node = ast.parse(line.strip()).body[0]
    except (SyntaxError, IndexError):
        return name
    if isinstance(node, ast.ImportFrom):
        return ", ".join(a.name for a in node.names) + f" (from {node.module})"
    return name


def library_origin(cls: type) -> str:
    """Which of handgrad's own classes (or methods) ``cls`` is or takes after ("Linear (layers.linear)"), or ""
    when it is the learner's own."""
    for k in cls.__mro__:
        module = getattr(k, "__module__", "") or ""
        if module.split(".")[0] in OWN:
            return f"{k.__name__} ({module})"
    for name, member in vars(cls).items():
        fn = getattr(member, "__func__", member)
        module = getattr(fn, "__module__", "") or ""
        if callable(fn) and module.split(".")[0] in OWN:
            return f"{getattr(fn, '__qualname__', name)} ({module})"
    return ""

"""Loading the learner's file: one that cannot be used (missing, not Python, no such class) is a LoadError, exit 2."""
from __future__ import annotations

import sys
import traceback
import types
from pathlib import Path


class LoadError(Exception):
    """The learner's file cannot be checked at all; the message says why in plain words."""


def load_class(path: Path, cls_name: str, exercise: str, shown: Path | None = None) -> type:
    """Run the learner's file as a fresh module and return its class ``cls_name``; ``shown``: the path as the
    learner gave it, for the messages (``path`` itself may be made absolute)."""
    real, path = path, (shown if shown is not None else path)
    if not real.is_file():
        why = "is a folder" if real.is_dir() else "does not exist"
        raise LoadError(f"{path} {why}.  Start the exercise with: python -m learn start {exercise} --out {path}")
    try:
        source = real.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise LoadError(f"cannot read {path}: {e}") from None
    try:
        code = compile(source, str(real), "exec")
    except SyntaxError as e:
        text = (e.text or "").rstrip("\n")
        caret = f"\n    {' ' * max((e.offset or 1) - 1, 0)}^" if text else ""
        raise LoadError(f"{path} is not valid Python: {e.msg} at line {e.lineno}:\n    {text}{caret}") from None
    module = types.ModuleType(f"_learner_{exercise}")
    module.__file__ = str(real)
    sys.modules[module.__name__] = module  # dataclasses and pickling look a class's module up here
    try:
        exec(code, module.__dict__)
    except (Exception, SystemExit) as e:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == str(real)]
        at = f" at line {frames[-1].lineno}:\n    {frames[-1].line}" if frames else ""
        raise LoadError(f"{path} raised {type(e).__name__} while it was loaded{at}\n  {e}") from None
    cls = module.__dict__.get(cls_name)
    if not isinstance(cls, type):
        found = sorted(k for k, v in module.__dict__.items() if isinstance(v, type) and v.__module__ == module.__name__)
        has = f"; it defines {', '.join(found)}" if found else ""
        raise LoadError(f"{path} has no class {cls_name}{has}.  The checker of {exercise} looks for class "
                        f"{cls_name} (python -m learn start {exercise} writes a file to fill in)")
    return cls

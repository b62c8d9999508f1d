"""Where ``python -m learn`` writes the learner's files, and the code it reads out of a notebook.

``start`` and ``show`` write into a work folder of the learner's, never into the directory they happen to run in
(often the handgrad checkout): ``$HANDGRAD_LEARN_DIR`` if set, else ``~/handgrad-learn``, else (a home that
cannot be written, as for a system user) ``handgrad-learn-USER`` in the temporary directory.  ``--out`` names any
other file.  ``check NAME`` without a file reads NAME.py from the same folder.
"""

from __future__ import annotations

import getpass
import json
import os
import shlex
import tempfile
from pathlib import Path


def work_dir(create: bool = True) -> Path:
    """The learner's work folder (module docstring), made if ``create``; OSError if even the fallback fails."""
    given = os.environ.get("HANDGRAD_LEARN_DIR")
    candidates = [Path(given).expanduser()] if given else [*_home(), _temp_dir()]
    if not create:
        return next((c for c in candidates if c.is_dir()), candidates[0])
    error = None
    for folder in candidates:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if os.access(folder, os.W_OK):
                return folder
        except OSError as e:
            error = e
    raise error or PermissionError(f"cannot write into {candidates[-1]}")


def _home() -> list[Path]:
    try:
        return [Path.home() / "handgrad-learn"]
    except (KeyError, RuntimeError):  # no $HOME and no home for this uid
        return []


def _temp_dir() -> Path:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid
        user = str(os.getuid())
    return Path(tempfile.gettempdir()) / f"handgrad-learn-{user}"


def check_command(name: str, file: str | Path | None = None) -> str:
    """The command that checks ``file`` as exercise ``name``, written so that it works as printed wherever the learner
    stands: the work folder's ``NAME.py`` (the default, also when ``file`` is None) needs no file name; any other
    file is named by its absolute path."""
    if file is not None:
        path = Path(file).expanduser().resolve()
        if path != (work_dir(create=False) / f"{name}.py").resolve():
            return f"python -m learn check {name} {shlex.quote(str(path))}"
    return f"python -m learn check {name}"


class NotebookError(ValueError):
    """A notebook whose code cannot be read: the message is one line."""


def notebook_code(path: Path) -> str:
    """The code cells of the notebook at ``path``, joined, without its checking cells, IPython's ``!shell`` and
    ``%magic`` lines made inert; NotebookError if it cannot be read.  A checking cell is known by its metadata
    (``learn start --notebook`` marks it; nbgrader marks its test cells) or by being nothing but a check (imports
    from learn and calls of ``check``/``check_class``), never by a word in the learner's text: an answer cell that
    also calls the check keeps its code (inside the check the call does nothing)."""
    try:
        nb = json.loads(Path(path).read_text(encoding="utf-8"))
        cells = nb["cells"]
        if not isinstance(cells, list):
            raise TypeError("'cells' is not a list")
    except (OSError, UnicodeDecodeError) as e:
        raise NotebookError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        what = f"no {e}" if isinstance(e, KeyError) else str(e).split("\n")[0][:200] or type(e).__name__
        raise NotebookError(f"{path} is not a Jupyter notebook (nbformat 4 JSON with 'cells'): {what}") from None
    parts = []
    for k, cell in enumerate(cells):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        if isinstance(source, list) and all(isinstance(line, str) for line in source):
            source = "".join(source)
        if not isinstance(source, str):
            raise NotebookError(f"{path}: code cell {k + 1}'s source is not text")
        if is_check_cell(cell.get("metadata"), source):
            continue
        lines = [_inert(line) if line.lstrip().startswith(("!", "%")) else line for line in source.splitlines()]
        parts.append("\n".join(lines))
    if not any(p.strip() for p in parts):
        raise NotebookError(f"{path} has no code cells to check (its only code is the check)")
    return "\n\n".join(parts) + "\n"


CHECK_META = "handgrad"  # a cell's metadata key: {"check": NAME} on the checking cell learn start writes


def is_check_cell(metadata, source: str) -> bool:
    """A checking cell: marked so in its metadata, an nbgrader test cell (graded, not a solution), or code that is
    nothing but imports from learn and calls of check or check_class (a notebook written before the marks)."""
    if isinstance(metadata, dict):
        if isinstance(metadata.get(CHECK_META), dict) and metadata[CHECK_META].get("check"):
            return True
        grader = metadata.get("nbgrader")
        if isinstance(grader, dict) and grader.get("grade") is True and not grader.get("solution"):
            return True
    import ast

    try:
        body = ast.parse(source).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    checks = 0
    for node in body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "learn":
            continue
        call = node.test if isinstance(node, ast.Assert) else node.value if isinstance(node, ast.Expr) else None
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id in ("check", "check_class", "register")
        ):
            checks += call.func.id != "register"
            continue
        return False
    return checks > 0


def _inert(line: str) -> str:
    """An IPython ``!shell`` or ``%magic`` line as a ``pass`` that keeps its indentation and its line number."""
    body = line.lstrip()
    return line[: len(line) - len(body)] + "pass  # " + body

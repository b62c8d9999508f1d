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
    """The code cells of the notebook at ``path``, joined, without its checking cell (``check(...)`` from
    ``learn.cell``, or an older notebook's ``check_class(...)``, which the checker replaces) and without IPython's ``!shell`` and ``%magic`` lines; NotebookError if unreadable."""
    try:
        nb = json.loads(path.read_text())
        cells = nb["cells"]
    except (OSError, UnicodeDecodeError) as e:
        raise NotebookError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    except (ValueError, KeyError, TypeError) as e:
        what = f"no {e}" if isinstance(e, KeyError) else str(e).split("\n")[0]
        raise NotebookError(f"{path} is not a Jupyter notebook (nbformat 4 JSON with 'cells'): {what}") from None
    parts = []
    for cell in cells:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        if "check_class(" in source or "from learn.cell import check" in source:
            continue
        lines = [_inert(line) if line.lstrip().startswith(("!", "%")) else line for line in source.splitlines()]
        parts.append("\n".join(lines))
    if not any(p.strip() for p in parts):
        raise NotebookError(f"{path} has no code cells to check")
    return "\n\n".join(parts) + "\n"


def _inert(line: str) -> str:
    """An IPython ``!shell`` or ``%magic`` line as a ``pass`` that keeps its indentation and its line number."""
    body = line.lstrip()
    return line[:len(line) - len(body)] + "pass  # " + body

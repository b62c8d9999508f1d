"""Where the learner's process runs for a grader, and as whom: bubblewrap's flags, the file system it sees, and
the unprivileged user where bubblewrap cannot run.

The view (``VIEW``, ``write_view``) is the check's own few files, all of handgrad the child imports, beside
stand-ins that raise ImportError for every other package of handgrad; bubblewrap mounts it read-only with the
Python environment (``environment_binds``: the interpreter and its import path, any installed copy of handgrad
in it hidden under an empty folder, a checkout on the path left out) and /usr; nothing else of the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .load import OWN

PROJECT = OWN  # handgrad's own top-level packages and modules: never importable inside the check
_LEARN = Path(__file__).resolve().parents[1]
VIEW = {  # the check's own code, all that the child imports of handgrad: path in the view -> its text, or None
    "learn/__init__.py": '"""The check\'s own code, all of handgrad a checked process sees."""\n',
    "learn/mistakes.py": None,
    "learn/files.py": None,
    "learn/checker/__init__.py": '"""Inside the check: the child\'s side only."""\n',
    "learn/checker/wire.py": None,
    "learn/checker/learner_side.py": None,
    "learn/checker/guard.py": None,
    "learn/checker/load.py": None,
    "learn/checker/fence.py": None,
    "learn/checker/value_expressions.py": None,
}
_STUB = (
    "raise ImportError(\"{name} is handgrad's own code, which the check does not hold: the class checked is "
    'the one you write", name="{name}")\n'
)
VIEW_AT = "/handgrad"  # where the view is mounted inside bubblewrap
BOOT = (
    "import sys; sys.path[:0] = [sys.argv[1]]; import importlib; "  # python -I -c BOOT VIEW MODULE ARGS...
    "importlib.import_module(sys.argv[2]).main(sys.argv[3:])"
)


class Unavailable(RuntimeError):
    """The check's process could not start (no bubblewrap, no torch inside it, no unprivileged user): the
    grader's environment is at fault, not the submission."""


_PROBED: dict = {}


def bwrap_path() -> str | None:
    """bubblewrap's path: ``$LEARN_BWRAP`` when set (empty: none, as where it is not installed), else ``bwrap`` on
    PATH or in /usr/bin."""
    given = os.environ.get("LEARN_BWRAP")
    if given is not None:
        return given or None
    return shutil.which("bwrap") or ("/usr/bin/bwrap" if os.access("/usr/bin/bwrap", os.X_OK) else None)


def bwrap_flags() -> list[str] | None:
    """The namespace flags bubblewrap accepts here (a user namespace too where it can make one), or None where it
    cannot run at all (not installed, user namespaces off, a container without the rights): probed once."""
    path = bwrap_path()
    if path is None:
        return None
    if path not in _PROBED:
        base = ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        user = ["--unshare-user", "--uid", "65534", "--gid", "65534", "--disable-userns"]
        found = None
        for flags in (base + user, base):
            try:
                ok = (
                    subprocess.run(
                        [path, *flags, *system_binds(), "--proc", "/proc", "--dev", "/dev", "--", "true"],
                        stdin=subprocess.DEVNULL,
                        capture_output=True,
                        timeout=30,
                    ).returncode
                    == 0
                )
            except (OSError, subprocess.SubprocessError):
                ok = False
            if ok:
                found = flags
                break
        _PROBED[path] = found
    return _PROBED[path]


def isolation(trusted: bool = False) -> str:
    """How a grader's check is isolated here: "bwrap", else "user" (root: an unprivileged user), else "fork"
    when ``trusted`` (the teacher said the submissions are theirs); Unavailable otherwise, in one line that says
    what to install."""
    if bwrap_flags() is not None:
        return "bwrap"
    if trusted:
        return "fork"
    raise Unavailable(
        "bubblewrap cannot run here, and the submissions' code must not run unconfined: install "
        "bubblewrap (Debian and Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap; "
        "Arch: pacman -S bubblewrap; it needs user namespaces), or, for code you trust (your own "
        "tests), add --trust-submissions"
    )


def system_binds() -> list[str]:
    """/usr read-only, and /lib, /lib64, /bin, ... as this system has them (links into /usr, or folders)."""
    out = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            out += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            out += ["--ro-bind", top, top]
    for f in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime"):
        if os.path.exists(f):
            out += ["--ro-bind", f, f]
    return out


_SYS_PATH: dict = {}


def child_path(python: str) -> list[str]:
    """The folders a fresh ``python -I`` imports from (its standard library and site-packages), asked once."""
    if python not in _SYS_PATH:
        run = subprocess.run(
            [python, "-I", "-c", "import json, sys; print(json.dumps(sys.path))"],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin"},
        )
        if run.returncode != 0:
            raise Unavailable(f"{python} -I does not start: {(run.stderr.strip().splitlines() or ['?'])[-1]}")
        _SYS_PATH[python] = [p for p in json.loads(run.stdout) if p and os.path.isabs(p)]
    return _SYS_PATH[python]


def environment_binds(python: str) -> list[str]:
    """The interpreter and every folder of its import path, read-only; handgrad's own packages inside them (a
    wheel's install) hidden under empty folders; a checkout on the path left out."""
    real = os.path.realpath(python)
    binds = [os.path.dirname(os.path.dirname(real)), os.path.dirname(os.path.dirname(os.path.abspath(python)))]
    binds += child_path(python)
    out, masks, seen = [], [], {"/", "/usr", os.path.expanduser("~")}  # never the whole of these
    for folder in binds:
        if not os.path.isdir(folder) or folder in seen or folder.startswith("/usr/"):
            continue
        seen.add(folder)
        if os.path.exists(os.path.join(folder, "pyproject.toml")):
            continue  # a checkout on the path (an old-style editable install): none of it enters
        out += ["--ro-bind", folder, folder]
        for name in PROJECT:
            for hit in (os.path.join(folder, name), os.path.join(folder, f"{name}.py")):
                if os.path.isdir(hit):
                    masks += ["--tmpfs", hit]
                elif os.path.isfile(hit):
                    masks += ["--ro-bind", "/dev/null", hit]
    for folder in child_path(python):  # handgrad inside /usr (a system-wide install): hidden too
        if folder.startswith("/usr/"):
            for name in PROJECT:
                hit = os.path.join(folder, name)
                if os.path.isdir(hit):
                    masks += ["--tmpfs", hit]
                elif os.path.isfile(hit + ".py"):
                    masks += ["--ro-bind", "/dev/null", hit + ".py"]
    return out + masks


def write_view(folder: Path) -> Path:
    """The check's own code, copied into ``folder`` (world-readable: the unprivileged user reads it too), and a
    stand-in for each of handgrad's other packages that raises ImportError saying the check does not hold it."""
    for rel, text in VIEW.items():
        dest = folder / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text if text is not None else (_LEARN.parent / rel).read_text())
    for name in PROJECT:
        if name != "learn":
            (folder / name).mkdir(exist_ok=True)
            (folder / name / "__init__.py").write_text(_STUB.format(name=name))
    for sub in ("exercises", "teach"):
        (folder / "learn" / sub).mkdir(exist_ok=True)
        (folder / "learn" / sub / "__init__.py").write_text(_STUB.format(name=f"learn.{sub}"))
    for path in [folder, *folder.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return folder


def unprivileged() -> tuple[int, int]:
    import pwd

    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


def kill_user(uid: int, gid: int, timeout: float = 10.0) -> None:
    """Every process of ``uid`` killed (``kill -9 -1`` run as that user, until none is left)."""
    deadline = time.monotonic() + timeout
    while True:
        left = _pids_of(uid)
        if not left:
            return
        if time.monotonic() > deadline:
            raise Unavailable(f"processes of user {uid} survive being killed: {left[:5]}")
        try:
            subprocess.run(
                ["kill", "-9", "-1"],
                user=uid,
                group=gid,
                extra_groups=[],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=10,
            )
        except (OSError, subprocess.SubprocessError):
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


def _pids_of(uid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    with open(f"/proc/{entry}/stat") as f:
                        if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                            out.append(int(entry))
            except (OSError, IndexError):
                pass
    return out

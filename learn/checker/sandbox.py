"""The learner's code runs in a child process, behind a boundary; the expected values and the verdict stay here.

Three ways to start the child (``Sandbox(..., isolate=...)``), the same child code in each (``learner_side``):

``"fork"``   forked from this process after torch is imported, so a check starts at once: ``learn check`` of the
             learner's own file.  Bounded (time, memory, output), no new process or thread (a seccomp filter), an
             audit hook against files written outside its folder: a fence for honest code, not a wall.
``"bwrap"``  a fresh Python exec'd inside bubblewrap: new PID, network, IPC, UTS (and user) namespaces, every
             capability dropped, ``--die-with-parent``, ``--new-session``; a read-only view of the Python
             environment and of the check's own few files (``VIEW``), never the worked solutions, the rest of
             handgrad, the other submissions, the grader's output or the home folder; a private tmpfs as its
             folder.  Every process it started dies with the PID namespace when the check ends.
``"user"``   where bubblewrap cannot run and this process is root (a Gradescope container): the fresh Python runs
             as an unprivileged user, and every process of that user is killed when the check ends.

The wire is frames of plain data over two pipes, each frame's whole receive bounded by the check's deadline:
tensors travel as (dtype, shape, bytes) and are read back here by an unpickler that builds nothing but built-in
values, within a size and a work budget, so nothing the child sends can run code, hang or exhaust this process.
Anything else ends in one line here, ``Escaped``.  A child that cannot even start (no torch, a broken
environment) is ``Unavailable``: the grader's problem, not the student's.

This module is a leaf: it imports nothing of the checker above it (the child's code is handed in as a module).
"""
from __future__ import annotations

import io
import json
import math
import os
import pickle
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

import torch

from .guard import LearnerFailed
from .load import OWN, LoadError

TIME_LIMIT_S = 30.0  # the learner's code, the whole check (``LEARN_CHECK_TIME_LIMIT``, ``learn grade --time-limit``)
START_LIMIT_S = 120.0  # a fresh child's Python and torch imported: the environment's time, not the learner's
MEMORY_LIMIT = 2 << 30  # bytes of address space the child may add to what it holds when the learner's code starts
OUTPUT_LIMIT = 1 << 20  # bytes the learner's code may print (or write into one file of its folder)
FRAME_LIMIT = 64 << 20  # bytes of one message from the child
DECODE_BUDGET = 1 << 20  # values one message may hold: a shared-reference bomb is refused, not walked
SECCOMP = True  # the child's seccomp filter (fence.py); off only where a test shows what holds without it
PROJECT = OWN  # handgrad's own top-level packages and modules: never importable inside the check
# the check's own code, all that the child imports of handgrad: (path in the view, its text or None for the file's)
_LEARN = Path(__file__).resolve().parents[1]
VIEW = {
    "learn/__init__.py": '"""The check\'s own code, all of handgrad a checked process sees."""\n',
    "learn/mistakes.py": None, "learn/files.py": None,
    "learn/checker/__init__.py": '"""Inside the check: the child\'s side only."""\n',
    "learn/checker/sandbox.py": None, "learn/checker/learner_side.py": None, "learn/checker/guard.py": None,
    "learn/checker/load.py": None, "learn/checker/fence.py": None,
    "learn/checker/value_expressions.py": None,
}
_STUB = ('raise ImportError("{name} is handgrad\'s own code, which the check does not hold: the class checked is '
         'the one you write", name="{name}")\n')
VIEW_AT = "/handgrad"  # where the view is mounted inside bubblewrap
BOOT = "import sys; sys.path[:0] = [sys.argv[1]]; import importlib; importlib.import_module(sys.argv[2]).main(sys.argv[3:])"
_DTYPES = {str(d): d for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
                                torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex128)}


class Escaped(Exception):
    """The learner's code ended or broke out of the check (time, memory, exit, a malformed message): one line."""


class Unavailable(RuntimeError):
    """The check's process could not start (no bubblewrap, no torch inside it, no unprivileged user): the
    grader's environment is at fault, not the submission."""


def time_limit(value=None, source: str = "LEARN_CHECK_TIME_LIMIT") -> float:
    """The check's time limit in seconds: ``value``, else ``$LEARN_CHECK_TIME_LIMIT``, else the default; a
    ValueError naming ``source`` unless it is a finite number above 0."""
    if value is None:
        value = os.environ.get("LEARN_CHECK_TIME_LIMIT")
        if value is None or not value.strip():
            return TIME_LIMIT_S
        source = "LEARN_CHECK_TIME_LIMIT"
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{source} must be a number of seconds above 0, not {value!r}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{source} must be a finite number of seconds above 0, not {value!r}")
    return seconds


def printable(text: str) -> str:
    """``text`` with every control and format character (a newline or tab aside) written as an escape, so what a
    submission names or prints cannot forge a line, move the cursor or reorder a line (bidi controls)."""
    out = []
    for ch in str(text):
        if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"):
            out.append(ch)
        else:
            out.append(ascii(ch)[1:-1])
    return "".join(out)


def one_line(text: str) -> str:
    """``printable`` with the newlines and tabs escaped too: a name or a note that must stay on its line."""
    return printable(text).replace("\n", "\\n").replace("\t", "\\t")


# -- the wire: plain data only ------------------------------------------------------------------------------------

def encode(x):
    """Tensors -> ("tensor", dtype, shape, bytes, type name); containers kept; anything else -> its type's name."""
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu().contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.dtype in _DTYPES.values() else b""
        return ("tensor", str(t.dtype), tuple(t.shape), data, type(x).__name__ if type(x) is not torch.Tensor
                else None, x.grad_fn is not None or x.requires_grad)
    if isinstance(x, (str, bytes, int, float, bool, type(None))):
        return x
    if isinstance(x, tuple):
        return ("tuple", [encode(v) for v in x])
    if isinstance(x, list):
        return ("list", [encode(v) for v in x])
    if isinstance(x, dict):
        return ("dict", [(str(k), encode(v)) for k, v in x.items()])
    return ("other", type(x).__name__)


class NotPlain:
    """What the learner returned where a plain torch.Tensor belongs (a subclass, or another object)."""

    def __init__(self, kind: str):
        self.kind = kind

    def __repr__(self):
        return self.kind


class _Unreadable(Exception):
    pass


def decode(x, budget: list | None = None):
    """The value ``encode`` made; _Unreadable for anything else (or past the budget of values)."""
    budget = [DECODE_BUDGET] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0:
        raise _Unreadable("too many values")
    if isinstance(x, (str, bytes, int, float, bool, type(None))):
        return x
    if not isinstance(x, tuple) or not x or not isinstance(x[0], str):
        raise _Unreadable(type(x).__name__)
    tag = x[0]
    if tag == "tensor" and len(x) == 6:
        _, dtype, shape, data, subclass, graph = x
        if not (isinstance(shape, tuple) and all(isinstance(s, int) and s >= 0 for s in shape)
                and isinstance(data, bytes)):
            raise _Unreadable("a tensor")
        if subclass is not None:
            return NotPlain(f"a {printable(str(subclass))} (a subclass of torch.Tensor; return plain torch.Tensor "
                            f"results)")
        if graph:
            return NotPlain("a tensor made by autograd (it has a grad_fn or requires grad): no autograd here, write "
                            "the gradient by hand")
        if dtype not in _DTYPES:
            return NotPlain(f"a tensor of dtype {printable(str(dtype))}")
        if math.prod(shape) * _DTYPES[dtype].itemsize != len(data):
            raise _Unreadable("a tensor's bytes")
        flat = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        return flat.view(_DTYPES[dtype]).reshape(shape).clone()
    if tag in ("tuple", "list") and len(x) == 2 and isinstance(x[1], list):
        items = [decode(v, budget) for v in x[1]]
        return tuple(items) if tag == "tuple" else items
    if tag == "dict" and len(x) == 2 and isinstance(x[1], list):
        out = {}
        for pair in x[1]:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
                raise _Unreadable("a dict")
            out[pair[0]] = decode(pair[1], budget)
        return out
    if tag == "other" and len(x) == 2 and isinstance(x[1], str):
        return NotPlain(f"a {printable(x[1])}")
    raise _Unreadable(printable(tag)[:40])


class _Builtins(pickle.Unpickler):
    def find_class(self, module, name):  # nothing but built-in values: no object of the child's making
        raise _Unreadable(f"{module}.{name}")


def loads(data: bytes):
    return _Builtins(io.BytesIO(data)).load()


def dumps(x) -> bytes:
    return pickle.dumps(x, protocol=4)


# -- frames over pipes -------------------------------------------------------------------------------------------

class Channel:
    """Length-prefixed frames over two file descriptors.  ``recv``/``send`` with a ``deadline`` (time.monotonic)
    never block past it (the parent's side); without one they block (the child's)."""

    def __init__(self, rfd: int, wfd: int):
        self.rfd, self.wfd = rfd, wfd

    def send(self, data: bytes, deadline: float | None = None) -> None:
        view = memoryview(struct.pack(">Q", len(data)) + data)
        while view:
            if deadline is not None:
                self._wait(self.wfd, select.POLLOUT, deadline)
            view = view[os.write(self.wfd, view[:1 << 20]):]

    def recv(self, deadline: float | None = None, limit: int = FRAME_LIMIT) -> bytes:
        (size,) = struct.unpack(">Q", self._exactly(8, deadline))
        if size > limit:
            raise _Unreadable(f"a message of {size} bytes")
        return self._exactly(size, deadline)

    def _exactly(self, n: int, deadline: float | None) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            if deadline is not None:
                self._wait(self.rfd, select.POLLIN, deadline)
            chunk = os.read(self.rfd, min(n - len(buf), 1 << 20))
            if not chunk:
                raise EOFError
            buf += chunk
        return bytes(buf)

    @staticmethod
    def _wait(fd: int, event: int, deadline: float) -> None:
        poller = select.poll()
        poller.register(fd, event | select.POLLHUP | select.POLLERR)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if poller.poll(min(left, 3600) * 1000):
                return

    def close(self) -> None:
        for fd in (self.rfd, self.wfd):
            try:
                os.close(fd)
            except OSError:
                pass


# -- where bubblewrap runs ---------------------------------------------------------------------------------------

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
                ok = subprocess.run([path, *flags, *_system_binds(), "--proc", "/proc", "--dev", "/dev", "--", "true"],
                                    stdin=subprocess.DEVNULL, capture_output=True, timeout=30).returncode == 0
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
    raise Unavailable("bubblewrap cannot run here, and the submissions' code must not run unconfined: install "
                      "bubblewrap (Debian and Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap; "
                      "Arch: pacman -S bubblewrap; it needs user namespaces), or, for code you trust (your own "
                      "tests), add --trust-submissions")


def _system_binds() -> list[str]:
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
        run = subprocess.run([python, "-I", "-c", "import json, sys; print(json.dumps(sys.path))"],
                             capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                             env={"PATH": "/usr/bin:/bin"})
        if run.returncode != 0:
            raise Unavailable(f"{python} -I does not start: {(run.stderr.strip().splitlines() or ['?'])[-1]}")
        _SYS_PATH[python] = [p for p in json.loads(run.stdout) if p and os.path.isabs(p)]
    return _SYS_PATH[python]


def _environment_binds(python: str) -> list[str]:
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


def _unprivileged() -> tuple[int, int]:
    import pwd
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


def kill_user(uid: int, timeout: float = 10.0) -> None:
    """Every process of ``uid`` killed (``kill -9 -1`` run as that user, until none is left)."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in _pids_of(uid)]
        if not left:
            return
        if time.monotonic() > deadline:
            raise Unavailable(f"processes of user {uid} survive being killed: {left[:5]}")
        try:
            subprocess.run(["kill", "-9", "-1"], user=uid, group=uid if uid == 65534 else None, extra_groups=[],
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
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


# -- the parent's side ------------------------------------------------------------------------------------------

class Sandbox:
    """One child running the learner's code: ``child`` is the module of the child's side (``serve(channel,
    setup)`` in a forked child, ``main(argv)`` in an exec'd one); ``target`` says what to load: {"file": path,
    "shown": the path as named, "cls": class name} (``"notebook": True`` for an .ipynb), or, forked only,
    {"object": the class, "where": its code's filename}.  ``request(op, *args)`` runs ``child.OPS[op]`` there
    and returns its answer; ``keys`` are the mistake keys the child may name (any other is dropped)."""

    def __init__(self, child, exercise: str, target: dict, *, isolate: str = "fork", time_limit: float | None = None,
                 keys: frozenset = frozenset()):
        if isolate not in ("fork", "bwrap", "user"):
            raise ValueError(f"isolate must be fork, bwrap or user, not {isolate!r}")
        self.limit = globals()["time_limit"](time_limit, "the time limit") if time_limit is not None else \
            globals()["time_limit"]()
        self.exercise, self.keys, self.isolate = exercise, keys, isolate
        self.folder = Path(tempfile.mkdtemp(prefix="learn-check-"))
        self.output = self.folder / ".output"
        self.doing = "loading your file"
        self.pid = self.proc = self.inner = None
        self.channel = None
        self.deadline = time.monotonic() + START_LIMIT_S
        self.cls_name = self.where = ""
        setup = {"exercise": exercise, "time_limit": self.limit, "memory": MEMORY_LIMIT, "output": OUTPUT_LIMIT,
                 "seccomp": SECCOMP}
        try:
            out = os.open(self.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                if isolate == "fork":
                    self._fork(child, setup, target, out)
                else:
                    self._exec(child, setup, target, out)
            finally:
                os.close(out)
            self.deadline = time.monotonic() + START_LIMIT_S
            self._expect_ready()
            self.deadline = time.monotonic() + self.limit  # the learner's code starts now: loading their file
            self.cls_name, self.where = self._answer()
            self.cls_name, self.where = printable(str(self.cls_name)), str(self.where)
        except BaseException:
            self.cleanup()
            raise

    # -- starting the child ---------------------------------------------------------------------------------------

    def _pipes(self):
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        os.set_blocking(req_w, False)
        self.channel = Channel(rep_r, req_w)
        return req_r, rep_w

    def _fork(self, child, setup: dict, target: dict, out: int) -> None:
        req_r, rep_w = self._pipes()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()  # what is buffered now must not be printed twice, by the child too
            except Exception:
                pass
        pid = os.fork()
        if pid == 0:  # the child: never returns
            try:
                os.close(self.channel.rfd)
                os.close(self.channel.wfd)
                os.dup2(out, 1)
                os.dup2(out, 2)
                keep = {0, 1, 2, req_r, rep_w}
                for fd in _open_fds():
                    if fd not in keep:
                        try:
                            os.close(fd)
                        except OSError:
                            pass
                child.serve(Channel(req_r, rep_w), {**setup, "target": target, "folder": str(self.folder)})
            finally:
                os._exit(0)
        self.pid = pid
        os.close(req_r)
        os.close(rep_w)

    def _exec(self, child, setup: dict, target: dict, out: int) -> None:
        if "object" in target:
            raise ValueError("a class object cannot cross into a fresh process: give its file")
        view = write_view(self.folder / "view")
        python = sys.executable
        src = Path(target["file"])
        name = src.name if src.suffix in (".py", ".ipynb") else "submission.py"
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "TMPDIR": "/tmp"}
        req_r, rep_w = self._pipes()
        fds = [req_r, rep_w]
        try:
            if self.isolate == "bwrap":
                flags = bwrap_flags()
                if flags is None:
                    raise Unavailable(isolation.__doc__ and "bubblewrap cannot run here")
                copy = self.folder / "submission"
                copy.mkdir()
                (copy / name).write_bytes(target["data"])
                info_r, info_w = os.pipe()
                fds.append(info_w)
                self.info = info_r
                argv = [bwrap_path(), *flags, *_system_binds(), "--proc", "/proc", "--dev", "/dev",
                        "--tmpfs", "/tmp", *_environment_binds(python),  # an environment in /tmp stays seen
                        "--ro-bind", str(view), VIEW_AT, "--ro-bind", str(copy), "/submission", "--chdir", "/tmp",
                        "--setenv", "HOME", "/tmp", "--info-fd", str(info_w), "--",
                        python, "-I", "-B", "-c", BOOT, VIEW_AT, child.__name__, str(req_r), str(rep_w)]
                folder, file = "/tmp", f"/submission/{name}"
                kwargs = {}
            else:  # "user": root, without bubblewrap
                if os.geteuid() != 0:
                    raise Unavailable("running a submission as another user needs root")
                uid, gid = _unprivileged()
                self.uid = uid
                work = self.folder / "work"
                work.mkdir()
                (work / name).write_bytes(target["data"])
                for p in (self.folder, view.parent):
                    os.chmod(p, 0o755)
                os.chown(work, uid, gid)
                os.chown(work / name, uid, gid)
                os.chmod(work, 0o700)
                argv = [python, "-I", "-B", "-c", BOOT, str(view), child.__name__, str(req_r), str(rep_w)]
                folder, file = str(work), str(work / name)
                env["HOME"] = str(work)
                kwargs = {"user": uid, "group": gid, "extra_groups": [], "cwd": str(work), "umask": 0o077}
            self.proc = subprocess.Popen(argv, pass_fds=fds, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                         env=env, start_new_session=True, close_fds=True, **kwargs)
        except OSError as e:
            raise Unavailable(f"the check's process did not start: {e}") from None
        finally:
            for fd in fds:
                os.close(fd)
        shown = target.get("shown", name)
        self.channel.send(dumps({**setup, "folder": folder,
                                 "target": {"file": file, "shown": shown, "cls": target["cls"],
                                            "notebook": target.get("notebook", False)}}),
                          time.monotonic() + START_LIMIT_S)

    # -- talking to it --------------------------------------------------------------------------------------------

    def _expect_ready(self) -> None:
        try:
            kind, _ = loads(self.channel.recv(self.deadline))
        except TimeoutError:
            raise Unavailable(f"the check's process took more than {START_LIMIT_S:g} s to start") from None
        except (EOFError, OSError, _Unreadable, pickle.UnpicklingError, ValueError):
            kind = None
        if kind != "ready":
            self.close()
            said = self.printed(600).strip().splitlines()
            raise Unavailable("the check's process could not start" + (f": {said[-1]}" if said else ""))

    def request(self, op: str, *args):
        self.doing = {"construct": "your constructor", "forward": "your forward", "backward": "your backward",
                      "numeric": "your forward", "step": "your step"}.get(op, "your code")
        try:
            self.channel.send(dumps((op, encode(args))), self.deadline)
        except TimeoutError:
            raise self._timed_out() from None
        except (BrokenPipeError, OSError):
            raise self._died() from None
        return self._answer()

    def _answer(self):
        try:
            kind, payload = loads(self.channel.recv(self.deadline))
            if kind == "ok":
                return decode(payload)
            if kind == "failed":
                text, attempted, key = decode(payload)
                attempted = {printable(str(k)): v for k, v in attempted.items() if isinstance(v, torch.Tensor)}
                raise LearnerFailed(printable(str(text)), attempted, key if key in self.keys else None)
        except TimeoutError:
            raise self._timed_out() from None
        except (EOFError, OSError):
            raise self._died() from None
        except (_Unreadable, pickle.UnpicklingError, ValueError, TypeError, EOFError, RecursionError, MemoryError,
                struct.error, AttributeError, IndexError, KeyError, UnicodeError):
            self.close()
            raise Escaped(f"{self.doing}: the check's process sent something the checker does not read (a "
                          f"malformed message): the check stopped it") from None
        self.close()
        if kind == "loaderror" and isinstance(payload, str):
            raise LoadError(printable(payload))
        raise Escaped(printable(payload) if isinstance(payload, str) else "the learner's process broke off")

    def _timed_out(self) -> Escaped:
        self.close()
        return Escaped(f"{self.doing} ran for more than {self.limit:g} s in all (an endless loop, or a long sleep?): "
                       f"the check stopped it")

    def _exit_code(self, wait: float):
        if self.pid is not None:
            end = time.monotonic() + wait
            while True:
                done, status = os.waitpid(self.pid, os.WNOHANG)
                if done:
                    self.pid = None
                    self._status = os.waitstatus_to_exitcode(status)
                    return self._status
                if time.monotonic() > end:
                    return None
                time.sleep(0.01)
        if self.proc is not None:
            try:
                code = self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                return None
            return -(code - 128) if self.isolate == "bwrap" and code > 128 else code
        return getattr(self, "_status", None)

    def _died(self) -> Escaped:
        code = self._exit_code(2)
        self.close()
        if code == -signal.SIGXFSZ:
            return Escaped(f"{self.doing} printed (or wrote) more than {OUTPUT_LIMIT >> 20} MB: the check stopped "
                           f"it; print less")
        if code in (-signal.SIGXCPU, -signal.SIGKILL) and time.monotonic() > self.deadline - 1:
            return self._timed_out()
        if code == -signal.SIGSYS:
            return Escaped(f"your code tried to start a process or a thread, run a program, signal a process, or "
                           f"make a device, FIFO or file attribute (in {self.doing}): the check forbids it and stopped "
                           f"it")
        if code == -signal.SIGXCPU:
            return Escaped(f"{self.doing} used more than {self.limit:g} s of processor time: the check stopped it")
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = str(-code)
            return Escaped(f"{self.doing} was killed by signal {name} (a crash, or too much memory)")
        return Escaped(f"{self.doing} ended the check's process (os._exit or a crash, exit code {code}): a checked "
                       f"class must return, not end the program")

    def printed(self, limit: int = 1500) -> str:
        """What the learner's code printed, cut to ``limit`` characters, control characters escaped."""
        try:
            with open(self.output, "rb") as f:
                text = f.read(limit + 1).decode("utf-8", "replace")
        except OSError:
            return ""
        lines = [ln if len(ln) <= 160 else ln[:160] + " ..." for ln in printable(text[:limit]).splitlines()]
        return "\n".join(lines) + ("\n... (more)" if len(text) > limit else "")

    def close(self) -> None:
        """The child and every process it started gone (its PID namespace, or its user's processes)."""
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
            self._exit_code(10)
        if self.proc is not None:
            if self.isolate == "bwrap":
                if self.inner is None:
                    self.inner = _child_pid(getattr(self, "info", None))
                if self.inner is not None and self.proc.poll() is None:
                    try:  # the namespace's first process: the kernel kills all of them with it
                        os.kill(self.inner, signal.SIGKILL)
                    except OSError:
                        pass
            if self.proc.poll() is None:
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
            if self.isolate == "user":
                kill_user(self.uid)
        if getattr(self, "info", None) is not None:
            os.close(self.info)
            self.info = None
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    def cleanup(self) -> None:
        try:
            self.close()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cleanup()


def _child_pid(fd: int | None) -> int | None:
    """The sandbox's first process, from bubblewrap's --info-fd (written once it started)."""
    if fd is None:
        return None
    try:
        os.set_blocking(fd, False)
        data = os.read(fd, 65536)
        return int(json.loads(data.decode())["child-pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _open_fds() -> list[int]:
    try:
        return [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 256))

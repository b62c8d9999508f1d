"""The learner's code runs in a child process: bounded in time, memory, output and files; the verdict stays here.

The child is forked after torch is imported (nothing to import again, so a check starts at once).  It loads the
learner's class, then answers requests ("construct", "forward", ...; see ``learner_side``) with plain data: the
tensors it returns are sent as (dtype, shape, bytes), read back here by an unpickler that builds nothing but
built-in values, so nothing the child sends can run code in this process.  The expected values are computed
here and never sent.  Whatever the child does (an endless loop, a huge allocation, ``sys.exit``, ``os._exit``,
megabytes of printing, a file written outside its temporary folder) ends in one line here, ``Escaped``, exit 2.
"""
from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import resource
import shutil
import signal
import sys
import tempfile
import time

import torch

from .guard import LearnerFailed
from .load import LoadError

TIME_LIMIT_S = float(os.environ.get("LEARN_CHECK_TIME_LIMIT", "30"))  # the whole check, every request together
MEMORY_LIMIT = 2 << 30  # bytes of address space the child may add to what it holds when forked
OUTPUT_LIMIT = 1 << 20  # bytes the learner's code may print (or write into its temporary folder)
_DTYPES = {str(d): d for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
                                torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex128)}


class Escaped(Exception):
    """The learner's code ended or broke out of the check (time, memory, exit, files): one line, exit 2."""


# -- the wire: plain data only ------------------------------------------------------------------------------------

def encode(x):
    """Tensors -> ("tensor", dtype, shape, bytes, type name); containers kept; anything else -> its type's name."""
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu().contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.dtype in _DTYPES.values() else b""
        return ("tensor", str(t.dtype), tuple(t.shape), data, type(x).__name__ if type(x) is not torch.Tensor
                else None)
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


def decode(x):
    if not isinstance(x, tuple):
        return x
    tag = x[0]
    if tag == "tensor":
        _, dtype, shape, data, subclass = x
        if subclass is not None:
            return NotPlain(f"a {subclass} (a subclass of torch.Tensor; return plain torch.Tensor results)")
        if dtype not in _DTYPES:
            return NotPlain(f"a tensor of dtype {dtype}")
        flat = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        return flat.view(_DTYPES[dtype]).reshape(shape).clone()
    if tag in ("tuple", "list"):
        items = [decode(v) for v in x[1]]
        return tuple(items) if tag == "tuple" else items
    if tag == "dict":
        return {k: decode(v) for k, v in x[1]}
    if tag == "other":
        return NotPlain(f"a {x[1]}")
    raise Escaped("the learner's process sent something the checker does not read")


class _Builtins(pickle.Unpickler):
    def find_class(self, module, name):  # nothing but built-in values: no object of the child's making
        raise Escaped("the learner's process sent something the checker does not read")


def _loads(data: bytes):
    return _Builtins(io.BytesIO(data)).load()


# -- the parent's side ------------------------------------------------------------------------------------------

class Sandbox:
    """One child running the learner's code.  ``load()`` (run in the child) returns the learner's class and the
    filename of its code; ``request(op, *args)`` runs ``learner_side.OPS[op]`` there and returns its answer."""

    def __init__(self, load, exercise: str, time_limit: float | None = None):
        self.load, self.exercise = load, exercise
        self.deadline = time.monotonic() + (TIME_LIMIT_S if time_limit is None else time_limit)
        self.folder = tempfile.mkdtemp(prefix="learn-check-")
        self.output = os.path.join(self.folder, ".output")
        self.doing = "loading your file"
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()  # what is buffered now must not be printed twice, by the child too
            except Exception:
                pass
        self.proc = ctx.Process(target=_child, args=(child, self), daemon=True)
        self.proc.start()
        child.close()
        try:
            self.cls_name, self.where = self._answer()
        except BaseException:
            self.cleanup()
            raise

    def request(self, op: str, *args):
        self.doing = {"construct": "your constructor", "forward": "your forward", "backward": "your backward",
                      "numeric": "your forward", "step": "your step"}.get(op, "your code")
        try:
            self.conn.send_bytes(pickle.dumps((op, encode(args))))  # no torch reductions: no sockets
        except (BrokenPipeError, OSError):
            raise self._died() from None
        return self._answer()

    def _answer(self):
        left = self.deadline - time.monotonic()
        if left <= 0 or not self.conn.poll(left):
            self.close()
            raise Escaped(f"{self.doing} ran for more than {TIME_LIMIT_S:g} s in all (an endless loop, or a long "
                          f"sleep?): the check stopped it")
        try:
            kind, payload = _loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            raise self._died() from None
        if kind == "ok":
            return decode(payload)
        if kind == "failed":
            text, attempted, key = decode(payload)
            raise LearnerFailed(text, {k: v for k, v in attempted.items() if isinstance(v, torch.Tensor)}, key)
        self.close()
        if kind == "loaderror" and isinstance(payload, str):
            raise LoadError(payload)
        raise Escaped(payload if isinstance(payload, str) else "the learner's process broke off")

    def _died(self) -> Escaped:
        self.proc.join(2)
        code = self.proc.exitcode
        self.close()
        if code == -signal.SIGXFSZ:
            return Escaped(f"{self.doing} printed (or wrote) more than {OUTPUT_LIMIT >> 20} MB: the check stopped "
                           f"it; print less")
        if code is not None and code < 0:
            return Escaped(f"{self.doing} was killed by signal {signal.Signals(-code).name} (a crash, or too much "
                           f"memory)")
        return Escaped(f"{self.doing} ended the check's process (os._exit or a crash, exit code {code}): a checked "
                       f"class must return, not end the program")

    def printed(self, limit: int = 1500) -> str:
        """What the learner's code printed, cut to ``limit`` characters."""
        try:
            with open(self.output, "rb") as f:
                text = f.read(limit + 1).decode("utf-8", "replace")
        except OSError:
            return ""
        lines = [ln if len(ln) <= 160 else ln[:160] + " ..." for ln in text[:limit].splitlines()]
        return "\n".join(lines) + ("\n... (more)" if len(text) > limit else "")

    def close(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()

    def cleanup(self) -> None:
        self.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cleanup()


# -- the child's side -------------------------------------------------------------------------------------------

def _send(conn, kind: str, payload) -> None:
    conn.send_bytes(pickle.dumps((kind, payload)))


def _fatal(conn, line: str) -> None:
    try:
        _send(conn, "fatal", line)
    finally:
        os._exit(0)


def _child(conn, box: Sandbox) -> None:
    from . import learner_side
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to answer
    out = os.open(box.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
    sys.stdin = io.StringIO()
    os.chdir(box.folder)  # the learner's file is loaded by its absolute path
    sys.dont_write_bytecode = True
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it; past OUTPUT_LIMIT the child is stopped
    resource.setrlimit(resource.RLIMIT_FSIZE, (OUTPUT_LIMIT, OUTPUT_LIMIT))
    _limit_memory()
    torch.set_num_threads(1)
    learner_side.refuse_autograd()
    sys.addaudithook(_audit(conn, os.path.realpath(box.folder)))
    try:
        cls, where = box.load()
        _send(conn, "ok", encode((cls.__name__, where)))
    except LoadError as e:
        _send(conn, "loaderror", str(e))
        os._exit(0)
    except BaseException as e:
        _fatal(conn, _why_stopped(e, "loading your file") or f"{type(e).__name__}: {e}")
    state = learner_side.State(cls, where, box.exercise)
    while True:
        try:
            op, args = pickle.loads(conn.recv_bytes())
            args = decode(args)
        except (EOFError, OSError):
            os._exit(0)
        try:
            _send(conn, "ok", encode(learner_side.OPS[op](state, *args)))
        except LearnerFailed as e:
            _send(conn, "failed", encode((e.text, e.attempted, e.key)))
        except BaseException as e:  # what the guard lets through: exits, interrupts, memory
            _fatal(conn, _why_stopped(e, op) or f"the checker failed in the learner's process: {type(e).__name__}: {e}")


def _why_stopped(e: BaseException, doing: str) -> str | None:
    if isinstance(e, SystemExit):
        return f"your code called sys.exit({e.code if e.code is not None else ''}) while {doing}: a checked class " \
               f"must return, not end the program"
    if isinstance(e, KeyboardInterrupt):
        return f"your code raised KeyboardInterrupt while {doing}: the check stopped"
    if isinstance(e, MemoryError) or "can't allocate memory" in str(e) or "not enough memory" in str(e):
        return f"your code asked for more memory than the check allows ({MEMORY_LIMIT >> 30} GiB more) while {doing}"
    return None


def _limit_memory() -> None:
    try:
        with open("/proc/self/status") as f:
            size = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (size + MEMORY_LIMIT, resource.getrlimit(resource.RLIMIT_AS)[1]))
    except (OSError, ValueError, StopIteration):
        pass  # no /proc: the time limit still bounds the run


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {"os.remove", "os.rename", "os.replace", "os.mkdir", "os.rmdir", "os.chmod", "os.chown",
                "os.symlink", "os.link", "os.truncate", "os.utime", "shutil.rmtree", "shutil.move",
                "shutil.copyfile", "shutil.copytree"}
_PROCESS_EVENTS = {"os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
                   "subprocess.Popen", "os.kill", "os.killpg", "socket.connect", "socket.bind"}


def _audit(conn, folder: str):
    """An audit hook (it cannot be removed): a file changed outside ``folder``, a new process or a socket ends
    the check with one line."""
    def inside(path) -> bool:
        if isinstance(path, int):
            return True  # an open file descriptor: what it names was opened through this hook already
        try:
            real = os.path.realpath(os.fsdecode(path))
        except Exception:
            return False
        return real == os.devnull or real == folder or real.startswith(folder + os.sep)

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writes = (mode is not None and any(c in str(mode) for c in "wax+")) or \
                     (mode is None and isinstance(flags, int) and flags & _WRITE_FLAGS)
            if writes and path is not None and not inside(path):
                _fatal(conn, f"your code tried to write {os.fsdecode(path)}, outside the check's temporary folder: "
                             f"the checked code may not change files (the check stopped it)")
        elif event in _PATH_EVENTS:
            paths = [a for a in args if isinstance(a, (str, bytes, os.PathLike))]
            if not all(inside(p) for p in paths):
                _fatal(conn, f"your code tried to change {', '.join(map(os.fsdecode, paths))} ({event}), outside "
                             f"the check's temporary folder: the checked code may not change files")
        elif event in _PROCESS_EVENTS:
            _fatal(conn, f"your code tried to start a process or open a connection ({event}): the checked code may "
                         f"not (the check stopped it)")
    return hook

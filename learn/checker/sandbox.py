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

The wire (wire.py) is frames of plain data over two pipes, each frame's whole receive bounded by the check's
deadline; anything the child does to end or break the check ends in one line here, ``Escaped``.  A child that
cannot even start (no torch, a broken environment) is ``Unavailable``: the grader's problem, not the student's.
Where and as whom an exec'd child runs is boundary.py's.

This module is a leaf: it imports nothing of the checker above it (the child's code is handed in as a module).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .boundary import (
    BOOT,
    VIEW_AT,
    Unavailable,
    bwrap_flags,
    bwrap_path,
    environment_binds,
    kill_user,
    system_binds,
    unprivileged,
    write_view,
)
from .guard import LearnerFailed
from .load import LoadError
from .wire import Channel, NotPlain, Unreadable, decode, dumps, encode, loads, printable

__all__ = ["Escaped", "NotPlain", "Sandbox", "Unavailable", "time_limit"]

TIME_LIMIT_S = 30.0  # the learner's code, the whole check (``LEARN_CHECK_TIME_LIMIT``, ``learn grade --time-limit``)
START_LIMIT_S = 120.0  # a fresh child's Python and torch imported: the environment's time, not the learner's
MEMORY_LIMIT = 2 << 30  # bytes of address space the child may add to what it holds when the learner's code starts
OUTPUT_LIMIT = 1 << 20  # bytes the learner's code may print (or write into one file of its folder)
SECCOMP = True  # the child's seccomp filter (fence.py); off only where a test shows what holds without it


class Escaped(Exception):
    """The learner's code ended or broke out of the check (time, memory, exit, a malformed message): one line."""


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


_checked_limit = time_limit  # Sandbox takes a ``time_limit`` argument, which hides the function's name there


# -- the parent's side ------------------------------------------------------------------------------------------


class Sandbox:
    """One child running the learner's code: ``child`` is the module of the child's side (``serve(channel,
    setup)`` in a forked child, ``main(argv)`` in an exec'd one); ``target`` says what to load: {"file": path,
    "shown": the path as named, "cls": class name} (``"notebook": True`` for an .ipynb), or, forked only,
    {"object": the class, "where": its code's filename}.  ``request(op, *args)`` runs ``child.OPS[op]`` there
    and returns its answer; ``keys`` are the mistake keys the child may name (any other is dropped)."""

    def __init__(
        self,
        child,
        exercise: str,
        target: dict,
        *,
        isolate: str = "fork",
        time_limit: float | None = None,
        keys: frozenset = frozenset(),
    ):
        if isolate not in ("fork", "bwrap", "user"):
            raise ValueError(f"isolate must be fork, bwrap or user, not {isolate!r}")
        self.limit = _checked_limit(time_limit, "the time limit") if time_limit is not None else _checked_limit()
        self.exercise, self.keys, self.isolate = exercise, keys, isolate
        self.folder = Path(tempfile.mkdtemp(prefix="learn-check-"))
        self.output = self.folder / ".output"
        self.doing = "loading your file"
        self.pid = self.proc = self.inner = self.info = self.uid = self.gid = None
        self.channel = None
        self.deadline = time.monotonic() + START_LIMIT_S
        self.cls_name = self.where = ""
        setup = {
            "exercise": exercise,
            "time_limit": self.limit,
            "memory": MEMORY_LIMIT,
            "output": OUTPUT_LIMIT,
            "seccomp": SECCOMP,
        }
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
            with contextlib.suppress(Exception):
                stream.flush()  # what is buffered now must not be printed twice, by the child too
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
                        with contextlib.suppress(OSError):
                            os.close(fd)
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
        suffix = src.suffix if src.suffix in (".py", ".ipynb") else ".py"
        plain = src.name.isprintable() and len(src.name) <= 100 and not src.name.startswith((".", "-"))
        name = src.name if plain and src.suffix == suffix else f"{self.exercise}{suffix}"  # its own name, if plain
        env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "TMPDIR": "/tmp",
        }
        req_r, rep_w = self._pipes()
        fds = [req_r, rep_w]
        try:
            if self.isolate == "bwrap":
                flags = bwrap_flags()
                if flags is None:
                    raise Unavailable("bubblewrap cannot run here")
                copy = self.folder / "submission"
                copy.mkdir()
                (copy / name).write_bytes(target["data"])
                info_r, info_w = os.pipe()
                fds.append(info_w)
                self.info = info_r
                argv = [
                    bwrap_path(),
                    *flags,
                    *system_binds(),
                    "--proc",
                    "/proc",
                    "--dev",
                    "/dev",
                    "--tmpfs",
                    "/tmp",
                    *environment_binds(python),  # an environment in /tmp stays seen
                    "--ro-bind",
                    str(view),
                    VIEW_AT,
                    "--ro-bind",
                    str(copy),
                    "/submission",
                    "--chdir",
                    "/tmp",
                    "--setenv",
                    "HOME",
                    "/tmp",
                    "--info-fd",
                    str(info_w),
                    "--",
                    python,
                    "-I",
                    "-B",
                    "-c",
                    BOOT,
                    VIEW_AT,
                    child.__name__,
                    str(req_r),
                    str(rep_w),
                ]
                folder, file = "/tmp", f"/submission/{name}"
                kwargs = {}
            else:  # "user": root, without bubblewrap
                if os.geteuid() != 0:
                    raise Unavailable("running a submission as another user needs root")
                uid, gid = self.uid, self.gid = unprivileged()
                work = self.folder / "work"
                work.mkdir()
                (work / name).write_bytes(target["data"])
                os.chmod(self.folder, 0o755)  # the view inside it readable by the user; .output stays root's
                os.chown(work, uid, gid)
                os.chown(work / name, uid, gid)
                os.chmod(work, 0o700)
                argv = [python, "-I", "-B", "-c", BOOT, str(view), child.__name__, str(req_r), str(rep_w)]
                folder, file = str(work), str(work / name)
                env["HOME"] = str(work)
                kwargs = {"user": uid, "group": gid, "extra_groups": [], "cwd": str(work), "umask": 0o077}
            self.proc = subprocess.Popen(
                argv,
                pass_fds=fds,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=env,
                start_new_session=True,
                close_fds=True,
                **kwargs,
            )
        except OSError as e:
            raise Unavailable(f"the check's process did not start: {e}") from None
        finally:
            for fd in fds:
                os.close(fd)
        shown = target.get("shown", name)
        self.channel.send(
            dumps(
                {
                    **setup,
                    "folder": folder,
                    "target": {
                        "file": file,
                        "shown": shown,
                        "cls": target["cls"],
                        "notebook": target.get("notebook", False),
                    },
                }
            ),
            time.monotonic() + START_LIMIT_S,
        )

    # -- talking to it --------------------------------------------------------------------------------------------

    def _expect_ready(self) -> None:
        try:
            kind, _ = loads(self.channel.recv(self.deadline))
        except TimeoutError:
            raise Unavailable(f"the check's process took more than {START_LIMIT_S:g} s to start") from None
        except (EOFError, OSError, Unreadable, pickle.UnpicklingError, ValueError):
            kind = None
        if kind != "ready":
            self.close()
            said = self.printed(600).strip().splitlines()
            raise Unavailable("the check's process could not start" + (f": {said[-1]}" if said else ""))

    def request(self, op: str, *args):
        self.doing = {
            "construct": "your constructor",
            "forward": "your forward",
            "backward": "your backward",
            "numeric": "your forward",
            "step": "your step",
        }.get(op, "your code")
        try:
            self.channel.send(dumps((op, encode(args))), self.deadline)
        except TimeoutError:
            raise self._timed_out() from None
        except (BrokenPipeError, OSError):
            raise self._died() from None
        return self._answer()

    def _answer(self):
        try:
            data = self.channel.recv(self.deadline)
        except TimeoutError:
            raise self._timed_out() from None
        except Unreadable:
            raise self._malformed() from None
        except (EOFError, OSError):
            raise self._died() from None
        try:
            kind, payload = loads(data)
            if kind == "ok":
                return decode(payload)
            if kind == "failed":
                text, attempted, key = decode(payload)
                failed = LearnerFailed(
                    printable(str(text)),
                    {printable(str(k)): v for k, v in attempted.items() if isinstance(v, torch.Tensor)},
                    key if isinstance(key, str) and key in self.keys else None,
                )
            elif kind not in ("loaderror", "fatal") or not isinstance(payload, str):
                raise Unreadable(printable(str(kind))[:40])
        except Exception:  # anything the child made up: that student's check ends, never this process
            raise self._malformed() from None
        if kind == "failed":
            raise failed
        self.close()
        if kind == "loaderror":
            raise LoadError(printable(payload))
        raise Escaped(printable(payload))

    def _malformed(self) -> Escaped:
        self.close()
        return Escaped(
            f"{self.doing}: the check's process sent something the checker does not read (a malformed "
            f"message): the check stopped it"
        )

    def _timed_out(self) -> Escaped:
        self.close()
        return Escaped(
            f"{self.doing} ran for more than {self.limit:g} s in all (an endless loop, or a long sleep?): "
            f"the check stopped it"
        )

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
            return Escaped(
                f"{self.doing} printed (or wrote) more than {OUTPUT_LIMIT >> 20} MB: the check stopped it; print less"
            )
        if code in (-signal.SIGXCPU, -signal.SIGKILL) and time.monotonic() > self.deadline - 1:
            return self._timed_out()
        if code == -signal.SIGSYS:
            return Escaped(
                f"your code tried to start a process or a thread, run a program, signal a process, or "
                f"make a device, FIFO or file attribute (in {self.doing}): the check forbids it and stopped "
                f"it"
            )
        if code == -signal.SIGXCPU:
            return Escaped(f"{self.doing} used more than {self.limit:g} s of processor time: the check stopped it")
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = str(-code)
            return Escaped(f"{self.doing} was killed by signal {name} (a crash, or too much memory)")
        return Escaped(
            f"{self.doing} ended the check's process (os._exit or a crash, exit code {code}): a checked "
            f"class must return, not end the program"
        )

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
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
            self._exit_code(10)
        if self.proc is not None:
            if self.isolate == "bwrap":
                if self.inner is None:
                    self.inner = _child_pid(self.info)
                if self.inner is not None and self.proc.poll() is None:
                    with contextlib.suppress(OSError):  # the namespace's first process: the kernel kills all with it
                        os.kill(self.inner, signal.SIGKILL)
            if self.proc.poll() is None:
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
            if self.isolate == "user":
                kill_user(self.uid, self.gid)
        if self.info is not None:
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

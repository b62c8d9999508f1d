"""The child process: it fences itself in, loads the learner's class, then runs their code on the inputs it is sent,
one request at a time, and returns what came out, never an expected value (it has none).

Before the learner's code runs (``prepare``): stdin closed, printing into one bounded file, the process's hard
limits, no capability, no new process or thread (fence.py), an audit hook that names a file written outside its
folder, a process or a connection, and autograd refused: gradient recording off, its entry points replaced
(``.backward()``, ``torch.autograd.grad``, ``torch.func``, ``torch.optim``, turning recording on), and, beneath
them, every request watched: a graph built at any level (by any entry point, private ones included), recording
left on, or a result that carries a graph is refused.  A class that is handgrad's own (``layers.Linear``,
a worked solution) is not the learner's and is refused when loaded.

``serve`` is the forked child's entry, ``main`` the exec'd one's (sandbox.py starts either).
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import signal
import sys

from .guard import LearnerFailed, call
from .load import LoadError, library_origin, load_class
from .wire import Channel, decode, dumps, encode

NO_AUTOGRAD = "no autograd here: write the gradient by hand"


class NoAutograd(RuntimeError):
    """Raised inside the learner's code when it reaches for autograd."""


# -- the exec'd child's entry ------------------------------------------------------------------------------------


def main(argv: list[str]) -> None:
    """``python -I -c BOOT VIEW learn.checker.learner_side REQ_FD REP_FD``: the setup arrives as the first frame."""
    channel = Channel(int(argv[0]), int(argv[1]))
    try:
        setup = pickle.loads(channel.recv())  # from the checker: trusted
    except (EOFError, OSError):
        os._exit(0)
    serve(channel, setup)


def serve(channel: Channel, setup: dict) -> None:
    """Fence in, say "ready", load the learner's class, answer requests until the checker closes the pipe."""
    try:
        prepare(setup, channel)
    except BaseException as e:  # the environment's fault: the checker reports it as such
        print(f"the check's process could not fence itself in: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(3)
    _send(channel, "ready", None)
    target = setup["target"]
    try:
        if "object" in target:
            cls, where = target["object"], target.get("where")
        else:
            cls, where = _load(target, setup["exercise"])
        own = library_origin(cls)
        if own:
            raise LoadError(
                f"{target.get('shown', 'it')} uses the library's own {own}, not yours: the class checked "
                f"is the one you write"
            )
        _send(channel, "ok", encode((cls.__name__, where)))
    except LoadError as e:
        _send(channel, "loaderror", str(e))
        os._exit(0)
    except BaseException as e:
        _fatal(channel, _why_stopped(e, "loading your file") or f"{type(e).__name__}: {e}")
    state = State(cls, where, setup["exercise"])
    while True:
        try:
            op, args = pickle.loads(channel.recv())
            args = decode(args)
        except (EOFError, OSError):
            os._exit(0)
        try:
            result = _watched(op, functools.partial(OPS[op], state, *args))
            _send(channel, "ok", encode(result))
        except LearnerFailed as e:
            _send(channel, "failed", encode((e.text, e.attempted, e.key)))
        except BaseException as e:  # what the guard lets through: exits, interrupts, memory
            _fatal(
                channel, _why_stopped(e, op) or f"the checker failed in the learner's process: {type(e).__name__}: {e}"
            )


def _load(target: dict, exercise: str):
    from pathlib import Path

    path, shown = Path(target["file"]), Path(target.get("shown") or target["file"])
    source = None
    if target.get("notebook"):
        from ..files import NotebookError, notebook_code

        try:
            source = notebook_code(path)
        except NotebookError as e:
            raise LoadError(str(e).replace(str(path), str(shown))) from None
    cls = load_class(path, target["cls"], exercise, shown=shown, source=source)
    return cls, str(path)


def _send(channel: Channel, kind: str, payload) -> None:
    channel.send(dumps((kind, payload)))


def _fatal(channel: Channel, line: str) -> None:
    try:
        _send(channel, "fatal", line)
    finally:
        os._exit(0)


_MEMORY = [2 << 30]  # the bytes of address space the child may add (the setup's), for the line that says so


def _why_stopped(e: BaseException, doing: str) -> str | None:
    if isinstance(e, SystemExit):
        return (
            f"your code called sys.exit({e.code if e.code is not None else ''}) while {doing}: a checked class "
            f"must return, not end the program"
        )
    if isinstance(e, KeyboardInterrupt):
        return f"your code raised KeyboardInterrupt while {doing}: the check stopped"
    if isinstance(e, MemoryError) or "can't allocate memory" in str(e) or "not enough memory" in str(e):
        return f"your code asked for more memory than the check allows ({_MEMORY[0] >> 30} GiB more) while {doing}"
    return None


# -- the fences --------------------------------------------------------------------------------------------------


def prepare(setup: dict, channel: Channel) -> None:
    """Everything the learner's code will run inside, in an order that leaves it nothing to undo."""
    import torch

    from . import fence

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the checker's to answer
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = io.StringIO()
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
    os.chdir(setup["folder"])  # the learner's file is loaded by its absolute path
    sys.dont_write_bytecode = True
    torch.set_num_threads(1)
    x = torch.ones(4, 4, dtype=torch.float64)
    (x @ x).sum().item()  # the math libraries start what they start now, before threads are refused
    _inert_checks()
    fence.drop_capabilities()
    _MEMORY[0] = setup["memory"]
    fence.hard_limits(memory=setup["memory"], cpu_seconds=setup["time_limit"] + 5, file_size=setup["output"])
    watch_autograd()
    refuse_autograd()
    sys.addaudithook(_audit(channel, os.path.realpath(setup["folder"])))
    why = fence.no_new_processes() if setup.get("seccomp", True) else None
    if why is not None:
        print(f"(the check could not refuse new processes here: {why})", file=sys.stderr)


def _inert_checks() -> None:
    """Inside the check, a notebook's own check call (``check(...)`` from learn.cell, ``check_class``) does
    nothing: the verdict is the checker's, outside."""
    import types

    cell = types.ModuleType("learn.cell")
    cell.check = lambda *args, **kwargs: None
    sys.modules["learn.cell"] = cell
    # the packages this module sits in, loaded before it (taken from sys.modules: importing them would be a cycle)
    sys.modules["learn"].cell = cell
    sys.modules["learn.checker"].check_class = lambda *args, **kwargs: True


_GRAPH: dict = {}


def watch_autograd() -> None:
    """Gradient recording off; capture, before any learner code runs, what ``_graph_mark`` needs (C functions
    and descriptors the learner's code cannot swap under it)."""
    import torch

    _GRAPH.update(
        set=torch._C._set_grad_enabled,
        on=torch._C.is_grad_enabled,
        zeros=torch.zeros,
        mul=torch.mul,
        grad_fn=torch._C.TensorBase.__dict__["grad_fn"].__get__,
        f64=torch.float64,
    )
    node = _GRAPH["grad_fn"](_probe_tensor())
    _GRAPH["seq"] = type(node)._sequence_nr
    torch.set_grad_enabled(False)


def _probe_tensor():
    g = _GRAPH
    g["set"](True)
    try:
        return g["mul"](g["zeros"]((), dtype=g["f64"], requires_grad=True), 2.0)
    finally:
        g["set"](False)


def _graph_mark() -> int:
    """The autograd graph's node counter on this thread (each node built takes the next number)."""
    return _GRAPH["seq"](_GRAPH["grad_fn"](_probe_tensor()))


def _watched(op: str, run):
    """``run()``, refused when it built an autograd graph or left gradient recording on."""
    if not _GRAPH:
        return run()
    before = _graph_mark()
    failure = None
    try:
        result = run()
    except LearnerFailed as e:
        failure, result = e, None
    left_on = _GRAPH["on"]()
    if left_on:
        _GRAPH["set"](False)
    built = _graph_mark() - before - 1
    if left_on or built > 0:
        why = (
            "turned gradient recording on and left it on"
            if left_on
            else f"built an autograd graph ({built} operation{'s' if built != 1 else ''} recorded)"
        )
        raise LearnerFailed(
            f"{_DOING.get(op, 'your code')} {why}: {NO_AUTOGRAD}, with plain tensor operations "
            f"(autograd is refused here however it is reached)",
            key="autograd-used",
        )
    if failure is not None:
        raise failure
    return result


_DOING = {
    "construct": "your constructor",
    "forward": "your forward",
    "backward": "your backward",
    "numeric": "your forward",
    "value_run": "your Value",
    "adam_run": "your Adam",
}


def refuse_autograd() -> None:
    """Gradient recording off, and every way into autograd (or torch.optim) raises NoAutograd in the learner's
    own line, so the report names it."""
    import torch
    import torch.autograd.forward_ad
    import torch.autograd.graph

    torch.set_grad_enabled(False)

    def refuse(what):
        def stop(*args, **kwargs):
            raise NoAutograd(f"{NO_AUTOGRAD} ({what} is refused)")

        return stop

    setter = torch._C._set_grad_enabled

    def recording(mode: bool) -> None:
        if mode:
            raise NoAutograd(f"{NO_AUTOGRAD} (turning gradient recording on is refused)")
        setter(False)

    torch._C._set_grad_enabled = recording  # torch.enable_grad, set_grad_enabled(True) and their kin
    torch.autograd.grad = refuse("torch.autograd.grad")
    torch.autograd.backward = refuse("torch.autograd.backward")
    torch.Tensor.backward = refuse("Tensor.backward")
    torch.autograd.graph._engine_run_backward = refuse("torch.autograd.graph._engine_run_backward")
    for n in ("make_dual", "unpack_dual", "dual_level"):
        setattr(torch.autograd.forward_ad, n, refuse(f"torch.autograd.forward_ad.{n}"))
    torch._C._enter_dual_level = refuse("forward-mode AD")
    torch._C._make_dual = refuse("forward-mode AD")
    for mod, names in (
        (torch.autograd.functional, ("jacobian", "hessian", "vjp", "jvp", "vhp", "hvp")),
        (torch.func, ("grad", "grad_and_value", "vjp", "jvp", "jacrev", "jacfwd", "hessian", "linearize")),
    ):
        for n in names:
            if hasattr(mod, n):
                setattr(mod, n, refuse(f"{mod.__name__}.{n}"))
    for n in ("Adam", "AdamW", "SGD", "RMSprop"):
        setattr(torch.optim, n, _refuse_optim(n))


def _refuse_optim(name):
    def stop(*args, **kwargs):
        raise NoAutograd(f"no torch.optim here: write the update by hand (torch.optim.{name} is refused)")

    return stop


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {
    "os.remove",
    "os.rename",
    "os.replace",
    "os.mkdir",
    "os.rmdir",
    "os.chmod",
    "os.chown",
    "os.symlink",
    "os.link",
    "os.truncate",
    "os.utime",
    "shutil.rmtree",
    "shutil.move",
    "shutil.copyfile",
    "shutil.copytree",
    "os.setxattr",
    "os.removexattr",
    "sqlite3.connect",
}
_PROCESS_EVENTS = {
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "subprocess.Popen",
    "os.kill",
    "os.killpg",
    "socket.connect",
    "socket.bind",
    "resource.setrlimit",
    "resource.prlimit",
}


def _audit(channel: Channel, folder: str):
    """An audit hook (it cannot be removed): a file changed outside ``folder``, a new process, a signal, a socket
    or a limit raised ends the check with one line.  The kernel's fences hold beneath it; this names the cause."""

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
            writes = (mode is not None and any(c in str(mode) for c in "wax+")) or (
                mode is None and isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            if writes and path is not None and not inside(path):
                _fatal(
                    channel,
                    f"your code tried to write {os.fsdecode(path)}, outside the check's temporary "
                    f"folder: the checked code may not change files (the check stopped it)",
                )
        elif event in _PATH_EVENTS:
            paths = [a for a in args if isinstance(a, (str, bytes, os.PathLike))]
            if event == "sqlite3.connect" and paths and os.fsdecode(paths[0]) == ":memory:":
                return
            if not all(inside(p) for p in paths):
                _fatal(
                    channel,
                    f"your code tried to change {', '.join(map(os.fsdecode, paths))} ({event}), "
                    f"outside the check's temporary folder: the checked code may not change files",
                )
        elif event in _PROCESS_EVENTS:
            _fatal(
                channel,
                f"your code tried to start a process, signal one, open a connection or lift a limit "
                f"({event}): the checked code may not (the check stopped it)",
            )

    return hook


# -- the requests ------------------------------------------------------------------------------------------------


class State:
    """The learner's class and the object built from it for the current configuration."""

    def __init__(self, cls: type, where: str | None, exercise: str):
        self.cls, self.where, self.exercise = cls, where, exercise
        self.obj, self.params, self.given = None, (), {}

    def ids(self) -> dict[int, str]:
        import torch

        return {
            id(getattr(self.obj, n)): n for n in self.params if isinstance(getattr(self.obj, n, None), torch.Tensor)
        }


def replay(obj, template, tensors: dict):
    """Call the learner's method as the spec's adapter would (calls.py records it): ``template`` is (method,
    args, kwargs), each argument a slot (a tensor by name), a value, or a tuple/list of them."""
    method, args, kwargs = template

    def build(a):
        kind, value = a
        if kind == "slot":
            return tensors[value]
        if kind in ("tuple", "list"):
            items = [build(v) for v in value]
            return tuple(items) if kind == "tuple" else items
        return value

    return getattr(obj, method)(*[build(a) for a in args], **{k: build(v) for k, v in kwargs.items()})


def construct(s: State, ctor: dict, params: dict) -> str | None:
    """Build the learner's layer with the constructor's arguments ``ctor`` and copy ``params`` into it; -> None,
    or why the parameters cannot be set."""
    import torch

    s.params = tuple(params)
    args = ", ".join(f"{k}={v!r}" for k, v in ctor.items())
    s.obj = call(f"{s.cls.__name__}({args})", lambda: s.cls(**ctor), where=s.where)
    for n, value in params.items():
        mine = getattr(s.obj, n, None)
        if not isinstance(mine, torch.Tensor):
            kind = "None" if mine is None else f"a {type(mine).__name__}, not a tensor"
            return (
                f"your {s.cls.__name__} has no tensor attribute {n} (got {kind}); the checker reads the "
                f"parameters by PyTorch's names: {', '.join(params)}"
            )
        if mine.shape != value.shape or mine.dtype != torch.float64:
            return (
                f"your {n} is {mine.dtype} of shape {tuple(mine.shape)}; expected float64 of shape "
                f"{tuple(value.shape)} (the constructor makes it)"
            )
        mine.copy_(value)
        mine.grad = None
    return None


def forward(s: State, template, inputs: dict):
    """-> (what forward returned, the inputs as they are after it)."""
    given = {n: t.clone() for n, t in inputs.items()}
    s.given = given  # what forward got: backward must leave it as it was too
    result = call(f"{s.cls.__name__}.forward", replay, s.obj, template, given, where=s.where)
    return result, given


def backward(s: State, template, douts: dict):
    """-> (what backward returned, the douts as they are after it, each parameter's .grad, the forward's inputs as
    they are after it)."""
    given = {n: t.clone() for n, t in douts.items()}
    result = call(f"{s.cls.__name__}.backward", replay, s.obj, template, given, where=s.where, params=s.ids())
    grads = {n: getattr(getattr(s.obj, n, None), "grad", None) for n in s.params}
    return result, given, grads, s.given


def numeric(s: State, template, inputs: dict, douts: dict, outputs: tuple, name: str, index: tuple, h: float):
    """d(sum of outputs * douts)/d name[index] by central differences of the learner's forward; None if it raises
    or returns something unusable."""
    if name.endswith(".grad"):
        t = getattr(s.obj, name[:-5])
    else:
        inputs = {n: v.clone() for n, v in inputs.items()}
        t = inputs[name[1:]]
    orig = t[index].item()
    values = []
    try:
        for step in (h, -h):
            t[index] = orig + step
            result = replay(s.obj, template, {n: v.clone() for n, v in inputs.items()})
            outs = dict(zip(outputs, result if len(outputs) > 1 else (result,), strict=True))
            values.append(sum((outs[o] * douts[f"d{o}"]).sum().item() if douts else outs[o].item() for o in outputs))
    except Exception:
        return None
    finally:
        t[index] = orig
    return (values[0] - values[1]) / (2 * h)


def stray(s: State, shape: tuple) -> dict:
    """The learner's object's tensor attributes of ``shape``: a gradient kept there instead of in .grad?"""
    import torch

    return {a: v for a, v in vars(s.obj).items() if isinstance(v, torch.Tensor) and tuple(v.shape) == shape}


def saved(s: State) -> dict:
    """The intermediates the learner chose to record in ``self.saved`` (a dict of tensors), if any."""
    import torch

    rec = getattr(s.obj, "saved", None)
    return {str(k): v for k, v in rec.items() if isinstance(v, torch.Tensor)} if isinstance(rec, dict) else {}


def probe(s: State, paths: tuple) -> dict:
    """The learner's object's attributes at the dotted ``paths`` ("fc1.weights"), each as it is (None if
    missing)."""
    found = {}
    for path in paths:
        value = s.obj
        for part in path.split("."):
            value = getattr(value, part, None)
        found[path] = list(value) if isinstance(value, tuple) else value
    return found


def value_run(s: State, index: int):
    from .value_expressions import EXPRESSIONS, run

    return run(s.cls, EXPRESSIONS[index][1], s.where)


def adam_run(s: State, params: list, grads: list, hyper: dict):
    """The learner's Adam on ``params`` with the given gradients, step by step: -> (the parameters after each
    step, the failure that stopped it as (text, key) or None)."""
    mine = [p.clone() for p in params]
    opt = call(f"{s.cls.__name__}(params, ...)", lambda: s.cls(mine, **hyper), where=s.where)
    history = []
    for gs in grads:
        for p, g in zip(mine, gs, strict=True):
            if p.grad is None:
                p.grad = g.clone()
            else:  # written into the same .grad tensor, as a loop that zeroes .grad in place does: state that
                p.grad.copy_(g)  # is that tensor itself (a momentum buffer not copied) changes with it
        try:
            call(f"{s.cls.__name__}.step", opt.step, where=s.where)
        except LearnerFailed as e:
            return history, (e.text, e.key)
        history.append([p.clone() for p in mine])
    return history, None


def _grads(obj) -> dict:
    return {f"{n}.grad": getattr(getattr(obj, n, None), "grad", None) for n in ("weight", "bias")}


def split_construct(s: State, ctor: dict, params: dict):
    """Two objects of the learner's Linear (exercise linear_split): one split into B and W, one fused; -> None, or
    why the parameters cannot be set."""
    import torch

    args = ", ".join(f"{k}={v!r}" for k, v in ctor.items())
    objs = [call(f"{s.cls.__name__}({args})", lambda: s.cls(**ctor), where=s.where) for _ in range(2)]
    for obj in objs:
        for n, value in params.items():
            mine = getattr(obj, n, None)
            if not isinstance(mine, torch.Tensor) or mine.shape != value.shape or mine.dtype != torch.float64:
                return (
                    f"your {s.cls.__name__}.{n} is {mine.dtype if isinstance(mine, torch.Tensor) else mine!r} of "
                    f"shape {tuple(getattr(mine, 'shape', ()))}; expected float64 of shape {tuple(value.shape)}"
                )
            mine.copy_(value)
            mine.grad = None
    s.obj, s.twin = objs
    s.params = tuple(params)
    return None


def split_forward(s: State, x):
    given = x.clone()
    out = call(f"{s.cls.__name__}.forward", s.obj.forward, given, where=s.where)
    return out, given


def split_b(s: State, dout):
    """B on the split object: -> (dx, dout as B left it, each .grad, the object's other attributes: what B kept)."""
    s.dout_given = dout.clone()  # the caller's buffer: overwritten before W (split_w)
    dx = call(f"{s.cls.__name__}.backward_input", s.obj.backward_input, s.dout_given, where=s.where, params=s.ids())
    kept = {k: v for k, v in vars(s.obj).items() if k not in ("weight", "bias", "x")}  # what B kept, by name
    return dx, s.dout_given.clone(), _grads(s.obj), kept


def split_w(s: State, overwrite):
    """The caller reuses dout's buffer, then W: -> each .grad."""
    s.dout_given.copy_(overwrite)
    call(f"{s.cls.__name__}.backward_weight", s.obj.backward_weight, where=s.where, params=s.ids())
    return _grads(s.obj)


def split_fused(s: State, x, dout):
    """The fused backward on the second object: -> (dx, each .grad)."""
    call(f"{s.cls.__name__}.forward", s.twin.forward, x.clone(), where=s.where)
    dx = call(f"{s.cls.__name__}.backward", s.twin.backward, dout.clone(), where=s.where)
    return dx, _grads(s.twin)


def split_w_again(s: State):
    """A W with no B before it: -> (whether it raised, each .grad after it)."""
    try:
        s.obj.backward_weight()
        raised = False
    except Exception:
        raised = True
    return raised, _grads(s.obj)


OPS = {
    "construct": construct,
    "forward": forward,
    "backward": backward,
    "numeric": numeric,
    "stray": stray,
    "saved": saved,
    "probe": probe,
    "value_run": value_run,
    "adam_run": adam_run,
    "split_construct": split_construct,
    "split_forward": split_forward,
    "split_b": split_b,
    "split_w": split_w,
    "split_fused": split_fused,
    "split_w_again": split_w_again,
}

"""Running the learner's code: an exception becomes a plain report naming their file and line, never a traceback.

Besides the exception's message the report shows the shapes of the tensors on the failing line, and when that
line adds into a ``.grad`` (``self.bias.grad += dout``) it evaluates the right-hand side, so the checker can
compare what the learner *tried* to add with the known mistakes ("your bias.grad equals dout: ...").
"""

from __future__ import annotations

import ast
import linecache
from pathlib import Path

from torch import Tensor

from ..mistakes import GRAD_NONE

KEYS = frozenset({"not-written", "autograd-used", "recursion", GRAD_NONE.key})  # the keys named here, beside the
# catalogue's: a key the learner's process sends that is neither is dropped (sandbox.Sandbox's ``keys``)


class LearnerFailed(Exception):
    """The learner's code raised: ``text`` says so in plain words; ``attempted`` maps a parameter's name to the
    gradient the failing line tried to put into its .grad; ``key`` names a recognised mistake."""

    def __init__(self, text: str, attempted: dict | None = None, key: str | None = None):
        super().__init__(text)
        self.text, self.attempted, self.key = text, attempted or {}, key


def call(what: str, fn, *args, where: str | None = None, params: dict[int, str] | None = None):
    """``fn(*args)``; an exception raised inside becomes LearnerFailed.  ``where``: the filename of the learner's
    code (its frames are the ones reported); ``params``: id(tensor) -> parameter name."""
    try:
        return fn(*args)
    except (KeyboardInterrupt, SystemExit, MemoryError):
        raise  # the sandbox ends the check on these, with one line
    except Exception as e:
        if "can't allocate memory" in str(e) or "not enough memory" in str(e):
            raise MemoryError(str(e)) from None  # torch's allocator says it with a RuntimeError
        raise explain(what, e, where, params or {}) from None


def explain(what: str, e: BaseException, where: str | None, params: dict[int, str]) -> LearnerFailed:
    frame, lineno = _learner_frame(e, where)
    kind = type(e).__name__
    message = str(e).strip() or "(no message)"
    if frame is None:
        return LearnerFailed(f"{what} raised {kind}: {message}")
    line = linecache.getline(frame.f_code.co_filename, lineno).strip()
    place = f"{Path(frame.f_code.co_filename).name} line {lineno}"
    if isinstance(e, NotImplementedError):
        unwritten = message[: -len(": not written yet")] if message.endswith(": not written yet") else what
        return LearnerFailed(
            f"{unwritten} is not written yet: {place} raises NotImplementedError.  Fill in the "
            f"part marked '# YOUR CODE HERE' (and delete the raise)",
            key="not-written",
        )
    if kind == "NoAutograd":
        return LearnerFailed(f"{what}, {place}: {message}:\n    {line}", key="autograd-used")
    text = [f"{what} raised {kind} at {place}:", f"    {line}", f"  {message}"]
    key = None
    if isinstance(e, RecursionError):
        key = "recursion"
        text.append(
            "  Python stops at about 1,000 nested calls, and a graph can be deeper: walk it with an explicit "
            "stack (a list you append to and pop from) instead of a function that calls itself"
        )
    node = _parse(line)
    attempted = {}
    if node is not None:
        shapes = _tensors_on_line(node, frame)
        if shapes:
            text.append("  on that line: " + ", ".join(f"{name} {tuple(t.shape)}" for name, t in shapes))
        target = _grad_target(node, frame, params)
        if target is not None:
            pname, value = target
            if isinstance(value, Tensor):
                attempted[pname] = value
            if isinstance(e, TypeError) and "NoneType" in message:  # p.grad += g, or p.grad = p.grad + g
                key = GRAD_NONE.key
                text.append("  " + GRAD_NONE.why)
    return LearnerFailed("\n".join(text), attempted, key)


def _learner_frame(e: BaseException, where: str | None):
    """The innermost frame of the learner's file in the exception's traceback, and its line number."""
    found, tb = (None, 0), e.__traceback__
    while tb is not None:
        if where is not None and tb.tb_frame.f_code.co_filename == where:
            found = (tb.tb_frame, tb.tb_lineno)
        tb = tb.tb_next
    return found


def _parse(line: str):
    try:
        body = ast.parse(line).body
    except SyntaxError:
        return None  # a line of a statement that spans several
    return body[0] if len(body) == 1 else None


def _lookup(node: ast.AST, frame):
    """The value of a name or an attribute chain (self.weight.T) in the frame; no calls are made."""
    if isinstance(node, ast.Name):
        if node.id in frame.f_locals:
            return frame.f_locals[node.id]
        return frame.f_globals.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _lookup(node.value, frame)
        if base is None or not isinstance(base, Tensor) and not hasattr(base, "__dict__"):
            return None
        try:
            return getattr(base, node.attr, None)
        except Exception:
            return None
    return None


def _tensors_on_line(node: ast.AST, frame) -> list[tuple[str, Tensor]]:
    seen, out = set(), []
    for sub in ast.walk(node):
        if isinstance(sub, (ast.Name, ast.Attribute)):
            name = ast.unparse(sub)
            value = _lookup(sub, frame)
            if isinstance(value, Tensor) and name not in seen:
                seen.add(name)
                out.append((name, value))
    return out[:8]


def _grad_target(node: ast.AST, frame, params: dict[int, str]):
    """For ``P.grad += expr`` or ``P.grad = expr`` with P one of the layer's parameters: (its name, expr's value)."""
    if isinstance(node, ast.AugAssign):
        target = node.target
    elif isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
    else:
        return None
    if not (isinstance(target, ast.Attribute) and target.attr == "grad"):
        return None
    param = _lookup(target.value, frame)
    if id(param) not in params:
        return None
    try:
        value = eval(
            compile(ast.Expression(node.value), frame.f_code.co_filename, "eval"), frame.f_globals, dict(frame.f_locals)
        )
    except Exception:
        value = None
    return params[id(param)], value

"""What crosses between the checker and the learner's process: plain data, in length-prefixed frames.

A request or an answer is a pickle of built-in values only: tensors travel as ("tensor", dtype, shape, bytes, the
subclass's name or None, whether it carries a graph), containers as tagged lists, anything else as its type's
name.  The checker reads an answer with an unpickler that builds nothing but built-in values (``loads``) and
turns it back into tensors within a budget of values (``decode``), so a message the child made up can neither
run code nor exhaust the checker: it is ``Unreadable``.  A frame is an 8-byte length and the bytes; ``Channel``
receives a whole frame by a deadline or not at all.  ``printable`` escapes what the child (or a file's name)
says before anything prints it.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import pickle
import select
import struct
import time
import unicodedata

import torch

FRAME_LIMIT = 64 << 20  # bytes of one message from the child
DECODE_BUDGET = 1 << 20  # values one message may hold: a shared-reference bomb is refused, not walked
_DTYPES = {
    str(d): d
    for d in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex128,
    )
}


class Unreadable(Exception):
    """A message that is not what the checker sends or reads (a malformed or made-up one)."""


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


def encode(x):
    """Tensors -> ("tensor", dtype, shape, bytes, type name); containers kept; anything else -> its type's name."""
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu().contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.dtype in _DTYPES.values() else b""
        return (
            "tensor",
            str(t.dtype),
            tuple(t.shape),
            data,
            type(x).__name__ if type(x) is not torch.Tensor else None,
            x.grad_fn is not None or x.requires_grad,
        )
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


def decode(x, budget: list | None = None):
    """The value ``encode`` made; Unreadable for anything else (or past the budget of values)."""
    budget = [DECODE_BUDGET] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0:
        raise Unreadable("too many values")
    if isinstance(x, (str, bytes, int, float, bool, type(None))):
        return x
    if not isinstance(x, tuple) or not x or not isinstance(x[0], str):
        raise Unreadable(type(x).__name__)
    tag = x[0]
    if tag == "tensor" and len(x) == 6:
        _, dtype, shape, data, subclass, graph = x
        if not (
            isinstance(shape, tuple) and all(isinstance(s, int) and s >= 0 for s in shape) and isinstance(data, bytes)
        ):
            raise Unreadable("a tensor")
        if subclass is not None:
            return NotPlain(
                f"a {printable(str(subclass))} (a subclass of torch.Tensor; return plain torch.Tensor results)"
            )
        if graph:
            return NotPlain(
                "a tensor made by autograd (it has a grad_fn or requires grad): no autograd here, write "
                "the gradient by hand"
            )
        if dtype not in _DTYPES:
            return NotPlain(f"a tensor of dtype {printable(str(dtype))}")
        if math.prod(shape) * _DTYPES[dtype].itemsize != len(data):
            raise Unreadable("a tensor's bytes")
        flat = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        return flat.view(_DTYPES[dtype]).reshape(shape).clone()
    if tag in ("tuple", "list") and len(x) == 2 and isinstance(x[1], list):
        items = [decode(v, budget) for v in x[1]]
        return tuple(items) if tag == "tuple" else items
    if tag == "dict" and len(x) == 2 and isinstance(x[1], list):
        out = {}
        for pair in x[1]:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
                raise Unreadable("a dict")
            out[pair[0]] = decode(pair[1], budget)
        return out
    if tag == "other" and len(x) == 2 and isinstance(x[1], str):
        return NotPlain(f"a {printable(x[1])}")
    raise Unreadable(printable(tag)[:40])


class _Builtins(pickle.Unpickler):
    def find_class(self, module, name):  # nothing but built-in values: no object of the child's making
        raise Unreadable(f"{module}.{name}")


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
            try:
                view = view[os.write(self.wfd, view[: 1 << 20]) :]
            except BlockingIOError:
                continue  # the pipe took nothing this time: wait again, within the deadline

    def recv(self, deadline: float | None = None, limit: int = FRAME_LIMIT) -> bytes:
        (size,) = struct.unpack(">Q", self._exactly(8, deadline))
        if size > limit:
            raise Unreadable(f"a message of {size} bytes")
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
            with contextlib.suppress(OSError):
                os.close(fd)

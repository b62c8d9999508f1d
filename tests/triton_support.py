"""What the Triton kernel tests share: where the kernels run, the checks Triton's interpreter does not make, and
tensors padded with sentinels.

Where the kernels run.  With TRITON_INTERPRET=1, in Triton's interpreter on CPU tensors; without it, compiled, on
the CUDA device.  tests/conftest.py sets TRITON_INTERPRET=1 where there is no CUDA device, so `pytest -m triton`
needs nothing set on a CPU, and runs the compiled kernels on a GPU machine (TRITON_INTERPRET=1 set by hand forces
the interpreter there too).  It must be set before Triton is first imported, not only before the kernels are
defined: Triton's own helpers (tl.zeros, tl.sum, tl.max) are kernels too, defined as Triton is imported, and a test
module may import Triton as it is collected; ``load`` fails with that explanation if it was not.

What the interpreter does not check, and ``guard`` (a fixture every kernel test uses, in tests/conftest.py) does
while a kernel runs in it; on a GPU the compiler checks the first two itself:
  - a tl.dot dimension under 16, which the interpreter accepts and an NVIDIA GPU refuses;
  - a float32 tl.dot without input_precision="ieee", which a GPU computes in TF32 (10-bit mantissas) and the
    interpreter in full float32, so agreement here would prove nothing there;
  - a load or store of a block without a mask, and any element read or written outside the tensors the kernel
    was given (the interpreter dereferences raw addresses: out of bounds it reads garbage or corrupts memory,
    silently);
  - a float passed as a runtime argument: a compiled kernel receives it as float32, the interpreter keeps
    Python's float64, so a float64 kernel would be right here and wrong there;
  - an int argument equal to 1, which a GPU compiles as a constant (tl.constexpr) and the interpreter passes
    as a tensor: the guard passes it as the constant, as the GPU does, so code that needs a tensor there fails.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

import numpy as np
import pytest
import torch

HAVE_TRITON = importlib.util.find_spec("triton") is not None
SKIP_REASON = "triton is not installed (pip install triton; torch's CUDA wheels bring it)"


def interpreting() -> bool:
    """Whether the kernels run in Triton's interpreter here (TRITON_INTERPRET, read as Triton reads it)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def device() -> str:
    """Where the tests put their tensors: "cpu" for the interpreter, "cuda" for the compiled kernels."""
    return "cpu" if interpreting() else "cuda"


def load(family: str):
    """kernels.triton.<family>, its kernels running where ``interpreting()`` says; skipped without Triton or a
    place to run it."""
    if not HAVE_TRITON:
        pytest.skip(SKIP_REASON)
    if not interpreting() and not torch.cuda.is_available():
        pytest.skip(
            "no CUDA device and TRITON_INTERPRET is not 1 (tests/conftest.py sets it where there is no "
            "device unless it was set to 0)"
        )
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(tl.zeros, InterpretedFunction) != interpreting():
        pytest.fail(
            f"Triton was imported with TRITON_INTERPRET={'0' if interpreting() else '1'} and the tests now "
            f"run with the opposite: Triton defines its own helpers (tl.zeros, ...) as it is imported, so the "
            f"variable must be set before Triton's first import (tests/conftest.py does)"
        )
    for name in ("kernels.triton._common", f"kernels.triton.{family}"):  # the helpers first: the family calls them
        module = importlib.import_module(name)
        if any(isinstance(v, InterpretedFunction) for v in vars(module).values()) != interpreting():
            module = importlib.reload(module)  # imported before, the other way
    return module


# -- the guard ---------------------------------------------------------------------------------------------------


def element_addresses(t: torch.Tensor) -> np.ndarray:
    """The byte address of every element of ``t`` (any strides), as uint64."""
    offsets = np.zeros(1, dtype=np.int64)
    for size, stride in zip(t.shape, t.stride(), strict=True):
        offsets = (offsets[:, None] + np.arange(size, dtype=np.int64)[None, :] * stride).ravel()
    if t.numel() == 0:
        offsets = offsets[:0]
    return (t.data_ptr() + offsets * t.element_size()).astype(np.uint64)


class Guard:
    """Records each launch's tensors and each tl.dot; fails a kernel that breaks a rule (the module docstring)."""

    def __init__(self, active: bool):
        self.active = active  # False on a GPU: nothing is recorded there
        self.allowed = np.zeros(0, dtype=np.uint64)  # sorted addresses of the current launch's tensor elements
        self.launches = 0
        self.dots: list[tuple[tuple[int, ...], tuple[int, ...], str]] = []  # (a's shape, b's shape, a's dtype)
        self.accesses = 0  # lanes loaded or stored

    def expect(self, launches: int) -> None:
        """The kernels ran under the guard, ``launches`` of them (so its checks cannot have passed unseen)."""
        if self.active:
            assert self.launches == launches, f"{self.launches} kernel launches guarded, expected {launches}"
            assert self.accesses > 0, "the guard saw no load or store"

    def register(self, tensors: list[torch.Tensor]) -> None:
        self.launches += 1
        found = [element_addresses(t) for t in tensors]
        self.allowed = np.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.uint64)

    def check(self, what: str, ptrs, mask) -> None:
        addresses = np.asarray(ptrs.data).ravel()
        active = addresses[np.broadcast_to(np.asarray(mask.data).astype(bool), np.shape(ptrs.data)).ravel()]
        self.accesses += active.size
        outside = active[~np.isin(active, self.allowed)]
        if outside.size:
            raise AssertionError(
                f"{what} of {outside.size} element(s) outside every tensor the kernel was given "
                f"(first at address {int(outside[0]):#x})"
            )


def _install(monkeypatch, guard: Guard) -> None:
    import triton.language as tl
    from triton._C.libtriton import ir
    from triton.runtime import interpreter as interp

    builder = interp.InterpreterBuilder
    masked_load, masked_store = builder.create_masked_load, builder.create_masked_store

    def create_masked_load(self, ptrs, mask, other, cache_modifier, eviction_policy, is_volatile):
        guard.check("load", ptrs, mask)
        return masked_load(self, ptrs, mask, other, cache_modifier, eviction_policy, is_volatile)

    def create_masked_store(self, ptrs, value, mask, cache_modifier, eviction_policy):
        guard.check("store", ptrs, mask)
        return masked_store(self, ptrs, value, mask, cache_modifier, eviction_policy)

    def everywhere(ptr):
        return interp.TensorHandle(np.ones_like(ptr.data, dtype=bool), tl.int1)

    def create_load(self, ptr, _0, _1, is_volatile):  # tl.load without a mask: a scalar only
        if np.size(ptr.data) > 1:
            raise AssertionError("tl.load of a block without a mask")
        return create_masked_load(self, ptr, everywhere(ptr), None, _0, _1, is_volatile)

    def create_store(self, ptr, val, _0, _1):
        if np.size(ptr.data) > 1:
            raise AssertionError("tl.store of a block without a mask")
        return create_masked_store(self, ptr, val, everywhere(ptr), None, None)

    create_dot = builder.create_dot

    def checked_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        shapes = (tuple(np.shape(a.data)), tuple(np.shape(b.data)))
        if min(shapes[0] + shapes[1]) < 16:
            raise AssertionError(f"tl.dot of {shapes[0]} @ {shapes[1]}: a GPU needs every dimension >= 16")
        if a.dtype == tl.float32 and input_precision != ir.INPUT_PRECISION.IEEE:
            raise AssertionError(
                f"float32 tl.dot with input_precision {input_precision}: a GPU would compute it "
                f"in TF32; pass input_precision='ieee'"
            )
        guard.dots.append((*shapes, str(a.dtype)))
        return create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    implicit_cvt = interp._implicit_cvt

    def argument(arg):
        if type(arg) is float:
            raise AssertionError(
                f"a float argument ({arg!r}) reaches a compiled kernel as float32: pass it as a "
                f"tl.constexpr or in a tensor"
            )
        if type(arg) is int and arg == 1:
            return tl.constexpr(1)  # as a GPU specialises it
        return implicit_cvt(arg)

    init_args = interp.GridExecutor._init_args_hst

    def init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        guard.register([a for a in [*args_hst, *kwargs_hst.values()] if isinstance(a, torch.Tensor)])
        return args_hst, kwargs_hst

    monkeypatch.setattr(builder, "create_load", create_load)
    monkeypatch.setattr(builder, "create_store", create_store)
    monkeypatch.setattr(builder, "create_masked_load", create_masked_load)
    monkeypatch.setattr(builder, "create_masked_store", create_masked_store)
    monkeypatch.setattr(builder, "create_dot", checked_dot)
    monkeypatch.setattr(interp, "_implicit_cvt", argument)
    monkeypatch.setattr(interp.GridExecutor, "_init_args_hst", init_args_hst)
    monkeypatch.setitem(interp.interpreter_builder.codegen_fns, "min_dot_size", lambda a, b: (16, 16, 16))


def guarded(monkeypatch) -> Guard:
    """The interpreter's missing checks, installed for one test (nothing on a GPU, whose compiler makes its own):
    tests/conftest.py's ``guard`` fixture."""
    g = Guard(HAVE_TRITON and interpreting())
    if g.active:
        _install(monkeypatch, g)
    return g


# -- sentinels around the data -----------------------------------------------------------------------------------


def padded(t: torch.Tensor, gap: int = 2, sentinel=float("nan")) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """t's values in a view of a larger buffer of sentinels: ``gap`` sentinels after every row of every axis and
    before the first and after the last element, so every stride differs from the contiguous one.
    -> (view, buffer, padding), padding a bool mask of the buffer: True where no element of the view lies."""
    shape = [s + gap for s in t.shape]
    n = int(np.prod(shape)) if shape else 1
    buffer = torch.full((n + 2 * gap,), sentinel, dtype=t.dtype, device=t.device)
    marks = torch.zeros(n + 2 * gap, dtype=torch.bool, device=t.device)
    inner = tuple(slice(0, s) for s in t.shape)
    view = buffer[gap : gap + n].view(shape)[inner]
    marks[gap : gap + n].view(shape)[inner] = True
    view.copy_(t)
    return view, buffer, ~marks


def assert_padding_kept(name: str, buffer: torch.Tensor, padding: torch.Tensor, sentinel=float("nan")) -> None:
    """Every sentinel of ``buffer`` where ``padding`` is True is as it was written (bit for bit)."""
    kept = buffer[padding]
    expected = torch.full_like(kept, sentinel)
    same = (kept.isnan() & expected.isnan()) | (kept == expected) if kept.is_floating_point() else kept == expected
    if not bool(same.all()):
        i = int((~same).nonzero()[0, 0])
        raise AssertionError(f"{name}: the padding around the data was written: sentinel {i} is {kept[i].item()}")


def assert_close(name: str, actual: torch.Tensor, expected: torch.Tensor, tol: float, floor: float = 1e-8) -> None:
    """max|actual - expected| / max(max|expected|, floor) <= tol, or a message with the worst element: its index
    and both values.  The floor: an expected tensor of zeros is met by rounding-sized numbers (CS231n's rule)."""
    if actual.shape != expected.shape:
        raise AssertionError(f"{name}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    if not bool(torch.isfinite(a).all()):
        i = np.unravel_index(int((~torch.isfinite(a)).flatten().nonzero()[0, 0]), tuple(a.shape))
        raise AssertionError(f"{name}: non-finite {a[i].item()} at {tuple(int(j) for j in i)}")
    err = (a - e).abs()
    scale = e.abs().max().clamp_min(floor) if e.numel() else 1.0
    worst = float(err.max()) / float(scale) if err.numel() else 0.0
    if worst > tol:
        i = np.unravel_index(int(err.argmax()), tuple(err.shape))
        raise AssertionError(
            f"{name}: relative error {worst:.2e} > {tol:.0e}; worst at {tuple(int(j) for j in i)}: "
            f"got {a[i].item()!r}, expected {e[i].item()!r}"
        )

"""Input validation shared by the layers and losses: every error names the layer, the argument and the shapes."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, TypeVar, cast

import torch
from torch import Tensor

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # typing's own from Python 3.13

K = TypeVar("K")

LOW_PRECISION = (torch.float16, torch.bfloat16)  # computed in float32 inside a layer, as torch's kernels accumulate

BEFORE_FORWARD = (
    "backward called before forward (or twice after one forward: each backward consumes the cache "
    "of the forward before it)"
)


def is_a(value: object, kinds: type[K] | tuple[type[K], ...]) -> TypeIs[K]:
    """``isinstance(value, kinds)``, except that a bool is never an int or a number here (True == 1 in Python,
    but a flag passed where a size or a scale belongs is a mistake)."""
    return isinstance(value, kinds) and not isinstance(value, bool)


def check_tensor(owner: str, name: str, t: object) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{owner}: {name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def check_like(owner: str, name: str, t: Tensor, ref: Tensor, ref_name: str) -> None:
    """Refuse a tensor whose dtype or device differs from ``ref`` (no silent casts)."""
    if t.dtype != ref.dtype:
        var = "x" if name == "input" else name  # what the caller's variable is likely called, for the example
        if not t.is_floating_point():  # integer, bool, complex: the model cannot take that dtype; the tensor can
            raise ValueError(
                f"{owner}: {name} has dtype {t.dtype} but {ref_name} has dtype {ref.dtype}; convert "
                f"the {name} (e.g. {var}.to({ref.dtype}))"
            )
        raise ValueError(
            f"{owner}: {name} has dtype {t.dtype} but {ref_name} has dtype {ref.dtype}; convert one "
            f"of them (e.g. {var}.to({ref.dtype}), or the model: net.to(dtype={t.dtype}))"
        )
    if t.device != ref.device:
        raise ValueError(
            f"{owner}: {name} is on {t.device} but {ref_name} is on {ref.device}; "
            f"move one of them (e.g. net.to(device='{t.device}'))"
        )


def check_floating(owner: str, name: str, t: Tensor) -> None:
    if not t.is_floating_point():
        raise ValueError(f"{owner}: {name} must be a floating-point tensor, got dtype {t.dtype}")


def check_dout(owner: str, dout: object, out_shape: torch.Size | None, ref: Tensor | None) -> Tensor:
    """Validate an upstream gradient against the shape of the cached forward output."""
    if out_shape is None:
        raise RuntimeError(f"{owner}: {BEFORE_FORWARD}")
    dout = check_tensor(owner, "dout", dout)
    if dout.shape != out_shape:
        raise ValueError(
            f"{owner}: dout has shape {tuple(dout.shape)} but the forward output had shape {tuple(out_shape)}"
        )
    if ref is not None:
        check_like(owner, "dout", dout, ref, "the forward output")
    return dout


def check_backward_dout(
    layer: object, dout: object, out_shape: torch.Size | None, dtype: torch.dtype | None, device: torch.device | None
) -> None:
    """A backward's check of ``dout`` against its forward's output (``out_shape`` None: no forward cached).
    One comparison on the hot path; only a failing dout pays for the layer's repr and the named error."""
    if (
        out_shape is not None
        and isinstance(dout, Tensor)
        and dout.shape == out_shape
        and dout.dtype == dtype
        and dout.device == device
    ):
        return
    check_dout(repr(layer), dout, out_shape, None if out_shape is None else torch.empty(0, dtype=dtype, device=device))


def check_grads_like(
    layer: object, names: tuple[str, ...], grads: Sequence, shapes, dtype: torch.dtype, device: torch.device
) -> None:
    """A backward's check of several upstream gradients (a recurrent layer's output and states), paired in order
    with the first of ``names`` and the ``shapes`` of the forward's outputs they belong to: each None (zeros) or a
    tensor of that shape, dtype and device.  One comparison each on the hot path; only a failing one pays for the
    layer's repr and the named error."""
    for name, g, shape in zip(names[: len(grads)], grads, shapes, strict=True):  # names: the family's, LSTM's at most
        if g is None or (isinstance(g, Tensor) and g.shape == shape and g.dtype == dtype and g.device == device):
            continue
        owner = repr(layer)
        g = check_tensor(owner, name, g)
        if g.shape != shape:
            raise ValueError(
                f"{owner}: {name} has shape {tuple(g.shape)} but the forward's output had shape {tuple(shape)}"
            )
        check_like(owner, name, g, torch.empty(0, dtype=dtype, device=device), "the forward output")


def check_loss_dout(loss: object, dout: object) -> None:
    """A loss's ``backward(dout)``: the upstream gradient of the scalar loss, a real number or a one-element real
    tensor (1.0 by default; a loss scale, a 1/N weight)."""
    if isinstance(dout, Tensor):
        if dout.numel() != 1 or dout.is_complex() or dout.dtype == torch.bool:
            raise ValueError(
                f"{loss!r}: dout (the upstream gradient of the loss) must be a real scalar, got a "
                f"tensor of shape {tuple(dout.shape)} and dtype {dout.dtype}"
            )
    elif not is_a(dout, numbers.Real):
        raise TypeError(
            f"{loss!r}: dout (the upstream gradient of the loss) must be a number or a one-element "
            f"tensor, default 1.0; got {type(dout).__name__} {dout!r:.40}"
        )


def check_int(owner: str, name: str, value: object, lo: int | None = 1, hi: int | None = None, *, why: str = "") -> int:
    """Refuse anything but an int in [lo, hi] (no bound where None; a bool is not an int here), naming the
    argument and the value; ``why`` is added after the requirement (" (the table has 4 rows)")."""
    if not is_a(value, int) or (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = (
            f" in [{lo}, {hi}]"
            if lo is not None and hi is not None
            else f" >= {lo}"
            if lo is not None
            else f" <= {hi}"
            if hi is not None
            else ""
        )
        raise ValueError(f"{owner}: {name} must be an int{bounds}{why}, got {value!r}")
    return value


def capturing(t: Tensor) -> bool:
    """True while ``t``'s CUDA stream is being captured into a graph, where reading a value back is illegal; never
    while torch.compile traces (it cannot trace the query, and the callers' compiled checks read nothing back)."""
    return t.is_cuda and not torch.compiler.is_compiling() and torch.cuda.is_current_stream_capturing()


def check_bool(owner: str, name: str, value: object, *, error: type[Exception] = ValueError) -> bool:
    """Refuse anything but True or False (1, "yes" and None are not flags here), naming the argument; ``error``:
    the exception raised (TypeError where torch's twin raises one)."""
    if not isinstance(value, bool):
        raise error(f"{owner}: {name} must be a bool, got {value!r}")
    return value


def check_number(
    owner: str,
    name: str,
    value: object,
    lo: float = -math.inf,
    hi: float = math.inf,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> float:
    """Refuse anything but a finite real number in [lo, hi] (``lo_open``/``hi_open``: the bound excluded); a bool
    is not a number here.  Returns it as a float."""
    x = cast(float, value)  # compared only where it is a real number (the `and` stops at the first test)
    ok = (
        is_a(value, numbers.Real)
        and math.isfinite(x)
        and (x > lo if lo_open else x >= lo)
        and (x < hi if hi_open else x <= hi)
    )
    if not ok:
        interval = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
        where = "a finite number" if (lo, hi) == (-math.inf, math.inf) else f"a finite number in {interval}"
        raise ValueError(f"{owner}: {name} must be {where}, got {value!r}")
    return float(x)


def check_probability(owner: str, name: str, value: object) -> float:
    """A probability in [0, 1] (dropout's p), as a float."""
    if not is_a(value, numbers.Real) or not 0.0 <= cast(float, value) <= 1.0:
        raise ValueError(f"{owner}: {name} must be a probability in [0, 1], got {value!r}")
    return float(cast(float, value))


class Expects(NamedTuple):
    """What a layer's forward takes, declared on the class (``expects = Expects(...)``) and checked by the template
    before the math runs: a tensor of one of the ranks ``dims``, whose axis ``size[0]`` holds as many values as the
    layer's attribute ``size[1]`` (or that ends with the shape held by the attribute ``trailing``), of a
    floating-point dtype, on the device and of the dtype of the first of the parameters named in ``like`` that the
    layer has.  A failure raises one error naming the layer, the input and what was expected:

        ``shape``     the expected shape as the error writes it, ``{attribute}`` fields read off the layer
        ``name``      what the error calls the input ("x", "src"); ``like_name`` in a dtype or device mismatch
        ``floating``  refuse an integer or boolean input before its shape (False: any dtype passes to ``like``)
        ``half``      a float16/bfloat16 input is accepted with float32 parameters (the norms compute in float32);
                      a mismatch is then said of "the parameters", as torch says it
        ``axis``      an attribute holding an axis index (a softmax's ``dim``) that must name an axis of the input
    """

    dims: tuple[int, ...] = ()
    size: tuple[int, str] | None = None
    trailing: str | None = None
    like: tuple[str, ...] = ()
    shape: str = ""
    name: str = "x"
    like_name: str = ""
    floating: bool = True
    half: bool = False
    axis: str | None = None


class _Fields:
    """``layer``'s attributes as a mapping, for ``str.format_map`` of an ``Expects.shape``."""

    def __init__(self, layer: object) -> None:
        self.layer = layer

    def __getitem__(self, key: str) -> object:
        return getattr(self.layer, key)


def check_expected(layer: object, x: object, expects: Expects) -> None:
    """Refuse ``x`` where it is not what ``expects`` declares for ``layer`` (the cheap test first; only a failing
    input pays for the layer's repr and the named error)."""
    ref, ref_name = None, ""
    for ref_name in expects.like:
        ref = getattr(layer, ref_name)
        if ref is not None:
            break
    if (
        isinstance(x, Tensor)
        and (not expects.floating or x.is_floating_point())
        and (not expects.dims or x.dim() in expects.dims)
        and (expects.size is None or (x.dim() > 0 and x.shape[expects.size[0]] == getattr(layer, expects.size[1])))
        and (expects.trailing is None or _ends_with(x, getattr(layer, expects.trailing)))
        and (
            ref is None
            or (
                x.device == ref.device
                and (x.dtype == ref.dtype or (expects.half and x.dtype in LOW_PRECISION and ref.dtype == torch.float32))
            )
        )
    ):
        if expects.axis is not None:
            dim = getattr(layer, expects.axis)
            if not -x.dim() <= dim < max(x.dim(), 1):
                raise ValueError(
                    f"{layer!r}: {expects.axis} {dim} is out of range for an input of shape {tuple(x.shape)}"
                )
        return
    owner = repr(layer)
    x = check_tensor(owner, expects.name, x)
    if expects.floating:
        check_floating(owner, expects.name, x)
    shape_ok = (
        (not expects.dims or x.dim() in expects.dims)
        and (expects.size is None or (x.dim() > 0 and x.shape[expects.size[0]] == getattr(layer, expects.size[1])))
        and (expects.trailing is None or _ends_with(x, getattr(layer, expects.trailing)))
    )
    if not shape_ok:
        raise ValueError(
            f"{owner}: expected input of shape {expects.shape.format_map(_Fields(layer))}, got {tuple(x.shape)}"
        )
    if ref is None:
        return
    if not expects.half:
        check_like(owner, expects.like_name or expects.name, x, ref, ref_name)
        return
    if x.device != ref.device:
        raise ValueError(
            f"{owner}: {expects.name} is on {x.device} but the parameters are on {ref.device}; "
            f"move one of them (e.g. layer.to(device='{x.device}'))"
        )
    raise ValueError(
        f"{owner}: {expects.name} has dtype {x.dtype} but the parameters have dtype {ref.dtype} (a "
        f"float16/bfloat16 input is accepted with float32 parameters); convert one of them"
    )


def _ends_with(x: Tensor, shape: tuple[int, ...]) -> bool:
    k = len(shape)
    return x.dim() >= k and tuple(x.shape[x.dim() - k :]) == tuple(shape)

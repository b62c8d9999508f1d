"""What a layer is: the ``Layer`` protocol, and ``BaseLayer``, the plumbing every built-in layer shares.

Shape legend used throughout ``layers/``:
    N = batch size, D = in_features, H = out_features, C = classes or channels,
    (H_in, W_in) / (H_out, W_out) = image height and width before / after a layer,
    (kH, kW) = kernel size.

A layer is any object with

    forward(x)      -> out           caches what backward needs
    backward(dout)  -> dx            dL/dx; adds dL/dparam into each parameter's .grad
    parameters()    -> list[Tensor]  plain tensors, requires_grad=True as nn.Parameter's (False: frozen)
    __call__(x)     == forward(x)

A parameter's own ``requires_grad`` decides whether backward gives it a gradient, read at each backward
(``wants_grad``), however it was set: ``p.requires_grad_(False)``, ``layer.requires_grad_(False, names)``,
``from_torch`` of a frozen module.  The forward and backward are hand-written and build no autograd graph:
every ``BaseLayer`` subclass's ``forward`` and ``backward`` run with grad recording off (``no_graph``).

Gradients *accumulate* (``p.grad += ...``) as in PyTorch; ``zero_grad()`` on a
model or an optimizer clears them.  Each backward consumes the cache of the
forward before it, so calling backward twice without a forward is an error,
never a silent doubling.

Layers whose input gradient costs real work (Linear, Conv2d) take
``backward(dout, need_input_grad=True)``; ``False`` skips dx and returns None.
A container (``Sequential``, ``Net``) is the whole model, whose input is data:
like torch, which computes ``x.grad`` only for an input that requires it, a
container skips its first layer's dx unless asked with ``need_input_grad=True``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol, TypeVar, overload, runtime_checkable

import torch
from torch import Tensor
from torch.nn.modules.module import _IncompatibleKeys

from .checks import check_bool
from .template import Product, Template, accumulate_grad, no_graph, recording_graph, wants_grad  # noqa: F401


@runtime_checkable
class Layer(Protocol):
    """What a layer is: forward(x) -> out, backward(dout) -> dx (its parameters' gradients into their .grad),
    parameters() and calling it as forward.  Structural: a class of one's own with these methods is a Layer to
    the type checker and to isinstance (which sees only that the methods are there), no base class needed."""

    def forward(self, x: Tensor) -> Tensor: ...

    def backward(self, dout: Tensor) -> Tensor: ...

    def parameters(self) -> list[Tensor]: ...

    def __call__(self, x: Tensor) -> Tensor: ...


_T1 = TypeVar("_T1", bound="Tensor | None")
_T2 = TypeVar("_T2", bound="Tensor | None")


@overload
def learned(a: _T1, /) -> tuple[_T1]: ...
@overload
def learned(a: _T1, b: _T2, /) -> tuple[_T1, _T2]: ...
@overload
def learned(*tensors: Tensor) -> tuple[Tensor, ...]: ...
@overload
def learned(*tensors: Tensor | None) -> tuple[Tensor | None, ...]: ...


def learned(*tensors: Tensor | None) -> tuple[Tensor | None, ...]:
    """Mark freshly created tensors as parameters: ``requires_grad=True``, as ``nn.Parameter``'s default (None
    passes through).  The tensors keep their identity (a tied matrix stays one tensor)."""
    return tuple(None if t is None else t.requires_grad_() for t in tensors)


def zero_grad_(params: Iterable[Tensor], set_to_none: bool = True) -> None:
    """Clear every ``.grad``: to None (the default, as torch does) or to zeros in place (the storage stays)."""
    params = [p for p in params if p.grad is not None]
    if set_to_none:
        for p in params:
            p.grad = None
    elif params:
        torch._foreach_zero_([p.grad for p in params if p.grad is not None])  # one kernel per device and dtype


def named_parameters_of(layer: Layer) -> list[tuple[str, Tensor]]:
    """``layer.named_parameters()`` where the layer has it; else each of ``parameters()`` under the name of the
    attribute that holds it (``self.weight`` -> "weight"), or its position (0, 1, ...) where no attribute does."""
    named = getattr(layer, "named_parameters", None)
    if named is not None:
        return list(named())
    attrs = {id(v): k for k, v in vars(layer).items() if isinstance(v, Tensor)} if hasattr(layer, "__dict__") else {}
    return [(attrs.get(id(p), str(j)), p) for j, p in enumerate(layer.parameters())]


class BaseLayer(Template):
    """Parameters, buffers, train/eval, state_dict and ``to`` for a hand-written layer.

    A subclass names its tensors in ``_param_names`` (learned, with ``.grad``) and
    ``_buffer_names`` (state such as batch norm's running statistics), as attributes
    that may be None (``bias=False``).  Containers override ``named_children``.
    Every tensor is kept in torch.nn's shape and layout for its name (Linear's weight is (out, in) as
    nn.Linear's), so ``named_parameters()``, ``.grad``, an optimizer's state and ``state_dict()`` pair with the
    torch.nn twin's by name and by position.
    """

    _param_names: tuple[str, ...] = ()
    _buffer_names: tuple[str, ...] = ()
    training: bool = True
    torch_class: type[torch.nn.Module] | None = None  # the torch.nn module this layer is the twin of
    _ctor_args: tuple[str, ...] = ()  # constructor arguments, named as the torch.nn module names them

    def __call__(self, *inputs, **options):
        return self.forward(*inputs, **options)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.extra_repr()})"

    def extra_repr(self) -> str:
        return ""

    # -- the tree -------------------------------------------------------------------------------------

    def named_parameters(self, prefix: str = "", remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        """Every parameter with torch's dotted name ("0.weight", "layers.2.bias", ...), in torch's order.  A tensor
        held by two layers (a module used twice, a tied matrix) comes once, under its first name, as torch's
        ``named_parameters()`` gives it (``remove_duplicate=False``: under every name)."""
        seen: set[int] = set()
        for _, _, name, t in self._slots("param", prefix):
            if remove_duplicate:
                if id(t) in seen:
                    continue
                seen.add(id(t))
            yield name, t

    def parameters(self) -> list[Tensor]:
        return [p for _, p in self.named_parameters()]

    def named_buffers(self, prefix: str = "", remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        seen: set[int] = set()
        for _, _, name, t in self._slots("buffer", prefix):
            if remove_duplicate:
                if id(t) in seen:
                    continue
                seen.add(id(t))
            yield name, t

    def _slots(self, kind: str, prefix: str = "") -> Iterator[tuple[Layer, str, str, Tensor]]:
        """(owning layer, its attribute, dotted name, tensor) for every parameter (kind "param") or buffer
        ("buffer") in the tree, depth first in torch's order, duplicates included.  A child that is not a
        BaseLayer (a layer of your own) shows its ``named_parameters_of`` and no buffers."""
        for attr in self._param_names if kind == "param" else self._buffer_names:
            t = getattr(self, attr)
            if t is not None:
                yield self, attr, prefix + attr, t
        for cname, child in self.named_children():
            if isinstance(child, BaseLayer):
                yield from child._slots(kind, f"{prefix}{cname}.")
            elif kind == "param":
                yield from ((child, n, f"{prefix}{cname}.{n}", p) for n, p in named_parameters_of(child))

    # -- frozen parameters --------------------------------------------------------------------------------

    def requires_grad_(self, requires_grad: bool = True, names=None):
        """Freeze (``False``) or unfreeze parameters: sets each one's own ``requires_grad``, as torch's
        ``module.requires_grad_`` / ``p.requires_grad_(False)`` do, and nothing else (``.grad`` is left as it is).
        ``names``: dotted names as ``named_parameters()`` gives them (None: all).  A tensor shared by several
        layers is one tensor with one flag.  Returns self."""
        check_bool(f"{type(self).__name__}.requires_grad_", "requires_grad", requires_grad, error=TypeError)
        slots = list(self._slots("param"))
        if names is None:
            targets = {id(t) for _, _, _, t in slots}
        else:
            names = [names] if isinstance(names, str) else list(names)
            by_name = {name: t for _, _, name, t in slots}
            unknown = [n for n in names if n not in by_name]
            if unknown:
                raise KeyError(
                    f"{type(self).__name__}.requires_grad_: no parameter named {', '.join(map(repr, unknown))}"
                    f" (its parameters: {', '.join(list(by_name)[:6])}{', ...' if len(by_name) > 6 else ''})"
                )
            targets = {id(by_name[n]) for n in names}
        for owner, _, _, t in slots:
            if id(t) not in targets:
                continue
            if not isinstance(owner, BaseLayer):
                raise TypeError(
                    f"requires_grad_: {type(owner).__name__} is not a handgrad BaseLayer; freeze its "
                    f"parameters by not passing them to the optimizer"
                )
            t.requires_grad_(requires_grad)
        return self

    def frozen_parameters(self) -> list[str]:
        """The dotted names of the parameters that do not require a gradient (their ``requires_grad`` False)."""
        return [name for name, t in self.named_parameters() if not t.requires_grad]

    def __init_subclass__(cls, **kwargs) -> None:
        """A class that writes the public ``forward`` or ``backward`` itself -- a container (``Sequential``), a layer
        in the plain protocol -- has it run with grad recording off (``no_graph``), as the template's own run: the
        parameters require gradients, and the hand-written pass must build no graph.  A layer written in the
        template writes ``forward_math``/``backward_math`` and inherits both (layers/template.py)."""
        super().__init_subclass__(**kwargs)
        for name in ("forward", "backward"):
            method = cls.__dict__.get(name)
            if method is not None and not getattr(method, "_no_graph", False):
                setattr(cls, name, no_graph(method))

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's .grad (to None by default, as torch does)."""
        zero_grad_(self.parameters(), set_to_none)

    def train(self, mode: bool = True):
        """Training mode (batch statistics, dropout on) or, with ``mode=False``, eval mode; for every child too."""
        self.training = bool(mode)
        for _, child in self.named_children():
            if hasattr(child, "train"):
                child.train(mode)
            elif hasattr(child, "training"):
                child.training = bool(mode)
        return self

    def eval(self):
        return self.train(False)

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        """Move/cast parameters and buffers in place (their identity is kept, so optimizers built earlier
        still see them).  Integer buffers (``num_batches_tracked``) keep their dtype, as in torch."""
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"{type(self).__name__}.to: dtype must be floating point, got {dtype}")
        for t in [*self.parameters(), *(b for _, b in self.named_buffers())]:
            cast = dtype if t.is_floating_point() else None
            t.data = t.data.to(device=device, dtype=cast)
            if t.grad is not None:
                t.grad = t.grad.to(device=device, dtype=cast)
        return self

    # -- state_dict -----------------------------------------------------------------------------------

    def _own_state(self) -> Iterator[tuple[str, Tensor]]:
        for name in (*self._param_names, *self._buffer_names):
            t = getattr(self, name)
            if t is not None:
                yield name, t

    def state_dict(self, prefix: str = "") -> dict[str, Tensor]:
        """torch.nn's keys and layouts, parameters then buffers per layer; tensors share memory with ours, detached
        (no ``requires_grad``) as torch.nn's are."""
        sd = {prefix + name: t.detach() for name, t in self._own_state()}
        for cname, child in self.named_children():
            if isinstance(child, BaseLayer):
                sd.update(child.state_dict(f"{prefix}{cname}."))
            else:
                own = getattr(child, "state_dict", None)
                pairs = own().items() if own is not None else named_parameters_of(child)
                sd.update((f"{prefix}{cname}.{n}", t) for n, t in pairs)
        return sd

    def load_state_dict(self, state_dict: Mapping[str, Tensor], strict: bool = True):
        """Copy values in (from this model's or its torch twin's state_dict); shapes must match.  Returns torch's
        ``_IncompatibleKeys(missing_keys, unexpected_keys)``; ``strict=True`` (the default) refuses any."""
        own = self.state_dict()
        missing = [k for k in own if k not in state_dict]  # in the model's order, as torch lists them
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            _refuse_wrapped_keys(type(self).__name__, own, state_dict)
            raise KeyError(
                f"{type(self).__name__}.load_state_dict: missing keys {missing}, unexpected keys {unexpected}"
            )
        for key, dst in own.items():
            if key not in state_dict:
                continue
            src = state_dict[key]
            if not isinstance(src, Tensor):
                raise TypeError(
                    f"{type(self).__name__}.load_state_dict: '{key}' is a {type(src).__name__}, not a tensor"
                )
            if src.shape != dst.shape:
                raise ValueError(
                    f"{type(self).__name__}.load_state_dict: '{key}' has shape {tuple(src.shape)}, "
                    f"expected {tuple(dst.shape)}"
                )
            with torch.no_grad():
                dst.copy_(src)
        return _IncompatibleKeys(missing, unexpected)

    # -- conversion to and from torch.nn ----------------------------------------------------------------

    @classmethod
    def _ctor_kwargs(cls, obj: object) -> dict:
        """Constructor arguments read off ``obj``, a layer of this class or its torch.nn twin: both name
        them alike (``bias`` is an argument but a tensor attribute: it becomes ``bias is not None``)."""
        kw = {}
        for name in cls._ctor_args:
            v = getattr(obj, name)
            kw[name] = (v is not None) if name == "bias" else v
        return kw

    def _device_dtype(self) -> dict:
        for t in (*self.parameters(), *(b for _, b in self.named_buffers())):
            if t.is_floating_point():
                return {"device": t.device, "dtype": t.dtype}
        return {}

    @classmethod
    def from_torch(cls, module: torch.nn.Module):
        """The hand-written layer equivalent to ``module``, holding a copy of its weights and buffers."""
        if cls.torch_class is None or not isinstance(module, cls.torch_class):
            raise TypeError(
                f"{cls.__name__}.from_torch: expected a {getattr(cls.torch_class, '__name__', None)}, "
                f"got {type(module).__name__}"
            )
        tensors = [*module.parameters(), *module.buffers()]
        placed: dict[str, Any] = (
            {"device": tensors[0].device, "dtype": next((t.dtype for t in tensors if t.is_floating_point()), None)}
            if tensors and _takes_dtype(cls)
            else {}
        )
        with _rng_untouched(placed.get("device")):  # the throwaway initialisation draws nothing from the RNG
            layer = cls(**cls._ctor_kwargs(module), **placed)
        layer.load_state_dict(module.state_dict())
        return copy_requires_grad(module, layer).train(module.training)

    def to_torch(self) -> torch.nn.Module:
        """The equivalent torch.nn module, holding a copy of these weights and buffers, in the same mode."""
        if self.torch_class is None:
            raise TypeError(f"{type(self).__name__} has no torch.nn twin")
        placed = self._device_dtype() if _takes_dtype(type(self)) else {}
        kw = self._ctor_kwargs(self)
        # an older torch: a bias always (the ignore: mypy takes a class for unhashable)
        if "bias" in kw and not _torch_takes(self.torch_class, "bias"):  # type: ignore[arg-type]
            bias = kw.pop("bias")
            if not bias:
                raise TypeError(
                    f"{self!r} has no twin in torch {torch.__version__}: its "
                    f"{self.torch_class.__name__} takes no bias argument (a bias is always there)"
                )
        with _rng_untouched(placed.get("device")):
            module = self.torch_class(**kw, **placed)
        module.load_state_dict(self.state_dict())
        return copy_requires_grad(self, module).train(self.training)


def copy_requires_grad(src, dst):
    """Freeze in ``dst`` what is frozen in ``src``, by parameter name -- a torch module's ``requires_grad=False``
    parameters or a hand-written model's ``frozen_parameters()``, either way; returns ``dst``."""
    if isinstance(src, torch.nn.Module):
        frozen = [name for name, p in src.named_parameters() if not p.requires_grad]
    else:
        frozen = src.frozen_parameters()
    if not frozen:
        return dst
    if isinstance(dst, torch.nn.Module):
        for name in frozen:
            dst.get_parameter(name).requires_grad_(False)
    else:
        dst.requires_grad_(False, frozen)
    return dst


def _refuse_wrapped_keys(owner: str, own: Mapping[str, Tensor], state_dict: Mapping[str, Tensor]) -> None:
    """A state_dict saved from a wrapper -- torch.compile's ``_orig_mod.``, DistributedDataParallel's ``module.`` --
    carries one prefix on every key: say so, and how to strip it, rather than list every key as missing."""
    keys = list(state_dict)
    for prefix, wrapper in (("_orig_mod.", "torch.compile"), ("module.", "DistributedDataParallel/DataParallel")):
        if (
            keys
            and all(isinstance(k, str) and k.startswith(prefix) for k in keys)
            and {k[len(prefix) :] for k in keys} & set(own)
        ):
            raise KeyError(
                f"{owner}.load_state_dict: every key starts with '{prefix}' (a state_dict saved from a "
                f"{wrapper} wrapper); strip it first: torch.nn.modules.utils."
                f"consume_prefix_in_state_dict_if_present(state_dict, '{prefix}'), or save the wrapped "
                f"model's own state_dict"
            )


def _takes_dtype(cls: type) -> bool:
    """Whether the layer's constructor (hence its torch twin's) takes device= and dtype= (layers with tensors)."""
    import inspect

    return "dtype" in inspect.signature(cls.__init__).parameters  # type: ignore[misc]  # the class's own __init__


@functools.cache
def _torch_takes(cls: type, name: str) -> bool:
    """Whether a torch.nn class's constructor takes the argument ``name`` (BatchNorm's ``bias`` came with a later
    torch; RNN's constructor takes ``**kwargs``, which it checks itself)."""
    import inspect

    params = inspect.signature(cls).parameters
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _rng_untouched(device: torch.device | None):
    """Run a throwaway initialisation without moving the global CPU (or that CUDA device's) RNG."""
    cuda = (
        [device.index if device.index is not None else torch.cuda.current_device()]
        if device is not None and device.type == "cuda"
        else []
    )
    return torch.random.fork_rng(devices=cuda)

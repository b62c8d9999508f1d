"""The template every built-in layer is written in: the layer writes its math, the base does the rest, once.

A layer writes a forward that returns its output and what its backward needs, by name, and a backward that
returns the gradients -- CS231n's ``affine_forward``/``affine_backward`` and torch.autograd.Function's form:

    class Linear(BaseLayer):
        _param_names = ("weight", "bias")

        class Saved(NamedTuple):          # what backward reads, by name
            x: Tensor                     # (N, D), for dW
            weight: Tensor                # (H, D), for dx

        def forward(self, x):
            return torch.addmm(self.bias, x, self.weight.t()), self.Saved(x, self.weight)

        def backward(self, dout, saved):
            dx = dout @ saved.weight if self.needs_input_grad else None
            return dx, {"weight": Product(dout.t(), saved.x), "bias": dout.sum(0)}

A class whose ``backward`` takes ``saved`` is written in the template: ``BaseLayer.__init_subclass__`` wraps its
two methods into the public protocol, ``layer.forward(x) -> out`` and ``layer.backward(dout) -> dx`` adding into
``.grad``, which does for every such layer:

forward(x, ...)
    the layer's ``check_input`` (default: a floating-point tensor), grad recording off (``no_graph``), the math,
    the version of every tensor in ``saved`` (layers/saved.py), the output's shape, dtype and device.
backward(dout, need_input_grad=True, ...)
    "backward called before forward", dout against the output (``check_dout``), the versions (a tensor changed in
    place since the forward is refused, naming it), ``self.needs_input_grad`` set for the math, then each
    parameter gradient added into ``.grad``; returns dx (None when ``need_input_grad=False``).
backward_input(dout, ...) then backward_weight()
    the same backward split in two for pipeline schedules: B returns dx, W adds the parameter gradients later.

A parameter gradient is a tensor (fresh: it becomes ``.grad`` on first use), ``Product(a, b)`` (``a @ b``, computed
only for a parameter that requires a gradient and added in place with ``addmm_`` when ``.grad`` exists),
``IndexAdd(index, source)`` (rows scattered in place with ``index_add_``: an embedding's), a callable returning
the tensor (computed only when wanted), or None.  A layer with no parameters returns dx alone.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from .checks import check_backward_dout, check_floating, check_tensor
from .saved import _TRACED, check_versions, versions

_recording = False  # set by recording_graph(): the layers' forward and backward record as plain torch code does


@contextlib.contextmanager
def recording_graph():
    """Within: the layers' forward and backward run with grad mode as the caller set it, so that autograd records
    the hand-written computation (gradcheck's autograd oracle differentiates the forward so)."""
    global _recording
    before, _recording = _recording, True
    try:
        yield
    finally:
        _recording = before


def no_graph(method):
    """``method`` run with grad recording off, as torch.optim runs its step: the hand-written forward and backward
    compute with tensors that require gradients and must record nothing.  Inside a container's call, where
    recording is off already, the cost is one ``torch.is_grad_enabled()`` test."""
    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        if torch.is_grad_enabled() and not _recording:
            with torch.no_grad():
                return method(self, *args, **kwargs)
        return method(self, *args, **kwargs)
    wrapped._no_graph = True
    return wrapped


def wants_grad(param: Tensor) -> bool:
    """Whether backward gives ``param`` a gradient: its own ``requires_grad``, read now.  The one rule every layer
    follows: a parameter that does not require a gradient gets none, its ``.grad`` left exactly as it was, and
    the product that would give it is skipped."""
    return param.requires_grad


def accumulate_grad(param: Tensor, grad: Tensor) -> None:
    """``param.grad += grad``, creating ``.grad`` on first use (PyTorch's semantics); nothing for a parameter that
    does not require a gradient (``wants_grad``).

    An existing ``.grad`` is added into in place, so its storage stays put from step to step when the
    gradients are cleared with ``zero_grad(set_to_none=False)`` (zeros written in place): what a CUDA
    graph replays and what a tight loop wants.  ``zero_grad()`` with torch's default ``set_to_none=True``
    drops ``.grad``, and the next backward allocates it again (from the caching allocator on CUDA).
    ``grad`` becomes ``.grad`` itself on first use: callers pass a tensor nothing else will write to.
    """
    if not wants_grad(param):
        return
    if param.grad is None:
        param.grad = grad
    else:
        param.grad.add_(grad)


class Product(NamedTuple):
    """A parameter gradient ``a @ b`` (a weight gradient is one GEMM: ``dW = dout^T x``), left to the base to
    compute: skipped for a frozen parameter, written as ``.grad`` on first use, added in place (``addmm_``, no
    temporary) when ``.grad`` exists."""
    a: Tensor
    b: Tensor


def add_product(param: Tensor, a: Tensor, b: Tensor) -> None:
    """``param.grad += a @ b`` without a temporary where ``.grad`` exists; nothing for a frozen parameter."""
    if not wants_grad(param):
        return
    if param.grad is None:
        param.grad = a @ b
    elif a.dim() == 2 and b.dim() == 2:
        param.grad.addmm_(a, b)
    else:
        param.grad.add_(a @ b)


class IndexAdd(NamedTuple):
    """A parameter gradient whose row ``index[i]`` receives ``source[i]``, repeated indices adding up (an embedding's
    scatter-add), left to the base: skipped for a frozen parameter, added with ``index_add_`` into ``.grad`` in
    place (zeros on first use): no temporary of the table's size."""
    index: Tensor  # (P,) row of each source row
    source: Tensor  # (P, D)


_LABELS = {"x": "its input x", "out": "its output"}  # how the in-place check names a kept tensor


class Template:
    """What the base does for a layer written in the template (see the module docstring).  ``BaseLayer`` mixes it
    in; a layer may override ``check_input`` and ``check_dout``, and name its kept tensors in ``_saved_labels``
    (field -> words for the in-place error; ``x`` and ``out`` are named already).  ``_input_grad_only`` lists the
    fields read only for dx, checked only when dx is asked for (autograd keeps Linear's weight only then)."""

    _saved_labels: dict[str, str] = {}
    _input_grad_only: tuple[str, ...] = ()
    needs_input_grad: bool = True  # what the math backward reads: whether dx is wanted this time
    _saved = None  # the forward's Saved, until the backward consumes it
    _out_meta = None  # the forward's output (shape, dtype, device): what dout must match; None: no forward
    _pending_w = None  # backward_input's gradients, until backward_weight adds them
    _versions = ()  # the version of each field of _saved (-1: not a tensor): what the in-place check compares
    _plain_dout_check = True  # check_dout not overridden (set per class by wrap_template): tested inline first
    _childless = True  # no child layers (set per class by wrap_template): a forward without parameters builds no
    # graph unless it is given a tensor that requires a gradient

    def named_children(self):
        """The child layers (none here; a container or a block names its own)."""
        return iter(())

    def check_input(self, x, *args, **kwargs) -> None:
        """Refuse what the math forward cannot take, naming the layer: by default, anything but a floating-point
        tensor."""
        if not (isinstance(x, Tensor) and x.is_floating_point()):
            check_tensor(repr(self), "x", x)
            check_floating(repr(self), "x", x)

    def check_dout(self, dout, meta) -> None:
        """Refuse a dout unlike the forward's output (``meta``: its shape, dtype, device; None: no forward)."""
        check_backward_dout(self, dout, *(meta or (None, None, None)))

    def discard_saved(self) -> None:
        """Drop the forward's cache, as a backward does (a caller that ran this layer's backward itself)."""
        self._saved = self._out_meta = None

    @no_graph
    def backward_input(self, dout, need_input_grad: bool = True, **kwargs):
        """B: the input gradient now, as ``backward`` returns it; the parameter gradients wait for
        ``backward_weight()`` (computed there where given as ``Product``s or callables).  One W per B."""
        if self._pending_w is not None:
            raise RuntimeError(f"{self!r}: backward_input() again before backward_weight() of the previous one")
        if getattr(type(self), "_backward_math", None) is None:
            raise TypeError(f"{type(self).__name__}: backward_input()/backward_weight() split a backward "
                                      f"written in the template (backward(self, dout, saved)); this layer writes "
                                      f"its own backward")
        dx, grads, saved, recorded = _backward_math(self, dout, need_input_grad, kwargs)
        self._pending_w = (grads, saved, recorded)
        return dx

    @no_graph
    def backward_weight(self) -> None:
        """W: adds the gradients of the last ``backward_input`` into ``.grad``.  What they read must not have
        changed in place since the forward."""
        grads = self._take_pending_w()
        if grads:
            _add_grads(self, grads)

    def _take_pending_w(self) -> dict | None:
        """The gradients the last ``backward_input`` left for W, after the checks: one W per B, and what they read
        unchanged in place since the forward."""
        pending, self._pending_w = self._pending_w, None
        if pending is None:
            raise RuntimeError(f"{self!r}: backward_weight() needs a backward_input() before it (one W per B)")
        grads, saved, recorded = pending
        if saved is not None:  # (what only dx read is done with)
            tensors = _without_input_grad_only(self, saved, _tensors_of(self, saved))
            check_versions(self, _labels(self, saved), tensors, recorded)
        return grads


def _labels(layer, saved) -> Callable[[], tuple[str, ...]]:
    """The words for each field of ``saved`` in an in-place error (made only when a check needs them)."""
    def labels() -> tuple[str, ...]:
        own = layer._saved_labels
        return tuple([own.get(n) or _LABELS.get(n, n) for n in type(saved)._fields])
    return labels


def _tensors_of(layer, saved) -> tuple:
    """The tensors a Saved holds, by field (None for a field that is not a tensor): what the versions cover."""
    if not hasattr(saved, "_fields"):
        raise TypeError(f"{type(layer).__name__}.forward must return (out, saved) with saved a NamedTuple (or "
                        f"None), got a {type(saved).__name__}")
    return tuple([v if isinstance(v, Tensor) else None for v in saved])


def _without_input_grad_only(layer, saved, tensors: tuple) -> tuple:
    """``tensors`` (``_tensors_of(saved)``) less the fields read only for dx (``_input_grad_only``), when dx is
    not asked for."""
    fields = type(saved)._fields
    return tuple([None if f in layer._input_grad_only else t for f, t in zip(fields, tensors)])


def _backward_math(layer, dout, need_input_grad, kwargs):
    """The checks, then the layer's math backward: (dx, grads, saved, recorded versions)."""
    meta, saved = layer._out_meta, layer._saved
    if not (layer._plain_dout_check and meta is not None and type(dout) is Tensor and dout.shape == meta[0]
            and dout.dtype == meta[1] and dout.device == meta[2]):
        layer.check_dout(dout, meta)  # (the cheap test above failed, or the layer checks its own way)
    layer._saved = layer._out_meta = None
    recorded, layer._versions = layer._versions, ()
    if saved is not None:
        # the common case, no kept tensor changed in place, in one pass; compiling, the check runs in full
        moved = torch.compiler.is_compiling() or (recorded and recorded[0] is _TRACED)
        if not moved:
            for t, then in zip(saved, recorded):
                if then != -1 and t._version != then:
                    moved = True
                    break
        if moved:
            tensors = _tensors_of(layer, saved)
            if not need_input_grad and layer._input_grad_only:
                tensors = _without_input_grad_only(layer, saved, tensors)
            check_versions(layer, _labels(layer, saved), tensors, recorded)
    layer.needs_input_grad = need_input_grad
    try:
        result = type(layer)._backward_math(layer, dout, saved, **kwargs)
    except Exception:
        layer._saved, layer._out_meta, layer._versions = saved, meta, recorded  # kept for a retry
        raise
    if layer._param_names:
        dx, grads = result
    else:
        dx, grads = result, None
    return (dx if need_input_grad else None), grads, saved, recorded


def _add_grads(layer, grads: dict) -> None:
    """Each parameter gradient the math returned, added into its ``.grad`` (the module docstring's forms): as
    ``add_product`` and ``accumulate_grad`` do, written out here, the hot loop of every backward."""
    names = layer._param_names
    for name, g in grads.items():
        if name not in names:
            raise KeyError(f"{layer!r}: backward returned a gradient for {name!r}, which is not one of its "
                           f"parameters {names}")
        p = getattr(layer, name)
        if g is None or p is None or not p.requires_grad:
            continue
        kind = type(g)
        if kind is Product:
            a, b = g
            grad = p.grad
            if grad is None or a.dim() != 2 or b.dim() != 2:
                g = a @ b
            else:
                shape = p.shape
                if len(shape) != 2 or a.shape[0] != shape[0] or b.shape[1] != shape[1]:
                    raise _wrong_shape(layer, name, (a.shape[0], b.shape[1]), p)
                grad.addmm_(a, b)  # no temporary
                continue
        elif kind is IndexAdd:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad.index_add_(0, g.index, g.source)
            continue
        elif not isinstance(g, Tensor):
            g = g()
        if g.shape != p.shape:
            raise _wrong_shape(layer, name, g.shape, p)
        grad = p.grad
        if grad is None:
            p.grad = g
        else:
            grad.add_(g)


def _wrong_shape(layer, name: str, shape: tuple, p: Tensor) -> ValueError:
    return ValueError(f"{layer!r}: backward's gradient for {name} has shape {tuple(shape)}, but {name} has "
                      f"shape {tuple(p.shape)}")


def is_template(cls: type) -> bool:
    """Whether ``cls`` writes its backward in the template: ``backward(self, dout, saved, ...)``."""
    backward = cls.__dict__.get("backward")
    if backward is None or getattr(backward, "_template", False):
        return False
    params = list(inspect.signature(backward).parameters)
    return len(params) >= 3 and params[2] == "saved"


def wrap_template(cls: type) -> None:
    """Replace the math ``forward``/``backward`` a template class writes by the public protocol's (the module
    docstring); the math stays on the class as ``_forward_math``/``_backward_math``."""
    cls._childless = cls.named_children is Template.named_children
    cls._plain_dout_check = cls.check_dout is Template.check_dout
    forward, backward = cls.__dict__.get("forward"), cls.__dict__.get("backward")
    if forward is not None and not getattr(forward, "_template", False):
        cls._forward_math = forward
        cls.forward = _public_forward(forward)
    if backward is not None and not getattr(backward, "_template", False):
        cls._backward_math = backward
        cls.backward = _public_backward(backward)


def _any_requires_grad(args: tuple) -> bool:
    """Whether a layer without parameters is given a tensor that requires a gradient (else it has no graph to
    build, and grad mode need not be switched off around it)."""
    for a in args:
        if isinstance(a, Tensor) and a.requires_grad:
            return True
    return False


def _public_forward(math: Callable):
    @functools.wraps(math)
    def forward(self, *args, **kwargs):
        self.check_input(*args, **kwargs)
        self._saved = self._out_meta = None  # a forward that raises leaves nothing stale behind
        if torch.is_grad_enabled() and not _recording and (self._param_names or not self._childless
                                                           or _any_requires_grad(args)):
            with torch.no_grad():
                out, saved = math(self, *args, **kwargs)
        else:  # (recording off already, or nothing here requires a gradient: no graph to build)
            out, saved = math(self, *args, **kwargs)
        if saved is None:
            self._versions = ()
        elif isinstance(saved, tuple) and not torch.compiler.is_compiling():
            try:  # the version of each kept tensor; -1: a field that is not a tensor
                self._versions = tuple([v._version if isinstance(v, Tensor) else -1 for v in saved])
            except RuntimeError:  # "Inference tensors do not track version counter"
                self._versions = versions(*_tensors_of(self, saved))
        else:
            self._versions = versions(*_tensors_of(self, saved))  # (_tensors_of says what a forward must return)
        self._saved = saved
        self._out_meta = (out.shape, out.dtype, out.device) if isinstance(out, Tensor) else True
        return out
    forward._template = forward._no_graph = True
    return forward


def _public_backward(math: Callable):
    @functools.wraps(math)
    def backward(self, dout, need_input_grad: bool = True, **kwargs):
        if torch.is_grad_enabled() and not _recording and (self._param_names or not self._childless
                                                           or _any_requires_grad((dout,))):
            with torch.no_grad():
                dx, grads, _, _ = _backward_math(self, dout, need_input_grad, kwargs)
                if grads:
                    _add_grads(self, grads)
                return dx
        dx, grads, _, _ = _backward_math(self, dout, need_input_grad, kwargs)
        if grads:
            _add_grads(self, grads)
        return dx
    backward._template = backward._no_graph = True
    backward.__signature__ = _public_signature(math)
    return backward


def _public_signature(math: Callable) -> inspect.Signature:
    """The public backward's signature, (self, dout, need_input_grad=True, *the math's extra arguments): what
    a container reads to ask a layer to skip dx (``functools.wraps`` would show the math's, with ``saved``)."""
    sig = inspect.signature(math)
    self_, dout, _saved, *extra = sig.parameters.values()
    need = inspect.Parameter("need_input_grad", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=True)
    return sig.replace(parameters=[self_, dout, need, *extra])

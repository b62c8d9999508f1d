"""The template every built-in layer is written in: the layer writes its math, the base does the rest, once.

As ``torch.autograd.Function`` names its math ``forward``/``backward`` beside the ``apply`` one calls, a layer here
writes two methods with names of their own -- the math -- and inherits the public ``forward``/``backward``, plain
methods of the base that run the machinery around the math.  CS231n's ``affine_forward``/``affine_backward``:

    class Linear(BaseLayer):
        _param_names = ("weight", "bias")
        expects = Expects(size=(-1, "in_features"), like=("weight",))   # the input the forward takes

        class Saved(NamedTuple):          # what backward reads, by name
            x: Tensor                     # (N, D), for dweight
            weight: Tensor                # (H, D), for dx

        def forward_math(self, x):
            return x @ self.weight.T + self.bias, self.Saved(x, self.weight)

        def backward_math(self, dout, saved):
            dx = dout @ saved.weight
            dweight = dout.T @ saved.x
            dbias = dout.sum(0)
            return dx, {"weight": dweight, "bias": dbias}

The public methods, the same for every layer (nothing is wrapped, nothing reads a signature):

forward(*inputs, **options)
    the input check (``check_input``: by default what the class declares in ``expects``, layers/checks.py), grad
    recording off (``no_graph``), ``forward_math``, the version of every tensor in its ``Saved`` (layers/saved.py),
    the output's shape, dtype and device; returns the output.
backward(dout, *more, need_input_grad=True, **options)
    "backward called before forward", dout against the output (``check_dout``), the versions (a tensor changed in
    place since the forward is refused, naming it), ``self.needs_input_grad`` set for the math, ``backward_math``,
    then each parameter gradient added into ``.grad``; returns dx (None when ``need_input_grad=False``).  A forward
    with several outputs takes one gradient per output (``more``: attention's weights, a recurrent layer's state).
backward_input(...) then backward_weight()
    the same backward split in two for pipeline schedules: B returns dx, W adds the parameter gradients later.

The math returns, the machinery accumulates: a parameter gradient is a tensor (fresh: it becomes ``.grad`` on first
use), ``Product(a, b)`` (``a @ b``, computed only for a parameter that requires a gradient and added in place with
``addmm_`` when ``.grad`` exists), ``IndexAdd(index, source)`` (rows scattered in place with ``index_add_``: an
embedding's), a callable returning the tensor (computed only when wanted), or None.  A layer with no parameters
returns dx alone.  A composite that runs a child's math itself (models/recompute.py) adds what it returns with
``add_grads``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch
from torch import Tensor

from kernels.gradients import IndexAdd, Product  # noqa: F401  (the forms a gradient may take)

from .checks import Expects, check_backward_dout, check_expected
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


_LABELS = {"x": "its input x", "out": "its output"}  # how the in-place check names a kept tensor
_ANY_FLOAT = Expects()  # the default input: a floating-point tensor of any shape


class Template:
    """The public ``forward``, ``backward``, ``backward_input`` and ``backward_weight`` of every layer written in
    the template (the module docstring), around the math a subclass writes, ``forward_math`` and
    ``backward_math``.  ``BaseLayer`` mixes it in.  A class declares its input in ``expects`` (or, for several
    inputs, writes ``check_input``), may write ``check_dout`` (a forward with several outputs), names its kept
    tensors in ``_saved_labels`` (field -> words for the in-place error; ``x`` and ``out`` are named already), and
    lists in ``_input_grad_only`` the fields read only for dx, checked only when dx is asked for (autograd keeps
    Linear's weight only then)."""

    expects: Expects = _ANY_FLOAT
    _saved_labels: dict[str, str] = {}
    _input_grad_only: tuple[str, ...] = ()
    _param_names: tuple[str, ...] = ()
    needs_input_grad: bool = True  # what the math backward reads: whether dx is wanted this time
    _saved = None  # the forward's Saved, until the backward consumes it
    _out_meta = None  # the forward's output (shape, dtype, device): what dout must match; None: no forward
    _pending_w = None  # backward_input's gradients, until backward_weight adds them
    _versions = ()  # the version of each field of _saved (-1: not a tensor): what the in-place check compares
    _plain_dout_check = True  # check_dout not written by the class: tested inline first
    _childless = True  # no child layers: a forward without parameters builds no graph unless it is given a tensor
    # that requires a gradient

    def __init_subclass__(cls, **kwargs) -> None:
        """Two facts about the class the hot path reads, found once: whether it writes ``check_dout`` and whether
        it has children."""
        super().__init_subclass__(**kwargs)
        cls._plain_dout_check = cls.check_dout is Template.check_dout
        cls._childless = cls.named_children is Template.named_children

    # -- the math a layer writes --------------------------------------------------------------------------------

    def forward_math(self, x, *args, **kwargs):
        """x -> (out, saved): the output and a NamedTuple of what ``backward_math`` reads (or None)."""
        raise NotImplementedError(f"{type(self).__name__} writes no forward_math")

    def backward_math(self, dout, saved, *more, **kwargs):
        """dout, saved -> dx (a layer without parameters) or (dx, {parameter name: gradient})."""
        raise NotImplementedError(f"{type(self).__name__} writes no backward_math")

    # -- the public protocol ------------------------------------------------------------------------------------

    def named_children(self):
        """The child layers (none here; a container or a block names its own)."""
        return iter(())

    def check_input(self, x, *args, **kwargs) -> None:
        """Refuse what the math forward cannot take, naming the layer: what the class declares in ``expects``
        (by default, a floating-point tensor)."""
        check_expected(self, x, self.expects)

    def check_dout(self, grads: tuple, meta, saved) -> None:
        """Refuse gradients unlike the forward's output (``grads``: the backward's dout and any more; ``meta``: the
        output's (shape, dtype, device), None: no forward; ``saved``: what the forward kept)."""
        if len(grads) > 1:
            raise TypeError(
                f"{self!r}: backward takes one gradient per output of the forward; it returned one "
                f"tensor, and backward got {len(grads)}"
            )
        check_backward_dout(self, grads[0], *(meta or (None, None, None)))

    @property
    def kept(self):
        """What the last forward kept for its backward (its ``Saved``), None after the backward consumed it."""
        return self._saved

    def discard_saved(self) -> None:
        """Drop the forward's cache, as a backward does (a caller that ran this layer's backward itself)."""
        self._saved = self._out_meta = None

    def forward(self, *inputs, **options):
        """The inputs (``x``, for most layers) -> the output: ``forward_math`` with the checks, no autograd graph,
        and what its backward reads kept and version-recorded."""
        self.check_input(*inputs, **options)
        self._saved = self._out_meta = None  # a forward that raises leaves nothing stale behind
        if (
            torch.is_grad_enabled()
            and not _recording
            and (self._param_names or not self._childless or _any_requires_grad(inputs))
        ):
            with torch.no_grad():
                out, saved = self.forward_math(*inputs, **options)
        else:  # (recording off already, or nothing here requires a gradient: no graph to build)
            out, saved = self.forward_math(*inputs, **options)
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

    def backward(self, dout, *more, need_input_grad: bool = True, **options):
        """dout (the output's shape; one gradient per output where the forward returns several) -> dx, and each
        parameter's gradient added into its ``.grad``.  ``need_input_grad=False`` skips dx and returns None."""
        if (
            torch.is_grad_enabled()
            and not _recording
            and (self._param_names or not self._childless or _any_requires_grad((dout,)))
        ):
            with torch.no_grad():
                dx, grads, _, _ = _backward_math(self, dout, more, need_input_grad, options)
                if grads:
                    add_grads(self, grads)
                return dx
        dx, grads, _, _ = _backward_math(self, dout, more, need_input_grad, options)
        if grads:
            add_grads(self, grads)
        return dx

    @no_graph
    def backward_input(self, dout, *more, need_input_grad: bool = True, **options):
        """B: the input gradient now, as ``backward`` returns it; the parameter gradients wait for
        ``backward_weight()`` (computed there where given as ``Product``s or callables).  One W per B."""
        if self._pending_w is not None:
            raise RuntimeError(f"{self!r}: backward_input() again before backward_weight() of the previous one")
        dx, grads, saved, recorded = _backward_math(self, dout, more, need_input_grad, options)
        self._pending_w = (grads, saved, recorded)
        return dx

    @no_graph
    def backward_weight(self) -> None:
        """W: adds the gradients of the last ``backward_input`` into ``.grad``.  What they read must not have
        changed in place since the forward."""
        grads = self._take_pending_w()
        if grads:
            add_grads(self, grads)

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
        raise TypeError(
            f"{type(layer).__name__}.forward_math must return (out, saved) with saved a NamedTuple (or "
            f"None), got a {type(saved).__name__}"
        )
    return tuple([v if isinstance(v, Tensor) else None for v in saved])


def _without_input_grad_only(layer, saved, tensors: tuple) -> tuple:
    """``tensors`` (``_tensors_of(saved)``) less the fields read only for dx (``_input_grad_only``), when dx is
    not asked for."""
    fields = type(saved)._fields
    return tuple([None if f in layer._input_grad_only else t for f, t in zip(fields, tensors, strict=True)])


def _backward_math(layer, dout, more, need_input_grad, kwargs):
    """The checks, then the layer's math backward: (dx, grads, saved, recorded versions)."""
    meta, saved = layer._out_meta, layer._saved
    if not (
        layer._plain_dout_check
        and not more
        and meta is not None
        and type(dout) is Tensor
        and dout.shape == meta[0]
        and dout.dtype == meta[1]
        and dout.device == meta[2]
    ):
        layer.check_dout((dout, *more), meta, saved)  # (the cheap test above failed, or the layer checks its own way)
    layer._saved = layer._out_meta = None
    recorded, layer._versions = layer._versions, ()
    if saved is not None:
        # the common case, no kept tensor changed in place, in one pass; compiling, the check runs in full
        moved = torch.compiler.is_compiling() or (recorded and recorded[0] is _TRACED)
        if not moved:
            for t, then in zip(saved, recorded, strict=True):
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
        result = layer.backward_math(dout, saved, *more, **kwargs)
    except Exception:
        layer._saved, layer._out_meta, layer._versions = saved, meta, recorded  # kept for a retry
        raise
    if layer._param_names:
        dx, grads = result
    else:
        dx, grads = result, None
    if not need_input_grad and not isinstance(dx, tuple):  # (a layer of several inputs -- x and a recurrent
        dx = None  # state -- gives its tuple with None for dx itself)
    return dx, grads, saved, recorded


def add_grads(layer, grads: dict) -> None:
    """Each parameter gradient a layer's math returned, added into its ``.grad`` (the module docstring's forms):
    as ``add_product`` and ``accumulate_grad`` do, written out here, the hot loop of every backward."""
    names = layer._param_names
    for name, g in grads.items():
        if name not in names:
            raise KeyError(
                f"{layer!r}: backward returned a gradient for {name!r}, which is not one of its parameters {names}"
            )
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
    return ValueError(
        f"{layer!r}: backward's gradient for {name} has shape {tuple(shape)}, but {name} has shape {tuple(p.shape)}"
    )


def _any_requires_grad(args: tuple) -> bool:
    """Whether a layer without parameters is given a tensor that requires a gradient (else it has no graph to
    build, and grad mode need not be switched off around it)."""
    return any(isinstance(a, Tensor) and a.requires_grad for a in args)

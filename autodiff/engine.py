"""A reverse-mode autograd engine on torch tensors, in the spirit of micrograd.

Each operation computes its result with plain torch ops (no torch.autograd) and,
when an input requires grad, records its parents and a closure ``_backward(g)``
that turns the gradient of its output into gradients of its inputs: the chain
rule, written by hand per operation.  ``backward()`` orders the graph with an
explicit stack (no recursion, so 100,000-op chains work) and replays the
closures in reverse.

Where gradients live: on ``tensor.data.grad`` (exposed as ``tensor.grad``), so
handgrad's optimizers -- torch.optim.Optimizer subclasses -- update engine
parameters directly.  Leaves accumulate gradients across backward calls, as in
PyTorch; a non-leaf's ``.grad`` holds its gradient from the latest backward.
Two leaves never share a gradient tensor; a view's (``W.T``, a reshape) may
share memory with its input's, as their data does: that spares the engine
Linear's ``x @ W.T`` a copy of every weight gradient.  Unlike micrograd, the
closures are released after backward (so is the memory they hold) unless
``retain_graph=True``.

In-place changes are caught, as torch.autograd catches them.  A closure reads the
torch tensors its op saw in the forward (captured then, not looked up again through
``a.data``), and ``_make`` records each saved tensor's ``_version``, the counter that
every in-place op (``mul_``, ``zero_``, ``copy_``, an optimizer's ``_foreach_add_``,
even under ``torch.no_grad``) increments.  ``backward()`` compares before running a
closure and raises, naming the op, the saved tensor and both versions, instead of
computing a gradient from changed values.  Which counter: an engine Tensor's
``.data`` *is* the torch tensor the ops save (the constructor stores ``detach()`` of
the tensor it is given, and ``detach()`` shares the version counter with its source),
so ``x.data.mul_(10)`` and an in-place change to the original torch tensor both bump
the recorded counter.  (torch's own ``t.data`` is different: it returns a new tensor
with a *fresh* counter, which is why torch.autograd does not see ``t.data.mul_``.)
As in autograd, an op saves only what its gradient needs: ``x * c`` with a constant
``c`` saves ``c`` (to scale x's gradient) but not ``x``, so changing ``x`` afterwards
is no error.
"""

from __future__ import annotations

import numbers
import threading
from collections.abc import Callable
from contextlib import ContextDecorator

import torch

from layers.checks import is_a

from .ops import TensorOps, _accum

_state = threading.local()


def is_grad_enabled() -> bool:
    return getattr(_state, "enabled", True)


class no_grad(ContextDecorator):
    """Inside, operations build no graph (like torch.no_grad); also usable as a decorator."""

    def __enter__(self):
        self._prev = is_grad_enabled()
        _state.enabled = False
        return self

    def __exit__(self, *exc):
        _state.enabled = self._prev
        return False


class Tensor(TensorOps):
    """A node of the graph: ``data`` (a torch.Tensor), ``grad``, ``requires_grad``, and how it was made."""

    __slots__ = (
        "data",
        "requires_grad",
        "_prev",
        "_backward",
        "_op",
        "_released",
        "_saved",
        "_owns_grad",
        "__weakref__",
    )

    def __init__(self, data, requires_grad: bool = False, *, _prev: tuple = (), _op: str = ""):
        if isinstance(data, Tensor):
            data = data.data
        if isinstance(data, torch.Tensor):
            data = data.detach()  # our own tensor object (sharing storage), so its .grad is ours
        else:
            try:
                data = torch.as_tensor(data, dtype=torch.get_default_dtype())
            except (TypeError, ValueError, RuntimeError) as e:
                raise TypeError(
                    f"autodiff.Tensor: cannot make a tensor of numbers from {type(data).__name__} "
                    f"{data!r:.60} ({e}); give a number, a (nested) list of numbers, or a torch.Tensor"
                ) from None
        if requires_grad and not (data.is_floating_point() or data.is_complex()):
            raise TypeError(f"only floating-point tensors can require gradients, got dtype {data.dtype}")
        self.data = data
        self.requires_grad = bool(requires_grad)
        self._prev = _prev
        self._backward: Callable[[torch.Tensor], None] | None = None
        self._op = _op
        self._released = False
        self._saved: tuple[tuple[str, torch.Tensor, int], ...] = ()
        self._owns_grad = False

    # -- plumbing -----------------------------------------------------------------------------------

    @property
    def grad(self) -> torch.Tensor | None:
        return self.data.grad

    @grad.setter
    def grad(self, value: torch.Tensor | None) -> None:
        self.data.grad = value

    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    device = property(lambda self: self.data.device)
    ndim = property(lambda self: self.data.dim())
    is_leaf = property(lambda self: not self._op)

    def dim(self) -> int:
        return self.data.dim()

    def numel(self) -> int:
        return self.data.numel()

    def item(self) -> float:
        return self.data.item()

    def numpy(self):
        return self.data.cpu().numpy()

    def tolist(self):
        return self.data.tolist()

    def detach(self) -> Tensor:
        return Tensor(self.data)

    def zero_grad(self) -> None:
        self.data.grad = None

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        body = repr(self.data)[len("tensor(") : -1] if self.data.dim() else repr(self.data.item())
        extra = f", op={self._op!r}" if self._op else (", requires_grad=True" if self.requires_grad else "")
        return f"Tensor({body}{extra})"

    def _lift(self, x, op: str) -> Tensor:
        """The other operand of ``op`` as a Tensor.  A Python number becomes a 0-d tensor of *our* dtype (on the
        CPU, which torch combines with any device), so 0.1 stays the float64 0.1 in float64 math.

        A torch.Tensor becomes a constant.  One that requires grad is refused: torch.autograd's graph and this
        engine's are separate, so it would silently get no gradient."""
        if isinstance(x, Tensor):
            return x
        if is_a(x, numbers.Number):
            dtype = self.dtype if self.data.is_floating_point() else torch.get_default_dtype()
            return Tensor._wrap(torch.tensor(x, dtype=dtype), False, (), "")
        if isinstance(x, torch.Tensor) and x.requires_grad:
            raise TypeError(
                f"{op}: the other operand is a torch.Tensor that requires grad (shape {tuple(x.shape)}, "
                f"{x.dtype}); the engine cannot give it a gradient (torch.autograd's graph is another "
                f"one). Wrap it as autodiff.Tensor(t, requires_grad=True) and read its gradient from "
                f"that Tensor's .grad, or pass t.detach() to use it as a constant"
            )
        if isinstance(x, (torch.Tensor, list, tuple)):
            return Tensor(x)
        raise TypeError(f"{op}: cannot combine an autodiff Tensor with {type(x).__name__}")

    @classmethod
    def _wrap(cls, data: torch.Tensor, requires_grad: bool, prev: tuple, op: str) -> Tensor:
        """Fast constructor for an op's result (a tensor no one else holds: no conversion, no detach)."""
        out = cls.__new__(cls)
        out.data, out.requires_grad, out._prev, out._op = data, requires_grad, prev, op
        out._backward, out._released, out._saved, out._owns_grad = None, False, (), False
        return out

    def _make(
        self,
        data: torch.Tensor,
        parents: tuple[TensorOps, ...],
        op: str,
        backward: Callable[[torch.Tensor], None],
        saved: tuple[tuple[str, torch.Tensor | None], ...] = (),
    ) -> Tensor:
        """Wrap an op's result; record the graph only if some parent needs a gradient.

        ``saved``: (name, tensor) for each tensor ``backward`` reads (None where not needed); their versions
        are recorded here and checked by ``Tensor.backward`` before ``backward`` runs.
        """
        if is_grad_enabled() and any(p.requires_grad for p in parents):
            for p in parents:
                if p.requires_grad and p.data.dtype != data.dtype:
                    raise _mixed_dtypes(op, parents, p, data.dtype)
            out = Tensor._wrap(data, True, parents, op)
            out._backward = backward
            out._saved = tuple((name, t, t._version) for name, t in saved if t is not None)
            return out
        return Tensor._wrap(data, False, (), "")

    def _check_saved(self) -> None:
        """Raise if a tensor this node's op saved for its gradient was changed in place since the forward."""
        for name, t, version in self._saved:
            if t._version != version:
                raise RuntimeError(
                    f"one of the tensors needed for gradient computation has been modified by an inplace "
                    f"operation: op '{self._op}' saved {name} (shape {tuple(t.shape)}, {t.dtype}) at version "
                    f"{version}, and it is now at version {t._version}. Something changed it in place between "
                    f"the forward and this backward (x.data.mul_(...), .zero_(), an optimizer step, ...): "
                    f"make that change after backward, or on a clone"
                )

    # -- backpropagation ---------------------------------------------------------------------------------

    def backward(self, gradient: torch.Tensor | None = None, retain_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's .grad that requires it.

        ``gradient`` is d(loss)/d(self); it may be omitted only for a single-element tensor.
        """
        if not self.requires_grad:
            raise RuntimeError(
                "backward: this tensor does not require grad and has no graph "
                "(no input had requires_grad=True, or it was made under no_grad)"
            )
        if gradient is None:
            if self.data.numel() != 1:
                raise RuntimeError(
                    f"grad can be implicitly created only for scalar outputs; this tensor has "
                    f"shape {tuple(self.shape)}: pass backward(gradient) of that shape"
                )
            gradient = torch.ones_like(self.data)
        else:
            gradient = gradient.data if isinstance(gradient, Tensor) else torch.as_tensor(gradient)
            if gradient.shape != self.shape:
                raise RuntimeError(
                    f"backward: gradient has shape {tuple(gradient.shape)}, expected {tuple(self.shape)}"
                )
            gradient = gradient.to(self.dtype)
        topo = _topological_order(self)
        for node in topo:
            if node._released:
                raise RuntimeError(
                    "trying to backward through the graph a second time: its saved tensors were "
                    "freed by the first backward; pass retain_graph=True to the first one"
                )
            if node._op:
                node.data.grad = None  # a non-leaf's .grad is this backward's, not accumulated
        _accum(self, gradient, fresh=False)
        for node in reversed(topo):
            if node._backward is not None and node.data.grad is not None:
                node._check_saved()
                node._backward(node.data.grad)
        if not retain_graph:
            for node in topo:
                if node._op:
                    node._backward, node._prev, node._released, node._saved = None, (), True, ()


def _mixed_dtypes(op: str, parents: tuple[TensorOps, ...], p: TensorOps, out_dtype: torch.dtype) -> TypeError:
    """The error for an op whose result's dtype differs from that of an operand that requires grad: its gradient
    would have the result's dtype, which torch refuses to store in that operand's .grad (in backward, far from
    here).  torch.autograd converts such gradients; this engine asks for one dtype instead."""
    dtypes = " and ".join(str(q.data.dtype) for q in parents)
    return TypeError(
        f"{op}: operands of dtypes {dtypes} give a {out_dtype} result, so the {p.data.dtype} operand "
        f"(shape {tuple(p.shape)}), which requires grad, would receive a {out_dtype} gradient; the "
        f"engine does not convert gradients between dtypes: give both operands the same dtype "
        f"(autodiff.Tensor(t.to({out_dtype}), ...), or build the model with dtype={out_dtype})"
    )


def _topological_order(root: Tensor, every_node: bool = False) -> list[Tensor]:
    """Every node that requires grad (every node at all with ``every_node``: draw_graph's view), parents before
    children, by depth-first search with an explicit stack."""
    order, seen = [], set()
    stack: list[tuple[Tensor, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        stack.extend((p, False) for p in node._prev if (every_node or p.requires_grad) and id(p) not in seen)
    return order

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

import math
import numbers
import threading
import weakref
from collections.abc import Callable, Sequence
from contextlib import ContextDecorator

import torch

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


def _unbroadcast(g: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum a gradient over the dimensions that broadcasting added or stretched, back to ``shape``."""
    if g.shape == shape:
        return g
    extra = g.dim() - len(shape)
    dims = tuple(range(extra)) + tuple(extra + i for i, n in enumerate(shape) if n == 1 and g.shape[extra + i] != 1)
    g = g.sum(dims, keepdim=True) if dims else g
    return g.reshape(shape)


class Tensor:
    """A node of the graph: ``data`` (a torch.Tensor), ``grad``, ``requires_grad``, and how it was made."""

    __slots__ = ("data", "requires_grad", "_prev", "_backward", "_op", "_released", "_saved", "_owns_grad",
                 "__weakref__")

    def __init__(self, data, requires_grad: bool = False, *, _prev: tuple = (), _op: str = ""):
        if isinstance(data, Tensor):
            data = data.data
        if isinstance(data, torch.Tensor):
            data = data.detach()  # our own tensor object (sharing storage), so its .grad is ours
        else:
            try:
                data = torch.as_tensor(data, dtype=torch.get_default_dtype())
            except (TypeError, ValueError, RuntimeError) as e:
                raise TypeError(f"autodiff.Tensor: cannot make a tensor of numbers from {type(data).__name__} "
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
        self._saved = ()
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

    def detach(self) -> "Tensor":
        return Tensor(self.data)

    def zero_grad(self) -> None:
        self.data.grad = None

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        body = repr(self.data)[len("tensor("):-1] if self.data.dim() else repr(self.data.item())
        extra = f", op={self._op!r}" if self._op else (", requires_grad=True" if self.requires_grad else "")
        return f"Tensor({body}{extra})"

    def _lift(self, x, op: str) -> "Tensor":
        """The other operand of ``op`` as a Tensor.  A Python number becomes a 0-d tensor of *our* dtype (on the
        CPU, which torch combines with any device), so 0.1 stays the float64 0.1 in float64 math.

        A torch.Tensor becomes a constant.  One that requires grad is refused: torch.autograd's graph and this
        engine's are separate, so it would silently get no gradient."""
        if isinstance(x, Tensor):
            return x
        if isinstance(x, numbers.Number) and not isinstance(x, bool):
            dtype = self.dtype if self.data.is_floating_point() else torch.get_default_dtype()
            return Tensor._wrap(torch.tensor(x, dtype=dtype), False, (), "")
        if isinstance(x, torch.Tensor) and x.requires_grad:
            raise TypeError(f"{op}: the other operand is a torch.Tensor that requires grad (shape {tuple(x.shape)}, "
                            f"{x.dtype}); the engine cannot give it a gradient (torch.autograd's graph is another "
                            f"one). Wrap it as autodiff.Tensor(t, requires_grad=True) and read its gradient from "
                            f"that Tensor's .grad, or pass t.detach() to use it as a constant")
        if isinstance(x, (torch.Tensor, list, tuple)):
            return Tensor(x)
        raise TypeError(f"{op}: cannot combine an autodiff Tensor with {type(x).__name__}")

    @classmethod
    def _wrap(cls, data: torch.Tensor, requires_grad: bool, prev: tuple, op: str) -> "Tensor":
        """Fast constructor for an op's result (a tensor no one else holds: no conversion, no detach)."""
        out = cls.__new__(cls)
        out.data, out.requires_grad, out._prev, out._op = data, requires_grad, prev, op
        out._backward, out._released, out._saved, out._owns_grad = None, False, (), False
        return out

    def _make(self, data: torch.Tensor, parents: tuple["Tensor", ...], op: str,
              backward: Callable[[torch.Tensor], None],
              saved: tuple[tuple[str, torch.Tensor | None], ...] = ()) -> "Tensor":
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
                    f"make that change after backward, or on a clone")

    # -- arithmetic (broadcasting) ---------------------------------------------------------------------

    def __add__(self, other) -> "Tensor":
        a, b = self, self._lift(other, "add")

        def backward(g):  # d(a+b)/da = d(a+b)/db = 1
            if a.requires_grad:
                _accum(a, _unbroadcast(g, a.shape), fresh=a.shape != g.shape)
            if b.requires_grad:
                _accum(b, _unbroadcast(g, b.shape), fresh=b.shape != g.shape)
        return self._make(a.data + b.data, (a, b), "add", backward)

    def __mul__(self, other) -> "Tensor":
        a, b = self, self._lift(other, "mul")
        ad, bd = a.data, b.data

        def backward(g):  # d(ab)/da = b, d(ab)/db = a
            if a.requires_grad:
                _accum(a, _unbroadcast(g * bd, a.shape))
            if b.requires_grad:
                _accum(b, _unbroadcast(g * ad, b.shape))
        return self._make(ad * bd, (a, b), "mul", backward,
                          (("its input a", ad if b.requires_grad else None),
                           ("its input b", bd if a.requires_grad else None)))

    def __neg__(self) -> "Tensor":
        a = self
        return self._make(-a.data, (a,), "neg", lambda g: _accum(a, -g))

    def __sub__(self, other) -> "Tensor":
        a, b = self, self._lift(other, "sub")

        def backward(g):  # d(a-b)/da = 1, d(a-b)/db = -1
            if a.requires_grad:
                _accum(a, _unbroadcast(g, a.shape), fresh=a.shape != g.shape)
            if b.requires_grad:
                _accum(b, _unbroadcast(-g, b.shape))
        return self._make(a.data - b.data, (a, b), "sub", backward)

    def __truediv__(self, other) -> "Tensor":
        a, b = self, self._lift(other, "div")

        ad, bd = a.data, b.data

        def backward(g):  # d(a/b)/da = 1/b, d(a/b)/db = -a/b^2
            if a.requires_grad:
                _accum(a, _unbroadcast(g / bd, a.shape))
            if b.requires_grad:
                _accum(b, _unbroadcast(-g * ad / (bd * bd), b.shape))
        return self._make(ad / bd, (a, b), "div", backward,
                          (("its input a", ad if b.requires_grad else None), ("its input b", bd)))

    def __pow__(self, exponent) -> "Tensor":
        a = self
        ad = a.data
        if isinstance(exponent, numbers.Number) and not isinstance(exponent, bool):
            p = exponent

            def backward(g):  # d(a^p)/da = p a^(p-1)
                _accum(a, g * p * ad ** (p - 1))
            return self._make(ad ** p, (a,), "pow", backward, (("its input a", ad),))
        b = self._lift(exponent, "pow")
        bd = b.data
        out_data = ad ** bd

        def backward_t(g):  # d(a^b)/da = b a^(b-1), d(a^b)/db = a^b log a
            if a.requires_grad:
                _accum(a, _unbroadcast(g * bd * ad ** (bd - 1), a.shape))
            if b.requires_grad:
                _accum(b, _unbroadcast(g * out_data * torch.log(ad), b.shape))
        return self._make(out_data, (a, b), "pow", backward_t,
                          (("its input a", ad), ("its input b", bd if a.requires_grad else None),
                           ("its output", out_data if b.requires_grad else None)))

    def __radd__(self, other) -> "Tensor":
        return self + other

    def __rmul__(self, other) -> "Tensor":
        return self * other

    def __rsub__(self, other) -> "Tensor":
        return self._lift(other, "sub") - self

    def __rtruediv__(self, other) -> "Tensor":
        return self._lift(other, "div") / self

    def __rpow__(self, other) -> "Tensor":
        return self._lift(other, "pow") ** self

    # -- matrix product ------------------------------------------------------------------------------

    def __matmul__(self, other) -> "Tensor":
        """As torch.matmul: 1-D operands are promoted (and the added dimension removed), batch dims broadcast."""
        a, b = self, self._lift(other, "matmul")
        if a.data.dim() == 0 or b.data.dim() == 0:
            raise ValueError(f"matmul: both operands need at least one dimension, got shapes "
                             f"{tuple(a.shape)} and {tuple(b.shape)}")
        ad, bd = a.data, b.data
        try:
            out = ad @ bd
        except RuntimeError as e:
            raise _matmul_error(ad, bd, e) from e

        def backward(g):
            A = ad.unsqueeze(0) if ad.dim() == 1 else ad  # (..., n, k)
            B = bd.unsqueeze(-1) if bd.dim() == 1 else bd  # (..., k, m)
            G = g
            if bd.dim() == 1:
                G = G.unsqueeze(-1)
            if ad.dim() == 1:
                G = G.unsqueeze(-2)  # (..., n, m)
            if a.requires_grad:  # dA = G @ B^T
                _accum(a, _unbroadcast(G @ B.mT, A.shape).reshape(a.shape))
            if b.requires_grad:  # dB = A^T @ G, laid out like B when B is a transposed (column-major) matrix
                if B.dim() == 2 and G.dim() == 2 and B.stride(0) == 1 and B.shape[0] > 1:
                    gb = (G.mT @ A).mT
                else:
                    gb = _unbroadcast(A.mT @ G, B.shape)
                _accum(b, gb.reshape(b.shape))
        return self._make(out, (a, b), "matmul", backward,
                          (("its input a", ad if b.requires_grad else None),
                           ("its input b", bd if a.requires_grad else None)))

    def __rmatmul__(self, other) -> "Tensor":
        return self._lift(other, "matmul") @ self

    # -- element-wise functions ----------------------------------------------------------------------

    def exp(self) -> "Tensor":
        a, out = self, torch.exp(self.data)
        return self._make(out, (a,), "exp", lambda g: _accum(a, g * out), (("its output", out),))  # d e^a = e^a

    def log(self) -> "Tensor":
        a, ad = self, self.data
        return self._make(torch.log(ad), (a,), "log", lambda g: _accum(a, g / ad),  # d log a = 1/a
                          (("its input a", ad),))

    def tanh(self) -> "Tensor":
        a, out = self, torch.tanh(self.data)
        return self._make(out, (a,), "tanh", lambda g: _accum(a, g * (1 - out * out)), (("its output", out),))

    def sigmoid(self) -> "Tensor":
        a, out = self, torch.sigmoid(self.data)
        return self._make(out, (a,), "sigmoid", lambda g: _accum(a, g * out * (1 - out)),
                          (("its output", out),))

    def relu(self) -> "Tensor":
        a, out = self, torch.relu(self.data)
        return self._make(out, (a,), "relu", lambda g: _accum(a, g * out.sign()),  # 1 where out > 0
                          (("its output", out),))

    # -- reductions ----------------------------------------------------------------------------------

    def sum(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> "Tensor":
        a = self
        out = a.data.sum() if dim is None else a.data.sum(dim, keepdim=keepdim)

        def backward(g):  # every summed element receives the output's gradient
            if dim is not None and not keepdim:
                for d in sorted(_dims(dim, a.data.dim())):
                    g = g.unsqueeze(d)
            fresh = g.shape != a.shape
            _accum(a, g.expand(a.shape).contiguous() if fresh else g, fresh=fresh)
        return self._make(out, (a,), "sum", backward)

    def mean(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> "Tensor":
        count = self.data.numel() if dim is None else math.prod(self.shape[d] for d in _dims(dim, self.data.dim()))
        return self.sum(dim, keepdim) * (1.0 / count)

    def max(self, dim: int | None = None, keepdim: bool = False) -> "Tensor":
        """Largest value (over ``dim``); the gradient goes to the arg-max (shared equally among ties when dim=None)."""
        a, ad = self, self.data
        if dim is None:
            out = ad.max()

            def backward_all(g):
                mask = (ad == out).to(ad.dtype)
                _accum(a, g * mask / mask.sum())
            return self._make(out, (a,), "max", backward_all, (("its input a", ad), ("its output", out)))
        values, idx = ad.max(dim, keepdim=True)

        def backward(g):  # reads only ad's shape and layout, not its values: not a saved tensor
            if not keepdim:
                g = g.unsqueeze(dim)
            _accum(a, torch.zeros_like(ad).scatter_(dim, idx, g))
        return self._make(values if keepdim else values.squeeze(dim), (a,), "max", backward)

    def log_softmax(self, dim: int = -1) -> "Tensor":
        """log p = x - logsumexp(x, dim);  dx = g - softmax(x) * sum(g, dim)."""
        a, out = self, torch.log_softmax(self.data, dim)

        def backward(g):
            _accum(a, g - torch.exp(out) * g.sum(dim, keepdim=True))
        return self._make(out, (a,), "log_softmax", backward, (("its output", out),))

    # -- shape -----------------------------------------------------------------------------------------

    def reshape(self, *shape) -> "Tensor":
        a = self
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape
        return self._view(a.data.reshape(shape), "reshape", lambda g: g.reshape(a.shape))

    view = reshape

    def transpose(self, dim0: int, dim1: int) -> "Tensor":
        a = self
        return self._view(a.data.transpose(dim0, dim1), "transpose", lambda g: g.transpose(dim0, dim1))

    @property
    def T(self) -> "Tensor":
        """Dimensions reversed (for a matrix: its transpose)."""
        a = self
        perm = tuple(reversed(range(a.data.dim())))
        return self._view(a.data.permute(perm), "T", lambda g: g.permute(perm))

    def _view(self, data: torch.Tensor, op: str, back: Callable[[torch.Tensor], torch.Tensor]) -> "Tensor":
        """A view op (reshape, transpose, T): ``back`` lays its gradient out as its input's.  The gradient is
        handed on without a copy when it is this node's own (``_owns_grad``: no other node holds it), so
        ``(x @ W.T)`` gives W its gradient without copying it: W.grad then shares memory with W.T's .grad, as
        W's data does with W.T's."""
        a = self

        def backward(g):
            _accum(a, back(g), fresh=node()._owns_grad)
        out = self._make(data, (a,), op, backward)
        node = weakref.ref(out)  # not out itself: the closure would hold its own node, a cycle only gc frees
        return out

    def __getitem__(self, index) -> "Tensor":
        a = self
        index = _unwrap_index(index)
        ad = a.data
        out = ad[index]

        def backward(g):  # reads only ad's shape and layout, not its values: not a saved tensor
            grad = torch.zeros_like(ad)
            if _is_basic(index):
                grad[index] += g  # a view: each element selected at most once
            else:
                # Advanced indexing may pick an element several times: find each output's source element
                # by indexing a tensor of element ids the same way, then add with index_add_ (sums repeats).
                ids = torch.arange(ad.numel(), device=ad.device).reshape(ad.shape)[index]
                grad.view(-1).index_add_(0, ids.reshape(-1), g.reshape(-1))
            _accum(a, grad)
        return self._make(out, (a,), "index", backward)

    # -- backpropagation ---------------------------------------------------------------------------------

    def backward(self, gradient: torch.Tensor | None = None, retain_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) into every leaf's .grad that requires it.

        ``gradient`` is d(loss)/d(self); it may be omitted only for a single-element tensor.
        """
        if not self.requires_grad:
            raise RuntimeError("backward: this tensor does not require grad and has no graph "
                               "(no input had requires_grad=True, or it was made under no_grad)")
        if gradient is None:
            if self.data.numel() != 1:
                raise RuntimeError(f"grad can be implicitly created only for scalar outputs; this tensor has "
                                   f"shape {tuple(self.shape)}: pass backward(gradient) of that shape")
            gradient = torch.ones_like(self.data)
        else:
            gradient = gradient.data if isinstance(gradient, Tensor) else torch.as_tensor(gradient)
            if gradient.shape != self.shape:
                raise RuntimeError(f"backward: gradient has shape {tuple(gradient.shape)}, expected "
                                   f"{tuple(self.shape)}")
            gradient = gradient.to(self.dtype)
        topo = _topological_order(self)
        for node in topo:
            if node._released:
                raise RuntimeError("trying to backward through the graph a second time: its saved tensors were "
                                   "freed by the first backward; pass retain_graph=True to the first one")
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


def _mixed_dtypes(op: str, parents: tuple[Tensor, ...], p: Tensor, out_dtype: torch.dtype) -> TypeError:
    """The error for an op whose result's dtype differs from that of an operand that requires grad: its gradient
    would have the result's dtype, which torch refuses to store in that operand's .grad (in backward, far from
    here).  torch.autograd converts such gradients; this engine asks for one dtype instead."""
    dtypes = " and ".join(str(q.data.dtype) for q in parents)
    return TypeError(f"{op}: operands of dtypes {dtypes} give a {out_dtype} result, so the {p.data.dtype} operand "
                     f"(shape {tuple(p.shape)}), which requires grad, would receive a {out_dtype} gradient; the "
                     f"engine does not convert gradients between dtypes: give both operands the same dtype "
                     f"(autodiff.Tensor(t.to({out_dtype}), ...), or build the model with dtype={out_dtype})")


def _matmul_error(ad: torch.Tensor, bd: torch.Tensor, e: RuntimeError) -> Exception:
    """torch's "mat1 and mat2 shapes cannot be multiplied (2x3 and 5x3)" (or its dtype complaint) as one line
    naming both shapes (or dtypes); any other failure as torch said it."""
    if ad.dtype != bd.dtype:
        return TypeError(f"matmul: operands of dtypes {ad.dtype} and {bd.dtype} (shapes {tuple(ad.shape)} and "
                         f"{tuple(bd.shape)}); a matrix product takes one dtype: give both operands the same dtype")
    inner_b = bd.shape[0] if bd.dim() == 1 else bd.shape[-2]
    if ad.shape[-1] != inner_b:
        why = (f"the last dimension of the first ({ad.shape[-1]}) must equal the "
               f"{'only' if bd.dim() == 1 else 'second-to-last'} dimension of the second ({inner_b})")
    else:
        try:
            torch.broadcast_shapes(ad.shape[:-2], bd.shape[:-2])
            return e
        except RuntimeError:
            why = f"their batch dimensions {tuple(ad.shape[:-2])} and {tuple(bd.shape[:-2])} do not broadcast"
    return ValueError(f"matmul: shapes {tuple(ad.shape)} and {tuple(bd.shape)} cannot be multiplied: {why}")


def _accum(node: Tensor, g: torch.Tensor, fresh: bool = True) -> None:
    """node.grad += g.  ``fresh=False`` says g may be held by another node too: a leaf then gets a copy (two leaves
    never share a gradient tensor, which an in-place change such as clipping would write through), and a non-leaf
    keeps g but records that it is not its own (``_owns_grad``), so that a view op hands it on copied."""
    if not node.requires_grad:
        return
    if node.data.grad is None:
        if node._op:
            node.data.grad, node._owns_grad = g, fresh
        else:
            node.data.grad = g if fresh else g.clone()
    else:
        node.data.grad = node.data.grad + g  # out of place: never writes into a tensor another node holds
        node._owns_grad = True


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


def _dims(dim: int | Sequence[int], ndim: int) -> tuple[int, ...]:
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(d % ndim if ndim else 0 for d in dims)


def _unwrap_index(index):
    if isinstance(index, Tensor):
        return index.data
    if isinstance(index, tuple):
        return tuple(i.data if isinstance(i, Tensor) else i for i in index)
    return index


def _is_basic(index) -> bool:
    """Ints, slices, None and Ellipsis only: the result is a view and no element repeats."""
    items = index if isinstance(index, tuple) else (index,)
    return all((isinstance(i, (int, slice)) and not isinstance(i, bool)) or i is None or i is Ellipsis
               for i in items)

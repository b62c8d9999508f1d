"""The engine's operations: each computes its result with plain torch ops and records a closure that turns the
gradient of its output into gradients of its inputs -- the chain rule, written by hand per operation.

``TensorOps`` is the half of ``autodiff.Tensor`` that holds them (arithmetic with broadcasting, matrix products,
elementwise functions, reductions, views and indexing); ``engine.py`` holds the other half, the graph: making a
node, checking what it saved, and ``backward()``.  A closure adds into its inputs' gradients with ``_accum``;
broadcast gradients are summed back to each operand's shape with ``_unbroadcast``.
"""

from __future__ import annotations

import math
import numbers
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from layers.checks import is_a

if TYPE_CHECKING:
    from typing_extensions import Self  # typing's own from Python 3.11


class TensorOps:
    """The operations of ``autodiff.Tensor`` (see ``engine.py`` for the node each of them makes)."""

    __slots__ = ()  # the node's fields are Tensor's (engine.py)

    if TYPE_CHECKING:  # what the operations read of the node, defined in engine.py
        data: torch.Tensor
        requires_grad: bool
        _op: str
        _owns_grad: bool

        @property
        def shape(self) -> torch.Size: ...

        def _lift(self, x: object, op: str) -> Self: ...

        def _make(
            self,
            data: torch.Tensor,
            parents: tuple[TensorOps, ...],
            op: str,
            backward: Callable[[torch.Tensor], None],
            saved: tuple[tuple[str, torch.Tensor | None], ...] = (),
        ) -> Self: ...

    # -- arithmetic (broadcasting) ---------------------------------------------------------------------

    def __add__(self, other) -> Self:
        a, b = self, self._lift(other, "add")

        def backward(g):  # d(a+b)/da = d(a+b)/db = 1
            if a.requires_grad:
                _accum(a, _unbroadcast(g, a.shape), fresh=a.shape != g.shape)
            if b.requires_grad:
                _accum(b, _unbroadcast(g, b.shape), fresh=b.shape != g.shape)

        return self._make(a.data + b.data, (a, b), "add", backward)

    def __mul__(self, other) -> Self:
        a, b = self, self._lift(other, "mul")
        ad, bd = a.data, b.data

        def backward(g):  # d(ab)/da = b, d(ab)/db = a
            if a.requires_grad:
                _accum(a, _unbroadcast(g * bd, a.shape))
            if b.requires_grad:
                _accum(b, _unbroadcast(g * ad, b.shape))

        return self._make(
            ad * bd,
            (a, b),
            "mul",
            backward,
            (("its input a", ad if b.requires_grad else None), ("its input b", bd if a.requires_grad else None)),
        )

    def __neg__(self) -> Self:
        a = self
        return self._make(-a.data, (a,), "neg", lambda g: _accum(a, -g))

    def __sub__(self, other) -> Self:
        a, b = self, self._lift(other, "sub")

        def backward(g):  # d(a-b)/da = 1, d(a-b)/db = -1
            if a.requires_grad:
                _accum(a, _unbroadcast(g, a.shape), fresh=a.shape != g.shape)
            if b.requires_grad:
                _accum(b, _unbroadcast(-g, b.shape))

        return self._make(a.data - b.data, (a, b), "sub", backward)

    def __truediv__(self, other) -> Self:
        a, b = self, self._lift(other, "div")

        ad, bd = a.data, b.data

        def backward(g):  # d(a/b)/da = 1/b, d(a/b)/db = -a/b^2
            if a.requires_grad:
                _accum(a, _unbroadcast(g / bd, a.shape))
            if b.requires_grad:
                _accum(b, _unbroadcast(-g * ad / (bd * bd), b.shape))

        return self._make(
            ad / bd, (a, b), "div", backward, (("its input a", ad if b.requires_grad else None), ("its input b", bd))
        )

    def __pow__(self, exponent) -> Self:
        a = self
        ad = a.data
        if is_a(exponent, numbers.Number):
            p: Any = exponent  # int, float or complex, as torch's pow takes them

            def backward(g):  # d(a^p)/da = p a^(p-1)
                _accum(a, g * p * ad ** (p - 1))

            return self._make(ad**p, (a,), "pow", backward, (("its input a", ad),))
        b = self._lift(exponent, "pow")
        bd = b.data
        out_data = ad**bd

        def backward_t(g):  # d(a^b)/da = b a^(b-1), d(a^b)/db = a^b log a
            if a.requires_grad:
                _accum(a, _unbroadcast(g * bd * ad ** (bd - 1), a.shape))
            if b.requires_grad:
                _accum(b, _unbroadcast(g * out_data * torch.log(ad), b.shape))

        return self._make(
            out_data,
            (a, b),
            "pow",
            backward_t,
            (
                ("its input a", ad),
                ("its input b", bd if a.requires_grad else None),
                ("its output", out_data if b.requires_grad else None),
            ),
        )

    def __radd__(self, other) -> Self:
        return self + other

    def __rmul__(self, other) -> Self:
        return self * other

    def __rsub__(self, other) -> Self:
        return self._lift(other, "sub") - self

    def __rtruediv__(self, other) -> Self:
        return self._lift(other, "div") / self

    def __rpow__(self, other) -> Self:
        return self._lift(other, "pow") ** self

    # -- matrix product ------------------------------------------------------------------------------

    def __matmul__(self, other) -> Self:
        """As torch.matmul: 1-D operands are promoted (and the added dimension removed), batch dims broadcast."""
        a, b = self, self._lift(other, "matmul")
        if a.data.dim() == 0 or b.data.dim() == 0:
            raise ValueError(
                f"matmul: both operands need at least one dimension, got shapes {tuple(a.shape)} and {tuple(b.shape)}"
            )
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

        return self._make(
            out,
            (a, b),
            "matmul",
            backward,
            (("its input a", ad if b.requires_grad else None), ("its input b", bd if a.requires_grad else None)),
        )

    def __rmatmul__(self, other) -> Self:
        return self._lift(other, "matmul") @ self

    # -- element-wise functions ----------------------------------------------------------------------

    def exp(self) -> Self:
        a, out = self, torch.exp(self.data)
        return self._make(out, (a,), "exp", lambda g: _accum(a, g * out), (("its output", out),))  # d e^a = e^a

    def log(self) -> Self:
        a, ad = self, self.data
        return self._make(
            torch.log(ad),
            (a,),
            "log",
            lambda g: _accum(a, g / ad),  # d log a = 1/a
            (("its input a", ad),),
        )

    def tanh(self) -> Self:
        a, out = self, torch.tanh(self.data)
        return self._make(out, (a,), "tanh", lambda g: _accum(a, g * (1 - out * out)), (("its output", out),))

    def sigmoid(self) -> Self:
        a, out = self, torch.sigmoid(self.data)
        return self._make(out, (a,), "sigmoid", lambda g: _accum(a, g * out * (1 - out)), (("its output", out),))

    def relu(self) -> Self:
        a, out = self, torch.relu(self.data)
        return self._make(
            out,
            (a,),
            "relu",
            lambda g: _accum(a, g * out.sign()),  # 1 where out > 0
            (("its output", out),),
        )

    # -- reductions ----------------------------------------------------------------------------------

    def sum(self, dim: int | tuple[int, ...] | list[int] | None = None, keepdim: bool = False) -> Self:
        a = self
        out = a.data.sum() if dim is None else a.data.sum(dim, keepdim=keepdim)

        def backward(g):  # every summed element receives the output's gradient
            if dim is not None and not keepdim:
                for d in sorted(_dims(dim, a.data.dim())):
                    g = g.unsqueeze(d)
            fresh = g.shape != a.shape
            _accum(a, g.expand(a.shape).contiguous() if fresh else g, fresh=fresh)

        return self._make(out, (a,), "sum", backward)

    def mean(self, dim: int | tuple[int, ...] | list[int] | None = None, keepdim: bool = False) -> Self:
        count = self.data.numel() if dim is None else math.prod(self.shape[d] for d in _dims(dim, self.data.dim()))
        return self.sum(dim, keepdim) * (1.0 / count)

    def max(self, dim: int | None = None, keepdim: bool = False) -> Self:
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

    def log_softmax(self, dim: int = -1) -> Self:
        """log p = x - logsumexp(x, dim);  dx = g - softmax(x) * sum(g, dim)."""
        a, out = self, torch.log_softmax(self.data, dim)

        def backward(g):
            _accum(a, g - torch.exp(out) * g.sum(dim, keepdim=True))

        return self._make(out, (a,), "log_softmax", backward, (("its output", out),))

    # -- shape -----------------------------------------------------------------------------------------

    def reshape(self, *shape) -> Self:
        a = self
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)) else shape
        return self._view(a.data.reshape(shape), "reshape", lambda g: g.reshape(a.shape))

    view = reshape

    def transpose(self, dim0: int, dim1: int) -> Self:
        a = self
        return self._view(a.data.transpose(dim0, dim1), "transpose", lambda g: g.transpose(dim0, dim1))

    @property
    def T(self) -> Self:
        """Dimensions reversed (for a matrix: its transpose)."""
        a = self
        perm = tuple(reversed(range(a.data.dim())))
        return self._view(a.data.permute(perm), "T", lambda g: g.permute(perm))

    def _view(self, data: torch.Tensor, op: str, back: Callable[[torch.Tensor], torch.Tensor]) -> Self:
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

    def __getitem__(self, index) -> Self:
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


def _unbroadcast(g: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum a gradient over the dimensions that broadcasting added or stretched, back to ``shape``."""
    if g.shape == shape:
        return g
    extra = g.dim() - len(shape)
    dims = tuple(range(extra)) + tuple(extra + i for i, n in enumerate(shape) if n == 1 and g.shape[extra + i] != 1)
    g = g.sum(dims, keepdim=True) if dims else g
    return g.reshape(shape)


def _matmul_error(ad: torch.Tensor, bd: torch.Tensor, e: RuntimeError) -> Exception:
    """torch's "mat1 and mat2 shapes cannot be multiplied (2x3 and 5x3)" (or its dtype complaint) as one line
    naming both shapes (or dtypes); any other failure as torch said it."""
    if ad.dtype != bd.dtype:
        return TypeError(
            f"matmul: operands of dtypes {ad.dtype} and {bd.dtype} (shapes {tuple(ad.shape)} and "
            f"{tuple(bd.shape)}); a matrix product takes one dtype: give both operands the same dtype"
        )
    inner_b = bd.shape[0] if bd.dim() == 1 else bd.shape[-2]
    if ad.shape[-1] != inner_b:
        why = (
            f"the last dimension of the first ({ad.shape[-1]}) must equal the "
            f"{'only' if bd.dim() == 1 else 'second-to-last'} dimension of the second ({inner_b})"
        )
    else:
        try:
            torch.broadcast_shapes(ad.shape[:-2], bd.shape[:-2])
            return e
        except RuntimeError:
            why = f"their batch dimensions {tuple(ad.shape[:-2])} and {tuple(bd.shape[:-2])} do not broadcast"
    return ValueError(f"matmul: shapes {tuple(ad.shape)} and {tuple(bd.shape)} cannot be multiplied: {why}")


def _accum(node: TensorOps, g: torch.Tensor, fresh: bool = True) -> None:
    """node.grad += g.  ``fresh=False`` says g may be held by another node too: a leaf then gets a copy (two leaves
    never share a gradient tensor, which an in-place change such as clipping would write through), and a non-leaf
    keeps g but records that it is not its own (``_owns_grad``), so that a view op hands it on copied."""
    if not node.requires_grad:
        return
    if node.data.grad is None:
        if node._op:
            node.data.grad, node._owns_grad = g, fresh  # type: ignore[misc]  # a slot of engine.Tensor, the only node
        else:
            node.data.grad = g if fresh else g.clone()
    else:
        node.data.grad = node.data.grad + g  # out of place: never writes into a tensor another node holds
        node._owns_grad = True  # type: ignore[misc]  # a slot of engine.Tensor, the only node


def _dims(dim: int | Sequence[int], ndim: int) -> tuple[int, ...]:
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(d % ndim if ndim else 0 for d in dims)


def _unwrap_index(index):
    if isinstance(index, TensorOps):
        return index.data
    if isinstance(index, tuple):
        return tuple(i.data if isinstance(i, TensorOps) else i for i in index)
    return index


def _is_basic(index) -> bool:
    """Ints, slices, None and Ellipsis only: the result is a view and no element repeats."""
    items = index if isinstance(index, tuple) else (index,)
    return all(is_a(i, (int, slice)) or i is None or i is Ellipsis for i in items)

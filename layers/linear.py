"""Linear layer: out = x @ W^T + b, W (out_features, in_features) as nn.Linear's, with a hand-written backward."""
from __future__ import annotations

import torch
from torch import Tensor

from .checks import check_dout, check_int, check_like, check_tensor
from .init import torch_default_params
from .layer import BaseLayer, accumulate_grad, learned, wants_grad
from .saved import check_versions, versions


_NOT_KEPT = object()  # Linear._x after a forward with keep_input=False


class Linear(BaseLayer):
    """Affine map ``out = x @ weight^T + bias``.

    ``weight`` has shape (H, D) = (out_features, in_features), row-major, exactly as nn.Linear's: one row of
    weights per output.  The forward is a single ``addmm`` of x with the transposed view ``weight.t()`` (D, H),
    the very BLAS call autograd makes for nn.Linear, with the same rounding (the forward output is bit-for-bit
    nn.Linear's, in float32 too).  Readers coming from CS231n, whose W is (D, H) and whose forward reads
    ``x @ W + b``: this W is that one transposed, so ``dW = dout^T @ x`` here is CS231n's ``x^T @ dout``
    transposed.
    Initialised exactly as nn.Linear (``layers.init``), so under the same
    ``torch.manual_seed`` a Linear and an nn.Linear get identical weights; ``named_parameters()``,
    ``.grad``, ``state_dict()`` and ``to_torch()`` all see nn.Linear's (H, D) tensor.

    Like nn.Linear it maps the last axis and keeps any leading ones: (N, D) -> (N, H), (B, T, D) -> (B, T, H),
    an unbatched (D,) -> (H,).  The leading axes are flattened into the N of one (N, D) product, so a
    sequence of tokens costs one GEMM, and the weight gradient sums over every leading position.

    Kept from forward to backward: x (for dW) and the weight (for dx).  Changing either in place in between --
    ``x.mul_(10)``, an optimizer step -- is refused in backward, as torch.autograd refuses it (layers/saved.py;
    the weight only when dx is asked for, as autograd keeps it only then).
    An input given back as ``backward(dout, input=x)`` is the caller's to keep unchanged: it was not kept here.
    """

    _param_names = ("weight", "bias")
    _kept_names = ("its input x", "weight")
    torch_class = torch.nn.Linear
    _ctor_args = ("in_features", "out_features", "bias")

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        self.in_features = check_int("Linear", "in_features", in_features)
        self.out_features = check_int("Linear", "out_features", out_features)
        self.weight, self.bias = learned(*torch_default_params((out_features, in_features), bias, device=device,
                                                               dtype=dtype))
        self._x: Tensor | None = None  # cached input as (N, D), needed for dW
        self._lead: torch.Size = torch.Size()  # the input's leading axes (*), restored on out and dx

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def forward(self, x: Tensor, keep_input: bool = True) -> Tensor:
        """x: (*, D) -> out: (*, H); (N, D) -> (N, H) is the common case.

        ``keep_input=False``: do not hold x until backward (a caller that can give it back then, recomputed
        or kept elsewhere, passes it as ``backward(dout, input=x)``)."""
        w = self.weight
        if not (isinstance(x, Tensor) and x.dim() >= 1 and x.shape[-1] == self.in_features
                and x.dtype == w.dtype and x.device == w.device):
            self._reject_input(x)  # the cheap test above failed: find out what is wrong and say so
        lead = x.shape[:-1]
        if x.dim() != 2:
            x = x.reshape(-1, self.in_features)  # (N, D), N = prod(*): a view when x is contiguous
        self._x = x if keep_input else _NOT_KEPT
        wt = w.t()  # (D, H), a view: no copy
        out = x @ wt if self.bias is None else torch.addmm(self.bias, x, wt)  # (N, H), bias add fused into the GEMM
        self._lead = lead
        self._versions = versions(x if keep_input else None, w)
        return out if len(lead) == 1 else out.view(*lead, self.out_features)  # (*, H)

    def backward(self, dout: Tensor, need_input_grad: bool = True, input: Tensor | None = None) -> Tensor | None:
        """dout: (*, H) -> dx: (*, D); adds dW (H, D) and db (H,) into .grad (summed over every leading position).

        ``need_input_grad=False`` skips the dx product (the first layer of a net
        does not need it) and returns None.  ``input``: the forward's x, given back when the forward was
        told not to keep it (``keep_input=False``); it must hold the very values the forward saw.
        """
        x, w, lead = self._x, self.weight, self._lead
        kept = x
        if x is _NOT_KEPT or input is not None:
            x = self._given_input(x, input)
            kept = None  # the caller's to keep unchanged
        if not (x is not None and isinstance(dout, Tensor) and dout.shape[:-1] == lead and dout.dim() >= 1
                and dout.shape[-1] == self.out_features and dout.dtype == w.dtype and dout.device == w.device):
            check_dout(repr(self), dout, None if x is None else torch.Size((*lead, self.out_features)), w)
        # x is read for dW, the weight only for dx (autograd likewise keeps it only when x needs a gradient)
        check_versions(self, self._kept_names, (kept, w if need_input_grad else None), self._versions)
        self._x = None
        if dout.dim() != 2:
            dout = dout.reshape(-1, self.out_features)  # (N, H)
        # dW = dout^T @ x, (H, D): out = x W^T, so each output row's gradient is dout's column times x; a frozen
        # parameter's product is skipped (wants_grad)
        if not wants_grad(w):
            pass
        elif w.grad is None:
            w.grad = dout.t() @ x
        else:
            w.grad.addmm_(dout.t(), x)  # accumulated in place: no temporary
        if self.bias is not None and wants_grad(self.bias):
            accumulate_grad(self.bias, dout.sum(0))  # (H,)
        if not need_input_grad:
            return None
        dx = dout @ w  # (N, D)
        return dx if len(lead) == 1 else dx.view(*lead, self.in_features)  # (*, D)

    # -- the backward split in two: B (the input gradient, now) and W (the weight gradient, later) ----------------
    # A pipeline's next stage waits for dx, not for dW (zero-bubble schedules, Qi et al. 2023): B returns dx and
    # keeps what W reads, (dout, x); W adds dW and db into .grad.  B then W runs backward's own products on the
    # same operands, so it equals backward bit for bit.  Linear's dW and dx share no work (two GEMMs, each on
    # dout): the split is complete.  A layer holds one pending W: B, B without W in between, is refused.

    @torch.no_grad()
    def backward_input(self, dout: Tensor, need_input_grad: bool = True, input: Tensor | None = None) -> Tensor | None:
        """B: dout (*, H) -> dx = dout @ W, (*, D), as ``backward`` returns it; nothing is written into .grad.
        Keeps dout and x for ``backward_weight()``.  ``need_input_grad`` and ``input`` as in ``backward``."""
        if getattr(self, "_pending_w", None) is not None:
            raise RuntimeError(f"{self!r}: backward_input() again before backward_weight() of the previous one")
        x, w, lead = self._x, self.weight, self._lead
        kept = x
        if x is _NOT_KEPT or input is not None:
            x = self._given_input(x, input)
            kept = None
        if not (x is not None and isinstance(dout, Tensor) and dout.shape[:-1] == lead and dout.dim() >= 1
                and dout.shape[-1] == self.out_features and dout.dtype == w.dtype and dout.device == w.device):
            check_dout(repr(self), dout, None if x is None else torch.Size((*lead, self.out_features)), w)
        check_versions(self, self._kept_names, (kept, w if need_input_grad else None), self._versions)
        self._x = None
        if dout.dim() != 2:
            dout = dout.reshape(-1, self.out_features)  # (N, H)
        self._pending_w = (dout, x, kept, self._versions[0])
        if not need_input_grad:
            return None
        dx = dout @ w  # (N, D)
        return dx if len(lead) == 1 else dx.view(*lead, self.in_features)  # (*, D)

    @torch.no_grad()
    def backward_weight(self) -> None:
        """W: adds dW = dout^T @ x (H, D) and db = sum of dout (H,) into .grad, from the last ``backward_input``."""
        pending, self._pending_w = getattr(self, "_pending_w", None), None
        if pending is None:
            raise RuntimeError(f"{self!r}: backward_weight() needs a backward_input() before it (one W per B)")
        dout, x, kept, version = pending
        check_versions(self, self._kept_names[:1], (kept,), (version,))  # x must not change between B and W
        w = self.weight
        if wants_grad(w):
            if w.grad is None:
                w.grad = dout.t() @ x  # (H, D)
            else:
                w.grad.addmm_(dout.t(), x)
        if self.bias is not None and wants_grad(self.bias):
            accumulate_grad(self.bias, dout.sum(0))  # (H,)

    def _given_input(self, kept: object, input: Tensor | None) -> Tensor:
        """The (N, D) input for dW when the caller gives it back (checked against the forward's shape)."""
        if kept is None:
            check_dout(repr(self), None, None, self.weight)  # no forward since the last backward: says so
        if input is None:
            raise ValueError(f"{self!r}: the forward did not keep its input (keep_input=False); pass it back as "
                             f"backward(dout, input=x)")
        if kept is not _NOT_KEPT:
            raise ValueError(f"{self!r}: backward got input=, but the forward kept its own input (keep_input=True)")
        shape = torch.Size((*self._lead, self.in_features))
        if not (isinstance(input, Tensor) and input.shape == shape and input.dtype == self.weight.dtype
                and input.device == self.weight.device):
            raise ValueError(f"{self!r}: input= must be the forward's input, of shape {tuple(shape)}, dtype "
                             f"{self.weight.dtype} on {self.weight.device}; got "
                             f"{tuple(input.shape) if isinstance(input, Tensor) else type(input).__name__}")
        return input.reshape(-1, self.in_features)  # (N, D)

    def _reject_input(self, x: object) -> None:
        check_tensor(repr(self), "x", x)
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"{self!r}: expected input of shape (*, {self.in_features}), got {tuple(x.shape)}")
        check_like(repr(self), "input", x, self.weight, "weight")

"""The shape-only ("fake") implementation of every ``handgrad::`` operator, for torch.compile's tracing and
torch.library.opcheck: the outputs' shapes, dtypes and devices, nothing computed.  Imported once the library that
defines the operators is loaded (kernels/cpp/__init__.py)."""

from __future__ import annotations

import torch
from torch import Tensor

_fake = torch.library.register_fake


@_fake("handgrad::layer_norm_forward")
def _(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float):
    n = x.shape[0]
    return torch.empty_like(x), x.new_empty(n), x.new_empty(n)


@_fake("handgrad::layer_norm_backward")
def _(dout: Tensor, x: Tensor, mean: Tensor, rstd: Tensor, weight: Tensor | None):
    k = x.shape[1]
    return torch.empty_like(x), x.new_empty(k), x.new_empty(k)


@_fake("handgrad::batch_norm_forward")
def _(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float):
    c = x.shape[1]
    return torch.empty_like(x), x.new_empty(c), x.new_empty(c), x.new_empty(c)


@_fake("handgrad::batch_norm_backward")
def _(dout: Tensor, x: Tensor, mean: Tensor, rstd: Tensor, weight: Tensor | None, need_dx: bool):
    c = x.shape[1]
    return torch.empty_like(x) if need_dx else x.new_empty(0), x.new_empty(c), x.new_empty(c)


@_fake("handgrad::gelu_backward")
def _(x: Tensor, out: Tensor, dout: Tensor):
    return torch.empty_like(x)


@_fake("handgrad::gelu_tanh_backward")
def _(x: Tensor, dout: Tensor):
    return torch.empty_like(x)


@_fake("handgrad::cross_entropy_forward")
def _(logits: Tensor, target: Tensor, label_smoothing: float):
    return torch.empty_like(logits), logits.new_empty(())


@_fake("handgrad::cross_entropy_backward")
def _(logp: Tensor, target: Tensor, scale: float, label_smoothing: float):
    return torch.empty_like(logp)


@_fake("handgrad::sgd_step")
def _(params, grads, bufs, lr, momentum, dampening, weight_decay, nesterov) -> None:
    return None


@_fake("handgrad::adam_step")
def _(params, grads, exp_avgs, exp_avg_sqs, neg_step_sizes, eps_hats, beta1, beta2, weight_decay, decay) -> None:
    return None


@_fake("handgrad::lstm_gates_forward")
def _(a, c_prev, act, c, tanh_c, r) -> None:
    return None


@_fake("handgrad::lstm_gates_backward")
def _(dr, act, c_prev, tanh_c, dc, da) -> None:
    return None


@_fake("handgrad::gru_gates_forward")
def _(act, m, h_prev, m_n, h) -> None:
    return None


@_fake("handgrad::gru_gates_backward")
def _(d, act, m_n, h_prev, carry, dm, da_n) -> None:
    return None


@_fake("handgrad::max_pool2d_backward")
def _(dout: Tensor, idx: Tensor, hw: int):
    return dout.new_empty(dout.shape[0], dout.shape[1], hw)


def _output_like(q: Tensor, rows: int, cols: int) -> Tensor:
    """attention.cpp's outputs, (B, [H,] rows, cols): laid out (B, rows, H, cols) where q's heads lie side by side in
    memory (its head stride below its row stride), else contiguous."""
    if q.dim() == 4 and q.stride(1) < q.stride(2):
        return q.new_empty(q.shape[0], rows, q.shape[1], cols).transpose(1, 2)
    return q.new_empty(*q.shape[:-2], rows, cols)


@_fake("handgrad::attention_forward")
def _(q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool, block: int):
    return _output_like(q, q.shape[-2], v.shape[-1]), q.new_empty(*q.shape[:-1], 1)


@_fake("handgrad::attention_backward")
def _(q, k, v, dout, D, lse, scale, causal, block):
    L, S, E, Ev = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    return _output_like(q, L, E), _output_like(q, S, E), _output_like(q, S, Ev)  # as q's, whatever k's and v's


@_fake("handgrad::attention_backward_into")
def _(q, k, v, dout, D, lse, scale, causal, block, dq, dk, dv) -> None:
    return None

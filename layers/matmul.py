"""The recurrent layers' matrix products, on the CPU through oneDNN where torch's BLAS is slower.

``torch.mm`` on the CPU calls MKL's sgemm.  On an AMD CPU (this project's machine is an AMD EPYC, Zen 5, with
AVX-512) MKL runs its AVX2 code, while oneDNN -- the library behind nn.LSTM's own CPU kernel -- generates AVX-512
code: for the products of a recurrent layer, (32, 256) x (256, 1024) per step and (2048, 256) x (256, 1024) over
a sequence, oneDNN measured 1.6-2x faster here in float32 (``python benchmarks/lstm_step.py`` prints both).  So
for a float32 CPU tensor the products below go through oneDNN's matmul, ``torch.ops.mkldnn._linear_pointwise``
(the op torch's own compiler emits for nn.Linear on the CPU); for anything else -- float64, CUDA, a torch built
without oneDNN, or ``ONEDNN = False`` -- through ``torch.addmm``.  The two agree to float32 round-off
(tests/test_recurrent.py); the float64 tests, which hold the layers to 1e-10, use the addmm path.

    linear(x, w, bias=None)   x (M, K), w (N, K) -> (M, N) = x @ w^T + bias       (nn.Linear's layout)
    linear_add(x, w, other)   -> other + x @ w^T                                   (other (M, N), may be strided)
    t_matmul(a, b)            a (K, M), b (K, N) -> (M, N) = a^T @ b                (a weight gradient: K = T*N rows)
"""
from __future__ import annotations

import torch
from torch import Tensor


def _probe() -> bool:
    """Whether this torch has oneDNN's matmul op and it computes x @ w^T (checked once, on tiny tensors)."""
    try:
        op = torch.ops.mkldnn._linear_pointwise
        x, w = torch.arange(6.0).view(2, 3), torch.arange(12.0).view(4, 3)
        return (torch.backends.mkldnn.is_available()
                and torch.equal(op(x, w, None, "none", [], ""), x @ w.t())
                and torch.equal(op.binary(x, x @ w.t(), w, None, "add"), 2 * (x @ w.t())))
    except (AttributeError, RuntimeError):
        return False


ONEDNN: bool = _probe()  # set False to run every product through torch.addmm (the benchmark compares both)


def _onednn(x: Tensor) -> bool:
    return ONEDNN and x.dtype == torch.float32 and x.device.type == "cpu"


def linear(x: Tensor, w: Tensor, bias: Tensor | None = None) -> Tensor:
    """x (M, K), w (N, K) -> x @ w^T + bias (M, N)."""
    if _onednn(x):
        return torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "")
    return x @ w.t() if bias is None else torch.addmm(bias, x, w.t())


def linear_add(x: Tensor, w: Tensor, other: Tensor) -> Tensor:
    """x (M, K), w (N, K), other (M, N) -> other + x @ w^T, a new tensor (M, N)."""
    if _onednn(x):
        return torch.ops.mkldnn._linear_pointwise.binary(x, other, w, None, "add")
    return torch.addmm(other, x, w.t())


def t_matmul(a: Tensor, b: Tensor) -> Tensor:
    """a (K, M), b (K, N) -> a^T @ b (M, N): a weight gradient, summed over the K rows (every time step and sample)."""
    if _onednn(a):
        return torch.ops.mkldnn._linear_pointwise(a.t(), b.t(), None, "none", [], "")
    return a.t() @ b


def t_matmul_add_(out: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """out += a^T @ b, a (K, M), b (K, N), out (M, N): a weight gradient added into an existing .grad."""
    if _onednn(a):
        return out.add_(t_matmul(a, b))
    return out.addmm_(a.t(), b)

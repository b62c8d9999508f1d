"""The recurrent layers' matrix products, on the CPU through oneDNN where torch's BLAS is slower.

``torch.mm`` on the CPU calls MKL's sgemm.  On an AMD CPU MKL runs its AVX2 code, while oneDNN -- the library
behind nn.LSTM's own CPU kernel -- generates AVX-512 code, faster for a recurrent layer's products there; on an
Intel CPU MKL runs its own AVX-512 code and is the faster (``python benchmarks/lstm_step.py`` prints both; the
figures are in docs/benchmarks.md).  So for a float32 CPU tensor on an AMD CPU the products below go through
oneDNN's matmul, ``torch.ops.mkldnn._linear_pointwise`` (the op torch's own compiler emits for nn.Linear on the
CPU); for anything else -- another CPU, float64, CUDA, a torch built without oneDNN, or ``ONEDNN = False`` --
through ``torch.addmm``.  The two agree to float32 round-off (tests/test_recurrent.py runs both wherever oneDNN is
there); the float64 tests, which hold the layers to 1e-10, use the addmm path.

    prepack(w, x)             w (N, K) in the layout the products with x's kind of rows read fastest (oneDNN's
                              blocked layout, reordered once and reused by every step, or w^T row-major)
    linear(x, w, bias=None)   x (M, K), w (N, K) or prepack(w) -> (M, N) = x @ w^T + bias     (nn.Linear's layout)
    linear_add(x, w, other)   -> other + x @ w^T                                   (other (M, N), may be strided)
    linear_add_(x, w, other)  the same, into other where it can (a scratch buffer: the caller uses what it returns)
    weight_grad(d, x)         d (K, M), x (K, N) -> d^T @ x (M, N), a weight gradient summed over the K rows, in
                              the form the layer template adds into .grad (layers/template.py)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..gradients import Product


def _probe() -> bool:
    """Whether this torch has oneDNN's matmul op and it computes x @ w^T (checked once, on tiny tensors)."""
    try:
        op = torch.ops.mkldnn._linear_pointwise
        x, w = torch.arange(6.0).view(2, 3), torch.arange(12.0).view(4, 3)
        return (
            torch.backends.mkldnn.is_available()
            and torch.equal(op(x, w, None, "none", [], ""), x @ w.t())
            and torch.equal(op.binary(x, x @ w.t(), w, None, "add"), 2 * (x @ w.t()))
        )
    except (AttributeError, RuntimeError):
        return False


def cpu_vendor() -> str:
    """The CPU's vendor id ("GenuineIntel", "AuthenticAMD", ...) from /proc/cpuinfo; "" where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


AMD: bool = cpu_vendor() == "AuthenticAMD"
AVAILABLE: bool = _probe()  # this torch has oneDNN's matmul op, and it computes x @ w^T
ONEDNN: bool = AVAILABLE and AMD  # set it to run the products through oneDNN (True) or torch.addmm (False)


def _onednn(x: Tensor) -> bool:
    """oneDNN's products for this x; not while torch.compile traces (its op wants a constant weight there)."""
    return ONEDNN and x.dtype == torch.float32 and x.device.type == "cpu" and not torch.compiler.is_compiling()


def prepack(w: Tensor, x: Tensor) -> Tensor:
    """w (N, K), any strides (``W.t()`` for a product by W itself), prepared for products ``linear(x_i, w)`` with
    x_i shaped and typed as x (M, K): oneDNN's blocked layout, or for torch.addmm w with w^T contiguous -- MKL's
    sgemm reads its second operand faster row-major than transposed at these shapes (a copy only where w^T is
    not contiguous already)."""
    if _onednn(x):
        return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), x.shape[0])
    return w.t().contiguous().t()


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


def linear_add_(x: Tensor, w: Tensor, other: Tensor) -> Tensor:
    """x (M, K), w (N, K), other (M, N) -> other + x @ w^T, written into ``other`` and returned (a GEMM with beta = 1:
    no copy of other, no new tensor); through oneDNN a new tensor, ``other`` left as it was."""
    if _onednn(x):
        return torch.ops.mkldnn._linear_pointwise.binary(x, other, w, None, "add")
    return other.addmm_(x, w.t())


def weight_grad(d: Tensor, x: Tensor) -> Product | Callable[[], Tensor]:
    """d (K, M), x (K, N) -> dW = d^T @ x (M, N), left for the layer template to compute (only for a parameter that
    wants a gradient): ``Product(d^T, x)`` (torch.addmm, in place into an existing .grad), or through oneDNN a
    callable.

    The K = T*N rows (every step and sample) are the product's inner dimension, strided in both operands; oneDNN
    makes its operands contiguous, and computing (x^T d)^T -- the smaller result first, then transposed -- is the
    fastest of that, transposing d once by hand, oneDNN on d^T x and MKL (docs/benchmarks.md).
    """
    if not _onednn(d):
        return Product(d.t(), x)
    op = torch.ops.mkldnn._linear_pointwise
    return lambda: op(x.t(), d.t(), None, "none", [], "").t().contiguous()  # contiguous: it may become .grad

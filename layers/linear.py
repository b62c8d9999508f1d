"""Linear layer: out = x @ W^T + b, W (out_features, in_features) as nn.Linear's, with a hand-written backward.

Shape legend: N = batch (every leading position), D = in_features, H = out_features.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

import kernels
from kernels import linear

from .checks import Expects, check_int
from .init import torch_default_params
from .layer import BaseLayer, learned


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

    Backward, the chain rule on out[n, h] = sum_d x[n, d] weight[h, d] + bias[h]: each of x, weight and bias is
    used by several outputs, and its gradient is the sum over them --

        dx[n, d] = sum_h dout[n, h] weight[h, d]     x[n, d] feeds every output h of its row:   dx = dout @ W
        dW[h, d] = sum_n dout[n, h] x[n, d]          W[h, d] is used by every row n:            dW = dout.T @ x
        db[h]    = sum_n dout[n, h]                  b is added to every row:                   db = dout.sum(0)

    Kept from forward to backward: x (for dW) and the weight (for dx).  Changing either in place in between --
    ``x.mul_(10)``, an optimizer step -- is refused in backward, as torch.autograd refuses it (layers/saved.py;
    the weight only when dx is asked for, as autograd keeps it only then).

    Written in the template (layers/template.py): the base checks, keeps, versions and accumulates; what is here
    is the math.  dW and dx share no work (two GEMMs, each on dout), so ``backward_input``/``backward_weight``
    (a pipeline's B and W) split it completely: dx now, dW and db later.  The kernel (kernels/linear.py) adds dW
    into ``.grad`` in place and skips dx where it is not asked for.
    """

    _param_names = ("weight", "bias")
    expects = Expects(
        size=(-1, "in_features"), like=("weight",), shape="(*, {in_features})", like_name="input", floating=False
    )
    _input_grad_only = ("weight",)  # read for dx only: autograd keeps the weight only when x needs a gradient
    torch_class = torch.nn.Linear
    _ctor_args = ("in_features", "out_features", "bias")

    class Saved(NamedTuple):
        x: Tensor  # (N, D), for dW
        weight: Tensor  # (H, D), for dx
        lead: torch.Size  # the input's leading axes (*), restored on dx

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        self.in_features = check_int("Linear", "in_features", in_features)
        self.out_features = check_int("Linear", "out_features", out_features)
        self.weight, self.bias = learned(
            *torch_default_params((out_features, in_features), bias, device=device, dtype=dtype)
        )

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def forward_math(self, x: Tensor):
        """x: (*, D) -> out: (*, H); (N, D) -> (N, H) is the common case."""
        lead = x.shape[:-1]
        if x.dim() != 2:
            x = x.reshape(-1, self.in_features)  # (N, D), N = prod(*): a view when x is contiguous
        wt = self.weight.t()  # (D, H), a view: no copy
        out = x @ wt if self.bias is None else torch.addmm(self.bias, x, wt)  # (N, H), bias add fused into the GEMM
        out = out if len(lead) == 1 else out.view(*lead, self.out_features)  # (*, H)
        return out, self.Saved(x, self.weight, lead)

    def backward_math(self, dout: Tensor, saved: Saved):
        """dout: (*, H) -> dx: (*, D); dweight (H, D) and dbias (H,) summed over every leading position."""
        x, weight = saved.x, saved.weight  # (N, D), (H, D)
        if dout.dim() != 2:
            dout = dout.reshape(-1, self.out_features)  # (N, H): every leading position a row
        if not kernels.enabled():
            dx = dout @ weight  # (N, D): dx[n, d] = sum_h dout[n, h] weight[h, d]
            dweight = dout.T @ x  # (H, D): dweight[h, d] = sum_n dout[n, h] x[n, d], a sum over the batch
            dbias = dout.sum(0)  # (H,): the bias is added to every row, so its gradient sums over the batch
        else:  # dweight into .grad in place (a Product the template adds), dx only when asked for: kernels/linear.py
            dx, dweight, dbias = linear.linear_backward(  # type: ignore[assignment]
                dout, x, weight, needs_dx=self.needs_input_grad
            )
        if dx is not None and len(saved.lead) != 1:
            dx = dx.view(*saved.lead, self.in_features)  # (*, D)
        return dx, {"weight": dweight, "bias": dbias}

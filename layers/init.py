"""torch.nn's default initialisation of Linear, convolution and recurrent weights, in one place.

``torch_default_params`` draws exactly what ``nn.Linear`` / ``nn.Conv2d``'s ``reset_parameters``
draws -- Kaiming-uniform with a=sqrt(5), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)), then the bias
from the same range -- with torch.nn.init's own functions, from the global RNG, in the same order.
So under one ``torch.manual_seed`` a hand-written layer and its torch twin get identical weights.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def torch_default_params(
    weight_shape: tuple[int, ...], bias: bool, *, device=None, dtype=None
) -> tuple[Tensor, Tensor | None]:
    """-> (weight of ``weight_shape`` in torch's layout, bias (weight_shape[0],) or None).

    fan_in = prod(weight_shape[1:]): in_features for Linear (H, D), in/groups * kH * kW for Conv2d.
    """
    w = torch.empty(weight_shape, device=device, dtype=dtype)
    torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5))
    if not bias:
        return w, None
    fan_in = math.prod(weight_shape[1:])
    bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
    b = torch.empty(weight_shape[0], device=device, dtype=dtype)
    torch.nn.init.uniform_(b, -bound, bound)
    return w, b


def torch_recurrent_init_(params: list[Tensor], hidden_size: int) -> None:
    """What ``nn.RNNBase`` and ``nn.RNNCellBase``'s ``reset_parameters`` draw: every parameter from
    U(-1/sqrt(H), 1/sqrt(H)), H = hidden_size (also for an LSTM's projection), in the order given -- pass them in
    torch's registration order (``_flat_weights_names``: per layer and direction w_ih, w_hh, b_ih, b_hh, w_hr)."""
    stdv = 1.0 / math.sqrt(hidden_size) if hidden_size > 0 else 0
    for p in params:
        torch.nn.init.uniform_(p, -stdv, stdv)

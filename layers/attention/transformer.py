"""The Transformer encoder: nn.TransformerEncoderLayer's and nn.TransformerEncoder's twins, backpropagated by hand.

Shape legend: L = sequence length, N = batch, E = d_model, F = dim_feedforward.  Inputs are (L, N, E), or
(N, L, E) with ``batch_first``, or unbatched (L, E).

One layer is self-attention then a position-wise MLP, each wrapped in a residual connection and a layer
norm -- after the residual add (``norm_first=False``, the original Transformer's post-norm) or before the
sublayer (``norm_first=True``, pre-norm, as GPT-2):

    post-norm:  x = norm1(x + sa(x));        x = norm2(x + ff(x))
    pre-norm:   x = x + sa(norm1(x));        x = x + ff(norm2(x))
    sa(x) = dropout1(self_attn(x, x, x)),    ff(x) = dropout2(linear2(dropout(activation(linear1(x)))))

Backward walks it in reverse.  A residual connection y = x + f(x) sends its gradient down both ways,
dx = dy + f.backward(dy); self-attention receives x as query, key and value, so its input gradient is the
sum of the three (``MultiheadAttention.backward(..., summed=True)``).

Both are ``Composite`` layers (layers/composite.py): under the backward split, B runs each sublayer's B in
backward's order (the weightless dropouts and activation run their backward, all B) and W each sublayer's W in
the same order -- post-norm norm2, linear2, linear1, norm1, self_attn; pre-norm linear2, linear1, norm2,
self_attn, norm1 -- the order in which the fused backward adds them.  What each sublayer shares between its B and
W is its own: LayerNorm computes its two (E,) sums in B, the attention concatenates dq, dk, dv once in B.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..activations import GELU, ReLU
from ..checks import Expects, check_bool, check_int
from ..composite import Composite
from ..dropout import Dropout
from ..layernorm import LayerNorm
from ..linear import Linear
from .multihead import MultiheadAttention

_ACTIVATIONS = {"relu": ReLU, "gelu": GELU}


class TransformerEncoderLayer(Composite):
    """``TransformerEncoderLayer(d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
    layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True)``: torch.nn's arguments, defaults,
    parameter names (``self_attn.in_proj_weight``, ``linear1.weight``, ``norm1.weight``, ...) and initialisation
    in its RNG order.  ``activation`` is "relu" or "gelu" (or torch's F.relu / F.gelu).

    ``forward(src, src_mask=None, src_key_padding_mask=None, is_causal=False) -> out`` (masks as
    nn.MultiheadAttention takes them: a boolean True means "may NOT attend"); ``backward(dout) -> dsrc``.
    torch's inference fast path (eval mode, ``torch._transformer_encoder_layer_fwd``) computes the same function;
    this layer always runs the path written out above.
    """

    torch_class = torch.nn.TransformerEncoderLayer
    expects = Expects(name="src", floating=False)  # a tensor; its self-attention checks the rest

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | object = "relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        check_int("TransformerEncoderLayer", "dim_feedforward", dim_feedforward)
        check_bool("TransformerEncoderLayer", "norm_first", norm_first)
        self.activation_name = _activation_name(activation)
        # torch's order of construction, hence of random draws: self_attn, linear1, dropout, linear2, norms
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first, **kw)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **kw)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **kw)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _ACTIVATIONS[self.activation_name]()
        self.batch_first = batch_first

    def named_children(self):
        return iter(
            (
                ("self_attn", self.self_attn),
                ("linear1", self.linear1),
                ("dropout", self.dropout),
                ("linear2", self.linear2),
                ("norm1", self.norm1),
                ("norm2", self.norm2),
                ("dropout1", self.dropout1),
                ("dropout2", self.dropout2),
                ("activation", self.activation),
            )
        )

    def extra_repr(self) -> str:
        return (
            f"d_model={self.self_attn.embed_dim}, nhead={self.self_attn.num_heads}, "
            f"dim_feedforward={self.linear1.out_features}, activation={self.activation_name!r}, "
            f"norm_first={self.norm_first}"
        )

    def forward_math(
        self,
        src: Tensor,
        src_mask: Tensor | None = None,
        src_key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> tuple[Tensor, None]:
        """src (L, N, E) / (N, L, E) / (L, E) -> out, the same shape (the sublayers keep what their backward
        needs: nothing is saved here)."""
        x = src
        if self.norm_first:
            x = x + self._sa(self.norm1(x), src_mask, src_key_padding_mask, is_causal=is_causal)
            x = x + self._ff(self.norm2(x))
        else:
            x = self.norm1(x + self._sa(x, src_mask, src_key_padding_mask, is_causal=is_causal))
            x = self.norm2(x + self._ff(x))
        return x, None

    def _sa(self, x: Tensor, mask, kpm, *, is_causal: bool) -> Tensor:
        return self.dropout1(
            self.self_attn(x, x, x, attn_mask=mask, key_padding_mask=kpm, need_weights=False, is_causal=is_causal)[0]
        )

    def _ff(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def backward_math(self, dout: Tensor, saved: None) -> Tensor:
        """dout: the output's shape -> dsrc; every sublayer adds its parameters' gradients into their .grad (under
        B, queues its W)."""
        if self.norm_first:
            d = dout + self.back(self.norm2, self._ff_backward(dout))  # through x = x + ff(norm2(x))
            return d + self.back(self.norm1, self._sa_backward(d))  # through x = x + sa(norm1(x))
        d = self.back(self.norm2, dout)  # through x = norm2(x + ff(x))
        d = d + self._ff_backward(d)
        d = self.back(self.norm1, d)  # through x = norm1(x + sa(x))
        return d + self._sa_backward(d)

    def _sa_backward(self, d: Tensor) -> Tensor:
        return self.back(self.self_attn, self.dropout1.backward(d), summed=True)  # query = key = value

    def _ff_backward(self, d: Tensor) -> Tensor:
        d = self.back(self.linear2, self.dropout2.backward(d))
        return self.back(self.linear1, self.activation.backward(self.dropout.backward(d)))

    @classmethod
    def _ctor_kwargs(cls, obj) -> dict:
        if isinstance(obj, TransformerEncoderLayer):
            activation = obj.activation_name
        else:
            activation = obj.activation
        return {
            "d_model": obj.self_attn.embed_dim,
            "nhead": obj.self_attn.num_heads,
            "dim_feedforward": obj.linear1.out_features,
            "dropout": float(obj.dropout.p),
            "activation": activation,
            "layer_norm_eps": obj.norm1.eps,
            "batch_first": obj.self_attn.batch_first,
            "norm_first": obj.norm_first,
            "bias": obj.linear1.bias is not None,
        }


class TransformerEncoder(Composite):
    """``TransformerEncoder(encoder_layer, num_layers, norm=None)``: ``num_layers`` copies of ``encoder_layer``
    (deep copies, as torch's: identical initial weights), then ``norm`` if given.  Keys as torch's
    (``layers.0.self_attn.in_proj_weight``, ``norm.weight``).

    ``forward(src, mask=None, src_key_padding_mask=None, is_causal=None) -> out``, ``backward(dout) -> dsrc``.
    ``is_causal=None`` detects, as torch does, whether ``mask`` is the causal mask.  torch's eval-mode fast path
    with a key padding mask runs on nested tensors and returns zeros at padded positions; this encoder
    always computes the layers as written (the values torch's training mode gives).
    """

    torch_class = torch.nn.TransformerEncoder
    expects = Expects(name="src", floating=False)  # a tensor; its layers check the rest

    def __init__(
        self,
        encoder_layer: TransformerEncoderLayer,
        num_layers: int,
        norm: LayerNorm | None = None,
        enable_nested_tensor: bool = True,
        mask_check: bool = True,
    ) -> None:
        if not isinstance(encoder_layer, TransformerEncoderLayer):
            raise TypeError(
                f"TransformerEncoder: encoder_layer must be a layers.TransformerEncoderLayer, got "
                f"{type(encoder_layer).__name__}"
            )
        check_int("TransformerEncoder", "num_layers", num_layers)
        if norm is not None and not isinstance(norm, LayerNorm):
            raise TypeError(f"TransformerEncoder: norm must be a layers.LayerNorm or None, got {type(norm).__name__}")
        self.layers = [copy.deepcopy(encoder_layer) for _ in range(num_layers)]
        self.num_layers, self.norm = num_layers, norm
        self.enable_nested_tensor, self.mask_check = enable_nested_tensor, mask_check  # torch's; no effect here

    def named_children(self):
        children = [(f"layers.{i}", layer) for i, layer in enumerate(self.layers)]
        if self.norm is not None:
            children.append(("norm", self.norm))
        return iter(children)

    def extra_repr(self) -> str:
        return f"num_layers={self.num_layers}, norm={self.norm is not None}"

    def forward_math(
        self,
        src: Tensor,
        mask: Tensor | None = None,
        src_key_padding_mask: Tensor | None = None,
        is_causal: bool | None = None,
    ) -> tuple[Tensor, None]:
        """src (L, N, E) / (N, L, E) / (L, E) -> out, the same shape (the layers keep their own: nothing is
        saved here)."""
        seq_len = src.shape[1 if self.layers[0].batch_first and src.dim() == 3 else 0]
        is_causal = torch.nn.modules.transformer._detect_is_causal_mask(mask, is_causal, seq_len)
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=is_causal)
        if self.norm is not None:
            x = self.norm(x)
        return x, None

    def backward_math(self, dout: Tensor, saved: None) -> Tensor:
        """dout -> dsrc, through the norm and the layers in reverse (under B, each one's W queued in that order)."""
        d = self.back(self.norm, dout) if self.norm is not None else dout
        for layer in reversed(self.layers):
            d = self.back(layer, d)
        return d

    @classmethod
    def from_torch(cls, module: torch.nn.Module) -> TransformerEncoder:
        """The hand-written encoder holding copies of ``module``'s weights, in its mode."""
        if not isinstance(module, torch.nn.TransformerEncoder):
            raise TypeError(
                f"TransformerEncoder.from_torch: expected a torch.nn.TransformerEncoder, got {type(module).__name__}"
            )
        norm = LayerNorm.from_torch(module.norm) if module.norm is not None else None
        ours = cls(TransformerEncoderLayer.from_torch(module.layers[0]), module.num_layers, norm)
        ours.load_state_dict(module.state_dict())
        return ours.train(module.training)

    def to_torch(self) -> torch.nn.TransformerEncoder:
        """The torch.nn.TransformerEncoder holding copies of these weights, in the same mode."""
        norm = self.norm.to_torch() if self.norm is not None else None
        module = torch.nn.TransformerEncoder(
            self.layers[0].to_torch(),  # type: ignore[arg-type]  # a torch.nn.TransformerEncoderLayer
            self.num_layers,
            norm=norm,
            enable_nested_tensor=False,
        )
        module.load_state_dict(self.state_dict())
        return module.train(self.training)


def _activation_name(activation: object) -> str:
    if activation in ("relu", F.relu) or isinstance(activation, (torch.nn.ReLU, ReLU)):
        return "relu"
    if activation in ("gelu", F.gelu) or (
        isinstance(activation, (torch.nn.GELU, GELU)) and getattr(activation, "approximate", "none") == "none"
    ):
        return "gelu"
    raise ValueError(
        f"TransformerEncoderLayer: activation must be 'relu' or 'gelu' (or F.relu / F.gelu), got {activation!r}"
    )

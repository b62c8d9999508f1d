"""The key/value cache behind ``GPT.generate``: a new token costs one position's work, not the window's.

Inference only: the GPT's parameters and the same math as its layers' forwards (``models/gpt.py``), nothing
kept for a backward.  ``tests/test_gpt.py`` ties the cached logits to a full recompute (1e-12, float64).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from layers.attention import ScaledDotProductAttention
from layers.moe import MixtureOfExperts

if TYPE_CHECKING:
    from layers.layernorm import LayerNorm
    from layers.linear import Linear


class KVCache:
    """The keys and values of every layer for the positions seen so far, for one ``GPT.generate`` call.

    prefill(idx (B, t)) runs the model on the window and keeps each layer's k and v (B, nh, t, hs);
    step(idx (B, 1)) computes one new position: its q, k, v, attention of that one query over the cached keys
    (all of them are in its past, so no mask), the MLP, the logits.  Inference only: the layers' parameters,
    the same math as their forwards, nothing kept for a backward.
    """

    def __init__(self, model) -> None:  # a models.gpt.GPT, which imports this file (so this one names it in words)
        self.model, self.length = model, 0
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []

    def prefill(self, idx: Tensor) -> Tensor:
        """idx (B, t), t <= block_size -> the logits of its last position (B, V)."""
        m = self.model
        B, T = idx.shape
        x = m.wte.weight[idx] + m.wpe.weight[:T]  # (B, T, C)
        self.k, self.v = [], []
        for i, block in enumerate(m.h):
            x = x + self._attend(block, _layernorm(block.ln_1, x), i, causal=True)
            x = x + self._mlp(block.mlp, _layernorm(block.ln_2, x))
        self.length = T
        return _layernorm(m.ln_f, x[:, -1]) @ m.wte.weight.t()  # (B, V)

    def step(self, idx_next: Tensor) -> Tensor:
        """idx_next (B, 1), the token at position ``length`` -> its logits (B, V)."""
        m = self.model
        x = m.wte.weight[idx_next] + m.wpe.weight[self.length : self.length + 1]  # (B, 1, C)
        for i, block in enumerate(m.h):
            x = x + self._attend(block, _layernorm(block.ln_1, x), i, causal=False)
            x = x + self._mlp(block.mlp, _layernorm(block.ln_2, x))
        self.length += 1
        return _layernorm(m.ln_f, x[:, -1]) @ m.wte.weight.t()  # (B, V)

    def _attend(self, block, x: Tensor, layer: int, *, causal: bool) -> Tensor:  # block: the GPT's Block
        a = block.attn
        B, T, C = x.shape
        nh = a.n_head
        qkv = _linear(a.c_attn, x)  # (B, T, 3C)
        q, k, v = (t.view(B, T, nh, C // nh).transpose(1, 2) for t in qkv.split(C, dim=2))  # (B, nh, T, hs)
        if layer == len(self.k):  # prefill: the window's keys and values
            self.k.append(k)
            self.v.append(v)
        else:  # one more position
            k = self.k[layer] = torch.cat([self.k[layer], k], 2)  # (B, nh, t+1, hs)
            v = self.v[layer] = torch.cat([self.v[layer], v], 2)
        y = ScaledDotProductAttention()(q, k, v, is_causal=causal, scale=1.0 / math.sqrt(C // nh))
        return _linear(a.c_proj, y.transpose(1, 2).reshape(B, T, C))

    @staticmethod
    def _mlp(mlp, x: Tensor) -> Tensor:  # mlp: a Block's MLP, or its mixture of experts
        if isinstance(mlp, MixtureOfExperts):  # routed and capped among the positions of this call
            return mlp.forward_math(x)[0]
        return _linear(mlp.c_proj, torch.nn.functional.gelu(_linear(mlp.c_fc, x), approximate=mlp.gelu.approximate))


def _linear(lin: Linear, x: Tensor) -> Tensor:
    """A Linear's map (x @ W^T + b), caching nothing."""
    y = x @ lin.weight.t()
    return y if lin.bias is None else y.add_(lin.bias)


def _layernorm(ln: LayerNorm, x: Tensor) -> Tensor:
    """A LayerNorm's map, caching nothing."""
    return torch.nn.functional.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps)

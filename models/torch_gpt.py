"""PytorchGPT: the nn.Module twin of ``models.GPT``, built from torch.nn layers and trained with autograd.

nanoGPT's architecture, names and initialisation (so its state_dict, and ``models.GPT``'s, load as they are),
with two differences that let it train beside the hand-written GPT from the same random draws: its dropouts
are ``SeededDropout``s, and its attention-weight dropout uses ``layers.attention.dropout``'s masks, drawn
from ``generator`` as the hand-written attention draws them.  Without dropout (the default) its attention is
``F.scaled_dot_product_attention(is_causal=True)``, nanoGPT's own call.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from layers.attention.dropout import attention_dropout_mask, draw_seed
from layers.dropout import SeededDropout
from layers.moe import check_moe
from layers.moe_twin import PytorchMoE


class _CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool, **kw) -> None:
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias, **kw)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias, **kw)
        self.resid_dropout = SeededDropout(dropout)
        self.n_head, self.n_embd, self.p = n_head, n_embd, float(dropout)
        self.generator: torch.Generator | None = None  # where attention-dropout seeds are drawn

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        if self.training and self.p > 0:  # the weights' dropout mask models.GPT draws, then the textbook attention
            seed = draw_seed(self.generator)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(
                torch.ones(T, T, dtype=torch.bool, device=x.device).tril().logical_not(), float("-inf")
            )
            mask = attention_dropout_mask(seed, self.p, B * self.n_head, T, T, dtype=att.dtype, device=x.device)
            y = (F.softmax(att, dim=-1) * mask.view(B, self.n_head, T, T)) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class _MLP(nn.Module):
    def __init__(self, n_embd: int, dropout: float, bias: bool, **kw) -> None:
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias, **kw)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias, **kw)
        self.dropout = SeededDropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class _Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool, moe: dict | None = None, **kw) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias, **kw)
        self.attn = _CausalSelfAttention(n_embd, n_head, dropout, bias, **kw)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias, **kw)
        self.mlp = _MLP(n_embd, dropout, bias, **kw) if moe is None else PytorchMoE(n_embd, 4 * n_embd, **moe, **kw)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class PytorchGPT(nn.Module):
    """``PytorchGPT(vocab_size, block_size, n_layer, n_head, n_embd, dropout=0.0, bias=True, dtype=None,
    device=None, n_experts=0, top_k=2, capacity_factor=1.25, aux_coef=0.01)``: ``forward(idx) -> logits`` (B, T, V)
    for every position; ``generate`` is nanoGPT's (the whole window recomputed for every token).  With
    ``n_experts`` > 0 each block's MLP is the mixture of experts' twin (layers/moe_twin.py) and ``aux_loss()`` is
    ``models.GPT``'s: the term to add to the loss."""

    def __init__(
        self,
        vocab_size: int = 50304,
        block_size: int = 1024,
        n_layer: int = 12,
        n_head: int = 12,
        n_embd: int = 768,
        dropout: float = 0.0,
        bias: bool = True,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        n_experts: int = 0,
        top_k: int = 2,
        capacity_factor: float = 1.25,
        aux_coef: float = 0.01,
    ) -> None:
        super().__init__()
        moe = check_moe("PytorchGPT", n_experts, top_k, capacity_factor, aux_coef)
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self._config = {
            "vocab_size": vocab_size,
            "block_size": block_size,
            "n_layer": n_layer,
            "n_head": n_head,
            "n_embd": n_embd,
            "dropout": float(dropout),
            "bias": bias,
            **(moe or {}),
        }
        self.aux_coef = aux_coef
        self.block_size = block_size
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(vocab_size, n_embd, **kw),
                wpe=nn.Embedding(block_size, n_embd, **kw),
                drop=SeededDropout(dropout),
                h=nn.ModuleList([_Block(n_embd, n_head, dropout, bias, moe, **kw) for _ in range(n_layer)]),
                ln_f=nn.LayerNorm(n_embd, bias=bias, **kw),
            )
        )
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False, **kw)
        self.transformer.wte.weight = self.lm_head.weight  # type: ignore[union-attr]  # weight tying, as nanoGPT
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def config(self) -> dict:
        """The constructor arguments (nanoGPT's GPTConfig fields)."""
        return dict(self._config)

    def aux_loss(self) -> Tensor | None:
        """After a forward: aux_coef times the blocks' auxiliary losses summed (None for the dense GPT)."""
        moes = [m for m in self.modules() if isinstance(m, PytorchMoE)]
        return self.aux_coef * sum(m.aux_loss for m in moes) if moes else None  # type: ignore[misc]

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: Tensor) -> Tensor:
        _, t = idx.size()
        if t > self.block_size:
            raise ValueError(
                f"PytorchGPT: cannot forward a sequence of length {t}: block_size is only {self.block_size}"
            )
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        # (nanoGPT's own lines: the ModuleDict's entries, which the type checker sees as a tensor or a module)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))  # type: ignore[operator]
        for block in self.transformer.h:  # type: ignore[union-attr]
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))  # type: ignore[operator]

    @torch.no_grad()
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """nanoGPT's ``generate``, with an optional generator for ``torch.multinomial``."""
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= self.block_size else idx[:, -self.block_size :]
            logits = self(idx_cond)[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            probs = F.softmax(logits, dim=-1)
            idx = torch.cat((idx, torch.multinomial(probs, num_samples=1, generator=generator)), dim=1)
        return idx

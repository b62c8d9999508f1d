"""GPT: nanoGPT's model with every backward written by hand, and sampling with a key/value cache.

Shape legend (llm.c's): B = batch, T = sequence length (<= block_size), C = n_embd (channels),
V = vocab_size, nh = n_head, hs = C / nh (one head's size), L = n_layer.

    x = wte[idx] + wpe[0..T)                               (B, T, C)  token + learned position embeddings
    for each of the L blocks (pre-norm residual blocks):
        x = x + attn(ln_1(x))                              causal self-attention, the only layer that mixes
        x = x + mlp(ln_2(x))                               information across time; mlp = c_proj(gelu(c_fc(.)))
                                                           (or, n_experts > 0, a mixture of experts: layers/moe.py)
    logits = ln_f(x) @ wte^T                               (B, T, V)  the output matrix IS the token table

Backward runs the same list in reverse; each residual connection y = x + f(x) sends dy both ways.  The
tied matrix ``transformer.wte.weight`` is one tensor whose gradient receives both contributions: the
output projection's dW = dlogits^T @ ln_f(x) and the embedding's scatter-add of dx at each token id.
Each block, and the GPT, is written in the layer template as a ``Composite`` (layers/template.py,
layers/composite.py): its forward returns the output and a named ``Saved``, its backward is the chain rule through
its children, and the base does the checks, the in-place refusals and the B/W split a pipeline schedule uses.

Names, state_dict keys and initialisation are nanoGPT's (karpathy/nanoGPT ``model.py``): under one
``torch.manual_seed`` this GPT and nanoGPT's draw identical weights (the modules are built in nanoGPT's
order, drawing what torch.nn's constructors draw, then re-initialised as its ``_init_weights`` does:
N(0, 0.02) for every Linear and Embedding, zero biases, N(0, 0.02 / sqrt(2 L)) for the residual
projections ``c_proj``), and ``load_state_dict(nanogpt.state_dict())`` gives nanoGPT's logits.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple, cast

import torch
from torch import Tensor

from layers.activations import GELU
from layers.attention import ScaledDotProductAttention
from layers.checks import BEFORE_FORWARD, check_bool, check_int, check_number
from layers.composite import Composite
from layers.dropout import Dropout
from layers.embedding import Embedding
from layers.layer import BaseLayer, _rng_untouched, copy_requires_grad, wants_grad
from layers.layernorm import LayerNorm
from layers.linear import Linear
from layers.moe import MixtureOfExperts, check_moe
from layers.template import add_product

from .kv_cache import KVCache
from .recompute import Recomputed
from .sampling import check_sampling, next_token


class CausalSelfAttention(Composite):
    """nanoGPT's attention: one packed projection ``c_attn`` (C -> 3C: q, k, v), nh causal heads (the blocked
    attention of ``layers.attention``), the heads side by side, ``c_proj`` (C -> C), ``resid_dropout``.

    forward(x (B, T, C)) -> (B, T, C); backward(dy) -> dx.  ``p`` and ``generator``: the attention weights'
    dropout probability and where its seeds are drawn (the trainer points every dropout of a model at one
    generator, so that the twin draws the same masks).  The attention between the two projections has no
    weights: under the B/W split all of it is B, and c_attn's W reads dqkv, kept by c_attn.

    ``norm``: the block's pre-norm (its ``ln_1``, owned and named by the Block), applied here first, so that with
    ``recompute`` (the default) its output is not held from forward to backward: c_attn gets it back computed again
    (models/recompute.py).  Without a norm, forward(x) is c_attn's input."""

    _saved_labels = {"y": "the heads' output y (c_proj's input)"}

    class Saved(NamedTuple):
        y: Tensor  # (B, T, C) the heads side by side: c_proj's input, and the attention's output for its backward
        recomputed: bool  # the norm's output was not held (c_attn's input): computed again in backward

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        dropout: float,
        bias: bool,
        *,
        norm: LayerNorm | None = None,
        device=None,
        dtype=None,
    ) -> None:
        if n_embd % n_head:
            raise ValueError(f"GPT: n_embd {n_embd} is not divisible by n_head {n_head}")
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.c_attn = Linear(n_embd, 3 * n_embd, bias=bias, **kw)
        self.c_proj = Linear(n_embd, n_embd, bias=bias, **kw)
        self.resid_dropout = Dropout(dropout)
        self.n_head, self.n_embd, self.p = n_head, n_embd, float(dropout)
        self.attention = ScaledDotProductAttention()
        self.norm, self.recompute = norm, True
        self._norm_c_attn = None if norm is None else Recomputed(norm, self.c_attn)

    generator = property(lambda self: self.attention.generator, lambda self, g: setattr(self.attention, "generator", g))

    def named_children(self) -> Iterator[tuple[str, BaseLayer]]:
        return iter((("c_attn", self.c_attn), ("c_proj", self.c_proj), ("resid_dropout", self.resid_dropout)))

    def forward_math(self, x: Tensor):
        """x (B, T, C) (the norm's input, when there is one) -> (B, T, C)."""
        B, T, C = x.shape
        recomputed = self.norm is not None and self.recompute
        if recomputed:
            qkv = self._norm_c_attn(x)  # type: ignore[misc]  # (B, T, 3C); set with the norm, its output not held
        else:
            qkv = self.c_attn(x if self.norm is None else self.norm(x))  # (B, T, 3C)
        q, k, v = qkv.split(C, dim=2)  # (B, T, C) each
        heads = lambda t: t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # noqa: E731  (B, nh, T, hs)
        p = self.p if self.training else 0.0
        y = self.attention(
            heads(q),
            heads(k),
            heads(v),
            dropout_p=p,
            is_causal=True,
            scale=1.0 / math.sqrt(C // self.n_head),
            keep_out=False,
        )  # (B, nh, T, hs)
        # (B, T, C) the heads side by side: c_proj's input, and the attention's output for its backward (which
        # therefore does not keep its own copy in the (B, nh, T, hs) layout).  A view where the C++ kernel ran (it
        # reads the heads' strided views of qkv and writes its output in this layout), else a copy.
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.resid_dropout(self.c_proj(y)), self.Saved(y, recomputed)

    def backward_math(self, dy: Tensor, saved: Saved) -> Tensor:
        """dy (B, T, C) -> dx (through the norm, when there is one)."""
        B, T, C = saved.y.shape
        nh, hs = self.n_head, C // self.n_head
        dy = self.back(self.c_proj, self.resid_dropout.backward(dy))  # (B, T, C)
        # dq, dk, dv written into c_attn's output gradient, each as the (B, nh, T, hs) view of its third that the
        # forward's heads were: the C++ kernel writes them there, any other path copies them in; no concatenation
        dqkv = dy.new_empty(B, T, 3 * C)
        heads = lambda i: dqkv[:, :, i * C : (i + 1) * C].view(B, T, nh, hs).transpose(1, 2)  # noqa: E731
        self.attention.backward(
            dy.view(B, T, nh, hs).transpose(1, 2),
            out=saved.y.view(B, T, nh, hs).transpose(1, 2),
            into=(heads(0), heads(1), heads(2)),
        )
        if saved.recomputed:
            return self.back(self._norm_c_attn, dqkv)  # type: ignore[arg-type]  # (set with the norm)
        dx = self.back(self.c_attn, dqkv)
        return dx if self.norm is None else self.back(self.norm, dx)


class MLP(Composite):
    """c_fc (C -> 4C), GELU, c_proj (4C -> C), dropout; backward in reverse.  ``norm``: the block's pre-norm (its
    ``ln_2``), applied first, as in ``CausalSelfAttention``.

    ``recompute`` (the default, llm.c's): neither the norm's output nor GELU's is held from forward to backward --
    each is computed again in backward, the same bits, for the next Linear's weight gradient (models/recompute.py):
    one (B, T, 4C) pass more per step, one (B, T, 4C) tensor fewer held per block, the largest a block has.
    ``recompute = False``: they are held instead (as torch's autograd holds them), one pass fewer."""

    class Saved(NamedTuple):
        recomputed: bool  # the norm's and GELU's outputs were not held: computed again in backward

    def __init__(
        self, n_embd: int, dropout: float, bias: bool, *, norm: LayerNorm | None = None, device=None, dtype=None
    ) -> None:
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.c_fc = Linear(n_embd, 4 * n_embd, bias=bias, **kw)
        self.gelu = GELU()
        self.c_proj = Linear(4 * n_embd, n_embd, bias=bias, **kw)
        self.dropout = Dropout(dropout)
        self.norm, self.recompute = norm, True
        self._norm_c_fc = None if norm is None else Recomputed(norm, self.c_fc)
        self._gelu_c_proj = Recomputed(self.gelu, self.c_proj)

    def named_children(self) -> Iterator[tuple[str, BaseLayer]]:
        return iter((("c_fc", self.c_fc), ("gelu", self.gelu), ("c_proj", self.c_proj), ("dropout", self.dropout)))

    def forward_math(self, x: Tensor):
        """x (B, T, C) (the norm's input, when there is one) -> (B, T, C)."""
        if self.recompute:
            h = self._norm_c_fc(x) if self.norm is not None else self.c_fc(x)  # type: ignore[misc]  # (B, T, 4C)
            y = self._gelu_c_proj(h)  # (B, T, C), gelu(h) not held
        else:
            h = self.c_fc(x if self.norm is None else self.norm(x))  # (B, T, 4C)
            y = self.c_proj(self.gelu(h))  # (B, T, C)
        return self.dropout(y), self.Saved(self.recompute)  # the children keep the rest

    def backward_math(self, dy: Tensor, saved: Saved) -> Tensor:
        """dy (B, T, C) -> dx (through the norm, when there is one)."""
        d = self.dropout.backward(dy)
        if saved.recomputed:
            dh = self.back(self._gelu_c_proj, d)  # (B, T, 4C)
            if self.norm is not None:
                return self.back(self._norm_c_fc, dh)  # type: ignore[arg-type]  # (set with the norm)
            return self.back(self.c_fc, dh)
        dx = self.back(self.c_fc, self.gelu.backward(self.back(self.c_proj, d)))
        return dx if self.norm is None else self.back(self.norm, dx)


class Block(Composite):
    """x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)).  Backward: dx = dy + attn.backward(dy) (through ln_1), after the
    same through the MLP.  The attention and the MLP apply their LayerNorm themselves (the Block owns and names
    ``ln_1`` and ``ln_2``), so that with ``recompute`` (``GPT.recompute``, the default) the LayerNorms' outputs are
    not held from forward to backward: each LayerNorm's input is held anyway, and backward computes its output
    again, bit for bit, for the next Linear's weight gradient.  One (B, T, C) pass more per LayerNorm; two (B, T, C)
    tensors fewer held per block.

    ``moe`` (MixtureOfExperts' settings: n_experts, top_k, capacity_factor, aux_coef): the MLP is a mixture of
    experts of the same shape (C -> 4C -> C each, layers/moe.py) instead, applied to ln_2(x), which it then holds;
    its backward adds the auxiliary loss's gradient (aux_coef times it), and it has no dropout of its own."""

    def __init__(
        self, n_embd: int, n_head: int, dropout: float, bias: bool, *, moe: dict | None = None, device=None, dtype=None
    ) -> None:
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.ln_1 = LayerNorm(n_embd, bias=bias, **kw)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias, norm=self.ln_1, **kw)
        self.ln_2 = LayerNorm(n_embd, bias=bias, **kw)
        self.mlp: MLP | MixtureOfExperts = (
            MLP(n_embd, dropout, bias, norm=self.ln_2, **kw)
            if moe is None
            else MixtureOfExperts(n_embd, 4 * n_embd, **moe, **kw)
        )

    @property
    def recompute(self) -> bool:
        """Whether the LayerNorms' and GELU's outputs are computed again in backward instead of held."""
        return self.attn.recompute and getattr(self.mlp, "recompute", True)

    @recompute.setter
    def recompute(self, value: bool) -> None:
        self.attn.recompute = value
        if isinstance(self.mlp, MLP):
            self.mlp.recompute = value

    def named_children(self) -> Iterator[tuple[str, BaseLayer]]:
        return iter((("ln_1", self.ln_1), ("attn", self.attn), ("ln_2", self.ln_2), ("mlp", self.mlp)))

    def forward_math(self, x: Tensor):
        # Each sum is added into the branch's output (a fresh tensor no layer keeps), not into x: ln_1 and ln_2
        # keep their inputs for backward.  One (B, T, C) allocation per residual fewer.
        x = self.attn(x).add_(x)  # x + attn(ln_1(x))
        if not isinstance(self.mlp, MLP):  # a mixture of experts (or its expert-parallel part): given ln_2(x)
            return self.mlp(self.ln_2(x)).add_(x), None  # x + moe(ln_2(x))
        return self.mlp(x).add_(x), None  # x + mlp(ln_2(x)); the children keep what their backwards read

    def backward_math(self, dy: Tensor, saved: None) -> Tensor:
        # y = x + f(x) sends dy both ways: dx = dy + f'(x)^T dy.  Added into the branch's dx (fresh); dy itself
        # may be a layer's cached tensor, so never written.
        if not isinstance(self.mlp, MLP):
            dy = self.back(self.ln_2, self.back(self.mlp, dy)).add_(dy)
        else:
            dy = self.back(self.mlp, dy).add_(dy)
        return self.back(self.attn, dy).add_(dy)


class GPT(Composite):
    """``GPT(vocab_size, block_size, n_layer, n_head, n_embd, dropout=0.0, bias=True, dtype=None, device=None)``:
    nanoGPT's GPTConfig fields and defaults (block_size 1024, vocab_size 50304, n_layer 12, n_head 12,
    n_embd 768: GPT-2 small).

    ``forward(idx (B, T) int) -> logits (B, T, V)``, every position's; ``backward(dlogits) -> None`` (token ids have
    no gradient) fills every parameter's .grad.  ``generate(idx, max_new_tokens, temperature=1.0, top_k=None,
    generator=None)`` samples as nanoGPT's ``generate`` does, with a key/value cache.
    ``named_parameters()`` yields the tied matrix once, as ``transformer.wte.weight``; ``state_dict()`` also has
    ``lm_head.weight`` (the same tensor), as nanoGPT's.

    ``n_experts`` K > 0: every block's MLP is a mixture of K experts (layers/moe.py), each token sent to ``top_k`` of
    them, each expert taking at most ceil(``capacity_factor`` top_k N / K) of a forward's N tokens; the auxiliary
    load-balancing loss (Switch's, Mixtral's) enters the gradient with weight ``aux_coef``, and ``aux_loss()`` after a
    forward is that weight times the blocks' sum, the term a trainer adds to its loss.  K = 0: nanoGPT's dense MLP.
    """

    _saved_labels = {"x": "ln_f's output", "weight": "transformer.wte.weight"}

    class Saved(NamedTuple):
        x: Tensor  # (B, T, C) ln_f's output, for the output projection's dW
        weight: Tensor  # (V, C) the tied matrix, for dx: changed in place before backward (an optimizer step), refused

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
        for name, v in (
            ("vocab_size", vocab_size),
            ("block_size", block_size),
            ("n_layer", n_layer),
            ("n_head", n_head),
            ("n_embd", n_embd),
        ):
            check_int("GPT", name, v)
        check_number("GPT", "dropout", dropout, 0.0, 1.0, hi_open=True)
        check_bool("GPT", "bias", bias)
        self.moe = check_moe("GPT", n_experts, top_k, capacity_factor, aux_coef)
        self.vocab_size, self.block_size, self.n_layer = vocab_size, block_size, n_layer
        self.n_head, self.n_embd, self.dropout, self.bias = n_head, n_embd, float(dropout), bias
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        # nanoGPT's construction order (wte, wpe, drop, h, ln_f, lm_head), drawing what torch.nn's constructors draw
        self.wte = Embedding(vocab_size, n_embd, **kw)
        self.wpe = Embedding(block_size, n_embd, **kw)
        self.drop = Dropout(dropout)
        self.h = [Block(n_embd, n_head, dropout, bias, moe=self.moe, **kw) for _ in range(n_layer)]
        self.ln_f = LayerNorm(n_embd, bias=bias, **kw)
        lm_head = Linear(n_embd, vocab_size, bias=False, **kw)  # drawn and then tied: its draw sets wte's values
        self.wte.weight = lm_head.weight  # (V, C) one tensor for the embedding and the output
        self._init_weights()
        self._lay_out_flat()

    def _init_weights(self) -> None:
        """nanoGPT's ``self.apply(self._init_weights)`` (modules in its order: each Linear and Embedding N(0, 0.02),
        biases zero; the tied matrix drawn as wte and again as lm_head), then its residual projections."""
        with torch.no_grad():
            torch.nn.init.normal_(self.wte.weight, std=0.02)
            torch.nn.init.normal_(self.wpe.weight, std=0.02)
            residual = 0.02 / math.sqrt(2 * self.n_layer)
            for block in self.h:
                mlp = block.mlp
                linears = (block.attn.c_attn, block.attn.c_proj) + (
                    (mlp.c_fc, mlp.c_proj) if isinstance(mlp, MLP) else ()
                )
                for lin in linears:
                    torch.nn.init.normal_(lin.weight, std=0.02)
                    if lin.bias is not None:
                        lin.bias.zero_()
                if isinstance(mlp, MixtureOfExperts):  # as the dense MLP's: the router and c_fc's, c_proj's
                    for w in (mlp.router, mlp.w1, mlp.w2):
                        torch.nn.init.normal_(w, std=0.02)
                    mlp.b1.zero_()
                    mlp.b2.zero_()
            torch.nn.init.normal_(self.wte.weight, std=0.02)  # as lm_head
            for block in self.h:  # named_parameters order: attn.c_proj.weight, then mlp.c_proj.weight
                mlp = block.mlp
                for w in (block.attn.c_proj.weight, mlp.c_proj.weight if isinstance(mlp, MLP) else mlp.w2):
                    torch.nn.init.normal_(w, std=residual)

    def _lay_out_flat(self) -> None:
        """llm.c's ``params_memory`` and ``grads_memory``: every parameter becomes a view into one block -- the
        matrices first, then the vectors, so that each of nanoGPT's two optimizer groups (weight decay on the
        2-D tensors only) is one span -- and its gradient a view into a second block laid out alike (the gradient it
        had, copied in; one that has none, as a fresh model, gets its view at the first backward, ``_give_grads``).
        Identities are kept (``.data`` is re-pointed), so an optimizer built before still holds these tensors.  The
        optimizer and the gradient clip then update a span with one kernel instead of one per tensor
        (``kernels/optimizers.py``), with the same numbers; nothing else depends on the layout."""
        params = self.parameters()
        order = [p for p in params if p.dim() >= 2] + [p for p in params if p.dim() < 2]
        total = sum(p.numel() for p in order)
        weights = order[0].new_empty(total)
        self._grad_layout: list[tuple[Tensor, tuple[int, ...], int]] = []  # (parameter, strides, offset)
        offset = 0
        for p in order:  # each keeps its strides where it is dense (contiguous, or a transposed block)
            dense = p.is_contiguous() or (p.dim() == 2 and p.t().is_contiguous())
            stride = p.stride() if dense else torch.empty(p.shape, device="meta").stride()  # else row-major
            view = weights.as_strided(p.shape, stride, offset)
            view.copy_(p.data)
            p.data = view
            self._grad_layout.append((p, stride, offset))
            offset += p.numel()
        if any(p.grad is not None for p in order):
            self._give_grads(keep=True)

    def _give_grads(self, keep: bool = False) -> None:
        """A fresh zeroed gradient block laid out as the parameters; each parameter that has a gradient
        (``keep``) or wants one (``wants_grad``, at a backward where none has one) gets its view.  A frozen
        parameter's ``.grad`` is left as it is, as torch leaves it."""
        p0 = self._grad_layout[0][0]
        grads = p0.new_zeros(sum(p.numel() for p, _, _ in self._grad_layout))
        for p, stride, offset in self._grad_layout:
            g = grads.as_strided(p.shape, stride, offset)
            if keep and p.grad is not None:
                g.copy_(p.grad)
                p.grad = g
            elif not keep and wants_grad(p):
                p.grad = g

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        """Move/cast as every layer does, then lay the parameters out in one block again on the new device."""
        super().to(device, dtype)
        self._lay_out_flat()
        return self

    @property
    def recompute(self) -> bool:
        """llm.c's ``recompute``: True (the default) holds neither the LayerNorms' nor GELU's outputs from forward
        to backward and computes them again there (three (B, T, C)-sized tensors fewer held per block, one of them
        4C wide; models/recompute.py); False holds them, as torch's autograd does, and saves those passes.  The
        same gradients, bit for bit, either way."""
        return all(block.recompute for block in self.h)

    @recompute.setter
    def recompute(self, value: bool) -> None:
        check_bool("GPT", "recompute", value)
        for block in self.h:
            block.recompute = value

    def extra_repr(self) -> str:
        return (
            f"vocab_size={self.vocab_size}, block_size={self.block_size}, n_layer={self.n_layer}, "
            f"n_head={self.n_head}, n_embd={self.n_embd}, dropout={self.dropout}, bias={self.bias}"
            + "".join(f", {k}={v}" for k, v in (self.moe or {}).items())
        )

    def named_children(self) -> Iterator[tuple[str, BaseLayer]]:
        yield "transformer.wte", self.wte
        yield "transformer.wpe", self.wpe
        yield "transformer.drop", self.drop
        for i, block in enumerate(self.h):
            yield f"transformer.h.{i}", block
        yield "transformer.ln_f", self.ln_f

    def state_dict(self, prefix: str = "") -> dict[str, Tensor]:
        sd = super().state_dict(prefix)
        sd[prefix + "lm_head.weight"] = self.wte.weight.detach()  # the tied matrix under its second name, as nanoGPT's
        return sd

    def load_state_dict(self, state_dict: Mapping[str, Tensor], strict: bool = True):
        """nanoGPT's keys; ``lm_head.weight`` must be the very values of ``transformer.wte.weight`` (they are tied).
        Returns torch's ``_IncompatibleKeys(missing_keys, unexpected_keys)``."""
        lm, wte = state_dict.get("lm_head.weight"), state_dict.get("transformer.wte.weight")
        if (
            lm is not None
            and wte is not None
            and isinstance(lm, Tensor)
            and isinstance(wte, Tensor)
            and lm.shape == wte.shape
            and not torch.equal(lm, wte)
        ):
            raise ValueError(
                "GPT.load_state_dict: 'lm_head.weight' differs from 'transformer.wte.weight'; this GPT "
                "ties them (one tensor), so they must be equal"
            )
        return super().load_state_dict(state_dict, strict)

    def config(self) -> dict:
        """The constructor arguments (nanoGPT's GPTConfig fields)."""
        return {
            "vocab_size": self.vocab_size,
            "block_size": self.block_size,
            "n_layer": self.n_layer,
            "n_head": self.n_head,
            "n_embd": self.n_embd,
            "dropout": self.dropout,
            "bias": self.bias,
            **(self.moe or {}),
        }

    def aux_loss(self) -> Tensor | None:
        """After a forward: aux_coef times the blocks' auxiliary load-balancing losses summed, the term the gradient
        includes (None for the dense GPT)."""
        if self.moe is None:
            return None
        terms = [cast(MixtureOfExperts, block.mlp).aux_loss for block in self.h]
        return self.moe["aux_coef"] * cast(Tensor, sum(cast(list[Tensor], terms)))

    def to_torch(self) -> torch.nn.Module:
        """The nn.Module twin (``models.PytorchGPT``) holding a copy of these weights, in the same mode."""
        from .torch_gpt import PytorchGPT

        with _rng_untouched(self.wte.weight.device):
            twin = PytorchGPT(**self.config(), dtype=self.wte.weight.dtype, device=self.wte.weight.device)
        twin.load_state_dict(self.state_dict())
        return copy_requires_grad(self, twin).train(self.training)

    @classmethod
    def from_torch(cls, module: torch.nn.Module) -> GPT:
        """The hand-written GPT holding a copy of a ``PytorchGPT``'s weights (for nanoGPT's own model, build a GPT
        with its config and ``load_state_dict(model.state_dict())``)."""
        from .torch_gpt import PytorchGPT

        if not isinstance(module, PytorchGPT):
            raise TypeError(f"GPT.from_torch: expected a models.PytorchGPT, got {type(module).__name__}")
        w: Tensor = module.transformer.wte.weight  # type: ignore[union-attr, assignment]  # (an nn.ModuleDict's entry)
        with _rng_untouched(w.device):
            gpt = cls(**module.config(), dtype=w.dtype, device=w.device)
        gpt.load_state_dict(module.state_dict())
        return copy_requires_grad(module, gpt).train(module.training)

    # -- forward and backward -------------------------------------------------------------------------------

    def __call__(self, idx: Tensor) -> Tensor:
        return self.forward(idx)

    def check_input(self, idx: object) -> None:
        if not (isinstance(idx, Tensor) and idx.dim() == 2):
            raise ValueError(
                f"GPT: idx must be a (B, T) tensor of token ids, got "
                f"{tuple(idx.shape) if isinstance(idx, Tensor) else type(idx).__name__}"
            )
        T = idx.shape[1]
        if T == 0:
            raise ValueError(f"GPT: idx has shape {tuple(idx.shape)}: a sequence needs at least one position (T >= 1)")
        if self.block_size < T:
            raise ValueError(f"GPT: cannot forward a sequence of length {T}: block_size is only {self.block_size}")

    def check_dout(self, grads: tuple, meta, saved) -> None:
        dlogits = grads[0]
        if meta is None:
            raise RuntimeError(f"GPT: {BEFORE_FORWARD}")
        if not isinstance(dlogits, Tensor) or dlogits.shape != meta[0]:
            raise ValueError(
                f"GPT: dlogits has shape {tuple(getattr(dlogits, 'shape', ()))} but the logits had "
                f"shape {tuple(meta[0])}"
            )

    def forward_math(self, idx: Tensor):
        """idx (B, T) integer token ids, T <= block_size -> logits (B, T, V)."""
        pos = torch.arange(idx.shape[1], device=idx.device)  # (T,)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)  # (B, T, C)
        w = self.wte.weight  # (V, C)
        return x @ w.t(), self.Saved(x, w)  # (B, T, V) logits = ln_f(x) @ wte^T

    def backward_math(self, dlogits: Tensor, saved: Saved) -> None:
        """dlogits (B, T, V) -> None; every parameter's gradient added into its .grad, the tied matrix's from both
        of its uses.  (Token ids have no gradient: under the B/W split the GPT's B returns None and leaves all of
        its work on the weights to W; a pipeline stage that ends inside the GPT uses the blocks' own B and W.)"""
        if all(p.grad is None for p, _, _ in self._grad_layout):  # as after zero_grad(): the gradients laid out in
            self._give_grads()  # one block again (the layers add into the zeroed views, the same numbers)
        x, w = saved.x, saved.weight  # (B, T, C), (V, C)
        d2 = dlogits.reshape(-1, self.vocab_size)  # (B*T, V)
        # the output projection's share of the tied matrix: dW = dlogits^T @ ln_f(x), first, as in W; into the
        # parameter the layer holds now (as the base adds a layer's own: as_module binds an alias for each pass)
        self.later(add_product, self.wte.weight, d2.t(), x.reshape(-1, self.n_embd))
        dx = self.back(self.ln_f, (d2 @ w).view_as(x))  # (B, T, C)
        for block in reversed(self.h):
            dx = self.back(block, dx)
        dx = self.drop.backward(dx)
        self.back(self.wpe, dx.sum(0))  # (T, C): every sequence of the batch used positions 0..T-1
        self.back(self.wte, dx)  # the embedding's share of the tied matrix: the scatter-add, into the same .grad
        return None

    # -- sampling --------------------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """idx (B, t) -> (B, t + max_new_tokens): nanoGPT's sampling, step for step -- the last position's logits
        / temperature, top-k by setting the rest to -inf, softmax, one ``torch.multinomial`` on ``generator`` (torch's
        default if None) -- with a key/value cache, so a new token costs one position's work.  Past block_size
        the window slides as nanoGPT's does: the positions shift, so the cache is rebuilt for the new window.
        Call it in eval mode (dropout off), as nanoGPT says of its own."""
        check_sampling("GPT.generate", idx, max_new_tokens, temperature, top_k, self.vocab_size)
        cache = KVCache(self)
        logits = None
        for n in range(max_new_tokens):
            if logits is None:  # the first step, or the window slid: positions shift, recompute the window
                logits = cache.prefill(idx[:, -self.block_size :])  # (B, V) the window's last position
            idx_next = next_token(logits, temperature, top_k=top_k, generator=generator)  # (B, 1)
            idx = torch.cat((idx, idx_next), dim=1)
            if n + 1 < max_new_tokens:
                # one position's work while the window has room; else the window slides at the next step
                logits = cache.step(idx_next) if cache.length < self.block_size else None  # (B, V)
        return idx

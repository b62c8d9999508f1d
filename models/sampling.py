"""Sampling from a language model's logits, nanoGPT's way, and generation with a recurrent model's state.

``next_token`` is one step of nanoGPT's ``generate``: the logits / temperature, top-k by setting the rest to -inf,
softmax, one ``torch.multinomial`` on ``generator`` (torch's default if None).  ``generate_recurrent`` runs a
recurrent language model (``forward(idx, state) -> (logits, state)``) over the prompt once, then one position per
new token, carrying the state: the recurrent counterpart of the GPT's key/value cache (and it has no window to
slide: the state summarises everything before).
"""

from __future__ import annotations

import torch
from torch import Tensor

from layers.checks import check_int, check_number


def check_sampling(owner: str, idx, max_new_tokens, temperature, top_k, vocab_size: int | None = None) -> None:
    """Every argument of a ``generate``: a clear ValueError naming the first that is wrong (with ``vocab_size``,
    also a prompt token outside 0..vocab_size-1)."""
    check_int(owner, "max_new_tokens", max_new_tokens, lo=0)
    check_number(owner, "temperature", temperature, 0.0, lo_open=True)  # > 0
    if top_k is not None:
        check_int(owner, "top_k", top_k)
    if not (isinstance(idx, Tensor) and idx.dim() == 2 and idx.shape[1] >= 1):
        raise ValueError(
            f"{owner}: idx must be a (B, t) tensor of token ids with t >= 1, got "
            f"{tuple(idx.shape) if isinstance(idx, Tensor) else type(idx).__name__}"
        )
    if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
        raise ValueError(f"{owner}: idx must hold integer token ids, got dtype {idx.dtype}")
    if vocab_size is not None and idx.numel():
        lo, hi = idx.min().item(), idx.max().item()
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{owner}: the prompt holds token id {bad}, outside the vocabulary 0..{vocab_size - 1}")


def next_token(
    logits: Tensor, temperature: float = 1.0, *, top_k: int | None = None, generator: torch.Generator | None = None
) -> Tensor:
    """logits (B, V) of the last position -> the next token ids (B, 1), drawn as nanoGPT draws them."""
    logits = logits / temperature
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits[logits < v[:, [-1]]] = -float("inf")
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)


@torch.no_grad()
def generate_recurrent(
    model,
    idx: Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    *,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """idx (B, t) -> (B, t + max_new_tokens) from a recurrent language model, each new token one position's work."""
    check_sampling(
        f"{type(model).__name__}.generate", idx, max_new_tokens, temperature, top_k, getattr(model, "vocab_size", None)
    )
    logits, state = model(idx)  # the prompt, from a zero state
    for n in range(max_new_tokens):
        nxt = next_token(logits[:, -1], temperature, top_k=top_k, generator=generator)  # (B, 1)
        idx = torch.cat((idx, nxt), dim=1)
        if n + 1 < max_new_tokens:
            logits, state = model(nxt, state)  # (B, 1, V): one step from the carried state
    return idx

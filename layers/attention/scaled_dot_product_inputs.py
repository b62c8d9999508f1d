"""ScaledDotProductAttention's inputs: F.scaled_dot_product_attention's rules for query, key, value and the mask, each
failure one error naming the value, and the mask turned into what the math takes (``blocked``, ``bias``)."""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor

from ..checks import LOW_PRECISION, check_bool, check_tensor

OWNER = "scaled_dot_product_attention"  # the errors name torch's function, whose twin the layer is


def check_qkv(q: object, k: object, v: object) -> tuple[tuple[int, ...], int, int, int, int]:
    """-> (the leading axes *, L, S, E, Ev)."""
    for name, t in (("query", q), ("key", k), ("value", v)):
        t = check_tensor(OWNER, name, t)
        if not t.is_floating_point() or t.dim() < 2:
            raise ValueError(
                f"{OWNER}: {name} must be a floating-point tensor of shape (*, length, size), "
                f"got {t.dtype} of shape {tuple(t.shape)}"
            )
    q, k, v = cast(Tensor, q), cast(Tensor, k), cast(Tensor, v)  # each checked above
    if not (q.dtype == k.dtype == v.dtype and q.device == k.device == v.device):
        raise ValueError(
            f"{OWNER}: query, key and value must share dtype and device, got "
            f"{q.dtype}/{k.dtype}/{v.dtype} on {q.device}/{k.device}/{v.device}"
        )
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]) or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"{OWNER}: expected query (*, L, E), key (*, S, E), value (*, S, Ev) with the same "
            f"leading axes, got query {tuple(q.shape)}, key {tuple(k.shape)}, value {tuple(v.shape)}"
        )
    return tuple(q.shape[:-2]), q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]


def check_mask(mask: object, q: Tensor, lead: tuple, L: int, S: int, *, is_causal: bool) -> None:
    """Refuse a mask torch's function would refuse: boolean (True = may attend) or of the query's dtype, on its
    device, broadcasting to the scores' shape (*, L, S); not with is_causal."""
    check_bool(OWNER, "is_causal", is_causal)
    if mask is None:
        return
    if is_causal:
        raise ValueError(f"{OWNER}: pass either attn_mask or is_causal=True, not both (as torch refuses)")
    mask = check_tensor(OWNER, "attn_mask", mask)
    if mask.dtype != torch.bool and mask.dtype != q.dtype:
        raise ValueError(
            f"{OWNER}: attn_mask must be boolean (True = may attend) or of the query's dtype "
            f"{q.dtype} (added to the scores), got {mask.dtype}"
        )
    if mask.device != q.device:
        raise ValueError(f"{OWNER}: attn_mask is on {mask.device} but query is on {q.device}")
    full = (*lead, L, S)
    try:
        ok = mask.dim() <= len(full) and torch.broadcast_shapes(mask.shape, full) == full
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"{OWNER}: attn_mask of shape {tuple(mask.shape)} does not broadcast to the scores' shape {full} (*, L, S)"
        )


def mask_parts(mask: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """A checked mask -> (blocked: bool, True where a query may NOT attend, or None; bias: float, added, or None)."""
    if mask is None:
        return None, None
    if mask.dtype == torch.bool:
        return mask.logical_not(), None
    if mask.dtype in LOW_PRECISION:
        mask = mask.float()
    return None, mask

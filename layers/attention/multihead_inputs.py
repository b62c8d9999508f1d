"""MultiheadAttention's inputs: torch's shape rules for query, key, value and the masks, each failure one error naming
the shapes, and the masks turned into the one mask the attention takes over (N, H, L, S)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..checks import check_tensor


def check_inputs(self, query, key, value, kpm, attn_mask) -> bool:
    """``self``: the MultiheadAttention.  torch's shape rules (``_mha_shape_check``), each failure one error naming
    the shapes; -> batched."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        t = check_tensor(repr(self), name, t)
        if not t.is_floating_point():
            raise ValueError(f"{self!r}: {name} must be floating point, got {t.dtype}")
    w = self.out_proj.weight
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dtype != w.dtype or t.device != w.device:
            raise ValueError(
                f"{self!r}: {name} is {t.dtype} on {t.device} but the parameters are {w.dtype} on "
                f"{w.device}; convert one of them"
            )
    if query.dim() not in (2, 3) or key.dim() != query.dim() or value.dim() != query.dim():
        raise ValueError(
            f"{self!r}: expected query, key and value all 3-D (batched) or all 2-D (unbatched), "
            f"got {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    batched = query.dim() == 3
    if batched:
        n_axis, t_axis = (0, 1) if self.batch_first else (1, 0)
        layout = "(N, L, E)" if self.batch_first else "(L, N, E)"
        N = query.shape[n_axis]
        ok = key.shape[n_axis] == N and value.shape[n_axis] == N and key.shape[t_axis] == value.shape[t_axis]
    else:
        layout, ok, N = "(L, E)", key.shape[0] == value.shape[0], None
        t_axis = 0
    sizes = (query.shape[-1], key.shape[-1], value.shape[-1])
    if not ok or sizes != (self.embed_dim, self.kdim, self.vdim):
        raise ValueError(
            f"{self!r}: expected query {layout} with E={self.embed_dim}, key and value of one "
            f"batch and length with {self.kdim} and {self.vdim} features; got query "
            f"{tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
        )
    L, S = query.shape[t_axis], key.shape[t_axis]
    if kpm is not None:
        kpm = check_tensor(repr(self), "key_padding_mask", kpm)
        want = (N, S) if batched else (S,)
        if tuple(kpm.shape) != want:
            raise ValueError(
                f"{self!r}: key_padding_mask must have shape {'(N, S)' if batched else '(S,)'} = "
                f"{want} ({'batch, ' if batched else ''}source length), got {tuple(kpm.shape)}"
            )
        check_mask_dtype(self, "key_padding_mask", kpm, query.dtype)
    if attn_mask is not None:
        attn_mask = check_tensor(repr(self), "attn_mask", attn_mask)
        wants = [(L, S)] + ([(N * self.num_heads, L, S)] if batched else [(self.num_heads, L, S)])
        if tuple(attn_mask.shape) not in wants:
            raise ValueError(
                f"{self!r}: attn_mask must have shape {' or '.join(map(str, wants))}, got {tuple(attn_mask.shape)}"
            )
        check_mask_dtype(self, "attn_mask", attn_mask, query.dtype)
    return batched


def check_mask_dtype(layer, name: str, mask: Tensor, dtype: torch.dtype) -> None:
    if mask.dtype != torch.bool and mask.dtype != dtype:
        raise ValueError(
            f"{layer!r}: {name} must be boolean (True = may NOT attend) or of the query's dtype "
            f"{dtype} (added to the scores), got {mask.dtype}"
        )
    if mask.device != layer.out_proj.weight.device:
        raise ValueError(
            f"{layer!r}: {name} is on {mask.device} but the parameters are on {layer.out_proj.weight.device}"
        )


def masks(
    attn_mask: Tensor | None, kpm: Tensor | None, N: int, H: int, L: int, S: int, extra: int, dtype: torch.dtype
) -> Tensor | None:
    """nn.MultiheadAttention's masks -> one mask for the attention over (N, H, L, S + extra), in the polarity of
    F.scaled_dot_product_attention: boolean masks (True = may NOT attend here) become a boolean True = may attend,
    float ones are summed, and both kinds together become one float mask, -inf where blocked; the appended keys
    (bias_k, the zero key) are never masked (torch pads its masks with zeros)."""
    blocked: list[Tensor] = []
    bias: list[Tensor] = []
    if attn_mask is not None:
        m = (
            attn_mask.view(1, 1, L, S)
            if attn_mask.dim() == 2
            else attn_mask.view(N, H, L, S)
            if attn_mask.shape[0] == N * H
            else attn_mask.view(1, H, L, S)
        )
        (blocked if m.dtype == torch.bool else bias).append(m)
    if kpm is not None:
        m = kpm.view(N, 1, 1, S)
        (blocked if m.dtype == torch.bool else bias).append(m)
    pad = lambda m: m if not extra else torch.nn.functional.pad(m, (0, extra))  # noqa: E731  (False / 0.0)
    out_blocked = None
    if blocked:
        out_blocked = pad(blocked[0] if len(blocked) == 1 else blocked[0] | blocked[1])
    if not bias:
        return None if out_blocked is None else out_blocked.logical_not()
    out_bias = pad((bias[0] if len(bias) == 1 else bias[0] + bias[1]).to(dtype))
    return out_bias if out_blocked is None else torch.where(out_blocked, -math.inf, out_bias)

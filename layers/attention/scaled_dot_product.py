"""Scaled dot-product attention by hand: the (L, S) scores and probabilities, and their backward.

Shape legend (torch's F.scaled_dot_product_attention):
    * = any leading batch/head axes, flattened here into B rows of independent attention problems,
    L = query length (target), S = key/value length (source), E = query/key size, Ev = value size.

Attention is the only layer of a transformer that mixes information across time: every query row l
takes a weighted mean of the value rows, weighted by the softmax of its scores against every key (llm.c keeps
``preatt`` and ``att``, two (L, S) buffers per head):

    preatt = scale * q @ k^T + bias      (L, S)   bias: the masks, 0 where allowed, -inf where not
    P      = softmax(preatt) per row      (L, S)   a row with every key masked: zeros (torch 2.14's function's choice)
    att    = P * dropout mask             (L, S)
    out    = att @ v                      (L, Ev)

and backward, through each of those four lines from the last:

    out = att @ v:          datt = dout @ v^T,  dv = att^T @ dout
    att = P * mask:         dP = datt * mask
    P = softmax(preatt):    dpreatt = P * (dP - rowsum(dP * P))      (the softmax's Jacobian, row by row)
    preatt = scale q k^T:   dq = scale * dpreatt @ k,  dk = scale * dpreatt^T @ q

That is this layer's textbook.  The kernel (kernels/attention.py, FlashAttention's way) computes the same numbers
holding at most one (L, block) slab of scores: keys in blocks, an online softmax, each row's log-sum-exp kept
instead of P, and rowsum(dP * P) replaced by D = rowsum(dout * out).

Masks, as torch's function takes them: a boolean ``attn_mask`` is True where a query MAY attend (the
opposite of nn.MultiheadAttention's), a float one is added to the scores; both broadcast to (*, L, S).
``is_causal`` lets query l see keys s <= l (top-left aligned when L != S, as torch).  A row whose keys are all
masked gives zeros and zero gradients, as torch 2.14's function does (its softmax would be 0/0).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
from torch import Tensor

import kernels
from kernels import attention

from ..checks import LOW_PRECISION, check_int, check_number, check_probability, check_tensor
from ..layer import BaseLayer
from .dropout import attention_dropout_mask, draw_seed
from .scaled_dot_product_inputs import OWNER, check_mask, check_qkv, mask_parts

DEFAULT_BLOCK_SIZE = 128  # the kernel's keys per block: large enough for efficient products, small enough that a
# causal pass skips most of what it need not compute (benchmarks/attention.py --block compares sizes)


class ScaledDotProductAttention(BaseLayer):
    """``F.scaled_dot_product_attention`` with a hand-written, memory-efficient backward.

    ``forward(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
    need_weights=False)``: query (*, L, E), key (*, S, E), value (*, S, Ev) -> out (*, L, Ev); with
    ``need_weights=True`` -> (out, weights), the attention weights A (*, L, S) after dropout (materialised
    from the kept log-sum-exps, one dense pass, for a caller that asked to see them).
    ``backward(dout, dweights=None)`` -> (dquery, dkey, dvalue).  ``dweights`` (only with need_weights)
    adds a gradient flowing into the returned weights.

    Dropout (``dropout_p > 0``: the function applies it whenever asked, as torch's does; a module passes 0
    in eval mode) draws one seed per forward from ``generator`` (default torch's CPU generator) and drops
    the weights ``layers.attention.dropout`` says, regenerating each block's mask in backward.
    ``block_size``: the kernel's keys per block (default 128); any value gives the same result up to rounding.
    float16/bfloat16 inputs are computed in float32 and the results rounded once.

    ``keep_out=False`` (a keyword of the forward): the output is not held for backward, which then needs it back
    as ``backward(dout, out=...)`` (a caller that keeps the same values in another layout anyway: the GPT's heads
    side by side).

    Kept from forward to backward (``Saved``): query, key and value (views of them where no cast or copy was
    needed), the output and the weights it returned (views of its own, where no cast was needed), and the masks;
    changing any in place in between (``out += x``) is refused, as torch.autograd refuses it (layers/saved.py).
    """

    class Saved(NamedTuple):
        spec: attention.Spec  # sizes, scale, masks, causality, dropout, the kernel's block size
        q: Tensor  # (B, L, E) in the compute dtype, or the query itself (B, H, L, E) where the C++ kernel ran on it
        k: Tensor  # (B, S, E) (or (B, H, S, E), as q)
        v: Tensor  # (B, S, Ev) (or (B, H, S, Ev))
        out: Tensor | None  # (B, L, Ev) (or (B, H, L, Ev)); None with keep_out=False (the caller gives it back)
        P: Tensor | None  # (B, L, S) the softmax (the textbook's; None from the kernel)
        att: Tensor | None  # (B, L, S) P after dropout (the textbook's)
        lse: Tensor | None  # (B, L, 1) (or (B, H, L, 1)) each row's base-2 log-sum-exp (the kernel's; None from the
        # textbook)
        weights: Tensor | None  # (B, L, S) the weights returned with need_weights, else None
        blocked: Tensor | None  # spec's boolean mask (True: may NOT attend), kept here to be version-checked
        bias: Tensor | None  # spec's float mask, likewise
        dtype: torch.dtype  # the inputs' dtype: the gradients' own
        q_shape: torch.Size  # query's shape (*, L, E)
        k_shape: torch.Size  # key's (*, S, E)
        v_shape: torch.Size  # value's (*, S, Ev)

    _saved_labels = {
        "q": "its input query",
        "k": "its input key",
        "v": "its input value",
        "weights": "its returned weights",
        "lse": "its log-sum-exp",
        "P": "its probabilities",
        "att": "its weights after dropout",
        "blocked": "its attention mask (blocked positions)",
        "bias": "its attention mask (added to the scores)",
    }

    def __init__(self, block_size: int | None = None, generator: torch.Generator | None = None) -> None:
        self.block_size = (
            DEFAULT_BLOCK_SIZE
            if block_size is None
            else check_int("ScaledDotProductAttention", "block_size", block_size)
        )
        self.generator = generator

    def extra_repr(self) -> str:
        return f"block_size={self.block_size}"

    # -- forward ------------------------------------------------------------------------------------------

    def check_input(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attn_mask: Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        need_weights: bool = False,
        *,
        keep_out: bool = True,
    ) -> None:
        """torch's rules for query, key, value and the mask (scaled_dot_product_inputs.py), dropout_p and scale."""
        lead, L, S, E, Ev = check_qkv(query, key, value)
        check_mask(attn_mask, query, lead, L, S, is_causal=is_causal)
        check_probability(OWNER, "dropout_p (the probability of dropping a weight)", dropout_p)
        if scale is not None:
            check_number(OWNER, "scale", scale)

    def forward_math(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attn_mask: Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        need_weights: bool = False,
        *,
        keep_out: bool = True,
    ):
        """query (*, L, E), key (*, S, E), value (*, S, Ev) -> (out (*, L, Ev) [, weights (*, L, S)]), Saved."""
        lead, L, S, E, Ev = tuple(query.shape[:-2]), query.shape[-2], key.shape[-2], query.shape[-1], value.shape[-1]
        blocked, bias = mask_parts(attn_mask)
        B = math.prod(lead)
        dtype = query.dtype
        cdt = torch.float32 if dtype in LOW_PRECISION else dtype  # compute dtype
        drop = None
        if dropout_p > 0.0:  # a block of the (B, L, S) mask from its coordinates alone (layers/attention/dropout.py)
            drop = functools.partial(_dropout_block, draw_seed(self.generator), float(dropout_p), B, L, S)
        spec = attention.Spec(
            lead=lead,
            L=L,
            S=S,
            scale=1.0 / math.sqrt(E) if scale is None else scale,
            blocked=blocked,
            bias=bias,
            causal=is_causal,
            drop=drop,
            block=self.block_size,
        )
        cpp_heads = len(lead) == 2 and kernels.enabled()
        if cpp_heads and attention.runs_cpp(spec, query, key, value, need_weights=need_weights):
            # (B, H, L, E) as they come: the C++ kernel reads the heads' strided views (the GPT's, of one (B, T, 3C)
            # projection) where flattening (B, H) into one axis would copy them, and writes its output with the
            # heads side by side, (B, L, H, Ev) in memory, where theirs are so
            q, k, v = query, key, value
        else:
            q = query.reshape(B, L, E).to(cdt)  # (B, L, E): views when contiguous and not half
            k = key.reshape(B, S, E).to(cdt)  # (B, S, E)
            v = value.reshape(B, S, Ev).to(cdt)  # (B, S, Ev)
        if kernels.enabled():  # keys in blocks, an online softmax, no (L, S) matrix kept: kernels/attention.py
            out, lse, weights = attention.forward(q, k, v, spec, need_weights=need_weights)
            P = att = None
        else:
            out, P, att = attention_forward(q, k, v, spec)  # (B, L, Ev), (B, L, S) x2
            lse, weights = None, (att if need_weights else None)
        saved = self.Saved(
            spec,
            q,
            k,
            v,
            out if keep_out else None,
            P,
            att,
            lse,
            weights,
            blocked,
            bias,
            dtype,
            query.shape,
            key.shape,
            value.shape,
        )
        out = out.view(*lead, L, Ev).to(dtype)
        if not need_weights:
            return out, saved
        return (out, weights.view(*lead, L, S).to(dtype)), saved  # type: ignore[union-attr]  # (need_weights)

    def masked_rows(self) -> Tensor:
        """After a forward: bool (*, L, 1), True for the query rows whose keys were all masked."""
        if self.kept is None:
            raise RuntimeError(f"{self!r}: masked_rows() needs a forward first")
        spec, lse, P = self.kept.spec, self.kept.lse, self.kept.P
        empty = lse.isinf() if lse is not None else P.sum(-1, keepdim=True) == 0  # (B, L, 1)
        return empty.view(*spec.lead, spec.L, 1)

    # -- backward -----------------------------------------------------------------------------------------

    def check_dout(self, grads: tuple, meta, saved) -> None:
        """dout, the output's gradient (and dweights, the returned weights', checked by the math)."""
        if meta is True:  # the forward returned (out, weights): dout is the output's
            meta = (torch.Size((*saved.spec.lead, saved.spec.L, saved.v.shape[-1])), saved.dtype, saved.q.device)
        super().check_dout(grads[:1], meta, saved)

    def backward_math(
        self,
        dout: Tensor,
        saved: Saved,
        dweights: Tensor | None = None,
        out: Tensor | None = None,
        into: tuple[Tensor, Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """dout (*, L, Ev) [, dweights (*, L, S)] -> (dquery (*, L, E), dkey (*, S, E), dvalue (*, S, Ev)): the
        module docstring's backward.  ``out``: the forward's output, given back when the forward did not keep it
        (``keep_out=False``).  ``into``: three tensors shaped and typed as query, key and value that the gradients
        are written into and returned as (the C++ kernel writes them there; any other path copies them in): the
        GPT's views of c_attn's output gradient, assembled with no copy."""
        spec, q, k, v, kept, weights, dtype = (
            saved.spec,
            saved.q,
            saved.k,
            saved.v,
            saved.out,
            saved.weights,
            saved.dtype,
        )
        lead, L, S = spec.lead, spec.L, spec.S
        out_shape = dout.shape
        if (kept is None) != (out is not None):
            raise ValueError(
                f"{self!r}: "
                + (
                    "the forward did not keep its output (keep_out=False); pass it back as backward(dout, out=...)"
                    if kept is None
                    else "backward got out=, but the forward kept its own output"
                )
            )
        if out is not None and not (isinstance(out, Tensor) and out.shape == out_shape and out.dtype == dtype):
            raise ValueError(
                f"{self!r}: out= must be the forward's output, of shape {tuple(out_shape)} and dtype "
                f"{dtype}; got {tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__}"
            )
        if into is not None:
            shapes = (saved.q_shape, saved.k_shape, saved.v_shape)
            if not (
                isinstance(into, tuple)
                and len(into) == 3
                and all(
                    isinstance(t, Tensor) and t.shape == s and t.dtype == dtype
                    for t, s in zip(into, shapes, strict=True)
                )
            ):
                raise ValueError(
                    f"{self!r}: into= must be three tensors shaped as query, key and value, "
                    f"{[tuple(s) for s in shapes]}, of dtype {dtype}"
                )
        if dweights is not None:
            if weights is None:
                raise ValueError(f"{self!r}: dweights given, but the forward returned no weights (need_weights=False)")
            dweights = check_tensor(repr(self), "dweights", dweights)
            if dweights.shape != (*lead, L, S) or dweights.dtype != dtype:
                raise ValueError(
                    f"{self!r}: dweights has shape {tuple(dweights.shape)} and dtype {dweights.dtype}, "
                    f"expected {(*lead, L, S)} and {dtype} (the weights' own)"
                )
        B, Ev = q.shape[0], v.shape[-1]
        rows = (*q.shape[:-2], L)  # (B, L) or, the C++ kernel's forward on (B, H, L, E), (B, H, L)
        do = dout.reshape(*rows, Ev).to(q.dtype)  # (B, L, Ev) (a view where dout is (B, H, L, Ev) itself)
        dw = None if dweights is None else dweights.reshape(B, L, S).to(q.dtype)  # (B, L, S)
        if saved.lse is not None:  # the kernel's forward ran: its backward (kernels/attention.py)
            out = kept if out is None else out.to(q.dtype).reshape(*rows, Ev)  # (B, L, Ev)
            D = attention.row_dot(do, out)  # type: ignore[arg-type]  # (B, L, 1) rowsum(dout * out) = rowsum(dP * P)
            if dw is not None:
                # the weights' own gradient joins dA: + rowsum(dW * A)
                D.add_((dw * weights).sum(-1, keepdim=True))  # type: ignore[operator]  # (kept where dw is given)
            written = into if into is not None and q.dtype == dtype else None  # (the kernel writes its own dtype)
            grads = attention.backward(q, k, v, do, dw, D, saved.lse, spec, into=written)
            if written is not None and grads is written:
                return written  # the C++ kernel wrote them there
            dq, dk, dv = grads
        else:
            # (the textbook's forward kept P and att)
            dq, dk, dv = attention_backward(do, dw, q, k, v, saved.P, saved.att, spec)  # type: ignore[arg-type]
        dq, dk, dv = dq.view(saved.q_shape), dk.view(saved.k_shape), dv.view(saved.v_shape)
        if into is not None:
            for buffer, d in zip(into, (dq, dk, dv), strict=True):
                buffer.copy_(d)  # (and cast)
            return into
        return dq.to(dtype), dk.to(dtype), dv.to(dtype)


def attention_forward(q: Tensor, k: Tensor, v: Tensor, spec: attention.Spec) -> tuple[Tensor, Tensor, Tensor]:
    """q (B, L, E), k (B, S, E), v (B, S, Ev) -> out (B, L, Ev), P and att (B, L, S): the module docstring's
    forward, holding the (L, S) matrices."""
    preatt = q @ k.transpose(1, 2) * spec.scale + attention_bias(spec, q)  # (B, L, S)
    rowmax = preatt.amax(-1, keepdim=True)  # subtract the row max: exp cannot overflow
    rowmax = torch.where(rowmax == -math.inf, 0.0, rowmax)  # a fully masked row: exp(-inf - 0) = 0, not nan
    e = torch.exp(preatt - rowmax)  # (B, L, S)
    total = e.sum(-1, keepdim=True)
    P = e / torch.where(total == 0, 1.0, total)  # (B, L, S) the softmax; zeros where every key is masked
    att = P if spec.drop is None else P * spec.dropout(0, 0, spec.S, P)  # (B, L, S)
    out = att @ v  # (B, L, Ev)
    return out, P, att


def attention_bias(spec: attention.Spec, like: Tensor) -> Tensor:
    """The masks as one additive bias (B, L, S), as torch's documentation writes its reference: 0 where query l
    may attend key s, -inf where not (``is_causal``: where s > l; a boolean mask: where it says so), plus a float
    mask."""
    bias = torch.zeros(*spec.lead, spec.L, spec.S, dtype=like.dtype, device=like.device)  # (*, L, S)
    if spec.causal:
        bias.masked_fill_(torch.ones(spec.L, spec.S, dtype=torch.bool, device=like.device).triu(1), -math.inf)
    if spec.blocked is not None:
        bias.masked_fill_(spec.blocked, -math.inf)
    if spec.bias is not None:
        bias = bias + spec.bias
    return bias.reshape(-1, spec.L, spec.S)  # (B, L, S)


def attention_backward(
    dout: Tensor, dweights: Tensor | None, q: Tensor, k: Tensor, v: Tensor, P: Tensor, att: Tensor, spec: attention.Spec
) -> tuple[Tensor, Tensor, Tensor]:
    """dout (B, L, Ev), dweights (B, L, S) or None -> dq (B, L, E), dk (B, S, E), dv (B, S, Ev): back through
    ``attention_forward``, the module docstring's backward."""
    datt = dout @ v.transpose(1, 2)  # (B, L, S)
    if dweights is not None:
        datt = datt + dweights  # the returned weights' own gradient
    dv = att.transpose(1, 2) @ dout  # (B, S, Ev)
    dP = datt if spec.drop is None else datt * spec.dropout(0, 0, spec.S, P)  # through the dropout mask
    dpreatt = P * (dP - (dP * P).sum(-1, keepdim=True))  # (B, L, S): the softmax's Jacobian, row by row
    dq = dpreatt @ k * spec.scale  # (B, L, E)
    dk = dpreatt.transpose(1, 2) @ q * spec.scale  # (B, S, E)
    return dq, dk, dv


def _dropout_block(
    seed: int,
    p: float,
    batch: int,
    rows: int,
    cols: int,
    row_range: tuple[int, int],
    col_range: tuple[int, int],
    dtype: torch.dtype,
    device: torch.device,
) -> Tensor:
    """A block of the scaled dropout mask of the (batch, rows, cols) weights (layers/attention/dropout.py)."""
    return attention_dropout_mask(
        seed, p, batch, rows, cols, row_range=row_range, col_range=col_range, dtype=dtype, device=device
    )

"""Scaled dot-product attention by hand, FlashAttention's way: keys in blocks, an online softmax, no (L, S) matrix.

Shape legend (torch's F.scaled_dot_product_attention):
    * = any leading batch/head axes, flattened here into B rows of independent attention problems,
    L = query length (target), S = key/value length (source), E = query/key size, Ev = value size,
    Bc = keys per block (``block_size``).

Attention is the only layer of a transformer that mixes information across time: every query row l
takes a weighted mean of the value rows, weighted by the softmax of its scores against every key,

    scores = scale * q @ k^T + bias        (L, S)   bias: the masks, 0 where allowed, -inf where not
    P      = softmax(scores) per row        (L, S)
    A      = P * dropout mask               (L, S)
    out    = A @ v                          (L, Ev)

``layers/reference.py`` computes exactly that, holding the (L, S) matrices, and backpropagates
through it with the softmax's Jacobian, ``dS = P * (dP - rowsum(dP * P))``.  This file computes the same
numbers while holding at most one (L, Bc) block of scores at a time (Dao et al., FlashAttention, 2022,
Algorithms 1 and 2, here vectorised over all query rows and looping over key blocks):

forward, for each key block j, with a running row maximum m and running row sum l (the online softmax):
    s    = scale * q @ k_j^T + bias_j                   (L, Bc)
    m'   = max(m, rowmax(s));   p = exp(s - m')          (L, Bc) unnormalised probabilities
    l    = l * exp(m - m') + rowsum(p)                   rescale what was summed against the old max
    acc  = acc * exp(m - m') + (p * dropout_j) @ v_j     (L, Ev)
then out = acc / l, and only out and each row's log-sum-exp, lse = m + log(l), are kept for backward.

backward recomputes each block's probabilities from lse instead of storing them, p = exp(s - lse), and
replaces rowsum(dP * P) -- which would need the whole row -- by D = rowsum(dout * out), the same number
(sum_s dP_s P_s = sum_s (dout . v_s) A_s = dout . out):
    dv_j  = (p * dropout_j)^T @ dout                     dp = (dout @ v_j^T) * dropout_j
    ds    = p * (dp - D)                                 (L, Bc)
    dq   += scale * ds @ k_j;   dk_j = scale * ds^T @ q

Masks, as torch's function takes them: a boolean ``attn_mask`` is True where a query MAY attend (the
opposite of nn.MultiheadAttention's), a float one is added to the scores; both broadcast to (*, L, S).
``is_causal`` lets query l see keys s <= l (top-left aligned when L != S, as torch); with it, key block j
is computed only for the query rows l >= its first key, so a causal pass does about half the work.  A row
whose keys are all masked gives zeros and zero gradients, as torch 2.14's function does (its softmax
would be 0/0).  The block size changes nothing but rounding (``tests/test_attention.py``).

Both passes compute in base 2: the scores carry a factor log2 e (in the product's alpha), exp becomes exp2
and lse is a base-2 log-sum-exp -- the same numbers, and exp2 is several times faster on the CPU.  When all
keys fit in one block (S <= block_size) ``layers/attention/one_block.py`` runs the same algorithm without
the online softmax's running state.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
from torch import Tensor

from .dropout import attention_dropout_mask, draw_seed
from .one_block import LOG2E, one_block_backward, one_block_forward
from .scaled_dot_product_inputs import OWNER, check_mask, check_qkv, mask_parts
from ..checks import LOW_PRECISION, check_int, check_number, check_probability, check_tensor
from ..layer import BaseLayer

DEFAULT_BLOCK_SIZE = 128  # keys per block: large enough for efficient products, small enough that a causal pass
# skips most of what it need not compute (benchmarks/attention.py --block compares sizes)


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
    ``block_size``: keys per block (default 128); any value gives the same result up to rounding.
    float16/bfloat16 inputs are computed in float32 and the results rounded once.

    ``keep_out=False`` (a keyword of the forward): the output is not held for backward, which then needs it back
    as ``backward(dout, out=...)`` (a caller that keeps the same values in another layout anyway: the GPT's heads
    side by side).

    Kept from forward to backward (``Saved``): query, key and value (views of them where no cast or copy was
    needed), the output and the weights it returned (views of its own, where no cast was needed), and the masks;
    changing any in place in between (``out += x``) is refused, as torch.autograd refuses it (layers/saved.py).
    """

    class Saved(NamedTuple):
        spec: _Spec                # sizes, scale, masks, causality, dropout seed, block size
        q: Tensor                  # (B, L, E) in the compute dtype
        k: Tensor                  # (B, S, E)
        v: Tensor                  # (B, S, Ev)
        out: Tensor | None         # (B, L, Ev); None with keep_out=False (the caller gives it back)
        lse: Tensor                # (B, L, 1) each row's base-2 log-sum-exp
        weights: Tensor | None     # (B, L, S) the weights returned with need_weights, else None
        blocked: Tensor | None     # spec's boolean mask (True: may NOT attend), kept here to be version-checked
        bias: Tensor | None        # spec's float mask, likewise
        dtype: torch.dtype         # the inputs' dtype: the gradients' own
        q_shape: torch.Size        # query's shape (*, L, E)
        k_shape: torch.Size        # key's (*, S, E)
        v_shape: torch.Size        # value's (*, S, Ev)

    _saved_labels = {"q": "its input query", "k": "its input key", "v": "its input value",
                     "weights": "its returned weights", "lse": "its log-sum-exp",
                     "blocked": "its attention mask (blocked positions)",
                     "bias": "its attention mask (added to the scores)"}

    def __init__(self, block_size: int | None = None, generator: torch.Generator | None = None) -> None:
        self.block_size = DEFAULT_BLOCK_SIZE if block_size is None else check_int(
            "ScaledDotProductAttention", "block_size", block_size)
        self.generator = generator

    def extra_repr(self) -> str:
        return f"block_size={self.block_size}"

    # -- forward ------------------------------------------------------------------------------------------

    def check_input(self, query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                    dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                    need_weights: bool = False, *, keep_out: bool = True) -> None:
        """torch's rules for query, key, value and the mask (scaled_dot_product_inputs.py), dropout_p and scale."""
        lead, L, S, E, Ev = check_qkv(query, key, value)
        check_mask(attn_mask, query, lead, L, S, is_causal=is_causal)
        check_probability(OWNER, "dropout_p (the probability of dropping a weight)", dropout_p)
        if scale is not None:
            check_number(OWNER, "scale", scale)

    def forward_math(self, query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                     dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                     need_weights: bool = False, *, keep_out: bool = True):
        """query (*, L, E), key (*, S, E), value (*, S, Ev) -> (out (*, L, Ev) [, weights (*, L, S)]), Saved."""
        lead, L, S, E, Ev = tuple(query.shape[:-2]), query.shape[-2], key.shape[-2], query.shape[-1], value.shape[-1]
        blocked, bias = mask_parts(attn_mask)
        B = math.prod(lead)
        dtype = query.dtype
        cdt = torch.float32 if dtype in LOW_PRECISION else dtype  # compute dtype
        q = query.reshape(B, L, E).to(cdt)  # (B, L, E): views when contiguous and not half
        k = key.reshape(B, S, E).to(cdt)  # (B, S, E)
        v = value.reshape(B, S, Ev).to(cdt)  # (B, S, Ev)
        seed = draw_seed(self.generator) if dropout_p > 0.0 else None
        spec = _Spec(lead=lead, L=L, S=S, scale=1.0 / math.sqrt(E) if scale is None else scale, blocked=blocked,
                     bias=bias, causal=is_causal, p=float(dropout_p), seed=seed, block=self.block_size)
        if S <= spec.block:  # every key in one block: the plain softmax, no running state (one_block.py)
            out, lse, weights = one_block_forward(q, k, v, spec, need_weights=need_weights)
        else:
            out, lse, weights = _blocked_forward(q, k, v, spec, need_weights=need_weights)
        saved = self.Saved(spec, q, k, v, out if keep_out else None, lse, weights, blocked, bias, dtype, query.shape,
                           key.shape, value.shape)
        out = out.view(*lead, L, Ev).to(dtype)
        if not need_weights:
            return out, saved
        return (out, weights.view(*lead, L, S).to(dtype)), saved

    def masked_rows(self) -> Tensor:
        """After a forward: bool (*, L, 1), True for the query rows whose keys were all masked."""
        if self.kept is None:
            raise RuntimeError(f"{self!r}: masked_rows() needs a forward first")
        spec, lse = self.kept.spec, self.kept.lse
        return lse.isinf().view(*spec.lead, spec.L, 1)

    # -- backward -----------------------------------------------------------------------------------------

    def check_dout(self, grads: tuple, meta, saved) -> None:
        """dout, the output's gradient (and dweights, the returned weights', checked by the math)."""
        if meta is True:  # the forward returned (out, weights): dout is the output's
            meta = (torch.Size((*saved.spec.lead, saved.spec.L, saved.v.shape[2])), saved.dtype, saved.q.device)
        super().check_dout(grads[:1], meta, saved)

    def backward_math(self, dout: Tensor, saved: Saved, dweights: Tensor | None = None,
                      out: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """dout (*, L, Ev) [, dweights (*, L, S)] -> (dquery (*, L, E), dkey (*, S, E), dvalue (*, S, Ev)): the
        module docstring's backward.  ``out``: the forward's output, given back when the forward did not keep it
        (``keep_out=False``)."""
        spec, q, k, v, kept, lse, weights, dtype = saved.spec, saved.q, saved.k, saved.v, saved.out, saved.lse, \
            saved.weights, saved.dtype
        lead, L, S = spec.lead, spec.L, spec.S
        out_shape = dout.shape
        if (kept is None) != (out is not None):
            raise ValueError(f"{self!r}: " + ("the forward did not keep its output (keep_out=False); pass it back "
                                              "as backward(dout, out=...)" if kept is None else
                                              "backward got out=, but the forward kept its own output"))
        if out is not None and not (isinstance(out, Tensor) and out.shape == out_shape and out.dtype == dtype):
            raise ValueError(f"{self!r}: out= must be the forward's output, of shape {tuple(out_shape)} and dtype "
                             f"{dtype}; got {tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__}")
        if dweights is not None:
            if weights is None:
                raise ValueError(f"{self!r}: dweights given, but the forward returned no weights "
                                 f"(need_weights=False)")
            check_tensor(repr(self), "dweights", dweights)
            if dweights.shape != (*lead, L, S) or dweights.dtype != dtype:
                raise ValueError(f"{self!r}: dweights has shape {tuple(dweights.shape)} and dtype {dweights.dtype}, "
                                 f"expected {(*lead, L, S)} and {dtype} (the weights' own)")
        B = q.shape[0]
        do = dout.reshape(B, L, v.shape[2]).to(q.dtype)  # (B, L, Ev)
        dw = None if dweights is None else dweights.reshape(B, L, S).to(q.dtype)  # (B, L, S)
        if out is None:  # D = rowsum(dout * out) = rowsum(dP * P), one dot product per row (no (B, L, Ev) temporary)
            D = torch.bmm(do.reshape(B * L, 1, -1), kept.view(B * L, -1, 1)).view(B, L, 1)
        else:  # the caller's layout: a product in it, summed per row
            D = torch.mul(dout.to(q.dtype), out.to(q.dtype)).sum(-1, keepdim=True).reshape(B, L, 1)
        if dw is not None:
            D.add_((dw * weights).sum(-1, keepdim=True))  # the weights' own gradient joins dA: + rowsum(dW * A)
        if S <= spec.block:
            dq, dk, dv = one_block_backward(q, k, v, do, dw, D, lse, spec)
        else:
            dq, dk, dv = _blocked_backward(q, k, v, do, dw, D, lse, spec)
        return dq.view(saved.q_shape).to(dtype), dk.view(saved.k_shape).to(dtype), dv.view(saved.v_shape).to(dtype)


class _Spec:
    """What a forward decided, for its blocks and for the backward that recomputes them: the sizes, scale,
    masks (``blocked``: True where a query may NOT attend; ``bias``: added to the scores), causality, dropout."""

    __slots__ = ("lead", "L", "S", "scale", "blocked", "bias", "causal", "p", "seed", "block")

    def __init__(self, *, lead, L, S, scale, blocked, bias, causal, p, seed, block) -> None:
        self.lead, self.L, self.S, self.scale = lead, L, S, scale
        self.blocked, self.bias, self.causal, self.p, self.seed, self.block = blocked, bias, causal, p, seed, block

    def blocks(self):
        """(first key, end key, first query row) of every key block that some query row may see."""
        for j0 in range(0, self.S, self.block):
            r0 = j0 if self.causal else 0  # causal: query rows before the block's first key see none of it
            if r0 >= self.L:
                return
            yield j0, min(j0 + self.block, self.S), r0

    def mask_(self, s: Tensor, r0: int, j0: int, j1: int) -> None:
        """Apply the masks to the base-2 scores s (B, Lr, Bc) of rows r0.. and keys j0..j1, in place (a float
        mask, added to the natural-log scores, is added times log2 e)."""
        if self.blocked is not None or self.bias is not None:
            view = s.view(*self.lead, s.shape[1], s.shape[2])  # (*, Lr, Bc): the masks broadcast over *
            if self.blocked is not None:
                view.masked_fill_(_block(self.blocked, r0, j0, j1), -math.inf)
            if self.bias is not None:
                view.add_(_block(self.bias, r0, j0, j1), alpha=LOG2E)
        if self.causal and j1 - 1 > r0:  # some key in the block lies after some row: mask key s > row l
            r1 = min(j1 - 1, self.L)  # rows from j1 - 1 on see every key of the block: only the corner is masked
            # (while torch.compile traces, the graph makes its own corner: the cache is plain Python)
            bias = _causal_bias.__wrapped__ if torch.compiler.is_compiling() else _causal_bias
            s[:, :r1 - r0].add_(bias(r0, r1, j0, j1, s.dtype, s.device))  # -inf where key > row

    def dropout(self, r0: int, j0: int, j1: int, like: Tensor) -> Tensor:
        """The scaled dropout mask of rows r0.. and keys j0..j1, (B, Lr, Bc)."""
        return attention_dropout_mask(self.seed, self.p, like.shape[0], self.L, self.S, row_range=(r0, self.L),
                                      col_range=(j0, j1), dtype=like.dtype, device=like.device)


def _blocked_forward(q: Tensor, k: Tensor, v: Tensor, spec: _Spec, *,
                     need_weights: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """q (B, L, E), k (B, S, E), v (B, S, Ev) -> (out (B, L, Ev), lse (B, L, 1) in base 2, weights (B, L, S) or
    None): the key blocks one after another with the online softmax (the module docstring's forward)."""
    B, L, S, Ev = q.shape[0], spec.L, spec.S, v.shape[2]
    cdt, scale, seed = q.dtype, spec.scale * LOG2E, spec.seed  # base-2 scores: exp(x) = 2^(x log2 e)
    zero = q.new_zeros(1, 1, 1)  # baddbmm's addend, ignored (beta=0): the scale rides in its alpha, no scaled copy of q
    kt = k.transpose(1, 2)  # (B, E, S)
    # The running state of the live query rows (rows a later key block can still reach): row max m,
    # row sum l of exp(s - m), and acc = sum of p @ v.  A causal pass finishes rows as it goes (block j
    # starts at key j0 and reaches only rows >= j0): their state moves to `done`, nothing is copied.
    m = torch.full((B, L, 1), -math.inf, dtype=cdt, device=q.device)  # (B, L, 1)
    l = torch.zeros((B, L, 1), dtype=cdt, device=q.device)  # (B, L, 1)
    acc = torch.zeros((B, L, Ev), dtype=cdt, device=q.device)  # (B, L, Ev)
    done: list[tuple[Tensor, Tensor, Tensor]] = []
    row = 0  # the first live row
    for j0, j1, r0 in spec.blocks():
        if r0 > row:  # rows row..r0 are finished
            done.append((m[:, :r0 - row], l[:, :r0 - row], acc[:, :r0 - row]))
            m, l, acc, row = m[:, r0 - row:], l[:, r0 - row:], acc[:, r0 - row:], r0
        s = torch.baddbmm(zero, q[:, r0:], kt[:, :, j0:j1], beta=0, alpha=scale)  # (B, Lr, Bc) rows r0.., keys j0..j1
        spec.mask_(s, r0, j0, j1)
        # The max only keeps exp() in range: the result does not depend on it, so it is a constant to
        # the gradient (detached: autograd, when it traces this forward, gives the same derivative).
        m_new = torch.maximum(m, s.detach().amax(-1, keepdim=True))  # (B, Lr, 1), -inf: row masked so far
        m_exp = m_new.masked_fill(m_new == -math.inf, 0.0)  # such a row: exp(-inf - 0) = 0, not nan
        p = s.sub_(m_exp).exp2_()  # (B, Lr, Bc) 2^(s - m'), in the scores' memory
        corr = (m - m_exp).exp2_()  # (B, Lr, 1) rescales what was summed against the old maximum
        l = torch.addcmul(p.sum(-1, keepdim=True), l, corr)  # (B, Lr, 1)
        if seed is not None:
            p = p * spec.dropout(r0, j0, j1, p)  # (B, Lr, Bc) the weights that survive dropout
        acc = torch.baddbmm(acc * corr, p, v[:, j0:j1])  # (B, Lr, Ev) acc * corr + p @ v_j
        m = m_new
    if done:
        m, l, acc = (torch.cat([*parts, last], 1) for parts, last in zip(zip(*done), (m, l, acc)))
    empty = l == 0  # rows whose keys are all masked
    out = acc.div_(l.masked_fill(empty, 1.0))  # (B, L, Ev): zeros where every key was masked (acc's memory)
    lse = (m + l.log2()).masked_fill_(empty, math.inf)  # (B, L, 1); +inf makes 2^(s - lse) = 0 there
    weights = None
    if need_weights:  # one dense pass, for a caller who asked to see the (L, S) weights
        s = torch.baddbmm(zero, q, kt, beta=0, alpha=scale)  # (B, L, S)
        spec.mask_(s, 0, 0, S)
        weights = s.sub_(lse).exp2_()  # (B, L, S) P
        if seed is not None:
            weights = weights * spec.dropout(0, 0, S, weights)  # A = P * mask
    return out, lse, weights


def _blocked_backward(q: Tensor, k: Tensor, v: Tensor, do: Tensor, dw: Tensor | None, D: Tensor, lse: Tensor,
                      spec: _Spec) -> tuple[Tensor, Tensor, Tensor]:
    """The module docstring's backward, key block by key block: q (B, L, E), k (B, S, E), v (B, S, Ev), dout
    (B, L, Ev), dweights (B, L, S) or None, D = rowsum(dout * out) (B, L, 1), lse (B, L, 1) in base 2
    -> (dq, dk, dv) shaped as q, k, v."""
    scale, scale2 = spec.scale, spec.scale * LOG2E
    kt = k.transpose(1, 2)  # (B, E, S)
    dq = torch.zeros_like(q)  # (B, L, E)
    dk = torch.zeros_like(k)  # (B, S, E) (a key block no query row sees keeps zeros)
    dv = torch.zeros_like(v)  # (B, S, Ev)
    for j0, j1, r0 in spec.blocks():
        s = torch.baddbmm(-lse[:, r0:], q[:, r0:], kt[:, :, j0:j1], alpha=scale2)  # (B, Lr, Bc) scores - lse
        spec.mask_(s, r0, j0, j1)  # (-inf - lse is -inf: masking after the shift is the same)
        p = s.exp2_()  # (B, Lr, Bc) P, recomputed from the kept log-sum-exp
        dp = torch.bmm(do[:, r0:], v[:, j0:j1].transpose(1, 2))  # (B, Lr, Bc) dA = dout @ v_j^T
        if dw is not None:
            dp.add_(dw[:, r0:, j0:j1])  # dA also receives the weights' gradient
        if spec.seed is not None:
            mask = spec.dropout(r0, j0, j1, p)  # the forward's mask, regenerated
            dv[:, j0:j1] = torch.bmm((p * mask).transpose(1, 2), do[:, r0:])  # (B, Bc, Ev) A_j^T @ dout
            dp.mul_(mask)  # dP = dA * mask
        else:
            dv[:, j0:j1] = torch.bmm(p.transpose(1, 2), do[:, r0:])  # (B, Bc, Ev) P_j^T @ dout
        ds = dp.sub_(D[:, r0:]).mul_(p)  # (B, Lr, Bc) P * (dP - D): the softmax's backward
        dq[:, r0:].baddbmm_(ds, k[:, j0:j1], alpha=scale)  # (B, Lr, E) += scale * ds @ k_j
        dk[:, j0:j1] = torch.bmm(ds.transpose(1, 2), q[:, r0:]).mul_(scale)  # (B, Bc, E) scale * ds^T @ q
        # (computed, then copied into the slice: a batched product written straight into a strided slice
        # of dk runs as one small product per batch entry on the CPU)
    return dq, dk, dv


@functools.lru_cache(maxsize=64)
def _causal_bias(r0: int, r1: int, j0: int, j1: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(r1 - r0, j1 - j0): -inf where key j > row r, else 0 -- the causal mask of rows r0.. and keys j0..j1,
    added to the scores (s + 0 = s exactly; one in-place pass, several times faster than masked_fill_ with a
    boolean mask, measured).  Cached: the same few corners recur at every step."""
    rows = torch.arange(r0, r1, device=device).view(-1, 1)
    keys = torch.arange(j0, j1, device=device).view(1, -1)
    return torch.zeros(r1 - r0, j1 - j0, dtype=dtype, device=device).masked_fill_(keys > rows, -math.inf)


def _block(mask: Tensor, r0: int, j0: int, j1: int) -> Tensor:
    """Rows r0.. and keys j0..j1 of a mask broadcastable to (*, L, S); a broadcast (size-1) axis stays as it is."""
    rows = slice(r0, None) if mask.shape[-2] != 1 else slice(None)
    cols = slice(j0, j1) if mask.shape[-1] != 1 else slice(None)
    return mask[..., rows, cols]

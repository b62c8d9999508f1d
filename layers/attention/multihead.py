"""MultiheadAttention: nn.MultiheadAttention's twin, its projections and attention backpropagated by hand.

Shape legend: L = target (query) length, S = source (key/value) length, N = batch, E = embed_dim,
H = num_heads, hd = E / H (one head's size), kdim / vdim = the key's and value's feature sizes.
Inputs are (L, N, E) -- or (N, L, E) with ``batch_first`` -- or unbatched (L, E), as torch takes them.

    q = query @ Wq^T + bq,  k = key @ Wk^T + bk,  v = value @ Wv^T + bv        (*, E) each, split into H heads
    heads = attention(q_h, k_h, v_h) per head (scaled_dot_product.py: the blocked, memory-efficient path)
    out = concat(heads) @ Wo^T + bo                                          (L, N, E)

Backward: out_proj's backward (a Linear), the attention's, then each projection's: dW = dq^T @ query,
dquery = dq @ Wq (likewise k, v).  Self-attention (the same tensor as query, key and value) runs the three
input projections as one (M, E) x (E, 3E) product with the packed ``in_proj_weight``, as torch does.

The backward split in two (a pipeline's B and W; the layer is a ``Composite``, layers/composite.py):
    B   out_proj's B (dmerged = dout @ Wo), the attention's backward (no weights: all of it is B), the
        projections' input gradients dquery = dq @ Wq, dkey = dk @ Wk, dvalue = dv @ Wv; keeps dq, dk, dv
    W   out_proj's W (dWo = dout^T @ merged, dbo), then the input projections' dW = d^T @ input and
        db = sum of d, then bias_k's and bias_v's (their rows of dk and dv summed over the batch)
Shared work: the attention's backward yields dq, dk and dv together, the gradients both passes read; with packed
self-attention B concatenates them into d = [dq dk dv] (L, N, 3E) once -- ``summed=True`` reads it for dx, one
product with ``in_proj_weight``, and W for dW = d^T @ x -- and W keeps d in place of its three parts.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..checks import check_bool, check_int, check_probability
from ..composite import Composite
from ..layer import Product, learned
from ..linear import Linear
from .multihead_inputs import check_inputs, masks
from .scaled_dot_product import ScaledDotProductAttention

_OWNER = "MultiheadAttention"


class MultiheadAttention(Composite):
    """``MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
    kdim=None, vdim=None, batch_first=False)``: torch.nn's arguments, parameter names and layouts
    (``in_proj_weight`` (3E, E) and ``in_proj_bias`` (3E,), or ``q_proj_weight``/``k_proj_weight``/``v_proj_weight``
    when kdim or vdim differ from E; ``bias_k``/``bias_v`` (1, 1, E); ``out_proj.weight/bias``) and its
    initialisation in its RNG order, so one seed gives identical weights.

    ``forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False) -> (out, weights or None)``.  Masks use nn.MultiheadAttention's
    polarity -- a boolean True means "may NOT attend", the opposite of F.scaled_dot_product_attention's -- and
    a float mask is added to the scores; ``key_padding_mask`` (N, S), ``attn_mask`` (L, S) or (N*H, L, S).
    ``is_causal`` is torch's hint that ``attn_mask`` is the causal mask (it must be given too); as in torch,
    without a key padding mask and weights the causal structure is used and the mask itself is not read.

    ``backward(dout, dweights=None) -> (dquery, dkey, dvalue)``, each in its input's shape.  When one tensor was
    passed as query, key and value (self-attention), its gradient is the sum of the three: the caller adds
    them -- or asks ``backward(dout, summed=True)`` for that sum, computed with one matrix product instead of
    three.  ``dweights`` is the gradient flowing into the returned weights, if any.

    A query row whose keys are all masked: with ``need_weights=False`` zeros, as torch's function gives; with
    ``need_weights=True`` nan, as torch's module gives (its softmax is 0/0 there); the gradients of such a row
    are zero (torch's are nan throughout the projections).  Dropout (training mode) drops attention weights with
    masks from ``layers.attention.dropout``, drawn from ``self.generator`` (torch's default generator if None).

    Kept from forward to backward: query, key and value (for the projections' weight gradients) and the input
    projections' weights (for the inputs' gradients); ``out_proj`` and the attention keep their own (the masks
    among them).  Changing any in place in between is refused, as torch.autograd refuses it (layers/saved.py).
    """

    _param_names = (
        "in_proj_weight",
        "q_proj_weight",
        "k_proj_weight",
        "v_proj_weight",
        "in_proj_bias",
        "bias_k",
        "bias_v",
    )

    class Saved(NamedTuple):
        packing: str  # which inputs shared one projection: "qkv", "kv" or ""
        query: Tensor  # (L, N, E) as projected, for the weight gradients
        key: Tensor  # (S, N, kdim)
        value: Tensor  # (S, N, vdim)
        key_padding_mask: Tensor | None  # (N, S): the attention keeps a view; named here as the caller passed it
        attn_mask: Tensor | None  # (L, S) or (N*H, L, S), likewise
        in_proj_weight: Tensor | None  # (3E, E), for the inputs' gradients (None where separate)
        q_proj_weight: Tensor | None  # (E, E)
        k_proj_weight: Tensor | None  # (E, kdim)
        v_proj_weight: Tensor | None  # (E, vdim)
        batched: bool  # False: the inputs were (L, E), a batch of one squeezed again
        L: int  # target length
        N: int  # batch
        S: int  # source length (before bias_k and the zero key)

    _saved_labels = {
        "query": "its input query",
        "key": "its input key",
        "value": "its input value",
        "key_padding_mask": "its key_padding_mask",
        "attn_mask": "its attn_mask",
    }
    torch_class = torch.nn.MultiheadAttention

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.embed_dim = check_int(_OWNER, "embed_dim", embed_dim)
        self.num_heads = check_int(_OWNER, "num_heads", num_heads)
        if embed_dim % num_heads:
            raise ValueError(f"{_OWNER}: embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        self.kdim = embed_dim if kdim is None else check_int(_OWNER, "kdim", kdim)
        self.vdim = embed_dim if vdim is None else check_int(_OWNER, "vdim", vdim)
        for name, flag in (
            ("bias", bias),
            ("add_bias_kv", add_bias_kv),
            ("add_zero_attn", add_zero_attn),
            ("batch_first", batch_first),
        ):
            check_bool(_OWNER, name, flag)
        self.dropout = check_probability(_OWNER, "dropout (the probability of dropping an attention weight)", dropout)
        self.batch_first, self.add_zero_attn = batch_first, add_zero_attn
        self.head_dim = embed_dim // num_heads
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        # torch's order of random draws: out_proj's Linear initialisation, then xavier for the input
        # projections, then bias_k and bias_v; the biases of the projections end as zeros.
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, **kw)
        self.in_proj_weight = self.q_proj_weight = self.k_proj_weight = self.v_proj_weight = None
        if self._qkv_same_embed_dim:
            self.in_proj_weight = torch.nn.init.xavier_uniform_(torch.empty(3 * embed_dim, embed_dim, **kw))
        else:
            self.q_proj_weight = torch.nn.init.xavier_uniform_(torch.empty(embed_dim, embed_dim, **kw))
            self.k_proj_weight = torch.nn.init.xavier_uniform_(torch.empty(embed_dim, self.kdim, **kw))
            self.v_proj_weight = torch.nn.init.xavier_uniform_(torch.empty(embed_dim, self.vdim, **kw))
        self.in_proj_bias = torch.zeros(3 * embed_dim, **kw) if bias else None
        if bias:
            with torch.no_grad():
                self.out_proj.bias.zero_()  # type: ignore[union-attr]  # (bias=True: it has one)
        self.bias_k = self.bias_v = None
        if add_bias_kv:
            self.bias_k = torch.nn.init.xavier_normal_(torch.empty(1, 1, embed_dim, **kw))
            self.bias_v = torch.nn.init.xavier_normal_(torch.empty(1, 1, embed_dim, **kw))
        learned(
            self.in_proj_weight,
            self.q_proj_weight,
            self.k_proj_weight,
            self.v_proj_weight,
            self.in_proj_bias,
            self.bias_k,
            self.bias_v,
        )
        self.attention = ScaledDotProductAttention()  # the blocked path; its generator draws dropout seeds

    @property
    def generator(self) -> torch.Generator | None:
        return self.attention.generator

    @generator.setter
    def generator(self, g: torch.Generator | None) -> None:
        self.attention.generator = g

    def named_children(self):
        return iter((("out_proj", self.out_proj),))

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}"

    # -- forward ------------------------------------------------------------------------------------------

    def forward_math(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[tuple[Tensor, Tensor | None], Saved]:
        """query (L, N, E), key (S, N, kdim), value (S, N, vdim) -> out (L, N, E), weights (N, L, S) averaged
        over heads, (N, H, L, S) with ``average_attn_weights=False``, or None; (N, ...) with batch_first;
        unbatched (L, E) -> (L, E), (L, S)."""
        batched = query.dim() == 3  # (check_input has checked the shapes)
        packing = "qkv" if query is key and key is value else "kv" if key is value else ""  # before new views
        if not batched:  # a batch of one, squeezed again at the end
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        if self.batch_first:  # (N, L, E) -> (L, N, E): views; the projections below copy anyway
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        L, N, E = query.shape
        S = key.shape[0]
        H, hd = self.num_heads, self.head_dim
        if is_causal and attn_mask is None:
            raise RuntimeError(
                f"{_OWNER}: is_causal=True is a hint that attn_mask is the causal mask: pass the "
                f"mask too (torch.nn.Transformer.generate_square_subsequent_mask(L))"
            )
        causal = is_causal and key_padding_mask is None and not need_weights  # torch uses the hint only then
        if causal:
            attn_mask = None

        q, k, v, packed = self._project(query, key, value, packing)  # (L, N, E), (S, N, E), (S, N, E)
        extra = 0  # keys appended below: bias_k/bias_v, then a zero key/value
        if self.bias_k is not None:
            k = torch.cat([k, self.bias_k.expand(1, N, E)])  # (S+1, N, E)
            v = torch.cat([v, self.bias_v.expand(1, N, E)])  # type: ignore[union-attr]  # (with bias_k)
            extra += 1
        heads = lambda t: t.reshape(t.shape[0], N, H, hd).permute(1, 2, 0, 3)  # noqa: E731  (T, N, E) -> (N, H, T, hd)
        qh, kh, vh = heads(q), heads(k), heads(v)
        if self.add_zero_attn:
            kh = torch.cat([kh, kh.new_zeros(N, H, 1, hd)], 2)  # (N, H, S', hd) a key of zeros ...
            vh = torch.cat([vh, vh.new_zeros(N, H, 1, hd)], 2)  # ... and its value
            extra += 1
        mask = masks(attn_mask, key_padding_mask, N, H, L, S, extra, query.dtype)  # in the function's polarity
        p_drop = self.dropout if self.training else 0.0
        res = self.attention(
            qh, kh, vh, mask, dropout_p=p_drop, is_causal=causal, scale=1.0 / math.sqrt(hd), need_weights=need_weights
        )
        attn, weights = res if need_weights else (res, None)  # (N, H, L, hd), (N, H, L, S')
        if need_weights:
            empty = self.attention.masked_rows()  # (N, H, L, 1) rows with every key masked: torch's module gives nan
            if bool(empty.any()):
                attn = attn.masked_fill(empty, math.nan)
                weights = weights.masked_fill(empty, math.nan)  # type: ignore[union-attr]  # (kept with need_weights)
        merged = attn.permute(2, 0, 1, 3).reshape(L * N, E)  # (L*N, E) the heads side by side
        out = self.out_proj(merged).view(L, N, E)
        saved = self.Saved(
            packed,
            query,
            key,
            value,
            key_padding_mask,
            attn_mask,
            self.in_proj_weight,
            self.q_proj_weight,
            self.k_proj_weight,
            self.v_proj_weight,
            batched,
            L,
            N,
            S,
        )
        if self.batch_first:
            out = out.transpose(0, 1)
        if not batched:
            out = out.squeeze(1)
        if weights is not None:
            weights = weights.mean(1) if average_attn_weights else weights  # (N, L, S') or (N, H, L, S')
            if not batched:
                weights = weights.squeeze(0)
        return (out, weights), saved

    def check_input(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        need_weights=True,
        attn_mask=None,
        average_attn_weights=True,
        is_causal=False,
    ) -> None:
        """torch's shape rules for the inputs and masks (layers/attention/multihead_inputs.py)."""
        check_inputs(self, query, key, value, key_padding_mask, attn_mask)

    def _project(self, query: Tensor, key: Tensor, value: Tensor, packing: str) -> tuple[Tensor, Tensor, Tensor, str]:
        """The input projections, packed into one product where the caller passed one tensor as several inputs
        (``packing`` "qkv": all three, "kv": key and value), as torch does:
        -> q (L, N, E), k (S, N, E), v (S, N, E), and which packing was used ("qkv", "kv" or "")."""
        E = self.embed_dim
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else b.split(E)
        if self.in_proj_weight is not None and packing == "qkv":
            qkv = _linear(query, self.in_proj_weight, b)  # (L, N, 3E): one product for all three
            q, k, v = qkv.split(E, -1)
            return q, k, v, "qkv"
        wq, wk, wv = self._weights()
        q = _linear(query, wq, bq)
        if self.in_proj_weight is not None and packing in ("qkv", "kv"):
            kv = _linear(key, self.in_proj_weight[E:], None if b is None else b[E:])  # (S, N, 2E)
            k, v = kv.split(E, -1)
            return q, k, v, "kv"
        return q, _linear(key, wk, bk), _linear(value, wv, bv), ""

    def _weights(self) -> tuple[Tensor, Tensor, Tensor]:
        """(Wq, Wk, Wv) in torch's (E, in) layout: views of in_proj_weight, or the separate weights."""
        if self.in_proj_weight is not None:
            return self.in_proj_weight.split(self.embed_dim)
        return self.q_proj_weight, self.k_proj_weight, self.v_proj_weight  # type: ignore[return-value]  # (the three)

    # -- backward -----------------------------------------------------------------------------------------

    def check_dout(self, grads: tuple, meta, saved) -> None:
        """dout, the output's gradient (and dweights, the returned weights', read by the attention's backward)."""
        if saved is not None:  # the forward returned (out, weights): dout is the output's
            L, N, E = saved.L, saved.N, self.embed_dim
            shape = ((N, L, E) if self.batch_first else (L, N, E)) if saved.batched else (L, E)
            meta = (torch.Size(shape), saved.query.dtype, saved.query.device)
        super().check_dout(grads[:1], meta, saved)

    def backward_math(self, dout: Tensor, saved: Saved, dweights: Tensor | None = None, *, summed: bool = False):
        """dout: the output's shape [, dweights: the weights'] -> ((dquery, dkey, dvalue) in the inputs' shapes, or
        with ``summed=True`` their sum, one tensor: the gradient of a tensor passed as all three; {parameter:
        gradient}); out_proj adds its own."""
        packing, query, key, value = saved.packing, saved.query, saved.key, saved.value
        batched, L, N, S = saved.batched, saved.L, saved.N, saved.S
        E, H, hd = self.embed_dim, self.num_heads, self.head_dim
        if summed and not (query.shape == key.shape == value.shape):
            raise ValueError(
                f"{_OWNER}: summed=True adds the gradients of query, key and value, which needs them "
                f"of one shape; got {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
            )
        if not batched:
            dout = dout.unsqueeze(1)
        if self.batch_first:
            dout = dout.transpose(0, 1)
        dmerged = self.back(self.out_proj, dout.reshape(L * N, E))  # (L*N, E); under B, its W queued
        dattn = dmerged.view(L, N, H, hd).permute(1, 2, 0, 3)  # (N, H, L, hd)
        if dweights is not None:
            dweights = _weights_grad(dweights, N, H, batched=batched)
        dqh, dkh, dvh = self.attention.backward(dattn, dweights=dweights)  # (N, H, L, hd), (N, H, S', hd) x2
        if self.add_zero_attn:
            dkh, dvh = dkh[:, :, :-1], dvh[:, :, :-1]  # the zero key and value are constants
        unheads = lambda t: t.permute(2, 0, 1, 3).reshape(t.shape[2], N, E)  # noqa: E731  (N, H, T, hd) -> (T, N, E)
        dq, dk, dv = unheads(dqh), unheads(dkh), unheads(dvh)  # (L, N, E), (S(+1), N, E) x2
        grads = {}  # added after out_proj's (the base adds them after this math; W after out_proj's W)
        if self.bias_k is not None:  # the appended key and value: their rows' gradients summed over the batch
            dk_extra, dv_extra = dk[S:], dv[S:]  # (1, N, E) each
            grads["bias_k"] = lambda: dk_extra.sum(1, keepdim=True)  # (1, 1, E)
            grads["bias_v"] = lambda: dv_extra.sum(1, keepdim=True)
            dk, dv = dk[:S], dv[:S]
        dx = self._project_backward(packing, query, key, value, dq, dk, dv, grads, summed=summed)
        if not self.needs_input_grad:  # backward_input(need_input_grad=False): the weight gradients only
            return None, grads
        dx = tuple(g.transpose(0, 1) if self.batch_first else g for g in dx)
        if not batched:
            dx = tuple(g.squeeze(1) for g in dx)
        return (dx[0] if summed else dx), grads

    def _project_backward(
        self,
        packing: str,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        dq: Tensor,
        dk: Tensor,
        dv: Tensor,
        grads: dict,
        *,
        summed: bool,
    ) -> tuple[Tensor, ...]:
        """Backward through the input projections: dW = d^T @ input and db = sum of d, into ``grads`` (computed
        when the base adds them: in W under the split); -> dinput = d @ W for each input (or their sum), or ()
        where no input gradient is asked for."""
        rows = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731  (T, N, F) -> (T*N, F)
        b = self.in_proj_bias
        if packing == "qkv":  # one input, one (3E, E) product: dW = [dq dk dv]^T @ x
            d = torch.cat([dq, dk, dv], -1)  # (L, N, 3E) read by dx (summed) and by dW: built once, in B
            grads["in_proj_weight"] = Product(rows(d).t(), rows(query))
            if b is not None:
                grads["in_proj_bias"] = lambda: rows(d).sum(0)  # (3E,)
            if not self.needs_input_grad:
                return ()
            if summed:
                return (_input_grad(d, self.in_proj_weight),)  # type: ignore[arg-type]  # (summed: one packed weight)
            wq, wk, wv = self._weights()
            return _input_grad(dq, wq), _input_grad(dk, wk), _input_grad(dv, wv)
        wq, wk, wv = self._weights()
        pairs = ((dq, query), (dk, key), (dv, value))
        if self.in_proj_weight is not None:  # the packed weight's three row blocks, each from its own input
            grads["in_proj_weight"] = lambda: torch.cat([rows(d).t() @ rows(x) for d, x in pairs])  # (3E, E)
        else:
            for name, (d, x) in zip(("q_proj_weight", "k_proj_weight", "v_proj_weight"), pairs, strict=True):
                grads[name] = Product(rows(d).t(), rows(x))  # (E, in)
        if b is not None:
            grads["in_proj_bias"] = lambda: torch.cat([rows(d).sum(0) for d, _ in pairs])  # (3E,)
        if not self.needs_input_grad:
            return ()
        dx = (_input_grad(dq, wq), _input_grad(dk, wk), _input_grad(dv, wv))
        return (dx[0] + dx[1] + dx[2],) if summed else dx

    # -- conversion -----------------------------------------------------------------------------------------

    @classmethod
    def _ctor_kwargs(cls, obj) -> dict:
        return {
            "embed_dim": obj.embed_dim,
            "num_heads": obj.num_heads,
            "dropout": float(obj.dropout),
            "bias": obj.in_proj_bias is not None,
            "add_bias_kv": obj.bias_k is not None,
            "add_zero_attn": obj.add_zero_attn,
            "kdim": obj.kdim,
            "vdim": obj.vdim,
            "batch_first": obj.batch_first,
        }


# -- helpers: the projections as plain matrix products ---------------------------------------------------------


def _linear(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """x (T, N, in) @ w^T (in, out) + b -> (T, N, out), one GEMM over the T*N rows."""
    x2 = x.reshape(-1, x.shape[-1])  # (T*N, in)
    y = x2 @ w.t() if b is None else torch.addmm(b, x2, w.t())
    return y.view(*x.shape[:-1], w.shape[0])


def _input_grad(d: Tensor, w: Tensor) -> Tensor:
    """d (T, N, out) @ w (out, in) -> (T, N, in)."""
    return (d.reshape(-1, d.shape[-1]) @ w).view(*d.shape[:-1], w.shape[1])


def _weights_grad(dweights: Tensor, N: int, H: int, *, batched: bool) -> Tensor:
    """The gradient of the returned weights -> that of the per-head weights (N, H, L, S') (a mean over heads
    spreads its gradient 1/H to each head)."""
    d = dweights if batched else dweights.unsqueeze(0)
    if d.dim() == 3:  # averaged over the heads
        d = (d / H).unsqueeze(1).expand(N, H, *d.shape[1:])
    return d

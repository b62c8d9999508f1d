"""Textbook versions of the fast layers, for the reader and the tests only.

The layers in this package are written for speed and for agreement with autograd to
the last bit: Linear makes the very BLAS calls nn.Linear makes, ReLU's backward multiplies by
sign(out), cross-entropy orders its operations as autograd rounds them, batch norm's
backward is one closed-form statement, convolution's backward is two more convolutions, the
recurrent layers' backpropagation through time does its matrix products over all time steps at once.
Here is the same math the way a textbook writes it, in CS231n's ``out, cache =
f_forward(...)`` / ``dx, dw = f_backward(dout, cache)`` style.  Nothing in the library
calls these; ``tests/test_reference.py`` (``tests/test_norm.py`` for batch norm,
``tests/test_conv.py`` for the im2col convolution, ``tests/test_recurrent.py`` and
``tests/test_cells.py`` for the recurrent cells and loops) check that the fast layers compute the same
numbers, so you can learn from this file and trust the fast one.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def linear_forward(x: Tensor, w: Tensor, b: Tensor) -> tuple[Tensor, tuple]:
    """x (N, D), w (H, D) -- nn.Linear's (out_features, in_features) --, b (H,) -> out (N, H) = x @ w^T + b.

    out[n, h] = sum_d x[n, d] w[h, d] + b[h].  (CS231n writes W as (D, H) and ``x @ W + b``: its W is this w^T.)"""
    out = x @ w.T + b  # (N, H)
    return out, (x, w)


def linear_backward(dout: Tensor, cache: tuple) -> tuple[Tensor, Tensor, Tensor]:
    """dout (N, H) -> dx (N, D) = dout @ w, dw (H, D) = dout^T @ x, db (H,) = sum over the batch of dout.

    Each by the chain rule on out[n, h] = sum_d x[n, d] w[h, d] + b[h]:
      dx[n, d] = sum_h dout[n, h] w[h, d]        every output the input feeds
      dw[h, d] = sum_n dout[n, h] x[n, d]        every example the weight was used for (a sum over the batch)
      db[h]    = sum_n dout[n, h]                the bias is added to every row
    (CS231n's dW = x^T @ dout is this dw transposed, as its W is.)"""
    x, w = cache
    return dout @ w, dout.T @ x, dout.sum(0)  # (N, D), (H, D), (H,)


def relu_forward(x: Tensor) -> tuple[Tensor, Tensor]:
    """out = max(x, 0); the cache is the mask of where x > 0."""
    mask = x > 0
    return x * mask, mask


def relu_backward(dout: Tensor, mask: Tensor) -> Tensor:
    """The gradient flows where the input was positive and stops elsewhere."""
    return dout * mask


def softmax_cross_entropy(logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """logits (N, C), class indices y (N,) -> (mean loss, dL/dlogits (N, C) = (softmax - onehot(y)) / N)."""
    n = logits.shape[0]
    shifted = logits - logits.max(1, keepdim=True).values  # subtract the row max: exp cannot overflow
    p = shifted.exp() / shifted.exp().sum(1, keepdim=True)  # (N, C) softmax
    loss = -p[torch.arange(n), y].log().mean()
    onehot = torch.zeros_like(p)
    onehot[torch.arange(n), y] = 1
    return loss, (p - onehot) / n


def batchnorm_forward(x: Tensor, gamma: Tensor, beta: Tensor, eps: float = 1e-5) -> tuple[Tensor, tuple]:
    """Training-mode batch norm of x (N, D) -- statistics per column D over the batch N -- as a chain of
    elementwise steps, each a node of the computational graph (CS231n's batchnorm_forward).

    The variance is the biased one (divided by N), as torch normalises.  For (N, C, H, W) move C last and
    flatten: x.permute(0, 2, 3, 1).reshape(-1, C).
    """
    n = x.shape[0]
    mu = x.sum(0) / n  # (D,)           step 1: mean
    xmu = x - mu  # (N, D)              step 2: centre
    sq = xmu ** 2  # (N, D)             step 3: square
    var = sq.sum(0) / n  # (D,)         step 4: biased variance
    sqrtvar = torch.sqrt(var + eps)  # (D,)  step 5
    ivar = 1.0 / sqrtvar  # (D,)        step 6: invstd
    xhat = xmu * ivar  # (N, D)         step 7: normalise
    gammax = gamma * xhat  # (N, D)     step 8: scale
    out = gammax + beta  # (N, D)       step 9: shift
    return out, (xhat, gamma, xmu, ivar, sqrtvar, var, eps)


def batchnorm_backward(dout: Tensor, cache: tuple) -> tuple[Tensor, Tensor, Tensor]:
    """Back through batchnorm_forward's graph one node at a time, last step first:
    dout (N, D) -> dx (N, D), dgamma (D,), dbeta (D,)."""
    xhat, gamma, xmu, ivar, sqrtvar, var, eps = cache
    n = dout.shape[0]
    dbeta = dout.sum(0)  # step 9: out = gammax + beta
    dgammax = dout
    dgamma = (dgammax * xhat).sum(0)  # step 8: gammax = gamma * xhat
    dxhat = dgammax * gamma
    divar = (dxhat * xmu).sum(0)  # step 7: xhat = xmu * ivar (xmu used twice: two paths into dxmu)
    dxmu1 = dxhat * ivar
    dsqrtvar = -divar / sqrtvar ** 2  # step 6: ivar = 1 / sqrtvar
    dvar = 0.5 * dsqrtvar / torch.sqrt(var + eps)  # step 5: sqrtvar = sqrt(var + eps)
    dsq = torch.ones_like(dout) * dvar / n  # step 4: var = sum(sq) / n
    dxmu2 = 2 * xmu * dsq  # step 3: sq = xmu^2
    dx1 = dxmu1 + dxmu2  # step 2: xmu = x - mu (x used twice: directly and through mu)
    dmu = -(dxmu1 + dxmu2).sum(0)
    dx2 = torch.ones_like(dout) * dmu / n  # step 1: mu = sum(x) / n
    return dx1 + dx2, dgamma, dbeta


def conv2d_forward(x: Tensor, w: Tensor, b: Tensor | None, stride=1, padding=0, dilation=1,
                   groups: int = 1) -> tuple[Tensor, tuple]:
    """Convolution as im2col + one matrix product (CS231n's conv_forward, vectorised).

    x (N, C_in, H, W), w (C_out, C_in/G, kH, kW), b (C_out,) or None -> out (N, C_out, H_out, W_out).
    ``F.unfold`` copies every receptive field into a column: cols (N, C_in*kH*kW, L), L = H_out*W_out
    positions.  Then each output is a dot product of a kernel row with a column, per group G:
        out[n, g] = w[g] (C_out/G, C_in/G*kH*kW)  @  cols[n, g] (C_in/G*kH*kW, L)
    stride, padding (symmetric) and dilation: an int or a pair.
    """
    n, _, h, wd = x.shape
    c_out, cg, kh, kw = w.shape
    cols = F.unfold(x, (kh, kw), dilation=dilation, padding=padding, stride=stride)  # (N, C_in*kH*kW, L)
    cols = cols.view(n, groups, cg * kh * kw, -1)  # (N, G, C_in/G*kH*kW, L)
    wg = w.reshape(groups, c_out // groups, cg * kh * kw)  # (G, C_out/G, C_in/G*kH*kW)
    out = wg @ cols  # (N, G, C_out/G, L)
    out = out.reshape(n, c_out, -1)  # (N, C_out, L)
    if b is not None:
        out = out + b.view(1, c_out, 1)
    ho, wo = _conv_out(h, kh, stride, padding, dilation, 0), _conv_out(wd, kw, stride, padding, dilation, 1)
    return out.view(n, c_out, ho, wo), (cols, wg, x.shape, w.shape, b is not None, stride, padding, dilation)


def conv2d_backward(dout: Tensor, cache: tuple) -> tuple[Tensor, Tensor, Tensor | None]:
    """Back through conv2d_forward: dout (N, C_out, H_out, W_out) -> dx, dw, db (None without a bias).

    The matrix product's two gradients, per group:  dw[g] = sum_n dout[n, g] @ cols[n, g]^T  and
    dcols[n, g] = w[g]^T @ dout[n, g];  then ``F.fold`` -- unfold's adjoint -- adds each column back onto
    the pixels it was copied from (a pixel in several receptive fields receives the sum).
    """
    cols, wg, x_shape, w_shape, has_bias, stride, padding, dilation = cache
    n, c_out = dout.shape[:2]
    groups = wg.shape[0]
    d = dout.reshape(n, groups, c_out // groups, -1)  # (N, G, C_out/G, L)
    dw = (d @ cols.transpose(-1, -2)).sum(0)  # (G, C_out/G, C_in/G*kH*kW)
    dcols = wg.transpose(-1, -2) @ d  # (N, G, C_in/G*kH*kW, L)
    dx = F.fold(dcols.reshape(n, -1, dcols.shape[-1]), x_shape[2:], w_shape[2:], dilation=dilation,
                padding=padding, stride=stride)  # (N, C_in, H, W)
    db = dout.sum((0, 2, 3)) if has_bias else None
    return dx, dw.reshape(w_shape), db


def _conv_out(size: int, k: int, stride, padding, dilation, axis: int) -> int:
    at = lambda v: v if isinstance(v, int) else v[axis]  # noqa: E731
    return (size + 2 * at(padding) - at(dilation) * (k - 1) - 1) // at(stride) + 1


def attention_bias(L: int, S: int, attn_mask: Tensor | None = None, *, is_causal: bool = False,
                   dtype: torch.dtype = torch.float64, device=None) -> Tensor:
    """The masks of F.scaled_dot_product_attention as one additive bias, as torch's documentation writes its
    reference: 0 where query l may attend key s, -inf where not.  ``is_causal``: key s <= l (top-left aligned);
    a boolean ``attn_mask`` is True where attending is allowed; a float one is added as it is.
    -> (L, S), or the mask's broadcast shape (*, L, S)."""
    bias = torch.zeros(L, S, dtype=dtype, device=device)
    if is_causal:
        allowed = torch.ones(L, S, dtype=torch.bool, device=device).tril(diagonal=0)
        bias = bias.masked_fill(allowed.logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            bias = bias.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            bias = attn_mask + bias
    return bias


def attention_forward(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None, *, scale: float | None = None,
                      dropout_mask: Tensor | None = None) -> tuple[Tensor, tuple]:
    """Attention the textbook way, holding the (L, S) matrices (llm.c's ``preatt`` and ``att``):

    q (*, L, E), k (*, S, E), v (*, S, Ev), bias broadcastable to (*, L, S) (``attention_bias``),
    dropout_mask (*, L, S) of 0 or 1/(1-p) -> out (*, L, Ev).

        preatt = scale * q @ k^T + bias      (*, L, S)
        P      = softmax(preatt) per row      (*, L, S)   a row with every key masked: zeros (torch's choice)
        att    = P * dropout_mask             (*, L, S)
        out    = att @ v                      (*, L, Ev)
    """
    scale = 1.0 / q.shape[-1] ** 0.5 if scale is None else scale
    preatt = q @ k.transpose(-2, -1) * scale  # (*, L, S)
    if bias is not None:
        preatt = preatt + bias
    rowmax = preatt.amax(-1, keepdim=True)  # subtract the row max: exp cannot overflow
    rowmax = torch.where(rowmax == float("-inf"), torch.zeros_like(rowmax), rowmax)  # a fully masked row
    e = torch.exp(preatt - rowmax)  # (*, L, S)
    total = e.sum(-1, keepdim=True)
    P = e / torch.where(total == 0, torch.ones_like(total), total)  # zeros where every key is masked
    att = P if dropout_mask is None else P * dropout_mask
    out = att @ v  # (*, L, Ev)
    return out, (q, k, v, P, att, dropout_mask, scale)


def attention_backward(dout: Tensor, cache: tuple) -> tuple[Tensor, Tensor, Tensor]:
    """Back through attention_forward: dout (*, L, Ev) -> dq (*, L, E), dk (*, S, E), dv (*, S, Ev).

    out = att @ v:          datt = dout @ v^T,  dv = att^T @ dout
    att = P * mask:         dP = datt * mask
    P = softmax(preatt):    dpreatt = P * (dP - rowsum(dP * P))      (the softmax's Jacobian, row by row)
    preatt = scale q k^T:   dq = scale * dpreatt @ k,  dk = scale * dpreatt^T @ q
    """
    q, k, v, P, att, dropout_mask, scale = cache
    datt = dout @ v.transpose(-2, -1)  # (*, L, S)
    dv = att.transpose(-2, -1) @ dout  # (*, S, Ev)
    dP = datt if dropout_mask is None else datt * dropout_mask
    dpreatt = P * (dP - (dP * P).sum(-1, keepdim=True))  # (*, L, S)
    dq = dpreatt @ k * scale  # (*, L, E)
    dk = dpreatt.transpose(-2, -1) @ q * scale  # (*, S, E)
    return dq, dk, dv


# -- recurrent networks: one cell's forward and backward, then a loop over time ---------------------------------
# min-char-rnn's and CS231n's way: the forward applies the cell at each step carrying h (and c); the backward
# runs from the last step to the first carrying dh_next (and dc_next), adding each step's weight gradients.
# torch's conventions: weights (G*H, I) and (G*H, H), two biases, LSTM gates stacked (i, f, g, o), GRU gates
# (r, z, n) with the reset gate multiplying W_hn h + b_hn.  Weight gradients come back in a dict named as the
# torch.nn cell's parameters.  T = time steps, N = batch, I = inputs, H = hidden, P = LSTM projection.

def rnn_step_forward(x: Tensor, h_prev: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor,
                     nonlinearity: str = "tanh") -> tuple[Tensor, tuple]:
    """x (N, I), h_prev (N, H) -> h (N, H) = act(x W_ih^T + b_ih + h_prev W_hh^T + b_hh)."""
    a = x @ w_ih.T + b_ih + h_prev @ w_hh.T + b_hh
    h = torch.tanh(a) if nonlinearity == "tanh" else torch.relu(a)
    return h, (x, h_prev, h, w_ih, w_hh, nonlinearity)


def rnn_step_backward(dh: Tensor, cache: tuple) -> tuple[Tensor, Tensor, dict]:
    """dh (N, H) -> dx (N, I), dh_prev (N, H), weight gradients.  tanh' = 1 - h^2; relu' = 1 where h > 0."""
    x, h_prev, h, w_ih, w_hh, nonlinearity = cache
    da = dh * (1 - h ** 2) if nonlinearity == "tanh" else dh * (h > 0)
    grads = {"weight_ih": da.T @ x, "weight_hh": da.T @ h_prev, "bias_ih": da.sum(0), "bias_hh": da.sum(0)}
    return da @ w_ih, da @ w_hh, grads


def lstm_step_forward(x: Tensor, h_prev: Tensor, c_prev: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor,
                      b_hh: Tensor, w_hr: Tensor | None = None) -> tuple[Tensor, Tensor, tuple]:
    """x (N, I), h_prev (N, H or P), c_prev (N, H) -> h (N, H or P), c (N, H).

    a = x W_ih^T + b_ih + h_prev W_hh^T + b_hh (N, 4H), split as torch stacks it: i, f, g, o.
    c = f c_prev + i g,  h = o tanh(c)  (with a projection W_hr (P, H): h = (o tanh(c)) W_hr^T).
    """
    a = x @ w_ih.T + b_ih + h_prev @ w_hh.T + b_hh
    ai, af, ag, ao = a.chunk(4, 1)
    i, f, g, o = torch.sigmoid(ai), torch.sigmoid(af), torch.tanh(ag), torch.sigmoid(ao)
    c = f * c_prev + i * g
    tc = torch.tanh(c)
    r = o * tc
    h = r if w_hr is None else r @ w_hr.T
    return h, c, (x, h_prev, c_prev, i, f, g, o, tc, r, w_ih, w_hh, w_hr)


def lstm_step_backward(dh: Tensor, dc: Tensor, cache: tuple) -> tuple[Tensor, Tensor, Tensor, dict]:
    """dh (N, H or P), dc (N, H) -> dx, dh_prev, dc_prev, weight gradients.

    Through h = o tanh(c): do = dh tanh(c), and c gets dh o (1 - tanh(c)^2) on top of what reaches it from
    the next step.  Through c = f c_prev + i g: di = dc g, df = dc c_prev, dg = dc i, dc_prev = dc f.
    Then each gate's pre-activation: sigmoid' = s (1 - s), tanh' = 1 - t^2.
    """
    x, h_prev, c_prev, i, f, g, o, tc, r, w_ih, w_hh, w_hr = cache
    grads = {}
    if w_hr is not None:
        grads["weight_hr"] = dh.T @ r
        dh = dh @ w_hr  # the gradient of r = o tanh(c)
    do = dh * tc
    dc = dc + dh * o * (1 - tc ** 2)
    di, df, dg, dc_prev = dc * g, dc * c_prev, dc * i, dc * f
    da = torch.cat([di * i * (1 - i), df * f * (1 - f), dg * (1 - g ** 2), do * o * (1 - o)], 1)  # (N, 4H)
    grads.update(weight_ih=da.T @ x, weight_hh=da.T @ h_prev, bias_ih=da.sum(0), bias_hh=da.sum(0))
    return da @ w_ih, da @ w_hh, dc_prev, grads


def gru_step_forward(x: Tensor, h_prev: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor
                     ) -> tuple[Tensor, tuple]:
    """x (N, I), h_prev (N, H) -> h (N, H), torch's GRU:

    r = sigmoid(x W_ir^T + b_ir + h W_hr^T + b_hr),  z = sigmoid(x W_iz^T + b_iz + h W_hz^T + b_hz)
    n = tanh(x W_in^T + b_in + r * (h W_hn^T + b_hn)),  h' = (1 - z) n + z h
    """
    gi, gh = x @ w_ih.T + b_ih, h_prev @ w_hh.T + b_hh  # (N, 3H) each
    i_r, i_z, i_n = gi.chunk(3, 1)
    h_r, h_z, h_n = gh.chunk(3, 1)
    r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    h = (1 - z) * n + z * h_prev
    return h, (x, h_prev, r, z, n, h_n, w_ih, w_hh)


def gru_step_backward(dh: Tensor, cache: tuple) -> tuple[Tensor, Tensor, dict]:
    """dh (N, H) -> dx, dh_prev, weight gradients.  h' = (1 - z) n + z h: dn = dh (1 - z), dz = dh (h - n),
    and h gets dh z directly; n = tanh(i_n + r h_n): its pre-activation gets dn (1 - n^2), which reaches i_n
    as is, h_n times r and r times h_n."""
    x, h_prev, r, z, n, h_n, w_ih, w_hh = cache
    dn, dz = dh * (1 - z), dh * (h_prev - n)
    dan = dn * (1 - n ** 2)  # the pre-activation of n
    dr, dh_n = dan * h_n, dan * r
    dar, daz = dr * r * (1 - r), dz * z * (1 - z)
    dgi, dgh = torch.cat([dar, daz, dan], 1), torch.cat([dar, daz, dh_n], 1)  # (N, 3H) each
    grads = {"weight_ih": dgi.T @ x, "weight_hh": dgh.T @ h_prev, "bias_ih": dgi.sum(0), "bias_hh": dgh.sum(0)}
    return dgi @ w_ih, dh * z + dgh @ w_hh, grads


def _add_grads(total: dict, step: dict) -> dict:
    return {k: total[k] + v for k, v in step.items()} if total else dict(step)


def rnn_forward(x: Tensor, h0: Tensor, params: dict, nonlinearity: str = "tanh") -> tuple[Tensor, list]:
    """x (T, N, I), h0 (N, H) -> hs (T, N, H), the caches: the cell at every step, h carried forward.
    params: the cell's tensors by torch.nn.RNNCell's names (weight_ih, weight_hh, bias_ih, bias_hh)."""
    h, hs, caches = h0, [], []
    for t in range(x.shape[0]):
        h, cache = rnn_step_forward(x[t], h, params["weight_ih"], params["weight_hh"], params["bias_ih"],
                                    params["bias_hh"], nonlinearity)
        hs.append(h)
        caches.append(cache)
    return torch.stack(hs), caches


def rnn_backward(dhs: Tensor, dh_n: Tensor, caches: list) -> tuple[Tensor, Tensor, dict]:
    """dhs (T, N, H) the outputs' gradients, dh_n (N, H) the last state's -> dx (T, N, I), dh0 (N, H), grads.
    Backpropagation through time: last step first, each step's dh = its output's gradient + dh_next."""
    dh_next, dxs, grads = dh_n, [None] * len(caches), {}
    for t in reversed(range(len(caches))):
        dxs[t], dh_next, g = rnn_step_backward(dhs[t] + dh_next, caches[t])
        grads = _add_grads(grads, g)
    return torch.stack(dxs), dh_next, grads


def lstm_forward(x: Tensor, h0: Tensor, c0: Tensor, params: dict) -> tuple[Tensor, Tensor, list]:
    """x (T, N, I), h0 (N, H or P), c0 (N, H) -> hs (T, N, H or P), c_n (N, H), the caches.
    params by torch's cell names, plus "weight_hr" (P, H) for a projection."""
    h, c, hs, caches = h0, c0, [], []
    for t in range(x.shape[0]):
        h, c, cache = lstm_step_forward(x[t], h, c, params["weight_ih"], params["weight_hh"], params["bias_ih"],
                                        params["bias_hh"], params.get("weight_hr"))
        hs.append(h)
        caches.append(cache)
    return torch.stack(hs), c, caches


def lstm_backward(dhs: Tensor, dh_n: Tensor, dc_n: Tensor, caches: list) -> tuple[Tensor, Tensor, Tensor, dict]:
    """dhs (T, N, H or P), dh_n, dc_n -> dx (T, N, I), dh0, dc0, grads; carrying dh_next and dc_next."""
    dh_next, dc_next, dxs, grads = dh_n, dc_n, [None] * len(caches), {}
    for t in reversed(range(len(caches))):
        dxs[t], dh_next, dc_next, g = lstm_step_backward(dhs[t] + dh_next, dc_next, caches[t])
        grads = _add_grads(grads, g)
    return torch.stack(dxs), dh_next, dc_next, grads


def gru_forward(x: Tensor, h0: Tensor, params: dict) -> tuple[Tensor, list]:
    """x (T, N, I), h0 (N, H) -> hs (T, N, H), the caches."""
    h, hs, caches = h0, [], []
    for t in range(x.shape[0]):
        h, cache = gru_step_forward(x[t], h, params["weight_ih"], params["weight_hh"], params["bias_ih"],
                                    params["bias_hh"])
        hs.append(h)
        caches.append(cache)
    return torch.stack(hs), caches


def gru_backward(dhs: Tensor, dh_n: Tensor, caches: list) -> tuple[Tensor, Tensor, dict]:
    """dhs (T, N, H), dh_n (N, H) -> dx (T, N, I), dh0 (N, H), grads."""
    dh_next, dxs, grads = dh_n, [None] * len(caches), {}
    for t in reversed(range(len(caches))):
        dxs[t], dh_next, g = gru_step_backward(dhs[t] + dh_next, caches[t])
        grads = _add_grads(grads, g)
    return torch.stack(dxs), dh_next, grads

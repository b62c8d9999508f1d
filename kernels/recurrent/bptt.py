"""Backpropagation through time arranged for speed: one direction of one recurrent layer over a whole sequence.

Shape legend (the recurrent layers'): T = time steps, N = batch, I = input features of this layer,
H = hidden_size, P = proj_size (LSTM only), H_out = P if P > 0 else H (the size of h),
G = gates stacked in the weights as torch stacks them (RNN 1; LSTM 4: i, f, g, o; GRU 3: r, z, n).

``layers/recurrent/stacked.py`` runs these for every layer and direction of RNN, LSTM and GRU, ``cells.py`` for one
step (T = 1), while the kernels are on.  ``layers/recurrent/cells.py`` has the same arithmetic as a reader derives
it -- one cell's forward and backward, and a loop over time carrying ``dh_next`` -- and tests/test_kernels.py ties
the two together in float64.  The recurrence is the only place where information moves across time.

How the work is arranged (the same for every kind):

forward    A = x @ W_ih^T + b             the input projections of all T steps: one GEMM, (T*N, I) x (I, G*H)
           per step t:  a = A[t] + h_{t-1} @ W_hh^T    one product with the add fused (W_hh prepacked once)
                        the gate arithmetic on the (N, G*H) slab, written with out= into preallocated
                        buffers (the product's (N, G*H) result is the loop's only allocation)
backward   the factors of the gate derivatives that do not depend on the upstream gradient (LSTM's
           o * (1 - tanh(c)^2), every sigmoid's s * (1 - s), ...): computed before the loop, as a few
           elementwise kernels over all steps (the LSTM's over a few steps at a time, from cache)
           per step:    dh = dy[t] + dA[t+1] @ W_hh          one product, add fused (dh_next of the textbook)
                        dA[t] = dh * factors                  2-4 elementwise kernels
           after the loop, each one matrix product over all T*N rows:
                        dW_ih = dA^T @ x,  dW_hh = dA^T @ h_prev,  db = column sums of dA,  dx = dA @ W_ih
           the parameter gradients are returned, by DirParams field, for the layer template to add into .grad
           (computed there, and only for a parameter that wants one: see ``Grads``)

The hidden states live in one buffer of T + 2 rows, ``hs``: hs[t + 1] = h_t for t = 0..T-1, and the initial
state at hs[0] (forward direction) or hs[T + 1] (reverse direction, which runs t = T-1 down to 0, so its
"previous" step is t + 1).  h_{t-1} of every step is then one contiguous slice -- hs[0:T] forward, hs[2:T+2]
reverse -- and dW_hh is one GEMM.  The LSTM keeps its cell states the same way.

Weights are kept in torch's layout, W_ih (G*H, I), W_hh (G*H, H_out): nn.Linear's, so ``linear(h, W_hh)`` is
h @ W_hh^T; the backward's products by W itself pass the view W.t(), read in place (``prepack``: the per-step
products read their weight once laid out for them, a copy per call at most).  The products go through
``matmul.py`` (oneDNN for float32 on an AMD CPU, torch.addmm otherwise).  On an AMD CPU tanh is computed as
2 sigmoid(2x) - 1 (``_tanh``: torch's float32 tanh is slower than its sigmoid there; docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from .. import cpp
from ..gradients import Product
from .matmul import AMD, linear, linear_add, linear_add_, prepack, weight_grad

SIGMOID_TANH: bool = AMD  # _tanh as 2 sigmoid(2x) - 1 (see there)


class DirParams(NamedTuple):
    """The parameters of one direction of one layer, torch's layout; None where absent (bias=False, no proj)."""

    w_ih: Tensor  # (G*H, I)
    w_hh: Tensor  # (G*H, H_out)
    b_ih: Tensor | None  # (G*H,)
    b_hh: Tensor | None  # (G*H,)
    w_hr: Tensor | None = None  # (P, H), LSTM with proj_size > 0


Grads = dict[str, Product | Callable[[], Tensor]]  # DirParams field -> its gradient, as the layer template takes it


# -- shared pieces ----------------------------------------------------------------------------------------


def _grads(
    d_rows: Tensor, weights: dict[str, Tensor], biases: tuple[str, ...] = (), p: DirParams | None = None
) -> Grads:
    """d (T*N, M) -> {field: dW = d^T @ x for each weight field and its x (T*N, K), summed over every step and
    sample; the column sums of d for each bias field that ``p`` has}: both biases of a gate are added to one
    pre-activation, so they get one gradient, summed once (a copy of its own for the second: .grad may become it)."""
    grads: Grads = {name: weight_grad(d_rows, x) for name, x in weights.items()}
    biases = tuple(name for name in biases if getattr(p, name) is not None)
    summed: list[Tensor] = []

    def db() -> Tensor:
        if summed:
            return summed[0].clone()
        summed.append(d_rows.sum(0))
        return summed[0]

    return grads | {name: db for name in biases}


def _tanh(x: Tensor, out: Tensor) -> Tensor:
    """tanh(x) into ``out`` (which may be x).  On an AMD CPU as 2 sigmoid(2x) - 1, an exact identity: faster where
    torch's float32 tanh is slow (docs/benchmarks.md has the figures); the rounding differs from tanh's by at most
    ~1 ulp of 1.  Elsewhere torch.tanh itself, which is the faster there."""
    if SIGMOID_TANH and x.device.type == "cpu":
        return torch.mul(x, 2, out=out).sigmoid_().mul_(2).sub_(1)
    return torch.tanh(x, out=out)


def _steps(T: int, reverse: bool) -> tuple[range, int]:
    """(the time steps in the order the forward runs them, the offset of h_{t-1} in hs: hs[t + offset])."""
    return (range(T - 1, -1, -1), 2) if reverse else (range(T), 0)


def _hidden_buffer(x: Tensor, T: int, N: int, size: int, h0: Tensor | None, *, reverse: bool) -> Tensor:
    """hs (T + 2, N, size), with h0 (zeros if None) at its initial row: 0 forward, T + 1 reverse."""
    hs = x.new_empty(T + 2, N, size)
    init = hs[T + 1] if reverse else hs[0]
    init.zero_() if h0 is None else init.copy_(h0)
    return hs


def _input_grad(dA2: Tensor, w_ih: Tensor, dx: Tensor | None) -> Tensor:
    """dx = dA @ W_ih, (T*N, G*H) x (G*H, I) -> (T*N, I); added to ``dx`` when given (a second direction)."""
    w = prepack(w_ih.t(), dA2)  # (I, G*H): linear(dA2, W_ih^T) = dA2 @ W_ih
    return linear(dA2, w) if dx is None else linear_add(dA2, w, dx)


class Cache(NamedTuple):
    """What one direction's forward keeps for its backward."""

    x2: Tensor  # (T*N, I) the input, for dW_ih
    p: DirParams
    reverse: bool
    hs: Tensor  # (T + 2, N, H_out) hidden states, see the module docstring
    act: Tensor  # (T, N, G*H) the gates' values (RNN: unused, hs holds them)
    extra: tuple  # what a kind needs besides: LSTM (cs, tc, rs, scratch), GRU (hg,), RNN (relu,)


# -- RNN --------------------------------------------------------------------------------------------------


def rnn_forward(
    x: Tensor, p: DirParams, h0: Tensor | None, *, reverse: bool, relu: bool
) -> tuple[Tensor, Tensor, Cache]:
    """Elman RNN, h_t = act(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh), act tanh or relu.

    x (T, N, I), h0 (N, H) or None (zeros) -> (y (T, N, H) in time order, h_n (N, H), cache).
    y and h_n are views of the cache: the caller copies what it hands out.
    """
    T, N, _ = x.shape
    H = p.w_hh.shape[0]
    x2 = x.reshape(T * N, -1)  # (T*N, I)
    bias = None if p.b_ih is None or p.b_hh is None else p.b_ih + p.b_hh  # (H,): both or neither
    A = linear(x2, p.w_ih, bias).view(T, N, H)  # (T, N, H) input terms, all steps in one GEMM
    hs = _hidden_buffer(x, T, N, H, h0, reverse=reverse)  # (T + 2, N, H)
    w_hh = prepack(p.w_hh, hs[0])  # (H, H), reused by every step
    steps, off = _steps(T, reverse)
    for t in steps:
        a = linear_add(hs[t + off], w_hh, A[t])  # (N, H) pre-activation
        torch.clamp_min(a, 0, out=hs[t + 1]) if relu else _tanh(a, out=hs[t + 1])  # (N, H) h_t
    return hs[1 : T + 1], hs[T if not reverse else 1], Cache(x2, p, reverse, hs, A, (relu,))


def rnn_backward(
    dy: Tensor, dh_n: Tensor | None, cache: Cache, *, need_dh0: bool, need_dx: bool = True, dx: Tensor | None = None
) -> tuple[Tensor | None, Tensor | None, Grads]:
    """dy (T, N, H), dh_n (N, H) or None -> (dx (T*N, I) or None, dh0 (N, H) or None, the parameter gradients).
    ``dx`` given (a second direction's): the input gradient is added to it.

    With a = the pre-activation, h = act(a):  da = dh * act'(a),  act' = 1 - h^2 (tanh) or [h > 0] (relu),
    and dh_{t-1} = da_t @ W_hh (plus dy_{t-1}, the output's own gradient).
    """
    x2, p, reverse, hs, scratch, (relu,) = cache
    T, N, H = dy.shape
    h = hs[1 : T + 1]  # (T, N, H)
    # act'(a) for all steps at once, into the input-projection buffer (dead after the forward)
    k = scratch.copy_(h > 0) if relu else torch.mul(h, h, out=scratch).neg_().add_(1)  # (T, N, H)
    dA = torch.empty_like(h)  # (T, N, H) dL/da per step
    w_hh_t = prepack(p.w_hh.t(), dA[0])  # (H, H) W_hh^T: linear(d, W_hh^T) = d @ W_hh
    steps, off = _steps(T, reverse)
    nxt = None
    for t in reversed(steps):
        if nxt is None:  # the last step the forward ran: dh = dy + dh_n
            d = dy[t] if dh_n is None else dy[t] + dh_n
        else:
            d = linear_add(dA[nxt], w_hh_t, dy[t])  # (N, H) dh_t = dy_t + da_{next} @ W_hh
        torch.mul(d, k[t], out=dA[t])  # (N, H) da_t
        nxt = t
    dA2 = dA.view(T * N, H)
    # dW_ih (H, I) = sum_t da_t^T x_t, dW_hh (H, H) = sum_t da_t^T h_{t-1}, db = sum_t da_t: over all rows at once
    grads = _grads(dA2, {"w_ih": x2, "w_hh": hs[off : off + T].reshape(T * N, H)}, ("b_ih", "b_hh"), p)
    dh0 = linear(dA[nxt], w_hh_t) if need_dh0 else None  # (N, H)
    return (_input_grad(dA2, p.w_ih, dx) if need_dx else None), dh0, grads


# -- LSTM -------------------------------------------------------------------------------------------------


def lstm_forward(
    x: Tensor, p: DirParams, h0: Tensor | None, c0: Tensor | None, *, reverse: bool
) -> tuple[Tensor, tuple[Tensor, Tensor], Cache]:
    """LSTM, torch's equations and gate order (i, f, g, o):

        [a_i, a_f, a_g, a_o] = x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh        (N, 4H)
        i, f, o = sigmoid(a_i, a_f, a_o),  g = tanh(a_g)
        c_t = f * c_{t-1} + i * g,  r_t = o * tanh(c_t),  h_t = r_t (P = 0) or r_t @ W_hr^T (N, P)

    x (T, N, I), h0 (N, H_out), c0 (N, H), either None (zeros) -> (y (T, N, H_out), (h_n, c_n), cache).
    y, h_n and c_n are views of the cache.
    """
    T, N, _ = x.shape
    H, Ho = p.w_hh.shape[0] // 4, p.w_hh.shape[1]
    x2 = x.reshape(T * N, -1)  # (T*N, I)
    bias = None if p.b_ih is None or p.b_hh is None else p.b_ih + p.b_hh  # (4H,): both or neither
    A = linear(x2, p.w_ih, bias).view(T, N, 4 * H)  # (T, N, 4H) input terms, all steps in one GEMM
    act = torch.empty_like(A)  # (T, N, 4H) gate values i, f, g, o
    gi, gf, gg, go = act.view(T, N, 4, H).unbind(2)  # (T, N, H) views, one per gate
    hs = _hidden_buffer(x, T, N, Ho, h0, reverse=reverse)  # (T + 2, N, H_out)
    cs = _hidden_buffer(x, T, N, H, c0, reverse=reverse)  # (T + 2, N, H) cell states, hs's layout
    tc = x.new_empty(T, N, H)  # (T, N, H) tanh(c_t)
    rs = x.new_empty(T, N, H) if p.w_hr is not None else None  # (T, N, H) r_t before the projection
    w_hh = prepack(p.w_hh, hs[0])  # (4H, H_out), reused by every step
    w_hr = None if p.w_hr is None else prepack(p.w_hr, tc[0])  # (P, H)
    steps, off = _steps(T, reverse)
    # every step's views made at once (unbind: one call each, not one indexing per step and buffer)
    a_, act_, h_, c_, tc_ = A.unbind(0), act.unbind(0), hs.unbind(0), cs.unbind(0), tc.unbind(0)
    i_, f_, g_, o_ = gi.unbind(0), gf.unbind(0), gg.unbind(0), go.unbind(0)
    ag_ = A[:, :, 2 * H : 3 * H].unbind(0)  # (N, H) g's pre-activation: where linear_add_ leaves it
    r_ = (rs if rs is not None else hs[1:]).unbind(0)  # (N, H) r_t = o * tanh(c_t): h_t itself when P = 0
    fused = cpp.usable(A, hs, cs)  # the gates in one C++ pass a step (kernels/cpp/recurrent.cpp)
    for t in steps:
        a = linear_add_(h_[t + off], w_hh, a_[t])  # (N, 4H) pre-activations, into A[t]: A[t] + h_{t-1} W_hh^T
        if fused:
            cpp.ops.lstm_gates_forward(a.contiguous(), c_[t + off], act_[t], c_[t + 1], tc_[t], r_[t])
            if w_hr is not None:
                h_[t + 1].copy_(linear(r_[t], w_hr))  # (N, P) h_t = r_t W_hr^T
            continue
        torch.sigmoid(a, out=act_[t])  # (N, 4H): i, f, o (and g's slot, overwritten next)
        _tanh(ag_[t] if a is a_[t] else a[:, 2 * H : 3 * H], out=g_[t])  # (N, H) g
        c = torch.mul(f_[t], c_[t + off], out=c_[t + 1])  # (N, H) f * c_{t-1}
        c.addcmul_(i_[t], g_[t])  # (N, H) c_t = f * c_{t-1} + i * g
        _tanh(c, out=tc_[t])  # (N, H)
        if rs is None or w_hr is None:  # (both or neither)
            torch.mul(o_[t], tc_[t], out=h_[t + 1])  # (N, H) h_t = o * tanh(c_t)
        else:
            h_[t + 1].copy_(linear(torch.mul(o_[t], tc_[t], out=rs[t]), w_hr))  # (N, P) h_t = r_t W_hr^T
    last = 1 if reverse else T
    # A (the input terms) is dead now; the cache keeps it as scratch memory for the backward's factors.
    return hs[1 : T + 1], (hs[last], cs[last]), Cache(x2, p, reverse, hs, act, (cs, tc, rs, A))


_FACTOR_STEPS = 4  # time steps per pass of _lstm_factors: their slabs stay in cache from one pass to the next


def _lstm_factors(act: Tensor, c_prev: Tensor, tc: Tensor, K: Tensor, Kc: Tensor) -> None:
    """The factors of the LSTM's gate derivatives that do not depend on the upstream gradient, for the steps of
    ``act`` (S, N, 4H) = [i, f, g, o], ``c_prev`` c_{t-1} and ``tc`` tanh(c_t) (S, N, H):

        K  = [g i (1 - i),  c_{t-1} f (1 - f),  i (1 - g^2),  tanh(c) o (1 - o)]      into K (S, N, 4H)
        Kc = o (1 - tanh(c)^2)                                                    into Kc (S, N, H)

    ``lstm_backward`` calls it on a few steps at a time: each pass after the first then reads what the one before
    left in cache, where over the whole sequence every pass would go to memory."""
    S, N, H4 = act.shape
    H = H4 // 4
    gi, _, gg, go = act.view(S, N, 4, H).unbind(2)  # (S, N, H) views
    torch.addcmul(act, act, act, value=-1, out=K)  # (S, N, 4H) s (1 - s) for every gate (g's slot replaced below)
    Ki, Kf, Kg, Ko = K.view(S, N, 4, H).unbind(2)  # (S, N, H) views
    Ki.mul_(gg)  # g i (1 - i)
    Kf.mul_(c_prev)  # c_{t-1} f (1 - f)
    torch.addcmul(gi, torch.mul(gi, gg, out=Kc), gg, value=-1, out=Kg)  # i (1 - g^2); Kc is scratch for i g
    Ko.mul_(tc)  # tanh(c) o (1 - o)
    torch.addcmul(go, torch.mul(go, tc, out=Kc), tc, value=-1, out=Kc)  # o (1 - tanh(c)^2)


def lstm_backward(
    dy: Tensor,
    dh_n: Tensor | None,
    dc_n: Tensor | None,
    cache: Cache,
    *,
    need_dh0: bool,
    need_dx: bool = True,
    dx: Tensor | None = None,
) -> tuple[Tensor | None, Tensor | None, Tensor, Grads]:
    """dy (T, N, H_out), dh_n (N, H_out), dc_n (N, H) (None: zeros) -> (dx (T*N, I) or None, dh0, dc0, the
    parameter gradients).

    Per step, with dh the total gradient reaching h_t (dy_t plus what flows back from step t+1) and dc_next
    the gradient reaching c_t from step t+1:

        dr  = dh (P = 0)  or  dh @ W_hr                                   (N, H)    [dW_hr += dh^T r_t]
        dc  = dc_next + dr * o * (1 - tanh(c_t)^2)                        h_t = o * tanh(c_t)
        da_o = dr * tanh(c_t) * o (1 - o)                                 sigmoid' = s (1 - s)
        da_i = dc * g * i (1 - i),  da_f = dc * c_{t-1} * f (1 - f),  da_g = dc * i * (1 - g^2)
        dc_next for step t-1 = dc * f,   dh for step t-1 = dy_{t-1} + da @ W_hh       (da = [da_i, da_f, da_g, da_o])

    Everything but dr and dc above is known from the forward: the factors K = [g i(1-i), c_{t-1} f(1-f),
    i (1-g^2), tanh(c) o(1-o)] (T, N, 4H) and o (1 - tanh(c)^2) (T, N, H) are computed before the loop
    (``_lstm_factors``), which is left with one product (two with P > 0) and four elementwise kernels per step.
    """
    x2, p, reverse, hs, act, (cs, tc, rs, K) = cache
    T, N, Ho = dy.shape
    H = act.shape[2] // 4
    gf = act.view(T, N, 4, H)[:, :, 1]  # (T, N, H) f
    steps, off = _steps(T, reverse)
    if cpp.usable(dy, act, cs):
        return _lstm_backward_fused(dy, dh_n, dc_n, cache, need_dh0=need_dh0, need_dx=need_dx, dx=dx)
    # The factors, before the loop; K reuses the forward's input-projection buffer.
    Kc = dy.new_empty(T, N, H)  # (T, N, H) o (1 - tanh(c)^2)
    c_prev = cs[off : off + T]  # (T, N, H) c_{t-1}
    for s in range(0, T, _FACTOR_STEPS):
        e = s + _FACTOR_STEPS
        _lstm_factors(act[s:e], c_prev[s:e], tc[s:e], K[s:e], Kc[s:e])
    K3, Ko = K.view(T, N, 4, H)[:, :, :3], K.view(T, N, 4, H)[:, :, 3]  # (T, N, 3, H) the factors of dc; of dr
    # dA is written over K, step by step: each step's da reads that step's factors only, and a buffer of this
    # size is a fresh mapping of memory (page faults) where it is allocated anew.
    dA = K  # (T, N, 4H) dL/da per step
    dA3, dAo = dA.view(T, N, 4, H)[:, :, :3], dA.view(T, N, 4, H)[:, :, 3]
    dc = dy.new_zeros(N, H) if dc_n is None else dc_n.clone()  # (N, H) dc_next
    dhs = dy.new_empty(T, N, Ho) if rs is not None else None  # (T, N, P) dh per step, for dW_hr
    w_hh_t = prepack(p.w_hh.t(), dA[0])  # (H_out, 4H) W_hh^T: linear(d, W_hh^T) = d @ W_hh
    w_hr_t = None if p.w_hr is None else prepack(p.w_hr.t(), dc)  # (H, P)
    dy_, dA_, dA3_, dAo_ = dy.unbind(0), dA.unbind(0), dA3.unbind(0), dAo.unbind(0)  # every step's views at once
    K3_, Ko_, Kc_, f_ = K3.unbind(0), Ko.unbind(0), Kc.unbind(0), gf.unbind(0)
    dc3 = dc.unsqueeze(1)  # (N, 1, H) a view of dc, which changes in place only
    nxt = None
    for t in reversed(steps):
        if nxt is None:  # the last step the forward ran: dh = dy + dh_n
            dh = dy_[t] if dh_n is None else dy_[t] + dh_n
        else:
            dh = linear_add(dA_[nxt], w_hh_t, dy_[t])  # (N, H_out) dy_t + da_{next} @ W_hh
        if dhs is None or w_hr_t is None:  # (both or neither)
            dr = dh  # (N, H)
        else:
            dr = linear(dhs[t].copy_(dh), w_hr_t)  # (N, H) dh @ W_hr
        dc.addcmul_(dr, Kc_[t])  # (N, H) dc = dc_next + dr * o (1 - tanh(c)^2)
        torch.mul(K3_[t], dc3, out=dA3_[t])  # (N, 3, H) da_i, da_f, da_g
        torch.mul(Ko_[t], dr, out=dAo_[t])  # (N, H) da_o
        dc.mul_(f_[t])  # (N, H) dc_next for the step before
        nxt = t
    dA2 = dA.view(T * N, 4 * H)
    # dW_ih (4H, I) = sum_t da_t^T x_t, dW_hh (4H, H_out) = sum_t da_t^T h_{t-1}, db = sum_t da_t: all rows at once
    grads = _grads(dA2, {"w_ih": x2, "w_hh": hs[off : off + T].reshape(T * N, Ho)}, ("b_ih", "b_hh"), p)
    if rs is not None and dhs is not None:  # (both or neither)
        grads |= _grads(dhs.view(T * N, Ho), {"w_hr": rs.view(T * N, H)})  # (P, H) sum_t dh_t^T r_t
    dh0 = linear(dA[nxt], w_hh_t) if need_dh0 else None  # (N, H_out)
    return (_input_grad(dA2, p.w_ih, dx) if need_dx else None), dh0, dc, grads


def _lstm_backward_fused(
    dy: Tensor,
    dh_n: Tensor | None,
    dc_n: Tensor | None,
    cache: Cache,
    *,
    need_dh0: bool,
    need_dx: bool,
    dx: Tensor | None,
) -> tuple[Tensor | None, Tensor | None, Tensor, Grads]:
    """``lstm_backward`` with each step's gate derivatives in one C++ pass (``lstm_gates_backward``: the same
    formulas, read from the forward's gates and tanh(c_t) as they are needed, so no factors before the loop)."""
    x2, p, reverse, hs, act, (cs, tc, rs, dA) = cache
    T, N, Ho = dy.shape
    H = act.shape[2] // 4
    steps, off = _steps(T, reverse)
    dy = dy.contiguous()  # (a direction's slice of a bidirectional layer's gradient is strided)
    dc = dy.new_zeros(N, H) if dc_n is None else dc_n.clone(memory_format=torch.contiguous_format)  # (N, H)
    dhs = dy.new_empty(T, N, Ho) if rs is not None else None  # (T, N, P) dh per step, for dW_hr
    w_hh_t = prepack(p.w_hh.t(), dA[0])  # (H_out, 4H) W_hh^T: linear(d, W_hh^T) = d @ W_hh
    w_hr_t = None if p.w_hr is None else prepack(p.w_hr.t(), dc)  # (H, P)
    dy_, dA_, act_, c_, tc_ = dy.unbind(0), dA.unbind(0), act.unbind(0), cs.unbind(0), tc.unbind(0)
    nxt = None
    for t in reversed(steps):
        if nxt is None:  # the last step the forward ran: dh = dy + dh_n
            dh = dy_[t] if dh_n is None else dy_[t] + dh_n
        else:
            dh = linear_add(dA_[nxt], w_hh_t, dy_[t])  # (N, H_out) dy_t + da_{next} @ W_hh
        if dhs is None or w_hr_t is None:  # (both or neither)
            dr = dh  # (N, H)
        else:
            dr = linear(dhs[t].copy_(dh), w_hr_t)  # (N, H) dh @ W_hr
        # da_t (N, 4H) into dA[t] (the forward's scratch); dc becomes what reaches c_{t-1}
        cpp.ops.lstm_gates_backward(dr.contiguous(), act_[t], c_[t + off], tc_[t], dc, dA_[t])
        nxt = t
    dA2 = dA.view(T * N, 4 * H)
    grads = _grads(dA2, {"w_ih": x2, "w_hh": hs[off : off + T].reshape(T * N, Ho)}, ("b_ih", "b_hh"), p)
    if rs is not None and dhs is not None:  # (both or neither)
        grads |= _grads(dhs.view(T * N, Ho), {"w_hr": rs.view(T * N, H)})  # (P, H) sum_t dh_t^T r_t
    dh0 = linear(dA[nxt], w_hh_t) if need_dh0 else None  # (N, H_out)
    return (_input_grad(dA2, p.w_ih, dx) if need_dx else None), dh0, dc, grads


# -- GRU --------------------------------------------------------------------------------------------------


def gru_forward(x: Tensor, p: DirParams, h0: Tensor | None, *, reverse: bool) -> tuple[Tensor, Tensor, Cache]:
    """GRU, torch's equations and gate order (r, z, n), the reset gate applied after the hidden matmul:

        [a_r, a_z, a_n] = x_t W_ih^T + b_ih              [m_r, m_z, m_n] = h_{t-1} W_hh^T + b_hh      (N, 3H)
        r = sigmoid(a_r + m_r),  z = sigmoid(a_z + m_z),  n = tanh(a_n + r * m_n)
        h_t = (1 - z) * n + z * h_{t-1}                   (computed as lerp(n, h_{t-1}, z))

    x (T, N, I), h0 (N, H) or None (zeros) -> (y (T, N, H), h_n (N, H), cache); y and h_n are views of the cache.
    """
    T, N, _ = x.shape
    H = p.w_hh.shape[0] // 3
    x2 = x.reshape(T * N, -1)  # (T*N, I)
    act = linear(x2, p.w_ih, p.b_ih).view(T, N, 3 * H)  # (T, N, 3H) input terms (one GEMM), become r, z, n
    mn = x.new_empty(T, N, H)  # (T, N, H) m_n = h_{t-1} W_hn^T + b_hn per step, kept for the backward
    hs = _hidden_buffer(x, T, N, H, h0, reverse=reverse)  # (T + 2, N, H)
    w_hh = prepack(p.w_hh, hs[0])  # (3H, H), reused by every step
    steps, off = _steps(T, reverse)
    fused = cpp.usable(act, hs)  # the gates in one C++ pass a step (kernels/cpp/recurrent.cpp)
    for t in steps:
        h_prev = hs[t + off]  # (N, H)
        m = linear(h_prev, w_hh, p.b_hh)  # (N, 3H) hidden terms
        a = act[t]
        if fused:  # a becomes r, z, n; m_n kept; h_t written
            cpp.ops.gru_gates_forward(a, m.contiguous(), h_prev, mn[t], hs[t + 1])
            continue
        rz = a[:, : 2 * H].add_(m[:, : 2 * H]).sigmoid_()  # (N, 2H) r, z
        n = a[:, 2 * H :].addcmul_(rz[:, :H], mn[t].copy_(m[:, 2 * H :]))  # (N, H) a_n + r * m_n
        _tanh(n, out=n)  # (N, H) n
        torch.lerp(n, h_prev, rz[:, H:], out=hs[t + 1])  # (N, H) h_t = n + z (h_{t-1} - n)
    last = 1 if reverse else T
    return hs[1 : T + 1], hs[last], Cache(x2, p, reverse, hs, act, (mn,))


def gru_backward(
    dy: Tensor, dh_n: Tensor | None, cache: Cache, *, need_dh0: bool, need_dx: bool = True, dx: Tensor | None = None
) -> tuple[Tensor | None, Tensor | None, Grads]:
    """dy (T, N, H), dh_n (N, H) or None -> (dx (T*N, I) or None, dh0 (N, H) or None, the parameter gradients).

    Per step, with dh the total gradient reaching h_t and h = n + z (h_prev - n):

        dz = dh * (h_prev - n),   dn = dh * (1 - z),   dh_prev gets dh * z directly
        da_n = dn * (1 - n^2)                      (the input side of n: a_n's gradient)
        dm_n = da_n * r,   dr = da_n * m_n         (the reset gate multiplies the hidden term m_n)
        da_r = dr * r (1 - r),  da_z = dz * z (1 - z)
        dh for step t-1 = dy_{t-1} + dh * z + [da_r, da_z, dm_n] @ W_hh

    So every gradient is dh times a factor known from the forward: K = [m_n r(1-r) (1-z)(1-n^2),
    (h_prev - n) z(1-z), r (1-z)(1-n^2), (1-z)(1-n^2)] (T, N, 4H), for all steps before the loop, which is
    left with a product, an addcmul and one broadcast multiply per step.  The hidden side's gradient is
    [da_r, da_z, dm_n] (the first 3H columns of dK), the input side's [da_r, da_z, da_n] (columns 0:2H, 3H:4H).
    """
    x2, p, reverse, hs, act, (mn,) = cache
    T, N, H = dy.shape
    r, z, n = act.view(T, N, 3, H).unbind(2)  # (T, N, H) views
    steps, off = _steps(T, reverse)
    h_prev = hs[off : off + T]  # (T, N, H)
    if cpp.usable(dy, act, hs):
        return _gru_backward_fused(dy, dh_n, cache, need_dh0=need_dh0, need_dx=need_dx, dx=dx)
    K = dy.new_empty(T, N, 4, H)  # the factors, for all steps at once
    Kr, Kz, Km, Kn = K.unbind(2)  # (T, N, H) views
    torch.addcmul(1 - z, (1 - z) * n, n, value=-1, out=Kn)  # (1 - z)(1 - n^2)
    torch.mul(Kn, r, out=Km)  # r (1 - z)(1 - n^2)
    torch.mul(Kn, mn, out=Kr).mul_(r - r * r)  # m_n (1 - z)(1 - n^2) r (1 - r)
    torch.mul(h_prev - n, z - z * z, out=Kz)  # (h_prev - n) z (1 - z)
    dK = torch.empty_like(K)  # (T, N, 4, H): [da_r, da_z, dm_n, da_n] per step
    dm = dK.view(T, N, 4 * H)[:, :, : 3 * H]  # (T, N, 3H) the hidden side's gradient (strided view)
    dhs = dy.new_empty(T, N, H)  # (T, N, H) dh per step
    w_hh_t = prepack(p.w_hh.t(), dhs[0])  # (H, 3H) W_hh^T: linear(d, W_hh^T) = d @ W_hh
    nxt = None
    for t in reversed(steps):
        if nxt is None:  # the last step the forward ran: dh = dy + dh_n
            dh = dhs[t].copy_(dy[t]) if dh_n is None else torch.add(dy[t], dh_n, out=dhs[t])
        else:
            d = linear_add(dm[nxt], w_hh_t, dy[t])  # (N, H) dy_t + [da_r, da_z, dm_n]_next @ W_hh
            dh = torch.addcmul(d, dhs[nxt], z[nxt], out=dhs[t])  # (N, H) + dh_next * z_next
        torch.mul(K[t], dh.unsqueeze(1), out=dK[t])  # (N, 4, H)
        nxt = t
    dK2 = dK.view(T * N, 4 * H)
    dm2 = dK2[
        :, : 3 * H
    ].contiguous()  # (T*N, 3H); contiguous: oneDNN's weight-gradient product is slow on a strided one
    da2 = torch.cat((dK2[:, : 2 * H], dK2[:, 3 * H :]), 1)  # (T*N, 3H) [da_r, da_z, da_n]
    grads = _grads(da2, {"w_ih": x2}, ("b_ih",), p)  # (3H, I) and b_ih from the input side
    grads |= _grads(dm2, {"w_hh": h_prev.reshape(T * N, H)}, ("b_hh",), p)  # (3H, H), b_hh: the hidden side
    dh0 = linear_add(dm[nxt], w_hh_t, dhs[nxt] * z[nxt]) if need_dh0 else None  # (N, H)
    return (_input_grad(da2, p.w_ih, dx) if need_dx else None), dh0, grads


def _gru_backward_fused(
    dy: Tensor, dh_n: Tensor | None, cache: Cache, *, need_dh0: bool, need_dx: bool, dx: Tensor | None
) -> tuple[Tensor | None, Tensor | None, Grads]:
    """``gru_backward`` with each step's gate derivatives in one C++ pass (``gru_gates_backward``: the same formulas,
    read from the forward's gates and m_n as they are needed, so no factors before the loop).  ``carry`` is
    dh_{t+1} z_{t+1}, the part of dh_t that reaches it directly rather than through the product by W_hh."""
    x2, p, reverse, hs, act, (mn,) = cache
    T, N, H = dy.shape
    steps, off = _steps(T, reverse)
    h_prev = hs[off : off + T]  # (T, N, H)
    dy = dy.contiguous()  # (a direction's slice of a bidirectional layer's gradient is strided)
    dm = dy.new_empty(T, N, 3 * H)  # (T, N, 3H): [da_r, da_z, dm_n] per step, the hidden side's gradient
    da_n = dy.new_empty(T, N, H)  # (T, N, H): with da_r, da_z the input side's
    carry = dy.new_zeros(N, H) if dh_n is None else dh_n.clone(memory_format=torch.contiguous_format)  # (N, H)
    w_hh_t = prepack(p.w_hh.t(), carry)  # (H, 3H) W_hh^T: linear(d, W_hh^T) = d @ W_hh
    dy_, dm_, dan_, act_, mn_ = dy.unbind(0), dm.unbind(0), da_n.unbind(0), act.unbind(0), mn.unbind(0)
    hp_ = h_prev.unbind(0)
    nxt = None
    for t in reversed(steps):
        d = dy_[t] if nxt is None else linear_add(dm[nxt], w_hh_t, dy_[t])  # (N, H) dy_t + dm_next @ W_hh
        cpp.ops.gru_gates_backward(d.contiguous(), act_[t], mn_[t], hp_[t], carry, dm_[t], dan_[t])
        nxt = t
    dm2 = dm.view(T * N, 3 * H)  # (T*N, 3H) contiguous: oneDNN's weight-gradient product is slow on a strided one
    da2 = torch.cat((dm2[:, : 2 * H], da_n.view(T * N, H)), 1)  # (T*N, 3H) [da_r, da_z, da_n]
    grads = _grads(da2, {"w_ih": x2}, ("b_ih",), p)  # (3H, I) and b_ih from the input side
    grads |= _grads(dm2, {"w_hh": h_prev.reshape(T * N, H)}, ("b_hh",), p)  # (3H, H), b_hh: the hidden side
    dh0 = linear_add(dm[nxt], w_hh_t, carry) if need_dh0 else None  # (N, H)
    return (_input_grad(da2, p.w_ih, dx) if need_dx else None), dh0, grads

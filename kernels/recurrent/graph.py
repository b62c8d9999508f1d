"""Backpropagation through time as torch.compile traces it: ``bptt.py``'s equations, written without buffers.

``bptt.py`` (beside this file) is written for eager speed: every step writes its gates and states with ``out=`` into
buffers allocated once (strided views of them, often), and its products go through oneDNN's prepacked matmul.
A compiler wants the opposite -- values, not places: torch.compile cannot trace an ``out=`` into a strided view,
and Inductor cannot lower oneDNN's op with a weight that is not a constant.  So while the step is being compiled
the recurrent layers and cells run these functions instead (``bptt.py`` hands over to them, and their caches
say which backward they need).  The arithmetic is the same -- the input projections of all steps in one product,
the factors of the gate derivatives for all steps before the backward loop, one product per step each way, the
weight gradients as one product over all T*N rows -- each step making new tensors, which the compiler fuses into
a few kernels a step and lays out in memory itself.  tests/test_compile.py ties the two to each other (and to
autograd) in float64.

Shapes and names as in ``bptt.py``: T steps, N batch, I input, H hidden, H_out = P or H; ``hp``/``cp`` are
h_{t-1}/c_{t-1} for every step t (T, N, .), in time order whichever way the layer runs.
"""

from __future__ import annotations

import sys
from types import ModuleType

import torch
from torch import Tensor

from . import bptt
from .bptt import Cache, DirParams, Grads, _grads, _steps


def for_forward() -> ModuleType:
    """The module whose forwards run now: this one while torch.compile traces the step, else ``bptt``."""
    return sys.modules[__name__] if torch.compiler.is_compiling() else bptt


def for_backward(cache: Cache) -> ModuleType:
    """The module whose backward takes ``cache``: the one whose forward made it."""
    return sys.modules[__name__] if isinstance(cache, GraphCache) else bptt


class GraphCache(Cache):
    """What one direction's compiled forward keeps: ``hs`` holds h_{t-1} per step (T, N, H_out), ``act`` the
    gates (T, N, G*H), ``extra`` what a kind needs besides (see each forward)."""


def _inputs(x: Tensor, w: Tensor, b_ih: Tensor | None, b_hh: Tensor | None) -> tuple[Tensor, Tensor]:
    """(x2 (T*N, I), A (T, N, G*H) = x W_ih^T + b_ih (+ b_hh)): the input projections of every step."""
    T, N = x.shape[:2]
    x2 = x.reshape(T * N, -1)
    bias = b_ih if b_ih is None or b_hh is None else b_ih + b_hh
    A = x2 @ w.t() if bias is None else torch.addmm(bias, x2, w.t())
    return x2, A.view(T, N, -1)


def _zeros_or(state: Tensor | None, like: Tensor, n: int, size: int) -> Tensor:
    return like.new_zeros(n, size) if state is None else state


def _in_time_order(per_step: dict[int, Tensor]) -> Tensor:
    return torch.stack([per_step[t] for t in range(len(per_step))])


def _finish(
    dA: Tensor, x2: Tensor, p: DirParams, hp: Tensor, first: int, *, need_dh0: bool, need_dx: bool, dx: Tensor | None
) -> tuple[Tensor | None, Tensor | None, Grads]:
    """The weight gradients over all rows, dh0 = dA[first] @ W_hh, dx = dA @ W_ih (+ dx): as bptt.py."""
    T, N, G = dA.shape
    dA2 = dA.reshape(T * N, G)
    grads = _grads(dA2, {"w_ih": x2, "w_hh": hp.reshape(T * N, -1)}, ("b_ih", "b_hh"), p)
    dh0 = dA[first] @ p.w_hh if need_dh0 else None
    if not need_dx:
        return None, dh0, grads
    return (dA2 @ p.w_ih if dx is None else torch.addmm(dx, dA2, p.w_ih)), dh0, grads


# -- RNN: h_t = act(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh) -------------------------------------------------


def rnn_forward(x: Tensor, p: DirParams, h0: Tensor | None, *, reverse: bool, relu: bool):
    T, N, _ = x.shape
    x2, A = _inputs(x, p.w_ih, p.b_ih, p.b_hh)
    h = _zeros_or(h0, x, N, p.w_hh.shape[0])
    hp, hs = {}, {}
    for t in _steps(T, reverse)[0]:
        hp[t] = h
        a = torch.addmm(A[t], h, p.w_hh.t())
        h = hs[t] = a.clamp_min(0) if relu else a.tanh()
    y = _in_time_order(hs)
    return y, h, GraphCache(x2, p, reverse, _in_time_order(hp), y, (relu,))


def rnn_backward(
    dy: Tensor,
    dh_n: Tensor | None,
    cache: GraphCache,
    *,
    need_dh0: bool,
    need_dx: bool = True,
    dx: Tensor | None = None,
):
    x2, p, reverse, hp, y, (relu,) = cache
    k = (y > 0).to(y.dtype) if relu else 1 - y * y  # act'(a) for every step
    steps = list(_steps(dy.shape[0], reverse)[0])
    dA, nxt = {}, None
    for t in reversed(steps):
        dh = (dy[t] if dh_n is None else dy[t] + dh_n) if nxt is None else torch.addmm(dy[t], dA[nxt], p.w_hh)
        dA[t] = dh * k[t]
        nxt = t
    return _finish(_in_time_order(dA), x2, p, hp, steps[0], need_dh0=need_dh0, need_dx=need_dx, dx=dx)


# -- LSTM: gates i, f, g, o; c_t = f c_{t-1} + i g; h_t = o tanh(c_t) (then @ W_hr^T with a projection) -----


def lstm_forward(x: Tensor, p: DirParams, h0: Tensor | None, c0: Tensor | None, *, reverse: bool):
    T, N, _ = x.shape
    H, Ho = p.w_hh.shape[0] // 4, p.w_hh.shape[1]
    x2, A = _inputs(x, p.w_ih, p.b_ih, p.b_hh)
    h, c = _zeros_or(h0, x, N, Ho), _zeros_or(c0, x, N, H)
    hp, cp, acts, tcs, rs, hs = {}, {}, {}, {}, {}, {}
    for t in _steps(T, reverse)[0]:
        hp[t], cp[t] = h, c
        a = torch.addmm(A[t], h, p.w_hh.t())  # (N, 4H)
        i, f, g, o = a.chunk(4, 1)
        i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
        acts[t] = torch.cat([i, f, g, o], 1)
        c = f * c + i * g
        tcs[t] = c.tanh()
        r = o * tcs[t]
        if p.w_hr is not None:
            rs[t] = r
            r = r @ p.w_hr.t()  # (N, P)
        h = hs[t] = r
    extra = (_in_time_order(cp), _in_time_order(tcs), _in_time_order(rs) if rs else None)
    return _in_time_order(hs), (h, c), GraphCache(x2, p, reverse, _in_time_order(hp), _in_time_order(acts), extra)


def lstm_backward(
    dy: Tensor,
    dh_n: Tensor | None,
    dc_n: Tensor | None,
    cache: GraphCache,
    *,
    need_dh0: bool,
    need_dx: bool = True,
    dx: Tensor | None = None,
):
    x2, p, reverse, hp, act, (cp, tc, rs) = cache
    i, f, g, o = act.chunk(4, 2)  # (T, N, H) each
    # the factors of bptt.lstm_backward, every step at once: da_{i,f,g} = dc * K3, da_o = dr * Ko, dc += dr * Kc
    K3 = torch.stack([g * i * (1 - i), cp * f * (1 - f), i * (1 - g * g)], 2)  # (T, N, 3, H)
    Ko, Kc = tc * o * (1 - o), o * (1 - tc * tc)
    steps = list(_steps(dy.shape[0], reverse)[0])
    dc = torch.zeros_like(cp[0]) if dc_n is None else dc_n
    dA, dhs, nxt = {}, {}, None
    for t in reversed(steps):
        dh = (dy[t] if dh_n is None else dy[t] + dh_n) if nxt is None else torch.addmm(dy[t], dA[nxt], p.w_hh)
        dhs[t] = dh
        dr = dh if p.w_hr is None else dh @ p.w_hr  # (N, H)
        dc = dc + dr * Kc[t]
        dA[t] = torch.cat([(K3[t] * dc.unsqueeze(1)).flatten(1), Ko[t] * dr], 1)  # (N, 4H)
        dc = dc * f[t]
        nxt = t
    dx, dh0, grads = _finish(_in_time_order(dA), x2, p, hp, steps[0], need_dh0=need_dh0, need_dx=need_dx, dx=dx)
    if rs is not None:  # dW_hr = sum_t dh_t^T r_t
        T, N, H = rs.shape
        grads |= _grads(_in_time_order(dhs).reshape(T * N, -1), {"w_hr": rs.reshape(T * N, H)})
    return dx, dh0, dc, grads


# -- GRU: r, z = sigmoid(...), n = tanh(a_n + r m_n), h_t = (1 - z) n + z h_{t-1} ------------------------------


def gru_forward(x: Tensor, p: DirParams, h0: Tensor | None, *, reverse: bool):
    T, N, _ = x.shape
    H = p.w_hh.shape[0] // 3
    x2, A = _inputs(x, p.w_ih, p.b_ih, None)  # b_hh belongs to the hidden side (r multiplies m_n)
    h = _zeros_or(h0, x, N, H)
    hp, acts, mns, hs = {}, {}, {}, {}
    for t in _steps(T, reverse)[0]:
        hp[t] = h
        m = h @ p.w_hh.t() if p.b_hh is None else torch.addmm(p.b_hh, h, p.w_hh.t())  # (N, 3H)
        a = A[t]
        rz = (a[:, : 2 * H] + m[:, : 2 * H]).sigmoid()
        r, z = rz[:, :H], rz[:, H:]
        mns[t] = m[:, 2 * H :]
        n = (a[:, 2 * H :] + r * mns[t]).tanh()
        acts[t] = torch.cat([r, z, n], 1)
        h = hs[t] = torch.lerp(n, h, z)
    y = _in_time_order(hs)
    return y, h, GraphCache(x2, p, reverse, _in_time_order(hp), _in_time_order(acts), (_in_time_order(mns),))


def gru_backward(
    dy: Tensor,
    dh_n: Tensor | None,
    cache: GraphCache,
    *,
    need_dh0: bool,
    need_dx: bool = True,
    dx: Tensor | None = None,
):
    x2, p, reverse, hp, act, (mn,) = cache
    r, z, n = act.chunk(3, 2)  # (T, N, H) each
    H = r.shape[2]
    # the factors of bptt.gru_backward: [da_r, da_z, dm_n, da_n] = dh * K, dh_{t-1} gets dh * z directly
    Kn = (1 - z) * (1 - n * n)
    K = torch.cat([mn * Kn * r * (1 - r), (hp - n) * z * (1 - z), r * Kn, Kn], 2)  # (T, N, 4H)
    steps = list(_steps(dy.shape[0], reverse)[0])
    dK: dict[int, Tensor] = {}
    nxt: int | None = None
    dh: Tensor  # set by the first step (nxt None) before any read
    for t in reversed(steps):
        if nxt is None:
            dh = dy[t] if dh_n is None else dy[t] + dh_n
        else:
            dh = torch.addmm(dy[t] + dh * z[nxt], dK[nxt][:, : 3 * H], p.w_hh)
        dK[t] = dh.repeat(1, 4) * K[t]
        nxt = t
    dKs = _in_time_order(dK)  # (T, N, 4H)
    T, N = dKs.shape[:2]
    dm, da = dKs[:, :, : 3 * H], torch.cat([dKs[:, :, : 2 * H], dKs[:, :, 3 * H :]], 2)
    dm2 = dm.reshape(T * N, 3 * H)
    da2 = da.reshape(T * N, 3 * H)
    grads = _grads(da2, {"w_ih": x2}, ("b_ih",), p) | _grads(dm2, {"w_hh": hp.reshape(T * N, H)}, ("b_hh",), p)
    first = steps[0]
    dh0 = torch.addmm(dh * z[first], dm[first], p.w_hh) if need_dh0 else None
    if not need_dx:
        return None, dh0, grads
    return (da2 @ p.w_ih if dx is None else torch.addmm(dx, da2, p.w_ih)), dh0, grads

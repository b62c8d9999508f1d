"""RNNCell, LSTMCell and GRUCell: one step of a recurrent layer, its equations, and the loop over time that calls them.

Shape legend: T = time steps, N = batch, I = input_size, H = hidden_size, P = proj_size (LSTM only), H_out = P if
P > 0 else H (the size of h), G = gates (RNN 1; LSTM 4: i, f, g, o; GRU 3: r, z, n).

The textbook, min-char-rnn's and CS231n's way: a step's forward and backward (``rnn_step``, ``lstm_step``,
``gru_step`` and their ``*_step_backward``), then a sequence as a loop over the steps carrying h (and c) forward,
and its backward from the last step to the first carrying dh_next (and dc_next), adding each step's weight
gradients (``rnn_forward`` ... ``gru_backward``: backpropagation through time).  torch's conventions: weights
(G*H, I) and (G*H, H_out), two biases, LSTM gates stacked (i, f, g, o), GRU gates (r, z, n) with the reset gate
multiplying W_hn h + b_hn (inside the product, unlike the original paper).  Weight gradients come back in a dict
by ``DirParams`` field (w_ih, w_hh, b_ih, b_hh, w_hr).  The recurrence is the only place where information moves
across time.

The kernels (kernels/recurrent/) run the same arithmetic arranged for speed -- the input projections of all steps
in one matrix product, the weights prepacked, the gate derivatives' factors for all steps before the loop, the
weight gradients as one product over all T*N rows -- with the same functions' signatures: ``recurrence()`` says
which run now (the kernels while they are on), ``recurrence_of(cache)`` which backward takes a forward's cache.

The cells as layers, twins of torch.nn's:

    RNNCell / GRUCell   forward(x, hx=None) -> h'           backward(dh') -> dx, or (dx, dh) when h was given
    LSTMCell            forward(x, hx=(h, c)) -> (h', c')     backward(dh', dc') -> dx, or (dx, (dh, dc))

x (N, I) or unbatched (I,); h, c, h', c' (N, H) or (H,); an omitted state is zeros; a None gradient is zeros.
The LSTMCell's backward also takes the pair as one argument, ``backward((dh', dc'))``.  One step is a sequence of
T = 1.  Parameters ``weight_ih`` (G*H, I), ``weight_hh`` (G*H, H), ``bias_ih``, ``bias_hh`` (G*H,): torch's names,
layout and initialisation, in its RNG order.  Written in the layer template (layers/template.py): the forward
returns the new state and a ``Saved``, the backward the gradients, and the base checks, keeps, versions and
accumulates.  ``backward_input`` takes and returns what ``backward`` does and leaves the parameter gradients to
``backward_weight()``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple, cast

import torch
from torch import Tensor

import kernels
from kernels.recurrent import graph
from kernels.recurrent.bptt import DirParams

from ..checks import BEFORE_FORWARD, Expects, check_bool, check_grads_like, check_int, check_like, check_tensor
from ..init import torch_recurrent_init_
from ..layer import BaseLayer, learned

PARAM_OF = {"w_ih": "weight_ih", "w_hh": "weight_hh", "b_ih": "bias_ih", "b_hh": "bias_hh"}  # DirParams -> ours


# -- one step: the cells' equations ---------------------------------------------------------------------------


def _affine(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """x @ w^T + b (b None: no bias), (N, G*H)."""
    return x @ w.T if b is None else x @ w.T + b


def rnn_step(x: Tensor, h_prev: Tensor, p: DirParams, relu: bool = False) -> tuple[Tensor, tuple]:
    """x (N, I), h_prev (N, H) -> h (N, H) = act(x W_ih^T + b_ih + h_prev W_hh^T + b_hh), act tanh or relu."""
    a = _affine(x, p.w_ih, p.b_ih) + _affine(h_prev, p.w_hh, p.b_hh)  # (N, H)
    h = torch.relu(a) if relu else torch.tanh(a)
    return h, (x, h_prev, h, p, relu)


def rnn_step_backward(dh: Tensor, cache: tuple) -> tuple[Tensor, Tensor, dict]:
    """dh (N, H) -> dx (N, I), dh_prev (N, H), the weight gradients.  tanh' = 1 - h^2; relu' = 1 where h > 0."""
    x, h_prev, h, p, relu = cache
    da = dh * (h > 0) if relu else dh * (1 - h**2)  # (N, H) the pre-activation's gradient
    grads = {"w_ih": da.T @ x, "w_hh": da.T @ h_prev, "b_ih": da.sum(0), "b_hh": da.sum(0)}
    return da @ p.w_ih, da @ p.w_hh, grads


def lstm_step(x: Tensor, h_prev: Tensor, c_prev: Tensor, p: DirParams) -> tuple[Tensor, Tensor, tuple]:
    """x (N, I), h_prev (N, H_out), c_prev (N, H) -> h (N, H_out), c (N, H):

    a = x W_ih^T + b_ih + h_prev W_hh^T + b_hh (N, 4H), split as torch stacks it: i, f, g, o
    i, f, o = sigmoid(a_i, a_f, a_o),  g = tanh(a_g)
    c = f c_prev + i g,   h = o tanh(c)   (with a projection W_hr (P, H): h = (o tanh(c)) W_hr^T)"""
    a = _affine(x, p.w_ih, p.b_ih) + _affine(h_prev, p.w_hh, p.b_hh)  # (N, 4H)
    ai, af, ag, ao = a.chunk(4, 1)
    i, f, g, o = torch.sigmoid(ai), torch.sigmoid(af), torch.tanh(ag), torch.sigmoid(ao)
    c = f * c_prev + i * g
    tc = torch.tanh(c)
    r = o * tc
    h = r if p.w_hr is None else r @ p.w_hr.T
    return h, c, (x, h_prev, c_prev, i, f, g, o, tc, r, p)


def lstm_step_backward(dh: Tensor, dc: Tensor, cache: tuple) -> tuple[Tensor, Tensor, Tensor, dict]:
    """dh (N, H_out), dc (N, H) -> dx, dh_prev, dc_prev, the weight gradients.

    Through h = o tanh(c): do = dh tanh(c), and c gets dh o (1 - tanh(c)^2) on top of what reaches it from the
    next step.  Through c = f c_prev + i g: di = dc g, df = dc c_prev, dg = dc i, dc_prev = dc f.  Then each gate's
    pre-activation: sigmoid' = s (1 - s), tanh' = 1 - t^2."""
    x, h_prev, c_prev, i, f, g, o, tc, r, p = cache
    grads = {}
    if p.w_hr is not None:
        grads["w_hr"] = dh.T @ r
        dh = dh @ p.w_hr  # the gradient of r = o tanh(c)
    do = dh * tc
    dc = dc + dh * o * (1 - tc**2)
    di, df, dg, dc_prev = dc * g, dc * c_prev, dc * i, dc * f
    da = torch.cat([di * i * (1 - i), df * f * (1 - f), dg * (1 - g**2), do * o * (1 - o)], 1)  # (N, 4H)
    grads.update(w_ih=da.T @ x, w_hh=da.T @ h_prev, b_ih=da.sum(0), b_hh=da.sum(0))
    return da @ p.w_ih, da @ p.w_hh, dc_prev, grads


def gru_step(x: Tensor, h_prev: Tensor, p: DirParams) -> tuple[Tensor, tuple]:
    """x (N, I), h_prev (N, H) -> h (N, H), torch's GRU:

    r = sigmoid(x W_ir^T + b_ir + h W_hr^T + b_hr),  z = sigmoid(x W_iz^T + b_iz + h W_hz^T + b_hz)
    n = tanh(x W_in^T + b_in + r * (h W_hn^T + b_hn)),  h' = (1 - z) n + z h"""
    gi, gh = _affine(x, p.w_ih, p.b_ih), _affine(h_prev, p.w_hh, p.b_hh)  # (N, 3H) each
    i_r, i_z, i_n = gi.chunk(3, 1)
    h_r, h_z, h_n = gh.chunk(3, 1)
    r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    h = (1 - z) * n + z * h_prev
    return h, (x, h_prev, r, z, n, h_n, p)


def gru_step_backward(dh: Tensor, cache: tuple) -> tuple[Tensor, Tensor, dict]:
    """dh (N, H) -> dx, dh_prev, the weight gradients.  h' = (1 - z) n + z h: dn = dh (1 - z), dz = dh (h - n), and
    h gets dh z directly; n = tanh(i_n + r h_n): its pre-activation gets dn (1 - n^2), which reaches i_n as is, h_n
    times r and r times h_n."""
    x, h_prev, r, z, n, h_n, p = cache
    dn, dz = dh * (1 - z), dh * (h_prev - n)
    dan = dn * (1 - n**2)  # the pre-activation of n
    dr, dh_n = dan * h_n, dan * r
    dar, daz = dr * r * (1 - r), dz * z * (1 - z)
    dgi, dgh = torch.cat([dar, daz, dan], 1), torch.cat([dar, daz, dh_n], 1)  # (N, 3H) each
    grads = {"w_ih": dgi.T @ x, "w_hh": dgh.T @ h_prev, "b_ih": dgi.sum(0), "b_hh": dgh.sum(0)}
    return dgi @ p.w_ih, dh * z + dgh @ p.w_hh, grads


# -- a sequence: the loop over time, and backpropagation through it ---------------------------------------------


class Steps(NamedTuple):
    """What the loop over time keeps: every step's cache, in the order the forward ran them."""

    x2: Tensor  # (T*N, I) the input, as the layers keep it
    order: range  # the time steps in the order the forward ran them (the reverse direction: T-1 down to 0)
    caches: list


def _forward(step, x: Tensor, state: list[Tensor], reverse: bool, *args) -> tuple[Tensor, list[Tensor], Steps]:
    """x (T, N, I), the initial state [h (, c)] -> (every step's h (T, N, H_out), the last state, Steps)."""
    T = x.shape[0]
    order = range(T - 1, -1, -1) if reverse else range(T)
    hs: list[Any] = [None] * T  # every step's h, each slot filled below
    caches = []
    for t in order:
        *state, cache = step(x[t], *state, *args)  # h (, c), carried to the next step
        hs[t] = state[0]
        caches.append(cache)
    return torch.stack(hs), state, Steps(x.reshape(T * x.shape[1], -1), order, caches)


def _backward(step_backward, dy: Tensor, dstate: list[Tensor], steps: Steps, dx: Tensor | None, need_dx: bool):
    """dy (T, N, H_out), the last state's gradients [dh (, dc)] -> (dx (T*N, I) or None, the initial state's
    gradients, the weight gradients summed over the steps): the last step first, each step's dh = its output's
    gradient + dh_next (the step after it's dh_prev)."""
    T = dy.shape[0]
    grads: dict[str, Tensor] = {}
    dxs: list[Any] = [None] * T  # every step's dx, each slot filled below
    for t, cache in zip(reversed(steps.order), reversed(steps.caches), strict=True):
        dstate[0] = dy[t] + dstate[0]
        dxs[t], *dstate, g = step_backward(*dstate, cache)
        grads = {k: grads[k] + v for k, v in g.items()} if grads else g
    if not need_dx:
        return None, dstate, grads
    d = torch.stack(dxs).reshape(T * dy.shape[1], -1)  # (T*N, I)
    return (d if dx is None else dx + d), dstate, grads


def _zeros(state: Tensor | None, like: Tensor, size: int) -> Tensor:
    return like.new_zeros(like.shape[1], size) if state is None else state


def _no_absent_biases(grads: dict, p: DirParams) -> dict:
    return {k: v for k, v in grads.items() if getattr(p, k) is not None}


def rnn_forward(x: Tensor, p: DirParams, h0: Tensor | None, *, reverse: bool, relu: bool):
    """x (T, N, I), h0 (N, H) or None (zeros) -> (y (T, N, H), h_n (N, H), Steps)."""
    y, (h,), steps = _forward(rnn_step, x, [_zeros(h0, x, p.w_hh.shape[0])], reverse, p, relu)
    return y, h, steps


def rnn_backward(
    dy: Tensor, dh_n: Tensor | None, steps: Steps, *, need_dh0: bool, need_dx: bool = True, dx: Tensor | None = None
):
    """dy (T, N, H), dh_n (N, H) or None -> (dx (T*N, I) or None, dh0 (N, H) or None, the weight gradients)."""
    dx, (dh0,), grads = _backward(rnn_step_backward, dy, [_zeros(dh_n, dy, dy.shape[2])], steps, dx, need_dx)
    return dx, (dh0 if need_dh0 else None), _no_absent_biases(grads, steps.caches[0][3])


def lstm_forward(x: Tensor, p: DirParams, h0: Tensor | None, c0: Tensor | None, *, reverse: bool):
    """x (T, N, I), h0 (N, H_out), c0 (N, H), either None (zeros) -> (y (T, N, H_out), (h_n, c_n), Steps)."""
    state = [_zeros(h0, x, p.w_hh.shape[1]), _zeros(c0, x, p.w_hh.shape[0] // 4)]
    y, (h, c), steps = _forward(lstm_step, x, state, reverse, p)
    return y, (h, c), steps


def lstm_backward(
    dy: Tensor,
    dh_n: Tensor | None,
    dc_n: Tensor | None,
    steps: Steps,
    *,
    need_dh0: bool,
    need_dx: bool = True,
    dx: Tensor | None = None,
):
    """dy (T, N, H_out), dh_n, dc_n (None: zeros) -> (dx (T*N, I) or None, dh0, dc0, the weight gradients)."""
    p = steps.caches[0][-1]
    dstate = [_zeros(dh_n, dy, dy.shape[2]), _zeros(dc_n, dy, p.w_hh.shape[0] // 4)]
    dx, (dh0, dc0), grads = _backward(lstm_step_backward, dy, dstate, steps, dx, need_dx)
    return dx, (dh0 if need_dh0 else None), dc0, _no_absent_biases(grads, p)


def gru_forward(x: Tensor, p: DirParams, h0: Tensor | None, *, reverse: bool):
    """x (T, N, I), h0 (N, H) or None (zeros) -> (y (T, N, H), h_n (N, H), Steps)."""
    y, (h,), steps = _forward(gru_step, x, [_zeros(h0, x, p.w_hh.shape[1])], reverse, p)
    return y, h, steps


def gru_backward(
    dy: Tensor, dh_n: Tensor | None, steps: Steps, *, need_dh0: bool, need_dx: bool = True, dx: Tensor | None = None
):
    """dy (T, N, H), dh_n (N, H) or None -> (dx (T*N, I) or None, dh0 (N, H) or None, the weight gradients)."""
    dx, (dh0,), grads = _backward(gru_step_backward, dy, [_zeros(dh_n, dy, dy.shape[2])], steps, dx, need_dx)
    return dx, (dh0 if need_dh0 else None), _no_absent_biases(grads, steps.caches[0][-1])


def recurrence() -> ModuleType:
    """The functions that run one direction of one layer over a sequence now (``rnn_forward`` ... ``gru_backward``):
    the kernels' while they are on (kernels/recurrent/bptt.py, or graph.py while torch.compile traces the step),
    else this module's loop."""
    return graph.for_forward() if kernels.enabled() else sys.modules[__name__]


def recurrence_of(cache) -> ModuleType:
    """The functions whose backward takes ``cache``: those whose forward made it."""
    return sys.modules[__name__] if isinstance(cache, Steps) else graph.for_backward(cache)


# -- the cells as layers ------------------------------------------------------------------------------------------


class _Cell(BaseLayer):
    _gates: int = 1  # G
    _states: tuple[str, ...] = ("h",)
    _param_names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    _ctor_args: tuple[str, ...] = ("input_size", "hidden_size", "bias")
    # each cell's one step of bptt.py's forward and backward (RNNCell, LSTMCell, GRUCell define them)
    _step: Callable[..., Any]
    _step_backward: Callable[..., Any]
    autograd_opaque = True  # as rnn.py's: out= into buffers, run under no_grad; gradcheck uses the twin
    expects = Expects(
        dims=(1, 2),
        size=(-1, "input_size"),
        like=("weight_ih",),
        shape="(N, {input_size}) or unbatched ({input_size},)",
    )
    as_module_refuses = "takes an initial state and returns its new state beside its output"

    class Saved(NamedTuple):
        """What the backward reads that a caller can reach, version-checked by the base (the state is copied into
        the layer's own buffer, the biases are not read), and the step's own buffers."""

        x: Tensor  # (N, I) the input, for dW_ih: a view of x where it can be
        weight_ih: Tensor  # (G*H, I), for dx
        weight_hh: Tensor  # (G*H, H), for dh
        step: Steps | tuple  # the one step's cache (T = 1), the textbook's or a kernel's
        batched: bool
        had_hx: bool
        shapes: tuple  # each new state's shape: what its gradient must match
        dtype: torch.dtype
        device: torch.device

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        name = type(self).__name__
        self.input_size = check_int(name, "input_size", input_size)
        self.hidden_size = check_int(name, "hidden_size", hidden_size)
        self.bias = check_bool(name, "bias", bias)
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"{name}: dtype must be floating point, got {dtype}")
        gh = self._gates * hidden_size  # G*H
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.weight_ih = torch.empty(gh, input_size, **kw)  # (G*H, I)
        self.weight_hh = torch.empty(gh, hidden_size, **kw)  # (G*H, H)
        self.bias_ih = torch.empty(gh, **kw) if bias else None  # (G*H,)
        self.bias_hh = torch.empty(gh, **kw) if bias else None  # (G*H,)
        torch_recurrent_init_(
            [p for p in (self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh) if p is not None], hidden_size
        )
        learned(self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)

    @classmethod
    def _ctor_kwargs(cls, obj: object) -> dict:
        return {name: getattr(obj, name) for name in cls._ctor_args}  # bias is a bool here, as in nn.LSTMCell

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if not self.bias:
            s += ", bias=False"
        nonlinearity = getattr(self, "nonlinearity", "tanh")  # (RNNCell's alone)
        if nonlinearity != "tanh":
            s += f", nonlinearity={nonlinearity!r}"
        return s

    def __call__(self, x: Tensor, hx=None):
        return self.forward(x, hx)

    def forward_math(self, x: Tensor, hx=None):
        """x (N, I) or (I,), hx the state (h, or the LSTM's (h, c)), each (N, H) or (H,), or None -> the new state,
        shaped as hx."""
        batched = x.dim() == 2
        x3 = x.reshape(1, -1, self.input_size)  # (T=1, N, I)
        N = x3.shape[1]
        state0 = self._initial_states(hx, N, batched=batched)
        finals, step = self._step(x3, DirParams(self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh), state0)
        new = [f.clone() if batched else f[0].clone() for f in finals]  # copies: the cache keeps its own
        saved = self.Saved(
            step.x2,
            self.weight_ih,
            self.weight_hh,
            step,
            batched,
            hx is not None,
            tuple(s.shape for s in new),
            x.dtype,
            x.device,
        )
        return (new[0] if len(new) == 1 else tuple(new)), saved

    def _initial_states(self, hx: object, N: int, *, batched: bool) -> list[Tensor | None]:
        if hx is None:
            return [None] * len(self._states)
        if len(self._states) == 1:
            parts = [hx]
        elif isinstance(hx, (tuple, list)) and len(hx) == 2:
            parts = list(hx)
        else:
            raise TypeError(f"{self!r}: the state must be the pair (h, c) of tensors, got {type(hx).__name__}")
        want = (N, self.hidden_size) if batched else (self.hidden_size,)
        for name, part in zip(self._states, parts, strict=True):
            part = check_tensor(repr(self), name, part)
            if part.shape != want:
                raise ValueError(
                    f"{self!r}: {name} has shape {tuple(part.shape)}, expected {want} "
                    f"({'(batch, hidden_size)' if batched else '(hidden_size,) for an unbatched x'})"
                )
            check_like(repr(self), name, part, self.weight_ih, "weight_ih")
        return [cast(Tensor, part).reshape(N, self.hidden_size) for part in parts]  # (each checked above)

    def backward_math(self, dh: Tensor | tuple | None, saved: Saved, dc: Tensor | None = None):
        """dh' (, dc') (None: zeros) -> (dx, or (dx, dstate) with dstate shaped as the forward's state; the
        parameter gradients): one step of bptt.py (T = 1)."""
        dout = _pair(dh, dc) if len(self._states) == 2 else (dh,)
        N, H = saved.x.shape[0], self.hidden_size
        dh = cast("Tensor | None", dout[0])  # (a tensor or None: the pair is split above)
        dy = (
            torch.zeros(1, N, H, dtype=saved.dtype, device=saved.device) if dh is None else dh.reshape(1, N, H)
        )  # (1, N, H)
        rest = [None if g is None else g.reshape(N, H) for g in dout[1:]]
        dx, d0, grads = self._step_backward(dy, rest, saved.step, need_d0=saved.had_hx)
        dx = dx.view(N, self.input_size) if saved.batched else dx.view(self.input_size)  # x's shape
        grads = {PARAM_OF[f]: g for f, g in grads.items()}
        if not saved.had_hx:
            return dx, grads
        d0 = [g if saved.batched else g[0] for g in d0]
        return (dx, (d0[0] if len(d0) == 1 else tuple(d0))), grads

    def check_dout(self, grads: tuple, meta, saved) -> None:
        """dh' (, dc'): each None (zeros) or shaped as the forward's new state."""
        if meta is None:
            raise RuntimeError(f"{self!r}: {BEFORE_FORWARD}")
        if len(grads) > len(self._states) or (len(self._states) == 1 and isinstance(grads[0], (tuple, list))):
            raise TypeError(
                f"{self!r}: backward takes {' and '.join(self._states)}'s gradients, got {len(grads)} arguments"
            )
        dout = _pair(*grads) if len(self._states) == 2 else grads
        check_grads_like(self, ("dh'", "dc'"), dout, saved.shapes, saved.dtype, saved.device)


class RNNCell(_Cell):
    """h' = act(x W_ih^T + b_ih + h W_hh^T + b_hh), act tanh or relu; backward: da = dh' * act'(a)."""

    torch_class = torch.nn.RNNCell
    _ctor_args = _Cell._ctor_args + ("nonlinearity",)

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        bias: bool = True,
        nonlinearity: str = "tanh",
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNNCell: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        self.nonlinearity = nonlinearity
        super().__init__(input_size, hidden_size, bias, device=device, dtype=dtype)

    def _step(self, x3, p, state0):
        _, h_n, cache = recurrence().rnn_forward(x3, p, state0[0], reverse=False, relu=self.nonlinearity == "relu")
        return [h_n], cache

    def _step_backward(self, dy, rest, step, *, need_d0):
        dx, dh0, grads = recurrence_of(step).rnn_backward(dy, None, step, need_dh0=need_d0)
        return dx, [dh0], grads


class LSTMCell(_Cell):
    """i, f, g, o from x W_ih^T + b_ih + h W_hh^T + b_hh (torch's order); c' = f c + i g, h' = o tanh(c').
    The gate derivatives are derived in ``lstm_step_backward``."""

    torch_class = torch.nn.LSTMCell
    _gates = 4
    _states = ("h", "c")

    def _step(self, x3, p, state0):
        _, (h_n, c_n), cache = recurrence().lstm_forward(x3, p, state0[0], state0[1], reverse=False)
        return [h_n, c_n], cache

    def _step_backward(self, dy, rest, step, *, need_d0):
        dx, dh0, dc0, grads = recurrence_of(step).lstm_backward(dy, None, rest[0], step, need_dh0=need_d0)
        return dx, [dh0, dc0], grads


class GRUCell(_Cell):
    """r, z, n from x W_ih^T + b_ih and h W_hh^T + b_hh (torch's order, the reset gate applied to W_hn h + b_hn);
    h' = (1 - z) n + z h.  The gate derivatives are derived in ``gru_step_backward``."""

    torch_class = torch.nn.GRUCell
    _gates = 3

    def _step(self, x3, p, state0):
        _, h_n, cache = recurrence().gru_forward(x3, p, state0[0], reverse=False)
        return [h_n], cache

    def _step_backward(self, dy, rest, step, *, need_d0):
        dx, dh0, grads = recurrence_of(step).gru_backward(dy, None, step, need_dh0=need_d0)
        return dx, [dh0], grads


def _pair(dh, dc=None) -> tuple:
    """(dh', dc') from the pair as one argument, ``backward((dh', dc'))``, or as two."""
    if isinstance(dh, (tuple, list)):
        if dc is not None or len(dh) != 2:
            raise TypeError("LSTMCell: backward takes (dh', dc') as one pair or as two arguments, not both")
        dh, dc = dh
    return dh, dc

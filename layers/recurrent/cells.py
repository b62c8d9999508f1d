"""RNNCell, LSTMCell and GRUCell: one step of a recurrent layer, the twins of torch.nn's cells.

Shape legend: N = batch, I = input_size, H = hidden_size, G = gates (RNN 1; LSTM 4: i, f, g, o; GRU 3: r, z, n).

    RNNCell / GRUCell   forward(x, hx=None) -> h'           backward(dh') -> dx, or (dx, dh) when h was given
    LSTMCell            forward(x, hx=(h, c)) -> (h', c')     backward(dh', dc') -> dx, or (dx, (dh, dc))

x (N, I) or unbatched (I,); h, c, h', c' (N, H) or (H,); an omitted state is zeros; a None gradient is zeros.
The LSTMCell's backward also takes the pair unpacked, ``backward(dh', dc')`` (the outputs' structure as
``gradcheck.check_layer`` passes it), or as one pair, ``backward((dh', dc'))``.  A loop over these cells is the textbook recurrence; the sequence layers
(rnn.py) run the same arithmetic -- one step here is ``bptt.py`` with T = 1 -- with the input
projections of all steps in one matrix product.  Parameters ``weight_ih`` (G*H, I), ``weight_hh`` (G*H, H),
``bias_ih``, ``bias_hh`` (G*H,): torch's names, layout and initialisation, in its RNG order.  Written in the layer
template (layers/template.py): the forward returns the new state and a ``Saved``, the backward the gradients, and
the base checks, keeps, versions and accumulates.

``backward_input`` takes and returns what ``backward`` does and leaves the parameter gradients to
``backward_weight()``: B is the step's backward (the pre-activation gradient dA, dx = dA @ W_ih, dh = dA @ W_hh),
W the products dW_ih = dA^T @ x, dW_hh = dA^T @ h and the biases' sums of dA (as stacked.py's split, T = 1).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..checks import BEFORE_FORWARD, Expects, check_bool, check_grads_like, check_int, check_like, check_tensor
from ..init import torch_recurrent_init_
from ..layer import BaseLayer, learned
from . import bptt_graph
from .bptt import Cache, DirParams

PARAM_OF = {"w_ih": "weight_ih", "w_hh": "weight_hh", "b_ih": "bias_ih", "b_hh": "bias_hh"}  # DirParams -> ours


class _Cell(BaseLayer):
    _gates: int = 1  # G
    _states: tuple[str, ...] = ("h",)
    _param_names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    _ctor_args = ("input_size", "hidden_size", "bias")
    autograd_opaque = True  # as rnn.py's: out= into buffers, run under no_grad; gradcheck uses the twin
    expects = Expects(dims=(1, 2), size=(-1, "input_size"), like=("weight_ih",),
                      shape="(N, {input_size}) or unbatched ({input_size},)")
    as_module_refuses = "takes an initial state and returns its new state beside its output"

    class Saved(NamedTuple):
        """What the backward reads that a caller can reach, version-checked by the base (the state is copied into
        the layer's own buffer, the biases are not read), and the step's own buffers."""
        x: Tensor  # (N, I) the input, for dW_ih: a view of x where it can be
        weight_ih: Tensor  # (G*H, I), for dx
        weight_hh: Tensor  # (G*H, H), for dh
        step: Cache  # bptt's cache of the one step (T = 1)
        batched: bool
        had_hx: bool
        shapes: tuple  # each new state's shape: what its gradient must match
        dtype: torch.dtype
        device: torch.device

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, *,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        name = type(self).__name__
        self.input_size = check_int(name, "input_size", input_size)
        self.hidden_size = check_int(name, "hidden_size", hidden_size)
        self.bias = check_bool(name, "bias", bias)
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"{name}: dtype must be floating point, got {dtype}")
        gh = self._gates * hidden_size  # G*H
        kw = {"device": device, "dtype": dtype}
        self.weight_ih = torch.empty(gh, input_size, **kw)  # (G*H, I)
        self.weight_hh = torch.empty(gh, hidden_size, **kw)  # (G*H, H)
        self.bias_ih = torch.empty(gh, **kw) if bias else None  # (G*H,)
        self.bias_hh = torch.empty(gh, **kw) if bias else None  # (G*H,)
        torch_recurrent_init_([p for p in (self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
                               if p is not None], hidden_size)
        learned(self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)

    @classmethod
    def _ctor_kwargs(cls, obj: object) -> dict:
        return {name: getattr(obj, name) for name in cls._ctor_args}  # bias is a bool here, as in nn.LSTMCell

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if not self.bias:
            s += ", bias=False"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            s += f", nonlinearity={self.nonlinearity!r}"
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
        saved = self.Saved(step.x2, self.weight_ih, self.weight_hh, step, batched, hx is not None,
                           tuple(s.shape for s in new), x.dtype, x.device)
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
        for name, part in zip(self._states, parts):
            check_tensor(repr(self), name, part)
            if part.shape != want:
                raise ValueError(f"{self!r}: {name} has shape {tuple(part.shape)}, expected {want} "
                                 f"({'(batch, hidden_size)' if batched else '(hidden_size,) for an unbatched x'})")
            check_like(repr(self), name, part, self.weight_ih, "weight_ih")
        return [part.reshape(N, self.hidden_size) for part in parts]

    def backward_math(self, dh: Tensor | tuple | None, saved: Saved, dc: Tensor | None = None):
        """dh' (, dc') (None: zeros) -> (dx, or (dx, dstate) with dstate shaped as the forward's state; the
        parameter gradients): one step of bptt.py (T = 1)."""
        dout = _pair(dh, dc) if len(self._states) == 2 else (dh,)
        N, H = saved.x.shape[0], self.hidden_size
        dh = dout[0]
        dy = torch.zeros(1, N, H, dtype=saved.dtype, device=saved.device) if dh is None \
            else dh.reshape(1, N, H)  # (1, N, H)
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
            raise TypeError(f"{self!r}: backward takes {' and '.join(self._states)}'s gradients, got {len(grads)} "
                            f"arguments")
        dout = _pair(*grads) if len(self._states) == 2 else grads
        check_grads_like(self, ("dh'", "dc'"), dout, saved.shapes, saved.dtype, saved.device)


class RNNCell(_Cell):
    """h' = act(x W_ih^T + b_ih + h W_hh^T + b_hh), act tanh or relu; backward: da = dh' * act'(a)."""

    torch_class = torch.nn.RNNCell
    _ctor_args = _Cell._ctor_args + ("nonlinearity",)

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh", *,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNNCell: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        self.nonlinearity = nonlinearity
        super().__init__(input_size, hidden_size, bias, device=device, dtype=dtype)

    def _step(self, x3, p, state0):
        _, h_n, cache = bptt_graph.for_forward().rnn_forward(x3, p, state0[0], reverse=False,
                                                             relu=self.nonlinearity == "relu")
        return [h_n], cache

    def _step_backward(self, dy, rest, step, *, need_d0):
        dx, dh0, grads = bptt_graph.for_backward(step).rnn_backward(dy, None, step, need_dh0=need_d0)
        return dx, [dh0], grads


class LSTMCell(_Cell):
    """i, f, g, o from x W_ih^T + b_ih + h W_hh^T + b_hh (torch's order); c' = f c + i g, h' = o tanh(c').
    The gate derivatives are derived in ``bptt.lstm_backward``."""

    torch_class = torch.nn.LSTMCell
    _gates = 4
    _states = ("h", "c")

    def _step(self, x3, p, state0):
        _, (h_n, c_n), cache = bptt_graph.for_forward().lstm_forward(x3, p, state0[0], state0[1], reverse=False)
        return [h_n, c_n], cache

    def _step_backward(self, dy, rest, step, *, need_d0):
        dx, dh0, dc0, grads = bptt_graph.for_backward(step).lstm_backward(dy, None, rest[0], step, need_dh0=need_d0)
        return dx, [dh0, dc0], grads


class GRUCell(_Cell):
    """r, z, n from x W_ih^T + b_ih and h W_hh^T + b_hh (torch's order, the reset gate applied to W_hn h + b_hn);
    h' = (1 - z) n + z h.  The gate derivatives are derived in ``bptt.gru_backward``."""

    torch_class = torch.nn.GRUCell
    _gates = 3

    def _step(self, x3, p, state0):
        _, h_n, cache = bptt_graph.for_forward().gru_forward(x3, p, state0[0], reverse=False)
        return [h_n], cache

    def _step_backward(self, dy, rest, step, *, need_d0):
        dx, dh0, grads = bptt_graph.for_backward(step).gru_backward(dy, None, step, need_dh0=need_d0)
        return dx, [dh0], grads


def _pair(dh, dc=None) -> tuple:
    """(dh', dc') from the pair as one argument, ``backward((dh', dc'))``, or as two."""
    if isinstance(dh, (tuple, list)):
        if dc is not None or len(dh) != 2:
            raise TypeError("LSTMCell: backward takes (dh', dc') as one pair or as two arguments, not both")
        dh, dc = dh
    return dh, dc

"""RNNCell, LSTMCell and GRUCell: one step of a recurrent layer, the twins of torch.nn's cells.

Shape legend: N = batch, I = input_size, H = hidden_size, G = gates (RNN 1; LSTM 4: i, f, g, o; GRU 3: r, z, n).

    RNNCell / GRUCell   forward(x, h=None) -> h'            backward(dh') -> dx, or (dx, dh) when h was given
    LSTMCell            forward(x, (h, c)=None) -> (h', c')   backward((dh', dc')) -> dx, or (dx, (dh, dc))

x (N, I) or unbatched (I,); h, c, h', c' (N, H) or (H,); an omitted state is zeros; a None gradient is zeros.
The LSTMCell's backward also takes the pair unpacked, ``backward(dh', dc')`` (the outputs' structure as
``gradcheck.check_layer`` passes it).  A loop over these cells is the textbook recurrence; the sequence layers
(rnn.py) run the same arithmetic -- one step here is ``bptt.py`` with T = 1 -- with the input
projections of all steps in one matrix product.  Parameters ``weight_ih`` (G*H, I), ``weight_hh`` (G*H, H),
``bias_ih``, ``bias_hh`` (G*H,): torch's names, layout and initialisation, in its RNG order.
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import bptt_graph
from .bptt import DirParams
from ..checks import check_floating, check_int, check_like, check_tensor
from ..init import torch_recurrent_init_
from ..layer import BaseLayer, learned
from ..saved import check_versions, versions


class _Cell(BaseLayer):
    _gates: int = 1  # G
    _states: tuple[str, ...] = ("h",)
    _param_names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    # What the backward reads that a caller can reach (the state is copied into the layer's own buffer, the biases
    # are not read): changed in place before backward, it is refused (layers/saved.py).
    _kept_names = ("its input x", "weight_ih", "weight_hh")
    _ctor_args = ("input_size", "hidden_size", "bias")
    autograd_opaque = True  # as rnn.py's: out= into buffers, run under no_grad; gradcheck uses the twin
    as_module_refuses = "takes an initial state and returns its new state beside its output"

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, *,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        name = type(self).__name__
        self.input_size = check_int(name, "input_size", input_size)
        self.hidden_size = check_int(name, "hidden_size", hidden_size)
        if not isinstance(bias, bool):
            raise ValueError(f"{name}: bias must be a bool, got {bias!r}")
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"{name}: dtype must be floating point, got {dtype}")
        self.bias = bias
        gh = self._gates * hidden_size  # G*H
        kw = {"device": device, "dtype": dtype}
        self.weight_ih = torch.empty(gh, input_size, **kw)  # (G*H, I)
        self.weight_hh = torch.empty(gh, hidden_size, **kw)  # (G*H, H)
        self.bias_ih = torch.empty(gh, **kw) if bias else None  # (G*H,)
        self.bias_hh = torch.empty(gh, **kw) if bias else None  # (G*H,)
        torch_recurrent_init_([p for p in (self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
                               if p is not None], hidden_size)
        learned(self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        self._cache: tuple | None = None

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

    def _run(self, x: Tensor, hx: object) -> list[Tensor]:
        """The step, x (N, I) or (I,) -> the new states [h' (, c')] as the caller hands them out."""
        w = self.weight_ih
        if not (isinstance(x, Tensor) and x.dim() in (1, 2) and x.shape[-1] == self.input_size
                and x.dtype == w.dtype and x.device == w.device):
            self._reject_input(x)
        batched = x.dim() == 2
        x3 = x.reshape(1, -1, self.input_size)  # (T=1, N, I)
        N = x3.shape[1]
        state0 = self._initial_states(hx, batched, N)
        p = DirParams(self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        finals, cache = self._step(x3, p, state0)
        new = [f.clone() if batched else f[0].clone() for f in finals]  # copies: the cache keeps its own
        self._cache = (cache, batched, hx is not None, [s.shape for s in new], x.dtype, x.device)
        self._versions = versions(cache.x2, self.weight_ih, self.weight_hh)  # x2: x as (N, I), a view where it can
        return new

    def _initial_states(self, hx: object, batched: bool, N: int) -> list[Tensor | None]:
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

    def _reject_input(self, x: object) -> None:
        check_tensor(repr(self), "x", x)
        check_floating(repr(self), "x", x)
        if x.dim() not in (1, 2) or x.shape[-1] != self.input_size:
            raise ValueError(f"{self!r}: expected input of shape (N, {self.input_size}) or unbatched "
                             f"({self.input_size},), got {tuple(x.shape)}")
        check_like(repr(self), "x", x, self.weight_ih, "weight_ih")

    def _backward(self, grads: list) -> object:
        """grads [dh' (, dc')] (None: zeros) -> dx, or (dx, dstate) with dstate shaped as the forward's state."""
        cache = self._cache
        if cache is None:
            raise RuntimeError(f"{self!r}: backward called before forward (or twice after one forward: "
                               f"each backward consumes the cache of the forward before it)")
        core, batched, had_hx, shapes, dtype, device = cache
        for name, g, shape in zip(("dh'", "dc'"), grads, shapes):
            if g is not None and not (isinstance(g, Tensor) and g.shape == shape and g.dtype == dtype
                                      and g.device == device):
                check_tensor(repr(self), name, g)
                if g.shape != shape:
                    raise ValueError(f"{self!r}: {name} has shape {tuple(g.shape)} but the forward's output had "
                                     f"shape {tuple(shape)}")
                check_like(repr(self), name, g, torch.empty(0, dtype=dtype, device=device), "the forward output")
        check_versions(self, self._kept_names, (core.x2, self.weight_ih, self.weight_hh), self._versions)
        self._cache = None
        N = core.x2.shape[0]
        H = self.hidden_size
        dh = grads[0]
        dy = torch.zeros(1, N, H, dtype=dtype, device=device) if dh is None else dh.reshape(1, N, H)  # (1, N, H)
        rest = [None if g is None else g.reshape(N, H) for g in grads[1:]]
        dx, d0 = self._step_backward(dy, rest, core, had_hx)
        dx = dx.view(N, self.input_size) if batched else dx.view(self.input_size)  # x's shape
        if not had_hx:
            return dx
        d0 = [g if batched else g[0] for g in d0]
        return dx, (d0[0] if len(d0) == 1 else tuple(d0))


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

    @torch.no_grad()
    def forward(self, x: Tensor, h: Tensor | None = None) -> Tensor:
        """x (N, I) or (I,), h (N, H) or (H,) or None -> h' (N, H) or (H,)."""
        return self._run(x, h)[0]

    def _step(self, x3, p, state0):
        _, h_n, cache = bptt_graph.for_forward().rnn_forward(x3, p, state0[0], False, self.nonlinearity == "relu")
        return [h_n], cache

    @torch.no_grad()
    def backward(self, dh: Tensor | None) -> Tensor | tuple[Tensor, Tensor]:
        """dh' -> dx, or (dx, dh) when the forward was given h."""
        return self._backward([dh])

    def _step_backward(self, dy, rest, core, need_d0):
        dx, dh0 = bptt_graph.for_backward(core).rnn_backward(dy, None, core, need_d0)
        return dx, [dh0]


class LSTMCell(_Cell):
    """i, f, g, o from x W_ih^T + b_ih + h W_hh^T + b_hh (torch's order); c' = f c + i g, h' = o tanh(c').
    The gate derivatives are derived in ``layers.recurrent.bptt.lstm_backward``."""

    torch_class = torch.nn.LSTMCell
    _gates = 4
    _states = ("h", "c")

    @torch.no_grad()
    def forward(self, x: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        """x (N, I) or (I,), hx = (h, c) each (N, H) or (H,), or None -> (h', c')."""
        h, c = self._run(x, hx)
        return h, c

    def _step(self, x3, p, state0):
        _, (h_n, c_n), cache = bptt_graph.for_forward().lstm_forward(x3, p, state0[0], state0[1], False)
        return [h_n, c_n], cache

    @torch.no_grad()
    def backward(self, dh: Tensor | tuple | None, dc: Tensor | None = None):
        """(dh', dc') -> dx, or (dx, (dh, dc)) when the forward was given (h, c).  Takes the pair as one argument,
        ``backward((dh', dc'))``, or unpacked, ``backward(dh', dc')``; either gradient may be None."""
        if isinstance(dh, (tuple, list)):
            if dc is not None or len(dh) != 2:
                raise TypeError(f"{self!r}: backward takes (dh', dc') as one pair or as two arguments, not both")
            dh, dc = dh
        return self._backward([dh, dc])

    def _step_backward(self, dy, rest, core, need_d0):
        dx, dh0, dc0 = bptt_graph.for_backward(core).lstm_backward(dy, None, rest[0], core, need_d0)
        return dx, [dh0, dc0]


class GRUCell(_Cell):
    """r, z, n from x W_ih^T + b_ih and h W_hh^T + b_hh (torch's order, the reset gate applied to W_hn h + b_hn);
    h' = (1 - z) n + z h.  The gate derivatives are derived in ``layers.recurrent.bptt.gru_backward``."""

    torch_class = torch.nn.GRUCell
    _gates = 3

    @torch.no_grad()
    def forward(self, x: Tensor, h: Tensor | None = None) -> Tensor:
        """x (N, I) or (I,), h (N, H) or (H,) or None -> h' (N, H) or (H,)."""
        return self._run(x, h)[0]

    def _step(self, x3, p, state0):
        _, h_n, cache = bptt_graph.for_forward().gru_forward(x3, p, state0[0], False)
        return [h_n], cache

    @torch.no_grad()
    def backward(self, dh: Tensor | None) -> Tensor | tuple[Tensor, Tensor]:
        """dh' -> dx, or (dx, dh) when the forward was given h."""
        return self._backward([dh])

    def _step_backward(self, dy, rest, core, need_d0):
        dx, dh0 = bptt_graph.for_backward(core).gru_backward(dy, None, core, need_d0)
        return dx, [dh0]

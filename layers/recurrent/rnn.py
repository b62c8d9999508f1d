"""RNN, LSTM and GRU: the twins of torch.nn's recurrent layers, with backpropagation through time by hand.

Each kind says which of the recurrence's functions run one direction of one layer (cells.py's loop over time,
or the kernels'); the stacking (layers, directions, dropout between layers, the states, the layouts, the checks)
is ``stacked.py``'s, shared.

``backward`` takes the gradients in the structure of the outputs and returns one per tensor input of the
forward: ``dx`` when the forward had no ``hx``, ``(dx, dhx)`` when it had one, ``dhx`` shaped as ``hx``
(the LSTM's ``(dh_0, dc_0)``) -- the initial states are inputs a user may train or carry across calls.
``backward_input`` takes and returns the same and leaves the parameter gradients to ``backward_weight()``.
"""

from __future__ import annotations

import torch

from .cells import recurrence, recurrence_of
from .stacked import _Recurrent


class _RecurrentLayer(_Recurrent):
    """RNN, LSTM and GRU: ``backward(doutput, dstate=None, need_input_grad=True)`` takes the gradients in the
    structure of the forward's outputs -- ``doutput`` the output's shape, ``dstate`` h_n's (the LSTM's: the pair
    (dh_n, dc_n)), any of them None for zeros -- and returns ``dx`` (the input's shape) when the forward had no
    hx, else ``(dx, dhx)``, ``dhx`` shaped as hx; ``need_input_grad=False`` skips dx (the first layer's
    dA @ W_ih) and gives None.  ``backward_input`` takes the same: the whole backward through time; the parameter
    gradients wait for ``backward_weight()`` (stacked.py's module docstring says what each pass computes)."""


class RNN(_RecurrentLayer):
    """Elman RNN, torch.nn.RNN's twin: h_t = act(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh), act tanh or relu.

    Backward through time (cells.py): da_t = dh_t * act'(a_t) with dh_t = dy_t + da_{t+1} @ W_hh.
    """

    torch_class = torch.nn.RNN
    _ctor_args = _Recurrent._ctor_args + ("nonlinearity",)

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: str = "tanh",
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNN: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        self.nonlinearity = nonlinearity
        super().__init__(
            input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, device=device, dtype=dtype
        )

    def _forward_dir(self, x, p, state0, *, reverse):
        y, h_n, cache = recurrence().rnn_forward(x, p, state0[0], reverse=reverse, relu=self.nonlinearity == "relu")
        return y, [h_n], cache

    def _backward_dir(self, dy, dfinal, cache, *, need_d0, need_dx, dx):
        dx, dh0, grads = recurrence_of(cache).rnn_backward(
            dy, dfinal[0], cache, need_dh0=need_d0, need_dx=need_dx, dx=dx
        )
        return dx, [dh0], grads


class LSTM(_RecurrentLayer):
    """Long short-term memory, torch.nn.LSTM's twin (gates i, f, g, o; two biases; optional projection P):

        i, f, g, o = sigmoid / sigmoid / tanh / sigmoid of (x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)
        c_t = f * c_{t-1} + i * g,   h_t = o * tanh(c_t)   (proj_size > 0: h_t = (o * tanh(c_t)) W_hr^T)

    The gate derivatives are derived in ``cells.lstm_step_backward``.  ``hx`` is the pair (h_0, c_0),
    ``backward(doutput, (dh_n, dc_n))``; with hx it returns ``(dx, (dh_0, dc_0))``.
    """

    torch_class = torch.nn.LSTM
    _gates = 4
    _states = ("h_0", "c_0")
    _ctor_args = _Recurrent._ctor_args + ("proj_size",)

    def _forward_dir(self, x, p, state0, *, reverse):
        y, (h_n, c_n), cache = recurrence().lstm_forward(x, p, state0[0], state0[1], reverse=reverse)
        return y, [h_n, c_n], cache

    def _backward_dir(self, dy, dfinal, cache, *, need_d0, need_dx, dx):
        dx, dh0, dc0, grads = recurrence_of(cache).lstm_backward(
            dy, dfinal[0], dfinal[1], cache, need_dh0=need_d0, need_dx=need_dx, dx=dx
        )
        return dx, [dh0, dc0], grads


class GRU(_RecurrentLayer):
    """Gated recurrent unit, torch.nn.GRU's twin (gates r, z, n; the reset gate multiplies W_hn h + b_hn):

        r, z = sigmoid(x_t W_i{r,z}^T + b_i{r,z} + h_{t-1} W_h{r,z}^T + b_h{r,z})
        n = tanh(x_t W_in^T + b_in + r * (h_{t-1} W_hn^T + b_hn)),   h_t = (1 - z) * n + z * h_{t-1}

    The gate derivatives are derived in ``cells.gru_step_backward``.
    """

    torch_class = torch.nn.GRU
    _gates = 3

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__(
            input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, device=device, dtype=dtype
        )

    def _forward_dir(self, x, p, state0, *, reverse):
        y, h_n, cache = recurrence().gru_forward(x, p, state0[0], reverse=reverse)
        return y, [h_n], cache

    def _backward_dir(self, dy, dfinal, cache, *, need_d0, need_dx, dx):
        dx, dh0, grads = recurrence_of(cache).gru_backward(
            dy, dfinal[0], cache, need_dh0=need_d0, need_dx=need_dx, dx=dx
        )
        return dx, [dh0], grads

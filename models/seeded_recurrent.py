"""SeededRNN, SeededLSTM, SeededGRU: nn.RNN/LSTM/GRU whose dropout between layers draws the hand-written layers' masks.

nn.LSTM's own dropout between layers is drawn inside its C++ kernel from torch's global generator, in an order
and layout nothing outside can reproduce.  These subclasses keep nn.LSTM's parameters, state_dict and kernels,
and change one thing: in training mode with dropout > 0 and more than one layer, the forward runs the layers one
at a time -- torch's own single-layer kernel (``torch._VF.lstm`` with num_layers=1, what nn.LSTM calls) -- and
multiplies each layer's output but the last by ``layers.dropout.inter_layer_mask``, drawn from ``generator``
exactly as the hand-written layer draws it.  Otherwise (eval mode, no dropout, one layer) it is nn.LSTM's
forward untouched.  Autograd differentiates ``y * mask``, so the backward reuses the mask.

``models.seeded_dropouts(module)`` turns every nn.RNN/LSTM/GRU inside a module into these (and every nn.Dropout
into a SeededDropout): ``seeded_dropouts(layer.to_torch())`` is the twin the trainer compares with.
"""

from __future__ import annotations

import torch
from torch import _VF, Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from layers.dropout import SeededDropout, inter_layer_mask


class _SeededMixin:
    """The layer-by-layer forward; each class below defines ``_vf(x, hx, weights) -> (y, h_n)``, the torch kernel
    of its kind run for one layer."""

    dropout: float  # the recurrent layer's, which this mixes into

    generator: torch.Generator | None = None  # where the masks are drawn from (None: torch's default)
    global_rows: tuple[int, int, int] | None = None  # data parallelism: this process's rows of the global batch

    @property
    def p(self) -> float:
        """The dropout probability between layers, under the name the dropout layers use (use_generator)."""
        return self.dropout

    def forward(self, input, hx=None):
        if not (self.training and self.dropout > 0 and self.num_layers > 1):
            return super().forward(input, hx)
        if isinstance(input, PackedSequence):
            raise TypeError(
                f"{type(self).__name__}: PackedSequence input is not supported with dropout between "
                f"layers in training mode; pad the batch"
            )
        lstm = isinstance(self, nn.LSTM)
        batched = input.dim() == 3
        x = input if batched else input.unsqueeze(0 if self.batch_first else 1)  # (T, N, I) or (N, T, I)
        D, L = 2 if self.bidirectional else 1, self.num_layers
        N = x.shape[0 if self.batch_first else 1]
        if hx is None:
            ho = self.proj_size if getattr(self, "proj_size", 0) else self.hidden_size
            zeros = lambda size: x.new_zeros(L * D, N, size)  # noqa: E731
            hx = (zeros(ho), zeros(self.hidden_size)) if lstm else zeros(ho)
        elif not batched:
            hx = tuple(h.unsqueeze(1) for h in hx) if lstm else hx.unsqueeze(1)
        self._update_flat_weights()  # as nn.LSTM's forward does (functional_call may have swapped the weights)
        self.check_forward_args(x, hx, None)
        per_layer = len(self._flat_weights) // L
        finals = []
        for k in range(L):
            weights = self._flat_weights[k * per_layer : (k + 1) * per_layer]
            h_k = tuple(h[k * D : (k + 1) * D] for h in hx) if lstm else hx[k * D : (k + 1) * D]
            x, state = self._vf(x, h_k, weights)
            finals.append(state)
            if k < L - 1:
                xt = x if not self.batch_first else x.transpose(0, 1)  # (T, N, F)
                mask = inter_layer_mask(
                    xt, self.dropout, generator=self.generator, global_rows=self.global_rows
                )  # (T, N, F)
                x = x * (mask if not self.batch_first else mask.transpose(0, 1))
        h_n = tuple(torch.cat([f[i] for f in finals]) for i in range(2)) if lstm else torch.cat(finals)
        if not batched:
            x = x.squeeze(0 if self.batch_first else 1)
            h_n = tuple(h.squeeze(1) for h in h_n) if lstm else h_n.squeeze(1)
        return x, h_n


class SeededRNN(_SeededMixin, nn.RNN):
    def _vf(self, x: Tensor, h: Tensor, weights: list[Tensor]):
        run = _VF.rnn_tanh if self.nonlinearity == "tanh" else _VF.rnn_relu
        y, h_n = run(x, h, weights, self.bias, 1, 0.0, self.training, self.bidirectional, self.batch_first)
        return y, h_n


class SeededLSTM(_SeededMixin, nn.LSTM):
    def _vf(self, x: Tensor, hc: tuple[Tensor, Tensor], weights: list[Tensor]):
        y, h_n, c_n = _VF.lstm(x, hc, weights, self.bias, 1, 0.0, self.training, self.bidirectional, self.batch_first)
        return y, (h_n, c_n)


class SeededGRU(_SeededMixin, nn.GRU):
    def _vf(self, x: Tensor, h: Tensor, weights: list[Tensor]):
        y, h_n = _VF.gru(x, h, weights, self.bias, 1, 0.0, self.training, self.bidirectional, self.batch_first)
        return y, h_n


SEEDED = {nn.RNN: SeededRNN, nn.LSTM: SeededLSTM, nn.GRU: SeededGRU}  # the class each becomes


def seeded_dropouts(module: torch.nn.Module) -> torch.nn.Module:
    """Turn every nn.Dropout inside ``module`` into a SeededDropout, and every nn.RNN/LSTM/GRU into its Seeded twin
    (above: the dropout between its layers drawn as the hand-written layer draws it); the
    same parameters and state, nothing to copy.  Returns ``module``."""
    for m in module.modules():
        if type(m) is nn.Dropout:
            m.__class__ = SeededDropout
        elif type(m) in SEEDED:
            m.__class__ = SEEDED[type(m)]
    return module

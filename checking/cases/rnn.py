"""The case family of the recurrent layers and cells (and the recurrent language model), checked with torch's own
kernels as the autograd oracle."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from layers import GRU, LSTM, RNN, GRUCell, Layer, LSTMCell, RNNCell
from models import RecurrentLM, seeded_dropouts

from ..checker import check_layer
from ..numeric import GradResult
from .make import F64, Case, rnd


class _TorchOracle:
    """A recurrent layer (RNN, LSTM, GRU, the cells) for check_layer, with torch.nn's kernels as the autograd oracle.

    These layers write into preallocated buffers with out=, which autograd cannot record, and say so
    (``autograd_opaque``).  Under grad mode -- only check_layer's autograd pass -- this runs their torch.nn twin
    instead, ``seeded_dropouts(layer.to_torch())`` (the same dropout masks), with the layer's own parameter tensors
    (in torch's layouts, as views) swapped in by ``torch.func.functional_call``: "vs autograd" is then the
    hand-written backward against autograd through nn.LSTM's (nn.GRU's, ...) own kernels, on the same weights and
    inputs.  Every other call is the layer's.
    """

    def __init__(self, layer):
        self.layer = layer
        self.twin = seeded_dropouts(layer.to_torch())

    def __repr__(self) -> str:
        return repr(self.layer)

    def named_parameters(self):
        return self.layer.named_parameters()

    def parameters(self) -> list[Tensor]:
        return self.layer.parameters()

    def forward(self, x, hx=None):
        if not torch.is_grad_enabled():
            return self.layer.forward(x, hx)
        self.twin.train(self.layer.training)
        return torch.func.functional_call(self.twin, self._attached_state(), (x,) if hx is None else (x, hx))

    def _attached_state(self) -> dict[str, Tensor]:
        """The layer's state_dict (torch's layouts: a Linear's weight as (H, D)) with each tensor rebuilt as a view
        of the parameter whose memory it shares: state_dict detaches, as torch.nn's does, and autograd must reach
        the parameters."""
        params = {p.untyped_storage().data_ptr(): p for p in self.layer.parameters()}
        state = {}
        for key, t in self.layer.state_dict().items():
            p = params.get(t.untyped_storage().data_ptr())
            state[key] = t if p is None else p.as_strided(t.shape, t.stride(), t.storage_offset())
        return state

    def backward(self, *douts):
        return self.layer.backward(*douts)


def recurrent_case(
    label: str,
    make: Callable[[], Layer],
    x_shape: tuple[int, ...],
    *,
    states: tuple | None = None,
    mode: str | None = None,
    vocab: int | None = None,
) -> Case:
    """A check of a recurrent layer or cell on a random input of ``x_shape`` (token ids below ``vocab`` if given)
    and, when ``states`` gives their shapes (a shape, or a pair of shapes for the LSTM's (h_0, c_0)), random
    initial states: their gradients are checked too.  The autograd oracle is the torch.nn twin (``_TorchOracle``)."""

    def run(fast: bool) -> list[GradResult]:
        layer = make()
        if mode is not None:
            layer.train(mode == "train")
        x = rnd(*x_shape) if vocab is None else torch.randint(0, vocab, x_shape)
        if states is None:
            inputs = x
        else:
            hx = tuple(rnd(*s) for s in states) if isinstance(states[0], tuple) else rnd(*states)
            inputs = (x, hx)
        tag = f" [{mode}]" if mode else ""
        where = f" x{x_shape}" + ("" if states is None else f" hx{states}")
        return check_layer(_TorchOracle(layer), inputs, name=f"{label}{tag}{where}", fast=fast)

    return run


def recurrent() -> dict[str, list[Case]]:
    """RNN, LSTM, GRU (layers, directions, projections, dropout, unbatched), their cells and RecurrentLM.

    Small sizes (T = 3-4, batch 2, hidden 3-5): every entry of every weight is perturbed twice."""

    def make(cls, *a, **kw):
        return lambda: cls(*a, dtype=F64, **kw)

    return {
        "rnn": [
            recurrent_case("RNN(3,4)", make(RNN, 3, 4), (4, 2, 3)),
            recurrent_case("RNN(3,4,relu,2 layers)", make(RNN, 3, 4, 2, "relu"), (4, 2, 3), states=(2, 2, 4)),
            recurrent_case(
                "RNN(3,3,bidirectional,batch_first,bias=False)",
                make(RNN, 3, 3, bias=False, batch_first=True, bidirectional=True),
                (2, 4, 3),
                states=(2, 2, 3),
            ),
            recurrent_case("RNN(3,4) unbatched", make(RNN, 3, 4), (4, 3), states=(1, 4)),
        ],
        "lstm": [
            recurrent_case("LSTM(3,4)", make(LSTM, 3, 4), (4, 2, 3)),
            recurrent_case(
                "LSTM(3,3,2 layers,bidirectional)",
                make(LSTM, 3, 3, 2, bidirectional=True),
                (3, 2, 3),
                states=((4, 2, 3), (4, 2, 3)),
            ),
            recurrent_case(
                "LSTM(3,4,proj_size=2,batch_first)",
                make(LSTM, 3, 4, proj_size=2, batch_first=True),
                (2, 4, 3),
                states=((1, 2, 2), (1, 2, 4)),
            ),
            recurrent_case("LSTM(3,3,2 layers,dropout=0.4)", make(LSTM, 3, 3, 2, dropout=0.4), (3, 2, 3), mode="train"),
            recurrent_case(
                "LSTM(2,3,proj_size=2,bidirectional) unbatched",
                make(LSTM, 2, 3, proj_size=2, bidirectional=True),
                (3, 2),
                states=((2, 2), (2, 3)),
            ),
        ],
        "gru": [
            recurrent_case("GRU(3,4)", make(GRU, 3, 4), (4, 2, 3), states=(1, 2, 4)),
            recurrent_case(
                "GRU(3,3,2 layers,bidirectional,batch_first)",
                make(GRU, 3, 3, 2, batch_first=True, bidirectional=True),
                (2, 3, 3),
                states=(4, 2, 3),
            ),
            recurrent_case("GRU(3,4,bias=False) unbatched", make(GRU, 3, 4, bias=False), (4, 3), states=(1, 4)),
        ],
        "rnncell": [
            recurrent_case("RNNCell(3,4)", make(RNNCell, 3, 4), (2, 3), states=(2, 4)),
            recurrent_case("RNNCell(3,4,relu)", make(RNNCell, 3, 4, nonlinearity="relu"), (2, 3)),
            recurrent_case("RNNCell(3,4) unbatched", make(RNNCell, 3, 4), (3,), states=(4,)),
        ],
        "lstmcell": [
            recurrent_case("LSTMCell(3,4)", make(LSTMCell, 3, 4), (2, 3), states=((2, 4), (2, 4))),
            recurrent_case("LSTMCell(3,4)", make(LSTMCell, 3, 4), (2, 3)),
            recurrent_case(
                "LSTMCell(3,4,bias=False) unbatched", make(LSTMCell, 3, 4, bias=False), (3,), states=((4,), (4,))
            ),
        ],
        "grucell": [
            recurrent_case("GRUCell(3,4)", make(GRUCell, 3, 4), (2, 3), states=(2, 4)),
            recurrent_case("GRUCell(3,4) unbatched", make(GRUCell, 3, 4), (3,), states=(4,)),
        ],
        "recurrentlm": [
            recurrent_case(
                "RecurrentLM(5,3,4,2 layers,lstm,dropout=0.3)",
                make(RecurrentLM, 5, 3, 4, 2, dropout=0.3),
                (2, 3),
                states=((2, 2, 4), (2, 2, 4)),
                mode="train",
                vocab=5,
            ),
            recurrent_case("RecurrentLM(5,3,4,gru)", make(RecurrentLM, 5, 3, 4, cell="gru"), (2, 3), vocab=5),
        ],
    }

"""A recurrent language model -- Embedding -> LSTM / GRU / RNN -> Linear -- by hand, and its nn.Module twin.

Shape legend: N = batch, T = time steps, V = vocab_size, E = embedding_dim, H = hidden_size, L = num_layers.

    idx (N, T) token ids -> embedding (N, T, E) -> recurrent layers (N, T, H) -> head (N, T, V) logits

``layers.Sequential`` chains layers of one input and one output; a recurrent layer also takes and returns its
state, so the model is this small class.  ``forward(idx, state=None) -> (logits, state_n)``: the state is the
recurrent layer's (h_n, or the LSTM's (h_n, c_n)), to carry into the next call (truncated backpropagation through
time: pass it on, its gradient is not followed across calls).  ``backward(dlogits, dstate=None)`` returns None
for the token ids, or ``(None, dstate_0)`` when the forward was given a state.

The twin, ``TorchRecurrentLM``, holds nn.Embedding, nn.LSTM (nn.GRU, nn.RNN) and nn.Linear under the same names,
so the state_dicts are interchangeable and one seed gives both the same weights (each part is initialised as its
torch.nn twin, in the same order).  Dropout between recurrent layers: nn.LSTM's own draws its masks inside its C++
kernel from the global generator; ``seeded_dropouts(model.to_torch())`` makes the twin's recurrent layer a
``SeededLSTM``, which draws the masks this model's LSTM draws (see models/seeded_recurrent.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from layers.checks import BEFORE_FORWARD, check_int
from layers.embedding import Embedding
from layers.layer import BaseLayer
from layers.linear import Linear
from layers.recurrent import GRU, LSTM, RNN

from .sampling import generate_recurrent

CELLS = {"lstm": (LSTM, nn.LSTM), "gru": (GRU, nn.GRU), "rnn": (RNN, nn.RNN)}


def _check(owner: str, vocab_size, embedding_dim, hidden_size, num_layers, cell) -> None:
    for name, value in (
        ("vocab_size", vocab_size),
        ("embedding_dim", embedding_dim),
        ("hidden_size", hidden_size),
        ("num_layers", num_layers),
    ):
        check_int(owner, name, value)
    if cell not in CELLS:
        raise ValueError(f"{owner}: cell must be one of {', '.join(map(repr, CELLS))}, got {cell!r}")


class TorchRecurrentLM(nn.Module):
    """The nn.Module twin of ``RecurrentLM``: nn.Embedding -> nn.LSTM/GRU/RNN (batch_first) -> nn.Linear."""

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int,
        hidden_size: int,
        num_layers: int = 1,
        cell: str = "lstm",
        dropout: float = 0.0,
        *,
        device=None,
        dtype=None,
    ):
        _check("TorchRecurrentLM", vocab_size, embedding_dim, hidden_size, num_layers, cell)
        super().__init__()
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.vocab_size, self.embedding_dim, self.hidden_size = vocab_size, embedding_dim, hidden_size
        self.num_layers, self.cell, self.dropout = num_layers, cell, dropout
        self.embedding = nn.Embedding(vocab_size, embedding_dim, **kw)
        self.rnn = CELLS[cell][1](embedding_dim, hidden_size, num_layers, batch_first=True, dropout=dropout, **kw)
        self.head = nn.Linear(hidden_size, vocab_size, **kw)

    def forward(self, idx: Tensor, state=None):
        out, state = self.rnn(self.embedding(idx), state)
        return self.head(out), state

    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """idx (B, t) -> (B, t + max_new_tokens), sampled as ``RecurrentLM.generate`` samples (call it in eval mode)."""
        return generate_recurrent(self, idx, max_new_tokens, temperature, top_k=top_k, generator=generator)


class RecurrentLM(BaseLayer):
    """Embedding(V, E) -> LSTM/GRU/RNN(E, H, L, batch_first=True, dropout) -> Linear(H, V), every backward by hand.

    idx (N, T) (or unbatched (T,)) integer ids, state None or as the recurrent layer takes it -> (logits (N, T, V),
    state_n).  Backward: the head's, then backpropagation through time, then the embedding's scatter-add.
    """

    torch_class = TorchRecurrentLM
    as_module_refuses = "takes an initial state and returns its new state beside its logits"
    _ctor_args = ("vocab_size", "embedding_dim", "hidden_size", "num_layers", "cell", "dropout")

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int,
        hidden_size: int,
        num_layers: int = 1,
        cell: str = "lstm",
        dropout: float = 0.0,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        _check("RecurrentLM", vocab_size, embedding_dim, hidden_size, num_layers, cell)
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.vocab_size, self.embedding_dim, self.hidden_size = vocab_size, embedding_dim, hidden_size
        self.num_layers, self.cell, self.dropout = num_layers, cell, dropout
        self.embedding = Embedding(vocab_size, embedding_dim, **kw)  # drawn first, as the twin draws
        self.rnn = CELLS[cell][0](embedding_dim, hidden_size, num_layers, batch_first=True, dropout=dropout, **kw)
        self.head = Linear(hidden_size, vocab_size, **kw)
        self._had_state: bool | None = None

    def extra_repr(self) -> str:
        return (
            f"vocab_size={self.vocab_size}, embedding_dim={self.embedding_dim}, hidden_size={self.hidden_size}, "
            f"num_layers={self.num_layers}, cell={self.cell!r}, dropout={self.dropout}"
        )

    def named_children(self):
        return iter((("embedding", self.embedding), ("rnn", self.rnn), ("head", self.head)))

    @classmethod
    def _ctor_kwargs(cls, obj: object) -> dict:
        return {name: getattr(obj, name) for name in cls._ctor_args}

    def __call__(self, idx: Tensor, state=None):
        return self.forward(idx, state)

    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """idx (B, t) -> (B, t + max_new_tokens): the prompt once, then each new token from the carried state, drawn
        as nanoGPT draws (models/sampling.py).  Call it in eval mode (no dropout)."""
        return generate_recurrent(self, idx, max_new_tokens, temperature, top_k=top_k, generator=generator)

    def forward(self, idx: Tensor, state=None):
        """idx (N, T) or (T,) -> (logits (N, T, V) or (T, V), the recurrent layer's final state)."""
        e = self.embedding(idx)  # (N, T, E)
        out, state_n = self.rnn(e, state)  # (N, T, H)
        self._had_state = state is not None
        return self.head(out), state_n  # (N, T, V)

    def backward(self, dlogits: Tensor, dstate=None):  # type: ignore[override]  # logits' and the final state's
        """dlogits (N, T, V), dstate (the final state's gradient, or None) -> None, or (None, dstate_0) when the
        forward was given a state; adds every parameter's gradient."""
        if self._had_state is None:
            raise RuntimeError(f"{self!r}: {BEFORE_FORWARD}")
        had_state, self._had_state = self._had_state, None
        grads = self.rnn.backward(self.head.backward(dlogits), dstate)  # BPTT: (N, T, E) (, dstate_0)
        de, dstate0 = grads if had_state else (grads, None)
        self.embedding.backward(de)  # the scatter-add into the table's rows
        return (None, dstate0) if had_state else None

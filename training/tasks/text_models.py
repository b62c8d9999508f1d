"""The language models of ``--model gpt|lstm|gru``: the hand-written model and its nn.Module twin, same weights.

Both take token ids (B, T) and return logits (B, T, V); the hand-written one's ``backward(dlogits)`` fills its
gradients.  The recurrent models start every window from a zero state (windows are drawn at random offsets, so
there is no state to carry between them).  Dropout in the twin draws the masks the hand-written model draws
(``SeededDropout``, the GPT twin's attention-dropout masks, ``SeededLSTM``/``SeededGRU``), once both are pointed at
generators in the same state (``training.impls.models.use_generator``).
"""
from __future__ import annotations

import torch

from models import GPT, PytorchGPT, RecurrentLM, TorchRecurrentLM, seeded_dropouts
from layers.layer import _rng_untouched

from ..config import TrainConfig


class CharRNN(RecurrentLM):
    """``RecurrentLM`` as the trainer drives a language model: forward(idx) -> logits, each window from a zero
    state; backward(dlogits) -> None."""

    def __call__(self, idx):
        return self.forward(idx)

    def forward(self, idx, state=None):
        return super().forward(idx, state)[0]


class TorchCharRNN(TorchRecurrentLM):
    """The twin of ``CharRNN``: forward(idx) -> logits."""

    def forward(self, idx, state=None):
        return super().forward(idx, state)[0]


def model_kwargs(config: TrainConfig, vocab_size: int) -> dict:
    """The constructor arguments of ``config``'s language model: GPT's, or RecurrentLM's (and their twins')."""
    if config.model == "gpt":
        return dict(vocab_size=vocab_size, block_size=config.block_size, n_layer=config.n_layer,
                    n_head=config.n_head, n_embd=config.n_embd, dropout=config.dropout, bias=config.bias)
    return dict(vocab_size=vocab_size, embedding_dim=config.n_embd, hidden_size=config.hidden,
                num_layers=config.n_layer, cell=config.model, dropout=config.dropout)


def build_text_models(config: TrainConfig, vocab_size: int, device, dtype) -> dict:
    """impl name -> model for ``config.impls`` (manual, torch), the twin holding the hand-written model's weights."""
    torch.manual_seed(config.seed)
    kw = {**model_kwargs(config, vocab_size), "device": device, "dtype": dtype}
    manual_cls, twin_cls = (GPT, PytorchGPT) if config.model == "gpt" else (CharRNN, TorchCharRNN)
    manual = manual_cls(**kw)
    with _rng_untouched(torch.device(device)):
        twin = seeded_dropouts(twin_cls(**kw))  # the recurrent twin's dropout draws the hand-written one's masks
    twin.load_state_dict(manual.state_dict())
    return {name: {"manual": manual, "torch": twin}[name] for name in config.impls}

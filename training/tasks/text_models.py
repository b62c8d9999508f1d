"""The language models of ``--model gpt|lstm|gru``: the hand-written model and its nn.Module twin, same weights.

Both take token ids (B, T) and return logits (B, T, V); the hand-written one's ``backward(dlogits)`` fills its
gradients.  The recurrent models start every window from a zero state (windows are drawn at random offsets, so
there is no state to carry between them).  Dropout in the twin draws the masks the hand-written model draws
(``SeededDropout``, the GPT twin's attention-dropout masks, ``SeededLSTM``/``SeededGRU``), once both are pointed at
generators in the same state (``training.impls.models.use_generator``).
"""

from __future__ import annotations

import torch

from layers.layer import _rng_untouched
from models import GPT, PytorchGPT, RecurrentLM, TorchRecurrentLM, seeded_dropouts

from ..config.model import ModelConfig
from ..config.run import RunConfig


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


def model_kwargs(model: ModelConfig, vocab_size: int) -> dict:
    """The constructor arguments of ``model``'s language model: GPT's, or RecurrentLM's (and their twins')."""
    if model.name == "gpt":
        return dict(
            vocab_size=vocab_size,
            block_size=model.block_size,
            n_layer=model.n_layer,
            n_head=model.n_head,
            n_embd=model.n_embd,
            dropout=model.dropout,
            bias=model.bias,
            **(
                dict(
                    n_experts=model.n_experts,
                    top_k=model.top_k,
                    capacity_factor=model.capacity_factor,
                    aux_coef=model.aux_coef,
                )
                if model.n_experts
                else {}
            ),
        )
    return dict(
        vocab_size=vocab_size,
        embedding_dim=model.n_embd,
        hidden_size=model.hidden,
        num_layers=model.n_layer,
        cell=model.name,
        dropout=model.dropout,
    )


def build_text_models(model: ModelConfig, run: RunConfig, vocab_size: int, device, dtype) -> dict:
    """impl name -> model for ``run.impls`` (manual, torch), the twin holding the hand-written model's weights."""
    torch.manual_seed(run.seed)
    kw = {**model_kwargs(model, vocab_size), "device": device, "dtype": dtype}
    manual_cls, twin_cls = (GPT, PytorchGPT) if model.name == "gpt" else (CharRNN, TorchCharRNN)
    manual = manual_cls(**kw)
    with _rng_untouched(torch.device(device)):
        twin = seeded_dropouts(twin_cls(**kw))  # the recurrent twin's dropout draws the hand-written one's masks
    twin.load_state_dict(manual.state_dict())
    return {name: {"manual": manual, "torch": twin}[name] for name in run.impls}

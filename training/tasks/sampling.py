"""Text from a trained language model: what ``python sample.py`` does (sample.py is its command line).

The checkpoint train.py wrote holds the model's settings, every implementation's weights and (text runs) the
corpus's vocabulary.  ``sample_text`` rebuilds the hand-written model (or its twin) from them, encodes the prompt,
and draws ``max_new_tokens`` characters with the model's ``generate`` (nanoGPT's sampling: temperature, top-k,
one ``torch.multinomial`` per character on a generator seeded by ``seed``), in eval mode.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from layers.checks import is_a
from models import GPT, PytorchGPT, RecurrentLM, TorchRecurrentLM

from ..config import MATH_KEYS, TEXT_MODELS, TrainConfig
from ..config.choices import SEEDS
from ..config.model import ModelConfig
from ..config.resume import saved_settings
from ..device import resolve_device
from ..errors import UsageError
from ..storage.checkpoint import read_checkpoint
from .corpus import TextData
from .text_models import model_kwargs


def checkpoint_config(ckpt: dict, path: Path) -> TrainConfig:
    """The settings a checkpoint was trained with."""
    saved = saved_settings(ckpt)
    if saved["model"] not in TEXT_MODELS:
        raise UsageError(
            f"--resume {path} is a checkpoint of --model {saved['model']} on {saved.get('dataset')}, "
            f"an image classifier: sample.py samples the language models (--model "
            f"{', '.join(TEXT_MODELS)})"
        )
    try:
        return TrainConfig(**{k: saved[k] for k in MATH_KEYS if k in saved})
    except (UsageError, TypeError) as e:
        raise UsageError(f"--resume {path}: the checkpoint's settings are impossible: {e}") from None


def build_model(model: ModelConfig, vocab_size: int, impl: str, device: torch.device, dtype: torch.dtype):
    """The language model (with ``generate``) of ``model``: the hand-written one, or (impl "torch") its twin."""
    gpt = model.name == "gpt"
    cls = {"manual": GPT if gpt else RecurrentLM, "torch": PytorchGPT if gpt else TorchRecurrentLM}[impl]
    return cls(**model_kwargs(model, vocab_size), device=device, dtype=dtype)


def sample_text(
    path: Path,
    prompt: str,
    max_new_tokens: int = 300,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
    impl: str = "manual",
    device: str = "auto",
) -> str:
    """The prompt and ``max_new_tokens`` characters sampled after it by the checkpoint's ``impl`` model.

    Every way the request cannot be met (an unreadable or image checkpoint, an implementation it does not hold, a
    character outside its vocabulary, out-of-range settings) is one UsageError, raised before anything is drawn.
    """
    if not is_a(max_new_tokens, int) or max_new_tokens < 0:
        raise UsageError(f"--max-new-tokens {max_new_tokens} is out of range (an integer >= 0)")
    if not (is_a(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise UsageError(f"--temperature {temperature} is out of range (need a finite number > 0)")
    if top_k is not None and not (is_a(top_k, int) and top_k >= 1):
        raise UsageError(f"--top-k {top_k} is out of range (an integer >= 1)")
    if not (is_a(seed, int) and SEEDS[0] <= seed <= SEEDS[1]):
        raise UsageError(f"--seed {seed} is out of range (an integer from -2**63 to 2**64 - 1)")
    if not prompt:
        raise UsageError('--prompt is empty: give at least one character to start from (nanoGPT starts from "\\n")')
    ckpt = read_checkpoint(path)
    config = checkpoint_config(ckpt, path)
    vocab = ckpt.get("vocab")
    if not (isinstance(vocab, list) and vocab and all(isinstance(c, str) for c in vocab)):
        raise UsageError(
            f"--resume {path} holds no vocabulary (it was written before train.py saved one); train "
            f"the model again to sample from it"
        )
    if impl not in ckpt["models"]:
        raise UsageError(f"--impl {impl}: the checkpoint holds the weights of {', '.join(ckpt['models'])} only")
    text = TextData(source=str(path), vocab=vocab, train=torch.empty(0), val=torch.empty(0), fingerprint={})
    try:
        ids = text.encode(prompt)
    except UsageError as e:
        raise UsageError(f"--prompt: {e} (the characters of the corpus it was trained on)") from None
    dev = resolve_device(device)
    model = build_model(config.model, len(vocab), impl, dev, config.run.torch_dtype)
    state = ckpt["models"][impl]
    try:
        model.load_state_dict({k: v.to(dev) for k, v in state.items()})
    except (KeyError, RuntimeError, ValueError) as e:
        raise UsageError(
            f"--resume {path}: 'models.{impl}' does not fit the model ({str(e).splitlines()[0][:160]})"
        ) from e
    model.train(False)
    gen = torch.Generator(device=dev).manual_seed(seed)
    idx = torch.tensor([ids], dtype=torch.int64, device=dev)
    try:
        out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k, generator=gen)
    except RuntimeError as e:  # torch.multinomial's: the probabilities are not finite
        if "probability tensor" not in str(e):
            raise
        dtype = str(config.run.torch_dtype).removeprefix("torch.")
        raise UsageError(
            f"--temperature {temperature} is too small: the logits divided by it overflow {dtype}, so "
            f"their softmax is not finite; use a larger temperature"
        ) from None
    return text.decode(out[0].tolist())

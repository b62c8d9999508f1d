"""The tables of choices the settings refer to, and how a setting is spelled on the command line."""

from __future__ import annotations

DATASETS = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}  # name -> torchvision dataset class
TEXT_DATASETS = ("shakespeare",)  # a corpus shipped in training/tasks/corpora (or any file with --data-file)
IMAGE_MODELS = ("mlp", "cnn")
TEXT_MODELS = ("gpt", "lstm", "gru")  # character-level language models
MODELS = IMAGE_MODELS + TEXT_MODELS
FAMILIES = {"image": IMAGE_MODELS, "text": TEXT_MODELS}
GROUPS = {"recurrent": ("lstm", "gru"), **FAMILIES}  # what a per-model default may be given for
IMPLS = ("manual", "engine", "torch")  # hand-written layers, the autodiff engine, nn.Module + autograd
IMPL_GROUPS = {"both": ("manual", "torch"), "all": IMPLS}
DTYPES = ("float32", "float64", "bfloat16", "float16")
# Mixed precision: data and the weights the optimizer updates stay float32, the matrix products run in the half dtype.
HALF_DTYPES = ("bfloat16", "float16")
SCHEDULES = ("constant", "cosine", "onecycle", "warmup-cosine")  # learning rate per step (torch.optim.lr_scheduler);
# warmup-cosine is nanoGPT's: linear warm-up for --warmup-iters, cosine from --lr to --min-lr by --lr-decay-iters
PIPELINE_SCHEDULES = ("gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "zb-v")  # training/parallel/pipeline_schedules.py
SEEDS = (-(2**63), 2**64 - 1)  # what torch.manual_seed takes; derived seeds wrap modulo 2**64 as torch's do
MAX_DIST_TIMEOUT = 1e7  # seconds (116 days): "no timeout" is a hang nobody is told about, so there is a bound


def flag(name: str) -> str:
    """The command-line spelling of a setting: batch_size -> --batch-size."""
    return "--" + name.replace("_", "-")


def family_of(model: str | None, dataset: str | None, data_file: object = None) -> str:
    """ "text" for the language models (or, with no --model, a text corpus), else "image"."""
    if model is not None:
        return "text" if model in TEXT_MODELS else "image"
    return "text" if data_file is not None or dataset in TEXT_DATASETS else "image"

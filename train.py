"""Train a hand-written model beside its nn.Module twin, from the same weights and batches.

    python train.py                                # the MLP on Fashion-MNIST (Debian's package or ./data)
    python train.py --dataset mnist                # MNIST under ./data, downloaded by torchvision if missing
    python train.py --impl manual --epochs 2 --hidden 128 --device cuda
    python train.py --dataset shakespeare --model gpt   # a character GPT on the shipped Shakespeare corpus

Each implementation trains on the same batches in the same order; the run reports per
epoch their losses, accuracies and seconds, and at the end how far their weights drifted
apart.  Outputs go to --out (default runs/<timestamp>-<pid>): metrics.jsonl, summary.json, PNG
plots and checkpoint.pt (written atomically after every epoch; --resume continues from it).

This file is the command line only: flags -> training.TrainConfig -> training.storage.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

try:  # importing torch takes seconds: Ctrl-C then is an interruption like any other, not a traceback
    import torch

    from optimizers import OPTIMIZERS
    from training import (DATASETS, DTYPES, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, IMPL_GROUPS, IMPLS, MODELS,
                          SCHEDULES, TEXT_DATASETS, Interrupted, RunFailed, TrainConfig, UsageError, run)
    from training.config import PIPELINE_SCHEDULES, parse_val_split
    from training.storage.checkpoint import saved_model
except KeyboardInterrupt:
    print("\ninterrupted", file=sys.stderr)
    sys.exit(130)

_UNSET = object()


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's "(default: X)" after each option's help, except where the help states its default itself and
    where there is none to state (an off-by-default switch, an option unset by default)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not the whole usage block
        raise UsageError(f"{message} (see --help)")


def _path(text: str) -> Path:
    if not text:  # Path("") is the current folder, never what an empty argument meant
        raise argparse.ArgumentTypeError("is empty; give a path")
    return Path(text)


def _val_split(text: str) -> int | float:
    try:
        return parse_val_split(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _eval_iters(text: str) -> int | str:
    if text == "all":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: an integer or all") from None


class _Schedule(argparse.Action):
    """--schedule takes a learning-rate schedule or a pipeline schedule (the names are apart): each to its own
    setting, so both can be given (--schedule warmup-cosine --schedule zb-h1)."""

    def __call__(self, parser, namespace, value, option_string=None):
        setattr(namespace, "pipeline_schedule" if value in PIPELINE_SCHEDULES else "schedule", value)


def build_parser() -> argparse.ArgumentParser:
    d = TrainConfig.__dataclass_fields__
    p = _Parser(description=__doc__.split("\n\n")[0], formatter_class=_HelpFormatter)
    p.register("type", Path, _path)  # every type=Path option refuses an empty path
    a = p.add_argument
    a("--dataset", choices=[*DATASETS, *TEXT_DATASETS], default=None,
      help="fashion-mnist (the default for the image models): from --data-dir, else Debian's dataset-fashion-mnist "
           "package (the README's install), else downloaded; mnist: from --data-dir, else downloaded; shakespeare "
           "(the default for the language models): the corpus shipped in training/tasks/corpora")
    a("--data-file", type=Path, default=None, metavar="PATH", help="text runs: train on this UTF-8 file instead")
    a("--data-dir", type=Path, default=d["data_dir"].default,
      help="torchvision's layout, DIR/MNIST/raw and DIR/FashionMNIST/raw; files found elsewhere are decompressed "
           "into it (default: data, in the current folder)")
    a("--no-download", action="store_true", help="never try the network for missing files")
    a("--model", choices=list(MODELS), default=None,
      help="mlp: the default Net (the default with an image dataset); cnn: the CNN; gpt: a character-level GPT (the "
           "default with a text corpus); lstm, gru: character-level recurrent language models")
    a("--impl", choices=[*IMPLS, *IMPL_GROUPS], default=d["impl"].default,
      help="manual: hand-written model; engine: the autodiff engine's Net (MLP only); torch: the nn.Module twin; "
           "both: manual and torch; all: all three")
    a("--epochs", type=int, default=d["epochs"].default, help="image runs: passes over the training split")
    a("--batch-size", type=int, default=None, help="samples per step, under torchrun the global batch (default: 128 "
      "images, 12 windows of text)")
    a("--lr", type=float, default=d["lr"].default, help="learning rate (the peak, with --schedule onecycle)")
    a("--optimizer", default=None, help=f"one of {', '.join(OPTIMIZERS)} (default: adam for images, adamw for text)")
    a("--momentum", type=float, default=d["momentum"].default, help="for sgd and rmsprop")
    a("--weight-decay", type=float, default=None, help="the optimizer's weight_decay, adamw's decoupled; text runs "
      "decay the matrices and embeddings only, as nanoGPT (default: 0 for images, 0.1 for text)")
    a("--beta2", type=float, default=None, help="adam/adamw's second-moment decay (default: 0.999 for images, 0.99 "
      "for text)")
    a("--schedule", choices=[*SCHEDULES, *PIPELINE_SCHEDULES], default=None, action=_Schedule,
      help="learning rate per step: constant (the images' default); cosine (annealed to 0); onecycle (warm-up to "
           "--lr, then annealed); warmup-cosine (text's default, nanoGPT's: linear warm-up for --warmup-iters, then "
           "cosine to --min-lr at --lr-decay-iters); or, with --pipeline-parallel, the pipeline's schedule: gpipe, "
           "1f1b (its default) or zb-h1 (zero bubble: weight gradients fill the bubbles); give it twice for both")
    a("--augment", action="store_true", help="random left-right flips and 2-pixel shifts of training images")
    a("--hidden", type=int, default=None, help="the MLP's hidden width, or the lstm/gru's hidden size (default: 1024 for the "
      "MLP, 256 for lstm/gru)")
    a("--depth", type=int, default=d["depth"].default, help="number of MLP hidden layers")
    a("--seed", type=int, default=d["seed"].default, help="initial weights, validation split, batch order, dropout "
      "and augmentation")
    a("--device", default=d["device"].default, help="cpu, cuda, cuda:N or auto")
    a("--threads", type=int, default=d["threads"].default, metavar="N",
      help=f"CPU threads for torch's operations (default: the cores the load average leaves free, at most one per "
           f"core ({torch.get_num_threads()} here), or $OMP_NUM_THREADS, which torchrun sets to 1; the start-up line "
           f"says what was chosen and why); give it for a float32 run that repeats bit for bit")
    a("--dtype", choices=list(DTYPES), default=d["dtype"].default,
      help="bfloat16, float16: mixed precision (float32 data and master weights the optimizer updates, matrix "
           "products in the half dtype, softmax/cross-entropy and batch norm statistics in float32; float16 with a "
           "dynamic loss scale; the twin under torch.autocast; not --impl engine)")
    a("--log-interval", type=int, default=d["log_interval"].default,
      help="steps between logged metrics and --monitor records (each epoch's last step and, with --monitor, the "
           "run's first are recorded too)")
    a("--val-interval", type=int, default=d["val_interval"].default, help="epochs between validations")
    a("--val-split", type=_val_split, default=None, metavar="N|FRACTION|PERCENT",
      help="training samples held out for validation: a count (6000), a fraction (0.1) or a percentage (10%%) of "
           "them (default: 10%%; 0: none)")
    a("--clip-grad", type=float, default=None, metavar="MAX_NORM",
      help="clip the total gradient norm to MAX_NORM (default: no clipping for images, 1.0 for text)")
    a("--limit-train", type=int, default=None, metavar="N", help="use the first N training samples (default: all)")
    g = p.add_argument_group("text runs (--model gpt, lstm, gru): nanoGPT's option names, its CPU configuration's "
                             "defaults")
    t = g.add_argument
    t("--max-iters", type=int, default=d["max_iters"].default, help="training iterations")
    t("--eval-interval", type=int, default=d["eval_interval"].default,
      help="iterations between evaluations of the train and val loss (and checkpoints)")
    t("--eval-iters", type=_eval_iters, default=d["eval_iters"].default,
      help="batches per split and evaluation, or all: every non-overlapping window of the split")
    t("--block-size", type=int, default=d["block_size"].default, help="context length: characters per window")
    t("--n-layer", type=int, default=None, help="GPT blocks, or stacked recurrent layers (default: 4 for gpt, 2 for lstm/gru)")
    t("--n-head", type=int, default=d["n_head"].default, help="GPT attention heads")
    t("--n-embd", type=int, default=d["n_embd"].default, help="GPT width, or the recurrent models' embedding width")
    t("--dropout", type=float, default=d["dropout"].default, help="dropout probability")
    t("--bias", action=argparse.BooleanOptionalAction, default=d["bias"].default,
      help="biases in the GPT's Linears and LayerNorms (default: off, as in nanoGPT's train.py)")
    t("--min-lr", type=float, default=d["min_lr"].default, help="warmup-cosine: the learning rate it decays to")
    t("--warmup-iters", type=int, default=d["warmup_iters"].default, help="warmup-cosine: iterations of linear warm-up")
    t("--lr-decay-iters", type=int, default=d["lr_decay_iters"].default,
      help="warmup-cosine: the iteration at which the rate reaches --min-lr")
    a("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
      help="capture the hand-written step once as a CUDA graph and replay it (default: on with a CUDA device for "
           "the MLP without --monitor or torchrun; on the CPU the same capturable, in-place step runs eagerly)")
    a("--compile", nargs="?", const="graph", default=None, choices=("graph", "fast"), metavar="fast",
      help="compile the hand-written step with torch.compile as one graph (fullgraph), and the twin's model as "
      "PyTorch users do (torch.compile(model)); the compile time is reported apart from the time per epoch or "
      "iteration. --compile fast: the hand-written step's guards are not evaluated at calls whose entry state they "
      "already passed (training/compiled_fast.py)")
    a("--monitor", action="store_true", help="record gradient, weight, update and activation statistics of every "
      "implementation every --log-interval steps, at the run's first step and at each epoch's last "
      "(monitor_<impl>.jsonl and monitor_*.png in the output folder)")
    a("--tensorboard", type=Path, default=None, metavar="DIR", help="also write the losses (and with --monitor "
      "the statistics and histograms) as TensorBoard event files into DIR")
    a("--no-plots", action="store_true", help="skip rendering the PNG figures")
    a("--dist-timeout", type=float, default=d["dist_timeout"].default,
      help="under torchrun: seconds a collective may wait before the run fails")
    a("--no-sync-bn", action="store_true", help="under torchrun: per-process batch norm statistics (the twin "
      "then uses plain BatchNorm under DDP) instead of synchronised ones")
    m = p.add_argument_group("model parallelism of the GPT under torchrun (docs/model-parallel.md): T x P ranks "
                             "hold one copy of the model, data parallelism over the rest of the world size").add_argument
    m("--tensor-parallel", type=int, default=d["tensor_parallel"].default, metavar="T",
      help="split each block's heads and MLP width, and the vocabulary, over T ranks (Megatron's f and g by hand)")
    m("--sequence-parallel", action="store_true", help="with --tensor-parallel: layer norms and residuals on each "
      "rank's block_size / T positions (all-gather / reduce-scatter along the sequence)")
    m("--pipeline-parallel", type=int, default=d["pipeline_parallel"].default, metavar="P",
      help="cut the blocks into P stages, run by --schedule gpipe, 1f1b or zb-h1")
    m("--pipeline-schedule", choices=list(PIPELINE_SCHEDULES), default=d["pipeline_schedule"].default,
      help="the same as --schedule gpipe|1f1b|zb-h1")
    m("--micro-batches", type=int, default=d["micro_batches"].default, metavar="M",
      help="a pipelined step's micro-batches (each data-parallel rank's batch splits into M equal parts)")
    m("--zero", type=int, choices=(0, 1, 2), default=d["zero"].default,
      help="ZeRO over the data-parallel ranks: 0 all-reduce, 1 optimizer state sharded, 2 gradients sharded too")
    m("--check-parity", action="store_true", help="run the first step sharded and in one process (rank 0), print "
      "per tensor the largest difference and whether it is float64 round-off or a bug, and stop")
    a("--out", type=Path, default=None, help="output folder (default: runs/<timestamp>-<pid>, unique to the run)")
    a("--overwrite", action="store_true", help="replace the run already in --out (without it a fresh run there is "
      "refused: --resume continues it)")
    a("--resume", type=Path, default=None, metavar="PATH", help="checkpoint.pt to continue from")
    a("--dry-run", action="store_true", help="one batch of each, for a smoke test; no checkpoint is written")
    a("--sanity", action="store_true", help="run the pre-flight checks (initial loss, overfitting 20 examples, "
      "gradients vs autograd, manual vs twin) and exit 0 only if all pass")
    a("--quiet", action="store_true", help="print nothing but errors")
    return p


def parse_config(argv: list[str] | None) -> TrainConfig:
    """Flags -> TrainConfig; ``given`` records which settings were on the command line (for --resume)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    parser.set_defaults(**{action.dest: _UNSET for action in parser._actions if action.dest != "help"})
    given = {k for k, v in vars(parser.parse_args(argv)).items() if v is not _UNSET}
    renamed = {"no_download": "download", "no_plots": "plots", "no_sync_bn": "sync_bn"}
    given = frozenset(renamed.get(k, k) for k in given)
    values = vars(args)
    values["download"] = not values.pop("no_download")
    values["plots"] = not values.pop("no_plots")
    values["sync_bn"] = not values.pop("no_sync_bn")
    compile_as = values.pop("compile")
    values["compile"], values["compile_fast"] = compile_as is not None, compile_as == "fast"
    if "compile" in given:
        given = given | {"compile_fast"}
    values.pop("sanity")
    if values["resume"] is not None and "model" not in given:  # the checkpoint's family decides which flags apply
        values["model"] = saved_model(values["resume"])
    return TrainConfig(**values, given=given - {"sanity"})


def main(argv: list[str] | None = None) -> int:
    """train.py with ``argv``; -> its exit status.  Ctrl-C is a KeyboardInterrupt here, after one line on stderr."""
    try:
        config = parse_config(argv)
        if build_parser().parse_args(argv).sanity:
            from training.sanity import run_sanity
            return run_sanity(config)
        return run(config)
    except Interrupted:  # the run said where its last checkpoint is
        raise
    except KeyboardInterrupt:  # before training started (loading data, say): nothing was written
        print("\ninterrupted", file=sys.stderr)
        raise
    except (UsageError, RunFailed) as e:
        msg = str(e)
        print(msg if msg.startswith("error:") else f"train.py: error: {msg}", file=sys.stderr)
        return EXIT_USAGE if isinstance(e, UsageError) else EXIT_FAILED


def _leave(code: int) -> None:
    """Exit with ``code``.  A rank under torchrun leaves without the interpreter's teardown: after a run that
    stopped early (ranks that disagree, a failed peer) torch's process-group threads can abort that teardown
    ("terminate called without an active exception", exit -6 instead of the run's status, measured about once
    in three runs of tests/test_distributed_faults.py).  Every file the run wrote is closed by then (checkpoints
    and logs fsynced); only the standard streams are flushed here."""
    if os.environ.get("WORLD_SIZE") is None:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def cli(argv: list[str] | None = None) -> int:
    """main() as the command line runs it: Ctrl-C, a KeyboardInterrupt for in-process callers, is exit 130."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    _leave(cli())

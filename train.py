"""Train the hand-written Net on MNIST beside its nn.Module twin, from the same weights and batches.

    python train.py                                # MNIST under ./data, both implementations
    python train.py --dataset fashion-mnist        # also finds Debian's dataset-fashion-mnist package
    python train.py --impl manual --epochs 2 --hidden 128 --device cuda

Each implementation trains on the same batches in the same order; the run reports per
epoch their losses, accuracies and seconds, and at the end how far their weights drifted
apart.  Outputs go to --out (default runs/<timestamp>): metrics.jsonl, summary.json, PNG
plots and checkpoint.pt (written atomically after every epoch; --resume continues from it).
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from autodiff import EngineNet, cross_entropy, no_grad
from layers import Net, PytorchNet
from losses import CrossEntropyLoss
from optimizers import OPTIMIZERS, clip_grad_norm_, get_optimizer

DATASETS = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}
DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")
SPLIT_FILES = {True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
               False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
IMPLS = ("manual", "engine", "torch")  # hand-written layers, the autodiff engine, nn.Module + autograd
IMPL_GROUPS = {"both": ("manual", "torch"), "all": IMPLS}
# Settings that determine the numbers a run produces: a resumed run must keep them.
MATH_ARGS = ("dataset", "impl", "batch_size", "lr", "optimizer", "momentum", "weight_decay", "hidden", "depth",
             "seed", "dtype", "clip_grad", "limit_train", "val_split")
EXIT_USAGE, EXIT_FAILED, EXIT_INTERRUPTED = 2, 1, 130


class UsageError(Exception):
    """Bad arguments or missing data: exit status 2 with the message."""


class NonFiniteLoss(Exception):
    pass


# -- arguments ---------------------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not the whole usage block
        raise UsageError(f"{message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--dataset", choices=list(DATASETS), default="mnist")
    a("--data-dir", type=Path, default=Path("data"), help="torchvision root: DIR/MNIST/raw, DIR/FashionMNIST/raw")
    a("--no-download", action="store_true", help="never try the network for missing files")
    a("--impl", choices=[*IMPLS, *IMPL_GROUPS], default="both",
      help="manual: hand-written Net; engine: the autodiff engine's Net; torch: the nn.Module twin; "
           "both: manual and torch; all: all three")
    a("--epochs", type=int, default=10)
    a("--batch-size", type=int, default=128)
    a("--lr", type=float, default=1e-3)
    a("--optimizer", default="adam", help=f"one of {', '.join(OPTIMIZERS)}")
    a("--momentum", type=float, default=0.0, help="for sgd and rmsprop")
    a("--weight-decay", type=float, default=0.0)
    a("--hidden", type=int, default=1024)
    a("--depth", type=int, default=3, help="number of hidden layers")
    a("--seed", type=int, default=0)
    a("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    a("--dtype", choices=["float32", "float64"], default="float32")
    a("--log-interval", type=int, default=50, help="steps between logged metrics")
    a("--val-interval", type=int, default=1, help="epochs between validations")
    a("--val-split", type=int, default=None, help="training samples held out for validation (default 10%%; 0: none)")
    a("--clip-grad", type=float, default=None, metavar="MAX_NORM")
    a("--limit-train", type=int, default=None, metavar="N", help="use the first N training samples")
    a("--monitor", action="store_true", help="log gradient and parameter statistics")
    a("--out", type=Path, default=None, help="output folder (default runs/<timestamp>)")
    a("--resume", type=Path, default=None, metavar="PATH", help="checkpoint.pt to continue from")
    a("--dry-run", action="store_true", help="one batch of each, for a smoke test")
    a("--quiet", action="store_true")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    checks = [("--epochs", args.epochs, args.epochs >= 1), ("--batch-size", args.batch_size, args.batch_size >= 1),
              ("--lr", args.lr, args.lr >= 0 and math.isfinite(args.lr)), ("--hidden", args.hidden, args.hidden >= 1),
              ("--depth", args.depth, args.depth >= 0), ("--log-interval", args.log_interval, args.log_interval >= 1),
              ("--val-interval", args.val_interval, args.val_interval >= 1),
              ("--momentum", args.momentum, args.momentum >= 0), ("--weight-decay", args.weight_decay, args.weight_decay >= 0)]
    if args.val_split is not None:
        checks.append(("--val-split", args.val_split, args.val_split >= 0))
    if args.clip_grad is not None:
        checks.append(("--clip-grad", args.clip_grad, args.clip_grad > 0))
    if args.limit_train is not None:
        checks.append(("--limit-train", args.limit_train, args.limit_train >= 1))
    for flag, value, ok in checks:
        if not ok:
            raise UsageError(f"{flag} {value} is out of range")
    args.optimizer = args.optimizer.lower()
    if args.optimizer not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer {args.optimizer!r}; known: {', '.join(OPTIMIZERS)}")
    if args.momentum and args.optimizer not in ("sgd", "rmsprop"):
        raise UsageError(f"--momentum applies to sgd and rmsprop, not {args.optimizer}")
    return args


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise UsageError(f"--device {name!r} is not a device ({e})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name} asked for CUDA, but torch {torch.__version__} sees no CUDA device here; "
                         f"use --device cpu")
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {name}: only cpu and cuda are supported")
    return device


# -- data ----------------------------------------------------------------------------------------------------

@dataclass
class Data:
    train_x: Tensor  # (N, 784) normalised, on the device
    train_y: Tensor  # (N,) int64
    val_x: Tensor | None
    val_y: Tensor | None
    test_x: Tensor
    test_y: Tensor
    mean: float
    std: float


def _missing_data_message(dataset: str, raw: Path, looked: list[Path], reason: str) -> str:
    names = ", ".join(f for pair in SPLIT_FILES.values() for f in pair)
    lines = [f"error: no usable {dataset} data: {reason}", "looked in:"] + [f"  {p}" for p in looked]
    lines += [f"fix: put the four IDX files ({names}; .gz or decompressed) in {raw}/"]
    lines += ["     or train on Fashion-MNIST: apt-get install -y dataset-fashion-mnist && "
              "python train.py --dataset fashion-mnist"]
    return "\n".join(lines)


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _official_md5(dataset: str) -> dict[str, str]:
    from torchvision.datasets import MNIST, FashionMNIST
    cls = MNIST if dataset == "mnist" else FashionMNIST
    return dict(cls.resources)


def prepare_raw(root: Path, dataset: str, train: bool, download: bool, say=print) -> Path:
    """Make the decompressed IDX files of one split present in torchvision's raw folder; return the folder.

    Order: files already there (decompressing .gz beside them), then Debian's Fashion-MNIST package,
    then torchvision's download.  Raises UsageError naming every place it looked.
    """
    raw = root / DATASETS[dataset] / "raw"
    looked = [raw]
    official = _official_md5(dataset)

    def have(name: str) -> bool:
        return (raw / name).is_file() or (raw / f"{name}.gz").is_file()

    def decompress(src: Path, dst: Path) -> None:
        try:
            with gzip.open(src, "rb") as f:
                data = f.read()
        except (OSError, EOFError) as e:
            raise UsageError(_missing_data_message(dataset, raw, looked, f"{src} is not a readable gzip file ({e})"))
        raw.mkdir(parents=True, exist_ok=True)
        _atomic_write_bytes(dst, data)

    names = SPLIT_FILES[train]
    if not all(have(n) for n in names) and dataset == "fashion-mnist":
        looked.append(DEBIAN_FASHION)
        if all((DEBIAN_FASHION / f"{n}.gz").is_file() for n in names):
            # Debian recompressed these .gz files, so torchvision's MD5 check would fail: decompress instead.
            for n in names:
                if not have(n):
                    decompress(DEBIAN_FASHION / f"{n}.gz", raw / n)
    if not all(have(n) for n in names) and download:
        from torchvision.datasets import MNIST, FashionMNIST
        cls = MNIST if dataset == "mnist" else FashionMNIST
        looked.append(Path("the network (torchvision download)"))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cls(str(root), train=train, download=True)
        except Exception as e:  # no network, a refused mirror, a bad archive: all reported the same way
            say(f"download failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    missing = [n for n in names if not have(n)]
    if missing:
        raise UsageError(_missing_data_message(dataset, raw, looked, f"missing {', '.join(missing)}"))
    for n in names:
        gz = raw / f"{n}.gz"
        if gz.is_file():
            md5 = hashlib.md5(gz.read_bytes()).hexdigest()
            if md5 != official.get(gz.name):
                warnings.warn(f"{gz} has MD5 {md5}, not the official {official.get(gz.name)}; using it anyway "
                              f"(its contents are checked when read)", stacklevel=2)
            if not (raw / n).is_file():
                decompress(gz, raw / n)
    return raw


def read_split(raw: Path, train: bool, dataset: str = "mnist") -> tuple[Tensor, Tensor]:
    """Read one split's images (N, 28, 28) uint8 and labels (N,) int64 with torchvision's IDX reader."""
    from torchvision.datasets.mnist import read_image_file, read_label_file
    img_name, lbl_name = SPLIT_FILES[train]
    out = []
    for name, reader in ((img_name, read_image_file), (lbl_name, read_label_file)):
        path = raw / name
        try:
            out.append(reader(str(path)))
        except (AssertionError, RuntimeError, ValueError, TypeError, IndexError, OSError) as e:
            raise UsageError(_missing_data_message(dataset, raw, [raw], f"{path} is corrupt or truncated "
                                                   f"({type(e).__name__}: {e or 'bad IDX header'})")) from None
    images, labels = out
    if images.shape[1:] != (28, 28) or images.shape[0] != labels.shape[0] or labels.numel() == 0:
        raise UsageError(_missing_data_message(dataset, raw, [raw], f"{raw / img_name} holds images of shape "
                                               f"{tuple(images.shape)} for {labels.shape[0]} labels; expected "
                                               f"(N, 28, 28) with N matching"))
    if labels.min() < 0 or labels.max() > 9:
        raise UsageError(_missing_data_message(dataset, raw, [raw], f"{raw / lbl_name} has labels outside 0..9"))
    return images, labels


def load_data(args, device: torch.device, dtype: torch.dtype, say=print) -> Data:
    """The whole dataset, normalised, on the device, loaded once; the validation split is seeded."""
    download = not args.no_download
    train_raw = prepare_raw(args.data_dir, args.dataset, True, download, say)
    test_raw = prepare_raw(args.data_dir, args.dataset, False, download, say)
    x, y = read_split(train_raw, True, args.dataset)
    tx, ty = read_split(test_raw, False, args.dataset)
    if args.limit_train is not None:
        x, y = x[: args.limit_train], y[: args.limit_train]
    n = x.shape[0]
    n_val = n // 10 if args.val_split is None else args.val_split
    if n_val >= n:
        raise UsageError(f"--val-split {n_val} leaves no training samples out of {n}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(args.seed))
    val_idx, train_idx = order[:n_val], order[n_val:]
    x = x.reshape(n, -1)
    train = x[train_idx].to(torch.float64) / 255
    mean, std = train.mean().item(), train.std().item()

    def prep(images: Tensor) -> Tensor:
        return ((images.reshape(images.shape[0], -1).to(torch.float64) / 255 - mean) / std).to(device, dtype)

    return Data(train_x=prep(x[train_idx]), train_y=y[train_idx].to(device),
                val_x=prep(x[val_idx]) if n_val else None, val_y=y[val_idx].to(device) if n_val else None,
                test_x=prep(tx), test_y=ty.to(device), mean=mean, std=std)


# -- the two implementations -------------------------------------------------------------------------------

class ManualImpl:
    """The hand-written Net: explicit backward, handgrad optimizer, no autograd graph."""

    name = "manual"

    def __init__(self, net: Net, args):
        self.model = net
        kw = _optimizer_kwargs(args)
        self.opt = get_optimizer(args.optimizer, net.parameters(), **kw)
        self.crit = CrossEntropyLoss()
        self.eval_crit = CrossEntropyLoss(reduction="sum")
        self.clip = args.clip_grad

    def train_step(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, float | None]:
        """-> (loss, logits, total grad norm before clipping or None)."""
        self.opt.zero_grad()
        logits = self.model(x)
        loss = self.crit(logits, y)
        self.model.backward(self.crit.backward(), need_input_grad=False)
        norm = clip_grad_norm_(self.model.parameters(), self.clip) if self.clip else None
        self.opt.step()
        return loss, logits, norm

    def eval_batch(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        logits = self.model(x)
        return self.eval_crit(logits, y), logits

    def named_parameters(self):
        return list(self.model.named_parameters())


class EngineImpl:
    """The same Net on handgrad's autodiff engine: gradients from per-operation closures, handgrad optimizer."""

    name = "engine"

    def __init__(self, model: EngineNet, args):
        self.model = model
        self.opt = get_optimizer(args.optimizer, model.parameters(), **_optimizer_kwargs(args))
        self.clip = args.clip_grad

    def train_step(self, x: Tensor, y: Tensor):
        self.opt.zero_grad()
        logits = self.model(x)
        loss = cross_entropy(logits, y)
        loss.backward()
        norm = clip_grad_norm_(self.model.parameters(), self.clip) if self.clip else None
        self.opt.step()
        return loss.data, logits.data, norm

    @no_grad()
    def eval_batch(self, x: Tensor, y: Tensor):
        logits = self.model(x)
        return cross_entropy(logits, y, reduction="sum").data, logits.data

    def named_parameters(self):
        return [(name, p.data) for name, p in self.model.named_parameters()]


class TorchImpl:
    """The nn.Module twin: autograd backward, torch.optim optimizer."""

    name = "torch"

    def __init__(self, twin: PytorchNet, args):
        self.model = twin
        cls = getattr(torch.optim, OPTIMIZERS[args.optimizer].__name__)  # handgrad's twin in torch.optim
        self.opt = cls(twin.parameters(), **_optimizer_kwargs(args))
        self.clip = args.clip_grad

    def train_step(self, x: Tensor, y: Tensor):
        self.opt.zero_grad()
        logits = self.model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip) if self.clip else None
        self.opt.step()
        return loss.detach(), logits.detach(), norm

    @torch.no_grad()
    def eval_batch(self, x: Tensor, y: Tensor):
        logits = self.model(x)
        return F.cross_entropy(logits, y, reduction="sum"), logits

    def named_parameters(self):
        return list(self.model.named_parameters())


def _optimizer_kwargs(args) -> dict:
    kw = {"lr": args.lr, "weight_decay": args.weight_decay}
    if args.optimizer in ("sgd", "rmsprop"):
        kw["momentum"] = args.momentum
    return kw


def build_impls(args, device: torch.device, dtype: torch.dtype) -> dict:
    names = IMPL_GROUPS.get(args.impl, (args.impl,))
    torch.manual_seed(args.seed)
    net = Net(hidden_size=args.hidden, depth=args.depth, device=device, dtype=dtype)
    impls = {}
    if "manual" in names:
        impls["manual"] = ManualImpl(net, args)
    if "engine" in names:
        engine = EngineNet(hidden_size=args.hidden, depth=args.depth, device=device, dtype=dtype)
        engine.load_state_dict(net.state_dict())  # the same initial weights
        impls["engine"] = EngineImpl(engine, args)
    if "torch" in names:
        twin = PytorchNet(hidden_size=args.hidden, depth=args.depth, device=device, dtype=dtype)
        twin.load_state_dict(net.state_dict())
        impls["torch"] = TorchImpl(twin, args)
    return impls


def max_param_abs_diff(impls: dict) -> float | None:
    """Largest |w_a - w_b| over every weight, between each implementation and the first."""
    if len(impls) < 2:
        return None
    first, *rest = impls.values()
    ref = first.model.state_dict()
    return max((ref[k] - v).abs().max().item() for other in rest for k, v in other.model.state_dict().items())


# -- training ------------------------------------------------------------------------------------------------

def param_stats(impl) -> dict:
    """Per parameter: gradient and parameter mean/std/norm (one host transfer for all of them)."""
    names, rows = [], []
    for name, p in impl.named_parameters():
        g = p.grad
        names.append(name)
        rows.append(torch.stack([g.mean(), g.std(), g.norm(), p.detach().mean(), p.detach().std(), p.detach().norm()]))
    values = torch.stack(rows).tolist()
    keys = ("grad_mean", "grad_std", "grad_norm", "param_mean", "param_std", "param_norm")
    return {n: dict(zip(keys, v)) for n, v in zip(names, values)}


def evaluate(impl, x: Tensor, y: Tensor, batch: int = 2000) -> tuple[float, float]:
    loss_sum = torch.zeros((), dtype=torch.float64, device=x.device)
    correct = torch.zeros((), dtype=torch.int64, device=x.device)
    for i in range(0, x.shape[0], batch):
        loss, logits = impl.eval_batch(x[i:i + batch], y[i:i + batch])
        loss_sum += loss.double()
        correct += (logits.argmax(1) == y[i:i + batch]).sum()
    n = x.shape[0]
    return loss_sum.item() / n, correct.item() / n


def train_epoch(impl, data: Data, perm: Tensor, epoch: int, args, log) -> dict:
    """One pass over the training split in the order ``perm``; returns the epoch's metrics."""
    from tqdm import tqdm
    bs, n = args.batch_size, perm.shape[0]
    steps = 1 if args.dry_run else math.ceil(n / bs)
    loss_sum, correct, seen = 0.0, torch.zeros((), dtype=torch.int64, device=perm.device), 0
    bar = tqdm(total=steps, desc=f"epoch {epoch} {impl.name}", leave=False, file=sys.stdout,
               disable=args.quiet or not sys.stdout.isatty())
    start = time.perf_counter()
    for step in range(1, steps + 1):
        idx = perm[(step - 1) * bs: step * bs]
        x, y = data.train_x[idx], data.train_y[idx]  # (B, 784), (B,): a gather on the device, no copies to it
        loss, logits, norm = impl.train_step(x, y)
        loss_val = loss.item()
        if not math.isfinite(loss_val):
            raise NonFiniteLoss(f"{impl.name}: the training loss became {loss_val} at epoch {epoch}, step {step}; "
                                f"stopping (lower --lr or set --clip-grad); the last good checkpoint is kept")
        loss_sum += loss_val * y.shape[0]
        correct += (logits.argmax(1) == y).sum()
        seen += y.shape[0]
        if step % args.log_interval == 0 or step == steps:
            rec = {"type": "step", "impl": impl.name, "epoch": epoch, "step": step,
                   "global_step": (epoch - 1) * steps + step, "loss": loss_val,
                   "train_loss": loss_sum / seen, "train_acc": correct.item() / seen}
            if args.monitor:
                after = torch.linalg.vector_norm(torch.stack([p.grad.norm() for _, p in impl.named_parameters()]))
                rec["grad_norm_before_clip"] = float(norm) if norm is not None else after.item()
                rec["grad_norm_after_clip"] = after.item()
                rec["params"] = param_stats(impl)
            log(rec)
            bar.set_postfix(loss=f"{rec['train_loss']:.4f}", acc=f"{rec['train_acc']:.3f}")
        bar.update(1)
    if perm.device.type == "cuda":
        torch.cuda.synchronize(perm.device)
    seconds = time.perf_counter() - start
    bar.close()
    return {"train_loss": loss_sum / seen, "train_acc": correct.item() / seen, "seconds": seconds}


# -- checkpoints ---------------------------------------------------------------------------------------------

def save_checkpoint(path: Path, state: dict) -> None:
    """Write to a temporary file, fsync, then os.replace: a crash or Ctrl-C leaves the previous checkpoint."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # make the rename itself durable
        finally:
            os.close(dir_fd)
    finally:
        tmp.unlink(missing_ok=True)


def checkpoint_state(impls: dict, args, epoch: int, records: list, batch_gen: torch.Generator) -> dict:
    return {
        "format": "handgrad-train-1", "epoch": epoch, "args": {k: getattr(args, k) for k in MATH_ARGS},
        "models": {name: impl.model.state_dict() for name, impl in impls.items()},
        "optimizers": {name: impl.opt.state_dict() for name, impl in impls.items()},
        "rng": {"torch": torch.get_rng_state(), "batches": batch_gen.get_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
        "records": records,  # every metrics.jsonl line so far
    }


def load_checkpoint(path: Path, args, parser_defaults: dict) -> dict:
    """Read a checkpoint and adopt its math settings; refuse ones that were explicitly changed."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UsageError(f"--resume {path}: no such file") from None
    except Exception as e:
        raise UsageError(f"--resume {path}: not a readable checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != "handgrad-train-1":
        raise UsageError(f"--resume {path}: not a handgrad train.py checkpoint")
    for key, saved in ckpt["args"].items():
        given = getattr(args, key)
        if given != saved and given != parser_defaults[key]:
            flag = "--" + key.replace("_", "-")
            raise UsageError(f"--resume: the checkpoint was trained with {flag} {saved}, not {given}; "
                             f"drop {flag} to continue it")
        setattr(args, key, saved)
    if ckpt["epoch"] >= args.epochs:
        raise UsageError(f"--resume: the checkpoint already holds {ckpt['epoch']} epochs; pass --epochs > {ckpt['epoch']}")
    return ckpt


# -- outputs ---------------------------------------------------------------------------------------------------

def write_plots(out: Path, records: list, monitor: bool) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = [r for r in records if r["type"] == "epoch"]
    steps = [r for r in records if r["type"] == "step"]
    impls = sorted({h["impl"] for h in history})
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for name in impls:
        rows = [h for h in history if h["impl"] == name]
        ep = [h["epoch"] for h in rows]
        ax_loss.plot(ep, [h["train_loss"] for h in rows], "o-", label=f"{name} train")
        ax_acc.plot(ep, [h["train_acc"] for h in rows], "o-", label=f"{name} train")
        val = [h for h in rows if h.get("val_loss") is not None]
        if val:
            ax_loss.plot([h["epoch"] for h in val], [h["val_loss"] for h in val], "s--", label=f"{name} val")
            ax_acc.plot([h["epoch"] for h in val], [h["val_acc"] for h in val], "s--", label=f"{name} val")
    for ax, title in ((ax_loss, "cross-entropy loss"), (ax_acc, "accuracy")):
        ax.set_xlabel("epoch"); ax.set_title(title); ax.grid(alpha=0.3); ax.legend()
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=100)
    plt.close(fig)
    mon = [s for s in steps if "grad_norm_before_clip" in s]
    if not (monitor and mon):
        return
    fig, (ax_total, ax_layer) = plt.subplots(1, 2, figsize=(11, 4))
    for name in impls:
        rows = [s for s in mon if s["impl"] == name]
        x = [s["global_step"] for s in rows]
        ax_total.plot(x, [s["grad_norm_before_clip"] for s in rows], label=f"{name} before clip")
        ax_total.plot(x, [s["grad_norm_after_clip"] for s in rows], "--", label=f"{name} after clip")
        for pname in rows[0]["params"] if rows else []:
            if pname.endswith("weight"):
                ax_layer.plot(x, [s["params"][pname]["grad_norm"] for s in rows], label=f"{name} {pname}")
    ax_total.set_title("total gradient norm"); ax_layer.set_title("gradient norm per layer")
    for ax in (ax_total, ax_layer):
        ax.set_xlabel("step"); ax.set_yscale("log"); ax.grid(alpha=0.3); ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "grad_norms.png", dpi=100)
    plt.close(fig)


def _atomic_write_text(path: Path, text: str) -> None:
    _atomic_write_bytes(path, text.encode())


# -- main ------------------------------------------------------------------------------------------------------

def run(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(argv)
    device = resolve_device(args.device)
    say = (lambda *a, **k: None) if args.quiet else print
    ckpt = None
    if args.resume is not None:
        defaults = {k: parser.get_default(k) for k in MATH_ARGS}
        ckpt = load_checkpoint(args.resume, args, defaults)
    dtype = getattr(torch, args.dtype)
    out = args.out or (args.resume.parent if args.resume else Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    data = load_data(args, device, dtype, say)
    data_seconds = time.perf_counter() - t0
    impls = build_impls(args, device, dtype)
    batch_gen = torch.Generator().manual_seed(args.seed + 1)
    records: list[dict] = []  # everything logged, in order; epochs are the records of type "epoch"
    start_epoch = 1
    if ckpt is not None:
        for name, impl in impls.items():
            impl.model.load_state_dict({k: v.to(device) for k, v in ckpt["models"][name].items()})
            impl.opt.load_state_dict(ckpt["optimizers"][name])
        torch.set_rng_state(ckpt["rng"]["torch"])
        batch_gen.set_state(ckpt["rng"]["batches"])
        if ckpt["rng"]["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
        records = list(ckpt["records"])
        start_epoch = ckpt["epoch"] + 1
        say(f"resuming from {args.resume} after epoch {ckpt['epoch']}")
    metrics_path = out / "metrics.jsonl"
    # Rewrite the log from what the checkpoint vouches for, so a half-finished epoch leaves no stray lines.
    _atomic_write_text(metrics_path, "".join(json.dumps(r) + "\n" for r in records))
    metrics_file = open(metrics_path, "a")

    def log(rec: dict) -> None:
        metrics_file.write(json.dumps(rec) + "\n")
        metrics_file.flush()
        records.append(rec)

    say(f"{args.dataset}: {data.train_x.shape[0]} train, {0 if data.val_x is None else data.val_x.shape[0]} val, "
        f"{data.test_x.shape[0]} test on {device} ({args.dtype}); loaded in {data_seconds:.2f} s; "
        f"impl {', '.join(impls)}; output {out}")
    ckpt_path = out / "checkpoint.pt"
    try:
        for epoch in range(start_epoch, args.epochs + 1):
            perm = torch.randperm(data.train_x.shape[0], generator=batch_gen).to(device)
            for name, impl in impls.items():
                rec = {"type": "epoch", "impl": name, "epoch": epoch, **train_epoch(impl, data, perm, epoch, args, log)}
                rec["val_loss"] = rec["val_acc"] = None
                if data.val_x is not None and (epoch % args.val_interval == 0 or epoch == args.epochs):
                    rec["val_loss"], rec["val_acc"] = evaluate(impl, data.val_x, data.val_y)
                log(rec)
                val = "" if rec["val_loss"] is None else f" | val loss {rec['val_loss']:.4f} acc {rec['val_acc']:.2%}"
                say(f"epoch {epoch:>3} {name:<6} train loss {rec['train_loss']:.4f} acc {rec['train_acc']:.2%}"
                    f"{val} | {rec['seconds']:.2f} s")
            diff = max_param_abs_diff(impls)
            if diff is not None:
                log({"type": "drift", "epoch": epoch, "impls": list(impls), "max_param_abs_diff": diff})
                say(f"epoch {epoch:>3} largest weight difference between {', '.join(impls)}: {diff:.3e}")
            save_checkpoint(ckpt_path, checkpoint_state(impls, args, epoch, records, batch_gen))
            if args.dry_run:
                break
    except NonFiniteLoss as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"\ninterrupted; the last complete checkpoint is {ckpt_path if ckpt_path.exists() else 'none yet'}",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        metrics_file.close()

    results = {}
    for name, impl in impls.items():
        test_loss, test_acc = evaluate(impl, data.test_x, data.test_y)
        rows = [r for r in records if r["type"] == "epoch" and r["impl"] == name]
        results[name] = {"test_accuracy": test_acc, "test_loss": test_loss, "train_loss": rows[-1]["train_loss"],
                         "seconds_per_epoch": sum(h["seconds"] for h in rows) / len(rows)}
    summary = {"dataset": args.dataset, "epochs": max(r["epoch"] for r in records), "results": results,
               "max_param_abs_diff": max_param_abs_diff(impls)}
    _atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_plots(out, records, args.monitor)

    say(f"\n{'impl':<8}{'test acc':>10}{'test loss':>11}{'train loss':>12}{'s/epoch':>10}")
    for name, r in results.items():
        say(f"{name:<8}{r['test_accuracy']:>10.2%}{r['test_loss']:>11.4f}{r['train_loss']:>12.4f}"
            f"{r['seconds_per_epoch']:>10.2f}")
    if summary["max_param_abs_diff"] is not None:
        say(f"largest weight difference between implementations after {summary['epochs']} epochs: "
            f"{summary['max_param_abs_diff']:.3e}")
    say(f"wrote {out}/summary.json, metrics.jsonl, curves.png{', grad_norms.png' if args.monitor else ''}, "
        f"checkpoint.pt")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return run(argv)
    except KeyboardInterrupt:  # before training started (loading data, say): nothing was written
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except UsageError as e:
        msg = str(e)
        print(msg if msg.startswith("error:") else f"train.py: error: {msg}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())

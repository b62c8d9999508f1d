"""Seeing inside training: GradientMonitor records gradient, weight, update and activation statistics
per layer; plot_records draws them; to_tensorboard writes them for TensorBoard."""

from .activations import ActivationWatcher, activation_kind
from .monitor import GradientMonitor
from .plots import plot_records
from .records import hist_edges, read_jsonl, write_jsonl
from .stats import SIGMOID_SATURATION, TANH_SATURATION, activation_stats, grad_stats, histogram, total_norm
from .tensorboard import to_tensorboard

__all__ = [
    "GradientMonitor",
    "ActivationWatcher",
    "activation_kind",
    "plot_records",
    "to_tensorboard",
    "write_jsonl",
    "read_jsonl",
    "hist_edges",
    "grad_stats",
    "histogram",
    "activation_stats",
    "total_norm",
    "TANH_SATURATION",
    "SIGMOID_SATURATION",
]

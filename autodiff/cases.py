"""gradcheck's built-in cases, first part: the MLPs, the losses, normalisation, convolution and pooling.

A case is ``run(fast) -> list[GradResult]``: it draws its inputs (the command seeds each case), builds the layer
and checks it.  ``cases_sequence.py`` has attention, the GPT and the recurrent layers; ``gradcheck.py`` (the
command) runs them all.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from layers import (GELU, AvgPool2d, BatchNorm1d, BatchNorm2d, Conv2d, Dropout, Flatten, Layer, LayerNorm, LeakyReLU,
                    Linear, LogSoftmax, MaxPool2d, ReLU, Sequential, Sigmoid, SiLU, Softmax, SyncBatchNorm, Tanh)
from losses import CrossEntropyLoss, MSELoss
from models import Net

from .gradcheck import check_layer, check_loss
from .numeric import GradResult

def _away_from_zero(x: Tensor, margin: float = 1e-2) -> Tensor:
    """Push entries off the ReLU kink, where the derivative is undefined and differences straddle it."""
    return torch.where(x.abs() < margin, x.sign() * margin + (x == 0) * margin, x)


F64 = torch.float64
Case = Callable[[bool], list[GradResult]]  # run(fast) -> results


def rnd(*shape: int, scale: float = 1.0) -> Tensor:
    return torch.randn(*shape, dtype=F64) * scale


def layer_case(label: str, make: Callable[[], Layer], *shape: int, kink: bool = False, scale: float = 1.0,
               mode: str | None = None) -> Case:
    """A check of ``make()`` on a random (shape) input; ``mode`` "train"/"eval" sets the layer's mode first;
    ``kink`` keeps inputs off a ReLU-like kink."""
    def run(fast: bool) -> list[GradResult]:
        x = rnd(*shape, scale=scale)
        layer = make()
        if mode is not None:
            layer.train(mode == "train")
        tag = f" [{mode}]" if mode else ""
        return check_layer(layer, _away_from_zero(x) if kink else x, name=f"{label}{tag} x{tuple(shape)}", fast=fast)
    return run


def loss_case(label: str, make, input_shape, target_fn) -> Case:
    def run(fast: bool) -> list[GradResult]:  # a loss has few inputs: always the full check
        x = rnd(*input_shape, scale=3.0)
        return check_loss(make(), x, target_fn(x), name=f"{label} x{tuple(input_shape)}")
    return run


def _mlp_cases() -> dict[str, list[Case]]:
    return {
        "linear": [layer_case("Linear(7,5)", lambda: Linear(7, 5, dtype=F64), 4, 7),
                   layer_case("Linear(3,6)", lambda: Linear(3, 6, dtype=F64), 1, 3),
                   layer_case("Linear(5,4,bias=False)", lambda: Linear(5, 4, bias=False, dtype=F64), 3, 5)],
        "relu": [layer_case("ReLU", ReLU, 4, 9, kink=True), layer_case("ReLU", ReLU, 1, 5, kink=True),
                 layer_case("ReLU", ReLU, 2, 3, 4, kink=True)],
        "tanh": [layer_case("Tanh", Tanh, 4, 9), layer_case("Tanh", Tanh, 1, 5, scale=3.0)],
        "sigmoid": [layer_case("Sigmoid", Sigmoid, 4, 9), layer_case("Sigmoid", Sigmoid, 1, 5, scale=3.0)],
        "softmax": [layer_case("Softmax", Softmax, 4, 9), layer_case("Softmax", Softmax, 1, 5, scale=2.0),
                    layer_case("Softmax(dim=0)", lambda: Softmax(dim=0), 6, 3),
                    layer_case("Softmax(dim=1)", lambda: Softmax(dim=1), 2, 4, 3)],
        "net": [layer_case("Net(5-6-6-3)", lambda: Net(hidden_size=6, num_classes=3, in_features=5, depth=2,
                                                       dtype=F64), 4, 5),
                layer_case("Net(tanh,sigmoid,softmax)",
                           lambda: Net(layers=[Linear(4, 5, dtype=F64), Tanh(), Linear(5, 5, dtype=F64), Sigmoid(),
                                               Linear(5, 3, dtype=F64), Softmax()]), 1, 4)],
    }


def _loss_cases() -> dict[str, list[Case]]:
    idx = lambda x: torch.randint(0, x.shape[1], (x.shape[0],))  # noqa: E731
    probs = lambda x: torch.softmax(torch.randn_like(x), 1)  # noqa: E731
    same = lambda x: torch.randn_like(x)  # noqa: E731
    return {
        "crossentropyloss": [
            loss_case("CrossEntropy", CrossEntropyLoss, (5, 4), idx),
            loss_case("CrossEntropy(sum)", lambda: CrossEntropyLoss("sum"), (1, 6), idx),
            loss_case("CrossEntropy(smooth=0.1)", lambda: CrossEntropyLoss(label_smoothing=0.1), (5, 4), idx),
            loss_case("CrossEntropy(probs)", CrossEntropyLoss, (3, 5), probs),
            loss_case("CrossEntropy(probs,sum,smooth=0.2)", lambda: CrossEntropyLoss("sum", label_smoothing=0.2),
                      (3, 5), probs)],
        "mseloss": [loss_case("MSE", MSELoss, (4, 3), same), loss_case("MSE(sum)", lambda: MSELoss("sum"), (1, 7), same),
                    loss_case("MSE", MSELoss, (2, 3, 4), same)],
    }


def nontrivial(layer):
    """Parameters away from their defaults (gamma off 1, beta off 0: a default can hide a missing term) and
    running statistics away from 0 and 1, so eval mode checks them too."""
    with torch.no_grad():
        for name, t in layer.named_parameters():
            t.copy_(torch.rand_like(t) + 0.5 if name.endswith("weight") else torch.randn_like(t))
        for name, t in layer.named_buffers():
            if name.endswith("running_mean"):
                t.copy_(torch.randn_like(t) * 0.5)
            elif name.endswith("running_var"):
                t.copy_(torch.rand_like(t) + 0.5)
    return layer


def _norm_cases() -> dict[str, list[Case]]:
    bn1 = lambda c, **kw: lambda: nontrivial(BatchNorm1d(c, dtype=F64, **kw))  # noqa: E731
    bn2 = lambda c, **kw: lambda: nontrivial(BatchNorm2d(c, dtype=F64, **kw))  # noqa: E731
    ln = lambda s, **kw: lambda: nontrivial(LayerNorm(s, dtype=F64, **kw))  # noqa: E731
    return {
        "batchnorm1d": [layer_case("BatchNorm1d(4)", bn1(4), 5, 4, mode="train"),
                        layer_case("BatchNorm1d(4)", bn1(4), 5, 4, mode="eval"),
                        layer_case("BatchNorm1d(3)", bn1(3), 2, 3, 4, mode="train"),
                        layer_case("BatchNorm1d(3)", bn1(3), 1, 3, 5, mode="train"),
                        layer_case("BatchNorm1d(3)", bn1(3), 1, 3, 5, mode="eval"),
                        layer_case("BatchNorm1d(3,affine=False)", bn1(3, affine=False), 4, 3, mode="train"),
                        layer_case("BatchNorm1d(3,momentum=None)", bn1(3, momentum=None), 4, 3, 2, mode="train"),
                        layer_case("BatchNorm1d(3,track_running_stats=False)", bn1(3, track_running_stats=False),
                                   4, 3, mode="eval")],
        "batchnorm2d": [layer_case("BatchNorm2d(3)", bn2(3), 2, 3, 3, 4, mode="train"),
                        layer_case("BatchNorm2d(3)", bn2(3), 2, 3, 3, 4, mode="eval"),
                        layer_case("BatchNorm2d(2)", bn2(2), 1, 2, 3, 3, mode="train"),
                        layer_case("BatchNorm2d(2,eps=0.1)", bn2(2, eps=0.1), 3, 2, 2, 2, mode="train")],
        # Outside a process group (as here) SyncBatchNorm is BatchNorm: tests/test_sync_batchnorm.py checks the
        # synchronised path on 2 processes against this one.
        "syncbatchnorm": [layer_case("SyncBatchNorm(3)", lambda: nontrivial(SyncBatchNorm(3, dtype=F64)), 2, 3, 2, 3,
                                     mode="train"),
                          layer_case("SyncBatchNorm(3)", lambda: nontrivial(SyncBatchNorm(3, dtype=F64)), 4, 3,
                                     mode="eval")],
        "layernorm": [layer_case("LayerNorm(6)", ln(6), 4, 6), layer_case("LayerNorm(5)", ln(5), 1, 5),
                      layer_case("LayerNorm((3,4))", ln((3, 4)), 2, 3, 4),
                      layer_case("LayerNorm(4,bias=False)", ln(4, bias=False), 2, 3, 4),
                      layer_case("LayerNorm(4,elementwise_affine=False)", ln(4, elementwise_affine=False), 3, 4)],
        "dropout": [layer_case("Dropout(0.3)", lambda: Dropout(0.3), 4, 9, mode="train"),
                    layer_case("Dropout(0.3)", lambda: Dropout(0.3), 1, 2, 3, 4, mode="train"),
                    layer_case("Dropout(0.3)", lambda: Dropout(0.3), 4, 9, mode="eval")],
        "gelu": [layer_case("GELU", GELU, 4, 9, scale=2.0), layer_case("GELU(tanh)", lambda: GELU("tanh"), 1, 5, 3,
                                                                          scale=2.0)],
        "leakyrelu": [layer_case("LeakyReLU", LeakyReLU, 4, 9, kink=True),
                      layer_case("LeakyReLU(0.2)", lambda: LeakyReLU(0.2), 1, 2, 5, kink=True)],
        "silu": [layer_case("SiLU", SiLU, 4, 9, scale=2.0), layer_case("SiLU", SiLU, 1, 5)],
        "logsoftmax": [layer_case("LogSoftmax(1)", lambda: LogSoftmax(1), 4, 9, scale=2.0),
                       layer_case("LogSoftmax(0)", lambda: LogSoftmax(0), 6, 3),
                       layer_case("LogSoftmax(-1)", lambda: LogSoftmax(-1), 1, 2, 4)],
    }


def distinct(*shape: int, spacing: float = 0.05) -> Tensor:
    """A random arrangement of evenly spaced values (centred on 0): no two entries closer than ``spacing``, so
    a perturbation of eps << spacing never changes which entry is a window's maximum (max pooling's kink)."""
    n = 1
    for s in shape:
        n *= s
    return ((torch.randperm(n, dtype=F64) - (n - 1) / 2) * spacing).view(*shape)


def distinct_case(label: str, make: Callable[[], Layer], *shape: int, mode: str | None = None) -> Case:
    """``layer_case`` on an input of distinct values (``distinct``): for layers that take a maximum."""
    def run(fast: bool) -> list[GradResult]:
        layer = make()
        if mode is not None:
            layer.train(mode == "train")
        tag = f" [{mode}]" if mode else ""
        return check_layer(layer, distinct(*shape), name=f"{label}{tag} x{tuple(shape)}", fast=fast)
    return run


def _small_cnn() -> Sequential:
    """(N, 1, 8, 8) -> conv+ReLU+max pool -> conv("same", even kernel)+ReLU+avg pool -> Flatten -> Linear -> (N, 5)."""
    return Sequential(Conv2d(1, 3, 3, padding=1, dtype=F64), ReLU(), MaxPool2d(2),
                      Conv2d(3, 4, (2, 3), padding="same", dtype=F64), ReLU(), AvgPool2d(2),
                      Flatten(), Linear(16, 5, dtype=F64))


def _conv_cases() -> dict[str, list[Case]]:
    conv = lambda *a, **kw: lambda: Conv2d(*a, dtype=F64, **kw)  # noqa: E731
    return {
        "conv2d": [layer_case("Conv2d(2,3,3)", conv(2, 3, 3), 2, 2, 5, 5),
                   layer_case("Conv2d(2,4,3,stride=2,padding=1)", conv(2, 4, 3, stride=2, padding=1), 1, 2, 6, 5),
                   layer_case("Conv2d(2,3,(2,3),padding='same')", conv(2, 3, (2, 3), padding="same"), 2, 2, 4, 5),
                   layer_case("Conv2d(2,2,3,padding='valid',dilation=(1,2))",
                              conv(2, 2, 3, padding="valid", dilation=(1, 2)), 1, 2, 5, 7),
                   layer_case("Conv2d(4,4,3,dilation=2,groups=2,bias=False)",
                              conv(4, 4, 3, dilation=2, groups=2, bias=False), 1, 4, 6, 6),
                   layer_case("Conv2d(3,6,(3,2),stride=(2,1),padding=(1,0),dilation=(1,2),groups=3)",
                              conv(3, 6, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=3),
                              2, 3, 7, 6)],
        "maxpool2d": [distinct_case("MaxPool2d(2)", lambda: MaxPool2d(2), 2, 2, 4, 5),
                      distinct_case("MaxPool2d(3,stride=2,padding=1)", lambda: MaxPool2d(3, 2, 1), 1, 2, 5, 6),
                      distinct_case("MaxPool2d(3,stride=1,dilation=(1,2),ceil_mode=True)",
                                    lambda: MaxPool2d(3, 1, dilation=(1, 2), ceil_mode=True), 1, 1, 5, 7)],
        "avgpool2d": [layer_case("AvgPool2d(2)", lambda: AvgPool2d(2), 2, 2, 4, 5),
                      layer_case("AvgPool2d(3,stride=2,padding=1)", lambda: AvgPool2d(3, 2, 1), 1, 2, 5, 6),
                      layer_case("AvgPool2d(3,2,1,count_include_pad=False,ceil_mode=True)",
                                 lambda: AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False), 1, 2, 6, 6)],
        "flatten": [layer_case("Flatten()", Flatten, 2, 3, 2, 2), layer_case("Flatten(0,1)", lambda: Flatten(0, 1), 2, 3, 4),
                    layer_case("Flatten(-2,-1)", lambda: Flatten(-2, -1), 1, 2, 3, 2)],
        "cnn": [layer_case("CNN(conv,relu,maxpool,conv same,relu,avgpool,flatten,linear)", _small_cnn, 2, 1, 8, 8),
                layer_case("CNN(conv,relu,maxpool,conv same,relu,avgpool,flatten,linear)", _small_cnn, 1, 1, 8, 8)],
    }


def inputs_case(label: str, make: Callable[[], Layer], inputs: Callable[[], tuple], mode: str | None = None,
                **forward_kwargs) -> Case:
    """A check of ``make()`` on the tuple ``inputs()`` (query, key, value; token ids) with keyword arguments."""
    def run(fast: bool) -> list[GradResult]:
        layer = make()
        if mode is not None:
            layer.train(mode == "train")
        args = inputs()
        tag = f" [{mode}]" if mode else ""
        shapes = ",".join(str(tuple(a.shape)) for a in (args if isinstance(args, tuple) else (args,)))
        return check_layer(layer, args, name=f"{label}{tag} x{shapes}", fast=fast, forward_kwargs=forward_kwargs)
    return run

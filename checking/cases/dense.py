"""The case families of the feed-forward layers: MLPs, losses, normalisation and dropout, the further activations,
convolution and pooling.  Each family is a function returning {command-line name: [cases]}, built when called."""

from __future__ import annotations

import torch

from layers import (
    GELU,
    AvgPool2d,
    BatchNorm1d,
    BatchNorm2d,
    Conv2d,
    Dropout,
    Flatten,
    LayerNorm,
    LeakyReLU,
    Linear,
    LogSoftmax,
    MaxPool2d,
    ReLU,
    Sequential,
    Sigmoid,
    SiLU,
    Softmax,
    SyncBatchNorm,
    Tanh,
)
from losses import CrossEntropyLoss, MSELoss
from models import Net

from .make import F64, Case, distinct_case, layer_case, loss_case, nontrivial


def mlp() -> dict[str, list[Case]]:
    """Linear, the first activations and softmax, and the MLP (``Net``) made of them."""
    return {
        "linear": [
            layer_case("Linear(7,5)", lambda: Linear(7, 5, dtype=F64), 4, 7),
            layer_case("Linear(3,6)", lambda: Linear(3, 6, dtype=F64), 1, 3),
            layer_case("Linear(5,4,bias=False)", lambda: Linear(5, 4, bias=False, dtype=F64), 3, 5),
        ],
        "relu": [
            layer_case("ReLU", ReLU, 4, 9, kink=True),
            layer_case("ReLU", ReLU, 1, 5, kink=True),
            layer_case("ReLU", ReLU, 2, 3, 4, kink=True),
        ],
        "tanh": [layer_case("Tanh", Tanh, 4, 9), layer_case("Tanh", Tanh, 1, 5, scale=3.0)],
        "sigmoid": [layer_case("Sigmoid", Sigmoid, 4, 9), layer_case("Sigmoid", Sigmoid, 1, 5, scale=3.0)],
        "softmax": [
            layer_case("Softmax", Softmax, 4, 9),
            layer_case("Softmax", Softmax, 1, 5, scale=2.0),
            layer_case("Softmax(dim=0)", lambda: Softmax(dim=0), 6, 3),
            layer_case("Softmax(dim=1)", lambda: Softmax(dim=1), 2, 4, 3),
        ],
        "net": [
            layer_case(
                "Net(5-6-6-3)", lambda: Net(hidden_size=6, num_classes=3, in_features=5, depth=2, dtype=F64), 4, 5
            ),
            layer_case(
                "Net(tanh,sigmoid,softmax)",
                lambda: Net(
                    layers=[
                        Linear(4, 5, dtype=F64),
                        Tanh(),
                        Linear(5, 5, dtype=F64),
                        Sigmoid(),
                        Linear(5, 3, dtype=F64),
                        Softmax(),
                    ]
                ),
                1,
                4,
            ),
        ],
    }


def loss() -> dict[str, list[Case]]:
    """Cross-entropy (class indices, probabilities, label smoothing) and mean squared error."""
    idx = lambda x: torch.randint(0, x.shape[1], (x.shape[0],))  # noqa: E731
    probs = lambda x: torch.softmax(torch.randn_like(x), 1)  # noqa: E731
    same = lambda x: torch.randn_like(x)  # noqa: E731
    return {
        "crossentropyloss": [
            loss_case("CrossEntropy", CrossEntropyLoss, (5, 4), idx),
            loss_case("CrossEntropy(sum)", lambda: CrossEntropyLoss("sum"), (1, 6), idx),
            loss_case("CrossEntropy(smooth=0.1)", lambda: CrossEntropyLoss(label_smoothing=0.1), (5, 4), idx),
            loss_case("CrossEntropy(probs)", CrossEntropyLoss, (3, 5), probs),
            loss_case(
                "CrossEntropy(probs,sum,smooth=0.2)",
                lambda: CrossEntropyLoss("sum", label_smoothing=0.2),
                (3, 5),
                probs,
            ),
        ],
        "mseloss": [
            loss_case("MSE", MSELoss, (4, 3), same),
            loss_case("MSE(sum)", lambda: MSELoss("sum"), (1, 7), same),
            loss_case("MSE", MSELoss, (2, 3, 4), same),
        ],
    }


def normalisation() -> dict[str, list[Case]]:
    """Batch norm (train and eval, every option), SyncBatchNorm, layer norm and dropout."""
    bn1 = lambda c, **kw: lambda: nontrivial(BatchNorm1d(c, dtype=F64, **kw))  # noqa: E731
    bn2 = lambda c, **kw: lambda: nontrivial(BatchNorm2d(c, dtype=F64, **kw))  # noqa: E731
    ln = lambda s, **kw: lambda: nontrivial(LayerNorm(s, dtype=F64, **kw))  # noqa: E731
    return {
        "batchnorm1d": [
            layer_case("BatchNorm1d(4)", bn1(4), 5, 4, mode="train"),
            layer_case("BatchNorm1d(4)", bn1(4), 5, 4, mode="eval"),
            layer_case("BatchNorm1d(3)", bn1(3), 2, 3, 4, mode="train"),
            layer_case("BatchNorm1d(3)", bn1(3), 1, 3, 5, mode="train"),
            layer_case("BatchNorm1d(3)", bn1(3), 1, 3, 5, mode="eval"),
            layer_case("BatchNorm1d(3,affine=False)", bn1(3, affine=False), 4, 3, mode="train"),
            layer_case("BatchNorm1d(3,momentum=None)", bn1(3, momentum=None), 4, 3, 2, mode="train"),
            layer_case(
                "BatchNorm1d(3,track_running_stats=False)", bn1(3, track_running_stats=False), 4, 3, mode="eval"
            ),
        ],
        "batchnorm2d": [
            layer_case("BatchNorm2d(3)", bn2(3), 2, 3, 3, 4, mode="train"),
            layer_case("BatchNorm2d(3)", bn2(3), 2, 3, 3, 4, mode="eval"),
            layer_case("BatchNorm2d(2)", bn2(2), 1, 2, 3, 3, mode="train"),
            layer_case("BatchNorm2d(2,eps=0.1)", bn2(2, eps=0.1), 3, 2, 2, 2, mode="train"),
        ],
        # Outside a process group (as here) SyncBatchNorm is BatchNorm: tests/test_sync_batchnorm.py checks the
        # synchronised path on 2 processes against this one.
        "syncbatchnorm": [
            layer_case("SyncBatchNorm(3)", lambda: nontrivial(SyncBatchNorm(3, dtype=F64)), 2, 3, 2, 3, mode="train"),
            layer_case("SyncBatchNorm(3)", lambda: nontrivial(SyncBatchNorm(3, dtype=F64)), 4, 3, mode="eval"),
        ],
        "layernorm": [
            layer_case("LayerNorm(6)", ln(6), 4, 6),
            layer_case("LayerNorm(5)", ln(5), 1, 5),
            layer_case("LayerNorm((3,4))", ln((3, 4)), 2, 3, 4),
            layer_case("LayerNorm(4,bias=False)", ln(4, bias=False), 2, 3, 4),
            layer_case("LayerNorm(4,elementwise_affine=False)", ln(4, elementwise_affine=False), 3, 4),
        ],
        "dropout": [
            layer_case("Dropout(0.3)", lambda: Dropout(0.3), 4, 9, mode="train"),
            layer_case("Dropout(0.3)", lambda: Dropout(0.3), 1, 2, 3, 4, mode="train"),
            layer_case("Dropout(0.3)", lambda: Dropout(0.3), 4, 9, mode="eval"),
        ],
    }


def activations() -> dict[str, list[Case]]:
    """GELU (exact and tanh), LeakyReLU, SiLU and LogSoftmax."""
    return {
        "gelu": [
            layer_case("GELU", GELU, 4, 9, scale=2.0),
            layer_case("GELU(tanh)", lambda: GELU("tanh"), 1, 5, 3, scale=2.0),
        ],
        "leakyrelu": [
            layer_case("LeakyReLU", LeakyReLU, 4, 9, kink=True),
            layer_case("LeakyReLU(0.2)", lambda: LeakyReLU(0.2), 1, 2, 5, kink=True),
        ],
        "silu": [layer_case("SiLU", SiLU, 4, 9, scale=2.0), layer_case("SiLU", SiLU, 1, 5)],
        "logsoftmax": [
            layer_case("LogSoftmax(1)", lambda: LogSoftmax(1), 4, 9, scale=2.0),
            layer_case("LogSoftmax(0)", lambda: LogSoftmax(0), 6, 3),
            layer_case("LogSoftmax(-1)", lambda: LogSoftmax(-1), 1, 2, 4),
        ],
    }


def _small_cnn() -> Sequential:
    """(N, 1, 8, 8) -> conv+ReLU+max pool -> conv("same", even kernel)+ReLU+avg pool -> Flatten -> Linear -> (N, 5)."""
    return Sequential(
        Conv2d(1, 3, 3, padding=1, dtype=F64),
        ReLU(),
        MaxPool2d(2),
        Conv2d(3, 4, (2, 3), padding="same", dtype=F64),
        ReLU(),
        AvgPool2d(2),
        Flatten(),
        Linear(16, 5, dtype=F64),
    )


def convolution() -> dict[str, list[Case]]:
    """Conv2d (stride, padding, dilation, groups), max and average pooling, Flatten, and a small CNN."""
    conv = lambda *a, **kw: lambda: Conv2d(*a, dtype=F64, **kw)  # noqa: E731
    return {
        "conv2d": [
            layer_case("Conv2d(2,3,3)", conv(2, 3, 3), 2, 2, 5, 5),
            layer_case("Conv2d(2,4,3,stride=2,padding=1)", conv(2, 4, 3, stride=2, padding=1), 1, 2, 6, 5),
            layer_case("Conv2d(2,3,(2,3),padding='same')", conv(2, 3, (2, 3), padding="same"), 2, 2, 4, 5),
            layer_case(
                "Conv2d(2,2,3,padding='valid',dilation=(1,2))",
                conv(2, 2, 3, padding="valid", dilation=(1, 2)),
                1,
                2,
                5,
                7,
            ),
            layer_case(
                "Conv2d(4,4,3,dilation=2,groups=2,bias=False)",
                conv(4, 4, 3, dilation=2, groups=2, bias=False),
                1,
                4,
                6,
                6,
            ),
            layer_case(
                "Conv2d(3,6,(3,2),stride=(2,1),padding=(1,0),dilation=(1,2),groups=3)",
                conv(3, 6, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=3),
                2,
                3,
                7,
                6,
            ),
        ],
        "maxpool2d": [
            distinct_case("MaxPool2d(2)", lambda: MaxPool2d(2), 2, 2, 4, 5),
            distinct_case("MaxPool2d(3,stride=2,padding=1)", lambda: MaxPool2d(3, 2, 1), 1, 2, 5, 6),
            distinct_case(
                "MaxPool2d(3,stride=1,dilation=(1,2),ceil_mode=True)",
                lambda: MaxPool2d(3, 1, dilation=(1, 2), ceil_mode=True),
                1,
                1,
                5,
                7,
            ),
        ],
        "avgpool2d": [
            layer_case("AvgPool2d(2)", lambda: AvgPool2d(2), 2, 2, 4, 5),
            layer_case("AvgPool2d(3,stride=2,padding=1)", lambda: AvgPool2d(3, 2, 1), 1, 2, 5, 6),
            layer_case(
                "AvgPool2d(3,2,1,count_include_pad=False,ceil_mode=True)",
                lambda: AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
                1,
                2,
                6,
                6,
            ),
        ],
        "flatten": [
            layer_case("Flatten()", Flatten, 2, 3, 2, 2),
            layer_case("Flatten(0,1)", lambda: Flatten(0, 1), 2, 3, 4),
            layer_case("Flatten(-2,-1)", lambda: Flatten(-2, -1), 1, 2, 3, 2),
        ],
        "cnn": [
            layer_case("CNN(conv,relu,maxpool,conv same,relu,avgpool,flatten,linear)", _small_cnn, 2, 1, 8, 8),
            layer_case("CNN(conv,relu,maxpool,conv same,relu,avgpool,flatten,linear)", _small_cnn, 1, 1, 8, 8),
        ],
    }

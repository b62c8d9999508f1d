"""gradcheck's built-in cases, in families.  A case is ``run(fast) -> list[GradResult]``; a family is a function
returning {command-line name: [cases]} (``python gradcheck.py --layer NAME`` picks one name), built when called.

``FAMILIES`` lists them in the order the command runs them (the order seeds each case's inputs):

- ``mlp``: Linear, ReLU, Tanh, Sigmoid, Softmax and the MLP ``Net``
- ``loss``: CrossEntropyLoss and MSELoss
- ``normalisation``: BatchNorm1d/2d, SyncBatchNorm, LayerNorm and Dropout
- ``activations``: GELU, LeakyReLU, SiLU and LogSoftmax
- ``convolution``: Conv2d, MaxPool2d, AvgPool2d, Flatten and a small CNN
- ``attention``: Embedding, attention (blocked and textbook), MultiheadAttention, the transformer layers, the GPT
- ``recurrent``: RNN, LSTM, GRU, their cells and RecurrentLM, with torch's kernels as the autograd oracle
- ``mixture``: the mixture of experts (top-2 with dropped tokens, normalised gates, top-1)

The makers (``layer_case``, ``inputs_case``, ``rnd``, ``nontrivial``, ``distinct``, ...) build cases for a
family of your own.
"""

from collections.abc import Callable, Iterable

from .dense import activations, convolution, loss, mlp, normalisation
from .make import F64, Case, distinct, distinct_case, inputs_case, layer_case, loss_case, nontrivial, rnd
from .mixture import mixture
from .rnn import recurrent, recurrent_case
from .sequence import TextbookAttention, attention, nontrivial_biases, unit_scale

Family = Callable[[], dict[str, list[Case]]]

FAMILIES: tuple[Family, ...] = (mlp, loss, normalisation, activations, convolution, attention, recurrent, mixture)


def collect(families: Iterable[Family] = FAMILIES) -> dict[str, list[Case]]:
    """The cases of ``families`` by command-line name; a name two families define is an error."""
    cases: dict[str, list[Case]] = {}
    for family in families:
        for key, runs in family().items():
            if key in cases:
                raise ValueError(f"gradcheck: two families define the case {key!r}")
            cases[key] = runs
    return cases


__all__ = [
    "FAMILIES",
    "Family",
    "Case",
    "collect",
    "mlp",
    "loss",
    "normalisation",
    "activations",
    "convolution",
    "attention",
    "recurrent",
    "mixture",
    "F64",
    "rnd",
    "layer_case",
    "loss_case",
    "inputs_case",
    "distinct_case",
    "recurrent_case",
    "nontrivial",
    "nontrivial_biases",
    "unit_scale",
    "distinct",
    "TextbookAttention",
]

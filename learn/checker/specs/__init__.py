"""What the checker knows about each exercise (inputs, autograd reference, known mistakes), by exercise name."""

from ...mistakes import GENERIC, Mistake
from ..accumulate_check import SPEC as ACCUMULATE
from ..split_check import LinearSplitSpec
from ..value_check import ValueSpec
from .activations import RELU, SIGMOID, TANH
from .attention import SPEC as ATTENTION
from .broadcast import SPEC as BROADCAST
from .conv2d import SPEC as CONV2D
from .dropout import SPEC as DROPOUT
from .embedding import SPEC as EMBEDDING
from .gelu import SPEC as GELU
from .gru_cell import SPEC as GRU_CELL
from .linear import SPEC as LINEAR
from .losses import MSE, SOFTMAX_CROSS_ENTROPY
from .lstm_cell import SPEC as LSTM_CELL
from .maxpool2d import SPEC as MAXPOOL2D
from .moe_dispatch import SPEC as MOE_DISPATCH
from .norms import BATCHNORM, LAYERNORM
from .optimizers import ADAM, RMSPROP, SGD
from .ring_attention import SPEC as RING_ATTENTION
from .tensor_parallel import SPEC as TENSOR_PARALLEL

SPECS = {
    s.name: s
    for s in (
        LINEAR,
        RELU,
        SIGMOID,
        TANH,
        GELU,
        MSE,
        SOFTMAX_CROSS_ENTROPY,
        BROADCAST,
        ACCUMULATE,
        ValueSpec(),
        DROPOUT,
        BATCHNORM,
        LAYERNORM,
        EMBEDDING,
        CONV2D,
        MAXPOOL2D,
        LSTM_CELL,
        GRU_CELL,
        ATTENTION,
        SGD,
        RMSPROP,
        ADAM,
        LinearSplitSpec(),
        TENSOR_PARALLEL,
        RING_ATTENTION,
        MOE_DISPATCH,
    )
}


def catalogue() -> list[tuple[str, Mistake]]:
    """Every known mistake as (exercise or "any layer", Mistake), the generic ones first."""
    entries = [("any layer", m) for m in GENERIC]
    for name, spec in SPECS.items():
        entries += [(name, m) for m in spec.mistakes]
    seen = set()  # one entry per mistake: a mistake replayed two ways (x < 0 and x <= 0) is listed once
    return [(where, m) for where, m in entries if (where, m.key) not in seen and not seen.add((where, m.key))]

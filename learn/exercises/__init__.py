"""The exercises, in the order a learner meets them: each one's name, the class to write and what it teaches."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Exercise:
    name: str  # what the commands take: python -m learn start NAME
    cls: str  # the class the learner writes
    teaches: str  # one line for `python -m learn list`

    @property
    def source(self) -> Path:
        """The single source: the worked solution, its answer inside ### BEGIN/END SOLUTION."""
        return Path(__file__).with_name(f"{self.name}.py")


EXERCISES = [
    Exercise("linear", "Linear", "the chain rule with matrices: a bias summed over the batch, gradients added "
             "with +="),
    Exercise("relu", "ReLU", "a gate: the gradient flows where the input was positive and stops elsewhere"),
    Exercise("sigmoid", "Sigmoid", "a local derivative read off the output: s (1 - s)"),
    Exercise("tanh", "Tanh", "the same from tanh's output: 1 - out^2"),
    Exercise("gelu", "GELU", "a product rule inside an activation: Phi(x) + x phi(x), and the tanh form's chain"),
    Exercise("mse", "MSELoss", "a loss: where the backward pass starts, and its 2 and its 1/N"),
    Exercise("softmax_cross_entropy", "SoftmaxCrossEntropy", "softmax and cross-entropy fused: (p - onehot) / N"),
    Exercise("broadcast", "ScaleShift", "the backward of broadcasting: each gradient summed back to its input's "
             "shape"),
    Exercise("accumulate", "Accumulate", "gradient accumulation and zero_grad: micro-batches add up, a second "
             "backward doubles"),
    Exercise("value", "Value", "the chain rule as an engine: a scalar autograd, topological order, a node used "
             "twice"),
    Exercise("dropout", "Dropout", "a random mask, kept for the backward: p dropped, the rest scaled by "
             "1/(1 - p)"),
    Exercise("batchnorm", "BatchNorm1d", "statistics that depend on the whole batch: three terms in dx"),
    Exercise("layernorm", "LayerNorm", "the same normalisation per row: which axis a gradient sums over"),
    Exercise("embedding", "Embedding", "a lookup's backward is a scatter-add: repeated ids add up"),
    Exercise("conv2d", "Conv2d", "weight sharing: a kernel's gradient sums over every position it touched"),
    Exercise("maxpool2d", "MaxPool2d", "routing: each gradient goes back to the input that won the max"),
    Exercise("lstm_cell", "LSTMCell", "gates and two states: dc flows through the forget gate, gates stacked "
             "i, f, g, o"),
    Exercise("gru_cell", "GRUCell", "three gates and one state: the reset gate inside the product, h reached "
             "three ways"),
    Exercise("attention", "CausalAttention", "softmax's Jacobian, the causal mask and the 1/sqrt(d) scale, both "
             "ways"),
    Exercise("sgd_momentum", "SGD", "an optimizer from .grad: a momentum buffer kept between steps, and "
             "Nesterov's look-ahead"),
    Exercise("rmsprop", "RMSprop", "a step divided by the gradient's running size: sqrt of an average of g^2"),
    Exercise("adam", "Adam", "an optimizer from .grad: moments, bias correction, eps outside the square root"),
    Exercise("linear_split", "Linear", "a backward split for a pipeline: B (dx, now), W (dW and db, later), "
             "bit for bit the fused one"),
    Exercise("tensor_parallel", "TensorParallelMLP", "an MLP split over ranks, Megatron's f and g: which pass "
             "all-reduces, and the bias added once"),
    Exercise("ring_attention", "RingAttention", "attention in blocks round a ring: partial softmaxes merged by "
             "their log-sum-exps, the backward from the merged one"),
    Exercise("moe_dispatch", "MoEDispatchCombine", "a mixture of experts' dispatch and combine: the gate's "
             "gradient, a token's k shares added, dropped tokens get none"),
]
BY_NAME = {e.name: e for e in EXERCISES}


def get(name: str) -> Exercise:
    """The exercise called ``name``; a KeyError that lists the names otherwise."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no exercise called {name!r}; the exercises are: {', '.join(BY_NAME)}") from None

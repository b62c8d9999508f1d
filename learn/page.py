"""The step-through page: the XOR network's forward and backward passes, node by node, in one HTML file.

``build_walk(seed)`` computes every number with handgrad's hand-written layers in float64 and lists the steps
that reveal them: the start, 5 forward steps (one per node), 9 backward steps (one per gradient) and one SGD
update that shows the loss fall.
``write_page(out, seed)`` embeds that walk as JSON in ``page_assets/page.html`` and inlines ``page.css`` and
``page.js`` beside it: one file, no network, no CDN.  The network, for the four XOR examples at once:

    z1 = x W1^T + b1      x (N, D), W1 (H, D), b1 (H,)  ->  z1 (N, H)      N = 4 examples, D = 2 inputs,
    h  = tanh(z1)                                       ->  h  (N, H)      H = 2 hidden units
    z2 = h W2^T + b2      W2 (1, H), b2 (1,)            ->  z2 (N, 1)
    y  = sigmoid(z2)                                    ->  y  (N, 1)
    loss = mean((y - t)^2)                              ->  loss ()        t (N, 1): the XOR targets

A number on the page is named by a *ref*, ``[tensor, kind, index]``: kind ``"value"`` (the forward's) or
``"grad"`` (dL/d tensor, the backward's), index ``"n,i"`` for a matrix, ``"i"`` for a vector, ``""`` for a
scalar.  The page writes each number as an element with those three as ``data-tensor``, ``data-kind``,
``data-index``.  Besides the network's tensors, the walk keeps the local derivatives the backward multiplies
by, as values: ``dloss_dy`` = 2(y - t)/N, ``dy_dz2`` = y(1 - y), ``dh_dz1`` = 1 - h^2.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import torch

from layers import Linear, Sigmoid, Tanh
from losses import MSELoss

from .page_predict import wrong_answers

ASSETS = Path(__file__).with_name("page_assets")
N, D, H = 4, 2, 2  # examples, inputs, hidden units
LR = 1.0  # the learning rate of the last step's SGD update
XOR_X = [[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]]  # (N, D): the four XOR inputs
XOR_T = [[0.0], [1.0], [1.0], [0.0]]  # (N, 1): their targets, x[n, 0] xor x[n, 1]

# The graph: each node with its caption, and the edges (input -> the node computed from it).
NODES = [
    {"id": "x", "caption": "x", "note": "inputs"},
    {"id": "t", "caption": "t", "note": "targets"},
    {"id": "W1", "caption": "W1", "note": "weights"},
    {"id": "b1", "caption": "b1", "note": "bias"},
    {"id": "W2", "caption": "W2", "note": "weights"},
    {"id": "b2", "caption": "b2", "note": "bias"},
    {"id": "z1", "caption": "z1 = x W1ᵀ + b1", "note": "linear"},
    {"id": "h", "caption": "h = tanh(z1)", "note": "hidden units"},
    {"id": "z2", "caption": "z2 = h W2ᵀ + b2", "note": "linear"},
    {"id": "y", "caption": "y = sigmoid(z2)", "note": "predictions"},
    {"id": "loss", "caption": "loss = mean((y − t)²)", "note": "mean squared error"},
]
EDGES = [
    ["x", "z1"],
    ["W1", "z1"],
    ["b1", "z1"],
    ["z1", "h"],
    ["h", "z2"],
    ["W2", "z2"],
    ["b2", "z2"],
    ["z2", "y"],
    ["y", "loss"],
    ["t", "loss"],
]


def _ref(tensor: str, kind: str, *index: int) -> list:
    """The name of one number on the page: [tensor, kind, "i,j"]."""
    return [tensor, kind, ",".join(map(str, index))]


def _label(tensor: str, kind: str, *index: int) -> str:
    """How the page writes a number's name: z1[2,0] for a value, dL/dz1[2,0] for a gradient."""
    name = f"dL/d{tensor}" if kind == "grad" else tensor
    return f"{name}[{','.join(map(str, index))}]" if index else name


def _entry(tensor: str, kind: str, index: tuple[int, ...], **how) -> dict:
    """One line of a step's arithmetic: the number it computes (``result``, a ref), its label, and how:
    ``terms`` (a sum of products of refs, less the products in ``minus``, if any), ``fn`` and ``arg`` (a function of
    one ref), or ``mse`` (pairs of refs (y, t), averaged as the loss averages them)."""
    return {"result": _ref(tensor, kind, *index), "label": _label(tensor, kind, *index), **how}


def _indices(shape) -> list[tuple[int, ...]]:
    """Every index of a tensor of ``shape``, row-major: (2, 2) -> (0, 0), (0, 1), (1, 0), (1, 1)."""
    return list(itertools.product(*map(range, shape)))


def _forward_steps() -> list[dict]:
    """The start and the 5 forward steps: each reveals one node's values and shows how each entry is computed."""
    start = {
        "phase": "start",
        "reveal": [["x", "value"], ["t", "value"], ["W1", "value"], ["b1", "value"], ["W2", "value"], ["b2", "value"]],
        "node": None,
        "edge": None,
        "formula": "",
        "text": "The data and the weights: the four XOR inputs x (one row per example) with their targets t, and "
        "the weights W1, b1, W2, b2, drawn at random as torch.nn.Linear draws them. Everything else is "
        "still to be computed. Next runs the forward pass node by node, then the backward pass: each gradient "
        "dL/d(tensor) arrives along an edge as downstream times local, the chain rule; then one update.",
        "entries": [],
    }
    steps = [
        (
            "z1",
            "z1 = x W1ᵀ + b1",
            "The first linear layer. Each hidden unit i weighs the two inputs of an example with its row of W1 and "
            "adds its bias: z1[n,i] = x[n,0] W1[i,0] + x[n,1] W1[i,1] + b1[i]. One row per example, one column per "
            "hidden unit.",
            [
                _entry(
                    "z1",
                    "value",
                    (n, i),
                    terms=[[_ref("x", "value", n, j), _ref("W1", "value", i, j)] for j in range(D)]
                    + [[_ref("b1", "value", i)]],
                )
                for n, i in _indices((N, H))
            ],
        ),
        (
            "h",
            "h = tanh(z1)",
            "The hidden units apply tanh to every entry of z1, squashing it into (−1, 1). This is what lets the "
            "network bend the line that a single linear layer would draw: XOR needs that.",
            [_entry("h", "value", (n, i), fn="tanh", arg=_ref("z1", "value", n, i)) for n, i in _indices((N, H))],
        ),
        (
            "z2",
            "z2 = h W2ᵀ + b2",
            "The second linear layer combines the two hidden units of each example into one number: "
            "z2[n,0] = h[n,0] W2[0,0] + h[n,1] W2[0,1] + b2[0].",
            [
                _entry(
                    "z2",
                    "value",
                    (n, 0),
                    terms=[[_ref("h", "value", n, j), _ref("W2", "value", 0, j)] for j in range(H)]
                    + [[_ref("b2", "value", 0)]],
                )
                for n in range(N)
            ],
        ),
        (
            "y",
            "y = sigmoid(z2)",
            "The sigmoid squashes z2 into (0, 1): y is the network's prediction for each example, to be compared "
            "with the target t.",
            [_entry("y", "value", (n, 0), fn="sigmoid", arg=_ref("z2", "value", n, 0)) for n in range(N)],
        ),
        (
            "loss",
            "loss = mean((y − t)²)",
            "The loss is the mean, over the four examples, of the squared difference between prediction and "
            "target: one number that says how wrong the network is. The forward pass is done; the backward pass "
            "will now find how the loss changes with every tensor before it.",
            [_entry("loss", "value", (), mse=[[_ref("y", "value", n, 0), _ref("t", "value", n, 0)] for n in range(N)])],
        ),
    ]
    return [start] + [
        {
            "phase": "forward",
            "number": k,
            "of": len(steps),
            "reveal": [[node, "value"]],
            "node": node,
            "edge": None,
            "formula": formula,
            "text": text,
            "entries": entries,
        }
        for k, (node, formula, text, entries) in enumerate(steps, 1)
    ]


def _backward_steps() -> list[dict]:
    """The 9 backward steps, in reverse topological order: each reveals one gradient as downstream x local."""
    steps = [
        (
            "loss",
            None,
            "dL/dL = 1",
            None,
            "The backward pass starts at the loss: the gradient of the loss with respect to itself is 1. "
            "Every gradient below is this 1 carried back through the graph, one edge at a time.",
            [_entry("loss", "grad", (), terms=[])],
        ),
        (
            "y",
            ["y", "loss"],
            "dL/dy = dL/dL × 2(y − t)/4",
            ["dL/dL (downstream)", "2(y − t)/4 (local)"],
            "The gradient of the loss with respect to y is the downstream gradient dL/dL = 1 times the local "
            "derivative of the mean squared error, 2(y − t)/4: the 2 from the square, the 4 from the mean over the "
            "four examples.",
            [
                _entry("y", "grad", (n, 0), terms=[[_ref("loss", "grad"), _ref("dloss_dy", "value", n, 0)]])
                for n in range(N)
            ],
        ),
        (
            "z2",
            ["z2", "y"],
            "dL/dz2 = dL/dy × y(1 − y)",
            ["dL/dy (downstream)", "y(1 − y) (local)"],
            "The gradient of the loss with respect to z2 is the downstream gradient dL/dy times the local "
            "derivative of the sigmoid, y(1 − y), written with the sigmoid's output y, which the forward kept.",
            [
                _entry("z2", "grad", (n, 0), terms=[[_ref("y", "grad", n, 0), _ref("dy_dz2", "value", n, 0)]])
                for n in range(N)
            ],
        ),
        (
            "W2",
            ["W2", "z2"],
            "dL/dW2 = dL/dz2ᵀ h",
            None,
            "The gradient of the loss with respect to W2: in example n, z2 changes with W2[0,j] at the rate h[n,j] "
            "(the local derivative), so that example contributes dL/dz2[n,0] × h[n,j]. The same W2 serves all four "
            "examples, so the four contributions add up: dL/dW2 = dL/dz2ᵀ h.",
            [
                _entry(
                    "W2", "grad", (0, j), terms=[[_ref("z2", "grad", n, 0), _ref("h", "value", n, j)] for n in range(N)]
                )
                for j in range(H)
            ],
        ),
        (
            "b2",
            ["b2", "z2"],
            "dL/db2 = Σₙ dL/dz2",
            None,
            "b2 is added to every example's z2 with local derivative 1, so its gradient is dL/dz2 summed over the "
            "four examples: a sum, not a mean (the 1/4 of the mean is already inside dL/dy).",
            [_entry("b2", "grad", (0,), terms=[[_ref("z2", "grad", n, 0)] for n in range(N)])],
        ),
        (
            "h",
            ["h", "z2"],
            "dL/dh = dL/dz2 W2",
            ["dL/dz2 (downstream)", "W2 (local)"],
            "The gradient flows on to the hidden units: z2[n,0] changes with h[n,j] at the rate W2[0,j], so the "
            "gradient of the loss with respect to h is the downstream gradient dL/dz2 times the weight W2[0,j].",
            [
                _entry("h", "grad", (n, j), terms=[[_ref("z2", "grad", n, 0), _ref("W2", "value", 0, j)]])
                for n, j in _indices((N, H))
            ],
        ),
        (
            "z1",
            ["z1", "h"],
            "dL/dz1 = dL/dh × (1 − h²)",
            ["dL/dh (downstream)", "1 − h² (local)"],
            "Through the tanh: the gradient of the loss with respect to z1 is the downstream gradient dL/dh times "
            "the local derivative of tanh, 1 − h², written with tanh's output h, which the forward kept.",
            [
                _entry("z1", "grad", (n, i), terms=[[_ref("h", "grad", n, i), _ref("dh_dz1", "value", n, i)]])
                for n, i in _indices((N, H))
            ],
        ),
        (
            "W1",
            ["W1", "z1"],
            "dL/dW1 = dL/dz1ᵀ x",
            None,
            "The gradient of the loss with respect to W1, as for W2: each example contributes dL/dz1[n,i] × x[n,j] "
            "and the four contributions add up. Where an input x[n,j] is 0, that example's term vanishes: "
            "a weight from an input that is off does not move the loss.",
            [
                _entry(
                    "W1", "grad", (i, j), terms=[[_ref("z1", "grad", n, i), _ref("x", "value", n, j)] for n in range(N)]
                )
                for i, j in _indices((H, D))
            ],
        ),
        (
            "b1",
            ["b1", "z1"],
            "dL/db1 = Σₙ dL/dz1",
            None,
            "The gradient of the loss with respect to b1: dL/dz1 summed over the examples, as for b2. Every weight "
            "now has its gradient (x and t are data: they need none), and the backward pass ends. Next: what the "
            "gradients are for.",
            [_entry("b1", "grad", (i,), terms=[[_ref("z1", "grad", n, i)] for n in range(N)]) for i in range(H)],
        ),
    ]
    return [
        {
            "phase": "backward",
            "number": k,
            "of": len(steps),
            "reveal": [[node, "grad"]],
            "node": node,
            "edge": edge,
            "formula": formula,
            "columns": columns,
            "text": text,
            "entries": entries,
            "ask": entries[0]["result"],
        }
        for k, (node, edge, formula, columns, text, entries) in enumerate(steps, 1)
    ]


# The exercise each step belongs to (python -m learn start NAME writes it), by the tensor the step reveals.
EXERCISE = {
    ("forward", "z1"): "linear",
    ("forward", "h"): "tanh",
    ("forward", "z2"): "linear",
    ("forward", "y"): "sigmoid",
    ("forward", "loss"): "mse",
    ("backward", "loss"): "mse",
    ("backward", "y"): "mse",
    ("backward", "z2"): "sigmoid",
    ("backward", "W2"): "linear",
    ("backward", "b2"): "linear",
    ("backward", "h"): "linear",
    ("backward", "z1"): "tanh",
    ("backward", "W1"): "linear",
    ("backward", "b1"): "linear",
    ("update", None): "sgd_momentum",  # plain SGD: the optimizer exercise closest to it
}
PARAMS = [("W1", (H, D)), ("b1", (H,)), ("W2", (1, H)), ("b2", (1,))]


def _update_step() -> dict:
    """The last step: one SGD update of every weight, W' = W − lr dL/dW, and the loss of the new weights."""
    entries = []
    for name, shape in PARAMS:
        for index in _indices(shape):
            e = _entry(
                f"{name}_new",
                "value",
                index,
                terms=[[_ref(name, "value", *index)]],
                minus=[[_ref("lr", "value"), _ref(name, "grad", *index)]],
            )
            e["label"] = f"{name}′[{','.join(map(str, index))}]"
            entries.append(e)
    loss_new = _entry(
        "loss_new", "value", (), mse=[[_ref("y_new", "value", n, 0), _ref("t", "value", n, 0)] for n in range(N)]
    )
    change = _entry("loss_change", "value", (), terms=[[_ref("loss_new", "value")]], minus=[[_ref("loss", "value")]])
    loss_new["label"], change["label"] = "loss′", "loss′ − loss"
    return {
        "phase": "update",
        "reveal": [[f"{name}_new", "value"] for name, _ in PARAMS] + [["loss_new", "value"], ["loss_change", "value"]],
        "node": None,
        "edge": None,
        "formula": "W′ = W − lr × dL/dW",
        "entries": [*entries, loss_new, change],
        "text": f"What the gradients are for: one step of gradient descent moves every weight a little "
        f"against its gradient, with the learning rate lr = {LR:g} here. The forward pass, run again "
        f"with the new weights W1′, b1′, W2′, b2′ (y′ is its prediction), gives a smaller loss: the "
        f"gradient said which way is down. Training is this, repeated.",
    }


def _update(fc1: Linear, fc2: Linear, x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
    """One SGD step from the layers' weights and gradients, and the forward pass again with the new weights."""
    new = {
        f"{name}_new": p.detach() - LR * p.grad
        for name, p in (("W1", fc1.weight), ("b1", fc1.bias), ("W2", fc2.weight), ("b2", fc2.bias))
    }
    again1, again2 = Linear(D, H, dtype=x.dtype), Linear(H, 1, dtype=x.dtype)
    again1.load_state_dict({"weight": new["W1_new"], "bias": new["b1_new"]})
    again2.load_state_dict({"weight": new["W2_new"], "bias": new["b2_new"]})
    y_new = Sigmoid().forward(again2.forward(Tanh().forward(again1.forward(x))))
    loss_new = MSELoss().forward(y_new, t)
    return {**new, "y_new": y_new, "loss_new": loss_new, "lr": torch.tensor(LR, dtype=x.dtype)}


def build_walk(seed: int = 0) -> dict:
    """Every number the page shows, computed by handgrad in float64, and the steps that reveal them.

    -> {"seed", "tensors": {name: {"shape", "value", "grad" (where the backward computes one)}} as nested
    lists of floats, "nodes", "edges", "steps"}.  Each step names the node it reveals (``reveal``: [tensor,
    kind] pairs), the edge its gradient flows along, its formula, its explanation in plain words, and
    ``entries``: the arithmetic behind every number it reveals, as refs (see the module's docstring).
    """
    f64 = torch.float64
    torch.manual_seed(seed)
    fc1 = Linear(D, H, dtype=f64)  # W1 (H, D), b1 (H,): drawn exactly as nn.Linear(D, H) draws them
    fc2 = Linear(H, 1, dtype=f64)  # W2 (1, H), b2 (1,)
    tanh, sigmoid, mse = Tanh(), Sigmoid(), MSELoss()
    x = torch.tensor(XOR_X, dtype=f64)  # (N, D)
    t = torch.tensor(XOR_T, dtype=f64)  # (N, 1)

    z1 = fc1.forward(x)  # (N, H)
    h = tanh.forward(z1)  # (N, H)
    z2 = fc2.forward(h)  # (N, 1)
    y = sigmoid.forward(z2)  # (N, 1)
    loss = mse.forward(y, t)  # ()

    # The backward, by hand: each layer turns dL/d(its output) into dL/d(its input).
    dloss = torch.ones((), dtype=f64)  # dL/dL
    dy = mse.backward(dloss)  # (N, 1)
    dz2 = sigmoid.backward(dy)  # (N, 1)
    dh = fc2.backward(dz2)  # (N, H); adds dL/dW2 (1, H) and dL/db2 (1,) into fc2.weight.grad, fc2.bias.grad
    dz1 = tanh.backward(dh)  # (N, H)
    fc1.backward(dz1, need_input_grad=False)  # dL/dW1 (H, D), dL/db1 (H,); x is data, it needs no gradient

    # The local derivatives the backward multiplied by, for the page to show (the layers' own formulas).
    values = {
        "x": x,
        "t": t,
        "W1": fc1.weight.detach(),
        "b1": fc1.bias.detach(),
        "W2": fc2.weight.detach(),
        "b2": fc2.bias.detach(),  # (the numbers, apart from the parameters, which require a gradient)
        "z1": z1,
        "h": h,
        "z2": z2,
        "y": y,
        "loss": loss,
        "dloss_dy": 2 * (y - t) / N,
        "dy_dz2": y * (1 - y),
        "dh_dz1": 1 - h * h,
    }
    grads = {
        "loss": dloss,
        "y": dy,
        "z2": dz2,
        "W2": fc2.weight.grad,
        "b2": fc2.bias.grad,
        "h": dh,
        "z1": dz1,
        "W1": fc1.weight.grad,
        "b1": fc1.bias.grad,
    }
    values |= _update(fc1, fc2, x, t)
    values["loss_change"] = values["loss_new"] - loss
    tensors = {
        name: {"shape": list(v.shape), "value": v.tolist(), **({"grad": grads[name].tolist()} if name in grads else {})}
        for name, v in values.items()
    }
    steps = _forward_steps() + _backward_steps() + [_update_step()]
    wrong = wrong_answers(values, grads)
    for s in steps:
        s["exercise"] = EXERCISE.get((s["phase"], s["node"]))
        if s["phase"] == "backward":
            s["mistakes"] = wrong[s["node"]]
    return {"seed": seed, "tensors": tensors, "nodes": NODES, "edges": EDGES, "steps": steps, "lr": LR}


def write_page(out: Path, seed: int = 0) -> Path:
    """Write the step-through page for ``seed`` to ``out`` (its folder created if need be) -> ``out``."""
    out = Path(out)
    html = (ASSETS / "page.html").read_text(encoding="utf-8")
    data = json.dumps(build_walk(seed), ensure_ascii=False).replace("</", "<\\/")  # safe inside <script>
    for slot, text in (
        ("@@CSS@@", (ASSETS / "page.css").read_text(encoding="utf-8")),
        ("@@JS@@", (ASSETS / "page.js").read_text(encoding="utf-8")),
        ("@@SEED@@", str(seed)),
        ("@@WALK@@", data),
    ):  # last: nothing is looked for inside the data
        assert html.count(slot) >= 1, f"page.html lost its {slot} slot"
        html = html.replace(slot, text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    return out

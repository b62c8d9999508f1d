"""The hand-written step under torch.compile: one graph, the eager step's numbers, the guards kept.

Most cases compile with the "aot_eager" backend: TorchDynamo's trace and AOTAutograd's functionalization -- what
decides whether the step is one graph and where the in-place check runs -- without Inductor's code generation,
which takes tens of seconds a model on this machine.  A few cases compile with Inductor, the default backend, for
real: the small Net with SGD and Adam, and the LSTM language model (whose products once failed in Inductor's
lowering).  Every case runs the step ten times in float64, eagerly and compiled from the same weights, and holds
the weights to 1e-10.
"""

from __future__ import annotations

import sys

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import optimizers
from kernels.recurrent import graph as bptt_graph
from layers import (
    GRU,
    LSTM,
    RNN,
    BatchNorm2d,
    Conv2d,
    Dropout,
    Flatten,
    GRUCell,
    Linear,
    LSTMCell,
    MaxPool2d,
    ReLU,
    RNNCell,
    Sequential,
)
from layers.saved import MESSAGE_IN_GRAPH
from losses import CrossEntropyLoss
from models import GPT, Net, RecurrentLM

OPTIMIZERS = {
    "sgd": lambda p: optimizers.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda p: optimizers.Adam(p, lr=1e-3, amsgrad=True),
    "adamw": lambda p: optimizers.AdamW(p, lr=1e-3),
    "rmsprop": lambda p: optimizers.RMSprop(p, lr=1e-3, momentum=0.5, centered=True),
    # eps 1e-6: Adagrad's first step is lr * g / (|g| + eps), whose value swings with the last bits of a gradient
    # near zero (a 1e-17 difference in g = 1e-10 moves it 1e-9 with eps 1e-10): ill-conditioned, not wrong
    "adagrad": lambda p: optimizers.Adagrad(p, lr=1e-2, lr_decay=0.01, eps=1e-6),
}


def _model(name: str):
    """(model, forward(crit) -> loss, backward(crit)) on fixed data, float64, small enough to compile quickly."""
    torch.manual_seed(0)
    kw = {"dtype": torch.float64}
    if name == "net":
        m = Net(hidden_size=16, dtype=torch.float64)
        x, y = torch.randn(8, 1, 28, 28, **kw), torch.randint(0, 10, (8,))
        return m, lambda crit: crit(m(x), y), lambda crit: m.backward(crit.backward())
    if name == "cnn":  # the CNN's kinds of layer, dropout included, on 8x8 images
        m = Sequential(
            Conv2d(1, 4, 3, padding=1, bias=False, **kw),
            BatchNorm2d(4, **kw),
            ReLU(),
            MaxPool2d(2),
            Flatten(),
            Dropout(0.3),
            Linear(64, 10, **kw),
        )
        x, y = torch.randn(6, 1, 8, 8, **kw), torch.randint(0, 10, (6,))
        return m, lambda crit: crit(m(x), y), lambda crit: m.backward(crit.backward())
    V, N, T = 11, 3, 6
    idx, y = torch.randint(0, V, (N, T)), torch.randint(0, V, (N, T))
    if name == "gpt":
        m = GPT(vocab_size=V, block_size=T, n_layer=1, n_head=2, n_embd=8, dtype=torch.float64)
        return (
            m,
            lambda crit: crit(m(idx).view(-1, V), y.view(-1)),
            lambda crit: m.backward(crit.backward().view(N, T, V)),
        )
    if name == "lstm":
        m = RecurrentLM(V, 4, 8, num_layers=2, cell="lstm")
        m.to(dtype=torch.float64)
        return (
            m,
            lambda crit: crit(m(idx)[0].reshape(-1, V), y.view(-1)),
            lambda crit: m.backward(crit.backward().view(N, T, V)),
        )
    raise ValueError(name)


def _step(forward, backward, opt):
    """The README's step: zero_grad, forward and loss, backward, optimizer step."""
    crit = CrossEntropyLoss()

    def step():
        opt.zero_grad()
        loss = forward(crit)
        backward(crit)
        opt.step()
        return loss

    return step


def _run(name: str, opt_name: str, backend: str | None, steps: int = 10, eager_first: int = 0):
    """The weights after ``steps`` steps, eagerly (backend None) or compiled with fullgraph=True after
    ``eager_first`` eager steps; and the number of graphs the compiler made."""
    model, forward, backward = _model(name)
    step = _step(forward, backward, OPTIMIZERS[opt_name](model.parameters()))
    torch._dynamo.reset()
    counters.clear()
    compiled = step if backend is None else torch.compile(step, fullgraph=True, backend=backend)
    torch.manual_seed(1)  # dropout's masks: eager and aot_eager draw them alike
    for i in range(steps):
        (step if i < eager_first else compiled)()
    return [p.detach().clone() for p in model.parameters()], counters["stats"]["unique_graphs"]


def _assert_close(got: list, expected: list, tol: float = 1e-10) -> None:
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        err = ((a - b).abs().max() / b.abs().max().clamp_min(1.0)).item()
        assert err <= tol, f"parameter {i} (shape {tuple(b.shape)}): {err:.2e} from the eager step"


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
@pytest.mark.parametrize("name", ["net", "cnn", "gpt", "lstm"])
def test_step_compiles_as_one_graph_equal_to_eager(name, opt_name):
    """The first step eager (it creates the optimizer's state: compiling it too is the Inductor cases' part, a
    second graph), the nine after it one graph (fullgraph=True raises at any graph break)."""
    eager, _ = _run(name, opt_name, None)
    compiled, graphs = _run(name, opt_name, "aot_eager", eager_first=1)
    assert graphs == 1, graphs
    _assert_close(compiled, eager)


def test_explain_finds_no_graph_break():
    model, forward, backward = _model("net")
    step = _step(forward, backward, optimizers.SGD(model.parameters(), lr=0.1, momentum=0.9))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(step)()
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


@pytest.mark.parametrize("name,opt_name", [("net", "sgd"), ("net", "adam"), ("lstm", "adamw")])
def test_step_compiled_by_inductor_equals_eager(name, opt_name):
    eager, _ = _run(name, opt_name, None)
    compiled, graphs = _run(name, opt_name, "inductor")
    assert 1 <= graphs <= 2, graphs
    _assert_close(compiled, eager)


# -- the in-place check (layers/saved.py) under compile -------------------------------------------------------


def _linear_step(change_between: bool):
    torch.manual_seed(0)
    layer = Linear(4, 3, dtype=torch.float64)

    def step(x):
        out = layer(x)
        if change_between:
            x.mul_(10)  # torch.autograd refuses this: dW would come from the changed x
        return layer.backward(torch.ones_like(out))

    return layer, step


def test_in_place_change_inside_the_compiled_step_is_refused():
    _, step = _linear_step(change_between=True)
    torch._dynamo.reset()
    words = (
        r"Linear: its input x was modified in place after the forward, before backward, in the compiled step"
        if MESSAGE_IN_GRAPH
        else r"Runtime assertion failed"
    )  # an older torch refuses without the words
    with pytest.raises(Exception, match=words):
        torch.compile(step, fullgraph=True, backend="aot_eager")(torch.randn(2, 4, dtype=torch.float64))


def test_unchanged_inputs_compile_without_a_false_alarm():
    layer, step = _linear_step(change_between=False)
    torch._dynamo.reset()
    x = torch.randn(2, 4, dtype=torch.float64)
    x.add_(1)  # an input whose version is not 0 when the step starts
    with torch.no_grad():  # the weight requires a gradient, as nn.Parameter's
        layer.weight.mul_(1.0)  # and a weight changed before the forward (an earlier optimizer step)
    dx = torch.compile(step, fullgraph=True, backend="aot_eager")(x)
    torch.testing.assert_close(dx, torch.ones(2, 3, dtype=torch.float64) @ layer.weight, rtol=0, atol=0)


def test_forward_eager_backward_compiled_checks_the_real_versions():
    """Recorded eagerly, compared where the backward is compiled: the comparison runs eagerly (a graph break)."""
    torch.manual_seed(0)
    layer = Linear(4, 3, dtype=torch.float64)
    backward = torch.compile(lambda d: layer.backward(d), backend="aot_eager")
    x = torch.randn(2, 4, dtype=torch.float64)
    torch._dynamo.reset()
    out = layer(x)
    dx = backward(torch.ones_like(out))  # nothing changed: no false alarm
    torch.testing.assert_close(dx, torch.ones(2, 3, dtype=torch.float64) @ layer.weight)
    out = layer(x)
    x.mul_(10)
    with pytest.raises(RuntimeError, match="its input x was modified in place after the forward"):
        backward(torch.ones_like(out))


def test_forward_compiled_backward_eager_warns_that_it_cannot_compare(monkeypatch):
    torch.manual_seed(0)
    layer = Linear(4, 3, dtype=torch.float64)
    monkeypatch.setattr(sys.modules["layers.saved"], "_warned", False)
    forward = torch.compile(lambda x: layer(x), backend="aot_eager")
    torch._dynamo.reset()
    x = torch.randn(2, 4, dtype=torch.float64)
    out = forward(x)
    with pytest.warns(RuntimeWarning, match="forward ran in a compiled graph and its backward outside it"):
        dx = layer.backward(torch.ones_like(out))
    torch.testing.assert_close(dx, torch.ones(2, 3, dtype=torch.float64) @ layer.weight)


def test_target_out_of_range_is_refused_in_the_compiled_step():
    model, _, _ = _model("net")
    crit = CrossEntropyLoss()
    x = torch.randn(4, 1, 28, 28, dtype=torch.float64)
    torch._dynamo.reset()
    loss = torch.compile(lambda y: crit(model(x), y), fullgraph=True, backend="aot_eager")
    loss(torch.tensor([0, 1, 2, 9]))  # in range
    with pytest.raises(RuntimeError, match=r"target contains a class outside \[0, 9\] for 10 classes"):
        loss(torch.tensor([0, 1, 2, 10]))


# -- kernels/recurrent/graph.py, the compiler's BPTT, against bptt.py (eager, no compiler) -------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: LSTM(4, 6, 2, bidirectional=True),
        lambda: LSTM(4, 6, 1, proj_size=3, bidirectional=True),
        lambda: GRU(4, 6, 2, bidirectional=True),
        lambda: RNN(4, 6, 2, nonlinearity="relu", bidirectional=True),
        lambda: RNN(4, 6, 1, bias=False),
        lambda: LSTMCell(4, 6),
        lambda: GRUCell(4, 6),
        lambda: RNNCell(4, 6),
    ],
    ids=["lstm", "lstm-proj", "gru", "rnn-relu", "rnn-nobias", "lstm-cell", "gru-cell", "rnn-cell"],
)
def test_bptt_graph_equals_bptt(make, monkeypatch):
    torch.manual_seed(0)
    x = torch.randn(5, 3, 4, dtype=torch.float64)
    results = []
    for graph in (False, True):
        torch.manual_seed(1)
        layer = make()
        layer.to(dtype=torch.float64)
        if graph:  # the forward takes the compiler's path without a compiler; the backward follows its cache
            monkeypatch.setattr(bptt_graph, "for_forward", lambda: bptt_graph)
        cell = "Cell" in type(layer).__name__
        inp = x[0] if cell else x
        state = (
            (torch.randn(3, 6, dtype=torch.float64),) * 2
            if isinstance(layer, LSTMCell)
            else torch.randn(3, 6, dtype=torch.float64)
            if cell
            else None
        )
        out = layer(inp, state) if cell else layer(inp)[0]  # a sequence layer: its output y (T, N, D*H)
        outs = out if isinstance(out, tuple) else (out,)  # LSTMCell: (h', c')
        g = [torch.linspace(-1, 1, t.numel(), dtype=torch.float64).view_as(t) for t in outs]
        grads = layer.backward(*g) if isinstance(layer, LSTMCell) else layer.backward(g[0])
        flat = [t for t in (grads if isinstance(grads, tuple) else (grads,)) if isinstance(t, torch.Tensor)]
        results.append([*outs, *flat, *(p.grad for p in layer.parameters())])
    assert len(results[0]) == len(results[1])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-13)


# -- train.py --compile ------------------------------------------------------------------------------------------


def test_train_compile_agrees_with_the_twin_and_reports_compile_time_apart(tiny, tmp_path, capsys):
    import json

    import train

    out = tmp_path / "run"
    with pytest.warns(UserWarning, match="not the official"):  # the tiny .gz files are not MNIST's
        code = train.main(
            [
                str(a)
                for a in (
                    "--data-dir",
                    tiny,
                    "--out",
                    out,
                    "--epochs",
                    "2",
                    "--dtype",
                    "float64",
                    "--hidden",
                    "16",
                    "--batch-size",
                    "64",
                    "--compile",
                    "--no-plots",
                )
            ]
        )
    assert code == 0
    printed = capsys.readouterr().out
    assert "s compiling)" in printed.splitlines()[1]  # epoch 1 of the hand-written step: compile time apart
    summary = json.loads((out / "summary.json").read_text())
    assert summary["max_param_abs_diff"] < 1e-12
    rounds = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first = [r for r in rounds if r["type"] == "epoch" and r["epoch"] == 1 and r["impl"] == "manual"]
    assert first and first[0]["compile_seconds"] > 0


@pytest.mark.parametrize(
    "argv,says",
    [
        (["--monitor"], "--monitor reads statistics back"),
        (["--cuda-graph"], "use one or the other"),
        (["--dtype", "bfloat16"], "mixed-precision step has not been made compilable"),
    ],
)
def test_train_compile_refuses_what_it_cannot_compile(tiny, tmp_path, capsys, argv, says):
    import train

    code = train.main(
        [
            str(a)
            for a in ("--data-dir", tiny, "--out", tmp_path / "r", "--epochs", "1", "--compile", "--no-plots", *argv)
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "--compile: cannot compile this run's step" in err and says in err

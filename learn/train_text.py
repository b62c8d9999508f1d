"""``learn train`` for embedding, lstm_cell, gru_cell and attention: a tiny character model on the shipped Shakespeare.

Each model predicts the next character of windows of the corpus (``training/tasks/corpora/shakespeare``); the
learner's layer sits in it beside handgrad's, every other layer handgrad's on both sides, from the same weights,
on the same windows, with the same SGD steps:

    embedding   idx (N, T) -> Embedding (V, D) [yours] -> Linear D -> V -> cross-entropy of the next character
    lstm_cell   idx -> Embedding (V, I) -> T steps of LSTMCell(I, H) [yours, one instance per step, the
                parameters shared, so their gradients add up over the steps] -> Linear H -> V at every step
    gru_cell    the same with GRUCell(I, H) [yours]
    attention   idx -> Embedding (V, D) -> q, k, v = three Linear D -> d -> CausalAttention [yours] -> Linear d -> V

The shapes differ from the checker's (longer sequences, wider layers, ids repeated many times in a batch).
"""

from __future__ import annotations

from pathlib import Path

import torch

import layers
from losses import CrossEntropyLoss

from .checker.guard import LearnerFailed, call
from .race import Race

F64 = torch.float64
CORPUS = Path(__file__).resolve().parents[1] / "training" / "tasks" / "corpora" / "shakespeare" / "tragedies.txt"
N, T = 8, 12  # windows per batch, characters per window
LR = 0.5
SIZES = {
    "embedding": dict(D=16),
    "lstm_cell": dict(I=10, H=16),
    "gru_cell": dict(I=10, H=16),
    "attention": dict(D=16, d=8),
}


def corpus(chars: int = 60_000) -> tuple[torch.Tensor, int, str]:
    """The first ``chars`` characters of the corpus as ids (chars,), the vocabulary's size, a line saying so."""
    if not CORPUS.is_file():
        raise LearnerFailed(f"the Shakespeare corpus is not in this copy of handgrad ({CORPUS} is missing)")
    text = CORPUS.read_text(encoding="utf-8")
    vocab = sorted(set(text))  # the whole corpus's characters, so that every window's are in it
    index = {ch: i for i, ch in enumerate(vocab)}
    ids = torch.tensor([index[ch] for ch in text[:chars]])
    return ids, len(vocab), f"Shakespeare ({CORPUS.name}), its first {chars:,} characters, {len(vocab)} symbols"


def _sgd(params, who: str) -> None:
    for p in params:
        if p.grad is None:
            raise LearnerFailed(
                f"a parameter of shape {tuple(p.shape)} of {who} has no .grad after backward: the "
                f"backward must add its gradient into .grad"
            )
        with torch.no_grad():
            p -= LR * p.grad
        p.grad = None


def _adopt(layer, twin, names, shown: str) -> list[torch.Tensor]:
    """Give the learner's ``layer`` the twin's initial values -> its parameters, in ``names``' order."""
    out = []
    for name in names:
        p, tp = getattr(layer, name, None), getattr(twin, name)
        if not isinstance(p, torch.Tensor) or p.shape != tp.shape or p.dtype != F64:
            raise LearnerFailed(f"your {shown} has no float64 {name} of shape {tuple(tp.shape)}")
        with torch.no_grad():
            p.copy_(tp)
        out.append(p)
    return out


class _Side:
    """One of the two models: the learner's or the twin.  ``forward_backward(idx, target)`` -> the loss."""

    def __init__(self, params, forward_backward):
        self.params, self.forward_backward = params, forward_backward


def _head_loss(head, crit, feats: torch.Tensor, target: torch.Tensor) -> tuple[float, torch.Tensor]:
    """Linear head and cross-entropy over every position: feats (N, T, F) -> (loss, dfeats (N, T, F))."""
    n, t, f = feats.shape
    loss = crit.forward(head.forward(feats.reshape(n * t, f)), target.reshape(-1))
    return float(loss), head.backward(crit.backward()).reshape(n, t, f)


def _embedding(cls, V, where):
    D = SIZES["embedding"]["D"]
    sides = []
    emb0, head0 = layers.Embedding(V, D, dtype=F64), layers.Linear(D, V, dtype=F64)
    for yours in (True, False):
        head = layers.Linear(D, V, dtype=F64)
        head.load_state_dict(head0.state_dict())
        if yours:
            emb = call(f"{cls.__name__}({V}, {D})", lambda: cls(V, D), where=where)
            params = _adopt(emb, emb0, ["weight"], f"{cls.__name__}({V}, {D})")
        else:
            emb = layers.Embedding(V, D, dtype=F64)
            emb.load_state_dict(emb0.state_dict())
            params = [emb.weight]
        crit = CrossEntropyLoss()

        def fb(idx, target, emb=emb, head=head, crit=crit):
            loss, dfeats = _head_loss(head, crit, emb.forward(idx), target)
            emb.backward(dfeats)
            return loss

        sides.append(_Side(params + list(head.parameters()), fb))
    return sides, f"Embedding({V}, {D}) [yours] -> Linear({D}, {V}) -> cross-entropy of the next character"


def _lstm_cell(cls, V, where):
    I, H = SIZES["lstm_cell"]["I"], SIZES["lstm_cell"]["H"]
    names = ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]
    emb0, cell0, head0 = (
        layers.Embedding(V, I, dtype=F64),
        layers.LSTMCell(I, H, dtype=F64),
        layers.Linear(H, V, dtype=F64),
    )
    sides = []
    for yours in (True, False):
        emb, head = layers.Embedding(V, I, dtype=F64), layers.Linear(H, V, dtype=F64)
        emb.load_state_dict(emb0.state_dict())
        head.load_state_dict(head0.state_dict())
        if yours:
            shown = f"{cls.__name__}({I}, {H})"
            cells = [call(shown, lambda: cls(I, H), where=where) for _ in range(T)]
            shared = _adopt(cells[0], cell0, names, shown)
        else:
            cells = [layers.LSTMCell(I, H, dtype=F64) for _ in range(T)]
            cells[0].load_state_dict(cell0.state_dict())
            shared = [getattr(cells[0], n) for n in names]
        for cell in cells[1:]:  # one instance per step (each keeps its own cache), the same parameter tensors
            for name, p in zip(names, shared, strict=True):
                setattr(cell, name, p)
        crit = CrossEntropyLoss()

        def fb(idx, target, emb=emb, head=head, crit=crit, cells=cells, yours=yours):
            x = emb.forward(idx)  # (N, T, I)
            h = c = torch.zeros(N, H, dtype=F64)
            hs = []
            for t in range(T):
                h, c = cells[t].forward(x[:, t], (h, c))
                hs.append(h)
            loss, dhs = _head_loss(head, crit, torch.stack(hs, 1), target)  # dhs (N, T, H)
            dh_next = dc_next = torch.zeros(N, H, dtype=F64)
            dxs = [None] * T
            for t in reversed(range(T)):  # h_t feeds the head and the next step: both gradients add up
                out = cells[t].backward(dhs[:, t] + dh_next, dc_next)
                dxs[t], (dh_next, dc_next) = (out[0], out[1:]) if yours else (out[0], out[1])
            emb.backward(torch.stack(dxs, 1))
            return loss

        sides.append(_Side(shared + list(emb.parameters()) + list(head.parameters()), fb))
    return sides, (
        f"Embedding({V}, {I}) -> {T} steps of LSTMCell({I}, {H}) [yours, its parameters shared by the "
        f"steps] -> Linear({H}, {V}) at each step -> cross-entropy"
    )


def _gru_cell(cls, V, where):
    I, H = SIZES["gru_cell"]["I"], SIZES["gru_cell"]["H"]
    names = ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]
    emb0, cell0, head0 = (
        layers.Embedding(V, I, dtype=F64),
        layers.GRUCell(I, H, dtype=F64),
        layers.Linear(H, V, dtype=F64),
    )
    sides = []
    for yours in (True, False):
        emb, head = layers.Embedding(V, I, dtype=F64), layers.Linear(H, V, dtype=F64)
        emb.load_state_dict(emb0.state_dict())
        head.load_state_dict(head0.state_dict())
        if yours:
            shown = f"{cls.__name__}({I}, {H})"
            cells = [call(shown, lambda: cls(I, H), where=where) for _ in range(T)]
            shared = _adopt(cells[0], cell0, names, shown)
        else:
            cells = [layers.GRUCell(I, H, dtype=F64) for _ in range(T)]
            cells[0].load_state_dict(cell0.state_dict())
            shared = [getattr(cells[0], n) for n in names]
        for cell in cells[1:]:  # one instance per step (each keeps its own cache), the same parameter tensors
            for name, p in zip(names, shared, strict=True):
                setattr(cell, name, p)
        crit = CrossEntropyLoss()

        def fb(idx, target, emb=emb, head=head, crit=crit, cells=cells):
            x = emb.forward(idx)  # (N, T, I)
            h = torch.zeros(N, H, dtype=F64)
            hs = []
            for t in range(T):
                h = cells[t].forward(x[:, t], h)
                hs.append(h)
            loss, dhs = _head_loss(head, crit, torch.stack(hs, 1), target)  # dhs (N, T, H)
            dh_next = torch.zeros(N, H, dtype=F64)
            dxs = [None] * T
            for t in reversed(range(T)):  # h_t feeds the head and the next step: both gradients add up
                dxs[t], dh_next = cells[t].backward(dhs[:, t] + dh_next)
            emb.backward(torch.stack(dxs, 1))
            return loss

        sides.append(_Side(shared + list(emb.parameters()) + list(head.parameters()), fb))
    return sides, (
        f"Embedding({V}, {I}) -> {T} steps of GRUCell({I}, {H}) [yours, its parameters shared by the "
        f"steps] -> Linear({H}, {V}) at each step -> cross-entropy"
    )


def _attention(cls, V, where):
    D, d = SIZES["attention"]["D"], SIZES["attention"]["d"]
    emb0 = layers.Embedding(V, D, dtype=F64)
    proj0 = [layers.Linear(D, d, dtype=F64) for _ in range(3)]
    head0 = layers.Linear(d, V, dtype=F64)
    sides = []
    for yours in (True, False):
        emb, head = layers.Embedding(V, D, dtype=F64), layers.Linear(d, V, dtype=F64)
        emb.load_state_dict(emb0.state_dict())
        head.load_state_dict(head0.state_dict())
        proj = [layers.Linear(D, d, dtype=F64) for _ in range(3)]
        for p, p0 in zip(proj, proj0, strict=True):
            p.load_state_dict(p0.state_dict())
        att = call(f"{cls.__name__}()", cls, where=where) if yours else layers.ScaledDotProductAttention()
        crit = CrossEntropyLoss()

        def fb(idx, target, emb=emb, head=head, crit=crit, proj=proj, att=att, yours=yours):
            x = emb.forward(idx).reshape(N * T, D)
            q, k, v = (lin.forward(x).reshape(N, T, d) for lin in proj)
            out = att.forward(q, k, v) if yours else att.forward(q, k, v, is_causal=True)
            loss, dout = _head_loss(head, crit, out, target)
            dqkv = att.backward(dout)
            dx = sum(lin.backward(g.reshape(N * T, d)) for lin, g in zip(proj, dqkv, strict=True))
            emb.backward(dx.reshape(N, T, D))
            return loss

        sides.append(
            _Side(list(emb.parameters()) + [p for lin in proj for p in lin.parameters()] + list(head.parameters()), fb)
        )
    return sides, (
        f"Embedding({V}, {D}) -> q, k, v = three Linear({D}, {d}) -> {cls.__name__} [yours], causal, "
        f"T = {T} -> Linear({d}, {V}) -> cross-entropy of the next character"
    )


BUILD = {"embedding": _embedding, "lstm_cell": _lstm_cell, "gru_cell": _gru_cell, "attention": _attention}


def text_race(ex, cls, file: str, seed: int) -> Race:
    """The character model of exercise ``ex`` with the learner's ``cls`` in it, beside handgrad's."""
    ids, V, data = corpus()
    torch.manual_seed(seed)
    (mine, twin), what = BUILD[ex.name](cls, V, file)
    g = torch.Generator().manual_seed(seed)
    batches = {}

    def batch(step):  # N windows of T + 1 characters: the model reads T and predicts the next at each
        if step not in batches:
            start = torch.randint(0, len(ids) - T - 1, (N, 1), generator=g)
            w = ids[start + torch.arange(T + 1)]
            batches[step] = (w[:, :-1], w[:, 1:])
        return batches[step]

    def step_mine(step):
        loss = call("a training step with your layer", mine.forward_backward, *batch(step), where=file)
        _sgd(mine.params, f"your {ex.cls}")
        return loss

    def step_twin(step):
        loss = twin.forward_backward(*batches.pop(step))
        _sgd(twin.params, "handgrad's model")
        return loss

    return Race(
        [
            f"Training your {ex.cls} beside handgrad's: exercise {ex.name}, from {file}",
            f"  data: {data}",
            f"  model: {what}",
            f"  SGD, lr {LR}, {N} windows of {T} characters a step; the twin: handgrad's "
            f"layers, the same initial weights and windows",
        ],
        step_mine,
        {"handgrad": step_twin},
    )

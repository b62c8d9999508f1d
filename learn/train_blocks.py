"""``learn train`` for ring_attention and moe_dispatch: the learner's layer in the middle of a small torch model,
beside the same model with that layer written in torch and differentiated by autograd.

ring_attention: each 14 x 14 image read as a sequence of its 14 rows; q, k, v = three Linear 14 -> 8; your
RingAttention(ranks=2) (blocks of 7 rows); the mean over the rows; Linear 8 -> 10.  The twin: softmax(q k^T /
sqrt(8)) v over whole rows.  moe_dispatch: Linear 196 -> 16; a router Linear 16 -> 4, softmax, top-2 (the gates);
your MoEDispatchCombine(4, 16, 16, capacity=14) (a batch of 32 makes 64 assignments for 4 experts of 14 places:
some are dropped); tanh; Linear 16 -> 10.  The twin: the dispatch and combine in torch, layers/moe.py's route()
choosing what is kept.  Around the learner's layer autograd does the rest: the layer's inputs are detached and its
output becomes a new leaf, whose gradient the learner's backward takes; what it returns is sent back into the
graph below.  SGD, cross-entropy, float64, the same initial weights and batches, as ``learn/train.py``'s races.
"""

from __future__ import annotations

import copy

import torch
from torch.nn import functional as F

from layers.moe import route

from .checker.guard import LearnerFailed, call
from .data import small_task
from .race import Race
from .train_layers import BATCH, F64, LR, sgd
from .train_parallel import flat_batches

ROWS, HEAD, RANKS = 14, 8, 2  # an image's rows as a sequence; 14 rows in 2 blocks of 7
WIDTH, EXPERTS, TOP_K, CAPACITY = 16, 4, 2, 14


def _tensors(got, like: list[torch.Tensor], what: str) -> list[torch.Tensor]:
    """The learner's results, each a float64 tensor of its expected shape; LearnerFailed naming the first that
    is not."""
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    if len(got) != len(like):
        raise LearnerFailed(f"{what} returned {len(got)} results, expected {len(like)}")
    for k, (t, want) in enumerate(zip(got, like, strict=True)):
        if not isinstance(t, torch.Tensor) or t.shape != want.shape or t.dtype != F64:
            shown = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise LearnerFailed(f"{what}: result {k + 1} should be float64 of shape {tuple(want.shape)}, got {shown}")
    return got


def _yours(what: str, fn, args, like: list[torch.Tensor], file: str) -> list[torch.Tensor]:
    return _tensors(call(what, fn, *args, where=file), like, what)


def _ring_net(seed: int) -> torch.nn.ModuleDict:
    torch.manual_seed(seed)
    lin = lambda i, o: torch.nn.Linear(i, o, dtype=F64)  # noqa: E731
    return torch.nn.ModuleDict(
        {"q": lin(ROWS, HEAD), "k": lin(ROWS, HEAD), "v": lin(ROWS, HEAD), "head": lin(HEAD, 10)}
    )


def ring_race(ex, cls, file: str, seed: int) -> Race:
    x, y, data = small_task(seed=seed)
    twin = _ring_net(seed)
    mine = copy.deepcopy(twin)
    layer = call(f"{cls.__name__}(ranks={RANKS})", lambda: cls(RANKS), where=file)
    batch = flat_batches(x, y, seed)

    def qkv(net, xb):
        seq = xb.reshape(-1, ROWS, ROWS)  # (B, 14, 14): 14 positions of 14 features
        return net["q"](seq), net["k"](seq), net["v"](seq)  # (B, 14, 8) each

    def step_mine(step):
        xb, yb = batch(step)
        q, k, v = qkv(mine, xb)
        (out,) = _yours(f"your {ex.cls}.forward", layer.forward, [t.detach() for t in (q, k, v)], [q], file)
        out = out.detach().requires_grad_()  # a leaf: autograd stops here, your backward goes on
        loss = F.cross_entropy(mine["head"](out.mean(1)), yb)
        loss.backward()
        grads = _yours(f"your {ex.cls}.backward", layer.backward, [out.grad], [q, k, v], file)
        torch.autograd.backward((q, k, v), grads)
        sgd(list(mine.parameters()), "the network around your layer")
        return float(loss.detach())

    def step_twin(step):
        xb, yb = batch(step)
        q, k, v = qkv(twin, xb)
        out = torch.softmax(q @ k.transpose(1, 2) * HEAD**-0.5, -1) @ v  # (B, 14, 8), whole rows
        loss = F.cross_entropy(twin["head"](out.mean(1)), yb)
        loss.backward()
        sgd(list(twin.parameters()), "the twin")
        return float(loss.detach())

    return Race(
        [
            f"Training your {ex.cls} beside whole-row attention: exercise {ex.name}, from {file}",
            f"  data: {data}, each image a sequence of its {ROWS} rows",
            f"  network: q, k, v = Linear {ROWS} -> {HEAD} -> {cls.__name__}(ranks={RANKS}) [yours] -> mean over the "
            f"rows -> Linear {HEAD} -> 10",
            f"  SGD, lr {LR}, batches of {BATCH}; the twin: softmax(q k^T / sqrt({HEAD})) v by autograd, the same "
            f"initial weights and batches",
        ],
        step_mine,
        {"autograd": step_twin},
    )


def _moe_net(seed: int) -> torch.nn.ModuleDict:
    torch.manual_seed(seed)
    lin = lambda i, o: torch.nn.Linear(i, o, dtype=F64)  # noqa: E731
    net = torch.nn.ModuleDict({"inp": lin(ROWS * ROWS, WIDTH), "router": lin(WIDTH, EXPERTS), "head": lin(WIDTH, 10)})
    net.experts = torch.nn.Parameter((torch.rand(EXPERTS, WIDTH, WIDTH, dtype=F64) * 2 - 1) * WIDTH**-0.5)
    return net


def _routed(net, xb):
    h = net["inp"](xb)  # (B, 16)
    probs = torch.softmax(net["router"](h), -1)  # (B, 4)
    experts, gates, _, kept = route(probs, TOP_K, CAPACITY, normalize=False)  # (B, 2) each
    return h, gates, experts, kept


def moe_race(ex, cls, file: str, seed: int) -> Race:
    x, y, data = small_task(seed=seed)
    twin = _moe_net(seed)
    mine = copy.deepcopy(twin)
    shown = f"{cls.__name__}({EXPERTS}, {WIDTH}, {WIDTH}, capacity={CAPACITY})"
    layer = call(shown, lambda: cls(EXPERTS, WIDTH, WIDTH, CAPACITY), where=file)
    w = getattr(layer, "weight", None)
    if not isinstance(w, torch.Tensor) or w.shape != mine.experts.shape or w.dtype != F64:
        raise LearnerFailed(f"your {shown} has no float64 weight of shape {tuple(mine.experts.shape)}")
    layer.weight = mine.experts.detach().clone()  # the twin's initial experts; yours is a plain tensor
    mine.experts.requires_grad_(False)
    batch = flat_batches(x, y, seed)

    def step_mine(step):
        xb, yb = batch(step)
        h, gates, experts, _ = _routed(mine, xb)
        given = (h.detach(), gates.detach(), experts)
        (out,) = _yours(f"your {ex.cls}.forward", layer.forward, given, [h], file)
        out = out.detach().requires_grad_()
        loss = F.cross_entropy(mine["head"](torch.tanh(out)), yb)
        loss.backward()
        grads = _yours(f"your {ex.cls}.backward", layer.backward, [out.grad], [h, gates], file)
        torch.autograd.backward((h, gates), grads)
        sgd([p for n, p in mine.named_parameters() if n != "experts"], "the network around your layer")
        sgd([layer.weight], f"your {ex.cls}")
        return float(loss.detach())

    def step_twin(step):
        xb, yb = batch(step)
        h, gates, experts, kept = _routed(twin, xb)
        out = torch.zeros_like(h)  # (B, 16)
        for e in range(EXPERTS):
            tokens, slots = ((experts == e) & kept).nonzero(as_tuple=True)
            out = out.index_add(0, tokens, gates[tokens, slots, None] * (h[tokens] @ twin.experts[e].T))
        loss = F.cross_entropy(twin["head"](torch.tanh(out)), yb)
        loss.backward()
        sgd(list(twin.parameters()), "the twin")
        return float(loss.detach())

    return Race(
        [
            f"Training your {ex.cls} beside autograd's: exercise {ex.name}, from {file}",
            f"  data: {data}",
            f"  network: Linear {ROWS * ROWS} -> {WIDTH}, router Linear {WIDTH} -> {EXPERTS}, softmax, top-{TOP_K} -> "
            f"{shown} [yours] -> tanh -> Linear {WIDTH} -> 10",
            f"  SGD, lr {LR}, batches of {BATCH}; the twin: the dispatch and combine by autograd, layers/moe.py's "
            f"route(); the same initial weights and batches",
        ],
        step_mine,
        {"autograd": step_twin},
    )

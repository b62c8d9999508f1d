"""Expert parallelism by hand (training/parallel/ep_moe.py) on 2 gloo ranks against one process in float64: the
mixture of experts alone, with uneven shares of the tokens (so the all-to-alls' splits are uneven), its output, input
gradient, every weight's gradient, the auxiliary loss and the dropped count; and the MoE GPT trained a few AdamW
steps, its losses and final weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import training
from layers.moe import MixtureOfExperts
from losses import CrossEntropyLoss
from models import GPT
from optimizers import AdamW
from tests.conftest import rel
from tests.spawn_ranks import spawn_ranks
from training.errors import UsageError
from training.parallel.distributed import DistInfo
from training.parallel.ep_moe import ExpertParallelMoE, expert_parallel, is_expert_param

f64 = torch.float64
ROWS = (5, 9)  # each rank's tokens: uneven
SIZE = dict(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8, dtype=f64)
MOE = dict(n_experts=4, top_k=2, capacity_factor=1.0, aux_coef=0.1)
STEPS, BATCH = 3, 4


def _layer(normalize):
    torch.manual_seed(0)
    return MixtureOfExperts(4, 6, 4, top_k=2, capacity_factor=0.75, normalize=normalize, aux_coef=0.3, dtype=f64)


def _tokens():
    g = torch.Generator().manual_seed(1)
    return torch.randn(sum(ROWS), 4, dtype=f64, generator=g), torch.randn(sum(ROWS), 4, dtype=f64, generator=g)


def layer_alone(rank, world, normalize):
    """This rank's differences from one process, each a largest relative difference (or a count's)."""
    whole, (x, dy) = _layer(normalize), _tokens()
    y1 = whole(x)
    dx1 = whole.backward(dy)
    part = ExpertParallelMoE(_layer(normalize), None, rank, world)
    lo = sum(ROWS[:rank])
    rows = slice(lo, lo + ROWS[rank])
    y = part(x[rows])
    dx = part.backward(dy[rows])
    aux = part.aux_loss.clone()
    dist.all_reduce(aux)
    dist.all_reduce(part.router.grad)  # the router's gradient: every rank's tokens' share
    L = 4 // world
    out = {"y": rel(y, y1[rows]), "dx": rel(dx, dx1[rows]), "aux": rel(aux, whole.aux_loss)}
    out["router"] = rel(part.router.grad, whole.router.grad)
    for name in ("w1", "b1", "w2", "b2"):
        out[name] = rel(getattr(part, name).grad, getattr(whole, name).grad[rank * L : (rank + 1) * L])
    out["dropped"] = abs(part.dropped - whole.dropped) + (whole.dropped == 0)  # and the case drops some
    return out


def _batches():
    g = torch.Generator().manual_seed(3)
    return [
        (torch.randint(0, 13, (BATCH, 8), generator=g), torch.randint(0, 13, (BATCH, 8), generator=g))
        for _ in range(STEPS)
    ]


def one_process():
    torch.manual_seed(0)
    gpt, crit, losses = GPT(**SIZE, **MOE), CrossEntropyLoss(), []
    opt = AdamW(gpt.parameters(), lr=1e-2)
    for x, y in _batches():
        gpt.zero_grad()
        logits = gpt(x)
        loss = crit(logits.reshape(-1, 13), y.reshape(-1)) + gpt.aux_loss()
        gpt.backward(crit.backward().view_as(logits))
        opt.step()
        losses.append(float(loss))
    return losses, {n: p.detach().clone() for n, p in gpt.named_parameters()}


def expert_parallel_gpt(rank, world):
    """The MoE GPT on this rank's rows of each batch, its experts split: -> (losses, the whole model's weights)."""
    torch.manual_seed(0)
    gpt = GPT(**SIZE, **MOE)
    part, crit, losses = expert_parallel(gpt, None, rank, world, grad_scale=world), CrossEntropyLoss(), []
    opt = AdamW(part.parameters(), lr=1e-2)
    b = BATCH // world
    for x, y in _batches():
        x, y = x[rank * b : (rank + 1) * b], y[rank * b : (rank + 1) * b]
        part.zero_grad()
        logits = part(x)
        mean = crit(logits.reshape(-1, 13), y.reshape(-1))
        part.backward(crit.backward(float(world) * y.numel() / (BATCH * 8)).view_as(logits))  # averaged below
        for name, p in part.named_parameters():
            if not is_expert_param(name):  # replicated: the gradients averaged; an expert's is whole on its rank
                dist.all_reduce(p.grad)
                p.grad /= world
        opt.step()
        total = mean.detach() * y.numel() / (BATCH * 8) + part.aux_loss()
        dist.all_reduce(total)
        losses.append(float(total))
    weights = {}
    for name, p in part.named_parameters():
        if is_expert_param(name):
            every = [torch.empty_like(p) for _ in range(world)]
            dist.all_gather(every, p.detach().contiguous())
            weights[name] = torch.cat(every)
        else:
            weights[name] = p.detach().clone()
    return losses, weights


def every_case(rank, world):
    return {"layer": [layer_alone(rank, world, n) for n in (False, True)], "gpt": expert_parallel_gpt(rank, world)}


@pytest.mark.slow
def test_expert_parallel_ranks_equal_one_process():
    results = spawn_ranks(every_case, 2, timeout=240)
    losses, weights = one_process()
    for rank, out in results.items():
        for case in out["layer"]:
            assert case.pop("dropped") == 0, (rank, "the dropped count differs, or nothing was dropped")
            assert max(case.values()) < 1e-12, (rank, case)
        got, w = out["gpt"]
        assert max(abs(a - b) / abs(b) for a, b in zip(got, losses, strict=True)) < 1e-9, (got, losses)
        assert w.keys() == weights.keys()
        for name in weights:
            assert rel(w[name], weights[name]) < 1e-9, (rank, name, rel(w[name], weights[name]))


TRAIN = dict(
    model="gpt",
    impl="manual",
    dtype="float64",
    n_layer=2,
    n_head=2,
    n_embd=16,
    block_size=8,
    batch_size=4,
    max_iters=3,
    eval_interval=3,
    eval_iters=1,
    log_interval=1,
    lr=0.05,
    clip_grad=0.05,
    plots=False,
    quiet=True,
    threads=1,
    dist_timeout=60,
    n_experts=4,
    top_k=2,
    capacity_factor=1.0,
    aux_coef=0.1,
)


def _results(out):
    summary = json.loads((out / "summary.json").read_text())["results"]["manual"]
    records = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    return summary, [r["loss"] for r in records if r["type"] == "step"]


def _train(rank, world, init_method, out):
    cfg = training.TrainConfig(**TRAIN, expert_parallel=world, out=Path(out))
    return training.run(cfg, say=lambda line: None, info=DistInfo(rank, world, rank), init_method=init_method)


def _check_parity(rank, world, init_method, out, broken=False):
    if broken:  # an expert's w2 gradient doubled on its rank: the forward, the router and every replicated weight
        # are untouched, only the experts' own gradient is wrong
        backward = ExpertParallelMoE.backward_math

        def doubled(self, dy, saved):
            dx, grads = backward(self, dy, saved)
            return dx, {**grads, "w2": 2 * grads["w2"]}

        ExpertParallelMoE.backward_math = doubled
    lines: list[str] = []
    cfg = training.TrainConfig(**TRAIN, expert_parallel=world, check_parity=True, out=Path(out))
    rc = training.run(cfg, say=lines.append, info=DistInfo(rank, world, rank), init_method=init_method)
    return rc, lines


def _rows(lines):
    return {" ".join(line.split()[:2]): line for line in lines if line.startswith(("output", "grad", "weight"))}


@pytest.mark.slow
def test_check_parity_reports_parity_under_expert_parallelism(tmp_path):
    results = spawn_ranks(_check_parity, 2, str(tmp_path), join=False, timeout=240)
    rc, lines = results[0]
    assert rc == 0 and results[1][0] == 0, lines
    assert "--expert-parallel 2" in lines[0], lines[0]
    assert lines[-1].startswith("parity: all ") and "within float64 rounding" in lines[-1], lines
    rows = _rows(lines)
    loss = next(line for line in lines if line.startswith("loss"))
    for name in ("grad transformer.h.1.mlp.w2", "weight transformer.h.0.mlp.w1", "grad transformer.h.0.mlp.router"):
        assert name in rows, sorted(rows)
    assert "output logits" in rows and "output transformer.h.1" in rows
    assert all(r.endswith("rounding") for r in [*rows.values(), loss]), lines
    assert not (tmp_path / "summary.json").exists()  # a check trains nothing and writes nothing


@pytest.mark.slow
def test_check_parity_names_a_wrong_expert_gradient_a_bug(tmp_path):
    results = spawn_ranks(_check_parity, 2, str(tmp_path), True, join=False, timeout=240)
    rc, lines = results[0]
    assert rc == 1 and results[1][0] == 1, lines
    # backward meets the last block first: its experts' w2 is the first tensor past rounding
    first = "grad transformer.h.1.mlp.w2"
    assert lines[-1].startswith(f"parity: BUG. The first tensor past float64 rounding is {first}"), lines[-1]
    rows = _rows(lines)
    assert rows["output logits"].endswith("rounding") and rows[first].endswith("bug")
    assert rows["grad transformer.h.1.mlp.router"].endswith("rounding")  # the router's gradient does not read dW2


@pytest.mark.slow
def test_train_py_expert_parallel_equals_one_process(tmp_path):
    one = tmp_path / "one"
    assert training.run(training.TrainConfig(**TRAIN, out=one)) == 0
    results = spawn_ranks(_train, 2, str(tmp_path / "ep"), join=False, timeout=240)
    assert list(results.values()) == [0, 0]
    (summary, steps), (ref, ref_steps) = _results(tmp_path / "ep"), _results(one)
    assert len(steps) == len(ref_steps) == TRAIN["max_iters"]
    for a, b in zip(steps, ref_steps, strict=True):
        assert abs(a - b) / abs(b) < 1e-9, (steps, ref_steps)
    for key in ("train_loss", "val_loss"):
        assert abs(summary[key] - ref[key]) / abs(ref[key]) < 1e-9, (key, summary, ref)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(expert_parallel=2), "--expert-parallel 2 splits a mixture of experts: give --n-experts K"),
        (dict(expert_parallel=3, n_experts=4), "--n-experts 4 does not divide by --expert-parallel 3"),
        (dict(n_experts=4, tensor_parallel=2), "--n-experts 4 with --tensor-parallel 2"),
    ],
)
def test_expert_parallel_refuses_what_it_cannot_do_in_one_line(tmp_path, kw, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        training.TrainConfig(**{**TRAIN, "n_experts": 0, **kw}, out=tmp_path)


def test_expert_parallel_refuses_another_world_size_in_one_line():
    from training.config.parallel import ParallelConfig
    from training.parallel.run import check_world

    with pytest.raises(UsageError, match="--expert-parallel 2 runs on 2 processes .*not a world size of 4"):
        check_world(ParallelConfig(expert_parallel=2), 4, DistInfo(0, 4))
    assert check_world(ParallelConfig(expert_parallel=2), 4, DistInfo(1, 2)) == 2

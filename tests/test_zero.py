"""ZeRO stages 1 and 2 on 2 gloo processes equal one process in float64 with every optimizer: three steps' losses
and final weights of the GPT to 1e-9 relative, each rank stepping its shard of the buckets, also clipped by the total
norm computed from the shards; a sharded checkpoint resumes bit for bit and refuses another rank's shard; the twin,
torch's ZeroRedundancyOptimizer under DDP, equals one process too."""

import io

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from losses import CrossEntropyLoss
from models.gpt import GPT
from optimizers import clip_grad_norm_, get_optimizer
from tests.spawn_ranks import spawn_ranks

f64 = torch.float64
V = 11
CFG = dict(vocab_size=V, block_size=8, n_layer=2, n_head=2, n_embd=16, dtype=f64)
OPTIMIZERS = {
    "sgd": dict(lr=0.05, momentum=0.9),
    "rmsprop": dict(lr=1e-3),
    "adam": dict(lr=1e-2),
    "adamw": dict(lr=1e-2),
    "adagrad": dict(lr=1e-2),
}
RUNS = [(stage, name) for stage in (1, 2) for name in OPTIMIZERS]
TOL = 1e-9
CLIP = 0.5  # below the GPT's gradient norms here: every step clips
STEPS = 3


def batches():
    g = torch.Generator().manual_seed(5)
    return [(torch.randint(0, V, (4, 8), generator=g), torch.randint(0, V, (4, 8), generator=g)) for _ in range(STEPS)]


def _step(model, crit, x, y):
    logits = model(x)
    loss = crit(logits.reshape(-1, V), y.reshape(-1))
    model.backward(crit.backward().view_as(logits))
    return float(loss)


def one_process(name, clip=None):
    torch.manual_seed(0)
    m = GPT(**CFG)
    opt, crit, losses, norms = get_optimizer(name, m.parameters(), **OPTIMIZERS[name]), CrossEntropyLoss(), [], []
    for x, y in batches():
        m.zero_grad()
        losses.append(_step(m, crit, x, y))
        if clip is not None:
            norms.append(float(clip_grad_norm_(m.parameters(), clip)))
        opt.step()
    return losses, {n: p.detach().clone() for n, p in m.named_parameters()}, norms


def _zero_run(rank, world, name, stage, steps, model=None, state=None, clip=None, norms=None):
    from optimizers import OPTIMIZERS as CLASSES
    from training.parallel.zero import ZeroOptimizer

    if model is None:
        torch.manual_seed(0)
        model = GPT(**CFG)
    opt = ZeroOptimizer(CLASSES[name], model.parameters(), stage=stage, bucket_cap_mb=0.02, **OPTIMIZERS[name])
    if state is not None:
        opt.load_state_dict(state)
    crit, losses = CrossEntropyLoss(), []
    for x, y in steps:
        rows = slice(rank * 2, rank * 2 + 2)  # this rank's half of the global batch
        opt.zero_grad()
        loss = torch.tensor(_step(model, crit, x[rows], y[rows]), dtype=f64)
        dist.all_reduce(loss)
        losses.append(loss.item() / world)
        norm = opt.step(clip)
        if norms is not None:
            norms.append(float(norm))
    return model, opt, losses


def hand_written(rank, world):
    out = {}
    for stage, name in RUNS:
        model, opt, losses = _zero_run(rank, world, name, stage, batches())
        assert len(opt.buckets) > 2  # a small cap: several buckets, each sharded
        out[stage, name] = (losses, {n: p.detach().clone() for n, p in model.named_parameters()})
    norms = []  # clipped by the total norm, computed from the shards
    model, _, losses = _zero_run(rank, world, "adamw", 2, batches(), clip=CLIP, norms=norms)
    out["clip"] = (losses, {n: p.detach().clone() for n, p in model.named_parameters()}, norms)
    # a sharded checkpoint after two steps resumes the third bit for bit
    model, opt, _ = _zero_run(rank, world, "adamw", 2, batches()[:2])
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "zero": opt.state_dict()}, buf)
    go_on = [
        p.detach().clone()
        for p in _zero_run(rank, world, "adamw", 2, batches()[2:], model, opt.state_dict())[0].parameters()
    ]
    buf.seek(0)
    saved = torch.load(buf)
    torch.manual_seed(1)
    fresh = GPT(**CFG)
    fresh.load_state_dict(saved["model"])
    resumed = [
        p.detach() for p in _zero_run(rank, world, "adamw", 2, batches()[2:], fresh, saved["zero"])[0].parameters()
    ]
    out["resume_equal"] = all(torch.equal(a, b) for a, b in zip(go_on, resumed, strict=True))
    other = dict(saved["zero"], rank=1 - rank)
    with pytest.raises(ValueError) as e:
        _zero_run(rank, world, "adamw", 2, [], None, other)
    out["refused"] = str(e.value)
    return out


def twin(rank, world):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    module = GPT(**CFG).to_torch()
    ddp = DistributedDataParallel(module)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, **OPTIMIZERS["adamw"])
    losses = []
    for x, y in batches():
        rows = slice(rank * 2, rank * 2 + 2)
        opt.zero_grad()
        loss = F.cross_entropy(ddp(x[rows]).reshape(-1, V), y[rows].reshape(-1))
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    return losses, {n: p.detach().clone() for n, p in module.named_parameters()}


def both(rank, world):
    return {"hand": hand_written(rank, world), "twin": twin(rank, world)}


def _assert_equal_one_process(losses, weights, ref_losses, ref_weights, what):
    assert max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses, strict=True)) < TOL, (what, losses, ref_losses)
    names = {n.replace("lm_head.weight", "transformer.wte.weight") for n in weights}
    assert names == ref_weights.keys(), what
    for n, w in weights.items():
        ref = ref_weights[n.replace("lm_head.weight", "transformer.wte.weight")]
        assert ((w - ref).abs().max() / ref.abs().max()).item() < TOL, (what, n)


def test_zero_1_and_2_on_two_ranks_equal_one_process_with_every_optimizer_and_resume_exactly():
    results = spawn_ranks(both, 2)
    refs = {name: one_process(name)[:2] for name in OPTIMIZERS}
    *clipped, ref_norms = one_process("adamw", CLIP)
    assert min(ref_norms) > CLIP
    for rank in (0, 1):
        hand = results[rank]["hand"]
        for stage, name in RUNS:
            _assert_equal_one_process(*hand[stage, name], *refs[name], f"ZeRO-{stage} {name} rank {rank}")
        _assert_equal_one_process(*hand["clip"][:2], *clipped, f"ZeRO-2 clipped rank {rank}")
        assert max(abs(a - b) / b for a, b in zip(hand["clip"][2], ref_norms, strict=True)) < TOL
        assert hand["resume_equal"]
        assert f"saved with rank {1 - rank!r}, this is {rank!r}" in hand["refused"]
        _assert_equal_one_process(*results[rank]["twin"], *refs["adamw"], f"ZeroRedundancyOptimizer rank {rank}")

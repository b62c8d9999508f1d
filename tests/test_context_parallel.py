"""Context parallelism on gloo processes equals one process in float64: ring attention (zigzag chunks, the partial
softmaxes merged by log-sum-exp, dK and dV brought home round the ring) on 2 and 4 ranks against the attention of
the whole sequence, forward and backward; the GPT with its windows split over 2 and 4 ranks, and over 2 context x
2 tensor-parallel ranks (with and without sequence parallelism), three AdamW steps' losses and final weights to
1e-9 relative."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from losses import CrossEntropyLoss
from models.gpt import GPT
from optimizers import AdamW
from tests.spawn_ranks import spawn_ranks
from tests.test_tensor_parallel import CFG, TOL, batches, one_process

f64 = torch.float64


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def ring_alone(rank, world):
    """RingAttention on this rank's zigzag chunks against F.scaled_dot_product_attention of the whole sequence."""
    from training.parallel.ring_attention import RingAttention, zigzag_positions

    g = torch.Generator().manual_seed(3)
    q, k, v, dout = (torch.randn(2, 3, 16, 4, dtype=f64, generator=g) for _ in range(4))
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*whole, is_causal=True)
    ref.backward(dout)
    pos = zigzag_positions(16, rank, world)
    ring = RingAttention(None, seq_len=16)
    out = ring(*(t[:, :, pos] for t in (q, k, v)), scale=0.5)  # scale 1/sqrt(4), as the reference's
    with pytest.raises(ValueError, match=f"window of 32 over {world} ranks is {32 // world} positions, got q with"):
        RingAttention(None, seq_len=32)(*(t[:, :, pos] for t in (q, k, v)))  # a shorter window than it was built for
    grads = ring.backward(dout[:, :, pos])
    err = max(_rel(a, b[:, :, pos]) for a, b in zip((out, *grads), (ref, *(t.grad for t in whole)), strict=True))
    alone = [dist.new_group([r]) for r in range(world)][rank]  # a ring of one rank: no passes, the whole sequence
    ring = RingAttention(alone)
    out = ring(q, k, v, scale=0.5)
    grads = ring.backward(dout)
    return max(err, *(_rel(a, b) for a, b in zip((out, *grads), (ref, *(t.grad for t in whole)), strict=True)))


def context_parallel_gpt(rank, world, tensor_parallel=1, sequence_parallel=False):
    """Three AdamW steps of the GPT split over the context-parallel group (x tensor parallelism); -> (losses,
    the whole model's final weights)."""
    from training.parallel.cp_gpt import context_parallel, zigzag_part
    from training.parallel.layout import parallel_layout
    from training.parallel.tp_gpt import TensorParallelGPT

    lay = parallel_layout(tensor_parallel, 1, world // tensor_parallel)
    C, c = lay.cp, lay.cp_rank
    torch.manual_seed(0)
    gpt = GPT(**CFG)
    base = TensorParallelGPT(gpt, lay.tp_group, sequence_parallel) if tensor_parallel > 1 else gpt
    part = context_parallel(base, lay.cp_group, CFG["block_size"], c, C)
    crit = part.loss() if tensor_parallel > 1 else CrossEntropyLoss()
    if C == 2 and tensor_parallel == 1:  # a window shorter than the one it was built for: its positions are wrong
        with pytest.raises(ValueError, match="window of 8 over 2 ranks is 4 positions, got q with 2"):
            part(zigzag_part(batches()[0][0][:, :4], c, C))
    opt, losses = AdamW(part.parameters(), lr=1e-2), []
    for x, y in batches():
        part.zero_grad()
        logits = part(zigzag_part(x, c, C))  # (B, T/C, V): this rank's positions
        loss = crit(logits.reshape(-1, logits.shape[-1]), zigzag_part(y, c, C).reshape(-1))
        part.backward(crit.backward(1.0 / C).view_as(logits))  # each rank's mean is 1/C of the whole's
        if tensor_parallel > 1:
            part.finish_gradients()
        for p in part.parameters():  # every rank of the ring holds the same weights: their gradients summed
            dist.all_reduce(p.grad, group=lay.grad_group)
        opt.step()
        total = loss.detach() / C
        dist.all_reduce(total, group=lay.cp_group)
        losses.append(float(total))
    weights = part.full_state_dict() if tensor_parallel > 1 else dict(part.named_parameters())
    return losses, {n: t.detach().clone() for n, t in weights.items()}


def every_case(rank, world):
    out = {"ring": ring_alone(rank, world), "gpt": context_parallel_gpt(rank, world)}
    if world == 4:
        out["tp"] = context_parallel_gpt(rank, world, 2)
        out["tp-sp"] = context_parallel_gpt(rank, world, 2, True)
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_context_parallel_ranks_equal_one_process(world):
    results = spawn_ranks(every_case, world, timeout=240)
    losses, weights, _ = one_process()
    for rank, out in results.items():
        assert out["ring"] < 1e-13, (rank, out["ring"])
        for case in [k for k in out if k != "ring"]:
            got, w = out[case]
            assert max(abs(a - b) / abs(b) for a, b in zip(got, losses, strict=True)) < TOL, (case, got, losses)
            assert w.keys() == weights.keys(), case
            for name in weights:
                assert _rel(w[name], weights[name]) < TOL, (case, rank, name, _rel(w[name], weights[name]))

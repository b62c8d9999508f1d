"""Tensor parallelism and data parallelism composed on 4 gloo processes (T=2 x D=2, tensor-parallel ranks adjacent)
equal one process in float64: the tensor-parallel GPT on each pair, the batch split between the pairs, the
gradients averaged over the data-parallel group by ZeRO-1 (reduce-scatter, AdamW on the shard, all-gather): three
steps' losses and the final weights to 1e-9 relative; a tensor-parallel size that does not divide the world is
refused by name."""

import pytest
import torch
import torch.distributed as dist

from models.gpt import GPT
from tests.spawn_ranks import spawn_ranks
from tests.test_tensor_parallel import CFG, TOL, batches, one_process


def composed(rank, world):
    from optimizers import AdamW
    from training.parallel.layout import parallel_layout
    from training.parallel.tp_gpt import TensorParallelGPT
    from training.parallel.zero import ZeroOptimizer

    with pytest.raises(ValueError, match="--tensor-parallel 3 does not divide the world size 4"):
        parallel_layout(3)
    lay = parallel_layout(2)
    torch.manual_seed(0)
    tp = TensorParallelGPT(GPT(**CFG), lay.tp_group)
    opt = ZeroOptimizer(AdamW, tp.parameters(), stage=1, group=lay.dp_group, bucket_cap_mb=0.02, lr=1e-2)
    crit, losses = tp.loss(), []
    for x, y in batches():  # (3, 8): the first data-parallel rank takes 2 rows, the second 1: uneven on purpose
        rows = slice(0, 2) if lay.dp_rank == 0 else slice(2, 3)
        opt.zero_grad()
        logits = tp(x[rows])
        loss = crit(logits.reshape(-1, logits.shape[-1]), y[rows].reshape(-1))
        # this rank's share of the global mean: its rows' mean x its rows / all rows; ZeRO averages over D, so x D
        share = (rows.stop - rows.start) / x.shape[0] * lay.dp
        tp.backward(crit.backward(share).view_as(logits))
        opt.step()
        total = loss.detach() * (rows.stop - rows.start) / x.shape[0]
        dist.all_reduce(total, group=lay.dp_group)
        losses.append(float(total))
    return (lay.tp_rank, lay.dp_rank), losses, tp.full_state_dict()


def test_two_tensor_parallel_pairs_times_two_data_parallel_ranks_equal_one_process():
    results = spawn_ranks(composed, 4)
    losses, weights, _ = one_process()
    assert sorted(r[0] for r in results.values()) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for rank, (_, got, w) in results.items():
        assert max(abs(a - b) / abs(b) for a, b in zip(got, losses, strict=True)) < TOL, (rank, got, losses)
        for name, ref in weights.items():
            assert ((w[name] - ref).abs().max() / ref.abs().max()).item() < TOL, (rank, name)

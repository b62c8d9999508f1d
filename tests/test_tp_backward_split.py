"""A tensor-parallel layer's backward split in two for a zero-bubble pipeline equals its fused backward bit for bit in
float64, on 2 gloo processes: B (``backward_input``) then W (``backward_weight``) gives the same input gradient and
adds the same parameter gradients as ``backward``, for the column- and row-parallel Linear, the vocabulary-parallel
embedding, the tensor-parallel block, with and without sequence parallelism; and a one-stage ``TensorParallelStage``
run as B then W equals ``TensorParallelGPT``'s forward, loss and backward bit for bit (a vocabulary of 11 padded to
12)."""

import pytest
import torch

from models.gpt import GPT
from tests.spawn_ranks import spawn_ranks
from tests.test_tensor_parallel import CFG, batches

f64 = torch.float64


def _grads(layer) -> dict:
    return {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _split_equals_fused(make, x, dout) -> list[bool]:
    """[dx equal, grads equal, some gradient there] for B then W against backward, on two builds of the layer."""
    fused, split = make(), make()
    fused(x.clone())
    split(x.clone())
    dx_f, dx_s = fused.backward(dout.clone()), split.backward_input(dout.clone())
    assert not _grads(split)  # B adds no parameter gradient
    split.backward_weight()
    same_dx = (dx_f is None and dx_s is None) or torch.equal(dx_f, dx_s)
    return [same_dx, _same(_grads(fused), _grads(split)), bool(_grads(fused))]


def check_layers(rank, world, sp):
    from training.parallel.tp_gpt import ParallelBlock
    from training.parallel.tp_layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding

    torch.manual_seed(0)
    gpt = GPT(**CFG)
    g = torch.Generator().manual_seed(1)
    part = 4 if sp else 8  # positions a rank holds outside the split regions
    full_x, part_x = torch.randn(3, part, 16, dtype=f64, generator=g), torch.randn(3, 8, 32, dtype=f64, generator=g)
    idx = torch.randint(0, CFG["vocab_size"], (3, 8), generator=g)
    out = {}
    out["column"] = _split_equals_fused(
        lambda: ColumnParallelLinear(gpt.h[0].mlp.c_fc, rank, world, None, sequence_parallel=sp),
        full_x,
        torch.randn(3, 8, 32, dtype=f64, generator=g),
    )
    out["row"] = _split_equals_fused(
        lambda: RowParallelLinear(gpt.h[0].mlp.c_proj, rank, world, None, sequence_parallel=sp),
        part_x,
        torch.randn(3, part, 16, dtype=f64, generator=g),
    )
    out["embedding"] = _split_equals_fused(
        lambda: VocabParallelEmbedding(gpt.wte, rank, world, None, sequence_parallel=sp),
        idx,
        torch.randn(3, part, 16, dtype=f64, generator=g),
    )
    out["block"] = _split_equals_fused(
        lambda: ParallelBlock(gpt.h[1], rank, world, None, sp), full_x, torch.randn(3, part, 16, dtype=f64, generator=g)
    )
    return out


def check_stage(rank, world, sp):
    from training.parallel.tp_gpt import TensorParallelGPT
    from training.parallel.tp_pipeline import TensorParallelStage

    torch.manual_seed(0)
    gpt = GPT(**CFG)
    whole, stage = TensorParallelGPT(gpt, sequence_parallel=sp), TensorParallelStage(gpt, 0, 1, None, sp)
    assert stage.head is None and stage.wte.weight.shape == (6, 16)  # one stage: the table is its own output layer
    x, y = batches()[0]
    same = []
    for model, run_backward in (
        (whole, lambda m, d: m.backward(d)),
        (stage, lambda m, d: (m.backward_input(d), m.backward_weight())),
    ):
        crit = model.loss()
        logits = model(x)
        loss = crit(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        run_backward(model, crit.backward().view_as(logits))
        model.finish_gradients()
        same.append((logits, loss, model.full_state_dict(grad=True)))
    (l1, loss1, g1), (l2, loss2, g2) = same
    return torch.equal(l1, l2), torch.equal(loss1, loss2), _same(g1, g2), len(g1)


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp-sp"])
def test_b_then_w_equals_the_fused_backward_bit_for_bit(sp):
    results = spawn_ranks(check_layers, 2, sp)
    for rank, out in results.items():
        assert out == {k: [True, True, True] for k in ("column", "row", "embedding", "block")}, (rank, out)


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp-sp"])
def test_a_one_stage_tensor_parallel_stage_equals_the_tensor_parallel_gpt(sp):
    results = spawn_ranks(check_stage, 2, sp)
    for rank, out in results.items():
        assert out == (True, True, True, 28), (rank, out)  # every parameter of the 2-layer GPT: 28 tensors

"""Tensor parallelism on 2 gloo processes equals one process in float64: the hand-written column/row-parallel GPT
(Megatron's f and g, heads split, a vocabulary of 11 padded to 12 with a vocabulary-parallel embedding and loss),
with and without sequence parallelism (layer norms and residuals on half the positions each), and its twin
(DTensor's ColwiseParallel/RowwiseParallel on the nn.Module GPT): the first step's every gradient, three AdamW steps'
losses and the final weights to 1e-9 relative; what does not divide is refused by name."""

import pytest
import torch
import torch.nn.functional as F

from losses import CrossEntropyLoss
from models.gpt import GPT
from optimizers import AdamW
from tests.spawn_ranks import spawn_ranks

f64 = torch.float64
V = 11  # does not divide by 2: padded to 12, the padded logit kept out of the loss
CFG = dict(vocab_size=V, block_size=8, n_layer=2, n_head=2, n_embd=16, dtype=f64)
TOL = 1e-9


def batches():
    g = torch.Generator().manual_seed(5)
    return [(torch.randint(0, V, (3, 8), generator=g), torch.randint(0, V, (3, 8), generator=g)) for _ in range(3)]


def one_process():
    torch.manual_seed(0)
    m = GPT(**CFG)
    opt, crit, losses, grads = AdamW(m.parameters(), lr=1e-2), CrossEntropyLoss(), [], None
    for x, y in batches():
        m.zero_grad()
        logits = m(x)
        losses.append(float(crit(logits.reshape(-1, V), y.reshape(-1))))
        m.backward(crit.backward().view_as(logits))
        grads = grads or {n: p.grad.clone() for n, p in m.named_parameters()}
        opt.step()
    return losses, {n: p.clone() for n, p in m.named_parameters()}, grads


def hand_written(rank, world, sequence_parallel=False):
    from training.parallel.tp_gpt import TensorParallelGPT

    torch.manual_seed(0)
    tp = TensorParallelGPT(GPT(**CFG), sequence_parallel=sequence_parallel)
    assert tp.wte.weight.shape == (6, 16)  # 12 padded rows, 6 a rank
    opt, crit, losses, grads = AdamW(tp.parameters(), lr=1e-2), tp.loss(), [], None
    for x, y in batches():
        tp.zero_grad()
        logits = tp(x)  # (B, T, 6): this rank's columns
        losses.append(float(crit(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))))
        tp.backward(crit.backward().view_as(logits))
        if sequence_parallel and grads is None:  # wpe saw this rank's 4 of the 8 positions only
            touched = tp.wpe.weight.grad.abs().sum(1) > 0
            assert touched.tolist() == [rank * 4 <= t < rank * 4 + 4 for t in range(8)]
        tp.finish_gradients()  # sequence parallelism: the replicated parameters' partial gradients summed
        grads = grads or tp.full_state_dict(grad=True)
        opt.step()
    refused = []
    for cfg in (dict(CFG, n_head=3, n_embd=15), dict(CFG, dropout=0.1)):
        with pytest.raises(ValueError) as e:
            TensorParallelGPT(GPT(**cfg))
        refused.append(str(e.value))
    return losses, tp.full_state_dict(), grads, refused


def twin(rank, world):
    from torch.distributed.device_mesh import init_device_mesh

    from training.parallel.verify.tp_twin import full_state_dict, tensor_parallel_twin

    torch.manual_seed(0)
    m = tensor_parallel_twin(GPT(**CFG).to_torch(), init_device_mesh("cpu", (world,)))
    opt, losses = torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=False), []
    for x, y in batches():
        opt.zero_grad()
        loss = F.cross_entropy(m(x).reshape(-1, V), y.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses, full_state_dict(m, world), None, []


def both(rank, world):
    return {"hand": hand_written(rank, world), "sequence": hand_written(rank, world, True), "twin": twin(rank, world)}


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def test_two_tensor_parallel_ranks_equal_one_process_hand_written_and_twin():
    results = spawn_ranks(both, 2)
    losses, weights, grads = one_process()
    for rank in (0, 1):
        for side in ("hand", "sequence", "twin"):
            got, w, g, _ = results[rank][side]
            assert max(abs(a - b) / abs(b) for a, b in zip(got, losses, strict=True)) < TOL, (side, got, losses)
            assert w.keys() == weights.keys()
            for name in weights:
                assert w[name].shape == weights[name].shape and _rel(w[name], weights[name]) < TOL, (side, name)
            if g is not None:
                for name in grads:
                    assert _rel(g[name], grads[name]) < TOL, (side, name)
        refused = results[rank]["hand"][3]
        assert "n_head 3 does not divide by --tensor-parallel 2" in refused[0]
        assert "dropout 0.1" in refused[1]

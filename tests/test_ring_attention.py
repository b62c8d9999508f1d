"""Ring attention's mathematics in one process (the ranks simulated, every rank's step s before any rank's step
s+1): the zigzag split covers the window once and evens the causal work; the partial softmaxes merged by their
log-sum-exps give the attention of the whole sequence, and the block-by-block backward (dK and dV carried round the
ring) its gradients, in float64 against torch's F.scaled_dot_product_attention and autograd; what the ring cannot
take is refused by name.  The ranks as processes: tests/test_context_parallel.py (slow)."""

import pytest
import torch
import torch.nn.functional as F

from training.parallel.cp_gpt import unzigzag, zigzag_part
from training.parallel.ring_attention import RingAttention, attend_block, meetings, merge, simulate, zigzag_positions

f64 = torch.float64


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8])
def test_the_simulated_ring_equals_the_attention_of_the_whole_sequence(ranks):
    g = torch.Generator().manual_seed(ranks)
    q, k, v, dout = (torch.randn(2, 3, 2 * ranks * 3, 5, dtype=f64, generator=g) for _ in range(4))
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*whole, is_causal=True)
    ref.backward(dout)
    got = simulate(q, k, v, dout, ranks)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, (ref, *(t.grad for t in whole)), strict=True):
        err = ((a - b).abs().max() / b.abs().max()).item()
        assert err < 1e-13, (name, ranks, err)  # measured: about 1e-15


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_the_zigzag_split_covers_every_position_once_and_evens_the_causal_work(ranks):
    T = 4 * ranks
    parts = [zigzag_positions(T, r, ranks) for r in range(ranks)]
    assert sorted(torch.cat(parts).tolist()) == list(range(T))
    # the (query, key) pairs each rank's queries attend to: the same count on every rank
    work = [sum(int(p) + 1 for p in part) for part in parts]
    assert len(set(work)) == 1, work
    # each ring step, a rank meets the same number of chunk pairs; over the ring, every pair once
    for r in range(ranks):
        met = [len(meetings(r, (r - s) % ranks, ranks)) for s in range(ranks)]
        assert met[0] == 3 and all(m == 2 for m in met[1:]), met  # its own block: two diagonals and one full
    x = torch.arange(3 * T).view(3, T)
    assert torch.equal(unzigzag([zigzag_part(x, r, ranks) for r in range(ranks)]), x)


def test_two_partial_softmaxes_merge_into_the_softmax_of_both():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 3, dtype=f64, generator=g) for _ in range(3))
    k2, v2 = (torch.randn(1, 2, 4, 3, dtype=f64, generator=g) for _ in range(2))
    o1, l1 = attend_block(q, k, v, 0.5, causal=False)
    o2, l2 = attend_block(q, k2, v2, 0.5, causal=True)
    mask = torch.cat([torch.ones(4, 4, dtype=torch.bool), torch.ones(4, 4, dtype=torch.bool).tril()], dim=1)
    ref = F.scaled_dot_product_attention(q, torch.cat([k, k2], 2), torch.cat([v, v2], 2), attn_mask=mask, scale=0.5)
    for a, b in ((o1, l1), (o2, l2)), ((o2, l2), (o1, l1)):  # in either order
        out, lse = merge(*a, *b)
        assert (out - ref).abs().max() < 1e-15
    assert (lse - torch.logaddexp(l1, l2)).abs().max() == 0


def test_what_the_ring_cannot_take_is_refused_by_name():
    q = torch.zeros(1, 2, 4, 3, dtype=f64)
    ring = RingAttention(None)
    for kw, words in (
        (dict(dropout_p=0.1), "dropout_p 0.1"),
        (dict(is_causal=False), "is_causal False"),
        (dict(attn_mask=torch.ones(4, 4, dtype=torch.bool)), "attn_mask given"),
    ):
        with pytest.raises(ValueError, match=words):
            ring.check_input(q, q, q, **kw)
    with pytest.raises(ValueError, match=r"must be \(B, H, 2n, E\) alike"):
        ring.check_input(q, q[..., :3, :], q)
    with pytest.raises(ValueError, match="sequence length 10 does not divide into 2 x 4 chunks"):
        zigzag_positions(10, 0, 4)

"""Parameters laid out in one block (llm.c's params_memory), updated as one: ``kernels/optimizers.py``, the GPT's
layout, and Adam/AdamW and the gradient clip taking the one-kernel path only when the tensors line up exactly,
with the per-tensor path's numbers."""

from __future__ import annotations

import copy

import pytest
import torch

from kernels.optimizers import flat_views, tile_like
from models import GPT
from optimizers import Adam, AdamW, clip_grad_norm_

f64 = torch.float64

# the fast path itself is under test, whatever HANDGRAD_KERNELS says
pytestmark = pytest.mark.usefixtures("kernels_on")


def _block(*shapes, transposed=()):
    """Views tiling one block, the i-th transposed when i is in ``transposed``."""
    total = sum(torch.Size(s).numel() for s in shapes)
    block = torch.arange(float(total), dtype=f64)
    views, off = [], 0
    for i, s in enumerate(shapes):
        n = torch.Size(s).numel()
        v = block[off : off + n].view(s[::-1]).t() if i in transposed else block[off : off + n].view(s)
        views.append(v)
        off += n
    return block, views


def test_flat_views_pair_element_by_element_in_any_order():
    block, ps = _block((3, 4), (5,), (2, 3), transposed=(2,))
    gblock, gs = _block((3, 4), (5,), (2, 3), transposed=(2,))
    views = flat_views(ps[::-1], gs[::-1])  # the lists' order does not matter, only where each tensor lies
    assert views is not None and torch.equal(views[0], block) and torch.equal(views[1], gblock)
    views[0].add_(views[1])  # one kernel: every parameter updated
    assert torch.equal(ps[2], 2 * gs[2])


@pytest.mark.parametrize("case", ["separate storage", "gap", "strides differ", "grad elsewhere", "one tensor"])
def test_flat_views_refuse_whatever_does_not_line_up(case):
    _, ps = _block((3, 4), (5,), (2, 3), transposed=(2,))
    _, gs = _block((3, 4), (5,), (2, 3), transposed=(2,))
    if case == "separate storage":
        ps[1] = ps[1].clone()
    elif case == "gap":
        ps = ps[:1] + ps[2:]
        gs = gs[:1] + gs[2:]
    elif case == "strides differ":
        _, gs = _block((3, 4), (5,), (2, 3))  # the last gradient not transposed: element k would not pair
    elif case == "grad elsewhere":
        gs[0] = gs[0].clone()
    else:
        ps, gs = ps[:1], gs[:1]
    assert flat_views(ps, gs) is None


def test_tile_like_copies_into_a_block_laid_out_as_the_parameters():
    _, ps = _block((3, 4), (5,), (2, 3), transposed=(2,))
    states = [torch.randn_like(p) for p in ps]
    tiled = tile_like(ps, states)
    assert all(torch.equal(a, b) for a, b in zip(tiled, states, strict=True)) and flat_views(ps, tiled) is not None


def _gpt(seed=0):
    torch.manual_seed(seed)
    return GPT(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8, dtype=f64)


def _loss_backward(gpt, idx):
    logits = gpt(idx)
    gpt.backward(torch.ones_like(logits) / logits.numel() + 0.01 * logits)


def test_the_gpt_lays_its_parameters_and_gradients_out_in_one_block_each():
    gpt = _gpt()
    params = gpt.parameters()
    assert all(p.grad is None for p in params)  # a fresh model has no gradients, as torch's
    _loss_backward(gpt, torch.randint(0, 13, (3, 8), generator=torch.Generator().manual_seed(1)))
    assert flat_views(params, [p.grad for p in params]) is not None
    decay = [p for p in params if p.dim() >= 2]
    assert flat_views(decay, [p.grad for p in decay]) is not None  # nanoGPT's weight-decay group: one span
    wte = gpt.wte.weight
    gpt.to(dtype=torch.float32)  # moved: laid out again, same tensors
    assert gpt.wte.weight is wte and wte.dtype == torch.float32
    assert flat_views(gpt.parameters(), [p.grad for p in gpt.parameters()]) is not None


@pytest.mark.parametrize("opt_cls, kw", [(AdamW, dict(weight_decay=0.1)), (Adam, dict(amsgrad=True))])
def test_adam_on_the_block_equals_adam_per_tensor(opt_cls, kw):
    """The same GPT twice, one laid out in blocks and one with every tensor on its own: 5 steps with clipping
    give the same weights (to rounding: the one-kernel path and the per-tensor path do the same arithmetic)."""
    flat, loose = _gpt(), _gpt()
    for p in loose.parameters():  # each tensor its own storage: the per-tensor path
        p.data = p.data.clone()
        p.grad = torch.zeros_like(p)
    assert flat_views(loose.parameters(), [p.grad for p in loose.parameters()]) is None
    idx = torch.randint(0, 13, (3, 8), generator=torch.Generator().manual_seed(1))
    opts = [opt_cls(m.parameters(), lr=1e-2, **kw) for m in (flat, loose)]
    for _ in range(5):
        for m, opt in zip((flat, loose), opts, strict=True):
            opt.zero_grad(set_to_none=False)
            _loss_backward(m, idx)
            clip_grad_norm_(m.parameters(), 0.05)
            opt.step()
    for (name, a), (_, b) in zip(flat.named_parameters(), loose.named_parameters(), strict=True):
        assert (a - b).abs().max() <= 1e-15 * max(1.0, b.abs().max().item()), name
    state = opts[0].state[flat.wte.weight]
    assert state["exp_avg"].untyped_storage().nbytes() > state["exp_avg"].numel() * 8  # the state is in a block


def test_a_loaded_optimizer_state_is_laid_out_again_and_gradients_set_to_none_fall_back():
    gpt, idx = _gpt(), torch.randint(0, 13, (3, 8), generator=torch.Generator().manual_seed(2))
    opt = AdamW(gpt.parameters(), lr=1e-2)
    _loss_backward(gpt, idx)
    opt.step()
    saved = copy.deepcopy(opt.state_dict())  # each load below gets its own copy (load_state_dict shares tensors)
    opt2 = AdamW(gpt.parameters(), lr=1e-2)
    opt2.load_state_dict(copy.deepcopy(saved))
    expect = _gpt()
    expect.load_state_dict(gpt.state_dict())
    opt3 = AdamW(expect.parameters(), lr=1e-2)
    opt3.load_state_dict(copy.deepcopy(saved))
    for p in expect.parameters():  # the reference: per tensor
        p.data = p.data.clone()
        p.grad = torch.zeros_like(p)
    for m, o, none in ((gpt, opt2, False), (expect, opt3, True)):
        o.zero_grad(set_to_none=none)  # set to None: fresh gradients, per tensor -- still right
        _loss_backward(m, idx)
        o.step()
    ps = gpt.parameters()
    assert flat_views(ps, [opt2.state[p]["exp_avg"] for p in ps]) is not None  # tiled again after the load
    for a, b in zip(gpt.parameters(), expect.parameters(), strict=True):
        assert (a - b).abs().max() <= 1e-15

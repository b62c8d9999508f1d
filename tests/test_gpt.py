"""The hand-written GPT against nanoGPT's own model.py (tests/anchors) and against its nn.Module twin, float64:
weights under one seed, logits, loss, every gradient (the tied matrix's included), 10 AdamW steps, sampling."""

import pytest
import torch

from gradcheck import check_layer
from losses import CrossEntropyLoss
from models import GPT, PytorchGPT
from models.gpt import KVCache
from optimizers import AdamW
from tests.anchors.nanogpt_model import GPT as NanoGPT
from tests.anchors.nanogpt_model import GPTConfig
from tests.conftest import assert_all_pass, named_grads

F64 = torch.float64
CFG = dict(vocab_size=41, block_size=24, n_layer=2, n_head=2, n_embd=16, dropout=0.0)


def close(a, b, tol):
    scale = max(a.abs().max().item(), b.abs().max().item(), 1e-3)
    err = (a - b).abs().max().item() / scale
    assert err < tol, f"relative error {err:.2e} >= {tol:g}"


def nanogpt(seed=0, **cfg):
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(F64)  # nanoGPT's model takes no dtype: build it in float64
    try:
        return NanoGPT(GPTConfig(**{**CFG, **cfg}))
    finally:
        torch.set_default_dtype(default)


def ours(seed=0, **cfg):
    torch.manual_seed(seed)
    return GPT(**{**CFG, **cfg}, dtype=F64)


def batch(seed=1, B=3, T=24, V=41):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g)


@pytest.fixture(autouse=True)
def quiet(capsys):
    yield  # nanoGPT prints its parameter count


@pytest.mark.parametrize("bias", [True, False])
def test_same_weights_names_and_keys_as_nanogpt_under_one_seed(bias):
    mine, theirs = ours(bias=bias), nanogpt(bias=bias)
    sd_m, sd_t = mine.state_dict(), theirs.state_dict()
    assert list(sd_m) == list(sd_t) and "lm_head.weight" in sd_m
    assert all(torch.equal(sd_m[k], sd_t[k]) for k in sd_t)
    assert [n for n, _ in mine.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    tied = sd_m["lm_head.weight"]  # tied: one tensor's memory, detached as torch's state_dict gives it
    assert tied.data_ptr() == mine.wte.weight.data_ptr() and tied.shape == mine.wte.weight.shape
    assert not tied.requires_grad


@pytest.mark.parametrize("bias", [True, False])
def test_logits_loss_and_every_gradient_equal_nanogpt_float64(bias):
    theirs = nanogpt(seed=3, bias=bias)
    mine = GPT(**{**CFG, "bias": bias}, dtype=F64)
    mine.load_state_dict(theirs.state_dict(), strict=True)  # loads nanoGPT's weights as they are
    idx, tgt = batch()
    tgt[0, :5] = -1  # nanoGPT ignores target -1
    logits = mine(idx)
    crit = CrossEntropyLoss(ignore_index=-1)
    loss = crit(logits.view(-1, CFG["vocab_size"]), tgt.view(-1))
    mine.backward(crit.backward().view_as(logits))
    ref_logits, ref_loss = theirs(idx, tgt)  # with targets nanoGPT returns every position's logits
    ref_loss.backward()
    close(logits, ref_logits.detach(), 1e-10)
    close(loss, ref_loss.detach(), 1e-10)
    grads = named_grads(mine)
    for name, p in theirs.named_parameters():
        close(grads[name], p.grad, 1e-10)  # transformer.wte.weight: the tied matrix, both of its uses


def test_the_tied_gradient_is_the_sum_of_both_uses():
    """Untie the twin (two tensors with the same values): their two gradients, the output projection's and the
    embedding's, must add up to the one gradient of the hand-written GPT's tied matrix."""
    mine = ours()
    idx, _ = batch()
    logits = mine(idx)
    dlogits = torch.randn_like(logits)
    mine.backward(dlogits)
    untied = PytorchGPT(**CFG, dtype=F64)
    untied.load_state_dict(mine.state_dict())
    untied.lm_head.weight = torch.nn.Parameter(untied.transformer.wte.weight.detach().clone())
    untied(idx).backward(dlogits)
    head, emb = untied.lm_head.weight.grad, untied.transformer.wte.weight.grad
    assert emb.abs().max() > 1e-3 and head.abs().max() > 1e-3  # both uses contribute
    close(mine.wte.weight.grad, head + emb, 1e-10)


def test_ten_adamw_steps_equal_nanogpt_and_torch_optim():
    theirs = nanogpt(seed=5)
    mine = GPT(**CFG, dtype=F64)
    mine.load_state_dict(theirs.state_dict())

    def groups(params):
        return [
            {"params": [p for _, p in params if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for _, p in params if p.dim() < 2], "weight_decay": 0.0},
        ]

    opt_m = AdamW(groups(list(mine.named_parameters())), lr=1e-2, betas=(0.9, 0.99))
    opt_t = theirs.configure_optimizers(0.1, 1e-2, (0.9, 0.99), "cpu")
    crit = CrossEntropyLoss(ignore_index=-1)
    for step in range(10):
        idx, tgt = batch(seed=10 + step)
        opt_m.zero_grad()
        logits = mine(idx)
        loss = crit(logits.view(-1, CFG["vocab_size"]), tgt.view(-1))
        mine.backward(crit.backward().view_as(logits))
        opt_m.step()
        opt_t.zero_grad()
        _, ref = theirs(idx, tgt)
        ref.backward()
        opt_t.step()
        assert abs(loss.item() - ref.item()) <= 1e-9 * abs(ref.item()), (step, loss.item(), ref.item())
    sd_t = theirs.state_dict()
    for k, v in mine.state_dict().items():
        close(v, sd_t[k], 1e-9)


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_twin_equals_the_hand_written_gpt_with_the_same_dropout_masks(dropout):
    mine = ours(dropout=dropout)
    twin = PytorchGPT(**{**CFG, "dropout": dropout}, dtype=F64)
    twin.load_state_dict(mine.state_dict())
    assert list(twin.state_dict()) == list(mine.state_dict())
    from training.impls.models import use_generator

    use_generator(mine, torch.Generator().manual_seed(9))
    use_generator(twin, torch.Generator().manual_seed(9))
    idx, _ = batch()
    logits, ref = mine(idx), twin(idx)
    close(logits, ref.detach(), 1e-12)
    dlogits = torch.randn_like(logits)
    mine.backward(dlogits)
    ref.backward(dlogits)
    grads = named_grads(mine)
    for name, p in twin.named_parameters():
        close(grads[name], p.grad, 1e-10)
    if dropout:
        use_generator(mine, torch.Generator().manual_seed(10))
        assert not torch.allclose(mine(idx), logits)  # another generator state: other masks


def test_cached_logits_equal_a_full_recompute():
    mine = ours().eval()
    idx, _ = batch(T=20)
    cache = KVCache(mine)
    got = [cache.prefill(idx[:, :7])]
    for t in range(7, 20):
        got.append(cache.step(idx[:, t : t + 1]))
    full = mine(idx)  # (B, 20, V)
    for i, logits in enumerate(got):
        close(logits, full[:, 6 + i], 1e-12)


@pytest.mark.parametrize("kw", [{}, {"temperature": 0.7, "top_k": 5}])
def test_sampling_equals_nanogpt_and_the_twin_token_for_token(kw):
    theirs = nanogpt(seed=2).eval()
    mine = GPT(**CFG, dtype=F64).eval()
    mine.load_state_dict(theirs.state_dict())
    twin = PytorchGPT(**CFG, dtype=F64).eval()
    twin.load_state_dict(mine.state_dict())
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    n = 40  # past block_size (24): the window slides and the cache is rebuilt
    torch.manual_seed(7)
    ref = theirs.generate(prompt, n, **kw)  # nanoGPT's own, on torch's global generator
    torch.manual_seed(7)
    got = mine.generate(prompt, n, **kw)
    assert torch.equal(got, ref)
    assert torch.equal(
        twin.generate(prompt, n, generator=torch.Generator().manual_seed(4), **kw),
        mine.generate(prompt, n, generator=torch.Generator().manual_seed(4), **kw),
    )


def test_gradcheck_small_gpt():
    torch.manual_seed(0)
    g = GPT(vocab_size=7, block_size=5, n_layer=1, n_head=2, n_embd=4, dropout=0.1, dtype=F64)
    results = check_layer(g, torch.tensor([[0, 3, 6, 6], [2, 1, 4, 0]]), fast=True)
    assert len(results) == len(list(g.named_parameters()))
    assert_all_pass(results)


def test_bad_input_is_named():
    g = ours()
    with pytest.raises(ValueError, match="cannot forward a sequence of length 25: block_size is only 24"):
        g(torch.zeros(1, 25, dtype=torch.long))
    with pytest.raises(ValueError, match=r"idx must be a \(B, T\) tensor of token ids, got \(5,\)"):
        g(torch.zeros(5, dtype=torch.long))
    with pytest.raises(IndexError, match="index 41 is out of range for a table of 41 rows"):
        g(torch.full((1, 3), 41))
    with pytest.raises(ValueError, match="n_embd 10 is not divisible by n_head 3"):
        GPT(vocab_size=5, block_size=4, n_layer=1, n_head=3, n_embd=10)
    with pytest.raises(ValueError, match="differs from 'transformer.wte.weight'"):
        sd = dict(g.state_dict())
        sd["lm_head.weight"] = sd["lm_head.weight"] + 1
        g.load_state_dict(sd)
    with pytest.raises(RuntimeError, match="backward called before forward"):
        ours().backward(torch.zeros(1, 2, 41, dtype=F64))
    with pytest.raises(ValueError, match=r"temperature must be a finite number in \(0"):
        g.generate(torch.zeros(1, 1, dtype=torch.long), 3, temperature=0)

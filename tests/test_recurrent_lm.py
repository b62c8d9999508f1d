"""The recurrent language model (Embedding -> LSTM/GRU/RNN -> Linear) against its nn.Module twin: the same weights
from one seed, conversion both ways, and the issue's goal -- a 2-layer character LSTM trained for 10 AdamW steps by
hand (optimizers.AdamW) and by autograd (torch.optim.AdamW) in float64, losses and weights within 1e-9."""

import pytest
import torch

import optimizers
from layers import from_torch
from losses import CrossEntropyLoss
from models import RecurrentLM, SeededLSTM, TorchRecurrentLM, seeded_dropouts
from training.impls.models import use_generator

f64 = torch.float64
V, E, H = 11, 6, 8  # a small "character" vocabulary


def twins(cell="lstm", dropout=0.0, seed=0):
    torch.manual_seed(seed)
    ours = RecurrentLM(V, E, H, num_layers=2, cell=cell, dropout=dropout, dtype=f64)
    torch.manual_seed(seed)
    twin = TorchRecurrentLM(V, E, H, num_layers=2, cell=cell, dropout=dropout, dtype=f64)
    return ours, seeded_dropouts(twin)


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_one_seed_gives_both_the_same_weights(cell):
    ours, twin = twins(cell)
    sd, tsd = ours.state_dict(), twin.state_dict()
    assert list(sd) == list(tsd)
    assert all(torch.equal(sd[k], tsd[k]) for k in sd)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_goal_character_lstm_ten_adamw_steps_equal_autograd(dropout):
    """Each step: a batch of 4 windows of 12 characters, the next character as the target, the state
    carried over from the step before (truncated BPTT); with dropout 0.3 between the two LSTM layers the twin
    is a SeededLSTM drawing the same masks from a generator in the same state."""
    ours, twin = twins("lstm", dropout)
    assert isinstance(twin.rnn, SeededLSTM)
    gen_ours, gen_twin = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    use_generator(ours, gen_ours)
    use_generator(twin, gen_twin)
    opt = optimizers.AdamW(ours.parameters(), lr=3e-2, weight_decay=0.1)
    named = dict(twin.named_parameters())
    opt_t = torch.optim.AdamW([named[n] for n, _ in ours.named_parameters()], lr=3e-2, weight_decay=0.1)
    crit = CrossEntropyLoss()
    data = torch.Generator().manual_seed(3)
    text = torch.randperm(V, generator=data)  # a "text" that repeats, so the next character can be learned
    state = state_t = None
    losses = []
    for step in range(10):
        start = torch.randint(0, V, (4, 1), generator=data)
        chars = text[(start + torch.arange(13)) % V]  # (4, 13)
        idx, target = chars[:, :-1], chars[:, 1:].reshape(-1)  # (N, T), (N*T,)
        opt.zero_grad()
        logits, state = ours(idx, state)
        loss = crit(logits.reshape(-1, V), target)
        ours.backward(crit.backward().view(logits.shape))
        opt.step()
        opt_t.zero_grad()
        logits_t, state_t = twin(idx, state_t)
        loss_t = torch.nn.functional.cross_entropy(logits_t.reshape(-1, V), target)
        loss_t.backward()
        opt_t.step()
        state_t = tuple(s.detach() for s in state_t)  # truncated BPTT: the state is carried, not differentiated
        assert abs(loss.item() - loss_t.item()) <= 1e-9 * abs(loss_t.item()), (step, loss.item(), loss_t.item())
        losses.append(loss.item())
    tsd = twin.state_dict()
    for name, t in ours.state_dict().items():
        assert (t - tsd[name]).abs().max() <= 1e-9 * max(tsd[name].abs().max().item(), 1e-3), name
    assert losses[-1] < losses[0]  # it learned something (the weights moved the same way in both)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_conversion_both_ways(cell):
    torch.manual_seed(1)
    twin = TorchRecurrentLM(V, E, H, num_layers=2, cell=cell)
    ours = from_torch(twin)
    assert isinstance(ours, RecurrentLM) and ours.cell == cell
    idx = torch.randint(0, V, (3, 5))
    twin.eval(), ours.eval()
    logits, _ = ours(idx)
    assert (logits - twin(idx)[0].detach()).abs().max() < 1e-5
    back = ours.to_torch()
    assert type(back) is TorchRecurrentLM
    assert all(torch.equal(back.state_dict()[k], v) for k, v in twin.state_dict().items())


def test_unbatched_ids_and_state_gradients():
    ours, twin = twins("gru")
    idx = torch.randint(0, V, (7,))  # (T,)
    h0 = torch.randn(2, H, dtype=f64)
    logits, h = ours(idx, h0)
    assert logits.shape == (7, V) and h.shape == (2, H)
    dlogits = torch.randn_like(logits)
    none, dh0 = ours.backward(dlogits)
    h0a = h0.clone().requires_grad_()
    lt, _ = twin(idx, h0a)
    (lt * dlogits).sum().backward()
    assert none is None and (dh0 - h0a.grad).abs().max() < 1e-12
    with pytest.raises(RuntimeError, match="backward called before forward"):
        ours.backward(dlogits)


def test_bad_arguments():
    with pytest.raises(ValueError, match="cell must be one of 'lstm', 'gru', 'rnn', got 'transformer'"):
        RecurrentLM(5, 3, 4, cell="transformer")
    with pytest.raises(ValueError, match="vocab_size must be an int >= 1, got 0"):
        RecurrentLM(0, 3, 4)


def test_generate_carries_the_state_and_draws_what_the_twin_draws():
    """Each new character from the carried state equals a full recompute of the sequence so far; the hand-written
    model and its twin sample the same characters from the same seed (float64)."""
    from models import RecurrentLM, next_token

    torch.manual_seed(0)
    model = RecurrentLM(11, 6, 8, num_layers=2, cell="gru", dtype=torch.float64)
    twin = model.to_torch()
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    out = model.generate(prompt, 7, temperature=0.9, top_k=4, generator=torch.Generator().manual_seed(5))
    assert out.shape == (2, 10) and torch.equal(out[:, :3], prompt)
    with torch.no_grad():
        again = twin.generate(prompt, 7, temperature=0.9, top_k=4, generator=torch.Generator().manual_seed(5))
    assert torch.equal(out, again)
    gen = torch.Generator().manual_seed(5)  # the same draws from full recomputes of each prefix
    idx = prompt
    for _ in range(7):
        logits, _ = model(idx)
        idx = torch.cat((idx, next_token(logits[:, -1], 0.9, top_k=4, generator=gen)), dim=1)
    assert torch.equal(idx, out)

"""The GPT with a mixture of experts for each block's MLP (models/gpt.py, layers/moe.py): its hand-written gradients,
the auxiliary load-balancing loss's included, against autograd through its nn.Module twin in float64; train.py with
--n-experts beside the twin; and the settings refused in one line naming their values."""

from __future__ import annotations

import json

import pytest
import torch

import train
from models import GPT, PytorchGPT
from tests.conftest import rel

f64 = torch.float64
SIZE = dict(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=8, dtype=f64)
CASES = [
    dict(n_experts=4, top_k=2, capacity_factor=0.75, aux_coef=0.1),  # tokens dropped
    dict(n_experts=4, top_k=2, capacity_factor=4.0, aux_coef=0.0),  # none dropped, no auxiliary term
    dict(n_experts=3, top_k=1, capacity_factor=1.0, aux_coef=0.05),  # Switch
]


@pytest.mark.parametrize("moe", CASES, ids=["top2-drop", "top2-all", "top1"])
def test_the_moe_gpts_gradients_equal_autograd_of_its_twin(moe):
    torch.manual_seed(0)
    gpt = GPT(**SIZE, **moe)
    twin = gpt.to_torch()
    assert isinstance(twin, PytorchGPT) and twin.config() == gpt.config()
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 13, (3, 8), generator=g)
    dlogits = torch.randn(3, 8, 13, dtype=f64, generator=g)
    logits = gpt(idx)
    aux = gpt.aux_loss()
    gpt.backward(dlogits)
    logits_t = twin(idx)
    aux_t = twin.aux_loss()
    ((logits_t * dlogits).sum() + aux_t).backward()
    assert rel(logits, logits_t) < 1e-13 and rel(aux, aux_t) < 1e-13
    dropped = [block.mlp.dropped for block in gpt.h]
    if moe["capacity_factor"] < 1:
        assert sum(dropped) > 0  # the case exercises the capacity
    if moe["capacity_factor"] * moe["top_k"] >= moe["n_experts"]:
        assert sum(dropped) == 0  # every expert can take every token
    if moe["aux_coef"]:
        assert float(aux) > 0
    for name, p in gpt.named_parameters():
        assert rel(p.grad, twin.get_parameter(name).grad) < 1e-10, name
    back = GPT.from_torch(twin)
    assert back.config() == gpt.config() and torch.equal(back(idx), logits)


def test_the_auxiliary_term_reaches_the_routers_gradient():
    torch.manual_seed(0)
    with_aux, without = GPT(**SIZE, n_experts=4, aux_coef=0.5), GPT(**SIZE, n_experts=4, aux_coef=0.0)
    without.load_state_dict(with_aux.state_dict())
    idx = torch.randint(0, 13, (2, 8), generator=torch.Generator().manual_seed(2))
    for gpt in (with_aux, without):
        gpt.backward(torch.ones_like(gpt(idx)))
    a, b = with_aux.h[0].mlp.router.grad, without.h[0].mlp.router.grad
    assert rel(a - b, a) > 1e-6  # the load-balancing term changes the router's gradient
    # and not the last block's experts' (its term reaches only its router and what is below it)
    assert torch.equal(with_aux.h[-1].mlp.w1.grad, without.h[-1].mlp.w1.grad)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(n_experts=2, top_k=3), "top_k 3 is more than n_experts 2"),
        (dict(n_experts=-1), "n_experts"),
        (dict(n_experts=2, capacity_factor=0.0), "capacity_factor"),
        (dict(n_experts=2, aux_coef=-1.0), "aux_coef"),
    ],
)
def test_bad_moe_settings_are_refused_naming_them(kw, message):
    with pytest.raises(ValueError, match=message):
        GPT(**SIZE, **kw)


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("First Citizen: Before we proceed any further, hear me speak.\nAll: Speak, speak.\n" * 20)
    return path


TINY = [
    "--model",
    "gpt",
    "--n-layer",
    "2",
    "--n-head",
    "2",
    "--n-embd",
    "16",
    "--block-size",
    "16",
    "--batch-size",
    "4",
    "--eval-iters",
    "2",
]


def test_train_py_trains_the_moe_gpt_beside_its_twin(corpus, tmp_path):
    out = tmp_path / "run"
    argv = [*TINY, "--data-file", corpus, "--out", out, "--max-iters", "4", "--eval-interval", "2"]
    argv += ["--dtype", "float64", "--n-experts", "4", "--top-k", "2", "--capacity-factor", "1.0", "--aux-coef", "0.1"]
    assert train.main([str(a) for a in [*argv, "--quiet", "--no-plots"]]) == 0
    summary = json.loads((out / "summary.json").read_text())
    m, t = summary["results"]["manual"], summary["results"]["torch"]
    assert abs(m["train_loss"] - t["train_loss"]) < 1e-12 and abs(m["val_loss"] - t["val_loss"]) < 1e-12
    assert summary["max_param_abs_diff"] < 1e-12
    weights = torch.load(out / "checkpoint.pt", weights_only=True)["models"]["manual"]
    assert weights["transformer.h.1.mlp.w1"].shape == (4, 64, 16)  # K experts, C -> 4C


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--n-experts", "4", "--top-k", "5"], "--top-k 5 is more than --n-experts 4"),
        (["--top-k", "2"], "--top-k applies to a mixture of experts: give --n-experts K > 0"),
        (["--n-experts", "2", "--capacity-factor", "0"], "--capacity-factor 0.0 is out of range"),
        (["--n-experts", "2", "--aux-coef", "-0.5"], "--aux-coef -0.5 is out of range"),
        (["--n-experts", "2", "--dtype", "bfloat16"], "--n-experts 2 with --dtype bfloat16 is not supported"),
    ],
)
def test_train_py_refuses_bad_moe_settings_in_one_line(corpus, tmp_path, capsys, argv, message):
    assert train.main([str(a) for a in [*TINY, "--data-file", corpus, "--out", tmp_path / "x", *argv]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1]

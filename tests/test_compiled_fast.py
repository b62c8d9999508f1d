"""The compiled step with guard evaluation skipped (GuardFreeStep) equals the eager step in float64 over ten steps,
and stays equal when something a skipped guard would have caught changes mid-run (a learning rate written as a
Python float, a dropout probability, a frozen parameter, a smaller batch), where skipping torch.compile's guards
unconditionally does not."""

import pytest
import torch

import optimizers
from layers import Dropout, Linear, ReLU, Sequential
from tests.conftest import train_step
from training.compiled_fast import GuardFreeStep

pytestmark = pytest.mark.slow
f64 = torch.float64


def _setup(seed=0):
    torch.manual_seed(seed)
    model = Sequential(Linear(6, 8, dtype=f64), ReLU(), Dropout(0.0), Linear(8, 3, dtype=f64))
    opt = optimizers.Adam(model.parameters(), lr=0.01)
    return model, opt, train_step(model, opt)


def _batches(n=10, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(5, 6, dtype=f64, generator=g), torch.randint(0, 3, (5,), generator=g)) for _ in range(n)]


def _change(i, model, opt, batches, change):
    """Apply ``change`` before step ``i`` (5): the run's own mid-run change."""
    if i != 5:
        return
    if change == "lr":
        opt.param_groups[0]["lr"] = 0.05  # a Python float: the graph has it as a constant
    elif change == "dropout":
        model[2].p = 0.5
    elif change == "freeze":
        model[0].weight.requires_grad_(False)
        model[0].weight.grad = None
    elif change == "batch":
        x, y = batches[i]
        batches[i] = (x[:3], y[:3])


def _run(kind, change=None):
    torch._dynamo.reset()
    model, opt, step = _setup()
    batches = _batches()
    runner = step
    if kind == "fast":
        runner = GuardFreeStep(torch.compile(step, fullgraph=True, backend="eager"), model, opt)
    elif kind == "unsafe":
        compiled = torch.compile(step, fullgraph=True, backend="eager")

        def runner(x, y, calls=[0]):  # noqa: B006 -- counts the calls
            calls[0] += 1
            if calls[0] <= 3:
                return compiled(x, y)
            with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                return compiled(x, y)

    losses = []
    for i in range(len(batches)):
        _change(i, model, opt, batches, change)
        torch.manual_seed(100 + i)  # the same dropout masks in every run
        losses.append(runner(*batches[i]).item())
    return losses, [p.detach().clone() for p in model.parameters()], runner


@pytest.mark.parametrize("change", [None, "lr", "dropout", "freeze", "batch"])
def test_equal_to_eager_over_ten_steps(change):
    losses, params, _ = _run("eager", change)
    fast_losses, fast_params, runner = _run("fast", change)
    torch.testing.assert_close(fast_losses, losses, rtol=1e-10, atol=1e-12)
    for a, b in zip(fast_params, params, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert runner.skipped >= 4  # the guards were skipped where nothing had changed


def test_skipping_every_guard_gives_a_wrong_answer_the_fingerprint_prevents():
    _, params, _ = _run("eager", "lr")
    _, unsafe, _ = _run("unsafe", "lr")
    assert any((a - b).abs().max() > 1e-6 for a, b in zip(unsafe, params, strict=True))  # the new lr was never used


def test_warmup_must_be_a_positive_int():
    with pytest.raises(ValueError, match="warmup must be an int >= 1"):
        GuardFreeStep(lambda: None, Sequential(Linear(2, 2)), None, warmup=0)


def test_train_py_compile_fast_equals_the_eager_run(tmp_path):
    """`train.py --compile fast` (the GPT on a small corpus, float64, ten steps): its weights and losses equal the
    eager run's to 1e-10."""
    import json

    import train

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("First Citizen: Before we proceed any further, hear me speak.\n" * 40)
    common = [
        "--data-file",
        corpus,
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
        "--max-iters",
        "10",
        "--eval-interval",
        "5",
        "--dtype",
        "float64",
        "--impl",
        "manual",
        "--quiet",
        "--no-plots",
    ]
    for name, extra in (("eager", []), ("fast", ["--compile", "fast"])):
        assert train.main([str(a) for a in (*common, "--out", tmp_path / name, *extra)]) == 0
    runs = {n: json.loads((tmp_path / n / "summary.json").read_text())["results"]["manual"] for n in ("eager", "fast")}
    for key in ("train_loss", "val_loss"):
        assert abs(runs["fast"][key] - runs["eager"][key]) <= 1e-10 * abs(runs["eager"][key])
    weights = [
        torch.load(tmp_path / n / "checkpoint.pt", weights_only=True)["models"]["manual"] for n in ("eager", "fast")
    ]
    for k in weights[0]:
        torch.testing.assert_close(weights[1][k], weights[0][k], rtol=1e-10, atol=1e-13, msg=k)


def test_compile_fast_is_a_choice_of_compile():
    from train import parse_config

    assert parse_config(["--compile", "fast"]).run.compile_fast and parse_config(["--compile"]).run.compile
    assert not parse_config(["--compile"]).run.compile_fast

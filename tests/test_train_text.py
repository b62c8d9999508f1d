"""train.py on text: the GPT and the recurrent language models beside their twins, resume, refusals, sample.py."""

from __future__ import annotations

import json
import math

import pytest
import torch

import sample
import train
import training
from training.config import TrainConfig
from training.schedule import warmup_cosine
from training.tasks.corpus import CORPORA, load_text

LINES = [
    "First Citizen: Before we proceed any further, hear me speak.",
    "All: Speak, speak.",
    "First Citizen: You are all resolved rather to die than to famish?",
    "All: Resolved. resolved.",
    "First Citizen: First, you know Caius Marcius is chief enemy to the people.",
]
GPT = [
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
    "--quiet",
    "--no-plots",
]
RNN = [
    "--n-layer",
    "2",
    "--hidden",
    "12",
    "--n-embd",
    "8",
    "--block-size",
    "12",
    "--batch-size",
    "3",
    "--eval-iters",
    "2",
    "--quiet",
    "--no-plots",
]


def run(*argv):
    return train.main([str(a) for a in argv])


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(LINES * 12) + "\n", encoding="utf-8")
    return path


def _weights(path, impl):
    return torch.load(path, weights_only=True)["models"][impl]


def test_gpt_trains_beside_its_twin_in_float64_and_writes_outputs(corpus, tmp_path):
    out = tmp_path / "run"
    assert (
        run(
            "--data-file",
            corpus,
            "--out",
            out,
            "--max-iters",
            "6",
            "--eval-interval",
            "3",
            "--dtype",
            "float64",
            "--dropout",
            "0.1",
            "--warmup-iters",
            "2",
            "--lr-decay-iters",
            "6",
            *GPT[:-1],
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "gpt" and summary["iters"] == 6 and summary["vocab_size"] == len(set(corpus.read_text()))
    assert set(summary["results"]) == {"manual", "torch"}
    m, t = summary["results"]["manual"], summary["results"]["torch"]
    assert abs(m["val_loss"] - t["val_loss"]) < 1e-12 and abs(m["train_loss"] - t["train_loss"]) < 1e-12
    assert math.log(summary["vocab_size"]) - 0.5 < m["val_loss"] < math.log(summary["vocab_size"]) + 0.5
    assert summary["max_param_abs_diff"] < 1e-12  # dropout on: the twin draws the same masks
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rounds = [r for r in recs if r["type"] == "epoch"]
    assert [(r["impl"], r["iter"]) for r in rounds] == [("manual", 3), ("torch", 3), ("manual", 6), ("torch", 6)]
    assert all(r["val_loss"] is not None and r["train_loss"] is not None for r in rounds)
    first = next(r for r in recs if r["type"] == "drift" and "max_grad_rel_diff" in r)
    assert first["max_grad_rel_diff"] < 1e-10
    a, b = _weights(out / "checkpoint.pt", "manual"), _weights(out / "checkpoint.pt", "torch")
    assert a.keys() == b.keys() and "lm_head.weight" in a and "transformer.wte.weight" in a
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-12
    assert torch.equal(a["lm_head.weight"], a["transformer.wte.weight"])  # tied: one tensor, both keys
    assert torch.load(out / "checkpoint.pt", weights_only=True)["vocab"] == sorted(set(corpus.read_text()))
    assert (out / "curves.png").stat().st_size > 0


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_recurrent_models_train_beside_their_twins(corpus, tmp_path, cell):
    out = tmp_path / cell
    assert (
        run(
            "--data-file",
            corpus,
            "--model",
            cell,
            "--out",
            out,
            "--max-iters",
            "4",
            "--eval-interval",
            "2",
            "--dtype",
            "float64",
            "--dropout",
            "0.2",
            *RNN,
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    m, t = summary["results"]["manual"], summary["results"]["torch"]
    assert abs(m["val_loss"] - t["val_loss"]) < 1e-12 and summary["max_param_abs_diff"] < 1e-12


def test_a_recurrent_run_resumes_with_its_own_hidden_size(corpus, tmp_path):
    """--hidden is the recurrent models' too: the checkpoint's (12 here, not lstm's default 256) is the one kept."""
    out = tmp_path / "lstm"
    assert (
        run("--data-file", corpus, "--model", "lstm", "--out", out, "--max-iters", "2", "--eval-interval", "2", *RNN)
        == 0
    )
    assert run("--resume", out / "checkpoint.pt", "--max-iters", "4", "--quiet", "--no-plots") == 0
    assert json.loads((out / "summary.json").read_text())["iters"] == 4


def test_a_resumed_text_run_equals_one_never_stopped(corpus, tmp_path):
    common = ["--data-file", corpus, "--dtype", "float64", "--dropout", "0.1", "--eval-interval", "3", *GPT]
    assert run("--out", tmp_path / "whole", "--max-iters", "6", *common) == 0
    assert run("--out", tmp_path / "half", "--max-iters", "3", *common) == 0
    # the model and the corpus file come from the checkpoint; only the length is given
    assert run("--resume", tmp_path / "half" / "checkpoint.pt", "--max-iters", "6", "--quiet", "--no-plots") == 0
    whole, half = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("whole", "half"))
    for impl in ("manual", "torch"):
        assert whole["results"][impl]["val_loss"] == half["results"][impl]["val_loss"]
        w, h = _weights(tmp_path / "whole" / "checkpoint.pt", impl), _weights(tmp_path / "half" / "checkpoint.pt", impl)
        assert all(torch.equal(w[k], h[k]) for k in w)

    def strip(d):
        return [
            {k: v for k, v in json.loads(line).items() if k != "seconds"}
            for line in (tmp_path / d / "metrics.jsonl").read_text().splitlines()
        ]

    assert strip("whole") == strip("half")


def test_resume_refuses_other_text_and_a_shorter_target(corpus, tmp_path, capsys):
    out = tmp_path / "r"
    assert run("--data-file", corpus, "--out", out, "--max-iters", "4", "--eval-interval", "2", *GPT) == 0
    other = tmp_path / "other.txt"
    other.write_text(corpus.read_text().replace("speak", "SPEAK"), encoding="utf-8")
    capsys.readouterr()
    assert run("--resume", out / "checkpoint.pt", "--data-file", other, "--max-iters", "6") == 2
    assert "other data than --data-file" in capsys.readouterr().err
    assert run("--resume", out / "checkpoint.pt", "--max-iters", "2") == 2
    assert "already holds 4 iterations" in capsys.readouterr().err


@pytest.mark.parametrize(
    "content, says",
    [
        (b"", "the file is empty"),
        (b"caf\xe9 au lait, not UTF-8 at all " * 10, "not UTF-8"),
        (b"too short for two windows", "too few for windows of --block-size"),
    ],
)
def test_a_bad_corpus_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, content, says):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    out = tmp_path / "never"
    assert run("--data-file", path, "--out", out, *GPT) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and str(path) in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--epochs", "3"], "--epochs applies to the image models"),
        (["--n-embd", "15"], "not divisible by --n-head"),
        (["--eval-iters", "0"], "--eval-iters"),
        (["--cuda-graph"], "--cuda-graph: cannot capture"),
        (["--sanity"], "--sanity checks the image models"),
    ],
)
def test_text_runs_refuse_what_does_not_apply(corpus, tmp_path, capsys, argv, says):
    assert run("--data-file", corpus, "--out", tmp_path / "never", *GPT, *argv) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_text_runs_under_torchrun_refuse_dropout_and_too_small_a_batch(corpus):
    from training.parallel.distributed import DistInfo
    from training.tasks.text import TextTask

    c = TrainConfig(model="gpt", data_file=corpus, block_size=8, dropout=0.1)
    task = TextTask(c.model, c.data, c.run, torch.device("cpu"), print)
    with pytest.raises(training.UsageError, match="--dropout 0.1 under torchrun"):
        task.check(DistInfo(rank=0, world_size=2))
    c = TrainConfig(model="gpt", data_file=corpus, block_size=8, batch_size=3)
    task = TextTask(c.model, c.data, c.run, torch.device("cpu"), print)
    with pytest.raises(training.UsageError, match="--batch-size 3 windows cannot be shared by 4 processes"):
        task.check(DistInfo(rank=0, world_size=4))
    task.check(DistInfo(rank=0, world_size=3))  # one window each


def test_warmup_cosine_is_nanogpts_schedule():
    c = TrainConfig(model="gpt", lr=1e-3, min_lr=1e-4, warmup_iters=100, lr_decay_iters=2000).optim
    assert warmup_cosine(0, c) == pytest.approx(1e-3 / 101)
    assert warmup_cosine(99, c) == pytest.approx(1e-3 * 100 / 101)
    assert warmup_cosine(100, c) == pytest.approx(1e-3)
    assert warmup_cosine(1050, c) == pytest.approx(0.55e-3)  # halfway: the mean of lr and min_lr
    assert warmup_cosine(2000, c) == pytest.approx(1e-4) and warmup_cosine(5000, c) == 1e-4
    opt = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=c.lr)
    sched = training.schedule.make_scheduler(opt, c, 2000)
    lrs = []
    for _ in range(3):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([warmup_cosine(i, c) for i in range(3)])


def test_the_shipped_corpus_trains_with_no_network_and_credits_its_source():
    path = CORPORA["shakespeare"]
    text = load_text(path, 64)
    assert text.vocab_size > 50 and text.train.shape[0] > 900_000
    readme = (path.parent / "README.md").read_text()
    assert "Open Knowledge Foundation" in readme


def test_sample_py_prints_the_same_text_from_the_model_and_its_twin(corpus, tmp_path, capsys):
    out = tmp_path / "r"
    assert (
        run("--data-file", corpus, "--out", out, "--max-iters", "2", "--eval-interval", "2", "--dtype", "float64", *GPT)
        == 0
    )
    texts = []
    for impl in ("manual", "torch"):
        capsys.readouterr()
        assert (
            sample.main(
                [
                    "--resume",
                    str(out / "checkpoint.pt"),
                    "--prompt",
                    "All:",
                    "--max-new-tokens",
                    "40",
                    "--seed",
                    "3",
                    "--top-k",
                    "5",
                    "--impl",
                    impl,
                ]
            )
            == 0
        )
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] and texts[0].startswith("All:") and len(texts[0]) == len("All:") + 40 + 1
    assert set(texts[0][:-1]) <= set(corpus.read_text())


def test_sample_py_refuses_bad_input_in_one_line(corpus, tmp_path, capsys, tiny):
    out = tmp_path / "r"
    assert run("--data-file", corpus, "--out", out, "--max-iters", "2", "--eval-interval", "2", *GPT) == 0
    capsys.readouterr()
    assert sample.main(["--resume", str(out / "checkpoint.pt"), "--prompt", "ROMEO: \u20ac"]) == 2
    err = capsys.readouterr().err
    assert "--prompt" in err and "'\u20ac'" in err and len(err.strip().splitlines()) == 1
    image = tmp_path / "image"
    with pytest.warns(UserWarning):
        assert (
            run(
                "--data-dir",
                tiny,
                "--out",
                image,
                "--epochs",
                "1",
                "--hidden",
                "8",
                "--depth",
                "1",
                "--no-download",
                "--quiet",
                "--no-plots",
            )
            == 0
        )
    assert sample.main(["--resume", str(image / "checkpoint.pt")]) == 2
    err = capsys.readouterr().err
    assert "image classifier" in err and len(err.strip().splitlines()) == 1
    assert sample.main(["--resume", str(tmp_path / "missing.pt")]) == 2
    assert "no such file" in capsys.readouterr().err
    for flag, value, says in (
        ("--temperature", "inf", "--temperature inf is out of range (need a finite number > 0)"),
        ("--temperature", "nan", "--temperature nan is out of range"),
        ("--temperature", "-1", "--temperature -1.0 is out of range"),
        ("--temperature", "1e-300", "--temperature 1e-300 is too small: the logits divided by it overflow float32"),
        ("--top-k", "0", "--top-k 0 is out of range (an integer >= 1)"),
        ("--max-new-tokens", "-1", "--max-new-tokens -1 is out of range"),
        ("--seed", str(2**64), f"--seed {2**64} is out of range"),
    ):
        assert sample.main(["--resume", str(out / "checkpoint.pt"), f"{flag}={value}"]) == 2, flag
        err = capsys.readouterr().err.strip()
        assert err == f"sample.py: error: {says}" or err.startswith(f"sample.py: error: {says}"), err
        assert len(err.splitlines()) == 1


def test_a_checkpoint_that_cannot_be_read_is_refused_for_itself_before_any_flag(corpus, tmp_path, capsys):
    """--resume with --max-iters and no --model: the checkpoint decides which flags apply, so a truncated, damaged,
    empty or folder --resume is refused as such, not as an image run given a text run's flag."""
    out = tmp_path / "r"
    assert run("--data-file", corpus, "--out", out, "--max-iters", "2", "--eval-interval", "2", *GPT) == 0
    data = (out / "checkpoint.pt").read_bytes()
    bad = {
        "truncated.pt": (data[:-200], "is truncated"),
        "empty.pt": (b"", "is empty"),
        "damaged.pt": (
            data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 1]) + data[len(data) // 2 + 1 :],
            "is damaged",
        ),
    }
    for name, (content, _) in bad.items():
        (tmp_path / name).write_bytes(content)
    (tmp_path / "folder.pt").mkdir()
    capsys.readouterr()
    for name, says in [*((n, s) for n, (_, s) in bad.items()), ("folder.pt", "is a folder")]:
        assert run("--resume", tmp_path / name, "--max-iters", "4") == 2, name
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"train.py: error: --resume {tmp_path / name} {says}") and len(err.splitlines()) == 1, err


def test_eval_iters_all_is_the_mean_loss_over_every_window_of_each_split(corpus, tmp_path):
    out = tmp_path / "r"
    assert (
        run(
            "--data-file",
            corpus,
            "--out",
            out,
            "--max-iters",
            "2",
            "--eval-interval",
            "2",
            "--dtype",
            "float64",
            "--impl",
            "torch",
            *GPT,
            "--eval-iters",
            "all",
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    from models import PytorchGPT

    text = load_text(corpus, 16)
    model = PytorchGPT(
        vocab_size=text.vocab_size, block_size=16, n_layer=2, n_head=2, n_embd=16, bias=False, dtype=torch.float64
    )
    model.load_state_dict(ckpt["models"]["torch"])
    model.eval()
    for split in ("train", "val"):
        data = text.split(split)
        n = (data.shape[0] - 1) // 16  # every non-overlapping window; the tail shorter than one is left out
        x = torch.stack([data[i * 16 : (i + 1) * 16] for i in range(n)])
        y = torch.stack([data[i * 16 + 1 : (i + 1) * 16 + 1] for i in range(n)])
        with torch.no_grad():
            want = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
        assert summary["results"]["torch"][f"{split}_loss"] == pytest.approx(want, rel=1e-12), split


def test_a_non_finite_loss_names_the_iteration_and_keeps_the_last_checkpoint(corpus, tmp_path, capsys):
    out = tmp_path / "r"
    diverge = ["--optimizer", "sgd", "--lr", "1e30", "--warmup-iters", "0", "--log-interval", "1"]
    assert run("--data-file", corpus, "--out", out, "--max-iters", "4", "--eval-interval", "2", *diverge, *GPT) == 1
    err = capsys.readouterr().err
    assert "manual: the training loss became" in err and "at iteration 2;" in err  # step 1's update blew it up
    assert not (out / "checkpoint.pt").exists()  # no round was completed

"""train.py's command line: every bad argument or unusable path is one line naming it, exit status 2."""

import re

import pytest
import torch

import train
import training
from training import TrainConfig, UsageError
from training.config import SETTINGS


def run(*argv):
    return train.main([str(a) for a in argv])


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--epochs", "-1"], "--epochs -1 is out of range (at least 1)"),
        (["--batch-size", "0"], "--batch-size 0 is out of range (at least 1)"),
        (["--optimizer", "adamax"], "unknown optimizer 'adamax'; known: sgd, rmsprop, adam, adamw, adagrad"),
        (["--lr", "-1"], "--lr -1.0 is out of range"),
        (["--lr", "nan"], "--lr nan is out of range"),
        (["--clip-grad", "0"], "--clip-grad 0.0 is out of range (need a positive number)"),
        (["--val-split", "-3"], "--val-split -3 is out of range (a count of samples is at least 0)"),
        (
            ["--val-split", "1.0"],
            "--val-split 1.0 is out of range (a fraction must be in [0, 1); for a count of samples "
            "give an integer, such as 6000)",
        ),
        (
            ["--val-split", "150%"],
            "argument --val-split: invalid value '150%': give a count of samples (6000), a fraction "
            "in [0, 1) (0.1) or a percentage below 100% (10%)",
        ),
        (["--val-split", "ten"], "argument --val-split: invalid value 'ten': give a count of samples (6000)"),
        (["--dataset", "cifar"], "argument --dataset: invalid choice: 'cifar'"),
        (["--epochs", "two"], "argument --epochs: invalid int value: 'two'"),
        (["--momentum", "0.9"], "--momentum applies to sgd and rmsprop, not adam"),
        (["--device", "tpu"], "--device 'tpu' is not a device"),
        (["--device", "meta"], "--device meta: only cpu and cuda are supported, not meta"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--seed", str(2**64)], f"--seed {2**64} is out of range (an integer from -2**63 to 2**64 - 1)"),
        (["--lr", "1e300"], "--lr 1e+300 is out of range (at most 3.4e+38: the weights are float32)"),
        (
            ["--lr", "1e39", "--dtype", "bfloat16"],
            "--lr 1e+39 is out of range (at most 3.4e+38: the weights are float32)",
        ),
        (["--dist-timeout", "inf"], "--dist-timeout inf is out of range (need seconds > 0 and at most 1e+07)"),
        (["--dist-timeout", "1e300"], "--dist-timeout 1e+300 is out of range"),
        (["--out", ""], "argument --out: is empty; give a path"),
        (["--data-dir", ""], "argument --data-dir: is empty; give a path"),
        (["--resume", ""], "argument --resume: is empty; give a path"),
        (["--model", "cnn", "--hidden", "64"], "--hidden applies to --model mlp, lstm or gru only, not --model cnn"),
        (
            ["--model", "cnn", "--depth", "3"],
            "--depth applies to --model mlp only, not --model cnn",
        ),  # the default, given
        (["--threads", "0"], "--threads 0 is out of range (at least 1)"),
    ],
)
def test_bad_arguments_exit_2_with_one_line_naming_the_problem(argv, match, capsys):
    assert run(*argv) == 2
    err = capsys.readouterr().err.strip()
    assert match in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_exits_2(capsys):
    assert run("--device", "cuda") == 2
    assert "--device cuda asked for CUDA, but torch" in capsys.readouterr().err


def test_unwritable_output_folder_is_one_line_before_any_data_is_read(tmp_path, capsys):
    # /proc refuses new folders; the data folder is empty, so reaching the data would be a different error.
    assert run("--out", "/proc/forbidden", "--data-dir", tmp_path, "--no-download") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("train.py: error: --out /proc/forbidden: cannot write there") and len(err.splitlines()) == 1


def test_out_is_a_file(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert run("--out", f, "--data-dir", tmp_path, "--no-download") == 2
    assert f"--out {f}: cannot write there" in capsys.readouterr().err


def test_data_dir_that_is_a_file_is_one_line(tmp_path, capsys):
    assert run("--data-dir", "/etc/passwd", "--out", tmp_path / "o") == 2
    err = capsys.readouterr().err.strip()
    assert err == "train.py: error: --data-dir /etc/passwd is not a folder"


def test_flags_map_onto_the_config_and_remember_what_was_given():
    config = train.parse_config(["--optimizer", "adam", "--no-download", "--epochs", "3"])
    assert config.optim.optimizer == "adam" and config.data.download is False and config.run.epochs == 3
    assert config.given == {"optimizer", "download", "epochs"}  # adam is the default, yet it was given
    assert train.parse_config([]).given == frozenset()
    # Every flag but --sanity lands on the setting of its name (--no-x on x), and every setting has its flag.
    dests = {a.dest for a in train.build_parser()._actions if a.dest != "help"}
    assert dests == set(SETTINGS) | {"sanity"}
    assert {
        a.option_strings[0] for a in train.build_parser()._actions if a.dest in ("download", "plots", "sync_bn")
    } == {"--no-download", "--no-plots", "--no-sync-bn"}


@pytest.mark.parametrize(
    "given,held_out",
    [(None, 30), ("0.1", 30), ("10%", 30), ("30", 30), ("0.41", 123), ("12.5%", 37), ("0", 0), ("0%", 0)],
)
def test_val_split_takes_a_count_a_fraction_or_a_percentage_as_its_help_says(tiny, given, held_out):
    """--val-split 0.1 is a fraction, as --help's "default: 10%" says, not an "invalid int value"."""
    help_text = " ".join(train.build_parser().format_help().split())
    assert "a count (6000), a fraction (0.1) or a percentage (10%) of them (default: 10%; 0: none)" in help_text
    config = train.parse_config(
        ["--data-dir", str(tiny), "--no-download"] + ([] if given is None else ["--val-split", given])
    )
    data = training.load_data(config.data, torch.device("cpu"), torch.float32, say=lambda *a: None)
    assert data.train_x.shape[0] == 300 - held_out  # 0.41 of 300 is 123, though 0.41 * 300 is 122.99999999999999
    assert (data.val_x is None) if held_out == 0 else data.val_x.shape[0] == held_out


def test_a_val_split_that_leaves_nothing_to_train_on_is_one_line(tiny, capsys):
    assert run("--data-dir", tiny, "--val-split", "300", "--no-download", "--quiet", "--no-plots", "--dry-run") == 2
    err = capsys.readouterr().err.strip()
    assert err == "train.py: error: --val-split 300 holds out 300 of the 300 training samples, leaving none to train on"


def test_seeds_at_the_ends_of_torchs_range_train(tiny, tmp_path):
    """torch.manual_seed takes -2**63 .. 2**64 - 1; the seeds derived from --seed (batches, epochs) wrap there."""
    for seed in (2**64 - 1, -(2**63)):
        out = tmp_path / str(seed)
        assert (
            run(
                "--data-dir",
                tiny,
                "--out",
                out,
                "--seed",
                seed,
                "--limit-train",
                "64",
                "--epochs",
                "1",
                "--hidden",
                "8",
                "--depth",
                "1",
                "--no-download",
                "--quiet",
                "--no-plots",
                "--model",
                "mlp",
            )
            == 0
        )
        assert (out / "checkpoint.pt").is_file()


def test_help_states_every_default_once():
    parser = train.build_parser()
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.dest == "help":
            continue
        text = formatter._expand_help(action)
        assert text.count("(default") <= 1 and "(default: None)" not in text, text
        s = SETTINGS.get(action.dest, (None, None))[1]
        if s is not None and s.varies:  # each model's default named, from the one declaration
            assert all(str(v) in text or f"{v:g}" in text for v in s.default.values.values()), text
        elif s is not None and s.default is not None and s.default is not False and s.form != "negated":
            assert f"(default: {s.default}" in text, text  # switches are off unless given, --no-x's are on
    assert "fashion-mnist (the default for the image models)" in " ".join(
        parser.format_help().split()
    )  # the install's data


def test_threads_sets_torch_and_the_start_up_line_says_so(tiny, tmp_path, capsys):
    before = torch.get_num_threads()
    try:
        assert (
            run(
                "--threads",
                "1",
                "--data-dir",
                tiny,
                "--out",
                tmp_path / "run",
                "--epochs",
                "1",
                "--hidden",
                "8",
                "--no-download",
                "--no-plots",
            )
            == 0
        )
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    first = capsys.readouterr().out.splitlines()[0]
    assert "fashion-mnist: 270 train" in first and "(float32; 1 CPU thread)" in first, first


def test_config_validates_in_one_place():
    with pytest.raises(UsageError, match="--hidden 0 is out of range"):
        TrainConfig(hidden=0)
    with pytest.raises(UsageError, match="--epochs must be an integer, got 2.5"):
        TrainConfig(epochs=2.5)
    with pytest.raises(UsageError, match="unknown impl 'jax'"):
        TrainConfig(impl="jax")
    with pytest.raises(UsageError, match="--out is empty; give a path"):
        TrainConfig(out="")
    with pytest.raises(UsageError, match="--hidden applies to --model mlp, lstm or gru only"):
        TrainConfig(model="cnn", hidden=16)  # a library caller's value that the CNN would ignore
    assert TrainConfig(model="cnn").model.depth == 3  # the defaults themselves are not an error
    assert TrainConfig(model="cnn").model.hidden is None and TrainConfig(model="gru").model.hidden == 256
    assert TrainConfig(optimizer="SGD").optim.optimizer == "sgd"
    assert TrainConfig(impl="all").run.impls == ("manual", "engine", "torch")
    with pytest.raises(UsageError, match="unknown settings: hiden"):
        TrainConfig(hiden=16)  # a misspelled setting is refused, never a new one
    with pytest.raises(UsageError, match="--augment must be True or False, got 'yes'"):
        TrainConfig(augment="yes")


def test_training_imports_nothing_from_the_command_line():
    import subprocess
    import sys

    code = (
        "import sys, training, training.trainer, training.parallel.distributed, training.parallel.allreduce; "
        "sys.exit('train' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def _help_entries(text: str) -> tuple[set, dict, list]:
    """--help as (the usage line's bracketed options, option -> its whole entry with help and default, the section
    titles), whitespace and order aside; the thread count of this machine aside."""
    text = re.sub(r"\(\d+\s+here\)", "(N here)", text)
    usage, _, rest = text.partition("\n\n")
    entries, sections, current = {}, [], None
    for line in rest.splitlines():
        if line.startswith("  -"):
            current = line.split()[0].rstrip(",")
            entries[current] = [line]
        elif line and not line.startswith(" "):
            sections.append(line)
            current = None
        elif current is not None:
            entries[current].append(line)
    return (
        set(re.findall(r"\[[^\[\]]+\]", " ".join(usage.split()))),
        {k: " ".join(" ".join(v).split()) for k, v in entries.items()},
        sections,
    )


def test_help_keeps_every_flag_default_and_help_text_of_the_hand_written_parser(monkeypatch):
    """train_help.txt is --help as train.py printed it (80 columns) when every option was written by hand; the flags
    derived from the settings' declarations print the same entries (in their parts' order)."""
    import pathlib

    monkeypatch.setenv("COLUMNS", "80")
    before = _help_entries((pathlib.Path(__file__).parent / "train_help.txt").read_text())
    parser = train.build_parser()
    parser.prog = "train.py"
    now = _help_entries(parser.format_help())
    assert len(before[1]) == 66
    assert now[0] == before[0]
    for flag in before[1].keys() | now[1].keys():
        assert now[1].get(flag) == before[1].get(flag), flag
    assert sorted(now[2]) == sorted(before[2])

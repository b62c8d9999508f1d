"""Argument checks live in one module (layers/checks.py): a bool is never an int or a number, and every refusal
names the owner, the argument, what was wanted and the value given, whichever package raises it."""

import re
from pathlib import Path

import pytest
import torch

import autodiff
from layers import AvgPool2d, Conv2d, Embedding, LayerNorm, Linear, LogSoftmax, Softmax
from layers.checks import check_bool, check_int, check_number, check_probability, is_a
from training.precision.loss_scale import DynamicLossScaler

ROOT = Path(__file__).resolve().parents[1]


def test_is_a_never_counts_a_bool_as_an_int_or_a_number():
    import numbers

    assert is_a(3, int) and is_a(2.5, numbers.Real) and is_a(1j, numbers.Number) and is_a(slice(1), (int, slice))
    assert not is_a(True, int) and not is_a(False, numbers.Real) and not is_a(True, (int, slice))
    assert not is_a("3", int) and not is_a(2.0, int)


@pytest.mark.parametrize(
    "kwargs, value, message",
    [
        ({}, 0, "L: n must be an int >= 1, got 0"),
        ({"lo": None}, True, "L: n must be an int, got True"),
        ({"lo": -4, "hi": 3}, 4, r"L: n must be an int in \[-4, 3\], got 4"),
        ({"lo": None, "hi": 3}, 4, "L: n must be an int <= 3, got 4"),
        ({"why": " (the reason)"}, 2.0, r"L: n must be an int >= 1 \(the reason\), got 2.0"),
    ],
)
def test_check_int_says_the_bounds_the_reason_and_the_value(kwargs, value, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        check_int("L", "n", value, **kwargs)


def test_the_shared_checks_return_what_they_accept():
    assert check_int("L", "n", -4, lo=-4, hi=3) == -4 and check_bool("L", "f", False) is False
    assert check_number("L", "x", 2, 0.0, lo_open=True) == 2.0 and check_probability("L", "p", 1) == 1.0
    with pytest.raises(TypeError, match="^L: f must be a bool, got 1$"):
        check_bool("L", "f", 1, error=TypeError)
    with pytest.raises(ValueError, match=r"^L: p must be a probability in \[0, 1\], got True$"):
        check_probability("L", "p", True)
    with pytest.raises(ValueError, match=r"^L: x must be a finite number in \(0.0, 1.0\), got 1.0$"):
        check_number("L", "x", 1.0, 0.0, 1.0, lo_open=True, hi_open=True)


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: Embedding(4, 3, padding_idx=True),
            r"Embedding: padding_idx must be an int in \[-4, 3\] \(the table "
            r"has 4 rows\), got True",
        ),
        (
            lambda: AvgPool2d(2, divisor_override=True),
            "AvgPool2d: divisor_override must be None or a non-zero int, got True",
        ),
        (lambda: Conv2d(1, 1, True), "Conv2d: kernel_size must be an int >= 1 or a pair of them, got True"),
        (lambda: LayerNorm([3, False]), r"LayerNorm: normalized_shape must be an int >= 1 .*got \[3, False\]"),
        (lambda: Softmax(True), "Softmax: dim must be an int, got True"),
        (lambda: LogSoftmax(None), r"LogSoftmax: dim must be an int \(torch's implicit dim=None .*got None"),
        (
            lambda: DynamicLossScaler(init_scale=True),
            r"DynamicLossScaler: init_scale must be a finite number in "
            r"\(0.0, inf\], got True",
        ),
        (lambda: DynamicLossScaler(growth_factor=1), r"growth_factor must be a finite number in \(1.0, inf\], got 1"),
        (
            lambda: DynamicLossScaler(backoff_factor=float("nan")),
            r"backoff_factor must be a finite number in "
            r"\(0.0, 1.0\), got nan",
        ),
    ],
)
def test_a_layer_refuses_a_bool_or_a_bad_value_naming_it(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_frozen_flag_must_be_a_bool():
    with pytest.raises(TypeError, match="Linear.requires_grad_: requires_grad must be a bool, got 0"):
        Linear(2, 3).requires_grad_(0)


def test_the_engine_takes_a_number_but_not_a_bool_as_an_operand():
    a = autodiff.Tensor(torch.ones(2, dtype=torch.float64), requires_grad=True)
    assert torch.equal((a + 2).data, torch.full((2,), 3.0, dtype=torch.float64))
    for op in (lambda: a + True, lambda: a**True):
        with pytest.raises(TypeError, match="cannot combine an autodiff Tensor with bool"):
            op()


def test_no_package_rolls_its_own_bool_exclusion():
    """``isinstance(v, bool) or not isinstance(v, int)`` and its variants are ``is_a`` / ``check_int`` /
    ``check_number``, the command line's checks (training/config*.py) included."""
    allowed = {"layers/checks.py"}
    pattern = re.compile(
        r"isinstance\([^()]*,\s*bool\)\s*or\s*not\s+isinstance|and\s+not\s+isinstance\([^()]*,\s*bool\)"
    )
    found = []
    for package in ("layers", "losses", "models", "optimizers", "training", "autodiff", "checking", "monitoring"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel not in allowed:
                found += [
                    f"{rel}:{i}" for i, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)
                ]
    assert not found, found


def test_the_command_lines_refuse_a_bool_where_a_count_belongs(tmp_path):
    from training.errors import UsageError
    from training.storage.checkpoint import check_fields
    from training.tasks.sampling import sample_text

    with pytest.raises(UsageError, match=r"--max-new-tokens True is out of range \(an integer >= 0\)"):
        sample_text(tmp_path / "none.pt", "a", max_new_tokens=True)
    ckpt = {"epoch": 1, "config": {}, "models": {}, "optimizers": {}, "rng": {}, "records": [{"epoch": True}]}
    with pytest.raises(UsageError, match=r"'records\[0\]' is of epoch True, outside the checkpoint's epochs 1..1"):
        check_fields(ckpt, tmp_path / "c.pt")
    with pytest.raises(UsageError, match="'epoch' is of type bool, not int"):
        check_fields({**ckpt, "epoch": True}, tmp_path / "c.pt")


@pytest.mark.parametrize(
    "field,value,words",
    [
        ("lr", True, r"--lr True is out of range"),
        ("dist_timeout", True, r"--dist-timeout True is out of range"),
        ("seed", True, r"--seed True is out of range"),
        ("zero", 1.0, r"--zero 1.0: the ZeRO stage is 0"),
        ("tensor_parallel", True, r"--tensor-parallel True is out of range"),
        ("dropout", False, r"--dropout False is out of range"),
        ("epochs", True, r"--epochs must be an integer, got True"),
    ],
)
def test_a_training_config_refuses_a_bool_or_float_where_a_number_or_stage_belongs(field, value, words):
    from training import TrainConfig
    from training.errors import UsageError

    with pytest.raises(UsageError, match=words):
        TrainConfig(**{field: value})

"""Augmentation (training/tasks/augment.py) and learning-rate schedules (training/schedule.py)."""

import pytest
import torch

from optimizers import SGD
from training import TrainConfig
from training.schedule import make_scheduler
from training.tasks.augment import flip_and_shift


def test_each_image_is_itself_maybe_mirrored_and_shifted():
    torch.manual_seed(0)
    x = torch.randn(64, 2, 6, 5, dtype=torch.float64)
    out = flip_and_shift(x, torch.Generator().manual_seed(3), pad=2, fill=-7.0)
    assert out.shape == x.shape
    again = flip_and_shift(x, torch.Generator().manual_seed(3), pad=2, fill=-7.0)
    assert torch.equal(out, again)  # the generator decides everything
    seen_flip = seen_shift = 0
    for i in range(64):
        matches = []
        for flip in (False, True):
            img = x[i].flip(2) if flip else x[i]
            padded = torch.nn.functional.pad(img, (2, 2, 2, 2), value=-7.0)
            matches += [
                (flip, dy, dx)
                for dy in range(5)
                for dx in range(5)
                if torch.equal(padded[:, dy : dy + 6, dx : dx + 5], out[i])
            ]
        assert matches, f"image {i} is not a flip/shift of its input"
        flip, dy, dx = matches[0]
        seen_flip += flip
        seen_shift += (dy, dx) != (2, 2)
    assert 16 < seen_flip < 48 and seen_shift > 40  # both kinds of change happen, per sample


def test_flip_and_shift_wants_images():
    with pytest.raises(ValueError, match=r"expected images \(N, C, H, W\), got shape \(3, 784\)"):
        flip_and_shift(torch.zeros(3, 784), torch.Generator())


@pytest.mark.parametrize("schedule", ["cosine", "onecycle"])
def test_schedules_peak_at_lr_and_end_near_zero(schedule):
    config = TrainConfig(schedule=schedule, lr=0.1, epochs=3, optimizer="sgd")
    w = torch.zeros(2)
    w.grad = torch.zeros(2)
    opt = SGD([w], lr=0.1)
    sched = make_scheduler(opt, config.optim, 30)
    lrs = []
    for _ in range(30):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert max(lrs) == pytest.approx(0.1, rel=1e-3) and lrs[-1] < 0.01
    assert make_scheduler(opt, TrainConfig().optim, 10) is None

"""A norm layer's eps is refused where torch refuses it: BatchNorm's eps must be positive when it normalises by
batch statistics (training, or without running statistics), and may be 0 in eval; LayerNorm takes eps=0 as
torch does."""

import pytest
import torch
from torch import nn

from layers import BatchNorm1d, BatchNorm2d, LayerNorm, from_torch

F64 = torch.float64


@pytest.mark.parametrize("cls, shape", [(BatchNorm1d, (4, 3)), (BatchNorm1d, (4, 3, 5)), (BatchNorm2d, (4, 3, 2, 2))])
@pytest.mark.parametrize("running", [True, False])
def test_batchnorm_eps_zero_is_refused_where_torch_refuses_it(cls, shape, running):
    x = torch.ones(shape, dtype=F64)  # a constant channel: 0/0 with eps=0
    theirs = cls.torch_class(3, eps=0.0, track_running_stats=running, dtype=F64)
    ours = from_torch(theirs)
    with pytest.raises(ValueError, match="eps must be positive"):
        theirs(x)
    with pytest.raises(
        ValueError,
        match=rf"{cls.__name__}\(3, eps=0.0.*: eps must be positive to normalise by batch "
        rf"statistics .*got eps=0.0",
    ):
        ours(x)
    theirs.eval(), ours.eval()
    if running:  # the running variance (1) keeps eval's division finite: torch goes on, and so does handgrad
        torch.testing.assert_close(ours(x), theirs(x).detach(), rtol=1e-15, atol=0)
    else:
        with pytest.raises(ValueError, match="eps must be positive"):
            theirs(x)
        with pytest.raises(ValueError, match="got eps=0.0"):
            ours(x)


def test_a_negative_eps_is_refused_naming_it():
    with pytest.raises(ValueError, match="batch_norm eps must be non-negative"):
        nn.BatchNorm1d(3, eps=-1e-5).eval()(torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"BatchNorm1d: eps must be a finite number in \[0.0, inf\], got -1e-05"):
        BatchNorm1d(3, eps=-1e-5)
    ours = BatchNorm2d(3)
    ours.eps = 0  # set after construction: still refused in the forward
    with pytest.raises(ValueError, match="got eps=0"):
        ours(torch.randn(2, 3, 2, 2))


def test_layernorm_eps_zero_is_torchs_answer():
    x = torch.randn(4, 3, dtype=F64)
    theirs = nn.LayerNorm(3, eps=0.0, dtype=F64)
    torch.testing.assert_close(from_torch(theirs)(x), theirs(x).detach(), rtol=1e-13, atol=1e-13)
    assert LayerNorm(3, eps=0.0)(torch.ones(2, 3)).isnan().all() == theirs(torch.ones(2, 3, dtype=F64)).isnan().all()

"""A checkpoint written before Linear weights were kept as (out, in) -- formats 1 to 3, whose optimizer state for a
Linear weight was (in, out) -- resumes as the run would have gone on: the state is transposed on load, with a note."""

import pytest
import torch

import training.storage.checkpoint
from tests.test_train import FAST, _run_first_epoch_only, run


def as_format_3(path, linear_weight_indices):
    """Rewrite a checkpoint as format 3 wrote it: the manual optimizer's state of each Linear weight transposed."""
    ckpt = torch.load(path, weights_only=True)
    ckpt["format"] = "handgrad-train-3"
    state = ckpt["optimizers"]["manual"]["state"]
    for i in linear_weight_indices:
        state[i] = {
            k: (v.t().contiguous() if isinstance(v, torch.Tensor) and v.dim() == 2 else v) for k, v in state[i].items()
        }
    path.unlink()
    training.storage.checkpoint.save_checkpoint(path, ckpt)


@pytest.mark.parametrize("optimizer", [["adam"], ["sgd", "--momentum", "0.9"]], ids=["adam", "sgd"])
def test_a_format_3_checkpoint_resumes_equal_to_an_uninterrupted_run(tiny, tmp_path, capsys, optimizer):
    # --hidden 16 --depth 2: 784 -> 16 -> 16 -> 10, so one Linear weight is square (16, 16): a transposed state of
    # it would load without a shape error and train wrong
    common = ["--data-dir", tiny, "--dtype", "float64", "--optimizer", *optimizer, "--impl", "both", *FAST]
    assert run(*common, "--out", tmp_path / "straight", "--epochs", "2") == 0
    _run_first_epoch_only(common, tmp_path / "half")
    ckpt_path = tmp_path / "half" / "checkpoint.pt"
    as_format_3(ckpt_path, linear_weight_indices=[0, 2, 4])  # layers.{0,1,2}.weight: every other parameter
    capsys.readouterr()
    assert run("--resume", ckpt_path, "--data-dir", tiny, "--no-download", "--no-plots") == 0
    out = capsys.readouterr().out
    assert "written before handgrad kept Linear weights as (out, in)" in out and "3 Linear weight(s)" in out
    a = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=True)
    b = torch.load(ckpt_path, weights_only=True)
    assert b["format"] == training.storage.checkpoint.FORMAT
    for name in a["models"]:
        for k, v in a["models"][name].items():
            assert torch.equal(v, b["models"][name][k]), (name, k)

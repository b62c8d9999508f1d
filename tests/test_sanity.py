"""train.py --sanity: the pre-flight table passes for the real models and fails for a broken backward."""

import train
from layers import ReLU


def run(*argv):
    return train.main([str(a) for a in argv])


def test_sanity_passes(tiny, capsys):
    assert run("--sanity", "--data-dir", tiny, "--no-download", "--hidden", "32", "--depth", "2") == 0
    out = capsys.readouterr().out
    for check in ("initial loss", "overfit 20 examples", "gradients vs autograd (float64)", "first-step loss"):
        line = next(ln for ln in out.splitlines() if ln.startswith(check))
        assert line.endswith("PASS"), line
    assert "all checks passed" in out


def test_sanity_catches_a_wrong_backward(tiny, capsys, monkeypatch):
    monkeypatch.setattr(ReLU, "backward", lambda self, dout: dout)  # forgets the mask: a classic bug
    assert run("--sanity", "--data-dir", tiny, "--no-download", "--hidden", "32", "--depth", "2") == 1
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("gradients vs autograd"))
    assert line.endswith("FAIL") and "some checks FAILED" in out

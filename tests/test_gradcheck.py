"""The gradient checker itself: it passes correct layers and catches a wrong one, naming where."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gradcheck
from gradcheck import check_layer
from layers import Linear

ROOT = Path(__file__).resolve().parents[1]


class WrongBiasLinear(Linear):
    """A Linear whose bias gradient is wrong in one element: the checker must point at it."""

    def backward(self, dout, need_input_grad=True):
        dx = super().backward(dout, need_input_grad)
        self.bias.grad[2] += 0.5
        return dx


class DoubleScaleTanh:
    """A user-written layer with a wrong input gradient (factor 2)."""

    def __call__(self, x):
        return self.forward(x)

    def forward(self, x):
        self.out = torch.tanh(x)
        return self.out

    def backward(self, dout):
        return 2 * dout * (1 - self.out ** 2)

    def parameters(self):
        return []


def test_catches_wrong_parameter_gradient_and_names_index():
    torch.manual_seed(0)
    results = {r.tensor: r for r in check_layer(WrongBiasLinear(4, 5, dtype=torch.float64),
                                                 torch.randn(3, 4, dtype=torch.float64))}
    assert results["x"].passed and results["weight"].passed
    bad = results["bias"]
    assert not bad.passed
    assert bad.worst_index == (2,)
    assert abs(bad.actual - bad.expected - 0.5) < 1e-8
    assert bad.rel_autograd > 1e-3
    assert "bias" in bad.describe() and "(2,)" in bad.describe()


def test_catches_wrong_input_gradient_of_user_layer():
    r, = check_layer(DoubleScaleTanh(), torch.randn(2, 3, dtype=torch.float64))
    assert r.tensor == "x" and not r.passed and r.rel_numeric > 0.4


def test_leaves_existing_grads_alone():
    lin = Linear(2, 2, dtype=torch.float64)
    lin.weight.grad = torch.full((2, 2), 7.0, dtype=torch.float64)
    check_layer(lin, torch.randn(3, 2, dtype=torch.float64))
    assert torch.equal(lin.weight.grad, torch.full((2, 2), 7.0, dtype=torch.float64))
    assert lin.bias.grad is None and not lin.weight.requires_grad


def test_refuses_float32():
    with pytest.raises(ValueError, match="need float64"):
        check_layer(Linear(2, 2), torch.randn(3, 2))


def test_main_checks_everything_and_passes(capsys):
    assert gradcheck.main([]) == 0
    out = capsys.readouterr().out
    for name in ("Linear", "ReLU", "Tanh", "Sigmoid", "Softmax", "Net", "CrossEntropy", "MSE"):
        assert name in out
    assert "FAIL" not in out and " 0 failed" in out


def test_command_line_single_layer_and_unknown_name():
    ok = subprocess.run([sys.executable, "gradcheck.py", "--layer", "Softmax"], cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "Softmax" in ok.stdout and "Linear" not in ok.stdout
    bad = subprocess.run([sys.executable, "gradcheck.py", "--layer", "conv"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown layer 'conv'" in bad.stderr

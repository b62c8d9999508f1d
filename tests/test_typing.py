"""A user's own layer type-checks against ``layers.Layer``: mypy, with the project's configuration, accepts a class
that has forward, backward, parameters and __call__ as the protocol writes them, and reports one whose backward
takes no upstream gradient, on the line that uses it as a Layer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("mypy")
pytestmark = pytest.mark.slow  # one mypy run reads torch's stubs: about 20 s on two busy cores

LAYER = '''
import torch
from torch import Tensor

from layers import Layer


class Scale:
    """y = a x, one learned scalar."""

    def __init__(self) -> None:
        self.a = torch.ones((), requires_grad=True)
        self.x = torch.zeros(())

    def forward(self, x: Tensor) -> Tensor:
        self.x = x
        return self.a * x

    def backward(self{dout}) -> Tensor:
        self.a.grad = (dout * self.x).sum().detach()
        return dout * self.a.detach()

    def parameters(self) -> list[Tensor]:
        return [self.a]

    def __call__(self, x: Tensor) -> Tensor:
        return self.forward(x)


def train_step(layer: Layer, x: Tensor) -> Tensor:
    return layer.backward(layer(x))


dout = torch.ones(3)
train_step(Scale(), torch.ones(3))
'''


@pytest.fixture(scope="module")
def mypy_on_two_layers(tmp_path_factory):
    """One mypy run (the torch stubs are read once) over a conforming layer and one whose backward lost dout."""
    folder = tmp_path_factory.mktemp("typing")
    (folder / "good_layer.py").write_text(LAYER.format(dout=", dout: Tensor"))
    (folder / "bad_layer.py").write_text(LAYER.format(dout=""))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--follow-imports=silent",  # the library's own findings are `mypy`'s job in CI, not this test's
            "--cache-dir",
            str(folder / "cache"),
            "--no-error-summary",
            "good_layer.py",
            "bad_layer.py",
        ],
        cwd=folder,
        env={**os.environ, "MYPYPATH": str(ROOT)},  # the editable install's import hook is invisible to mypy
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode in (0, 1), r.stdout + r.stderr  # 2: mypy itself failed
    return r.stdout.splitlines()


def test_a_layer_with_the_protocols_methods_type_checks(mypy_on_two_layers):
    assert [line for line in mypy_on_two_layers if line.startswith("good_layer.py")] == []


def test_a_layer_whose_backward_takes_no_dout_is_reported(mypy_on_two_layers):
    errors = [line for line in mypy_on_two_layers if line.startswith("bad_layer.py") and ": error:" in line]
    assert any('"Scale"' in e and '"Layer"' in e and "[arg-type]" in e for e in errors), mypy_on_two_layers
    line_of_the_call = LAYER.format(dout="").splitlines().index("train_step(Scale(), torch.ones(3))") + 1
    assert any(e.startswith(f"bad_layer.py:{line_of_the_call}:") for e in errors), mypy_on_two_layers

"""An MLP learns XOR on handgrad's autodiff engine (micrograd's classic demo, on tensors).

    python examples/xor.py
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from autodiff import MLP, Tensor  # noqa: E402
from optimizers import Adam  # noqa: E402

torch.manual_seed(1)
model = MLP([2, 8, 1], dtype=torch.float64)  # Linear(2, 8), tanh, Linear(8, 1)
xs = [[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]]
ys = [0.0, 1.0, 1.0, 0.0]
opt = Adam(model.parameters(), lr=0.05)

for step in range(1, 1001):
    opt.zero_grad()
    preds = [model(Tensor(torch.tensor([x], dtype=torch.float64))) for x in xs]  # one (1, 1) Tensor per sample
    loss = sum(((p - y) ** 2).sum() for p, y in zip(preds, ys)) * 0.25  # mean squared error, scalar Tensors
    loss.backward()
    opt.step()
    if step % 50 == 0 or loss.item() < 0.01:
        print(f"step {step:4d}  loss {loss.item():.5f}")
    if loss.item() < 0.01:
        break

for x, y, p in zip(xs, ys, preds):
    print(f"{x} -> {p.item():+.3f}  (target {y})")
sys.exit(0 if loss.item() < 0.01 else 1)

"""The textbook versions in layers/reference.py compute what the fast layers compute."""
import torch

from layers import Linear, ReLU
from layers import reference as ref
from losses import CrossEntropyLoss
from tests.conftest import rel

f64 = torch.float64


def test_linear_fast_equals_textbook():
    torch.manual_seed(0)
    lin = Linear(7, 5, dtype=f64)
    x, dout = torch.randn(6, 7, dtype=f64), torch.randn(6, 5, dtype=f64)
    out, cache = ref.linear_forward(x, lin.weight, lin.bias)
    dx, dw, db = ref.linear_backward(dout, cache)
    assert rel(lin(x), out) < 1e-14
    assert rel(lin.backward(dout), dx) < 1e-14
    assert rel(lin.weight.grad, dw) < 1e-14 and rel(lin.bias.grad, db) < 1e-14


def test_relu_sign_trick_equals_mask():
    x = torch.randn(50, 40, dtype=f64)
    x[0, :5] = 0.0  # exactly at the kink: both say the gradient is 0 there
    dout = torch.randn_like(x)
    relu = ReLU()
    out, mask = ref.relu_forward(x)
    assert torch.equal(relu(x), out)
    assert torch.equal(relu.backward(dout), ref.relu_backward(dout, mask))


def test_cross_entropy_fast_equals_p_minus_onehot():
    torch.manual_seed(1)
    logits, y = torch.randn(9, 4, dtype=f64) * 5, torch.randint(0, 4, (9,))
    crit = CrossEntropyLoss()
    loss_ref, grad_ref = ref.softmax_cross_entropy(logits, y)
    assert abs(crit(logits, y).item() - loss_ref.item()) < 1e-14 * abs(loss_ref.item()) + 1e-15
    assert rel(crit.backward(), grad_ref) < 1e-14

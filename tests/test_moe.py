"""The mixture of experts by hand (layers/moe.py): its backward, the router's and the auxiliary loss's included,
against central differences and torch.autograd in float64, with and without dropped tokens, top-1 and top-2,
Switch's gates and Mixtral's normalised ones; and against its nn.Module twin (layers/moe_twin.py, dense, written
another way): the output, the auxiliary loss, the dropped count and every gradient."""

import pytest
import torch

from checking import numeric_grad
from layers.moe import MixtureOfExperts, route
from layers.moe_twin import PytorchMoE
from tests.conftest import assert_all_pass, rel

f64 = torch.float64
CASES = [
    dict(top_k=2, capacity_factor=0.75, normalize=False),  # tokens dropped
    dict(top_k=2, capacity_factor=4.0, normalize=True),  # none dropped, Mixtral's gates
    dict(top_k=1, capacity_factor=1.0, normalize=False),  # Switch
]


def _layer(seed=0, aux_coef=0.01, size=(4, 6, 4), **kw):
    torch.manual_seed(seed)
    return MixtureOfExperts(*size, aux_coef=aux_coef, dtype=f64, **kw)


@pytest.mark.parametrize("kw", CASES, ids=["top2-drop", "top2-norm", "top1"])
def test_the_backward_equals_central_differences_and_autograd(kw):
    from gradcheck import check_layer

    # the output's gradient alone (the checker differentiates sum(y * dy)); C = 3, H = 4, K = 3: every entry of the
    # Jacobian is differenced, so the case is small
    layer = _layer(aux_coef=0.0, size=(3, 4, 3), **kw)
    x = torch.randn(2, 4, 3, dtype=f64, generator=torch.Generator().manual_seed(1))
    layer(x)
    if kw["capacity_factor"] < 1:
        assert layer.dropped > 0  # the case exercises the capacity
    assert_all_pass(check_layer(layer, x))


@pytest.mark.parametrize("kw", CASES, ids=["top2-drop", "top2-norm", "top1"])
def test_the_auxiliary_loss_gradient_equals_central_differences(kw):
    layer = _layer(aux_coef=0.3, **kw)
    g = torch.Generator().manual_seed(2)
    x, dy = torch.randn(10, 4, dtype=f64, generator=g), torch.randn(10, 4, dtype=f64, generator=g)

    def total():
        return float((layer(x) * dy).sum() + layer.aux_coef * layer.aux_loss)

    layer(x)
    for p in layer.parameters():
        p.grad = None
    dx = layer.backward(dy)
    assert rel(dx, numeric_grad(total, x)) < 1e-7
    with torch.no_grad():  # the auxiliary loss reaches the router alone (and x through it); the experts' gradients
        assert rel(layer.router.grad, numeric_grad(total, layer.router)) < 1e-7  # are check_layer's above
    layer(x)
    pure = _layer(aux_coef=0.0, **kw)
    pure(x)
    assert rel(dx - pure.backward(dy), dx) > 1e-6  # the auxiliary term changes the gradient


@pytest.mark.parametrize("kw", CASES, ids=["top2-drop", "top2-norm", "top1"])
def test_the_twin_gives_the_same_output_aux_loss_drops_and_gradients(kw):
    layer = _layer(aux_coef=0.1, **kw)
    twin = layer.to_torch()
    assert isinstance(twin, PytorchMoE)
    g = torch.Generator().manual_seed(3)
    x, dy = torch.randn(2, 8, 4, dtype=f64, generator=g), torch.randn(2, 8, 4, dtype=f64, generator=g)
    xt = x.clone().requires_grad_()
    yt = twin(xt)
    ((yt * dy).sum() + twin.aux_coef * twin.aux_loss).backward()
    y = layer(x)
    dx = layer.backward(dy)
    assert rel(y, yt) < 1e-13 and rel(layer.aux_loss, twin.aux_loss) < 1e-13
    assert layer.dropped == twin.dropped
    assert rel(dx, xt.grad) < 1e-12
    for name, p in layer.named_parameters():
        assert rel(p.grad, twin.get_parameter(name).grad) < 1e-12, name
    back = MixtureOfExperts.from_torch(twin)  # and back: the same settings and weights
    assert back.extra_repr() == layer.extra_repr()
    assert all(torch.equal(a, b) for a, b in zip(back.parameters(), layer.parameters(), strict=True))


def test_the_capacity_queues_first_choices_before_second_ones_each_in_token_order():
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.2, 0.7, 0.1]], dtype=f64)
    experts, gates, _, kept = route(probs, top_k=2, capacity=1, normalize=False)
    assert experts.tolist() == [[0, 1], [0, 1], [1, 0]]
    # expert 0 takes token 0's first choice, expert 1 token 2's; every other assignment finds its expert full
    assert kept.tolist() == [[True, False], [False, False], [True, False]]
    assert torch.equal(gates, probs.topk(2, -1).values)
    layer = _layer(top_k=2, capacity_factor=0.5)
    layer(torch.randn(16, 4, dtype=f64, generator=torch.Generator().manual_seed(4)))
    assert layer.capacity(16) == 4 and layer.dropped >= 2 * 16 - 4 * 4  # ceil(0.5 * 2 * 16 / 4) a expert


def test_bad_settings_and_inputs_are_refused_by_name():
    with pytest.raises(ValueError, match="top_k 5 must be between 1 and n_experts 4"):
        MixtureOfExperts(4, 6, 4, top_k=5)
    with pytest.raises(ValueError, match="capacity_factor 0.0 must be positive"):
        MixtureOfExperts(4, 6, 4, capacity_factor=0.0)
    with pytest.raises(ValueError, match=r"x must be a floating \(\*, 4\) tensor, got \(3, 5\)"):
        MixtureOfExperts(4, 6, 4)(torch.zeros(3, 5))

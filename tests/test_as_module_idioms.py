"""as_module under PyTorch's own idioms: torch's answer, or one line that names as_module, the layer and the case.

Each case runs beside the plain nn.Module doing the same (float64):
- double backward (a gradient penalty, ``hvp``, ``hessian``) is refused by torch's once-differentiable mechanism
  with a message naming the layer; ``create_graph=True`` alone still gives torch's first derivatives;
- the layer computes with the parameters the module holds at each call: ``functional_call`` (torch.func and
  torch.nn.utils.stateless) with other weights, parametrizations (weight_norm, spectral_norm, one of your own),
  pruning, and a Parameter assigned in place of another give torch's outputs and gradients;
- a parameter changed in place between two backwards of one retained graph is refused, as autograd refuses it;
- ``torch.func.grad`` works; vmap, jacrev, forward-mode AD (forward_ad, torch.func.jvp) are refused naming
  as_module; autocast runs the layer as ``torch.amp.custom_fwd(cast_inputs=...)`` runs a custom function.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize, prune
from torch.nn.utils.parametrizations import spectral_norm, weight_norm

from layers import BatchNorm1d, Conv2d, LayerNorm, Linear, Sequential, Tanh, as_module
from tests.conftest import rel

F64 = torch.float64


def _pair(make):
    """(as_module of a hand-written layer, its torch.nn twin with the same weights), float64."""
    torch.manual_seed(0)
    module = as_module(make())
    return module, module.layer.to_torch()


def _mlp():
    return Sequential(Linear(3, 5, dtype=F64), Tanh(), Linear(5, 2, dtype=F64))


# -- double backward --------------------------------------------------------------------------------------------

SECOND = r"as_module\(.*\): its backward is hand-written and gives first derivatives only"


def test_a_gradient_penalty_is_refused_naming_the_layer_and_first_derivatives_stay_torch_s():
    module, twin = _pair(_mlp)
    x = torch.randn(4, 3, dtype=F64, requires_grad=True)
    grads = [torch.autograd.grad(m(x).pow(2).sum(), x, create_graph=True)[0] for m in (module, twin)]
    assert rel(grads[0], grads[1]) < 1e-13  # create_graph=True alone goes on
    twin_penalty = grads[1].pow(2).sum()
    twin_penalty.backward()  # torch differentiates its own backward
    assert all(p.grad is not None for p in twin.parameters())
    with pytest.raises(RuntimeError, match=SECOND + r".*gradient penalty"):
        grads[0].pow(2).sum().backward()


def test_a_penalty_through_a_last_layer_with_a_constant_upstream_gradient_is_refused_too():
    """``out.sum()``: the gradient reaching the layer is a constant, yet its dx depends on x (tanh'')."""
    module, twin = _pair(Tanh)
    x = torch.randn(4, 3, dtype=F64, requires_grad=True)
    (g_twin,) = torch.autograd.grad(twin(x).sum(), x, create_graph=True)
    assert g_twin.requires_grad
    (g,) = torch.autograd.grad(module(x).sum(), x, create_graph=True)
    assert rel(g, g_twin) < 1e-14
    with pytest.raises(RuntimeError, match=r"as_module\(Tanh\(\)\): its backward is hand-written"):
        g.pow(2).sum().backward()


@pytest.mark.parametrize("what", ["hvp", "hessian"])
def test_hvp_and_hessian_are_refused_naming_the_layer(what):
    module, twin = _pair(_mlp)
    x, v = torch.randn(2, 3, dtype=F64), torch.randn(2, 3, dtype=F64)
    ask = {
        "hvp": lambda f: torch.autograd.functional.hvp(f, x, v)[1],
        "hessian": lambda f: torch.autograd.functional.hessian(f, x),
    }[what]
    assert ask(lambda x: twin(x).pow(2).sum()).abs().max() > 1e-3  # torch's answer is not zero
    with pytest.raises(RuntimeError, match=SECOND):
        ask(lambda x: module(x).pow(2).sum())
    with pytest.raises(RuntimeError, match=SECOND):
        ask(lambda x: module(x).sum())  # a constant upstream gradient: zeros without the refusal


# -- the parameters the module holds at each call ------------------------------------------------------------------


def _same_step(module, twin, x, run):
    """``run(model, x) -> loss`` on both; outputs and every gradient (input and leaves) equal to 1e-12."""
    results = []
    for m in (module, twin):
        xi = x.clone().requires_grad_()
        loss = run(m, xi)
        loss.backward()
        results.append((loss.detach(), xi.grad, [p.grad for p in m.parameters()]))
    (l0, g0, p0), (l1, g1, p1) = results
    assert rel(l0, l1) < 1e-12 and rel(g0, g1) < 1e-12
    assert len(p0) == len(p1)
    for a, b in zip(p0, p1, strict=True):
        assert (a is None) == (b is None) and (a is None or rel(a, b) < 1e-12)


@pytest.mark.parametrize("call", ["torch.func", "stateless"])
@pytest.mark.parametrize("make", [lambda: Linear(3, 2, dtype=F64), _mlp], ids=["linear", "sequential"])
def test_functional_call_with_fast_weights_as_maml_writes_it(call, make):
    module, twin = _pair(make)
    functional_call = torch.func.functional_call if call == "torch.func" else nn.utils.stateless.functional_call
    x, y = torch.randn(6, 3, dtype=F64), torch.randn(6, 2, dtype=F64)

    def run(m, x):  # one first-order inner step, then the loss of the fast weights
        params = dict(m.named_parameters())
        inner = (m(x) - y).pow(2).mean()
        grads = torch.autograd.grad(inner, list(params.values()))
        fast = {n: p - 0.5 * g for (n, p), g in zip(params.items(), grads, strict=True)}
        return (functional_call(m, fast, (x,)) - y).pow(2).mean()

    _same_step(module, twin, x, run)


def test_torch_func_grad_of_a_functional_call():
    module, twin = _pair(_mlp)
    x = torch.randn(4, 3, dtype=F64)
    grads = []
    for m in (module, twin):
        params = {n: p.detach() for n, p in m.named_parameters()}
        grads.append(torch.func.grad(lambda ps, m=m: torch.func.functional_call(m, ps, (x,)).pow(2).sum())(params))
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert rel(grads[0][name], grads[1][name]) < 1e-12, name
    dx = [torch.func.grad(lambda x, m=m: m(x).pow(2).sum())(x) for m in (module, twin)]
    assert rel(dx[0], dx[1]) < 1e-12


def test_a_second_derivative_under_torch_func_is_refused():
    module, twin = _pair(_mlp)
    x = torch.randn(2, 3, dtype=F64)

    def gradgrad(m):
        return torch.func.grad(lambda x: torch.func.grad(lambda x: m(x).pow(2).sum())(x).sum())(x)

    assert gradgrad(twin).abs().max() > 1e-3
    with pytest.raises(
        RuntimeError,
        match=r"as_module\(Sequential\(Linear, Tanh, Linear\)\): a second derivative "
        r"\(torch.func.grad of torch.func.grad, hessian\) is not supported",
    ):
        gradgrad(module)
    # plain autograd through torch.func.grad's result (MAML's outer step through torch.func): refused too
    params = dict(module.named_parameters())
    inner = torch.func.grad(lambda ps: torch.func.functional_call(module, ps, (x,)).pow(2).sum())(params)
    with pytest.raises(RuntimeError, match=SECOND):
        sum(g.pow(2).sum() for g in inner.values()).backward()


def test_the_module_s_requires_grad_flag_decides_which_parameter_gets_a_gradient():
    """Frozen and unfrozen through the Parameters, torch's idiom, after wrapping: torch's gradients."""
    module, twin = _pair(_mlp)
    module.layer.requires_grad_(False, ["2.bias"])  # frozen in the layer before the module's flag is set again
    for m in (module, twin):
        m.get_submodule("0").weight.requires_grad_(False)
        m.get_submodule("2").bias.requires_grad_(True)
    _same_step(module, twin, torch.randn(4, 3, dtype=F64), lambda m, x: m(x).pow(2).sum())
    assert module.get_submodule("0").weight.grad is None and module.get_submodule("2").bias.grad is not None


def _parametrized(how):
    def make_pair():
        module, twin = _pair(_mlp)
        for _m, sub in ((module, module.get_submodule("0")), (twin, twin[0])):
            torch.manual_seed(3)  # spectral_norm draws its power-iteration vectors
            if how == "weight_norm":
                weight_norm(sub)
            elif how == "spectral_norm":
                spectral_norm(sub)
            elif how == "own":
                parametrize.register_parametrization(sub, "weight", _Symmetric())
            elif how == "pruning":
                prune.l1_unstructured(sub, "weight", amount=0.4)
        return module, twin

    return make_pair


class _Symmetric(nn.Module):
    def forward(self, w):
        return 0.5 * (w + w[:, :3].sum() * 0.1)


@pytest.mark.parametrize("how", ["weight_norm", "spectral_norm", "own", "pruning"])
def test_parametrizations_and_pruning_give_torch_s_training_steps(how):
    module, twin = _parametrized(how)()
    assert [n for n, _ in module.named_parameters()] == [n for n, _ in twin.named_parameters()]
    module.load_state_dict(twin.state_dict())
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (module, twin)]
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(5, 3, dtype=F64, generator=g)
        for _m, opt in zip((module, twin), opts, strict=True):
            opt.zero_grad()
        _same_step(module, twin, x, lambda m, x: m(x).pow(2).sum())
        for opt in opts:
            opt.step()
    for (name, a), b in zip(module.state_dict().items(), twin.state_dict().values(), strict=True):
        assert rel(a, b) < 1e-12, name


@pytest.mark.parametrize("how", ["weight_norm", "pruning"])
def test_a_parametrized_or_pruned_wrapper_of_one_layer(how):
    torch.manual_seed(0)
    module = as_module(Linear(4, 3, dtype=F64))
    twin = module.layer.to_torch()
    for m in (module, twin):
        weight_norm(m) if how == "weight_norm" else prune.l1_unstructured(m, "weight", amount=0.5)
    _same_step(module, twin, torch.randn(2, 4, dtype=F64), lambda m, x: m(x).pow(2).sum())


def test_an_assigned_parameter_is_the_one_the_layer_computes_with():
    module, twin = _pair(_mlp)
    new = torch.randn(2, 5, dtype=F64)
    module.get_submodule("2").weight = nn.Parameter(new.clone())
    twin[2].weight = nn.Parameter(new.clone())
    _same_step(module, twin, torch.randn(4, 3, dtype=F64), lambda m, x: m(x).pow(2).sum())
    assert module.get_submodule("2").weight.grad is not None


def test_a_replaced_buffer_is_refused():
    torch.manual_seed(0)
    module = as_module(BatchNorm1d(3, dtype=F64))
    with pytest.raises(RuntimeError, match=r"buffer 'running_mean' was replaced .*load_state_dict"):
        torch.func.functional_call(module, {"running_mean": torch.zeros(3, dtype=F64)}, (torch.randn(4, 3, dtype=F64),))


# -- an in-place change between two backwards of one graph -----------------------------------------------------

INPLACE_CASES = {
    "linear": (lambda: Linear(3, 4, dtype=F64), (5, 3)),
    "sequential": (_mlp, (5, 3)),
    "conv2d": (lambda: Conv2d(2, 3, 3, padding=1, dtype=F64), (2, 2, 4, 4)),
    "layernorm": (lambda: LayerNorm(3, dtype=F64), (5, 3)),
    "batchnorm": (lambda: BatchNorm1d(3, dtype=F64), (5, 3)),
}


@pytest.mark.parametrize("case", sorted(INPLACE_CASES))
def test_a_step_between_two_backwards_of_a_retained_graph_is_refused_as_torch_refuses_it(case):
    make, shape = INPLACE_CASES[case]
    module, twin = _pair(make)
    x = torch.randn(shape, dtype=F64)
    for m, says in (
        (
            twin,
            r"one of the variables needed for gradient computation has been modified by an "
            r"inplace operation",
        ),
        (module, r"as_module\(.*\): parameter '.*' was modified by an inplace operation"),
    ):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        out = m(x.clone().requires_grad_())
        dout = torch.randn_like(out)
        out.backward(dout, retain_graph=True)
        opt.step()
        with pytest.raises(RuntimeError, match=says):
            out.backward(dout)


# -- torch.func, forward-mode AD, autocast -----------------------------------------------------------------------

REFUSED = r"as_module\(.*\): {}.* is not supported"


@pytest.mark.parametrize(
    "what,run",
    [
        ("torch.func.vmap", lambda m, x: torch.func.vmap(m)(x.unsqueeze(1))),
        ("torch.func.vmap over its backward", lambda m, x: torch.func.jacrev(lambda x: m(x).sum(0))(x)),
        ("forward-mode AD", lambda m, x: torch.func.jvp(m, (x,), (torch.ones_like(x),))),
        ("forward-mode AD", lambda m, x: _forward_ad(m, x)),
        ("torch.func.vmap", lambda m, x: torch.func.jacfwd(lambda x: m(x).sum(0))(x)),
        ("torch.func.vmap", lambda m, x: torch.func.hessian(lambda x: m(x).pow(2).sum())(x)),
    ],
)
def test_transforms_it_cannot_run_are_refused_naming_as_module(what, run):
    module, twin = _pair(_mlp)
    x = torch.randn(4, 3, dtype=F64)
    run(twin, x)  # torch's module runs it
    with pytest.raises(RuntimeError, match=REFUSED.format(what)):
        run(module, x)


def _forward_ad(m, x):
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        return fwAD.unpack_dual(m(fwAD.make_dual(x, torch.ones_like(x)))).tangent


def test_autocast_runs_the_layer_as_custom_fwd_runs_a_custom_function():
    """Under autocast(bfloat16) the layer runs with autocast off, its input cast to its parameters' dtype: the
    output, the input gradient and the parameter gradients are those of the twin run in float32 without autocast."""
    torch.manual_seed(0)
    module = as_module(Sequential(Linear(3, 4), Tanh(), Linear(4, 2)))
    twin = module.layer.to_torch()
    x = torch.randn(5, 3)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module(xs[0].to(torch.bfloat16))
    ref = twin(xs[1].to(torch.bfloat16).float())
    assert out.dtype == torch.float32 and rel(out, ref) < 1e-6
    out.pow(2).sum().backward()
    ref.pow(2).sum().backward()
    assert xs[0].grad.dtype == torch.float32 and rel(xs[0].grad, xs[1].grad) < 1e-5
    for p, q in zip(module.parameters(), twin.parameters(), strict=True):
        assert rel(p.grad, q.grad) < 1e-5

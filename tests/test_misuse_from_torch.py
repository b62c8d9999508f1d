"""from_torch drops nothing silently: tied parameters stay one tensor (gradients of both uses added, the steps of
torch's), and what the hand-written layers would not run -- hooks, parametrizations, pruning, added tensors,
subclasses -- is refused in one line naming the module."""

import pytest
import torch
import torch.nn.utils.prune as prune
from torch import nn
from torch.nn.utils import parametrizations

import optimizers
from layers import from_torch

F64 = torch.float64


def _tied_linears():
    l1, l2 = nn.Linear(5, 5), nn.Linear(5, 5)
    l2.weight = l1.weight
    return nn.Sequential(l1, nn.Tanh(), l2).to(F64), lambda g: torch.randn(7, 5, dtype=F64, generator=g)


def _tied_embedding():
    emb, head = nn.Embedding(11, 4), nn.Linear(4, 11, bias=False)
    head.weight = emb.weight  # the language model's tied input and output matrix
    return nn.Sequential(emb, nn.Tanh(), head).to(F64), lambda g: torch.randint(0, 11, (3, 6), generator=g)


@pytest.mark.parametrize("build", [_tied_linears, _tied_embedding], ids=["linear-linear", "embedding-linear"])
@pytest.mark.parametrize("opt", ["SGD", "Adam"])
def test_tied_parameters_stay_one_tensor_and_step_as_torch(build, opt):
    torch.manual_seed(0)
    theirs, data = build()
    ours = from_torch(theirs)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    first, last = ours[0].weight, ours[2].weight
    assert first is last  # one tensor, held by both layers
    kw = {"lr": 0.1, "momentum": 0.9} if opt == "SGD" else {"lr": 0.05}
    opt_t = getattr(torch.optim, opt)(theirs.parameters(), **kw)
    opt_o = getattr(optimizers, opt)(ours.parameters(), **kw)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        x = data(g)
        dout = torch.randn(
            *x.shape[:-1] if x.is_floating_point() else x.shape,
            5 if x.is_floating_point() else 11,
            dtype=F64,
            generator=g,
        )
        opt_t.zero_grad()
        out_t = theirs(x)
        out_t.backward(dout)
        opt_t.step()
        opt_o.zero_grad()
        out_o = ours(x)
        ours.backward(dout)
        opt_o.step()
        torch.testing.assert_close(out_o, out_t, rtol=1e-12, atol=1e-12)
    for (name, p_o), (_, p_t) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        torch.testing.assert_close(p_o, p_t.detach(), rtol=1e-12, atol=1e-12, msg=name)
        torch.testing.assert_close(p_o.grad, p_t.grad, rtol=1e-12, atol=1e-12, msg=name)


def _hooked(kind):
    lin = nn.Linear(3, 2)
    if kind == "forward ":
        lin.register_forward_hook(lambda m, args, out: out * 10)
    elif kind == "forward pre-":
        lin.register_forward_pre_hook(lambda m, args: (args[0] * 10,))
    elif kind == "backward pre-":
        lin.register_full_backward_pre_hook(lambda m, g: (g[0] * 10,))
    else:
        lin.register_full_backward_hook(lambda m, gi, go: None)
    return lin


@pytest.mark.parametrize("kind", ["forward ", "forward pre-", "backward pre-", "backward "])
def test_a_module_hook_is_refused_naming_the_module_and_the_hook(kind):
    model = nn.Sequential(nn.Linear(3, 3), nn.Sequential(nn.ReLU(), _hooked(kind)))
    with pytest.raises(TypeError, match=rf"from_torch: '1\.1' \(Linear\) has a {kind}hook .*remove it") as e:
        from_torch(model)
    assert "\n" not in str(e.value)


def test_a_hook_on_the_container_and_a_global_hook_are_refused():
    model = nn.Sequential(nn.Linear(3, 3))
    handle = model.register_forward_hook(lambda m, a, out: out * 10)
    with pytest.raises(TypeError, match=r"from_torch: Sequential has a forward hook"):
        from_torch(model)
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, a, out: out * 10)
    try:
        with pytest.raises(TypeError, match=r"from_torch: a global module forward hook is registered"):
            from_torch(model)
    finally:
        handle.remove()
    from_torch(model)  # nothing left to drop


def test_pruning_and_parametrizations_are_refused_with_the_fix():
    pruned = nn.Linear(4, 3)
    prune.l1_unstructured(pruned, "weight", amount=0.5)
    with pytest.raises(TypeError, match=r"'0' \(Linear\) is pruned .*prune.remove\(module, 'weight'\)"):
        from_torch(nn.Sequential(pruned))
    prune.remove(pruned, "weight")  # made permanent: a plain weight with zeros, converted as it is
    assert torch.equal(from_torch(pruned).weight, pruned.weight)
    normed = parametrizations.weight_norm(nn.Linear(4, 3))
    with pytest.raises(TypeError, match=r"has a parametrization of 'weight' .*remove_parametrizations"):
        from_torch(normed)
    spectral = parametrizations.spectral_norm(nn.Linear(4, 3))
    with pytest.raises(TypeError, match=r"has a parametrization of 'weight'"):
        from_torch(nn.Sequential(nn.ReLU(), spectral))


def test_added_tensors_and_subclasses_are_refused_naming_them():
    lin = nn.Linear(3, 2)
    lin.register_parameter("scale", nn.Parameter(torch.ones(2)))
    with pytest.raises(TypeError, match=r"'0' \(Linear\) does not convert: .*unexpected keys \['scale'\]"):
        from_torch(nn.Sequential(lin))
    bn = nn.BatchNorm1d(3)
    bn.register_buffer("extra", torch.zeros(3), persistent=False)
    with pytest.raises(TypeError, match=r"BatchNorm1d has 'extra'"):
        from_torch(bn)

    class Scaled(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 10

    with pytest.raises(TypeError, match=r"'1' \(Scaled\) is a subclass of nn.Linear; its own code"):
        from_torch(nn.Sequential(nn.ReLU(), Scaled(3, 2)))
    container = nn.Sequential(nn.Linear(2, 2))
    container.register_parameter("loose", nn.Parameter(torch.ones(1)))
    with pytest.raises(TypeError, match=r"Sequential holds its own tensors 'loose'"):
        from_torch(container)


def test_parameters_over_the_same_memory_are_refused_not_copied_apart():
    """A tied transposed autoencoder: torch's two Parameters stay one memory; copies would drift apart silently."""
    enc, dec = nn.Linear(6, 3), nn.Linear(3, 6)
    dec.weight = nn.Parameter(enc.weight.T)
    with pytest.raises(TypeError, match=r"^from_torch: 0\.weight and 2\.weight are two tensors over the same memory"):
        from_torch(nn.Sequential(enc, nn.Tanh(), dec))
    shared = torch.zeros(12)  # disjoint slices of one buffer are two tensors, each with memory of its own
    a, b = nn.Linear(2, 3, bias=False), nn.Linear(2, 3, bias=False)
    a.weight, b.weight = nn.Parameter(shared[:6].view(3, 2)), nn.Parameter(shared[6:].view(3, 2))
    from_torch(nn.Sequential(a, b))  # converts
    dec.weight = nn.Parameter(enc.weight.detach().T.clone())  # untied: converts, and trains the two apart
    from_torch(nn.Sequential(enc, nn.Tanh(), dec))


@pytest.mark.parametrize("build", [_tied_linears, _tied_embedding], ids=["linear-linear", "embedding-linear"])
def test_to_torch_keeps_a_tied_weight_tied(build):
    torch.manual_seed(0)
    theirs, _ = build()
    back = from_torch(theirs).to_torch()
    assert back[0].weight is back[2].weight
    assert [n for n, _ in back.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), theirs.state_dict().values(), strict=True))


def test_each_childs_mode_is_kept_both_ways():
    """Fine-tuning's ``model.train(); bn.eval()``: the batch norm keeps its running statistics, the dropout is off."""
    torch.manual_seed(0)
    theirs = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.Dropout(0.5), nn.Linear(3, 2)).to(F64)
    theirs[1].running_mean.uniform_()
    theirs.train()
    theirs[1].eval(), theirs[2].eval()
    ours = from_torch(theirs)
    assert [layer.training for layer in ours.layers] == [m.training for m in theirs] == [True, False, False, True]
    assert [m.training for m in ours.to_torch()] == [True, False, False, True] and ours.to_torch().training
    x, dout = torch.randn(4, 3, dtype=F64), torch.randn(4, 2, dtype=F64)
    xt = x.clone().requires_grad_()
    out = theirs(xt)
    out.backward(dout)
    torch.testing.assert_close(ours(x), out.detach(), rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(ours.backward(dout, need_input_grad=True), xt.grad, rtol=1e-13, atol=1e-13)


def test_a_composite_module_in_two_modes_is_refused():
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    layer.dropout1.eval()
    with pytest.raises(
        TypeError,
        match=r"'1' \(TransformerEncoderLayer\) is in train mode but its '1.dropout1' in "
        r"the other",
    ):
        from_torch(nn.Sequential(nn.ReLU(), layer))

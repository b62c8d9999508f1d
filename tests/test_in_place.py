"""A tensor kept from the forward for the backward, changed in place in between, is refused.

Every layer and loss that keeps a tensor its backward reads -- an input for a weight gradient, a weight for the
input gradient, a loss's target -- records the tensors' version counters in the forward and compares them in
backward (layers/saved.py), as torch.autograd does.  Each case below changes each kept tensor in place after the
forward and expects a RuntimeError naming the layer and the tensor; and, unchanged, expects the backward to match
torch.autograd through the layer's torch.nn twin in float64.  Then the changes that must NOT be refused: the
tensors a layer does not read in backward, handgrad's own training steps (an optimizer step after backward, the
GPT's recomputed inputs, a pool's output changed by a following in-place layer), inference-mode tensors.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

import layers as L
import optimizers
from losses import CrossEntropyLoss, MSELoss
from models import GPT, Net

f64 = torch.float64


def refused(layer: object, name: str, before: str = "backward"):
    """pytest.raises for the in-place refusal of ``layer`` naming ``name``."""
    return pytest.raises(
        RuntimeError, match=re.escape(f"{layer!r}: {name} was modified in place after the forward, before {before}")
    )


def nontrivial(layer):
    """Parameters away from their defaults (a LayerNorm's ones and zeros can hide a term), drawn from a seed."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
    return layer


# -- the three cases ------------------------------------------------------------------------------------


def test_a_linear_input_multiplied_in_place_before_backward_is_refused_as_autograd_refuses_it():
    torch.manual_seed(0)
    lin = L.Linear(4, 3, dtype=f64)
    x = torch.randn(5, 4, dtype=f64)
    out = lin(x)
    x.mul_(10)  # dW would be computed from the new x: 10 times too large
    with refused(lin, "its input x"):
        lin.backward(torch.ones_like(out))
    xt = torch.randn(5, 4, dtype=f64, requires_grad=True) * 1.0  # (a leaf that requires grad cannot change in place)
    out = lin.to_torch()(xt)
    xt.mul_(10)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):  # torch.autograd: the same
        out.sum().backward()


def test_an_optimizer_step_between_forward_and_backward_is_refused():
    torch.manual_seed(0)
    net = Net(hidden_size=8, in_features=6, num_classes=3, dtype=f64)
    opt = optimizers.SGD(net.parameters(), lr=0.1)
    crit = CrossEntropyLoss()
    x, y = torch.randn(4, 6, dtype=f64), torch.tensor([0, 2, 1, 2])
    crit(net(x), y)
    net.backward(crit.backward())  # a first step's gradients, so that step() moves every weight
    crit(net(x), y)
    opt.step()  # too early: dx would be computed with the new weights
    last = net.layers[-1]
    with refused(last, "its parameter weight"):
        net.backward(crit.backward())


def test_a_cross_entropy_target_changed_after_forward_is_refused():
    crit = CrossEntropyLoss()
    logits, target = torch.randn(4, 5, dtype=f64), torch.tensor([0, 1, 2, 3])
    crit(logits, target)
    target[0] = 4  # the gradient would be 0.25 off at two entries (1/N, from the other class)
    with refused(crit, "target"):
        crit.backward()
    logits_t = logits.clone().requires_grad_()
    target = torch.tensor([0, 1, 2, 3])
    loss = F.cross_entropy(logits_t, target)
    target[0] = 4
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):  # torch.autograd: the same
        loss.backward()


# -- every layer: each kept tensor, changed, is refused; unchanged, backward matches autograd -------------------


class _SDPA(torch.nn.Module):
    """F.scaled_dot_product_attention as a module (the twin of ScaledDotProductAttention's forward)."""

    def forward(self, q, k, v, attn_mask=None, is_causal=False):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)


class _Masked(torch.nn.Module):
    """x * mask: the twin of a Dropout forward that drew ``mask``."""

    def __init__(self, mask):
        super().__init__()
        self.mask = mask

    def forward(self, x):
        return x * self.mask


@dataclass
class Case:
    make: Callable[[], object]  # the layer, float64, parameters away from their defaults
    inputs: Callable[[], tuple]  # the forward's positional inputs (fresh tensors)
    kept: dict[str, Callable]  # the name the error shows -> (layer, inputs, out, kwargs) -> the tensor to change
    kwargs: Callable[[], dict] = dict  # the forward's keyword arguments (masks), fresh
    pick: Callable = lambda out: out  # the output that gets an upstream gradient
    backward: Callable = lambda layer, dout: layer.backward(dout)  # -> the inputs' gradients (a tensor or a tuple)
    twin: Callable = lambda layer: layer.to_torch()
    grads_of: tuple[int, ...] = (0,)  # the inputs whose gradients are compared


def _seeded(*shape, dtype=f64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _attr(path):
    """The kept tensor at ``path`` in the layer ("weight", "out_proj.weight")."""

    def get(layer, inputs, out, kwargs):
        for name in path.split("."):
            layer = getattr(layer, name)
        return layer

    return get


def _input(i):
    return lambda layer, inputs, out, kwargs: inputs[i]


def _kwarg(name):
    return lambda layer, inputs, out, kwargs: kwargs[name]


def _out(layer, inputs, out, kwargs):
    return out


KPM = lambda: {"key_padding_mask": torch.tensor([[False, False, True], [False, True, False]])}  # noqa: E731
FLOAT_MASK = lambda: {"attn_mask": _seeded(4, 5, seed=9)}  # noqa: E731

CASES = {
    "Linear": Case(
        lambda: nontrivial(L.Linear(4, 3, dtype=f64)),
        lambda: (_seeded(2, 5, 4),),
        {"its input x": _input(0), "its parameter weight": _attr("weight")},
    ),
    "Conv2d": Case(
        lambda: nontrivial(L.Conv2d(2, 3, 3, padding=1, dtype=f64)),
        lambda: (_seeded(2, 2, 5, 5),),
        {"its input x": _input(0), "its parameter weight": _attr("weight")},
    ),
    "BatchNorm1d (training)": Case(
        lambda: nontrivial(L.BatchNorm1d(3, dtype=f64)),
        lambda: (_seeded(6, 3),),
        {"its parameter weight": _attr("weight")},
    ),
    "BatchNorm2d (eval)": Case(
        lambda: nontrivial(L.BatchNorm2d(3, dtype=f64)).eval(),
        lambda: (_seeded(2, 3, 2, 2),),
        {"its input x": _input(0), "its parameter weight": _attr("weight")},
    ),
    "SyncBatchNorm (one process)": Case(
        lambda: nontrivial(L.SyncBatchNorm(3, dtype=f64)),
        lambda: (_seeded(4, 3, 2),),
        {"its parameter weight": _attr("weight")},
    ),
    "LayerNorm": Case(
        lambda: nontrivial(L.LayerNorm(4, dtype=f64)),
        lambda: (_seeded(3, 4),),
        {"its input x": _input(0), "its parameter weight": _attr("weight"), "its parameter bias": _attr("bias")},
    ),
    "Embedding": Case(
        lambda: L.Embedding(7, 3, dtype=f64),
        lambda: (torch.tensor([[1, 2, 2], [6, 0, 1]]),),
        {"its input idx": _input(0)},
        grads_of=(),
    ),
    "Dropout": Case(
        lambda: L.Dropout(0.5),
        lambda: (_seeded(4, 6),),
        {"its mask (layer.mask)": _attr("mask")},
        twin=lambda layer: _Masked(layer.mask),
    ),
    "ReLU": Case(L.ReLU, lambda: (_seeded(3, 4),), {"its output": _out}),
    "Softmax": Case(lambda: L.Softmax(1), lambda: (_seeded(3, 4),), {"its output": _out}),
    "GELU": Case(L.GELU, lambda: (_seeded(3, 4),), {"its input x": _input(0), "its output": _out}),
    "LeakyReLU": Case(L.LeakyReLU, lambda: (_seeded(3, 4),), {"its input x": _input(0)}),
    "SiLU": Case(L.SiLU, lambda: (_seeded(3, 4),), {"its output": _out}),
    "ScaledDotProductAttention": Case(
        L.ScaledDotProductAttention,
        lambda: (_seeded(2, 4, 3, seed=1), _seeded(2, 5, 3, seed=2), _seeded(2, 5, 3, seed=3)),
        {
            "its input query": _input(0),
            "its input key": _input(1),
            "its input value": _input(2),
            "its output": _out,
            "its attention mask (added to the scores)": _kwarg("attn_mask"),
        },
        kwargs=FLOAT_MASK,
        twin=lambda layer: _SDPA(),
        grads_of=(0, 1, 2),
    ),
    "MultiheadAttention": Case(
        lambda: nontrivial(L.MultiheadAttention(4, 2, dtype=f64)),
        lambda: (_seeded(2, 2, 4, seed=1), _seeded(3, 2, 4, seed=2), _seeded(3, 2, 4, seed=3)),
        {
            "its input query": _input(0),
            "its input key": _input(1),
            "its input value": _input(2),
            "its key_padding_mask": _kwarg("key_padding_mask"),
            "its parameter in_proj_weight": _attr("in_proj_weight"),
            "its parameter weight": _attr("out_proj.weight"),
        },  # out_proj's own check
        kwargs=lambda: {**KPM(), "need_weights": False},
        pick=lambda out: out[0],
        grads_of=(0, 1, 2),
    ),
    "TransformerEncoderLayer": Case(
        lambda: nontrivial(L.TransformerEncoderLayer(4, 2, 8, dropout=0.0, dtype=f64)),
        lambda: (_seeded(3, 2, 4),),
        {"its input query": _input(0), "its parameter weight": _attr("linear2.weight")},
    ),
    "LSTM": Case(
        lambda: L.LSTM(3, 4, dtype=f64),
        lambda: (_seeded(5, 2, 3),),
        {
            "its input x": _input(0),
            "its parameter weight_ih_l0": _attr("weight_ih_l0"),
            "its parameter weight_hh_l0": _attr("weight_hh_l0"),
        },
        pick=lambda out: out[0],
    ),
    "GRU (2 layers, bidirectional)": Case(
        lambda: L.GRU(3, 4, num_layers=2, bidirectional=True, dtype=f64),
        lambda: (_seeded(5, 2, 3),),
        {"its input x": _input(0), "its parameter weight_hh_l1_reverse": _attr("weight_hh_l1_reverse")},
        pick=lambda out: out[0],
    ),
    "LSTMCell": Case(
        lambda: L.LSTMCell(3, 4, dtype=f64),
        lambda: (_seeded(2, 3),),
        {
            "its input x": _input(0),
            "its parameter weight_ih": _attr("weight_ih"),
            "its parameter weight_hh": _attr("weight_hh"),
        },
        pick=lambda out: out[0],
        backward=lambda layer, dout: layer.backward(dout, None),
    ),
    "RNNCell": Case(
        lambda: L.RNNCell(3, 4, dtype=f64),
        lambda: (_seeded(2, 3),),
        {"its input x": _input(0), "its parameter weight_hh": _attr("weight_hh")},
    ),
}


def _forward(case: Case, layer, inputs, kwargs):
    torch.manual_seed(3)  # Dropout's mask
    return case.pick(layer(*inputs, **kwargs))


def _change_in_place(t):
    """Another value in every element, in place: + 1 (a float), flipped (a mask), the next id below 7 (token ids)."""
    if t.dtype == torch.bool:
        t.logical_not_()
    elif t.is_floating_point():
        t.add_(1)
    else:
        t.add_(1).remainder_(7)


@pytest.mark.parametrize("case_name, tensor_name", [(c, t) for c, case in CASES.items() for t in case.kept])
def test_a_kept_tensor_changed_in_place_before_backward_is_refused(case_name, tensor_name):
    case = CASES[case_name]
    layer, inputs, kwargs = case.make(), case.inputs(), case.kwargs()
    out = _forward(case, layer, inputs, kwargs)
    changed = case.kept[tensor_name](layer, inputs, out, kwargs)
    with torch.no_grad():
        _change_in_place(changed)
    # the layer that refuses: the case's own, or the sublayer that keeps the tensor (out_proj, linear2, ...)
    owner = {
        "MultiheadAttention/its parameter weight": lambda: layer.out_proj,
        "TransformerEncoderLayer/its parameter weight": lambda: layer.linear2,
        "TransformerEncoderLayer/its input query": lambda: layer.self_attn,
    }.get(f"{case_name}/{tensor_name}", lambda: layer)()
    with refused(owner, tensor_name):
        case.backward(layer, torch.ones_like(out))


@pytest.mark.parametrize("case_name", CASES)
def test_unchanged_the_backward_runs_and_matches_autograd(case_name):
    case = CASES[case_name]
    layer, inputs, kwargs = case.make(), case.inputs(), case.kwargs()
    out = _forward(case, layer, inputs, kwargs)
    dout = _seeded(*out.shape, seed=11)
    grads = case.backward(layer, dout)
    grads = grads if isinstance(grads, tuple) else (grads,)
    twin = case.twin(layer)
    t_inputs = [t.clone().requires_grad_(i in case.grads_of) for i, t in enumerate(inputs)]
    t_out = _forward(case, twin, t_inputs, kwargs)
    (t_out * dout).sum().backward()
    for i in case.grads_of:
        torch.testing.assert_close(grads[i], t_inputs[i].grad, rtol=1e-10, atol=1e-12)
    twin_params = dict(twin.named_parameters())
    for name, p in layer.named_parameters() if hasattr(layer, "named_parameters") else ():
        expected = twin_params[name].grad
        torch.testing.assert_close(
            p.grad, torch.zeros_like(p) if expected is None else expected, rtol=1e-10, atol=1e-12, msg=name
        )


# -- the losses ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target_kind", ["class indices", "probabilities", "label smoothing", "(N, C, d) logits"])
def test_cross_entropy_refuses_a_changed_target_and_else_matches_autograd(target_kind):
    g = torch.Generator().manual_seed(0)
    shape = (4, 5, 3) if target_kind.startswith("(N") else (4, 5)
    logits = torch.randn(*shape, generator=g, dtype=f64)
    if target_kind == "probabilities":
        target = torch.randn(*shape, generator=g, dtype=f64).softmax(1)
    else:
        target = torch.randint(0, 5, (shape[0], *shape[2:]), generator=g)
    crit = CrossEntropyLoss(label_smoothing=0.1 if target_kind == "label smoothing" else 0.0)
    crit(logits, target)
    target.add_(1) if target.is_floating_point() else target.remainder_(4)  # (remainder_: a change, in range)
    with refused(crit, "target"):
        crit.backward()
    crit(logits, target)
    grad = crit.backward(2.0)
    z = logits.clone().requires_grad_()
    (2.0 * F.cross_entropy(z, target, label_smoothing=crit.label_smoothing)).backward()
    torch.testing.assert_close(grad, z.grad, rtol=1e-12, atol=1e-15)


def test_mse_keeps_only_its_own_difference_so_a_changed_input_or_target_changes_nothing():
    """MSELoss keeps input - target, computed in the forward: no version check is needed (nothing a caller holds
    is read again), and the gradient is the forward's values' (torch.autograd, which keeps both, would refuse)."""
    x, y = _seeded(3, 4, seed=1), _seeded(3, 4, seed=2)
    expected = 2 * (x - y) / x.numel()
    crit = MSELoss()
    crit(x, y)
    x.mul_(10)
    y.zero_()
    torch.testing.assert_close(crit.backward(), expected, rtol=1e-15, atol=0)


# -- the GPT ------------------------------------------------------------------------------------------------------


def _gpt():
    torch.manual_seed(0)
    return GPT(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8, dtype=f64)


def _gpt_batch():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 11, (2, 6), generator=g), torch.randint(0, 11, (2, 6), generator=g)


@pytest.mark.parametrize("recompute", [True, False])
def test_gpt_steps_with_its_flat_adamw_are_not_refused_and_match_the_twin(recompute):
    """The GPT's own training step: recomputed LayerNorm and GELU outputs (or held ones), residuals added in place
    into fresh tensors, parameters in one block updated by one kernel (AdamW's flat path) after backward -- no
    refusal, and three steps equal the nn.Module twin's under torch.optim.AdamW."""
    gpt = _gpt()
    gpt.recompute = recompute
    twin = gpt.to_torch()
    opt = optimizers.AdamW(gpt.parameters(), lr=1e-2)
    topt = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    crit = CrossEntropyLoss()
    for _ in range(3):
        idx, y = _gpt_batch()
        opt.zero_grad()
        logits = gpt(idx)
        crit(logits.view(-1, 11), y.view(-1))
        gpt.backward(crit.backward().view_as(logits))
        opt.step()
        topt.zero_grad()
        F.cross_entropy(twin(idx).view(-1, 11), y.view(-1)).backward()
        topt.step()
    theirs = dict(twin.named_parameters())
    for name, p in gpt.named_parameters():
        torch.testing.assert_close(p, theirs[name].detach(), rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize(
    "change", ["flat AdamW step", "flat AdamW step, embeddings frozen", "the token ids", "a block's weight"]
)
def test_gpt_refuses_a_change_between_forward_and_backward(change):
    """The GPT's parameters lie in one block, which AdamW updates with one kernel through a view of the group's
    first parameter; every parameter of the group must count as changed (not only that first one: with the
    embeddings frozen, the group starts at wpe.weight, which no backward reads)."""
    gpt = _gpt()
    frozen = change.endswith("frozen")
    group = [p for n, p in gpt.named_parameters() if not frozen or (p.dim() >= 2 and n != "transformer.wte.weight")]
    opt = optimizers.AdamW(group, lr=1e-2)
    crit = CrossEntropyLoss()
    idx, y = _gpt_batch()
    logits = gpt(idx)
    crit(logits.view(-1, 11), y.view(-1))
    gpt.backward(crit.backward().view_as(logits))
    opt.step()  # a first step: the state is laid out in blocks, and the next step takes the flat path
    logits = gpt(idx)
    crit(logits.view(-1, 11), y.view(-1))
    if change.startswith("flat AdamW step"):
        opt.step()  # one kernel over the whole block of parameters: every parameter changed
        expect = (
            refused(gpt.h[1].mlp._gelu_c_proj, "its parameter weight")
            if frozen
            else refused(gpt, "its parameter transformer.wte.weight")
        )
    elif change == "the token ids":
        idx.remainder_(5)
        expect = refused(gpt.wte, "its input idx")
    else:
        with torch.no_grad():
            gpt.h[1].mlp.c_proj.weight.mul_(2)  # c_proj runs inside the pair GELU -> c_proj (models/recompute.py)
        expect = refused(gpt.h[1].mlp._gelu_c_proj, "its parameter weight")
    with expect:
        gpt.backward(crit.backward().view_as(logits))


def test_the_gpt_attention_refuses_a_change_of_the_heads_output_it_keeps():
    """CausalSelfAttention keeps the heads side by side (c_proj's input) for the attention's backward: a change
    of it in place before backward is refused, naming it."""
    from models.gpt import CausalSelfAttention

    torch.manual_seed(0)
    attn = CausalSelfAttention(8, 2, 0.0, True, dtype=f64)
    out = attn(_seeded(2, 5, 8))
    attn._saved.y.mul_(2)
    with refused(attn, "the heads' output y (c_proj's input)"):
        attn.backward(torch.ones_like(out))


# -- what must not be refused -------------------------------------------------------------------------------------


def test_a_first_linear_without_dx_does_not_read_its_weight_so_a_change_is_not_refused():
    """autograd keeps the weight of x @ W^T only when x needs a gradient; so does Linear (need_input_grad=False:
    dW = dout^T x needs x, not W)."""
    torch.manual_seed(0)
    lin = L.Linear(4, 3, dtype=f64)
    x = _seeded(5, 4)
    lin(x)
    dout = _seeded(5, 3, seed=1)
    with torch.no_grad():
        lin.weight.mul_(2)
    assert lin.backward(dout, need_input_grad=False) is None
    torch.testing.assert_close(lin.weight.grad, dout.t() @ x, rtol=1e-15, atol=0)


@pytest.mark.parametrize("follower", [lambda: L.LeakyReLU(0.1, inplace=True), lambda: L.SiLU(inplace=True)])
def test_a_pool_output_changed_by_a_following_in_place_layer_is_not_refused(follower):
    """ReLU -> MaxPool2d runs the two backwards as one, with the mask out > 0 taken on the pool's output; a
    following in-place layer changes that output legitimately (the pool's backward reads only its argmax), so the
    pair falls back to the two backwards, and the gradient equals autograd's."""
    torch.manual_seed(0)
    model = L.Sequential(
        L.Conv2d(1, 2, 3, padding=1, dtype=f64),
        L.ReLU(),
        L.MaxPool2d(2),
        follower(),
        L.Flatten(),
        L.Linear(8, 3, dtype=f64),
    )
    twin = model.to_torch()
    x = _seeded(2, 1, 4, 4)
    out = model(x)
    dout = _seeded(*out.shape, seed=1)
    dx = model.backward(dout, need_input_grad=True)
    xt = x.clone().requires_grad_()
    (twin(xt) * dout).sum().backward()
    torch.testing.assert_close(dx, xt.grad, rtol=1e-10, atol=1e-12)
    for (name, p), (_, tp) in zip(model.named_parameters(), twin.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad, tp.grad, rtol=1e-10, atol=1e-12, msg=name)


def test_a_relu_output_changed_before_the_fused_relu_pool_backward_is_refused_by_the_relu():
    model = L.Sequential(L.Conv2d(1, 2, 3, padding=1, dtype=f64), L.ReLU(), L.MaxPool2d(2))
    out = model(_seeded(1, 1, 4, 4))
    model.layers[1]._saved.out.mul_(2)  # the ReLU's output, the pool's input: what the pair's backward reads
    with refused(model.layers[1], "its output"):
        model.backward(torch.ones_like(out))


def test_inference_mode_tensors_have_no_version_and_are_not_checked():
    lin, relu = L.Linear(4, 3), L.ReLU()
    with torch.inference_mode():
        x = torch.randn(2, 4)
        out = relu(lin(x))
    assert out.shape == (2, 3)
    dx = lin.backward(relu.backward(torch.ones(2, 3)))
    assert dx.shape == (2, 4)


def test_the_recurrent_initial_state_is_copied_so_changing_it_is_not_refused():
    lstm = L.LSTM(3, 4, dtype=f64)
    x, h0, c0 = _seeded(5, 2, 3), _seeded(1, 2, 4, seed=1), _seeded(1, 2, 4, seed=2)
    out, _ = lstm(x, (h0, c0))
    twin = lstm.to_torch()
    expected_out, _ = twin(x, (h0.clone(), c0.clone()))
    h0.zero_()
    dx, (dh0, dc0) = lstm.backward(torch.ones_like(out))
    xt, h0t, c0t = (t.clone().requires_grad_() for t in (x, _seeded(1, 2, 4, seed=1), _seeded(1, 2, 4, seed=2)))
    twin(xt, (h0t, c0t))[0].sum().backward()
    torch.testing.assert_close(dx, xt.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dh0, h0t.grad, rtol=1e-10, atol=1e-12)


# -- three errors that were unclear: one clear line each --------------------------------------------------------


@pytest.mark.parametrize(
    "make, args",
    [
        (CrossEntropyLoss, (torch.randn(3, 4), torch.tensor([0, 1, 2]))),
        (MSELoss, (torch.randn(3, 4), torch.randn(3, 4))),
    ],
)
def test_a_loss_backward_with_a_wrong_dout_says_what_dout_must_be(make, args):
    crit = make()
    crit(*args)
    for bad in ("a", None, [1.0], True):
        with pytest.raises(
            TypeError,
            match=re.escape(
                f"{crit!r}: dout (the upstream gradient of the loss) must be a "
                f"number or a one-element tensor, default 1.0; got "
                f"{type(bad).__name__}"
            ),
        ):
            crit.backward(bad)
    for bad in (torch.ones(2), torch.ones((), dtype=torch.complex64), torch.tensor(True)):
        with pytest.raises(
            ValueError,
            match=re.escape(
                f"{crit!r}: dout (the upstream gradient of the loss) must be "
                f"a real scalar, got a tensor of shape {tuple(bad.shape)}"
            ),
        ):
            crit.backward(bad)
    grad = crit.backward(torch.tensor(2.0))  # a refused dout consumed nothing: the forward's cache is still there
    assert grad.shape == (3, 4)


def test_a_wrong_shape_key_padding_mask_names_n_s_and_the_shape_given():
    enc = L.TransformerEncoderLayer(8, 2, 16, dropout=0.0)
    src = torch.randn(5, 3, 8)  # (S, N, E): S = 5, N = 3
    with pytest.raises(
        ValueError,
        match=re.escape("key_padding_mask must have shape (N, S) = (3, 5) (batch, source length), got (5, 3)"),
    ):
        enc(src, src_key_padding_mask=torch.zeros(5, 3, dtype=torch.bool))
    mha = L.MultiheadAttention(8, 2)
    with pytest.raises(
        ValueError, match=re.escape("key_padding_mask must have shape (S,) = (5,) (source length), got (1, 5)")
    ):
        mha(src[:, 0], src[:, 0], src[:, 0], key_padding_mask=torch.zeros(1, 5, dtype=torch.bool))


@pytest.mark.parametrize("dtype", [torch.int64, torch.uint8, torch.complex64])
@pytest.mark.parametrize("where", ["Linear", "Net", "MSELoss target", "Conv2d"])
def test_an_integer_or_complex_input_is_told_to_convert_the_input_not_the_model(dtype, where):
    if where == "Linear":
        call, name, var = lambda x: L.Linear(4, 3)(x), "input", "x"
        x = torch.ones(2, 4, dtype=dtype)
    elif where == "Net":
        call, name, var = lambda x: Net(hidden_size=8)(x), "input", "x"
        x = torch.ones(2, 784, dtype=dtype)
    elif where == "Conv2d":
        call, name, var = lambda x: L.Conv2d(1, 2, 3)(x), "input", "x"
        x = torch.ones(1, 1, 4, 4, dtype=dtype)
    else:
        call, name, var = lambda y: MSELoss()(torch.randn(3), y), "target", "target"
        x = torch.ones(3, dtype=dtype)
    with pytest.raises(ValueError) as info:
        call(x)
    message = str(info.value)
    assert f"{name} has dtype {dtype}" in message and f"convert the {name} (e.g. {var}.to(torch.float32))" in message
    assert "net.to(" not in message  # .to() refuses a non-floating dtype: never advise it


def test_batchnorm_in_eval_mode_keeps_its_own_copy_of_running_mean():
    """In eval mode the backward reads running_mean (dgamma = sum(dout * (x - running_mean)) * invstd).  The buffer
    may be rewritten between forward and backward with the same values (as_module's re-run does) or others
    (load_state_dict); the layer keeps a copy (C numbers), so the gradient is the forward's either way."""
    bn = nontrivial(L.BatchNorm2d(3, dtype=f64)).eval()
    with torch.no_grad():
        bn.running_mean.normal_()
    twin = bn.to_torch()
    x, dout = _seeded(2, 3, 2, 2), _seeded(2, 3, 2, 2, seed=1)
    bn(x)
    bn.running_mean.add_(1)
    dx = bn.backward(dout)
    xt = x.clone().requires_grad_()
    (twin(xt) * dout).sum().backward()
    torch.testing.assert_close(dx, xt.grad, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(bn.weight.grad, twin.weight.grad, rtol=1e-12, atol=1e-14)

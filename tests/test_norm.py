"""BatchNorm1d/2d and LayerNorm: gradient checks, torch.nn parity over several steps (running statistics,
momentum=None, eval mode), conversion with buffers, the textbook batch norm, mixed precision, bad input, and no
dx computed where none is asked for."""

import contextlib

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import kernels
from gradcheck import check_layer, nontrivial
from layers import BatchNorm1d, BatchNorm2d, LayerNorm, from_torch
from tests.conftest import assert_all_pass, rel

f64 = torch.float64

BN_CONFIGS = [  # (our class, torch's class, input shape)
    (BatchNorm1d, nn.BatchNorm1d, (6, 4)),
    (BatchNorm1d, nn.BatchNorm1d, (3, 4, 5)),
    (BatchNorm1d, nn.BatchNorm1d, (1, 4, 5)),
    (BatchNorm2d, nn.BatchNorm2d, (3, 4, 3, 5)),
    (BatchNorm2d, nn.BatchNorm2d, (1, 4, 2, 3)),
]
BN_OPTIONS = [
    {},
    {"momentum": None},
    {"momentum": 0.6, "eps": 1e-3},
    {"affine": False},
    {"track_running_stats": False},
    {"affine": False, "track_running_stats": False},
    {"bias": False},
    {"bias": False, "track_running_stats": False},
]  # torch 2.x: a weight, no bias


def ids(configs):
    return [f"{c[0].__name__}{c[2]}" for c in configs]


@pytest.mark.parametrize("cls,_,shape", BN_CONFIGS, ids=ids(BN_CONFIGS))
@pytest.mark.parametrize("opts", BN_OPTIONS, ids=str)
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_batchnorm_gradcheck(cls, _, shape, opts, mode):
    torch.manual_seed(len(shape) + shape[0])
    layer = nontrivial(cls(shape[1], dtype=f64, **opts)).train(mode == "train")
    assert_all_pass(check_layer(layer, torch.randn(*shape, dtype=f64) * 2 + 1))


def torch_twin(ours, cls_t, **opts):
    theirs = cls_t(ours.num_features, dtype=f64, **opts)
    theirs.load_state_dict(ours.state_dict())
    return theirs


@pytest.mark.parametrize("cls,cls_t,shape", BN_CONFIGS, ids=ids(BN_CONFIGS))
@pytest.mark.parametrize("opts", BN_OPTIONS, ids=str)
def test_batchnorm_equals_torch_over_steps_then_eval(cls, cls_t, shape, opts):
    """Four training steps (outputs, dx, accumulated parameter grads, running stats, num_batches_tracked),
    then eval mode (running statistics or, untracked, batch statistics) forward and backward."""
    torch.manual_seed(3)
    ours = nontrivial(cls(shape[1], dtype=f64, **opts))
    theirs = torch_twin(ours, cls_t, **opts)
    for step in range(5):
        training = step < 4
        ours.train(training), theirs.train(training)
        x = torch.randn(*shape, dtype=f64) * (1 + step) + step  # statistics change from step to step
        dout = torch.randn(*shape, dtype=f64)
        xr = x.clone().requires_grad_()
        out_t = theirs(xr)
        out_t.backward(dout)
        out = ours(x)
        dx = ours.backward(dout)
        assert rel(out, out_t.detach()) < 1e-12 and rel(dx, xr.grad) < 1e-12, step
        for (name, p), (name_t, p_t) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
            assert name == name_t and rel(p.grad, p_t.grad) < 1e-12, (step, name)  # accumulated over steps
        sd, sd_t = ours.state_dict(), theirs.state_dict()
        assert list(sd) == list(sd_t)
        for k in sd:
            assert sd[k].dtype == sd_t[k].dtype and torch.allclose(sd[k], sd_t[k], rtol=1e-12, atol=0), (step, k)
    if opts.get("track_running_stats", True):
        assert ours.num_batches_tracked.item() == 4


def test_running_var_is_unbiased_and_momentum_none_is_the_cumulative_average():
    torch.manual_seed(0)
    bn = BatchNorm1d(3, momentum=None, dtype=f64)
    xs = [torch.randn(5, 3, dtype=f64) * 3 + 1 for _ in range(3)]
    for x in xs:
        bn(x)
        bn.backward(torch.randn_like(x))
    assert torch.allclose(bn.running_mean, torch.stack([x.mean(0) for x in xs]).mean(0), rtol=1e-13)
    assert torch.allclose(bn.running_var, torch.stack([x.var(0, unbiased=True) for x in xs]).mean(0), rtol=1e-13)
    assert bn.num_batches_tracked.dtype == torch.long and bn.num_batches_tracked.item() == 3


def test_eval_uses_running_statistics_and_does_not_update_them():
    torch.manual_seed(1)
    bn = nontrivial(BatchNorm2d(3, dtype=f64)).eval()
    before = {k: v.clone() for k, v in bn.state_dict().items()}
    x = torch.randn(2, 3, 4, 4, dtype=f64)
    out = bn(x)
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    expected = (x - bn.running_mean.view(1, 3, 1, 1)) * scale.view(1, 3, 1, 1) + bn.bias.view(1, 3, 1, 1)
    assert rel(out, expected) < 1e-14
    dout = torch.randn_like(x)
    assert rel(bn.backward(dout), dout * scale.view(1, 3, 1, 1)) < 1e-14  # the affine map's backward
    for k, v in bn.state_dict().items():
        assert torch.equal(v, before[k]), k


def _step_by_step(x, gamma, beta, eps):
    """Training-mode batch norm of x (M, C) as a chain of elementwise steps, each a node of the computational graph
    (CS231n's batchnorm_forward), for autograd to differentiate node by node."""
    mu = x.sum(0) / x.shape[0]  # step 1: mean
    xmu = x - mu  # step 2: centre
    var = (xmu**2).sum(0) / x.shape[0]  # steps 3-4: the biased variance
    ivar = 1.0 / torch.sqrt(var + eps)  # steps 5-6
    return gamma * (xmu * ivar) + beta  # steps 7-9: normalise, scale, shift


@pytest.mark.parametrize("textbook", [True, False], ids=["textbook", "kernel"])
def test_compact_backward_equals_the_step_by_step_graph(textbook):
    """The one-statement backward (the layer's textbook, and its kernel) against autograd through the step-by-step
    graph, as CS231n's batchnorm_backward_alt is checked against batchnorm_backward."""
    torch.manual_seed(2)
    x, dout = torch.randn(7, 5, dtype=f64) * 2 + 3, torch.randn(7, 5, dtype=f64)
    bn = nontrivial(BatchNorm1d(5, dtype=f64))
    leaves = [t.detach().clone().requires_grad_() for t in (x, bn.weight, bn.bias)]
    out = _step_by_step(*leaves, bn.eps)
    dx, dgamma, dbeta = torch.autograd.grad(out, leaves, dout)
    with kernels.disabled() if textbook else contextlib.nullcontext():
        assert rel(bn(x), out.detach()) < 1e-13
        assert rel(bn.backward(dout), dx) < 1e-12
    assert rel(bn.weight.grad, dgamma) < 1e-13 and rel(bn.bias.grad, dbeta) < 1e-13
    # (N, C, H, W): the same graph on channels-last rows
    x4, d4 = torch.randn(2, 3, 4, 2, dtype=f64), torch.randn(2, 3, 4, 2, dtype=f64)
    bn2 = nontrivial(BatchNorm2d(3, dtype=f64))
    rows = lambda t: t.permute(0, 2, 3, 1).reshape(-1, 3)  # noqa: E731
    leaves = [t.detach().clone().requires_grad_() for t in (rows(x4), bn2.weight, bn2.bias)]
    out = _step_by_step(*leaves, bn2.eps)
    dx = torch.autograd.grad(out, leaves[0], rows(d4))[0]
    with kernels.disabled() if textbook else contextlib.nullcontext():
        assert rel(rows(bn2(x4)), out.detach()) < 1e-13 and rel(rows(bn2.backward(d4)), dx) < 1e-12


def test_batchnorm_initialisation_and_state_dict_equal_torch_and_draw_nothing():
    state = torch.get_rng_state()
    ours = BatchNorm2d(6)
    assert torch.equal(state, torch.get_rng_state())
    sd, sd_t = ours.state_dict(), nn.BatchNorm2d(6).state_dict()
    assert list(sd) == list(sd_t) == ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    for k in sd:
        assert sd[k].dtype == sd_t[k].dtype and torch.equal(sd[k], sd_t[k]), k
    assert [n for n, _ in ours.named_parameters()] == ["weight", "bias"]
    assert list(BatchNorm1d(3, affine=False, track_running_stats=False).state_dict()) == []
    assert list(BatchNorm1d(3, affine=False).state_dict()) == list(nn.BatchNorm1d(3, affine=False).state_dict())


@pytest.mark.parametrize("opts", BN_OPTIONS, ids=str)
def test_batchnorm_from_torch_to_torch_round_trip_with_buffers(opts):
    torch.manual_seed(4)
    theirs = nn.BatchNorm2d(3, dtype=f64, **opts)
    theirs(torch.randn(4, 3, 2, 2, dtype=f64) * 3 + 2)  # non-trivial running statistics, one batch tracked
    theirs.eval()
    ours = from_torch(theirs)
    assert isinstance(ours, BatchNorm2d) and not ours.training
    assert (ours.momentum, ours.eps, ours.affine, ours.track_running_stats) == (
        theirs.momentum,
        theirs.eps,
        theirs.affine,
        theirs.track_running_stats,
    )
    back = ours.to_torch()
    assert type(back) is nn.BatchNorm2d and not back.training
    for a, b, c in [(theirs.state_dict(), ours.state_dict(), back.state_dict())]:
        assert list(a) == list(b) == list(c)
        for k in a:
            assert torch.equal(a[k], b[k]) and torch.equal(a[k], c[k]) and a[k].dtype == c[k].dtype, k
    x = torch.randn(2, 3, 2, 2, dtype=f64)
    assert rel(ours(x), theirs(x)) < 1e-14 and rel(back(x), theirs(x)) < 1e-14


def test_gradients_accumulate_across_two_backwards():
    torch.manual_seed(5)
    bn = nontrivial(BatchNorm1d(3, dtype=f64))
    x1, x2 = torch.randn(4, 3, dtype=f64), torch.randn(4, 3, dtype=f64)
    d1, d2 = torch.randn(4, 3, dtype=f64), torch.randn(4, 3, dtype=f64)
    grads = []
    for x, d in ((x1, d1), (x2, d2)):
        bn.zero_grad()
        bn(x)
        bn.backward(d)
        grads.append([p.grad.clone() for p in bn.parameters()])
    bn.zero_grad()
    for x, d in ((x1, d1), (x2, d2)):
        bn(x)
        bn.backward(d)
    for p, g1, g2 in zip(bn.parameters(), *grads, strict=True):
        assert rel(p.grad, g1 + g2) < 1e-14


def test_batchnorm_float32_sane_vs_torch():
    torch.manual_seed(6)
    ours = nontrivial(BatchNorm2d(8))
    theirs = nn.BatchNorm2d(8)
    theirs.load_state_dict(ours.state_dict())
    x, dout = torch.randn(16, 8, 6, 6) * 4 + 10, torch.randn(16, 8, 6, 6)
    xr = x.clone().requires_grad_()
    out_t = theirs(xr)
    out_t.backward(dout)
    out, dx = ours(x), ours.backward(dout)
    assert rel(out, out_t.detach()) < 1e-5 and rel(dx, xr.grad) < 1e-4
    assert rel(ours.weight.grad, theirs.weight.grad) < 1e-4 and rel(ours.bias.grad, theirs.bias.grad) < 1e-4
    assert rel(ours.running_mean, theirs.running_mean) < 1e-5 and rel(ours.running_var, theirs.running_var) < 1e-5
    ours.eval(), theirs.eval()
    assert rel(ours(x), theirs(x).detach()) < 1e-5


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
def test_batchnorm_half_input_keeps_float32_statistics(low):
    """Issue 10's mixed precision: a bfloat16/float16 input with float32 parameters, statistics in float32."""
    torch.manual_seed(7)
    ours = nontrivial(BatchNorm2d(4))
    theirs = nn.BatchNorm2d(4)
    theirs.load_state_dict(ours.state_dict())
    x = (torch.randn(8, 4, 5, 5) * 2 + 300).to(low)  # a large mean: sum(x^2)/M - mean^2 would cancel
    xr = x.clone().requires_grad_()
    out_t = theirs(xr)
    out = ours(x)
    dout = torch.randn_like(out)
    out_t.backward(dout)
    dx = ours.backward(dout)
    assert out.dtype == low and dx.dtype == low and ours.running_mean.dtype == torch.float32
    assert ours.weight.grad.dtype == torch.float32
    x32 = x.float()
    exact = (x32 - x32.mean((0, 2, 3), keepdim=True)) / torch.sqrt(
        x32.var((0, 2, 3), unbiased=False, keepdim=True) + 1e-5
    )
    exact = exact * ours.weight.view(1, 4, 1, 1) + ours.bias.view(1, 4, 1, 1)
    assert rel(out.float(), exact) < 1e-2 and rel(out.float(), out_t.float().detach()) < 1e-2
    assert rel(dx.float(), xr.grad.float()) < 3e-2
    assert rel(ours.running_mean, theirs.running_mean) < 1e-5 and rel(ours.running_var, theirs.running_var) < 1e-3
    assert rel(ours.weight.grad, theirs.weight.grad) < 2e-2


def test_batchnorm_bad_input_and_arguments():
    bn = BatchNorm2d(3, dtype=f64)
    with pytest.raises(ValueError, match=r"BatchNorm2d\(3.*expected input of shape \(N, 3, H, W\), got \(2, 3, 4\)"):
        bn(torch.randn(2, 3, 4, dtype=f64))
    with pytest.raises(ValueError, match=r"got \(2, 4, 2, 2\)"):
        bn(torch.randn(2, 4, 2, 2, dtype=f64))
    with pytest.raises(ValueError, match="dtype torch.float32 but the parameters have dtype torch.float64"):
        bn(torch.randn(2, 3, 2, 2))
    with pytest.raises(ValueError, match="floating-point"):
        bn(torch.ones(2, 3, 2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="torch.Tensor"):
        bn([[1.0]])
    with pytest.raises(ValueError, match=r"expected input of shape \(N, 3\) or \(N, 3, L\)"):
        BatchNorm1d(3)(torch.randn(2, 3, 4, 4))
    with pytest.raises(ValueError, match="more than 1 value per channel when training"):
        bn(torch.randn(1, 3, 1, 1, dtype=f64))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        BatchNorm1d(3)(torch.randn(1, 3))
    BatchNorm1d(3).eval()(torch.randn(1, 3))  # eval mode: one sample is fine, as in torch
    with pytest.raises(RuntimeError, match="backward called before forward"):
        bn.backward(torch.randn(2, 3, 2, 2, dtype=f64))
    x = torch.randn(2, 3, 2, 2, dtype=f64)
    bn(x)
    with pytest.raises(ValueError, match=r"dout has shape \(2, 3, 2\)"):
        bn.backward(torch.randn(2, 3, 2, dtype=f64))
    bn.backward(torch.randn_like(x))
    with pytest.raises(RuntimeError, match="backward called before forward"):
        bn.backward(torch.randn_like(x))
    for kwargs, match in [
        ({"num_features": 0}, "num_features must be an int >= 1, got 0"),
        ({"num_features": 3, "momentum": 1.5}, r"momentum must be a finite number in \[0.0, 1.0\], got 1.5"),
        ({"num_features": 3, "eps": -1}, r"eps must be a finite number in \[0.0, inf\], got -1"),
        ({"num_features": 3, "affine": 1}, "affine must be a bool, got 1"),
        ({"num_features": 3, "dtype": torch.int32}, "dtype must be floating point"),
    ]:
        with pytest.raises(ValueError, match=match):
            BatchNorm2d(**kwargs)


# -- LayerNorm --------------------------------------------------------------------------------------

LN_CONFIGS = [
    (6, (4, 6), {}),
    (5, (1, 5), {}),
    ((3, 4), (2, 3, 4), {}),
    ([4], (2, 3, 4), {"bias": False}),
    (4, (3, 4), {"elementwise_affine": False}),
    ((2, 3, 2), (2, 2, 3, 2), {"eps": 1e-2}),
]


@pytest.mark.parametrize("ns,shape,opts", LN_CONFIGS, ids=str)
def test_layernorm_gradcheck_and_equals_torch(ns, shape, opts):
    torch.manual_seed(8)
    ours = nontrivial(LayerNorm(ns, dtype=f64, **opts))
    assert_all_pass(check_layer(ours, torch.randn(*shape, dtype=f64) * 2 + 1))
    theirs = nn.LayerNorm(ns, dtype=f64, **opts)
    theirs.load_state_dict(ours.state_dict())
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for _ in range(2):  # gradients accumulate like torch's
        x, dout = torch.randn(*shape, dtype=f64) * 3 - 1, torch.randn(*shape, dtype=f64)
        xr = x.clone().requires_grad_()
        out_t = theirs(xr)
        out_t.backward(dout)
        assert rel(ours(x), out_t.detach()) < 1e-12 and rel(ours.backward(dout), xr.grad) < 1e-12
        for (n, p), (_, p_t) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
            assert rel(p.grad, p_t.grad) < 1e-12, n
    ours.eval()
    x = torch.randn(*shape, dtype=f64)
    assert rel(ours(x), theirs.eval()(x).detach()) < 1e-12  # no running state: eval == train


def test_layernorm_init_conversion_and_errors():
    ours = LayerNorm((3, 4))
    assert ours.normalized_shape == (3, 4) and torch.equal(ours.weight, torch.ones(3, 4))
    theirs = nn.LayerNorm((3, 4), eps=1e-3, bias=False)
    with torch.no_grad():
        theirs.weight.uniform_()
    conv = from_torch(theirs)
    assert isinstance(conv, LayerNorm) and conv.bias is None and conv.eps == 1e-3
    back = conv.to_torch()
    assert back.bias is None and torch.equal(back.weight, theirs.weight) and list(back.state_dict()) == ["weight"]
    assert from_torch(nn.LayerNorm(4, elementwise_affine=False)).weight is None
    with pytest.raises(ValueError, match=r"expected input of shape \(\*, 3, 4\), got \(2, 4, 3\)"):
        ours(torch.randn(2, 4, 3))
    with pytest.raises(ValueError, match="dtype torch.float64 but the parameters have dtype torch.float32"):
        ours(torch.randn(2, 3, 4, dtype=f64))
    with pytest.raises(RuntimeError, match="backward called before forward"):
        ours.backward(torch.randn(2, 3, 4))
    for bad in (0, (), (3, -1), "4", 2.0):
        with pytest.raises(ValueError, match="normalized_shape must be"):
            LayerNorm(bad)
    out = LayerNorm(4, elementwise_affine=False)(torch.randn(2, 4, dtype=f64))  # no parameters: any float dtype
    assert out.dtype == f64


def test_layernorm_bfloat16_input_float32_params():
    torch.manual_seed(9)
    ours = nontrivial(LayerNorm(16))
    theirs = nn.LayerNorm(16)
    theirs.load_state_dict(ours.state_dict())
    x = (torch.randn(8, 16) + 50).bfloat16()
    out = ours(x)
    assert out.dtype == torch.bfloat16 and rel(out.float(), theirs(x).float().detach()) < 2e-2
    assert ours.backward(torch.ones_like(out)).dtype == torch.bfloat16 and ours.weight.grad.dtype == torch.float32


@pytest.mark.cuda
def test_norm_layers_on_cuda_equal_cpu():
    torch.manual_seed(10)
    for make, shape in (
        (lambda: nontrivial(BatchNorm2d(3, momentum=None, dtype=f64)), (4, 3, 5, 5)),
        (lambda: nontrivial(LayerNorm(5, dtype=f64)), (4, 3, 5)),
    ):
        cpu = make()
        gpu = make()
        gpu.load_state_dict(cpu.state_dict())
        gpu.to("cuda")
        x, d = torch.randn(*shape, dtype=f64), torch.randn(*shape, dtype=f64)
        assert rel(gpu(x.cuda()).cpu(), cpu(x)) < 1e-12
        assert rel(gpu.backward(d.cuda()).cpu(), cpu.backward(d)) < 1e-12
        for (n, a), (_, b) in zip(cpu.state_dict().items(), gpu.state_dict().items(), strict=True):
            assert torch.allclose(a, b.cpu(), rtol=1e-12), n


@pytest.mark.parametrize(
    "cls,cls_t,shape",
    [
        (BatchNorm1d, nn.BatchNorm1d, (0, 3)),
        (BatchNorm1d, nn.BatchNorm1d, (0, 3, 4)),
        (BatchNorm2d, nn.BatchNorm2d, (0, 3, 2, 2)),
    ],
    ids=str,
)
@pytest.mark.parametrize("opts", [{}, {"momentum": None}, {"track_running_stats": False}, {"bias": False}], ids=str)
def test_batchnorm_empty_batch_as_torch(cls, cls_t, shape, opts):
    """An empty batch in training mode: torch returns an empty output, counts the batch in num_batches_tracked,
    leaves the running statistics and gives zero parameter gradients; then a real batch (momentum=None's average
    counts the empty one, as torch's does) and eval mode on an empty batch."""
    torch.manual_seed(6)
    ours = nontrivial(cls(3, dtype=f64, **opts))
    theirs = torch_twin(ours, cls_t, **opts)
    full = (5,) + shape[1:]
    for x_shape, training in ((shape, True), (full, True), (shape, False)):
        ours.train(training), theirs.train(training)
        x = torch.randn(*x_shape, dtype=f64) * 2 + 1
        dout = torch.randn(*x_shape, dtype=f64)
        xr = x.clone().requires_grad_()
        out_t = theirs(xr)
        out_t.backward(dout)
        out = ours(x)
        dx = ours.backward(dout)
        assert out.shape == out_t.shape and dx.shape == xr.grad.shape == x.shape
        if x.numel():
            assert rel(out, out_t.detach()) < 1e-12 and rel(dx, xr.grad) < 1e-12
        for (name, p), (_, p_t) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
            assert torch.isfinite(p.grad).all() and torch.allclose(p.grad, p_t.grad, rtol=1e-12, atol=0), name
        sd, sd_t = ours.state_dict(), theirs.state_dict()
        assert list(sd) == list(sd_t)
        for k in sd:
            assert torch.allclose(sd[k], sd_t[k], rtol=1e-12, atol=0), (x_shape, k)


def test_batchnorm_one_value_per_channel_is_still_refused():
    with pytest.raises(
        ValueError,
        match=r"expected more than 1 value per channel when training, got input of "
        r"shape \(1, 3\)",
    ):
        BatchNorm1d(3)(torch.randn(1, 3))


def test_batchnorm_bias_false_names_and_repr_as_torch():
    ours, theirs = BatchNorm2d(4, bias=False), nn.BatchNorm2d(4, bias=False)
    assert ours.bias is None and list(ours.state_dict()) == list(theirs.state_dict())
    assert repr(ours) == repr(theirs) and repr(BatchNorm1d(2, affine=False)) == repr(nn.BatchNorm1d(2, affine=False))
    back = from_torch(theirs).to_torch()
    assert back.bias is None and back.weight is not None
    with pytest.raises(ValueError, match="bias must be a bool, got 0"):
        BatchNorm1d(3, bias=0)


def test_layernorm_refuses_an_input_changed_in_place_before_backward():
    """LayerNorm keeps its input (xhat is recomputed from it in backward), so changing it in between is refused."""
    ln = LayerNorm(4, dtype=f64)
    x = torch.randn(3, 4, dtype=f64)
    ln(x)
    x.add_(1.0)
    with pytest.raises(
        RuntimeError,
        match=r"LayerNorm\(.*\): its input x was modified in place after the forward, "
        r"before backward",
    ):
        ln.backward(torch.ones(3, 4, dtype=f64))


def test_layernorm_half_precision_input_changed_in_place_is_refused():
    """A bfloat16 input is kept as a float32 one is, so changing it in place before backward is refused, naming it,
    as torch.autograd refuses it."""
    ln = LayerNorm(4)
    x = torch.randn(2, 4).bfloat16()
    out = ln(x)
    x.mul_(2)
    with pytest.raises(RuntimeError, match="its input x"):
        ln.backward(torch.ones_like(out))
    ln(x)
    assert ln.backward(torch.ones_like(out)).dtype == torch.bfloat16


class _FullSize(TorchDispatchMode):
    """Records every op that makes a tensor of ``shape`` (the input's: what dx's statement would allocate)."""

    def __init__(self, shape):
        super().__init__()
        self.shape, self.ops = torch.Size(shape), []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.shape == self.shape:
            self.ops.append(str(func))
        return out


@pytest.mark.parametrize("cls,_,shape", BN_CONFIGS[1::2], ids=ids(BN_CONFIGS[1::2]))
@pytest.mark.parametrize("opts", [{}, {"bias": False}, {"affine": False}, {"track_running_stats": False}], ids=str)
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.usefixtures("kernels_on")  # (the kernel's economy: the textbook computes dx and drops it)
def test_batchnorm_without_input_grad_gives_the_same_grads_and_computes_no_dx(cls, _, shape, opts, mode):
    """need_input_grad=False (a network's first layer): None, .grad as with dx, and dx's statement never runs
    (fewer input-sized tensors; none at all without parameters; the sums dx needs are not reduced)."""
    torch.manual_seed(11)
    layer = nontrivial(cls(shape[1], dtype=f64, **opts)).train(mode == "train")
    x, dout = torch.randn(*shape, dtype=f64) * 2 + 1, torch.randn(*shape, dtype=f64)
    reduced = []
    layer._reduce_grad_sums = lambda *sums: reduced.append(1) or sums[:2]  # the sums only dx reads
    runs = {}
    for need in (True, False):
        layer.zero_grad()
        layer(x)
        with _FullSize(shape) as made:
            dx = layer.backward(dout, need_input_grad=need)
        runs[need] = (
            dx,
            [None if p.grad is None else p.grad.clone() for p in layer.parameters()],
            made.ops,
            len(reduced),
        )
        reduced.clear()
    (dx, with_dx, ops_dx, reduced_dx), (none, without_dx, ops, reduced_none) = runs[True], runs[False]
    assert none is None and isinstance(dx, torch.Tensor) and dx.shape == x.shape
    assert len(with_dx) == len(without_dx) == (0 if opts.get("affine") is False else 2 - ("bias" in opts))
    for g, h in zip(with_dx, without_dx, strict=True):
        assert torch.equal(g, h)
    assert len(ops) < len(ops_dx), (ops, ops_dx)
    if opts.get("affine") is False:
        assert ops == [], ops
    assert reduced_none == 0 and reduced_dx == (1 if mode == "train" or "track_running_stats" in opts else 0)


def test_a_twin_under_a_torch_whose_batch_norm_takes_no_bias(monkeypatch):
    """Before torch gave BatchNorm a ``bias`` argument its BatchNorm always had one: to_torch leaves the argument
    out where it is True, and refuses by name where it is False (no such twin exists there)."""
    import layers.layer as layer_module

    takes = layer_module._torch_takes
    monkeypatch.setattr(layer_module, "_torch_takes", lambda cls, name: name != "bias" and takes(cls, name))
    ours = nontrivial(BatchNorm2d(3, dtype=f64))
    twin = ours.to_torch()
    assert twin.bias is not None and torch.equal(twin.bias, ours.bias)
    with pytest.raises(TypeError, match=r"BatchNorm2d\(3.*bias=False.*has no twin in torch .*takes no bias argument"):
        BatchNorm2d(3, bias=False).to_torch()

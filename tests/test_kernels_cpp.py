"""The C++ kernels (kernels/cpp/): each tied to its layer's textbook and to torch.autograd, each operator checked by
torch.library.opcheck, one compiled into a fullgraph torch.compile, and the textbook path where no build is possible.

The kernels are built once (the ``built`` fixture, shared by the session; the build folder is the suite's persistent
TORCH_EXTENSIONS_DIR, so a later run loads them in about a second).  Each test that runs a layer also checks that its
kernel was called (``calls``): a dispatch that silently took the eager path would otherwise pass.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import warnings

import pytest
import torch
import torch.nn.functional as F

import kernels
import optimizers
from kernels import cpp
from layers import GELU, GRU, LSTM, BatchNorm1d, BatchNorm2d, LayerNorm, MaxPool2d, ScaledDotProductAttention
from losses import CrossEntropyLoss
from tests.test_kernels import rel_err

F64, F32 = torch.float64, torch.float32
TOL = {F64: 1e-12, F32: 2e-5}  # float64 agrees to rounding (1e-7 asked); float32 to a few of its units
pytestmark = pytest.mark.usefixtures("kernels_on")


@pytest.fixture(scope="session")
def built():
    """The library, built or loaded once for the session; no compiler or ninja here: skipped (a failed build fails)."""
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler here")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok = cpp.available()
    assert ok, [str(w.message) for w in caught]
    return cpp.ops


class _Spy:
    """torch.ops.handgrad, counting each operator's calls by name."""

    def __init__(self, ops):
        self.ops, self.counts = ops, {}

    def __getattr__(self, name):
        op = getattr(self.ops, name)

        def call(*args, **kwargs):
            self.counts[name] = self.counts.get(name, 0) + 1
            return op(*args, **kwargs)

        return call


@pytest.fixture
def calls(built, monkeypatch):
    """The count of each C++ operator's calls in this test, by name."""
    spy = _Spy(built)
    monkeypatch.setattr(cpp, "ops", spy)
    return spy.counts


def run_layer(make, x, dout, textbook: bool):
    """out, dx and the parameter gradients of make()'s layer, with the kernels on or (textbook) off."""
    with kernels.disabled() if textbook else contextlib.nullcontext():
        layer = make()
        out = layer(x)
        dx = layer.backward(dout)
        return [out, dx, *(p.grad for p in layer.parameters())]


def autograd_reference(fn, x, params, dout):
    """out, dx and the parameter gradients of fn(x, *params) by torch.autograd."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, *params)]
    out = fn(*leaves)
    grads = torch.autograd.grad(out, leaves, dout)
    return [out.detach(), *grads]


def assert_close(got, want, dtype, what):
    assert len(got) == len(want), what
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.shape == b.shape and a.dtype == b.dtype, (what, i, a.shape, b.shape, a.dtype, b.dtype)
        assert rel_err(a, b) < TOL[dtype], (what, i, rel_err(a, b))


# -- layer norm ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize(
    "shape, norm, affine, bias",
    [((6, 24), (24,), True, True), ((3, 5, 7), (5, 7), True, False), ((2, 4, 33), (33,), False, False)],
)
def test_layer_norm_backward_equals_the_textbook_and_autograd(calls, dtype, shape, norm, affine, bias):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g, dtype=dtype) * 3 + 1
    dout = torch.randn(shape, generator=g, dtype=dtype)

    def make():
        ln = LayerNorm(norm, elementwise_affine=affine, bias=bias, dtype=dtype)
        for p in ln.parameters():  # gamma away from 1, beta away from 0: defaults can hide a term
            p.detach().copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1), dtype=dtype))
        return ln

    fast = run_layer(make, x, dout, textbook=False)
    assert calls.get("layer_norm_backward") == 1
    assert_close(fast, run_layer(make, x, dout, textbook=True), dtype, "textbook")
    want = autograd_reference(lambda x, *p: F.layer_norm(x, norm, *p, eps=1e-5), x, list(make().parameters()), dout)
    assert_close(fast, want, dtype, "autograd")


@pytest.mark.parametrize("dtype", [F64, F32])
def test_layer_norm_forward_op_equals_aten(built, dtype):
    g = torch.Generator().manual_seed(2)
    x, w, b = (torch.randn(s, generator=g, dtype=dtype) for s in ((9, 37), (37,), (37,)))
    out, mean, rstd = built.layer_norm_forward(x, w, b, 1e-5)
    ref = torch.native_layer_norm(x, (37,), w, b, 1e-5)
    for a, r in zip((out, mean, rstd), ref, strict=True):
        assert rel_err(a, r.view(a.shape)) < TOL[dtype]


# -- GELU -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_backward_equals_the_textbook_and_autograd(calls, dtype, approximate):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 67, generator=g, dtype=dtype) * 4  # 67: a tail shorter than a vector
    x[0, :4] = torch.tensor([0.0, -0.0, torch.finfo(dtype).tiny / 4, -30.0])  # 0/0, a subnormal, Phi's underflow
    dout = torch.randn(x.shape, generator=g, dtype=dtype)
    fast = run_layer(lambda: GELU(approximate=approximate), x, dout, textbook=False)
    assert calls.get("gelu_tanh_backward" if approximate == "tanh" else "gelu_backward") == 1
    assert_close(fast, run_layer(lambda: GELU(approximate=approximate), x, dout, textbook=True), dtype, "textbook")
    want = autograd_reference(lambda x: F.gelu(x, approximate=approximate), x, [], dout)
    assert_close(fast, want, dtype, "autograd")


def test_gelu_backward_keeps_a_nan(built):
    x = torch.tensor([float("nan"), 0.0, 1.0], dtype=F64)
    dx = built.gelu_backward(x, F.gelu(x), torch.ones_like(x))
    assert dx[0].isnan() and dx[1] == 0.5 and not dx[2].isnan()


# -- optimizers -----------------------------------------------------------------------------------------------------

OPTIMIZERS = [
    ("SGD", {"lr": 0.1, "momentum": 0.9}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01, "dampening": 0.3}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("Adam", {"lr": 0.01}),
    ("Adam", {"lr": 0.01, "weight_decay": 0.1, "betas": (0.3, 0.9)}),  # lerp's other form: 1 - beta1 >= 1/2
    ("AdamW", {"lr": 0.01, "weight_decay": 0.1}),
]


def optimizer_steps(name, kw, dtype, mode, steps=4):
    """The parameters after ``steps`` steps on seeded gradients: mode "cpp" (the kernels on), "textbook" (off),
    "torch" (torch.optim's own, foreach=False)."""
    g = torch.Generator().manual_seed(4)
    params = [torch.randn(s, generator=g, dtype=dtype, requires_grad=True) for s in ((37,), (5, 3), (8, 16))]
    if mode == "torch":
        opt = getattr(torch.optim, name)(params, foreach=False, **kw)
    else:
        opt = getattr(optimizers, name)(params, **kw)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g, dtype=dtype)
        with kernels.disabled() if mode == "textbook" else contextlib.nullcontext():
            opt.step()
    return [p.detach() for p in params]


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("name, kw", OPTIMIZERS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(OPTIMIZERS)])
def test_the_fused_optimizer_step_equals_the_textbook_and_torch(calls, dtype, name, kw):
    fast = optimizer_steps(name, kw, dtype, "cpp")
    op = "sgd_step" if name == "SGD" else "adam_step"
    assert calls.get(op) == (3 if name == "SGD" else 4)  # SGD's first step sets the buffer: the textbook's
    for mode, tol in (("textbook", 1e-15 if dtype == F64 else 1e-6), ("torch", TOL[dtype])):
        for a, b in zip(fast, optimizer_steps(name, kw, dtype, mode), strict=True):
            assert rel_err(a, b) < tol, (mode, rel_err(a, b))


def test_the_fused_step_leaves_what_it_does_not_handle_to_the_textbook(calls):
    p = torch.zeros(4, dtype=F64, requires_grad=True)
    for opt in (optimizers.Adam([p], amsgrad=True), optimizers.SGD([p], lr=0.1)):  # amsgrad; SGD without momentum
        p.grad = torch.ones(4, dtype=F64)
        opt.step()
    assert not calls


# -- softmax with cross-entropy ---------------------------------------------------------------------------------------


def loss_grads(logits, target, textbook: bool, **kw):
    """The loss and dL/dlogits of CrossEntropyLoss(**kw), with the kernels on or (textbook) off."""
    with kernels.disabled() if textbook else contextlib.nullcontext():
        crit = CrossEntropyLoss(**kw)
        loss = crit(logits, target)
        return [loss, crit.backward()]


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("kw", [{}, {"label_smoothing": 0.1, "reduction": "sum"}, {"ignore_index": 2}])
def test_cross_entropy_backward_equals_the_textbook_and_autograd(calls, dtype, kw):
    g = torch.Generator().manual_seed(5)
    z, y = torch.randn(6, 19, generator=g, dtype=dtype) * 5, torch.randint(0, 19, (6,), generator=g)
    y[0] = 2  # an ignored position where ignore_index = 2: the eager kernel's case (the C++ one is not called)
    fast = loss_grads(z, y, textbook=False, **kw)
    assert calls.get("cross_entropy_backward", 0) == (0 if "ignore_index" in kw else 1)
    assert_close(fast, loss_grads(z, y, textbook=True, **kw), dtype, "textbook")
    want = autograd_reference(lambda z: F.cross_entropy(z, y, **kw), z, [], torch.ones((), dtype=dtype))
    assert_close(fast, want, dtype, "autograd")


# -- softmax with cross-entropy, batch norm: the operators alone ----------------------------------------------------


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_cross_entropy_ops_equal_autograd(built, dtype, eps):
    g = torch.Generator().manual_seed(5)
    z, y = torch.randn(7, 19, generator=g, dtype=dtype) * 5, torch.randint(0, 19, (7,), generator=g)
    logp, total = built.cross_entropy_forward(z, y, eps)
    zr = z.clone().requires_grad_(True)
    loss = F.cross_entropy(zr, y, label_smoothing=eps, reduction="sum")
    loss.backward()
    assert rel_err(-total, loss.detach()) < TOL[dtype]
    assert rel_err(logp, torch.log_softmax(z, 1)) < TOL[dtype]
    assert rel_err(built.cross_entropy_backward(logp, y, 1.0, eps), zr.grad) < TOL[dtype]


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize(
    "cls, shape, opts",
    [
        (BatchNorm2d, (4, 3, 5, 7), {}),  # S = 35: a tail shorter than a vector
        (BatchNorm2d, (2, 5, 4, 4), {"bias": False}),
        (BatchNorm2d, (3, 2, 3, 3), {"affine": False}),
        (BatchNorm1d, (6, 4, 9), {"track_running_stats": False}),
    ],
    ids=["2d", "2d-no-bias", "2d-no-affine", "1d-no-running-stats"],
)
def test_batch_norm_equals_the_textbook_and_autograd(calls, dtype, cls, shape, opts):
    """Training mode: the C++ forward (statistics, output, the running estimates it updates) and backward."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(shape, generator=g, dtype=dtype) * 3 + 1
    dout = torch.randn(shape, generator=g, dtype=dtype)
    layers = []

    def make():
        bn = cls(shape[1], dtype=dtype, **opts)
        for p in bn.parameters():  # gamma away from 1, beta away from 0: defaults can hide a term
            p.detach().copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1), dtype=dtype))
        layers.append(bn)
        return bn

    fast = run_layer(make, x, dout, textbook=False)
    assert calls.get("batch_norm_forward") == 1 and calls.get("batch_norm_backward") == 1
    assert_close(fast, run_layer(make, x, dout, textbook=True), dtype, "textbook")
    if opts.get("track_running_stats", True):
        assert_close(
            [layers[0].running_mean, layers[0].running_var],
            [layers[1].running_mean, layers[1].running_var],
            dtype,
            "running statistics",
        )
    params = list(make().parameters())
    ref = lambda x, w=None, b=None: F.batch_norm(x, None, None, w, b, True, 0.1, 1e-5)  # noqa: E731
    want = autograd_reference(ref, x, params, dout)
    assert_close(fast, want, dtype, "autograd")


def test_batch_norm_without_input_grad_runs_no_dx_pass(calls):
    """A network's first normalisation: the kernel's sums alone, the same bits as with dx."""
    g = torch.Generator().manual_seed(7)
    x, dout = torch.randn(4, 3, 6, 6, generator=g, dtype=F64), torch.randn(4, 3, 6, 6, generator=g, dtype=F64)
    grads = {}
    for need in (True, False):
        bn = BatchNorm2d(3, dtype=F64)
        bn(x)
        dx = bn.backward(dout, need_input_grad=need)
        assert (dx is None) is not need
        grads[need] = [p.grad for p in bn.parameters()]
    assert calls.get("batch_norm_backward") == 2
    assert all(torch.equal(a, b) for a, b in zip(grads[True], grads[False], strict=True))


@pytest.mark.parametrize(
    "why, x",
    [
        ("channels last", torch.randn(4, 3, 5, 5).to(memory_format=torch.channels_last)),
        ("(N, C): no axis after the channels", torch.randn(8, 3)),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_batch_norm_takes_the_layers_path_where_the_kernel_does_not_apply(calls, why, x):
    """Not a contiguous (N, C, ...) x: the layer's own forward, its eager backward, the same numbers as the
    textbook."""
    dout = torch.randn(x.shape)
    fast = run_layer(lambda: BatchNorm1d(3) if x.dim() == 2 else BatchNorm2d(3), x, dout, textbook=False)
    assert "batch_norm_forward" not in calls and "batch_norm_backward" not in calls, why
    want = run_layer(lambda: BatchNorm1d(3) if x.dim() == 2 else BatchNorm2d(3), x, dout, textbook=True)
    assert_close(fast, want, F32, why)


def test_batch_norm_of_a_bfloat16_input_runs_the_kernel_in_float32(calls):
    """The statistics dtype is float32 (the layer's rule), so the kernel runs on the float32 copy of x: the
    textbook's float32 numbers, rounded once to bfloat16."""
    g = torch.Generator().manual_seed(8)
    x, dout = (torch.randn(4, 3, 5, 5, generator=g).bfloat16() for _ in range(2))
    fast = run_layer(lambda: BatchNorm2d(3), x, dout, textbook=False)
    assert calls.get("batch_norm_forward") == 1 and calls.get("batch_norm_backward") == 1
    want = run_layer(lambda: BatchNorm2d(3), x, dout, textbook=True)
    for a, b in zip(fast, want, strict=True):  # a float32 difference at most flips a last bfloat16 bit
        assert a.dtype == b.dtype and (a.float() - b.float()).abs().max() <= 2**-7 * b.float().abs().max()


@pytest.mark.parametrize("dtype", [F64, F32])
def test_batch_norm_ops_equal_autograd(built, dtype):
    g = torch.Generator().manual_seed(6)
    x, w, b = (torch.randn(s, generator=g, dtype=dtype) for s in ((4, 3, 10), (3,), (3,)))
    dout = torch.randn(x.shape, generator=g, dtype=dtype)
    out, mean, var, rstd = built.batch_norm_forward(x, w, b, 1e-5)
    want = autograd_reference(lambda x, w, b: F.batch_norm(x, None, None, w, b, True, 0.1, 1e-5), x, [w, b], dout)
    assert rel_err(out, want[0]) < TOL[dtype]
    assert rel_err(var, x.var((0, 2), unbiased=False)) < TOL[dtype]
    dx, dw, db = built.batch_norm_backward(dout, x, mean, rstd, w, True)
    for a, r in zip((dx, dw, db), want[1:], strict=True):
        assert rel_err(a, r) < TOL[dtype]
    none, dw2, db2 = built.batch_norm_backward(dout, x, mean, rstd, w, False)  # the parameters' gradients only
    assert none.numel() == 0 and torch.equal(dw2, dw) and torch.equal(db2, db)


# -- the recurrent layers' gates ---------------------------------------------------------------------------------


def recurrent_inputs(cls, kw, dtype):
    """x (T, N, I), the initial state, dout and the final state's gradients, seeded."""
    g = torch.Generator().manual_seed(10)
    T, N, H, P = 7, 3, 6, kw.get("proj_size") or 6
    D, L = 2 if kw.get("bidirectional") else 1, kw.get("num_layers", 1)
    r = lambda *shape: torch.randn(shape, generator=g, dtype=dtype)  # noqa: E731
    state = (r(D * L, N, P), r(D * L, N, H)) if cls is LSTM else (r(D * L, N, H),)
    dstate = (r(D * L, N, P), r(D * L, N, H)) if cls is LSTM else (r(D * L, N, H),)
    return r(T, N, 4), state, r(T, N, D * P), dstate


def recurrent_run(cls, kw, dtype, textbook: bool):
    """output, h_n (and c_n), dx, the state's gradients and the parameter gradients of one forward and backward of
    cls(**kw), the kernels on or (textbook) off."""
    x, state, dout, dstate = recurrent_inputs(cls, kw, dtype)
    with kernels.disabled() if textbook else contextlib.nullcontext():
        torch.manual_seed(9)
        layer = cls(4, 6, dtype=dtype, **kw)
        for p in layer.parameters():  # away from torch's uniform initialisation, so every term is sizeable
            p.detach().mul_(3)
        out, hn = layer(x, state if cls is LSTM else state[0])
        dx, dh0 = layer.backward(dout, dstate if cls is LSTM else dstate[0])
        return [
            out,
            *(hn if cls is LSTM else (hn,)),
            dx,
            *(dh0 if cls is LSTM else (dh0,)),
            *(p.grad for p in layer.parameters()),
        ]


RECURRENT = [
    (LSTM, {}),
    (LSTM, {"bidirectional": True, "num_layers": 2}),
    (LSTM, {"proj_size": 3}),
    (GRU, {}),
    (GRU, {"bidirectional": True, "num_layers": 2}),
]


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("cls, kw", RECURRENT, ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(RECURRENT)])
def test_the_fused_gates_equal_the_textbook_and_autograd(calls, dtype, cls, kw):
    """The layer with the C++ gates against its textbook loop over the cells' equations (the kernels off), the eager
    kernels (the C++ ones off), and torch.nn's twin through autograd."""
    fast = recurrent_run(cls, kw, dtype, textbook=False)
    name = cls.__name__.lower()
    steps = 7 * (2 if kw.get("bidirectional") else 1) * kw.get("num_layers", 1)
    assert calls.get(f"{name}_gates_forward") == steps and calls.get(f"{name}_gates_backward") == steps, calls
    assert_close(fast, recurrent_run(cls, kw, dtype, textbook=True), dtype, "textbook")
    with cpp.disabled():
        assert_close(fast, recurrent_run(cls, kw, dtype, textbook=False), dtype, "eager kernels")
    torch.manual_seed(9)
    twin = cls(4, 6, dtype=dtype, **kw)
    for p in twin.parameters():
        p.detach().mul_(3)
    twin = twin.to_torch()
    x, state, dout, dstate = recurrent_inputs(cls, kw, dtype)
    leaves = [t.clone().requires_grad_(True) for t in (x, *state)]
    out, hn = twin(leaves[0], tuple(leaves[1:]) if cls is LSTM else leaves[1])
    hn = hn if isinstance(hn, tuple) else (hn,)
    grads = torch.autograd.grad([out, *hn], [*leaves, *twin.parameters()], [dout, *dstate])
    assert_close(fast, [out.detach(), *(h.detach() for h in hn), *grads], dtype, "autograd")


# -- max pooling's backward ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("kw", [{"kernel_size": 2}, {"kernel_size": 3, "stride": 1, "padding": 1}])
def test_max_pool_backward_equals_the_textbook_and_autograd(calls, dtype, kw):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 9, 6, 7, generator=g, dtype=dtype)
    x[0, 0, :2, :2] = 1.0  # a tie: the first maximum takes the gradient, as torch's kernel picks it
    make = lambda: MaxPool2d(**kw)  # noqa: E731
    out = MaxPool2d(**kw)(x)
    dout = torch.randn(out.shape, generator=g, dtype=dtype)
    fast = run_layer(make, x, dout, textbook=False)
    assert calls.get("max_pool2d_backward") == 1
    assert_close(fast, run_layer(make, x, dout, textbook=True), dtype, "textbook")
    assert_close(fast, autograd_reference(lambda x: F.max_pool2d(x, **kw), x, [], dout), dtype, "autograd")


# -- attention ---------------------------------------------------------------------------------------------------


def attention_run(q, k, v, dout, textbook: bool, **kw):
    """out, dq, dk, dv of ScaledDotProductAttention(block_size)(q, k, v, **kw), the kernels on or (textbook) off."""
    block = kw.pop("block_size")
    with kernels.disabled() if textbook else contextlib.nullcontext():
        att = ScaledDotProductAttention(block_size=block)
        out = att(q, k, v, **kw)
        return [out, *att.backward(dout)]


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("L, S", [(12, 12), (7, 13), (13, 7)])  # causal is top-left aligned where L != S
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [1, 5, 128])
def test_attention_equals_the_textbook_and_autograd(calls, dtype, L, S, causal, block):
    g = torch.Generator().manual_seed(12)
    q, k = torch.randn(2, 3, L, 19, generator=g, dtype=dtype) * 2, torch.randn(2, 3, S, 19, generator=g, dtype=dtype)
    v = torch.randn(2, 3, S, 11, generator=g, dtype=dtype)  # E 19, Ev 11: tails shorter than a vector
    dout = torch.randn(2, 3, L, 11, generator=g, dtype=dtype)
    fast = attention_run(q, k, v, dout, textbook=False, is_causal=causal, block_size=block)
    assert calls.get("attention_forward") == 1 and calls.get("attention_backward") == 1, calls
    assert_close(
        fast, attention_run(q, k, v, dout, textbook=True, is_causal=causal, block_size=block), dtype, "textbook"
    )
    want = autograd_reference(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), q, [k, v], dout
    )
    assert_close(fast, want, dtype, "autograd")


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("E", [16, 32, 64, 128])
@pytest.mark.parametrize("L, S", [(70, 70), (45, 100), (100, 45), (200, 130)])  # several blocks of query rows
@pytest.mark.parametrize("causal", [False, True])
def test_attention_in_blocks_of_rows_and_keys_equals_the_textbook(calls, dtype, E, L, S, causal):
    # rows in blocks of 32 (64 from L = 192), keys in blocks of 24: neither divides L or S, nor the other block,
    # so a causal block cuts the diagonal at every offset; head widths as the models use them
    g = torch.Generator().manual_seed(14)
    q, k = torch.randn(3, L, E, generator=g, dtype=dtype) * 2, torch.randn(3, S, E, generator=g, dtype=dtype)
    v, dout = torch.randn(3, S, E, generator=g, dtype=dtype), torch.randn(3, L, E, generator=g, dtype=dtype)
    fast = attention_run(q, k, v, dout, textbook=False, is_causal=causal, block_size=24)
    assert calls.get("attention_forward") == 1 and calls.get("attention_backward") == 1, calls
    assert_close(fast, attention_run(q, k, v, dout, textbook=True, is_causal=causal, block_size=24), dtype, "textbook")


def _strided_attention_inputs(dtype, g):
    """q, k, v, dout (6, L, 16) as views whose rows are contiguous and nothing else is: the heads of torch's (L, N, E)
    layout, every other row of a wider buffer, one batch entry broadcast to all (batch stride 0), one row broadcast
    to all (row stride 0)."""
    B, L, S, hd = 6, 45, 70, 16
    r = lambda *s: torch.randn(s, generator=g, dtype=dtype)  # noqa: E731
    q = r(L, B, 2 * hd)[..., :hd].transpose(0, 1)  # (B, L, hd) strides (2 hd, 2 B hd, 1)
    k = r(B, 2 * S, hd)[:, ::2]  # (B, S, hd) row stride 2 hd
    v = r(1, S, hd + 3)[..., 3:].expand(B, S, hd)  # (B, S, hd) batch stride 0, offset 3
    dout = r(B, 1, hd).expand(B, L, hd)  # (B, L, hd) row stride 0
    return q, k, v, dout


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_operators_read_strided_rows(built, dtype, causal):
    q, k, v, dout = _strided_attention_inputs(dtype, torch.Generator().manual_seed(15))
    assert not any(t.is_contiguous() for t in (q, k, v, dout))
    scale = 0.25

    def run(q, k, v, dout):
        out, lse = built.attention_forward(q, k, v, scale, causal, 24)
        D = (dout * out).sum(-1, keepdim=True)
        return [out, lse, *built.attention_backward(q, k, v, dout, D, lse, scale, causal, 24)]

    got = run(q, k, v, dout)
    assert all(t.is_contiguous() for t in got)
    assert_close(got, run(*(t.contiguous() for t in (q, k, v, dout))), dtype, "contiguous copies")
    want = autograd_reference(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale), q, [k, v], dout
    )
    assert_close([got[0], *got[2:]], want, dtype, "autograd")


def test_opcheck_attention_on_strided_views(built):
    q, k, v, dout = _strided_attention_inputs(F64, torch.Generator().manual_seed(16))
    torch.library.opcheck(torch.ops.handgrad.attention_forward.default, (q, k, v, 0.25, True, 24))
    out, lse = built.attention_forward(q, k, v, 0.25, True, 24)
    D = (dout * out).sum(-1, keepdim=True)
    torch.library.opcheck(torch.ops.handgrad.attention_backward.default, (q, k, v, dout, D, lse, 0.25, True, 24))


def _gpt_heads(dtype, g, S=None):
    """q, k, v, dout (B, nh, T, hs) as the GPT makes them: the heads' views of one (B, T, 3C) projection (strides
    (T 3C, hs, 3C, 1)) and of a (B, T, C) gradient; ``S``: k and v from a (B, S, 2C) projection of their own."""
    B, T, nh, hs = 2, 45, 3, 16
    C = nh * hs
    r = lambda *s: torch.randn(s, generator=g, dtype=dtype)  # noqa: E731
    heads = lambda t, n: t.view(B, n, nh, hs).transpose(1, 2)  # noqa: E731
    q, k, v = (heads(t, T) for t in r(B, T, 3 * C).split(C, dim=2))
    if S is not None:
        k, v = (heads(t, S) for t in r(B, S, 2 * C).split(C, dim=2))
    return q, k, v, heads(r(B, T, C), T)


def _heads_side_by_side(t):
    """Whether t (B, H, L, E) is laid out (B, L, H, E) in memory, as the C++ kernels write a 4-D input's outputs."""
    return t.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("S", [None, 70])  # None: self-attention, k and v from q's projection (S = L)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_operators_take_the_gpts_heads_as_they_are(built, dtype, S, causal):
    q, k, v, dout = _gpt_heads(dtype, torch.Generator().manual_seed(17), S)
    assert not any(t.is_contiguous() for t in (q, k, v, dout)) and all(t.stride(-1) == 1 for t in (q, k, v))
    scale = 0.25

    def run(q, k, v, dout):
        out, lse = built.attention_forward(q, k, v, scale, causal, 24)
        D = (dout * out).sum(-1, keepdim=True)
        return [out, lse, *built.attention_backward(q, k, v, dout, D, lse, scale, causal, 24)]

    got = run(q, k, v, dout)
    out, lse, dq, dk, dv = got
    assert all(_heads_side_by_side(t) for t in (out, dq, dk, dv)) and lse.is_contiguous(), [t.stride() for t in got]
    assert out.shape == q.shape and lse.shape == (*q.shape[:-1], 1)
    dense = run(*(t.contiguous() for t in (q, k, v, dout)))
    assert all(t.is_contiguous() for t in dense)  # (the heads apart in q: the outputs contiguous too)
    assert_close(got, dense, dtype, "contiguous copies")
    flat = [t.reshape(-1, *t.shape[2:]) for t in (q, k, v, dout)]  # the 3-D operators on (B nh, T, hs)
    assert_close(got, [t.view(g.shape) for t, g in zip(run(*flat), got, strict=True)], dtype, "3-D")
    want = autograd_reference(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale), q, [k, v], dout
    )
    assert_close([got[0], *got[2:]], want, dtype, "autograd")


def test_opcheck_attention_on_the_gpts_heads(built):
    q, k, v, dout = _gpt_heads(F64, torch.Generator().manual_seed(18))
    torch.library.opcheck(torch.ops.handgrad.attention_forward.default, (q, k, v, 0.25, True, 24))
    out, lse = built.attention_forward(q, k, v, 0.25, True, 24)
    D = (dout * out).sum(-1, keepdim=True).contiguous()
    torch.library.opcheck(torch.ops.handgrad.attention_backward.default, (q, k, v, dout, D, lse, 0.25, True, 24))
    B, nh, T, hs = q.shape
    into = tuple(t.view(B, T, nh, hs).transpose(1, 2) for t in torch.zeros(B, T, 3 * nh * hs, dtype=F64).chunk(3, 2))
    op = torch.ops.handgrad.attention_backward_into.default
    torch.library.opcheck(op, (q, k, v, dout, D, lse, 0.25, True, 24, *into))
    k, v = _gpt_heads(F64, torch.Generator().manual_seed(19), S=70)[1:3]
    torch.library.opcheck(torch.ops.handgrad.attention_forward.default, (q, k, v, 0.5, False, 16))


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_layer_hands_the_gpts_heads_to_the_kernel(calls, dtype, causal):
    q, k, v, dout = _gpt_heads(dtype, torch.Generator().manual_seed(20))
    att = ScaledDotProductAttention(block_size=24)
    out = att(q, k, v, is_causal=causal)
    # the heads' views went in as they are: the output is the kernel's own, heads side by side (no copy made)
    assert _heads_side_by_side(out) and att.kept.q.data_ptr() == q.data_ptr() and att.kept.q.stride() == q.stride()
    got = [out, *att.backward(dout)]
    assert calls.get("attention_forward") == 1 and calls.get("attention_backward") == 1, calls
    assert all(_heads_side_by_side(t) for t in got[1:])
    assert_close(got, attention_run(q, k, v, dout, textbook=True, is_causal=causal, block_size=24), dtype, "textbook")
    want = autograd_reference(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), q, [k, v], dout
    )
    assert_close(got, want, dtype, "autograd")
    # a forward on the heads, its backward without the C++ kernels: the eager kernel on the (batch, head) pairs
    att(q, k, v, is_causal=causal)
    with cpp.disabled():
        eager = [out, *att.backward(dout)]
    assert calls.get("attention_backward") == 1, calls
    assert_close(eager, got, dtype, "eager backward")
    # into=: the gradients written into the heads' views of one (B, T, 3C) buffer, as the GPT asks, by the kernel
    # or (C++ off) copied there
    for off in (False, True):
        att(q, k, v, is_causal=causal)
        B, nh, T, hs = q.shape
        dqkv = torch.full((B, T, 3 * nh * hs), math.nan, dtype=dtype)
        into = tuple(t.view(B, T, nh, hs).transpose(1, 2) for t in dqkv.split(nh * hs, dim=2))
        with cpp.disabled() if off else contextlib.nullcontext():
            assert att.backward(dout, into=into) is into
        assert calls.get("attention_backward_into") == 1 and calls.get("attention_backward") == 1, calls
        assert_close([out, *into], got, dtype, f"into=, C++ {'off' if off else 'on'}")
    with pytest.raises(ValueError, match="into= must be three tensors"):
        att(q, k, v, is_causal=causal)
        att.backward(dout, into=into[:2])


def test_attention_with_a_mask_or_dropout_is_left_to_the_eager_kernel(calls):
    q = torch.randn(2, 5, 8, dtype=F64)
    mask = torch.rand(5, 5, generator=torch.Generator().manual_seed(13)) > 0.3
    att = ScaledDotProductAttention()
    att(q, q, q, attn_mask=mask)
    att.backward(torch.ones(2, 5, 8, dtype=F64))
    att(q, q, q, dropout_p=0.5)
    att.backward(torch.ones(2, 5, 8, dtype=F64))
    assert not calls


# -- the operators' registration -------------------------------------------------------------------------------------


def _attention_sample(r):
    q, k, v, dout = r(2, 5, 4), r(2, 7, 4), r(2, 7, 3), r(2, 5, 3)
    s = 0.5 * q @ k.transpose(1, 2)  # (B, L, S) the scores
    out = torch.softmax(s, -1) @ v
    lse = torch.logsumexp(s, -1, keepdim=True) / math.log(2)  # base 2, as the kernels keep it
    return q, k, v, dout, (dout * out).sum(-1, keepdim=True), lse


def _samples():
    g = torch.Generator().manual_seed(7)
    r = lambda *s: torch.randn(s, generator=g, dtype=F64)  # noqa: E731
    x, w, b, d = r(5, 12), r(12), r(12), r(5, 12)
    mean, rstd = x.mean(1), (x.var(1, unbiased=False) + 1e-5).rsqrt()
    xb = r(4, 3, 6)
    y = torch.randint(0, 12, (5,), generator=g)
    ps = lambda: [r(7), r(2, 3)]  # noqa: E731
    return {
        "layer_norm_forward": (x, w, b, 1e-5),
        "layer_norm_backward": (d, x, mean, rstd, w),
        "batch_norm_forward": (xb, r(3), r(3), 1e-5),
        "batch_norm_backward": (r(4, 3, 6), xb, xb.mean((0, 2)), xb.var((0, 2)).add(1e-5).rsqrt(), r(3), True),
        "gelu_backward": (x, F.gelu(x), d),
        "gelu_tanh_backward": (x, d),
        "cross_entropy_forward": (x, y, 0.1),
        "cross_entropy_backward": (torch.log_softmax(x, 1), y, 0.2, 0.1),
        "sgd_step": (ps(), ps(), ps(), 0.1, 0.9, 0.0, 0.01, True),
        "adam_step": (ps(), ps(), ps(), [p.abs() for p in ps()], [-0.01, -0.02], [1e-8, 1e-8], 0.9, 0.999, 0.0, 0.99),
        "lstm_gates_forward": (r(3, 8), r(3, 2), r(3, 8), r(3, 2), r(3, 2), r(3, 2)),
        "lstm_gates_backward": (r(3, 2), r(3, 8).sigmoid(), r(3, 2), r(3, 2).tanh(), r(3, 2), r(3, 8)),
        "gru_gates_forward": (r(3, 6), r(3, 6), r(3, 2), r(3, 2), r(3, 2)),
        "gru_gates_backward": (r(3, 2), r(3, 6).sigmoid(), r(3, 2), r(3, 2), r(3, 2), r(3, 6), r(3, 2)),
        "attention_forward": (r(2, 5, 4), r(2, 7, 4), r(2, 7, 3), 0.5, True, 3),
        "attention_backward": (*_attention_sample(r), 0.5, False, 3),
        "attention_backward_into": (*_attention_sample(r), 0.5, True, 3, r(2, 5, 4), r(2, 7, 4), r(2, 7, 3)),
        "max_pool2d_backward": (r(2, 3, 2, 2), torch.randint(0, 16, (2, 3, 2, 2), generator=g), 16),
    }


@pytest.mark.parametrize("name", sorted(_samples()))
def test_opcheck(built, name):
    op = getattr(torch.ops.handgrad, name).default
    torch.library.opcheck(op, _samples()[name])  # schema, fake, autograd registration, AOT dispatch


def test_bad_input_is_named(built):
    x = torch.randn(3, 4, dtype=F64)
    with pytest.raises(RuntimeError, match="weight has 5 elements, expected 4"):
        built.layer_norm_forward(x, torch.ones(5, dtype=F64), None, 1e-5)
    with pytest.raises(RuntimeError, match="dout is Float but the input is Double"):
        built.gelu_tanh_backward(x, x.float())
    with pytest.raises(RuntimeError, match="class 9"):
        built.cross_entropy_backward(x, torch.tensor([0, 1, 9]), 1.0, 0.0)


@pytest.mark.slow
def test_the_kernels_compile_into_one_graph(built):
    """The dispatch of kernels/ and the operators traced by torch.compile as one graph, the numbers the eager ones."""
    from kernels import elementwise, norms

    def step(x, w, b, dout):
        out, mean, rstd = torch.native_layer_norm(x, (8,), w, b, 1e-5)
        dx, dw, db = norms.layer_norm_backward(dout, x, mean, rstd, None, w, b, (1,), needs_dx=True)
        return elementwise.gelu_backward(out, None, dx, "none") * 2, dw, db

    g = torch.Generator().manual_seed(8)
    args = [torch.randn(s, generator=g, dtype=F64) for s in ((4, 8), (8,), (8,), (4, 8))]
    graphs = []

    def inductor(gm, example_inputs):  # Inductor, having seen the graph
        graphs.append(gm.code)
        return torch._inductor.compile(gm, example_inputs)

    got = torch.compile(step, fullgraph=True, backend=inductor)(*args)
    assert len(graphs) == 1 and "handgrad.layer_norm_backward" in graphs[0] and "handgrad.gelu_backward" in graphs[0]
    for a, b in zip(got, step(*args), strict=True):
        assert rel_err(a, b) < 1e-15


# -- where there is no build: the textbook, said once ----------------------------------------------------------------


@pytest.mark.parametrize("why", ["no compiler", "a failed build"])
def test_without_a_build_the_textbook_runs_and_says_so_once(monkeypatch, tmp_path, why):
    monkeypatch.setattr(cpp, "_loaded", None)  # as in a fresh process (restored after)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    if why == "no compiler":
        monkeypatch.setenv("CXX", "no-such-compiler-here")
    else:
        from torch.utils import cpp_extension

        def fail(**kw):
            raise RuntimeError("ninja: build stopped\nnorms.cpp:1:1: error: something the compiler said\nmore")

        monkeypatch.setattr(cpp_extension, "load", fail)
    x, dout = torch.randn(3, 8, dtype=F64), torch.randn(3, 8, dtype=F64)
    with pytest.warns(RuntimeWarning, match="C\\+\\+ kernels are not available") as caught:
        got = run_layer(lambda: LayerNorm(8, dtype=F64), x, dout, textbook=False)
    assert len(caught) == 1
    assert ("no-such-compiler-here" if why == "no compiler" else "error: something the compiler said") in str(
        caught[0].message
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: the second backward warns nothing
        again = run_layer(lambda: LayerNorm(8, dtype=F64), x, dout, textbook=False)
    assert not cpp.available()
    want = run_layer(lambda: LayerNorm(8, dtype=F64), x, dout, textbook=True)
    assert_close(got, want, F64, "fallback")
    assert_close(again, want, F64, "fallback")


def test_a_build_says_so_in_one_line(monkeypatch, tmp_path, capsys, built):
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp, "_loaded", None)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # an empty cache: a build
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: None)  # (the operators are registered already)
    assert cpp.available()
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("handgrad: building the C++ kernels") and "minute" in err[0], err
    assert err[1].startswith("handgrad: built the C++ kernels in"), err

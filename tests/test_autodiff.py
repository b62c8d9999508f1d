"""The autodiff engine: every operation against torch.autograd in float64, and the graph mechanics."""

import pytest
import torch

import optimizers
from autodiff import MLP, EngineNet, Tensor, cross_entropy, no_grad
from losses import CrossEntropyLoss
from models import Net, PytorchNet

f64 = torch.float64


def compare(fn, *shapes_or_tensors, tol=1e-9, seed=0, positive=False):
    """fn applied to engine Tensors and to torch tensors; outputs and every input gradient must agree."""
    g = torch.Generator().manual_seed(seed)
    raw = [s if isinstance(s, torch.Tensor) else torch.randn(s, generator=g, dtype=f64) for s in shapes_or_tensors]
    if positive:
        raw = [r.abs() + 0.5 for r in raw]
    ours = [Tensor(r.clone(), requires_grad=True) for r in raw]
    ref = [r.clone().requires_grad_() for r in raw]
    out, out_ref = fn(*ours), fn(*ref)
    upstream = torch.randn(out_ref.shape, generator=g, dtype=f64)
    out.backward(upstream if out_ref.dim() else None)
    out_ref.backward(upstream if out_ref.dim() else None)
    assert out.shape == out_ref.shape
    torch.testing.assert_close(out.data, out_ref.detach(), rtol=tol, atol=1e-12)
    for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
        assert a.grad is not None and a.grad.shape == b.shape, f"input {i}"
        err = ((a.grad - b.grad).abs().max() / b.grad.abs().max().clamp_min(1e-30)).item()
        assert err < tol, f"input {i}: relative error {err:.2e}"


BINARY = [lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, lambda a, b: a / b]
BROADCAST = [((3, 4), (3, 4)), ((3, 4), (4,)), ((4,), (3, 4)), ((3, 1), (1, 4)), ((2, 3, 4), (3, 1)), ((5,), ())]


@pytest.mark.parametrize("op", BINARY, ids=["add", "sub", "mul", "div"])
@pytest.mark.parametrize("sa,sb", BROADCAST)
def test_binary_ops_with_broadcasting(op, sa, sb):
    compare(op, sa, sb)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: a + 2.5,
        lambda a: 2.5 + a,
        lambda a: a - 0.1,
        lambda a: 0.1 - a,
        lambda a: a * 0.1,
        lambda a: 3 * a,
        lambda a: a / 7.0,
        lambda a: 7.0 / a,
        lambda a: -a,
    ],
    ids=["add", "radd", "sub", "rsub", "mul", "rmul", "div", "rdiv", "neg"],
)
def test_ops_with_python_numbers(fn):
    compare(fn, (3, 4))


@pytest.mark.parametrize(
    "fn",
    [lambda a: a**2, lambda a: a**3.5, lambda a: a**-1.5, lambda a: 2.0**a],
    ids=["sq", "pow3.5", "pow-1.5", "rpow"],
)
def test_pow_with_number(fn):
    compare(fn, (3, 4), positive=True)


@pytest.mark.parametrize("sa,sb", [((3, 4), (3, 4)), ((3, 4), (4,)), ((4,), (2, 4))])
def test_pow_with_tensor_exponent(sa, sb):
    compare(lambda a, b: a**b, sa, sb, positive=True)


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((3, 4), (4, 5)),
        ((4,), (4, 5)),
        ((3, 4), (4,)),
        ((4,), (4,)),
        ((2, 3, 4), (4, 5)),
        ((3, 4), (2, 4, 5)),
        ((2, 3, 4), (2, 4, 5)),
        ((2, 1, 3, 4), (5, 4, 2)),
        ((1, 4), (4, 1)),
    ],
)
def test_matmul_shapes(sa, sb):
    compare(lambda a, b: a @ b, sa, sb)


def test_matmul_with_transposed_operand():
    w = torch.randn(5, 4, dtype=f64).t()  # column-major (4, 5), as W.T in the engine Linear's x @ W.T
    compare(lambda a, b: a @ b, (3, 4), w)


@pytest.mark.parametrize("name", ["exp", "log", "tanh", "sigmoid", "relu"])
@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4)])
def test_elementwise(name, shape):
    compare(lambda a: getattr(a, name)(), shape, positive=(name == "log"))


@pytest.mark.parametrize(
    "dim,keepdim", [(None, False), (0, False), (1, True), (-1, False), ((0, 2), False), ((0, 2), True)]
)
@pytest.mark.parametrize("red", ["sum", "mean"])
def test_sum_and_mean(dim, keepdim, red):
    if dim is None:
        compare(lambda a: getattr(a, red)(), (2, 3, 4))
    else:
        compare(lambda a: getattr(a, red)(dim, keepdim=keepdim), (2, 3, 4))


@pytest.mark.parametrize("dim,keepdim", [(0, False), (1, True), (-1, False)])
def test_max_over_dim(dim, keepdim):
    def ref_or_ours(a):
        out = a.max(dim, keepdim=keepdim)
        return out.values if isinstance(out, tuple) else out

    compare(ref_or_ours, (3, 4, 5))


def test_max_over_everything_with_ties():
    compare(lambda a: a.max(), torch.tensor([[1.0, 3.0], [3.0, 2.0]], dtype=f64))


@pytest.mark.parametrize(
    "fn",
    [
        lambda a: a.reshape(4, 6),
        lambda a: a.view(-1),
        lambda a: a.reshape((3, 8)),
        lambda a: a.transpose(0, 2),
        lambda a: a.reshape(6, 4).T,
        lambda a: a.sum(0).T,
    ],
)
def test_shape_ops(fn):
    compare(fn, (2, 3, 4))


@pytest.mark.parametrize(
    "index",
    [
        1,
        -1,
        (0, 2),
        slice(1, 3),
        (slice(None), 1),
        (Ellipsis, 2),
        (None, 0),
        torch.tensor([0, 2, 0]),
        (torch.tensor([0, 1, 1]), torch.tensor([2, 2, 0])),
        (slice(None), torch.tensor([3, 3, 0])),
    ],
    ids=["int", "neg", "tuple", "slice", "slice-int", "ellipsis", "none", "repeat-idx", "pairs", "slice-idx"],
)
def test_indexing(index):
    compare(lambda a: a[index], (3, 4))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_log_softmax(dim):
    compare(lambda a: a.log_softmax(dim) if isinstance(a, Tensor) else torch.log_softmax(a, dim), (4, 5))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy(reduction):
    t = torch.tensor([0, 3, 1, 1, 4])
    compare(
        lambda z: (
            cross_entropy(z, t, reduction)
            if isinstance(z, Tensor)
            else torch.nn.functional.cross_entropy(z, t, reduction=reduction)
        ),
        (5, 5),
    )


def test_composite_expression():
    compare(lambda a, b, c: ((a @ b).tanh() * c + (a.sum(1, keepdim=True) / 3.0).exp()).mean(), (3, 4), (4, 2), (2,))


# -- graph mechanics -----------------------------------------------------------------------------------


def test_node_reused_receives_the_sum():
    x = Tensor([2.0, -3.0], requires_grad=True)
    y = x * x + x * 3.0 + x  # dy/dx = 2x + 4
    y.sum().backward()
    assert x.grad.tolist() == [8.0, -2.0]


def test_gradients_accumulate_across_backwards():
    x = Tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()
    (x * 3.0).sum().backward()
    assert x.grad.tolist() == [5.0, 7.0]
    x.zero_grad()
    assert x.grad is None


def test_two_leaves_never_share_a_gradient_tensor():
    a, b = Tensor([1.0, 2.0], requires_grad=True), Tensor([3.0, 4.0], requires_grad=True)
    (a + b).sum().backward()
    a.grad.mul_(10)  # e.g. gradient clipping in place
    assert b.grad.tolist() == [1.0, 1.0]


def test_a_transposed_weight_gets_its_gradient_without_a_copy_and_two_leaves_still_never_share():
    """x @ W.T (the engine Linear's forward): W's gradient is W.T's, transposed back, with no copy (a copy of every
    weight gradient cost the engine's step 15-20%); where the gradient a view received is also another node's, the
    leaf gets a copy, so an in-place change to one leaf's .grad never reaches another's."""
    g = torch.Generator().manual_seed(0)
    w_raw, x_raw = torch.randn(5, 3, generator=g, dtype=f64), torch.randn(4, 3, generator=g, dtype=f64)
    w = Tensor(w_raw, requires_grad=True)
    wt = w.T
    (Tensor(x_raw) @ wt).sum().backward()
    ref = w_raw.clone().requires_grad_()
    (x_raw @ ref.T).sum().backward()
    assert torch.equal(w.grad, ref.grad) and w.grad.is_contiguous()
    assert w.grad.untyped_storage().data_ptr() == wt.grad.untyped_storage().data_ptr()  # a view, as W.T is of W
    for make in (
        lambda a, b: a.T + b.T,
        lambda a, b: a.reshape(15) + b.reshape(15),
        lambda a, b: a.transpose(0, 1) - b.transpose(0, 1),
    ):
        a, b = Tensor(w_raw.clone(), requires_grad=True), Tensor(w_raw.clone(), requires_grad=True)
        make(a, b).sum().backward()  # add/sub hand the same gradient tensor to both views
        assert a.grad.untyped_storage().data_ptr() != b.grad.untyped_storage().data_ptr()
        a.grad.mul_(10)  # e.g. clipping in place
        assert b.grad.abs().max().item() == 1.0


def test_a_view_op_node_is_freed_without_the_cycle_collector():
    import gc
    import weakref

    x = Tensor([[1.0, 2.0]], requires_grad=True)
    gc.disable()
    try:
        for view in (lambda t: t.T, lambda t: t.reshape(2), lambda t: t.transpose(0, 1)):
            y = view(x)
            ref = weakref.ref(y)
            del y
            assert ref() is None
    finally:
        gc.enable()


def test_chain_of_100000_operations():
    x = Tensor(torch.tensor(1.0, dtype=f64), requires_grad=True)
    y = x
    for _ in range(100_000):
        y = y * 1.00001 + 0.0
    y.backward()
    assert x.grad.item() == pytest.approx(1.00001**100_000, rel=1e-9)


def test_no_grad_builds_no_graph():
    x = Tensor([1.0, 2.0], requires_grad=True)
    with no_grad():
        y = x * 2.0
    assert not y.requires_grad and y.is_leaf
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.sum().backward()
    z = x * 2.0
    assert z.requires_grad  # restored after the block

    @no_grad()
    def f(t):
        return t * 3.0

    assert not f(x).requires_grad


def test_constants_build_no_graph():
    c = Tensor([1.0, 2.0])
    y = c * 2.0 + 1.0
    assert not y.requires_grad and y._backward is None


def test_graph_released_after_backward_unless_retained():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()  # allowed: the first one kept the graph
    assert x.grad.tolist() == [4.0, 8.0]
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward()


def test_non_scalar_backward_needs_a_gradient():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = x * 2.0
    with pytest.raises(RuntimeError, match="only for scalar outputs"):
        y.backward()
    with pytest.raises(RuntimeError, match=r"gradient has shape \(3,\), expected \(2,\)"):
        y.backward(torch.ones(3))
    y.backward(torch.tensor([1.0, 10.0]))
    assert x.grad.tolist() == [2.0, 20.0]


def test_non_leaf_grad_is_from_the_latest_backward():
    x = Tensor([1.0, 2.0], requires_grad=True)
    h = x * 2.0
    y = (h * h).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert h.grad.tolist() == [4.0, 8.0]  # 2h, not accumulated
    assert x.grad.tolist() == [16.0, 32.0]  # accumulated twice


def test_construction_and_accessors():
    t = Tensor([[1, 2], [3, 4]])
    assert t.dtype == torch.get_default_dtype() and t.shape == (2, 2) and t.device.type == "cpu"
    assert Tensor(2.5).item() == 2.5 and t.numpy().tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert "requires_grad=True" in repr(Tensor([1.0], requires_grad=True))
    assert "op='mul'" in repr(Tensor([1.0], requires_grad=True) * 2.0)
    d = (Tensor([1.0], requires_grad=True) * 2.0).detach()
    assert not d.requires_grad and d.is_leaf
    with pytest.raises(TypeError, match="only floating-point"):
        Tensor(torch.tensor([1, 2]), requires_grad=True)
    with pytest.raises(TypeError, match="cannot combine"):
        Tensor([1.0]) + "a"


# -- the engine Net --------------------------------------------------------------------------------------


def test_engine_net_gradients_equal_hand_written_and_autograd():
    torch.manual_seed(0)
    net = Net(hidden_size=64, dtype=f64)
    eng = EngineNet(hidden_size=64, dtype=f64)
    twin = PytorchNet(hidden_size=64, dtype=f64)
    eng.load_state_dict(net.state_dict())
    twin.load_state_dict(net.state_dict())
    x, y = torch.randn(16, 1, 28, 28, dtype=f64), torch.randint(0, 10, (16,))

    crit = CrossEntropyLoss()
    loss_hand = crit(net(x), y)
    net.backward(crit.backward())
    loss_eng = cross_entropy(eng(x), y)
    loss_eng.backward()
    loss_ref = torch.nn.functional.cross_entropy(twin(x), y)
    loss_ref.backward()

    assert abs(loss_eng.item() - loss_ref.item()) < 1e-12 and abs(loss_hand.item() - loss_ref.item()) < 1e-12
    hand = dict(net.named_parameters())
    eng_p = dict(eng.named_parameters())
    assert [(n, p.shape) for n, p in eng_p.items()] == [(n, p.shape) for n, p in twin.named_parameters()]
    for name, p in twin.named_parameters():  # each .grad as exposed, in torch's layout: no transpose
        for label, g in (("engine", eng_p[name].grad), ("hand", hand[name].grad)):
            assert ((g - p.grad).abs().max() / p.grad.abs().max()).item() < 1e-12, (label, name)


def test_engine_net_same_seed_same_weights_as_twin():
    torch.manual_seed(3)
    eng = EngineNet(hidden_size=32)
    torch.manual_seed(3)
    twin = PytorchNet(hidden_size=32)
    for k, v in twin.state_dict().items():
        assert torch.equal(eng.state_dict()[k], v), k


def test_engine_training_equals_nn_module_training():
    torch.manual_seed(0)
    eng = EngineNet(hidden_size=64, dtype=f64)
    twin = PytorchNet(hidden_size=64, dtype=f64)
    twin.load_state_dict(eng.state_dict())
    opt, ref_opt = optimizers.Adam(eng.parameters(), lr=1e-3), torch.optim.Adam(twin.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    for _ in range(15):
        x, y = torch.randn(32, 784, generator=g, dtype=f64), torch.randint(0, 10, (32,), generator=g)
        opt.zero_grad()
        cross_entropy(eng(x), y).backward()
        optimizers.clip_grad_norm_(eng.parameters(), 1.0)
        opt.step()
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(twin(x), y).backward()
        torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0)
        ref_opt.step()
    for k, v in twin.state_dict().items():
        assert ((eng.state_dict()[k] - v).abs().max() / v.abs().max()).item() < 1e-10, k


def test_xor_example_learns_xor(tmp_path):
    """examples/xor.py (micrograd's demo on the engine) exits 0 only when its loss fell below 0.01; with --draw it
    writes the last step's graph (SVG where Graphviz's dot is installed, else the DOT text).  The example's one run
    in the suite."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / ("xor.svg" if shutil.which("dot") else "xor.dot")
    r = subprocess.run(
        [sys.executable, "examples/xor.py", "--draw", str(out)], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "loss" in r.stdout and "(target 1.0)" in r.stdout and f"written to {out}" in r.stdout
    drawn = out.read_text()
    assert ("<svg" in drawn) if out.suffix == ".svg" else drawn.startswith("digraph autodiff {")
    for name in ("layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias", "tanh", "matmul"):
        assert name in drawn, name


def test_xor_example_without_graphviz_says_the_command_line_fix(tmp_path):
    """Without Graphviz (a PATH without dot), --draw xor.svg is refused before training, naming --draw xor.dot."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run(
        [sys.executable, "examples/xor.py", "--draw", str(tmp_path / "xor.svg")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": str(tmp_path)},
    )
    assert r.returncode == 2 and "step" not in r.stdout
    assert f"use --draw {tmp_path / 'xor.dot'} to write the DOT text" in r.stderr and "format=" not in r.stderr


def test_engine_net_refuses_bad_architecture():
    with pytest.raises(ValueError, match="hidden_size must be an int >= 1, got 0"):
        EngineNet(hidden_size=0)


def test_cross_entropy_bad_target():
    z = Tensor(torch.randn(2, 3), requires_grad=True)
    with pytest.raises(ValueError, match="target contains class 3"):
        cross_entropy(z, torch.tensor([0, 3]))
    with pytest.raises(ValueError, match=r"integer class indices of shape \(2,\)"):
        cross_entropy(z, torch.tensor([0.0, 1.0]))


# -- in-place changes between forward and backward ---------------------------------------------------------
# torch.autograd refuses to differentiate through a tensor that was changed in place after an op saved it; so does
# the engine (it records each saved tensor's _version), instead of computing a gradient from the changed values.


def test_leaf_data_changed_in_place_is_refused():
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    version = x.data._version
    y = x * x
    x.data.mul_(10)  # the engine's .data is the saved tensor itself (same version counter)
    assert x.data._version == version + 1
    with pytest.raises(
        RuntimeError,
        match=r"op 'mul' saved its input a \(shape \(3,\), torch.float\d+\) at version "
        rf"{version}, and it is now at version {version + 1}",
    ):
        y.sum().backward()
    assert x.grad is None  # nothing was accumulated from the changed values


def test_leaf_changed_through_the_original_torch_tensor_is_refused():
    t = torch.tensor([1.0, 2.0], dtype=f64)
    x = Tensor(t, requires_grad=True)  # stores t.detach(): a new tensor that shares t's version counter
    y = (x * x).sum()
    t.add_(1.0)
    with pytest.raises(RuntimeError, match="op 'mul' saved its input"):
        y.backward()


def test_intermediate_data_zeroed_is_refused():
    x = Tensor([1.0, -2.0, 3.0], requires_grad=True)
    h = x.exp()  # exp saves its output
    y = (h * 2.0).sum()
    h.data.zero_()
    with pytest.raises(
        RuntimeError,
        match=r"op 'exp' saved its output \(shape \(3,\), torch.float\d+\) at version 0, "
        r"and it is now at version 1",
    ):
        y.backward()


def test_optimizer_step_between_forward_and_backward_is_refused():
    torch.manual_seed(0)
    net = MLP([3, 4, 2])
    opt = optimizers.SGD(net.parameters(), lr=0.1)
    loss = cross_entropy(net(torch.randn(5, 3)), torch.tensor([0, 1, 1, 0, 1]))
    loss.backward(retain_graph=True)
    opt.step()  # updates the weights in place (torch._foreach_add_ bumps their versions)
    with pytest.raises(
        RuntimeError,
        match=r"op 'matmul' saved its input b \(shape \(4, 2\), torch.float32\) at "
        r"version \d+, and it is now at version \d+",
    ):
        loss.backward()


def test_only_what_the_gradient_needs_is_saved():
    """As in autograd: x * c (c constant) saves c, not x, and x + y saves nothing; changing x is then no error."""
    x = Tensor([1.0, 2.0], requires_grad=True)
    c = Tensor([3.0, 4.0])
    y = (x * c).sum() + (x + 1.0).sum()
    x.data.mul_(10)
    y.backward()
    assert x.grad.tolist() == [4.0, 5.0]
    xr = torch.tensor([1.0, 2.0], requires_grad=True)
    yr = (xr * torch.tensor([3.0, 4.0])).sum() + (xr + 1.0).sum()
    with torch.no_grad():
        xr.mul_(10)
    yr.backward()  # autograd agrees: no error, same gradient
    assert xr.grad.tolist() == [4.0, 5.0]
    z = Tensor([1.0, 2.0], requires_grad=True)
    w = (z * c).sum()
    c.data.add_(1)  # but the constant was saved (z's gradient is c): changing it is refused
    with pytest.raises(RuntimeError, match="op 'mul' saved its input b"):
        w.backward()


def test_unchanged_saved_tensors_pass_and_retain_graph_checks_again():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = (x.tanh() * x).sum()
    y.backward(retain_graph=True)
    x.data.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


# -- the engine's parameters in torch's layout -------------------------------------------------------


def square_and_non_square():
    """The default Net's shape with every hidden layer square (16 -> 16 -> 16 -> 10), and one all square: a
    transposed weight, gradient or optimizer state would go unnoticed by shape alone there."""
    return [
        dict(hidden_size=16, num_classes=10, in_features=12, depth=2),
        dict(hidden_size=16, num_classes=16, in_features=16, depth=2),
    ]


@pytest.mark.parametrize("kw", square_and_non_square(), ids=["mixed", "square"])
def test_engine_parameters_have_nn_linear_names_shapes_and_gradients(kw):
    torch.manual_seed(0)
    eng, twin = EngineNet(**kw, dtype=f64), PytorchNet(**kw, dtype=f64)
    twin.load_state_dict(eng.state_dict())
    assert [(n, p.shape) for n, p in eng.named_parameters()] == [(n, p.shape) for n, p in twin.named_parameters()]
    assert all(p.data.is_contiguous() for p in eng.parameters())  # the tensor itself, not a transposed view
    for (n, p), (_, q) in zip(eng.named_parameters(), twin.named_parameters(), strict=True):
        assert p.data.data_ptr() == eng.state_dict()[n].data_ptr() and torch.equal(p.data, q.detach()), n
    x, y = torch.randn(8, kw["in_features"], dtype=f64), torch.randint(0, kw["num_classes"], (8,))
    cross_entropy(eng(x), y).backward()
    torch.nn.functional.cross_entropy(twin(x), y).backward()
    for (n, p), (_, q) in zip(eng.named_parameters(), twin.named_parameters(), strict=True):
        assert p.grad.shape == q.grad.shape, n
        assert ((p.grad - q.grad).abs().max() / q.grad.abs().max()).item() < 1e-10, n


TORCH_OPTIMS = [
    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)),
    ("RMSprop", dict(lr=0.01, momentum=0.5, centered=True)),
    ("Adam", dict(lr=0.01, amsgrad=True)),
    ("AdamW", dict(lr=0.01)),
    ("Adagrad", dict(lr=0.1)),
]


def _train(model, opt, steps, g, engine):
    for _ in range(steps):
        x, y = torch.randn(8, 16, generator=g, dtype=f64), torch.randint(0, 16, (8,), generator=g)
        opt.zero_grad()
        if engine:
            cross_entropy(model(x), y).backward()
        else:
            torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


@pytest.mark.parametrize("name,kw", TORCH_OPTIMS, ids=[n for n, _ in TORCH_OPTIMS])
@pytest.mark.parametrize("direction", ["torch->engine", "engine->torch"])
def test_optimizer_state_moves_between_torch_optim_and_the_engine_through_the_model(name, kw, direction):
    """torch.optim's state after 3 steps loads into handgrad's optimizer over the engine model (or the reverse),
    and 3 more steps equal torch's own: the state maps by position onto parameters of the same layout."""
    arch = square_and_non_square()[1]  # every weight square: a transposed state would load without complaint
    torch.manual_seed(0)
    eng, twin, ref = EngineNet(**arch, dtype=f64), PytorchNet(**arch, dtype=f64), PytorchNet(**arch, dtype=f64)
    twin.load_state_dict(eng.state_dict())
    ref.load_state_dict(eng.state_dict())
    ref_opt = getattr(torch.optim, name)(ref.parameters(), **kw)
    _train(ref, ref_opt, 3, torch.Generator().manual_seed(1), engine=False)
    if direction == "torch->engine":
        first, first_opt = twin, getattr(torch.optim, name)(twin.parameters(), **kw)
        second, second_opt = eng, getattr(optimizers, name)(eng.parameters(), **kw)
    else:
        first, first_opt = eng, getattr(optimizers, name)(eng.parameters(), **kw)
        second, second_opt = twin, getattr(torch.optim, name)(twin.parameters(), **kw)
    _train(first, first_opt, 3, torch.Generator().manual_seed(1), engine=first is eng)
    second.load_state_dict(first.state_dict())
    second_opt.load_state_dict(first_opt.state_dict())
    g = torch.Generator().manual_seed(2)
    _train(second, second_opt, 3, g, engine=second is eng)
    _train(ref, ref_opt, 3, torch.Generator().manual_seed(2), engine=False)
    for k, v in ref.state_dict().items():
        assert ((second.state_dict()[k] - v).abs().max() / v.abs().max()).item() < 1e-10, k


def test_to_keeps_the_parameter_tensors_so_an_optimizer_built_before_still_steps():
    """nn.Module.to keeps each parameter's identity; so does the engine's: the optimizer built before ``to`` holds
    the tensors backward fills, and a backward after ``to`` fills them."""
    torch.manual_seed(0)
    eng = EngineNet(hidden_size=16, depth=1)
    twin = PytorchNet(hidden_size=16, depth=1)
    twin.load_state_dict(eng.state_dict())
    opt, ref_opt = optimizers.Adam(eng.parameters(), lr=1e-2), torch.optim.Adam(twin.parameters(), lr=1e-2)
    before = [p.data for p in eng.parameters()]
    assert eng.to(torch.float64) is eng and twin.to(torch.float64) is twin
    assert all(p.data is t and t.dtype == f64 for p, t in zip(eng.parameters(), before, strict=True))
    x, y = torch.randn(4, 784, dtype=f64), torch.randint(0, 10, (4,))
    cross_entropy(eng(x), y).backward()
    torch.nn.functional.cross_entropy(twin(x), y).backward()
    opt.step()
    ref_opt.step()
    for k, v in twin.state_dict().items():
        assert ((eng.state_dict()[k] - v).abs().max() / v.abs().max()).item() < 1e-10, k
    eng.to(dtype=torch.float32)  # .grad follows its parameter, as in nn.Module.to
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in eng.parameters())
    with pytest.raises(
        TypeError, match="parameters must stay floating-point .* got dtype torch.int64; convert the input instead"
    ):
        eng.to(torch.int64)


# -- misuse: refused in one line naming the problem ----------------------------------------------------


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b: a * b,
        lambda a, b: b * a,
        lambda a, b: a + b,
        lambda a, b: b - a,
        lambda a, b: a / b,
        lambda a, b: a @ b,
        lambda a, b: b @ a,
        lambda a, b: a**b,
    ],
    ids=["mul", "rmul", "add", "rsub", "div", "matmul", "rmatmul", "pow"],
)
def test_a_torch_tensor_that_requires_grad_is_refused_saying_how_to_wrap_it(fn):
    """It would silently get no gradient (b.grad stayed None): the engine's graph is not torch.autograd's."""
    a = Tensor(torch.rand(3, 3, dtype=f64) + 0.5, requires_grad=True)
    b = torch.rand(3, 3, dtype=f64, requires_grad=True)
    with pytest.raises(
        TypeError,
        match=r"a torch.Tensor that requires grad \(shape \(3, 3\), torch.float64\); "
        r"the engine cannot give it a gradient .* "
        r"autodiff.Tensor\(t, requires_grad=True\)",
    ):
        fn(a, b)
    assert b.grad is None
    # wrapped, it gets autograd's gradient; detached, it is a constant
    wrapped = Tensor(b, requires_grad=True)
    fn(a, wrapped).sum().backward()
    ref_a, ref_b = a.data.clone().requires_grad_(), b.detach().clone().requires_grad_()
    fn(ref_a, ref_b).sum().backward()
    assert (wrapped.grad - ref_b.grad).abs().max().item() < 1e-12
    assert (a.grad - ref_a.grad).abs().max().item() < 1e-12
    fn(a, b.detach())


@pytest.mark.parametrize(
    "fn",
    [lambda a, b: a * b, lambda a, b: b + a, lambda a, b: a / b, lambda a, b: a - b],
    ids=["mul", "radd", "div", "sub"],
)
def test_operands_of_two_float_dtypes_are_refused_at_the_forward_naming_both(fn):
    """float32 and float64 passed the forward and failed in backward with torch's grad_dtype message."""
    a = Tensor(torch.randn(3, 3), requires_grad=True)
    b = Tensor(torch.randn(3, 3, dtype=f64))
    with pytest.raises(
        TypeError,
        match=r"operands of dtypes torch.float(32|64) and torch.float(32|64) give a "
        r"torch.float64 result, so the torch.float32 operand \(shape \(3, 3\)\), "
        r"which requires grad, would receive a torch.float64 gradient",
    ):
        fn(a, b)
    c = Tensor(torch.randn(3, 3, dtype=f64), requires_grad=True)  # the float64 one takes a float64 gradient: fine
    fn(c, Tensor(torch.randn(3, 3))).sum().backward()
    assert c.grad.dtype == f64
    with no_grad():  # no graph, no gradient: torch's promotion
        assert fn(a, b).dtype == f64


def test_a_wrong_input_size_names_the_layer_and_both_shapes():
    net = EngineNet(hidden_size=8, depth=1)
    with pytest.raises(ValueError, match=r"^Linear\(784, 8\): input has shape \(2, 3\), expected \(N, 784\)"):
        net(Tensor(torch.randn(2, 3)))
    with pytest.raises(
        ValueError,
        match=r"^matmul: shapes \(2, 3\) and \(5, 3\) cannot be multiplied: the last "
        r"dimension of the first \(3\) must equal the second-to-last dimension of the "
        r"second \(5\)$",
    ):
        Tensor(torch.randn(2, 3)) @ torch.randn(5, 3)
    with pytest.raises(
        ValueError,
        match=r"matmul: shapes \(2, 2, 3\) and \(3, 3, 4\) cannot be multiplied: their "
        r"batch dimensions \(2,\) and \(3,\) do not broadcast",
    ):
        Tensor(torch.randn(2, 2, 3)) @ torch.randn(3, 3, 4)
    with pytest.raises(
        TypeError,
        match=r"matmul: operands of dtypes torch.float32 and torch.float64 \(shapes \(2, 3\) "
        r"and \(3, 4\)\); a matrix product takes one dtype",
    ):
        Tensor(torch.randn(2, 3), requires_grad=True) @ torch.randn(3, 4, dtype=f64)


@pytest.mark.parametrize(
    "data", [["a"], "abc", {"x": 1.0}, [[1.0, 2.0], [3.0]]], ids=["str-list", "str", "dict", "ragged"]
)
def test_a_tensor_of_non_numbers_is_a_clear_type_error(data):
    with pytest.raises(
        TypeError,
        match=r"^autodiff.Tensor: cannot make a tensor of numbers from .*; give a number, "
        r"a \(nested\) list of numbers, or a torch.Tensor$",
    ):
        Tensor(data)

"""layers.as_module: every hand-written layer inside nn.Module models, checked by torch.autograd.gradcheck.

Each exported layer class has an entry in CASES (a test fails when a new exported layer lacks one).  For
every case: ``torch.autograd.gradcheck`` of the module with respect to the input AND every Parameter
(central differences, float64), and the gradients against autograd through the layer's torch.nn twin
(same weights, same dropout masks) to 1e-12.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import layers
import models
from layers import (
    GELU,
    AvgPool2d,
    BatchNorm1d,
    BatchNorm2d,
    Conv2d,
    Dropout,
    Embedding,
    Flatten,
    LayerNorm,
    LeakyReLU,
    Linear,
    LogSoftmax,
    MaxPool2d,
    MixtureOfExperts,
    MultiheadAttention,
    ReLU,
    ScaledDotProductAttention,
    SeededDropout,
    Sequential,
    Sigmoid,
    SiLU,
    Softmax,
    SyncBatchNorm,
    Tanh,
    TransformerEncoder,
    TransformerEncoderLayer,
    as_module,
)
from layers.layer import BaseLayer
from models import GPT, Net, seeded_dropouts
from tests.conftest import rel

F64 = torch.float64
SEED = 1234  # every dropout generator is reseeded to this before each forward: the function gradcheck sees is fixed


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These tensors are tiny: intra-op threads only add synchronisation (a float64 conv2d of (2, 2, 5, 5) took
    40 ms with 2 threads on a loaded 2-core machine, 0.01 ms with 1, measured), so this file runs on one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def err(g: torch.Tensor, ref: torch.Tensor) -> float:
    """max|g - ref| relative to max(max|ref|, 1): some gradients here are zero up to round-off (a bias before
    batch norm), where an error relative to the entry itself means nothing."""
    return ((g - ref).abs().max() / ref.abs().max().clamp_min(1.0)).item()


def _bn(cls, c, train=True, **kw):
    def make():
        bn = cls(c, dtype=F64, **kw)
        with torch.no_grad():  # parameters require gradients, as nn.Parameter's
            bn.weight.uniform_(0.5, 1.5), bn.bias.uniform_(-0.5, 0.5)  # away from the defaults (STYLE 16)
            if bn.running_mean is not None:
                bn.running_mean.uniform_(-0.5, 0.5), bn.running_var.uniform_(0.5, 2.0)
        return bn.train(train)

    return make


def _ln(shape, **kw):
    def make():
        ln = LayerNorm(shape, dtype=F64, **kw)
        with torch.no_grad():  # parameters require gradients, as nn.Parameter's
            if ln.weight is not None:
                ln.weight.uniform_(0.5, 1.5)
            if ln.bias is not None:
                ln.bias.uniform_(-0.5, 0.5)
        return ln

    return make


def _dropout(p, inplace=False, train=True):
    def make():
        d = Dropout(p, inplace=inplace).train(train)
        d.generator = torch.Generator()
        return d

    return make


def _cnn():
    return Sequential(
        Conv2d(2, 3, 3, padding=1, dtype=F64),
        _bn(BatchNorm2d, 3)(),
        ReLU(),
        MaxPool2d(2),
        Flatten(),
        _dropout(0.3)(),
        Linear(12, 4, dtype=F64),
    )


def _net():
    return Net(
        layers=[
            Linear(5, 6, dtype=F64),
            Tanh(),
            _dropout(0.25)(),
            _bn(BatchNorm1d, 6)(),
            Linear(6, 3, dtype=F64),
            LogSoftmax(dim=1),
        ]
    )


# class name -> [(case id, factory, input shape)].  Every exported BaseLayer class needs an entry.
CASES: dict[str, list[tuple[str, object, tuple[int, ...]]]] = {
    "Linear": [
        ("linear", lambda: Linear(5, 4, dtype=F64), (3, 5)),
        ("linear-nobias", lambda: Linear(5, 4, bias=False, dtype=F64), (1, 5)),
    ],
    "ReLU": [("relu", ReLU, (3, 5))],
    "Tanh": [("tanh", Tanh, (3, 5))],
    "Sigmoid": [("sigmoid", Sigmoid, (3, 5))],
    "Softmax": [("softmax", lambda: Softmax(dim=1), (3, 5)), ("softmax-dim0", lambda: Softmax(dim=0), (3, 2, 2))],
    "LogSoftmax": [("logsoftmax", lambda: LogSoftmax(dim=1), (3, 5))],
    "LeakyReLU": [
        ("leakyrelu", lambda: LeakyReLU(0.1), (3, 5)),
        ("leakyrelu-inplace", lambda: LeakyReLU(0.2, inplace=True), (3, 5)),
    ],
    "GELU": [("gelu", GELU, (3, 5)), ("gelu-tanh", lambda: GELU("tanh"), (3, 5))],
    "SiLU": [("silu", SiLU, (3, 5)), ("silu-inplace", lambda: SiLU(inplace=True), (3, 5))],
    "BatchNorm1d": [
        ("bn1d-train", _bn(BatchNorm1d, 4), (6, 4)),
        ("bn1d-ncl", _bn(BatchNorm1d, 3), (4, 3, 2)),
        ("bn1d-eval", _bn(BatchNorm1d, 4, train=False), (3, 4)),
        ("bn1d-nostats", _bn(BatchNorm1d, 4, track_running_stats=False), (5, 4)),
    ],
    "BatchNorm2d": [
        ("bn2d-train", _bn(BatchNorm2d, 3), (2, 3, 3, 2)),
        ("bn2d-eval", _bn(BatchNorm2d, 3, train=False), (2, 3, 2, 2)),
    ],
    "SyncBatchNorm": [("syncbn-single-process", _bn(SyncBatchNorm, 3), (4, 3, 2))],
    "LayerNorm": [
        ("layernorm", _ln(4), (3, 4)),
        ("layernorm-2d", _ln((2, 3)), (2, 2, 3)),
        ("layernorm-nobias", _ln(4, bias=False), (3, 4)),
    ],
    "Dropout": [
        ("dropout", _dropout(0.4), (4, 5)),
        ("dropout-inplace", _dropout(0.5, inplace=True), (4, 5)),
        ("dropout-eval", _dropout(0.4, train=False), (4, 5)),
    ],
    "Conv2d": [
        ("conv", lambda: Conv2d(2, 3, 3, stride=2, padding=1, dtype=F64), (2, 2, 5, 5)),
        ("conv-groups", lambda: Conv2d(4, 2, (2, 3), dilation=(1, 2), groups=2, dtype=F64), (1, 4, 4, 6)),
    ],
    "MaxPool2d": [
        ("maxpool", lambda: MaxPool2d(2), (2, 2, 4, 4)),
        ("maxpool-ceil", lambda: MaxPool2d(3, stride=2, padding=1, ceil_mode=True), (1, 2, 5, 5)),
    ],
    "AvgPool2d": [("avgpool", lambda: AvgPool2d(3, stride=2, padding=1), (2, 2, 5, 5))],
    "Flatten": [("flatten", Flatten, (2, 3, 2))],
    "Sequential": [("sequential-cnn", _cnn, (3, 2, 4, 4))],
    "Net": [("net", _net, (4, 5))],
    # An integer input (token ids) has no gradient: the case gives the input itself instead of a shape.
    "Embedding": [
        ("embedding", lambda: Embedding(6, 3, padding_idx=2, dtype=F64), lambda: torch.tensor([[0, 5, 5], [4, 1, 3]]))
    ],  # no padding id: its zero gradient is a convention
    "TransformerEncoderLayer": [
        ("encoder-layer", lambda: TransformerEncoderLayer(4, 2, 6, dropout=0.0, dtype=F64), (3, 2, 4)),
        (
            "encoder-layer-prenorm",
            lambda: TransformerEncoderLayer(4, 2, 6, dropout=0.0, norm_first=True, activation="gelu", dtype=F64),
            (3, 2, 4),
        ),
    ],
    "GPT": [
        (
            "gpt",
            lambda: GPT(vocab_size=7, block_size=5, n_layer=1, n_head=2, n_embd=4, dtype=F64),
            lambda: torch.tensor([[0, 3, 6, 6], [2, 1, 4, 0]]),
        )
    ],
    "TransformerEncoder": [
        ("encoder", lambda: TransformerEncoder(TransformerEncoderLayer(4, 2, 6, dropout=0.0, dtype=F64), 2), (3, 2, 4))
    ],
    # aux_coef 0: the module's output alone (the auxiliary loss's gradient is tests/test_moe.py's); tokens dropped
    "MixtureOfExperts": [
        ("moe", lambda: MixtureOfExperts(3, 4, 3, top_k=2, capacity_factor=0.75, aux_coef=0.0, dtype=F64), (8, 3))
    ],
}
# Layers whose forward takes several inputs (query, key, value): as_module wraps one-input layers and refuses these.
MULTI_INPUT = {
    "ScaledDotProductAttention": ScaledDotProductAttention,
    "MultiheadAttention": lambda: MultiheadAttention(4, 2),
}
# Recurrent layers take and return a state beside their input and output: as_module refuses them, saying so.
STATEFUL = {
    "RNN": lambda: layers.RNN(3, 4),
    "LSTM": lambda: layers.LSTM(3, 4),
    "GRU": lambda: layers.GRU(3, 4),
    "RNNCell": lambda: layers.RNNCell(3, 4),
    "LSTMCell": lambda: layers.LSTMCell(3, 4),
    "GRUCell": lambda: layers.GRUCell(3, 4),
    "RecurrentLM": lambda: models.RecurrentLM(5, 3, 4),
}
CASE_LIST = [case for cases in CASES.values() for case in cases]


def _reseed(model: nn.Module) -> None:
    """Every dropout generator of ``model`` (an as_module module or a torch twin with SeededDropouts) back to SEED."""
    stack = [model.layer] if hasattr(model, "layer") else []
    while stack:  # the hand-written layers inside an as_module module
        node = stack.pop()
        if isinstance(node, Dropout) and node.generator is not None:
            node.generator.manual_seed(SEED)
        stack.extend(child for _, child in node.named_children())
    for m in model.modules():  # a torch twin's
        if isinstance(m, SeededDropout) and m.generator is not None:
            m.generator.manual_seed(SEED)


def test_every_exported_layer_has_a_case():
    exported = {
        name
        for pkg in (layers, models)
        for name in pkg.__all__
        if inspect.isclass(getattr(pkg, name))
        and issubclass(getattr(pkg, name), BaseLayer)
        and getattr(pkg, name) is not BaseLayer
    }
    covered = set(CASES) | set(MULTI_INPUT) | set(STATEFUL)
    assert exported - covered == set(), f"exported layers without an as_module case: {exported - covered}"
    assert covered - exported == set(), f"cases for names that are not exported layers: {covered - exported}"


@pytest.mark.parametrize("name", sorted(MULTI_INPUT))
def test_a_layer_with_several_inputs_is_refused_naming_them(name):
    with pytest.raises(
        TypeError,
        match=rf"as_module wraps layers with one input; {name}.forward takes "
        rf"query, key, value",
    ):
        as_module(MULTI_INPUT[name]())


@pytest.mark.parametrize("name", sorted(STATEFUL))
def test_a_recurrent_layer_is_refused_saying_why(name):
    with pytest.raises(
        TypeError,
        match=rf"as_module wraps layers of one input and one output; {name} takes an "
        rf"initial state and returns its new state",
    ):
        as_module(STATEFUL[name]())


def _input(shape):
    """A case's input: float64 of the given shape, or the case's own tensor (integer token ids)."""
    return shape() if callable(shape) else torch.randn(shape, dtype=F64)


@pytest.mark.parametrize("case", CASE_LIST, ids=[c[0] for c in CASE_LIST])
def test_gradcheck_every_layer(case):
    """torch.autograd.gradcheck: input and every Parameter, float64 central differences vs the hand-written backward
    (called once per output element with retain_graph: the re-run path is exercised too)."""
    _, make, shape = case
    torch.manual_seed(0)
    module = as_module(make())
    x = _input(shape)
    x.requires_grad_(x.is_floating_point())
    params = list(module.parameters())

    def f(x, *ps):
        _reseed(module)
        return module(x)

    assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-8, rtol=1e-6)


def _twin(module: nn.Module) -> nn.Module:
    twin = seeded_dropouts(module.layer.to_torch())
    for m in twin.modules():
        if isinstance(m, SeededDropout):
            m.generator = torch.Generator()
    return twin


@pytest.mark.parametrize("case", CASE_LIST, ids=[c[0] for c in CASE_LIST])
def test_gradients_equal_autograd_through_the_torch_twin(case):
    """One forward and backward with a random upstream gradient; input and parameter gradients (and the
    running statistics) equal those autograd computes through the layer's torch.nn twin."""
    _, make, shape = case
    torch.manual_seed(0)
    module = as_module(make())
    twin = _twin(module)
    assert list(module.state_dict()) == list(twin.state_dict())  # torch's keys, in torch's order
    x = _input(shape)
    dout = None
    grads = []
    for m in (module, twin):
        xi = x.clone().requires_grad_(x.is_floating_point())
        _reseed(m)
        out = m(
            xi * 1.0 if x.is_floating_point() else xi
        )  # a non-leaf input: the twin's in-place layers may overwrite it
        dout = torch.randn_like(out) if dout is None else dout
        out.backward(dout)
        grads.append([xi.grad, *(p.grad for p in m.parameters())])
    names = ["x", *(n for n, _ in module.named_parameters())]
    for name, g, ref in zip(names, *grads, strict=True):
        if g is None and ref is None and name == "x":  # an integer input has no gradient
            continue
        assert g.shape == ref.shape, name
        assert err(g, ref) < 1e-12, name
    for (name, b), ref in zip(module.state_dict().items(), twin.state_dict().values(), strict=True):
        assert torch.equal(b, ref) if not b.is_floating_point() else rel(b, ref) < 1e-14, name


def test_parameters_share_memory_and_the_layers_own_grad_is_left_alone():
    torch.manual_seed(0)
    lin = Linear(3, 4, dtype=F64)
    module = as_module(lin)
    assert module.weight.shape == (4, 3) and module.weight.data_ptr() == lin.weight.data_ptr()
    assert module.bias.data_ptr() == lin.bias.data_ptr()
    sentinel = torch.full((4, 3), 7.0, dtype=F64)
    lin.weight.grad = sentinel
    x = torch.randn(5, 3, dtype=F64)
    module(x).pow(2).sum().backward()
    assert lin.weight.grad is sentinel and (sentinel == 7.0).all() and lin.bias.grad is None
    ref = nn.Linear(3, 4, dtype=F64)
    ref.load_state_dict(module.state_dict())
    ref(x).pow(2).sum().backward()
    assert rel(module.weight.grad, ref.weight.grad) < 1e-14 and rel(module.bias.grad, ref.bias.grad) < 1e-14
    with torch.no_grad():
        module.weight.add_(1.0)  # an optimizer's in-place step reaches the layer
    assert torch.equal(lin.weight, module.weight)


def test_mixed_model_trains_like_the_pure_nn_model():
    """nn.Linear + hand-written BatchNorm1d/ReLU/Dropout/Linear/Tanh trained with torch.optim equals the pure
    nn model step for step (float64, 1e-10 after 8 steps), batch-norm running statistics included."""
    torch.manual_seed(0)
    drop = Dropout(0.3)
    drop.generator = torch.Generator().manual_seed(7)
    mixed = nn.Sequential(
        nn.Linear(6, 8, dtype=F64),
        as_module(BatchNorm1d(8, dtype=F64)),
        as_module(ReLU()),
        as_module(Linear(8, 8, dtype=F64)),
        as_module(drop),
        as_module(Tanh()),
        nn.Linear(8, 3, dtype=F64),
    )
    pure_drop = SeededDropout(0.3)
    pure_drop.generator = torch.Generator().manual_seed(7)
    pure = nn.Sequential(
        nn.Linear(6, 8, dtype=F64),
        nn.BatchNorm1d(8, dtype=F64),
        nn.ReLU(),
        nn.Linear(8, 8, dtype=F64),
        pure_drop,
        nn.Tanh(),
        nn.Linear(8, 3, dtype=F64),
    )
    assert list(mixed.state_dict()) == list(pure.state_dict())
    mixed.load_state_dict(pure.state_dict())
    opts = [
        torch.optim.SGD(mixed.parameters(), lr=0.1, momentum=0.9),
        torch.optim.SGD(pure.parameters(), lr=0.1, momentum=0.9),
    ]
    opts2 = [torch.optim.Adam(mixed.parameters(), lr=0.01), torch.optim.Adam(pure.parameters(), lr=0.01)]
    g = torch.Generator().manual_seed(1)
    for step in range(8):
        x, y = torch.randn(10, 6, generator=g, dtype=F64), torch.randint(0, 3, (10,), generator=g)
        losses = []
        for model, opt, opt2 in zip((mixed, pure), opts, opts2, strict=True):
            model.train(step != 5)  # one eval-mode step: running statistics used, dropout off
            (opt if step < 4 else opt2).zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            (opt if step < 4 else opt2).step()
            losses.append(loss.item())
        assert abs(losses[0] - losses[1]) <= 1e-12 * abs(losses[1])
    assert mixed[1].layer.training and mixed[1].layer.num_batches_tracked.item() == 7
    for (name, a), b in zip(mixed.state_dict().items(), pure.state_dict().values(), strict=True):
        assert a.dtype == b.dtype and (torch.equal(a, b) if not a.is_floating_point() else rel(a, b) < 1e-10), name


def test_repeated_backward_updates_running_stats_once_and_gives_the_same_gradient():
    """backward(retain_graph=True) three times re-runs the forward for the later ones: the same gradient each time
    (three times the first, accumulated), the same dropout mask, running statistics updated once."""
    torch.manual_seed(0)
    drop = Dropout(0.5)
    net = Sequential(Linear(4, 6, dtype=F64), BatchNorm1d(6, dtype=F64), drop, ReLU())
    module = as_module(net)
    x = torch.randn(8, 4, dtype=F64, requires_grad=True)
    out = module(x)
    mask = drop.mask.clone()
    stats = [b.clone() for b in module.buffers()]
    dout = torch.randn_like(out)
    out.backward(dout, retain_graph=True)
    first = [x.grad.clone(), *(p.grad.clone() for p in module.parameters())]
    torch.manual_seed(99)  # the RNG moving between backwards does not change the re-run's mask
    rng = torch.get_rng_state()
    out.backward(dout, retain_graph=True)
    out.backward(dout)
    assert torch.equal(drop.mask, mask)
    assert torch.equal(torch.get_rng_state(), rng)  # the re-runs drew nothing from the caller's point of view
    for g, ref in zip([x.grad, *(p.grad for p in module.parameters())], first, strict=True):
        assert rel(g, 3 * ref) < 1e-14
    for b, ref in zip(module.buffers(), stats, strict=True):
        assert torch.equal(b, ref)
    assert net[1].num_batches_tracked.item() == 1
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.backward(dout)


def test_one_module_used_twice_in_one_graph():
    """Shared weights: the module called twice before one backward gives autograd's gradient (the earlier
    call's forward is re-run from its own input, dropout mask and running statistics)."""
    torch.manual_seed(0)
    seq = Sequential(Linear(4, 4, dtype=F64), _bn(BatchNorm1d, 4)(), _dropout(0.3)(), Tanh())
    module = as_module(seq)
    twin = _twin(module)
    x = torch.randn(6, 4, dtype=F64)
    grads, stats = [], []
    for m in (module, twin):
        _reseed(m)
        xi = x.clone().requires_grad_()
        m(m(xi) * 0.5).pow(2).sum().backward()
        grads.append([xi.grad, *(p.grad for p in m.parameters())])
        stats.append(list(m.state_dict().values()))
    for g, ref in zip(*grads, strict=True):
        assert err(g, ref) < 1e-12
    for a, b in zip(*stats, strict=True):
        assert torch.equal(a, b) if not a.is_floating_point() else rel(a, b) < 1e-14
    assert seq[1].num_batches_tracked.item() == 2  # two forwards, as torch counts them


def test_train_eval_follow_the_module():
    bn = BatchNorm1d(3)
    model = nn.Sequential(as_module(bn), as_module(Dropout(0.5)))
    model.eval()
    assert not bn.training and not model[1].layer.training
    model.train()
    assert bn.training
    model[0].training = False  # set without train(): the next forward follows the module
    model[0](torch.randn(2, 3))
    assert not bn.training


def test_eval_under_no_grad_equals_the_twin():
    torch.manual_seed(0)
    net = Net(hidden_size=8, num_classes=3, in_features=5, depth=2, dtype=F64)
    module = as_module(net).eval()
    twin = net.to_torch().eval()
    x = torch.randn(4, 1, 5, dtype=F64)  # Net flattens (N, 1, 5) -> (N, 5)
    with torch.no_grad():
        assert torch.equal(module(x), twin(x))
    xi = x.clone().requires_grad_()
    module(xi).sum().backward()
    assert xi.grad.shape == x.shape


def test_to_moves_the_layer_and_keeps_the_parameters():
    torch.manual_seed(0)
    lin = Linear(3, 2)
    module = as_module(lin)
    weight = module.weight
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    module.double()
    assert module.weight is weight and weight.dtype == F64 and lin.weight.dtype == F64
    assert lin.weight.data_ptr() == weight.data_ptr()
    module(torch.randn(4, 3, dtype=F64)).sum().backward()
    opt.step()
    assert torch.equal(lin.weight, module.weight)


def test_state_dict_loads_from_the_torch_twin():
    torch.manual_seed(0)
    twin = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
    module = as_module(Sequential(Conv2d(1, 2, 3), BatchNorm2d(2)))
    module.load_state_dict(twin.state_dict())
    assert torch.equal(module.layer[0].weight, twin[0].weight.detach())
    x = torch.randn(2, 1, 5, 5)
    assert rel(module(x), twin(x)) < 1e-6


def test_float32():
    torch.manual_seed(0)
    module = as_module(Sequential(Linear(5, 4), GELU(), Linear(4, 3), LayerNorm(3)))
    twin = module.layer.to_torch()
    x = torch.randn(3, 5)
    module(x).pow(2).sum().backward()
    twin(x).pow(2).sum().backward()
    for p, q in zip(module.parameters(), twin.parameters(), strict=True):
        assert p.grad.dtype == torch.float32 and err(p.grad, q.grad) < 1e-5


def test_errors():
    with pytest.raises(TypeError, match="already a torch.nn.Module"):
        as_module(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="expected a hand-written layer"):
        as_module("relu")
    lin = Linear(3, 2)
    module = as_module(lin)
    with pytest.raises(ValueError, match=r"expected input of shape \(\*, 3\), got \(4, 5\)"):
        module(torch.randn(4, 5))
    lin.to(dtype=F64)  # moved behind the module's back: its Parameters would no longer be the layer's
    with pytest.raises(RuntimeError, match="parameter 'weight' no longer shares memory"):
        module(torch.randn(4, 3, dtype=F64))
    # An activation's cached output overwritten in place: torch's own error, never a silent wrong gradient.
    y = as_module(Tanh())(torch.randn(3, requires_grad=True))
    y.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_a_linear_output_may_be_overwritten_in_place_as_nn_linear_s_may():
    torch.manual_seed(0)
    module = as_module(Linear(3, 4, dtype=F64))
    x = torch.randn(2, 3, dtype=F64, requires_grad=True)
    nn.ReLU(inplace=True)(module(x)).sum().backward()  # Linear's backward needs x, not its output
    assert x.grad is not None


@pytest.mark.cuda
def test_cuda_gradcheck_and_twin():
    cuda = torch.device("cuda")
    torch.manual_seed(0)
    module = as_module(_cnn()).to(cuda)
    for m in module.layer:
        if isinstance(m, Dropout):
            m.generator = torch.Generator(device=cuda)
    x = torch.randn(2, 2, 4, 4, dtype=F64, device=cuda, requires_grad=True)

    def f(x, *ps):
        for m in module.layer:
            if isinstance(m, Dropout):
                m.generator.manual_seed(SEED)
        return module(x)

    # nondet_tol: on a GPU a second backward may sum in another order (atomic adds), differing in the last bits
    assert torch.autograd.gradcheck(f, (x, *module.parameters()), eps=1e-6, atol=1e-8, rtol=1e-6, nondet_tol=1e-12)


def test_a_direct_call_of_the_layer_in_between_is_noticed():
    """The layer run directly between the module's forward and backward: its cache is another input's now; the
    backward notices (the layer's attributes are other objects) and re-runs its own forward."""
    torch.manual_seed(0)
    lin = Linear(3, 2, dtype=F64)
    module = as_module(lin)
    ref = nn.Linear(3, 2, dtype=F64)
    ref.load_state_dict(module.state_dict())
    x = torch.randn(4, 3, dtype=F64)
    out = module(x)
    lin.forward(torch.randn(5, 3, dtype=F64))
    out.pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    assert rel(module.weight.grad, ref.weight.grad) < 1e-14


def test_an_abandoned_graph_is_freed_by_reference_counting():
    """A forward whose backward never comes (grad enabled in evaluation, say) holds no reference cycle: its output
    is freed as soon as the user and the layer let go of it, without waiting for the garbage collector."""
    import gc
    import weakref

    module = as_module(Sequential(Linear(3, 3), Tanh(), BatchNorm1d(3), SiLU()))
    gc.disable()
    try:
        out = module(torch.randn(4, 3, requires_grad=True))
        alive = weakref.ref(out)
        module(torch.randn(4, 3, requires_grad=True))  # the layers' caches move on
        del out
        assert alive() is None
    finally:
        gc.enable()


def test_deepcopy_keeps_parameters_and_layer_together():
    import copy

    torch.manual_seed(0)
    module = as_module(Sequential(Linear(3, 4), BatchNorm1d(4)))
    module(torch.randn(5, 3)).sum().backward()
    clone = copy.deepcopy(module)
    assert clone.layer is not module.layer
    assert clone.get_submodule("0").weight.data_ptr() == clone.layer[0].weight.data_ptr()
    for (name, a), b in zip(clone.state_dict().items(), module.state_dict().values(), strict=True):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr(), name
    for p, q in zip(clone.parameters(), module.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
    with torch.no_grad():
        clone.layer[0].weight.add_(1.0)  # the copy's Parameters are its layer's tensors, not the original's
    assert torch.equal(clone.get_submodule("0").weight, clone.layer[0].weight)
    assert not torch.equal(module.get_submodule("0").weight, clone.get_submodule("0").weight)
    clone(torch.randn(5, 3)).sum().backward()  # and it runs

"""as_module inside the rest of PyTorch: torch's answer beside the plain nn.Module, or one line naming the case.

Activation checkpointing (reentrant and not), DDP on one process, hooks on the wrapper, the old hook forms of
weight_norm and spectral_norm, ``.to()``/``.double()`` after parametrizing, pruning or assigning, a state_dict
loaded with ``assign=True``, ``vector_to_parameters``, channels_last, expanded (stride-0) and transposed inputs, and
forwards under ``no_grad``/``inference_mode`` give torch's outputs, gradients and running statistics (float64, 1e-12
relative to max(|ref|, 1)).  A hook on one of the wrapper's submodules (which only hold parameters: nothing calls them),
a deep copy of a parametrized wrapper, torch.jit.trace, torch.jit.script and torch.export are refused in one line.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.nn.utils import prune
from torch.nn.utils.parametrizations import weight_norm
from torch.utils.checkpoint import checkpoint

from layers import BatchNorm2d, Conv2d, Linear, MaxPool2d, ReLU, Sequential, Tanh, as_module

F64 = torch.float64


def err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a - b| relative to max(max|b|, 1): a bias before batch norm has a gradient of round-off size."""
    return ((a.double() - b.double()).abs().max() / b.abs().max().clamp_min(1.0)).item()


def _mlp():
    return Sequential(Linear(3, 5, dtype=F64), Tanh(), Linear(5, 2, dtype=F64))


def _cnn():
    return Sequential(Conv2d(2, 3, 3, padding=1, dtype=F64), BatchNorm2d(3, dtype=F64), ReLU(), MaxPool2d(2))


def _sub(m: nn.Module, name: str) -> nn.Module:
    return m.get_submodule(name)


def _beside(make, shape, run) -> None:
    """``run(model, x) -> out`` on the wrapper and on its torch twin: outputs, the input's and every parameter's
    gradient (a random upstream gradient) and the state_dicts equal."""
    torch.manual_seed(0)
    module = as_module(make())
    twin = module.layer.to_torch()
    x = torch.randn(shape, dtype=F64)
    results = []
    for m in (module, twin):
        xi = x.clone().requires_grad_()
        out = run(m, xi)
        if out.requires_grad:
            (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)).sum().backward()
        results.append((out.detach(), xi.grad, [p.grad for p in m.parameters()], m.state_dict()))
    (o0, g0, p0, s0), (o1, g1, p1, s1) = results
    assert err(o0, o1) < 1e-12 and (g0 is None) == (g1 is None) and (g1 is None or err(g0, g1) < 1e-12)
    assert len(p0) == len(p1)
    for a, b in zip(p0, p1, strict=True):
        assert (a is None) == (b is None) and (b is None or err(a, b) < 1e-12)
    assert list(s0) == list(s1)
    for name in s0:
        assert err(s0[name], s1[name]) < 1e-12, name


def _no_grad(m, x):
    with torch.no_grad():
        return m(x)


def _inference(m, x):
    with torch.inference_mode():
        return m(x).clone()


def _wrapper_hooks(m, x):
    m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    m.register_forward_hook(lambda mod, args, out: out * 10)
    m.register_full_backward_hook(lambda mod, gin, gout: (gin[0] * 3,))
    m.register_full_backward_pre_hook(lambda mod, gout: (gout[0] * 0.5,))
    return m(x)


def _cast_after(change):
    def run(m, x):
        m.float()
        change(m)
        m.double()
        return m(x)

    return run


def _old_hook_form(apply):
    def run(m, x):
        torch.manual_seed(5)  # the old spectral_norm draws its power-iteration vector
        apply(_sub(m, "0"))
        return m(x)

    return run


def _assign_state(m, x):
    torch.manual_seed(9)
    m.load_state_dict({k: torch.randn_like(v) for k, v in m.state_dict().items()}, assign=True)
    return m(x)


def _vector_to_parameters(m, x):
    nn.utils.vector_to_parameters(nn.utils.parameters_to_vector(m.parameters()) * 0.5, m.parameters())
    return m(x)


CASES = {
    "vector-to-parameters": (_mlp, (4, 3), _vector_to_parameters),
    "checkpoint-reentrant": (_cnn, (2, 2, 4, 4), lambda m, x: checkpoint(m, x, use_reentrant=True)),
    "checkpoint-non-reentrant": (_cnn, (2, 2, 4, 4), lambda m, x: checkpoint(m, x, use_reentrant=False)),
    "channels-last": (_cnn, (2, 2, 4, 4), lambda m, x: m(x.contiguous(memory_format=torch.channels_last))),
    "expanded-cnn": (_cnn, (2, 2, 4, 4), lambda m, x: m(x[:1].expand(3, 2, 4, 4))),
    "expanded-mlp": (_mlp, (4, 3), lambda m, x: m(x[:1].expand(4, 3))),
    "transposed": (_mlp, (4, 3), lambda m, x: m(x.t().contiguous().t())),
    "no-grad": (_cnn, (2, 2, 4, 4), _no_grad),
    "inference-mode": (_cnn, (2, 2, 4, 4), _inference),
    "hooks-on-the-wrapper": (_mlp, (4, 3), _wrapper_hooks),
    "parameter-hooks": (_mlp, (4, 3), lambda m, x: [p.register_hook(lambda g: g * 2) for p in m.parameters()] and m(x)),
    "float-then-double": (_mlp, (4, 3), _cast_after(lambda m: None)),
    "weight-norm-then-double": (_mlp, (4, 3), _cast_after(lambda m: weight_norm(_sub(m, "0")))),
    "pruned-then-double": (_mlp, (4, 3), _cast_after(lambda m: prune.l1_unstructured(_sub(m, "0"), "weight", 0.3))),
    "assigned-then-double": (
        _mlp,
        (4, 3),
        _cast_after(lambda m: setattr(_sub(m, "2"), "weight", nn.Parameter(torch.linspace(-1, 1, 10).view(2, 5)))),
    ),
    "old-spectral-norm-hook": (_mlp, (4, 3), _old_hook_form(nn.utils.spectral_norm)),
    "old-weight-norm-hook": (_mlp, (4, 3), _old_hook_form(nn.utils.weight_norm)),
    "load-state-dict-assign": (_mlp, (4, 3), _assign_state),
    "deepcopy": (_cnn, (2, 2, 4, 4), lambda m, x: copy.deepcopy(m)(x)),
}


@pytest.mark.filterwarnings("ignore::FutureWarning")  # the old weight_norm hook form is deprecated
@pytest.mark.parametrize("case", sorted(CASES))
def test_beside_the_torch_module(case):
    make, shape, run = CASES[case]
    _beside(make, shape, run)


def test_ddp_on_one_process(tmp_path):
    """DistributedDataParallel (gloo, a file:// rendezvous, world size 1) around the wrapper: torch's step."""
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        _beside(_cnn, (2, 2, 4, 4), lambda m, x: DistributedDataParallel(m)(x))
    finally:
        if started:
            dist.destroy_process_group()


def test_a_hook_on_a_submodule_of_the_wrapper_is_refused():
    """The submodules hold parameters for torch's names; the layer runs as one node, so nothing calls them."""
    module = as_module(_mlp())
    _sub(module, "0").register_forward_hook(lambda mod, args, out: out * 10)
    with pytest.raises(
        RuntimeError,
        match=r"^as_module\(Sequential\(Linear, Tanh, Linear\)\): a forward hook on "
        r"its submodule '0' would never run .*register the hook on the as_module "
        r"wrapper itself$",
    ):
        module(torch.randn(4, 3, dtype=F64))


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.jit is deprecated
@pytest.mark.parametrize(
    "what,run",
    [
        ("torch.jit.trace", lambda m, x: torch.jit.trace(m, x)(x)),
        ("torch.jit.script", lambda m, x: torch.jit.script(m)(x)),
        ("torch.export", lambda m, x: torch.export.export(m, (x,)).module()(x)),
    ],
)
def test_graph_capture_it_cannot_trace_into_is_refused_naming_as_module(what, run):
    torch.manual_seed(0)
    module = as_module(_mlp())
    x = torch.randn(4, 3, dtype=F64)
    assert err(run(module.layer.to_torch(), x), module(x)) < 1e-12  # torch's module is captured
    with pytest.raises(
        RuntimeError,
        match=rf"^as_module\(Sequential\(Linear, Tanh, Linear\)\): {what} is not "
        rf"supported .*use its torch.nn twin \(layer.to_torch\(\)\) there$",
    ):
        run(module, x)


def test_a_deep_copy_of_a_parametrized_wrapper_is_refused():
    module = as_module(_mlp())
    weight_norm(_sub(module, "0"))
    with pytest.raises(RuntimeError, match=r"cannot deepcopy a wrapper whose parameter '0.weight' was parametrized"):
        copy.deepcopy(module)

"""``as_module(layer)``: a hand-written layer (or a whole Sequential/Net) as a ``torch.nn.Module``.

Autograd sees one node per wrapped layer, a ``torch.autograd.Function`` whose forward is the layer's
hand-written forward and whose backward is the layer's hand-written backward -- no autograd graph is
built inside it.  So a hand-written layer drops into any PyTorch model, trains with torch.optim, and is
checked by ``torch.autograd.gradcheck(as_module(layer), x)``.

The layer's parameters appear as ``nn.Parameter``s (torch.nn's shapes, as the layer keeps them),
sharing memory with the layer's own tensors: an optimizer stepping the Parameters steps the layer.
Buffers (batch norm's running statistics) are registered as buffers, the very tensors the layer updates,
so the module's ``state_dict()`` has the keys and layouts of the torch.nn twin and loads from it.

The layer computes with the parameters the module holds at each call (binding.py):
``getattr(submodule, name)`` as torch would read it, so ``torch.func.functional_call`` with other weights,
a parametrization (``weight_norm``, ``spectral_norm``, ``register_parametrization``), pruning and a
Parameter assigned in place of another are what the hand-written forward and backward compute with, and
autograd carries each gradient on to whatever the tensor came from.  The gradient goes to a Parameter
whose ``requires_grad`` is True (torch's rule, read from the module's tensors); the layer's own ``.grad``s
are left as they were.

One backward per forward is what a hand-written layer's cache serves.  Autograd may ask for more:
``backward(retain_graph=True)`` then another backward, ``torch.autograd.gradcheck`` (one backward per
output element), or the module called twice in one graph (shared weights, as an nn.Module may be).  Each
forward therefore keeps its input and a snapshot of what it changed or drew -- the buffers before the
forward (running statistics) and the state of each generator a dropout drew its mask from -- and notes
which objects the layers' attributes held right after it.  A backward that finds any of them replaced
(the cache used by an earlier backward, or overwritten by a later forward, through this module or by
calling the layer directly) re-runs its forward first, from the snapshot, then puts the buffers and the
random states back as they are now: running statistics are updated once per forward call, the re-run
draws the same dropout mask, and every backward gets the gradient of its own forward.  In the usual
training step (one forward, one backward) nothing is re-run.  A re-run needs the forward's input and
parameters as they were: one changed in place since (an optimizer step between two backwards of a
retained graph) is refused, naming it, as autograd refuses a saved tensor that changed.

What it supports and what it refuses, each in one line naming the layer:
- double backward: refused.  Gradients asked for with ``create_graph=True`` are torch's, behind a node that
  raises when differentiated (torch's mechanism for a once-differentiable function): a gradient penalty,
  ``hvp`` and ``hessian`` stop there instead of missing the second-derivative terms;
- torch.func: ``grad``/``vjp`` (one level) and ``functional_call`` work; ``vmap`` (so ``jacrev``, ``jacfwd``,
  ``hessian``), ``jvp`` and forward-mode AD, and ``grad`` of ``grad`` are refused;
- autocast: the layer runs with autocast off, a floating input cast to its parameters' dtype, as
  ``torch.amp.custom_fwd(cast_inputs=...)`` runs a custom function: its output has the parameters' dtype;
- hooks on the wrapper run as on any module; a hook on one of its submodules (they only hold parameters, and
  nothing calls them) is refused, except the pre-hooks that recompute a parameter (pruning, the old hook forms
  of weight_norm and spectral_norm), which the wrapper runs;
- a buffer replaced on the module (``functional_call`` with buffers) is refused; ``copy.deepcopy`` of a wrapper
  whose parameters were parametrized, pruned or replaced is refused;
- ``torch.compile`` runs it; ``torch.jit.trace``, ``torch.jit.script`` and ``torch.export`` are refused.

Rules: move or cast with ``module.to(...)`` (it moves the layer too; moving the layer alone is refused
at the next forward); layers with ``inplace=True`` run on a copy of their input (a custom Function may
not overwrite its input behind autograd's back); a layer's cache is recognised by assignment (a
hand-written layer of your own must assign new cache objects in forward, not overwrite old ones in place).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from ..dropout import Dropout
from ..layer import BaseLayer, Layer, named_parameters_of
from ..sequential import _takes_need_input_grad
from ..template import Template
from .binding import bind, read_parameters, rewired, run_pruning_hooks
from .function import _HandgradFunction, _refuse_transforms, _refused_under


def _walk(layer: Layer, prefix: str = "") -> Iterator[tuple[str, Layer]]:
    """(dotted prefix, layer) for the layer and every layer inside it, depth first (explicit stack)."""
    stack = [(prefix, layer)]
    while stack:
        pre, node = stack.pop()
        yield pre, node
        children = list(node.named_children()) if isinstance(node, BaseLayer) else []
        stack.extend((f"{pre}{name}.", child) for name, child in reversed(children))


def _own_tensors(node: Layer, kind: str) -> Iterator[tuple[str, Tensor]]:
    """A layer's own parameters (kind="param") or buffers (kind="buffer"), not its children's: (attr, tensor)."""
    if isinstance(node, BaseLayer):
        for attr in node._param_names if kind == "param" else node._buffer_names:
            t = getattr(node, attr)
            if t is not None:
                yield attr, t
    elif kind == "param":
        yield from named_parameters_of(node)


def _held(node: Layer, attr: str) -> Tensor | None:
    """The tensor a layer holds now under ``attr`` (a layer of your own: as ``named_parameters_of`` names it)."""
    if isinstance(node, BaseLayer) or not attr.isdigit():
        return getattr(node, attr, None)
    return dict(named_parameters_of(node)).get(attr)


class _Slot:
    """One parameter: the layers and attributes that hold it (``users``: several for a tensor two layers share), the
    (submodule, name) pairs under which the module registers its Parameter (``holders``: several for a tied one),
    and the Parameter itself (torch.nn's layout, the layer's memory).  ``bindable``: the layers hold it as a plain
    attribute, which the wrapper can point at another tensor for one call."""

    __slots__ = ("node", "attr", "name", "tensor", "param", "users", "holders", "bindable", "ptr")

    def __init__(self, node: Layer, attr: str, name: str, tensor: Tensor, param: nn.Parameter) -> None:
        self.node, self.attr, self.name, self.tensor, self.param = node, attr, name, tensor, param
        self.users: list[tuple[Layer, str]] = []
        self.holders: list[tuple[nn.Module, str]] = []
        self.bindable = True
        self.ptr = tensor.data_ptr()  # where the two shared memory last: which side moved, if one did

    def use(self, node: Layer, attr: str) -> None:
        self.users.append((node, attr))
        self.bindable = self.bindable and vars(node).get(attr) is self.tensor


class HandgradModule(nn.Module):
    """A hand-written layer as an nn.Module; build it with ``as_module(layer)``.

    ``forward(x)`` runs the layer's forward, autograd's backward runs the layer's backward.  ``.layer`` is
    the wrapped layer.  ``train()``/``eval()`` set the layer's mode too; ``to()``/``double()``/``cuda()``
    move the layer's tensors and keep the Parameters pointing at them.
    """

    def __init__(self, layer: Layer) -> None:
        if isinstance(layer, nn.Module) or not isinstance(layer, Layer):
            raise TypeError(
                f"as_module: expected a hand-written layer (forward, backward, parameters), got "
                f"{type(layer).__name__}"
                + (" -- it is already a torch.nn.Module" if isinstance(layer, nn.Module) else "")
            )
        refused = getattr(layer, "as_module_refuses", None)  # a layer's own reason (the recurrent layers')
        if refused:
            raise TypeError(
                f"as_module wraps layers of one input and one output; {type(layer).__name__} {refused} "
                f"(use its torch.nn twin, layer.to_torch(), inside an nn.Module)"
            )
        inputs = _required_inputs(layer)
        if len(inputs) > 1:
            raise TypeError(
                f"as_module wraps layers with one input; {type(layer).__name__}.forward takes "
                f"{', '.join(inputs)} (use its torch.nn twin, layer.to_torch(), inside an nn.Module)"
            )
        super().__init__()
        self.layer = layer
        nodes = list(_walk(layer))
        self._leaves = [node for _, node in nodes]
        self._slots: list[_Slot] = []
        self._buffers_of: list[tuple[Layer, str, Tensor]] = []
        self._buffer_holders: list[tuple[nn.Module, str, Tensor]] = []
        made: dict[int, _Slot] = {}
        for prefix, node in nodes:
            for attr, t in _own_tensors(node, "param"):
                if not t.is_floating_point():
                    raise TypeError(
                        f"as_module: parameter '{prefix}{attr}' of {node!r} has dtype {t.dtype}; "
                        f"parameters must be floating point"
                    )
                slot = made.get(id(t))
                if slot is None:
                    # a new tensor object over the same memory, requiring a gradient as the layer's tensor does (a
                    # layer of your own keeps plain tensors and writes their .grad itself: trainable)
                    param = nn.Parameter(t, requires_grad=t.requires_grad or not isinstance(node, BaseLayer))
                    slot = made[id(t)] = _Slot(node, attr, prefix + attr, t, param)
                    self._slots.append(slot)
                # a tensor two layers hold (a module used twice) is one Parameter under both names
                slot.use(node, attr)
                self._holder(prefix).register_parameter(attr, slot.param)
                slot.holders.append((self._holder(prefix), attr))
            for attr, t in _own_tensors(node, "buffer"):
                self._holder(prefix).register_buffer(attr, t)
                self._buffers_of.append((node, attr, t))
                self._buffer_holders.append((self._holder(prefix), attr, t))
        self._register_tied_names()
        self._holders = [m for m in self.modules() if m is not self]  # they hold parameters; nothing calls them
        self._inplace = any(getattr(node, "inplace", False) is True for node in self._leaves)
        self._dropouts = [node for node in self._leaves if isinstance(node, Dropout)]
        self._skips_dx = _takes_need_input_grad(layer)
        self._pending = None  # what the Function's forward hands to its setup_context
        self.train(getattr(layer, "training", True))

    def _register_tied_names(self) -> None:
        """A layer whose state_dict names one parameter twice (GPT's ``lm_head.weight``, its token table) gets the
        same Parameter under the second name too, as a tied nn.Module has it: named_parameters() yields it once,
        state_dict() under both names."""
        own = getattr(self.layer, "state_dict", None)
        if own is None:
            return
        names = {s.name for s in self._slots}
        for key, t in own().items():
            if key in names:
                continue
            for s in self._slots:
                p = s.param
                if (t.data_ptr(), t.shape, t.stride()) == (p.data_ptr(), p.shape, p.stride()):
                    prefix, _, attr = key.rpartition(".")
                    holder = self._holder(prefix + "." if prefix else "")
                    holder.register_parameter(attr, p)
                    s.holders.append((holder, attr))
                    break

    def _holder(self, prefix: str) -> nn.Module:
        """The submodule that holds the tensors named ``prefix + attr`` ("layers.0." -> self.layers[0])."""
        module: nn.Module = self
        for part in filter(None, prefix.split(".")):
            child = module._modules.get(part)
            if child is None:
                child = nn.Module()
                module.add_module(part, child)
            module = child
        return module

    def __repr__(self) -> str:
        return f"as_module({self.layer!r})"

    def __deepcopy__(self, memo: dict) -> HandgradModule:
        """A copy over a deep copy of the layer (nn.Module's own deepcopy would copy the Parameters and the
        layer's tensors apart, and they would no longer share memory); gradients are copied too."""
        name = rewired(self)
        if name is not None:
            raise RuntimeError(
                f"as_module: cannot deepcopy a wrapper whose parameter '{name}' was parametrized, "
                f"pruned or replaced (the copy is built from the layer, which knows none of that): "
                f"deepcopy it before, or remove the parametrization / pruning first"
            )
        clone = HandgradModule(copy.deepcopy(self.layer, memo)).train(self.training)
        for mine, theirs in zip(self._slots, clone._slots, strict=True):
            theirs.param.requires_grad_(mine.param.requires_grad)
            if mine.param.grad is not None:
                theirs.param.grad = mine.param.grad.clone()
        memo[id(self)] = clone
        return clone

    def __prepare_scriptable__(self) -> nn.Module:
        """torch.jit.script asks this first: a hand-written layer is Python that TorchScript cannot compile."""
        raise _refused_under(self.layer, "torch.jit.script")

    # -- modes and devices --------------------------------------------------------------------------------

    def train(self, mode: bool = True) -> HandgradModule:
        super().train(mode)
        if hasattr(self.layer, "train"):
            self.layer.train(mode)
        elif hasattr(self.layer, "training"):
            self.layer.training = bool(mode)
        return self

    def _apply(self, fn, recurse: bool = True) -> HandgradModule:
        """``to``/``double``/``cuda``/...: convert the layer's tensors in place (their identities kept, as
        BaseLayer.to does) and point the Parameters (identities kept too: optimizers built earlier still
        hold them) at the converted memory."""
        grads = [None if s.param.grad is None else fn(s.param.grad) for s in self._slots]
        for s in self._slots:
            s.tensor.data = fn(s.tensor)
            s.param.data = s.tensor
            s.ptr = s.tensor.data_ptr()
        for s, g in zip(self._slots, grads, strict=True):
            s.param.grad = g
        for _, _, t in self._buffers_of:
            t.data = fn(t)
        # What else the module holds (a parametrization's or pruning's tensors, an assigned Parameter): torch's own
        # conversion, a no-op on the tensors converted above (fn of a converted tensor is that tensor).
        return super()._apply(fn, recurse)

    def _check_bound(self) -> None:
        """Every Parameter still shares memory with the layer tensor it was made from (cheap pointer tests)."""
        for s in self._slots:
            t, p = _held(s.node, s.attr), s.param
            if t is s.tensor and t.data_ptr() == s.ptr != p.data_ptr() and t.shape == p.shape:
                t.data = p.data  # the Parameter's .data was replaced (vector_to_parameters): the layer follows it
                s.ptr = t.data_ptr()
            if t is not s.tensor or t.data_ptr() != p.data_ptr() or t.dtype != p.dtype or t.device != p.device:
                raise RuntimeError(
                    f"as_module: parameter '{s.name}' no longer shares memory with the layer's tensor (the layer "
                    f"was moved, cast or given a new tensor outside the module); move or cast with "
                    f"module.to(...), and load weights with module.load_state_dict"
                )

    # -- forward ----------------------------------------------------------------------------------------

    def forward(self, x: Tensor) -> Tensor:
        """x: the layer's input -> the layer's output (autograd's backward runs the hand-written backward).  The layer
        computes with the parameters as the module holds them now (binding.py)."""
        layer = self.layer
        if getattr(layer, "training", self.training) != self.training:
            self.train(self.training)  # the module's mode was set without train() (e.g. module.training = False)
        self._check_bound()
        _refuse_transforms(layer)
        run_pruning_hooks(self, self._holders, x)
        params = read_parameters(self)
        x = self._autocast_input(x)
        with (
            torch.autocast(x.device.type if isinstance(x, Tensor) else "cpu", enabled=False)
            if self._autocasting(x)
            else contextlib.nullcontext()
        ):
            if not torch.is_grad_enabled() or not (
                (isinstance(x, Tensor) and x.requires_grad) or any(p.requires_grad for p in params)
            ):
                # No graph will be recorded: a plain forward, nothing kept for a backward.
                with bind(self, params, [False] * len(params)):
                    return layer.forward(x.clone() if self._inplace and isinstance(x, Tensor) else x)
            return _HandgradFunction.apply(self, x, *params)

    def _autocasting(self, x: object) -> bool:
        return isinstance(x, Tensor) and torch.is_autocast_enabled(x.device.type)

    def _autocast_input(self, x: Any) -> Any:
        """Under autocast the layer runs with autocast off and a floating input cast to its parameters' dtype, as
        torch.amp.custom_fwd(cast_inputs=...) runs a custom function: the output has the parameters' dtype."""
        if not self._autocasting(x) or not x.is_floating_point() or not self._slots:
            return x
        return x.to(self._slots[0].param.dtype)

    # -- what a forward changes, so that it can be re-run exactly --------------------------------------------

    def _generators(self, device: torch.device) -> list[torch.Generator]:
        """The generators the dropout layers will draw from in this forward (once each)."""
        gens: list[torch.Generator] = []
        for d in self._dropouts:
            if not (d.training and 0.0 < d.p < 1.0):
                continue
            g = d.generator
            if g is None:
                g = torch.default_generator if device.type == "cpu" else _device_default_generator(device)
            if all(g is not h for h in gens):
                gens.append(g)
        return gens

    def _snapshot(self, device: torch.device) -> tuple:
        """The random states and buffers this forward starts from."""
        gens = self._generators(device)
        training = [getattr(node, "training", True) for node in self._leaves]
        return ([(g, g.get_state()) for g in gens], [t.clone() for _, _, t in self._buffers_of], training)

    def _rerun(self, x: Tensor, snapshot: tuple) -> None:
        """Re-run a forward from its snapshot (refilling the layer's cache for one backward); the buffers,
        random states and modes are as they were before this call afterwards."""
        rng, buffers_before, training = snapshot
        now = (
            [(g, g.get_state()) for g, _ in rng],
            [t.clone() for _, _, t in self._buffers_of],
            [getattr(node, "training", True) for node in self._leaves],
        )
        try:
            self._put(rng, buffers_before, training)
            self.layer.forward(x.clone() if self._inplace else x)
        finally:
            self._put(*now)

    def _put(self, rng: list, buffers: list[Tensor], modes: list[bool]) -> None:
        """Set the generators' states, the buffers' values and the layers' modes."""
        for g, state in rng:
            g.set_state(state)
        for (_, _, t), value in zip(self._buffers_of, buffers, strict=True):
            t.copy_(value)
        for node, mode in zip(self._leaves, modes, strict=True):
            if hasattr(node, "training"):
                node.training = mode


def _required_inputs(layer: Layer) -> list[str]:
    """The positional arguments ``layer.forward`` needs (no default): ["x"] for a one-input layer."""
    try:
        forward = layer.forward_math if isinstance(layer, Template) else layer.forward  # (the math names them)
        params = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]


def _device_default_generator(device: torch.device) -> torch.Generator:
    """torch's default generator on a non-CPU device (what ``bernoulli_`` draws from without a generator): the
    device module's ``default_generators`` (CUDA, XPU, ...).  A backend without generator objects (MPS keeps one
    process-wide state) is refused: the re-run of a forward could not draw the same dropout mask."""
    module = torch.get_device_module(device)
    generators = getattr(module, "default_generators", None)
    if not generators:
        raise RuntimeError(
            f"as_module: a dropout layer on {device.type} draws from a random state that cannot be "
            f"saved and restored per generator; give the layer its own torch.Generator "
            f"(layer.generator = torch.Generator(device)) or run it on cpu or cuda"
        )
    return generators[device.index if device.index is not None else module.current_device()]


def as_module(layer: Layer) -> HandgradModule:
    """The hand-written ``layer`` (any layer of ``layers/``, or a Sequential/Net) as a torch.nn.Module.

        model = nn.Sequential(nn.Linear(784, 256), as_module(layers.BatchNorm1d(256)), as_module(layers.ReLU()),
                              as_module(layers.Linear(256, 10)))
        torch.autograd.gradcheck(as_module(layers.Tanh()), torch.randn(4, 3, dtype=torch.float64,
                                                                      requires_grad=True))

    Its Parameters (torch.nn's names and layouts) share memory with the layer's tensors; autograd's
    backward of its output runs the layer's hand-written backward (see this file's docstring).
    """
    return HandgradModule(layer)

"""from_torch: a torch.nn model of supported modules becomes its hand-written twin, with the same weights."""

from __future__ import annotations

import copy
from collections import OrderedDict

import torch
from torch import nn

from ..layer import BaseLayer
from ..sequential import Sequential


def _supported() -> dict[type[nn.Module], type[BaseLayer]]:
    """torch.nn class -> hand-written class, for every layer that names its torch twin."""
    table: dict[type[nn.Module], type[BaseLayer]] = {}
    stack = list(BaseLayer.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        torch_class = cls.__dict__.get("torch_class")
        if torch_class is not None and not cls.__name__.startswith("_"):
            table.setdefault(torch_class, cls)
    return table


def from_torch(module: nn.Module) -> BaseLayer:
    """``from_torch(nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), ...))`` -> ``layers.Sequential`` of the
    hand-written layers, holding copies of the module's weights and buffers, in the module's mode.

    nn.Sequential may nest, and keeps its children's names (``nn.Sequential(OrderedDict(fc=...))`` gives
    "fc.weight", so ``to_torch().state_dict()`` loads into the original).  A module with no hand-written twin
    raises a TypeError naming it.

    What torch runs is converted: a module used twice (``act = nn.ReLU(); nn.Sequential(lin, act, lin2, act)``,
    or ``nn.Sequential(lin, nn.Tanh(), lin)``) appears twice, as two hand-written layers that hold the very same
    tensors -- each keeps its own cache for backward, and the shared weight's ``.grad`` receives both uses.
    A parameter shared by two modules (``l2.weight = l1.weight``; an Embedding tied to the output Linear) is
    likewise one tensor in both hand-written layers.  ``named_parameters()`` then names a shared tensor once,
    state_dict under every name, as torch's do.  Two different tensors over the same memory (a transposed tie,
    ``l2.weight = nn.Parameter(l1.weight.T)``) are refused: copies of them would drift apart.  A parameter with
    ``requires_grad=False`` is frozen
    (``requires_grad_``): it gets no gradient.

    Each child keeps its own train/eval mode (``model.train(); bn.eval()``).  What the hand-written layers would
    not run is refused, naming the module: a hook (forward, forward pre-, backward, backward pre-; or a global
    one), a parametrization, pruning's reparametrisation, a parameter or buffer the torch class does not have, a
    subclass of a supported class (its own code), a composite module whose submodules are in two modes.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"from_torch: expected a torch.nn.Module, got {type(module).__name__}")
    _refuse_global_hooks()
    _refuse_overlapping(module)
    return _convert(module, "", {}, {})


def _refuse_overlapping(module: nn.Module) -> None:
    """Refuse two different tensors over the same memory (``l2.weight = nn.Parameter(l1.weight.T)``, a tied
    transposed autoencoder): copied apart, they would drift apart at the first step where torch's stay one."""
    seen: dict[tuple, list[tuple[int | torch.SymInt, int | torch.SymInt, str]]] = {}
    named = [*module.named_parameters(remove_duplicate=True), *module.named_buffers(remove_duplicate=True)]
    for name, t in named:
        if t.device.type == "meta" or t.numel() == 0:
            continue
        storage = t.untyped_storage()
        start = t.storage_offset() * t.element_size()
        span = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True))  # elements it reaches
        end = start + span * t.element_size()
        for other_start, other_end, other in seen.setdefault((t.device, storage.data_ptr()), []):
            if start < other_end and other_start < end:
                raise TypeError(
                    f"from_torch: {other} and {name} are two tensors over the same memory (one a view "
                    f"of the other, as a transposed tie is), which two hand-written layers cannot share: "
                    f"copied apart they would drift apart at the first step; give {name} its own memory "
                    f"(nn.Parameter(t.detach().clone())) to train the two apart"
                )
        seen[(t.device, storage.data_ptr())].append((start, end, name))


_HOOKS = (
    ("_forward_pre_hooks", "forward pre-hook"),
    ("_forward_hooks", "forward hook"),
    ("_backward_pre_hooks", "backward pre-hook"),
    ("_backward_hooks", "backward hook"),
)


def _where(path: str, module: nn.Module) -> str:
    return f"'{path}' ({type(module).__name__})" if path else type(module).__name__


def _name(hook: object) -> str:
    return getattr(hook, "__qualname__", None) or type(hook).__name__


def _refuse_global_hooks() -> None:
    """A hook registered for every module (``register_module_forward_hook``, ...) would not run in handgrad."""
    from torch.nn.modules import module as torch_module

    for kind in ("forward_pre", "forward", "backward_pre", "backward"):
        if getattr(torch_module, f"_global_{kind}_hooks", None):
            raise TypeError(
                f"from_torch: a global module {kind.replace('_', ' ')} hook is registered "
                f"(register_module_{kind}_hook); the hand-written layers would not run it: remove it "
                f"first (handle.remove())"
            )


def _refuse_dropped(module: nn.Module, path: str) -> None:
    """Refuse, naming it, whatever torch would run on ``module`` or its submodules and a hand-written layer not."""
    from torch.nn.utils import parametrize, prune

    other = [p for p, sub in module.named_modules(prefix=path) if sub.training != module.training]
    if other:  # one hand-written layer has one mode
        raise TypeError(
            f"from_torch: {_where(path, module)} is in {'train' if module.training else 'eval'} mode but "
            f"its {', '.join(map(repr, other))} in the other, which the hand-written "
            f"{type(module).__name__} cannot hold; put the whole module in one mode first"
        )
    for sub_path, sub in module.named_modules(prefix=path, remove_duplicate=False):
        where = _where(sub_path, sub)
        if parametrize.is_parametrized(sub):
            names = ", ".join(repr(n) for n in sub.parametrizations)
            raise TypeError(
                f"from_torch: {where} has a parametrization of {names} (register_parametrization, "
                f"weight_norm, spectral_norm), which the hand-written layer would not apply; bake it "
                f"in first: torch.nn.utils.parametrize.remove_parametrizations(module, name)"
            )
        for attr, kind in _HOOKS:
            for hook in getattr(sub, attr, {}).values():
                if isinstance(hook, prune.BasePruningMethod):
                    raise TypeError(
                        f"from_torch: {where} is pruned ({hook._tensor_name}_orig and "
                        f"{hook._tensor_name}_mask), which the hand-written layer would not apply; make "
                        f"it permanent first: torch.nn.utils.prune.remove(module, '{hook._tensor_name}')"
                    )
                raise TypeError(
                    f"from_torch: {where} has a {kind} ({_name(hook)}), which the hand-written layer "
                    f"would not run; remove it first (handle.remove()) and apply it to the hand-written model's "
                    f"values yourself"
                )


def _convert(
    module: nn.Module, path: str, converted: dict[int, BaseLayer], tensors: dict[int, torch.Tensor]
) -> BaseLayer:
    """from_torch of ``module`` at ``path``, with ``converted`` (id of each torch module converted so far -> its
    hand-written layer) and ``tensors`` (id of each torch parameter or buffer seen so far -> its hand-written one)."""
    done = converted.get(id(module))
    if done is not None:  # the same module used again: the same tensors, a cache of its own
        kept = [*done.parameters(), *(b for _, b in done.named_buffers())]
        return copy.deepcopy(done, {id(t): t for t in kept})
    if type(module) is nn.Sequential:
        _refuse_dropped_own(module, path)
        # module._modules, not named_children(): named_children() gives a module used twice only once
        layer = Sequential(
            OrderedDict(
                (name, _convert(child, f"{path}.{name}" if path else name, converted, tensors))
                for name, child in module._modules.items()
                if child is not None
            )
        )
        layer.training = module.training  # its own flag only: each child keeps its own mode (a BatchNorm in eval)
    else:
        _refuse_dropped(module, path)
        table = _supported()
        cls = table.get(type(module))
        if cls is None:
            base = next((c for c in type(module).__mro__[1:] if c in table or c is nn.Sequential), None)
            if base is not None:
                raise TypeError(
                    f"from_torch: {_where(path, module)} is a subclass of nn.{base.__name__}; its own "
                    f"code (forward, ...) would not run in the hand-written layer: convert a plain "
                    f"nn.{base.__name__}"
                )
            names = ", ".join(sorted(["Sequential", *(c.__name__ for c in table)]))
            raise TypeError(f"from_torch: {type(module).__name__} is not supported; supported: {names}")
        try:
            layer = cls.from_torch(module)
        except KeyError as e:  # the module's state_dict has keys the torch class does not make
            raise TypeError(
                f"from_torch: {_where(path, module)} does not convert: {e.args[0]} (its tensors must be "
                f"a plain nn.{cls.torch_class.__name__}'s; one added would be dropped)"  # type: ignore[union-attr]
            ) from None
        _tie(module, path, layer, tensors)
    converted[id(module)] = layer
    return layer


def _refuse_dropped_own(module: nn.Module, path: str) -> None:
    """_refuse_dropped for a container's own hooks and tensors (its children are checked as they convert)."""
    where = _where(path, module)
    for attr, kind in _HOOKS:
        for hook in getattr(module, attr, {}).values():
            raise TypeError(
                f"from_torch: {where} has a {kind} ({_name(hook)}), "
                f"which the hand-written Sequential would not run; remove it first (handle.remove())"
            )
    own = [n for n, t in (*module._parameters.items(), *module._buffers.items()) if t is not None]
    if own:
        raise TypeError(
            f"from_torch: {where} holds its own tensors {', '.join(map(repr, own))}, which no "
            f"hand-written layer would use"
        )


def _tie(module: nn.Module, path: str, layer: BaseLayer, tensors: dict[int, torch.Tensor]) -> None:
    """Pair ``module``'s tensors with ``layer``'s by name: refuse one the layer has no place for; make a tensor
    already converted elsewhere (a tied weight) the very same tensor here, so both uses add into one ``.grad``."""
    ours = {name: (owner, attr, t) for kind in ("param", "buffer") for owner, attr, name, t in layer._slots(kind)}
    theirs = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    extra = [name for name, _ in theirs if name not in ours]
    if extra:
        raise TypeError(
            f"from_torch: {_where(path, module)} has {', '.join(map(repr, extra))}, which the "
            f"hand-written {type(layer).__name__} has no place for (a parameter or buffer added to "
            f"the module); it would be dropped"
        )
    for name, t in theirs:
        owner, attr, mine = ours[name]
        first = tensors.setdefault(id(t), mine)
        if first is not mine:
            setattr(owner, attr, first)


def to_torch(layer: BaseLayer) -> nn.Module:
    """``layer.to_torch()``: the torch.nn equivalent holding copies of the weights and buffers."""
    convert = getattr(layer, "to_torch", None)
    if convert is None:
        raise TypeError(f"to_torch: {type(layer).__name__} has no torch.nn twin")
    return convert()


__all__ = ["from_torch", "to_torch"]

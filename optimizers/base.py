"""HandOptimizer: torch.optim.Optimizer plumbing around a hand-written, vectorised update.

Subclassing ``torch.optim.Optimizer`` gives param_groups, state_dict /
load_state_dict, zero_grad, add_param_group, hooks and every lr_scheduler for
free; each subclass writes only ``_update(group, params, grads)``, the update
equations, with ``torch._foreach_*`` ops across the group (one kernel per
operation for the whole group rather than one per tensor).

``capturable`` has torch.optim's meaning.  Off (the default), a step counter is a
0-d CPU tensor and the bias corrections are Python floats computed from it: cheap,
since reading a CPU number never waits for the GPU, but a replayed CUDA graph would
never advance such a counter.  On, the counter lives on the parameter's device and
every scalar that depends on it (bias corrections, Adagrad's decayed rate) is a
device tensor computed by kernels, so the step does no host synchronisation and no
host-to-device copy and can be captured in a CUDA graph (``training.cuda_graph``).
Hyper-parameters (lr, betas, ...) are Python numbers passed to the kernels as
arguments: a captured graph keeps the values it was captured with.

A tensor ``lr`` (and Adam's tensor ``betas``), as torch.optim takes them: one element,
kept as given in ``param_groups`` (so an lr_scheduler, which ``fill_``s a tensor lr in
place, changes that very tensor).  With ``capturable=True`` the kernels read it on the
device, in torch.optim's capturable order of operations, so a schedule keeps working
inside a captured CUDA graph.  Otherwise each step reads its value (``.item()``: put it
on the CPU) into the same scalar expressions torch's per-tensor code evaluates with it.

torch.optim's implementation switches are accepted with torch's meaning where they
mean something here: ``foreach`` None/True/False all run the one vectorised update
(``torch._foreach_*``; on the CPU those kernels loop over the tensors, so False would
compute the same numbers one tensor at a time); ``differentiable=False`` and
``fused=None/False`` are accepted, and ``differentiable=True`` / ``fused=True`` are
refused with a ValueError saying why (the update is hand-written outside autograd, and
it is the foreach one, not a fused kernel).

What is checked when.  Each optimizer names the hyper-parameters its update reads and how
each is checked (``_hyper``: lr, eps, ... must be finite numbers in range; ``_flags``:
True or False).  They are checked in the constructor, for every group ``add_param_group``
adds, for every group of a state ``load_state_dict`` loads, and at ``step()`` for a group
whose values were written since its last check (``opt.param_groups[0]["lr"] = ...``, a
scheduler's write): a ValueError naming the optimizer, the group, the key and the value.
The step compares each group's values with those last checked by identity (a few hundred
nanoseconds a group), so an unchanged group costs nothing more.  A tensor hyper-parameter on
an accelerator is checked at step() for its shape and dtype only: reading its value would
wait for the device (and cannot be done inside a captured CUDA graph); its value is checked
where it is given.  Parameters must be floating-point or complex tensors (TypeError otherwise,
when they are added).

Complex parameters are updated as torch.optim updates them: a complex tensor, its gradient
and its state are viewed as real tensors of (real, imaginary) pairs (``torch.view_as_real``),
so that element-wise squares, square roots and maxima act on each component (``as_real``).
The state itself stays complex, as torch.optim's.

``load_state_dict`` refuses, at load and naming what differs, a state that would fail or
compute something else at the next step(): another number of groups or of parameters in a
group, a group lacking this optimizer's hyper-parameters (a state saved by another optimizer
type: both types named), invalid hyper-parameter values, or a state tensor whose shape is not
its parameter's (the parameter's index and both shapes named).  The state maps to the
parameters by position, as torch.optim's does: the j-th parameter of the i-th saved group
gives its state to the j-th parameter of the i-th group here, whatever their names, so a
model whose equally-shaped parameters come in another order silently exchanges their state.
"""

from __future__ import annotations

import operator
import warnings
from abc import abstractmethod
from collections.abc import Callable, Mapping

import torch
from torch import Tensor
from torch.optim import Optimizer

from kernels import cpp

from .checks import check_flag, check_impl_flags


def number(x: float | Tensor) -> float:
    """A hyper-parameter's value as a Python number (a tensor's read back: the non-capturable paths only)."""
    return x.item() if isinstance(x, Tensor) else x


def cpp_usable(*lists: list[Tensor]) -> bool:
    """Whether the C++ update (kernels/cpp/optimizers.cpp) may run on these lists (params, grads, state): the
    kernels on and built, not traced, every tensor a dense CPU float32 or float64 one of a single dtype."""
    if compiling() or not lists[0]:
        return False
    tensors = [t for ts in lists for t in ts]
    return all(t.is_contiguous() for t in tensors) and cpp.usable(*tensors)


def compiling() -> bool:
    """True while torch.compile traces the step.  The updates then take their capturable forms (step counters
    and bias corrections as tensors, computed by the graph; nothing read back to the host, which would break the
    graph) and skip the one-block path (kernels/optimizers.py), which reads memory addresses: the compiler fuses the
    per-tensor updates itself.  The numbers are the eager step's, rounded in another order."""
    return torch.compiler.is_compiling()


def as_real(tensors: list[Tensor]) -> list[Tensor]:
    """torch.optim's reading of complex tensors: each as the real tensor of its (real, imaginary) pairs, a view
    (``torch.view_as_real``, shape (..., 2)), so that squares and square roots act on each component: Adam's second
    moment of g = a + bi is (a^2, b^2), not the complex g^2.  Real tensors pass as they are."""
    return [torch.view_as_real(t) if t.is_complex() else t for t in tensors]


def step_dtype(param: Tensor, capturable: bool) -> torch.dtype:
    """The dtype of ``param``'s step counter.  torch.optim's: float64 under a float64 default dtype, else float32.
    A capturable counter is float64 for a float64 (or complex128) parameter under any default dtype too: its
    bias corrections 1 - beta^t are computed in the counter's dtype on the device, and in float32 they are
    1e-7 relative off (a float64 Adam step 7e-7 from torch.optim's), where the default path computes them in
    Python floats.  (torch.optim's capturable Adam keeps float32 there: it is the less precise.)"""
    if torch.get_default_dtype() == torch.float64 or (capturable and param.dtype in (torch.float64, torch.complex128)):
        return torch.float64
    return torch.float32


def scalar_step(param: Tensor, capturable: bool) -> Tensor:
    """A fresh ``step`` counter: a 0-d tensor of ``step_dtype``, on the CPU, or on ``param``'s device when
    ``capturable``."""
    return torch.zeros((), dtype=step_dtype(param, capturable), device=param.device if capturable else "cpu")


_UNSEEN = object()  # a key a group did not have when last checked
_GROUPS_HINT = (
    "pass model.parameters() or a list of tensors, named parameters as (name, tensor) pairs "
    "(model.named_parameters(), or a dict's .items()), or a list of parameter-group dicts "
    "{'params': [...], 'lr': ...}"
)


class HandOptimizer(Optimizer):
    """Base class: ``step`` gathers the parameters that have a gradient and calls ``_update``.

    As torch.optim: a parameter moves by whatever ``.grad`` holds, whatever its ``requires_grad`` (a frozen
    parameter with a gradient left by ``zero_grad(set_to_none=False)`` keeps moving by momentum and weight decay);
    a parameter whose ``.grad`` is None is skipped, and a step where none has one updates nothing (warned once).

    Parameters may be torch Tensors or autodiff engine Tensors (whose torch tensor ``.data``
    carries ``.grad``): the optimizer keeps and updates the torch tensor.  Each subclass names
    ``_hyper`` (the hyper-parameters its update reads, each with its check) and ``_flags`` (its
    True/False switches); see the module docstring for what is checked when.
    """

    _hyper: dict[str, Callable] = {}
    _flags: tuple[str, ...] = ()

    def __init__(self, params, defaults: dict):
        name = type(self).__name__
        if isinstance(params, Mapping):
            raise TypeError(
                f"{name}: params is a dict (keys {', '.join(map(repr, list(params)[:3]))}"
                f"{', ...' if len(params) > 3 else ''}), whose iteration gives its keys; {_GROUPS_HINT}"
            )
        if isinstance(params, (set, frozenset)):
            raise TypeError(
                f"{name}: params is a set, whose order changes from run to run (the state maps to the "
                f"parameters by position); pass a list"
            )
        self._warned_no_grad = False  # step() without any gradient: said once (a warning), then silently nothing
        self._has_complex = False  # any complex parameter: the updates then view tensors as real (as_real)
        self._checked: dict[int, tuple[dict, dict]] = {}  # group index -> (group, a copy when last checked)
        super().__init__(params, self._check_values(name, defaults))

    def _check_values(self, owner: str, values: dict, *, read: bool = True, keys: set | None = None) -> dict:
        """Check a group's (or the defaults') hyper-parameters, or only those named in ``keys``; returns the values
        with lr and betas as the constructor keeps them."""
        checked = {}
        for key, check in self._hyper.items():
            if keys is None or key in keys:
                if key not in values:
                    raise ValueError(f"{owner}: no {key!r}, which {type(self).__name__} needs")
                checked[key] = check(owner, key, values[key], read=read)
        for key in self._flags:
            if key in values and (keys is None or key in keys):
                check_flag(owner, key, values[key])
        if keys is None or not keys.isdisjoint(("foreach", "differentiable", "fused")):
            check_impl_flags(
                owner,
                values.get("foreach"),
                values.get("differentiable", False),
                values.get("fused"),
                optimizer=type(self).__name__,
            )
        return {**values, **checked}

    def _check_params(self, owner: str, params: list) -> list[Tensor | tuple[str, Tensor]]:
        """The group's parameters as torch tensors ((name, tensor) pairs kept as pairs, as torch.optim takes them),
        each floating-point or complex."""
        out: list[Tensor | tuple[str, Tensor]] = []
        for j, p in enumerate(params):
            named = isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str)
            t = p[1] if named else p
            if not isinstance(t, Tensor):
                t = getattr(t, "data", None)  # an engine Tensor: its torch tensor, where the gradient lives
                if not isinstance(t, Tensor):
                    raise TypeError(
                        f"{owner}: parameter {j} is a {type(p[1] if named else p).__name__}, not a tensor; "
                        f"{_GROUPS_HINT}"
                    )
            if not (t.is_floating_point() or t.is_complex()):
                raise TypeError(
                    f"{owner}: parameter {j} (shape {tuple(t.shape)}) has dtype {t.dtype}: an optimizer "
                    f"updates floating-point or complex tensors; convert it (.float()) or leave it out"
                )
            out.append((p[0], t) if named else t)
        return out

    def add_param_group(self, param_group: dict) -> None:
        """torch.optim's add_param_group, the group's parameters and values checked (module docstring)."""
        owner = f"{type(self).__name__}: param_groups[{len(self.param_groups)}]"
        if not isinstance(param_group, Mapping) or "params" not in param_group:
            keys = f" (its keys: {', '.join(map(repr, param_group))})" if isinstance(param_group, Mapping) else ""
            raise TypeError(
                f"{owner}: a parameter group must be a dict with a 'params' entry{keys}, "
                f"got {type(param_group).__name__}; {_GROUPS_HINT}"
            )
        params = param_group["params"]
        if isinstance(params, Mapping):
            raise TypeError(f"{owner}: 'params' is a dict, whose iteration gives its keys; {_GROUPS_HINT}")
        if isinstance(params, (set, frozenset)):
            raise TypeError(
                f"{owner}: 'params' is a set, whose order changes from run to run (the state maps to the "
                f"parameters by position); pass a list"
            )
        param_group["params"] = self._check_params(owner, [params] if isinstance(params, Tensor) else list(params))
        super().add_param_group(param_group)  # fills the defaults in
        try:
            self._check_values(owner, param_group)
        except ValueError:
            self.param_groups.pop()
            raise
        self._record_checked(len(self.param_groups) - 1, param_group)

    def _record_checked(self, i: int, group: dict, *, params_changed: bool = True) -> None:
        self._checked[i] = (group, dict(group))
        if params_changed:
            self._has_complex = self._has_complex or any(p.is_complex() for p in group["params"])

    def _unchanged(self, i: int, group: dict) -> bool:
        """``group`` holds the very objects it held when last checked (compared by identity: nothing is read)."""
        seen = self._checked.get(i)
        return (
            seen is not None
            and seen[0] is group
            and len(seen[1]) == len(group)
            and all(map(operator.is_, group.values(), seen[1].values()))
        )

    def _recheck(self, i: int, group: dict) -> None:
        """A group written since its last check: check again what changed (everything, for a group not seen
        before or one that lost a key), and fit its step counters to its capturable flag."""
        owner = f"{type(self).__name__}.step(): param_groups[{i}]"
        seen = self._checked.get(i)
        before = seen[1] if seen is not None and seen[0] is group and seen[1].keys() <= group.keys() else {}
        changed = {k for k, v in group.items() if before.get(k, _UNSEEN) is not v}  # a scheduler's write: {"lr"}
        if "params" in changed:
            self._check_params(owner, group["params"])
        self._check_values(owner, group, read=False, keys=changed)
        if changed & {"params", "capturable"}:
            self._fit_step_counters(group)
        self._record_checked(i, group, params_changed="params" in changed)

    def _fit_step_counters(self, group: dict) -> None:
        """A capturable group's counters in ``step_dtype`` (torch's load_state_dict makes them float32, and a
        group switched to capturable keeps the default path's)."""
        if not group.get("capturable", False):
            return
        for p in group["params"]:
            step = self.state[p].get("step") if p in self.state else None
            if isinstance(step, Tensor) and step.dtype != step_dtype(p, True):
                self.state[p]["step"] = step.to(step_dtype(p, True))

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)  # load_state_dict and unpickling come here
        self._checked = {}  # every group is checked again at the next step()
        self.__dict__.setdefault("_warned_no_grad", False)
        self._has_complex = any(p.is_complex() for g in self.param_groups for p in g["params"])

    def load_state_dict(self, state_dict: dict) -> None:
        """torch.optim's load_state_dict, refusing at load what the next step() would fail on or compute otherwise
        (module docstring).  The state maps to the parameters by position, as torch.optim's does."""
        self._check_state_fits(state_dict)
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            for key in self._flags:  # a state saved before a switch existed: off, as torch.optim's __setstate__ sets it
                group.setdefault(key, False)
            self._fit_step_counters(group)

    def _check_state_fits(self, state_dict: dict) -> None:
        name = type(self).__name__
        owner = f"{name}.load_state_dict"
        if not isinstance(state_dict, Mapping) or not {"state", "param_groups"} <= state_dict.keys():
            got = (
                f"keys {', '.join(map(repr, state_dict))}"
                if isinstance(state_dict, Mapping)
                else type(state_dict).__name__
            )
            raise ValueError(f"{owner}: not an optimizer state_dict (one has 'state' and 'param_groups'), got {got}")
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"{owner}: the state has {len(saved_groups)} parameter groups, this optimizer {len(self.param_groups)}"
            )
        index = 0  # the parameter's position over all groups
        for i, (group, saved) in enumerate(zip(self.param_groups, saved_groups, strict=True)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(
                    f"{owner}: param_groups[{i}] holds {len(saved['params'])} parameters in the state, "
                    f"{len(group['params'])} here"
                )
            missing = [k for k in self._hyper if k not in saved]
            if missing:
                raise ValueError(self._foreign_state(owner, i, saved, missing))
            self._check_values(f"{owner}: the state's param_groups[{i}]", saved)
            for j, (p, pid) in enumerate(zip(group["params"], saved["params"], strict=True)):
                for key, value in state_dict["state"].get(pid, {}).items():
                    if isinstance(value, Tensor) and key != "step" and value.shape != p.shape:
                        raise ValueError(
                            f"{owner}: parameter {index} (param_groups[{i}]['params'][{j}]) has shape "
                            f"{tuple(p.shape)} but its saved {key!r} has shape {tuple(value.shape)}; "
                            f"the state maps to the parameters by position: were they created in "
                            f"another order?"
                        )
                index += 1

    def _foreign_state(self, owner: str, i: int, saved: dict, missing: list[str]) -> str:
        name = type(self).__name__
        likely = [cls.__name__ for cls in _hand_optimizers() if cls._hyper and cls._hyper.keys() <= saved.keys()]
        origin = f"by {' or '.join(likely)}" if likely else "by another optimizer type"
        found = ", ".join(k for k in saved if k not in ("params", "param_names"))
        return (
            f"{owner}: this state was saved {origin}, not by {name}: its param_groups[{i}] has no "
            f"{', '.join(map(repr, missing))} (it has {found}); load a state saved by {name} (handgrad's or "
            f"torch.optim's)"
        )

    def zero_grad(self, set_to_none: bool = True) -> None:
        """torch.optim's zero_grad; while torch.compile traces the step, the same written out (torch's own is
        marked not to be traced, which would break the compiled step's graph)."""
        if not compiling():
            return super().zero_grad(set_to_none)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad.requires_grad_(False)
                        p.grad.zero_()

    @torch.no_grad()
    def step(self, closure=None):
        """One update.  ``closure`` (optional) re-evaluates the model and returns the loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for i, group in enumerate(self.param_groups):  # every group before any update: a refused step changes nothing
            if compiling():  # values are constants of the trace (the compiler guards on them): checked while tracing
                self._check_values(f"{type(self).__name__}.step(): param_groups[{i}]", group, read=False)
            elif not self._unchanged(i, group):
                self._recheck(i, group)
        stepped = False
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            stepped = True
            grads = [p.grad for p in params]
            for p, g in zip(params, grads, strict=True):
                if g.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                if g.shape != p.shape:
                    raise RuntimeError(
                        f"{type(self).__name__}: a gradient has shape {tuple(g.shape)} but its "
                        f"parameter has shape {tuple(p.shape)}"
                    )
            if group["maximize"]:
                grads = torch._foreach_neg(grads)
            if compiling():  # the capturable forms: nothing read back (see compiling)
                group = {**group, "capturable": True}
            self._update(group, params, grads)
        if not stepped and not compiling() and not self._warned_no_grad:
            self._warned_no_grad = True  # once: a frozen backbone's optimizer steps like this every step
            warnings.warn(
                f"{type(self).__name__}.step(): no parameter has a gradient (every .grad is None), so "
                f"nothing was updated, as torch.optim does (all frozen, or no backward yet); said once",
                stacklevel=2,
            )
        return loss

    @abstractmethod
    def _update(self, group: dict, params: list[Tensor], grads: list[Tensor]) -> None:
        """Apply the update to ``params`` in place; ``grads`` are already negated if maximize.

        Must not modify ``grads`` in place (they may be the parameters' own .grad tensors).  With
        ``self._has_complex``, complex tensors are updated through ``as_real`` views.
        """


def _hand_optimizers() -> list[type[HandOptimizer]]:
    """Every HandOptimizer subclass defined so far (SGD, Adam, AdamW, ...), subclasses of subclasses included, in
    the order they were defined: found by walking ``__subclasses__`` rather than importing them."""
    found, stack = [], list(HandOptimizer.__subclasses__())
    while stack:
        cls = stack.pop(0)
        found.append(cls)
        stack.extend(cls.__subclasses__())
    return found

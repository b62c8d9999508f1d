"""The stacked recurrence RNN, LSTM and GRU share: parameters, layers, directions, dropout between layers, the
initial states, the layouts, the checks -- and the backward through all of them, and its split in two.

Shape legend: T = time steps, N = batch, I = input_size, H = hidden_size, P = proj_size (LSTM only),
H_out = P if P > 0 else H (the size of h), L = num_layers, D = directions (2 if bidirectional else 1),
G = gates (RNN 1; LSTM 4, stacked i, f, g, o; GRU 3, stacked r, z, n).

    input   (T, N, I), or (N, T, I) with batch_first=True, or unbatched (T, I)
    hx      h_0 (L*D, N, H_out) -- batch second whatever batch_first says, as torch -- unbatched (L*D, H_out);
            the LSTM's is the pair (h_0, c_0), c_0 (L*D, N, H).  Omitted: zeros.
    output  (T, N, D*H_out) (batch_first (N, T, D*H_out), unbatched (T, D*H_out)): the last layer's h_t at
            every step, the two directions side by side (forward first)
    h_n     (L*D, N, H_out), row k*D + d the last state of layer k, direction d -- for the reverse direction,
            that of t = 0, the last step it runs; the LSTM returns (h_n, c_n)

Layer k's input is layer k-1's output (both directions); in training mode with ``dropout`` > 0 that output
goes through dropout first (not after the last layer), as torch does.  The per-direction work -- the
recurrence and its backward through time -- is ``cells.py``'s loop (or the kernels'); each kind (``rnn.py``) says which
of its functions
to run.  Written in the layer template (layers/template.py): the forward returns its outputs and a ``Saved``, the
backward the inputs' gradients and every parameter's, and the base checks, keeps, versions and accumulates.

The backward split in two (a pipeline's B and W): the whole backward through time is B -- every step's
pre-activation gradient dA feeds the step before it and dx = dA @ W_ih -- and B keeps dA; W computes from it, one
product each over all T*N rows, dW_ih = dA^T @ x, dW_hh = dA^T @ h_prev (the LSTM's dW_hr = dh^T @ r) and the
biases' column sums, and adds them layer by layer from the top, each layer's directions forward first: the
order the fused backward adds them in.  dA is the work the two passes share; nothing of W's is computed in B.

Parameters have torch.nn's names, layouts and registration order (``weight_ih_l{k}``, ``weight_hh_l{k}``,
``bias_ih_l{k}``, ``bias_hh_l{k}``, the LSTM's ``weight_hr_l{k}``, ``_reverse`` for the second direction), and
torch's initialisation in the same RNG order: under one ``torch.manual_seed`` a layer and its nn twin get
identical weights.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections import namedtuple
from typing import Any, cast

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence

from kernels.recurrent.bptt import DirParams

from ..checks import (
    BEFORE_FORWARD,
    Expects,
    check_bool,
    check_grads_like,
    check_int,
    check_like,
    check_probability,
    check_tensor,
)
from ..dropout import inter_layer_mask
from ..init import torch_recurrent_init_
from ..layer import BaseLayer, learned

# a DirParams field -> the parameter's name in torch's scheme, before its _l{k}[_reverse] suffix
PARAM_OF = {"w_ih": "weight_ih", "w_hh": "weight_hh", "b_ih": "bias_ih", "b_hh": "bias_hh", "w_hr": "weight_hr"}


def saved_type(weights: tuple[str, ...]) -> type:
    """A recurrent layer's ``Saved``, one per set of weight names: what its backward reads, by name --

        x          (T*N, I) the input as layer 0 keeps it for dW_ih (a view of x, or its own copy where x was not
                   contiguous)
        <weights>  every weight matrix under torch's name (weight_ih_l0, ..., weight_hr_l1_reverse), for dx and dh
        dirs       [layer][direction] -> what each direction's backward reads (cells.Steps, or a kernel's cache)
        masks      [layer] -> the dropout mask (T, N, D*H_out) on its output, or None
        batched, had_hx, T, N, shapes (the output's, then each state's: what the gradients must match), dtype, device

    The base version-checks each tensor field by its name: x and the weights, changed in place before backward,
    are refused (layers/saved.py).  The initial states are copied into the layer's own buffers, so changing hx
    afterwards changes nothing; the biases are not read.

    Made once per set of names, when a layer is built (a type made while torch.compile traces would be a new type
    at every trace)."""
    saved = _SAVED_TYPES.get(weights)
    if saved is None:
        saved = _SAVED_TYPES[weights] = namedtuple(
            "Saved", ("x", *weights, "dirs", "masks", "batched", "had_hx", "T", "N", "shapes", "dtype", "device")
        )
    return saved


_SAVED_TYPES: dict[tuple[str, ...], type] = {}


class _Recurrent(BaseLayer, ABC):
    """What RNN, LSTM and GRU share; a subclass sets the kind (``_gates``, ``_states``) and the core functions."""

    _gates: int = 1  # G
    _states: tuple[str, ...] = ("h_0",)  # the initial states: ("h_0", "c_0") for the LSTM
    _ctor_args: tuple[str, ...] = (
        "input_size",
        "hidden_size",
        "num_layers",
        "bias",
        "batch_first",
        "dropout",
        "bidirectional",
    )
    # The forward writes into preallocated buffers with out=, which autograd cannot record (and runs under no_grad:
    # no graph is built).  gradcheck's autograd oracle for these layers is autograd through the torch.nn twin's
    # own kernels on the same weights (checking.cases.rnn._TorchOracle), as the tests compare.
    autograd_opaque = True
    as_module_refuses = "takes an initial state and returns its new state beside its output"
    expects = Expects(
        dims=(2, 3),
        size=(-1, "input_size"),
        like=("weight_ih_l0",),
        shape="{_layout} or unbatched (T, I) with I = input_size = {input_size}",
    )

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        name = type(self).__name__
        self.input_size = check_int(name, "input_size", input_size)
        self.hidden_size = check_int(name, "hidden_size", hidden_size)
        self.num_layers = check_int(name, "num_layers", num_layers)
        for flag, value in (("bias", bias), ("batch_first", batch_first), ("bidirectional", bidirectional)):
            check_bool(name, flag, value)
        self.dropout = check_probability(
            name, "dropout (the probability of zeroing an element of a layer's output)", dropout
        )
        self.proj_size = check_int(name, "proj_size", proj_size, lo=0)
        if proj_size >= hidden_size:
            raise ValueError(
                f"{name}: proj_size must be smaller than hidden_size, got proj_size={proj_size} and "
                f"hidden_size={hidden_size}"
            )
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"{name}: dtype must be floating point, got {dtype}")
        if dropout > 0 and num_layers == 1:
            warnings.warn(
                f"{name}: dropout acts between recurrent layers, so dropout={dropout} does nothing with num_layers=1",
                stacklevel=2,
            )
        self.bias, self.batch_first, self.bidirectional = bias, batch_first, bidirectional
        self.h_out = proj_size or hidden_size  # H_out
        self.num_directions = 2 if bidirectional else 1  # D
        names: list[str] = []
        shapes: list[tuple[int, ...]] = []
        gh = self._gates * hidden_size  # G*H
        for k in range(num_layers):
            layer_in = input_size if k == 0 else self.h_out * self.num_directions
            for sfx in ("", "_reverse")[: self.num_directions]:
                entries: list[tuple[str, tuple[int, ...]]] = [
                    (f"weight_ih_l{k}{sfx}", (gh, layer_in)),
                    (f"weight_hh_l{k}{sfx}", (gh, self.h_out)),
                ]
                if bias:
                    entries += [(f"bias_ih_l{k}{sfx}", (gh,)), (f"bias_hh_l{k}{sfx}", (gh,))]
                if proj_size:
                    entries += [(f"weight_hr_l{k}{sfx}", (proj_size, hidden_size))]
                for n, s in entries:
                    names.append(n)
                    shapes.append(s)
        self._param_names = tuple(names)  # torch's _flat_weights_names, in its order
        self._weight_names = tuple(n for n in names if n.startswith("weight"))  # each a field of saved_type's
        saved_type(self._weight_names)
        for n, s in zip(names, shapes, strict=True):
            setattr(self, n, torch.empty(s, device=device, dtype=dtype))
        torch_recurrent_init_([getattr(self, n) for n in names], hidden_size)
        learned(*(getattr(self, n) for n in names))
        # Dropout between layers draws from ``generator`` (None: torch's default); the trainer points it, and the
        # twin's, at one generator (training.impls.models.use_generator finds them by ``generator`` and ``p``).
        self.generator: torch.Generator | None = None
        self.global_rows: tuple[int, int, int] | None = None

    def __call__(self, x: Tensor, hx: Tensor | tuple[Tensor, Tensor] | None = None):
        return self.forward(x, hx)

    @property
    def p(self) -> float:
        """The dropout probability between layers (``dropout``), under the name the dropout layers use."""
        return self.dropout

    @classmethod
    def _ctor_kwargs(cls, obj: object) -> dict:
        return {name: getattr(obj, name) for name in cls._ctor_args}  # bias is a bool here, as in nn.LSTM

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size:
            s += f", proj_size={self.proj_size}"
        nonlinearity = getattr(self, "nonlinearity", "tanh")  # (RNN's alone)
        if nonlinearity != "tanh":
            s += f", nonlinearity={nonlinearity!r}"
        for name, default in (
            ("num_layers", 1),
            ("bias", True),
            ("batch_first", False),
            ("dropout", 0.0),
            ("bidirectional", False),
        ):
            if getattr(self, name) != default:
                s += f", {name}={getattr(self, name)}"
        return s

    def _params(self, k: int, d: int) -> DirParams:
        def get(n: str) -> Any:  # the weights always there; a bias or weight_hr may not be
            return getattr(self, n + _suffix(k, d), None)

        return DirParams(get("weight_ih"), get("weight_hh"), get("bias_ih"), get("bias_hh"), get("weight_hr"))

    # -- the kind: one direction of one layer, forward and backward (cells.py's recurrence) --------------------

    @abstractmethod
    def _forward_dir(self, x: Tensor, p: DirParams, state0: list, *, reverse: bool) -> tuple[Tensor, list, object]:
        """x (T, N, in) -> (y (T, N, H_out), final states [h_n (, c_n)], cache)."""

    @abstractmethod
    def _backward_dir(
        self, dy: Tensor, dfinal: list, cache: object, *, need_d0: bool, need_dx: bool, dx: Tensor | None
    ) -> tuple[Tensor | None, list, dict]:
        """-> (dx (T*N, in) or None, [dh_0 (, dc_0)] or Nones, the parameter gradients by DirParams field)."""

    # -- forward ------------------------------------------------------------------------------------------

    def forward_math(self, x: Tensor, hx: Tensor | tuple[Tensor, Tensor] | None = None):
        """x (T, N, I) / (N, T, I) / (T, I), hx as in the module docstring -> (output, h_n) (LSTM: (output,
        (h_n, c_n)))."""
        batched = x.dim() == 3
        xt = x.transpose(0, 1) if batched and self.batch_first else x if batched else x.unsqueeze(1)  # (T, N, I)
        T, N = xt.shape[:2]
        if T == 0:
            raise ValueError(f"{self!r}: the input has no time steps (shape {tuple(x.shape)})")
        state0 = self._initial_states(hx, N, batched=batched)  # [(L*D, N, .) or None] per state
        L, D = self.num_layers, self.num_directions
        finals: list[list[Tensor]] = [[] for _ in self._states]
        dirs: list[list[Any]] = []  # [layer][direction]: cells.Steps, or a kernel's cache
        masks = []
        inp = xt
        for k in range(L):
            ys, layer_dirs = [], []
            for d in range(D):
                j = k * D + d
                y, fin, cache = self._forward_dir(
                    inp, self._params(k, d), [None if s is None else s[j] for s in state0], reverse=d == 1
                )
                ys.append(y)
                layer_dirs.append(cache)
                for lst, f in zip(finals, fin, strict=True):
                    lst.append(f)
            dirs.append(layer_dirs)
            out = ys[0] if D == 1 else torch.cat(ys, 2)  # (T, N, D*H_out)
            mask = None
            if k < L - 1 and self.training and self.dropout > 0:
                mask = inter_layer_mask(
                    out, self.dropout, generator=self.generator, global_rows=self.global_rows
                )  # (T, N, D*H_out)
                out = (out * mask).contiguous()  # layer k+1's input
            masks.append(mask)
            inp = out
        # The last layer's output: with D = 1 a view of its cache, handed out as a copy of its own.
        output = inp.transpose(0, 1) if self.batch_first and batched else inp if batched else inp[:, 0]
        output = output.clone(memory_format=torch.contiguous_format) if D == 1 else output.contiguous()
        h_n = [torch.stack(lst) for lst in finals]  # (L*D, N, H_out), (L*D, N, H)
        if not batched:
            h_n = [h[:, 0] for h in h_n]  # (L*D, H_out)
        saved = saved_type(self._weight_names)(
            dirs[0][0].x2,
            *(getattr(self, n) for n in self._weight_names),
            dirs,
            masks,
            batched,
            hx is not None,
            T,
            N,
            (output.shape, *(h.shape for h in h_n)),
            output.dtype,
            output.device,
        )
        return (output, (h_n[0] if len(h_n) == 1 else tuple(h_n))), saved

    def check_input(self, x: object, hx: object = None) -> None:
        if isinstance(x, PackedSequence):
            raise TypeError(
                f"{self!r}: PackedSequence input is not supported; pad the batch "
                f"(torch.nn.utils.rnn.pad_packed_sequence) and pass the padded tensor"
            )
        super().check_input(x)  # what ``expects`` declares; hx is checked by the forward (_initial_states)

    @property
    def _layout(self) -> str:
        return "(N, T, I)" if self.batch_first else "(T, N, I)"

    def _initial_states(self, hx: object, N: int, *, batched: bool) -> list[Tensor | None]:
        """hx -> [h_0 (, c_0)] as (L*D, N, .), checked against the input's batch; Nones for no hx."""
        if hx is None:
            return [None] * len(self._states)
        w: Tensor = getattr(self, "weight_ih_l0")  # noqa: B009 (made by setattr in __init__, as its siblings)
        if len(self._states) == 1:
            parts = [hx]
        elif isinstance(hx, (tuple, list)) and len(hx) == 2:
            parts = list(hx)
        else:
            raise TypeError(f"{self!r}: hx must be the pair (h_0, c_0) of tensors, got {type(hx).__name__}")
        sizes = [self.h_out, self.hidden_size][: len(parts)]  # h's, then LSTM's c
        out: list[Tensor | None] = []
        for name, part, size in zip(self._states, parts, sizes, strict=True):
            part = check_tensor(repr(self), name, part)
            want = (
                (self.num_layers * self.num_directions, N, size)
                if batched
                else (self.num_layers * self.num_directions, size)
            )
            if part.shape != want:
                which = "(num_layers * num_directions, batch, " if batched else "(num_layers * num_directions, "
                raise ValueError(
                    f"{self!r}: {name} has shape {tuple(part.shape)}, expected {want} = {which}"
                    f"{'hidden_size' if size == self.hidden_size else 'proj_size'}) for an input of "
                    f"{'batch ' + str(N) if batched else 'unbatched input'}"
                    f"{' (the states are batch second also with batch_first=True)' if batched else ''}"
                )
            check_like(repr(self), name, part, w, "weight_ih_l0")
            out.append(part if batched else part.unsqueeze(1))
        return out

    # -- backward -----------------------------------------------------------------------------------------

    def backward_math(self, doutput: Tensor | None, saved, dstate: Tensor | tuple | None = None):
        """doutput, dstate (any of them None: zeros) -> (dx, or (dx, dhx) when the forward had hx; every
        parameter's gradient).

        Layer by layer from the top, each direction through time (cells.py); a layer's input gradient goes through
        the dropout mask below it.  ``needs_input_grad`` False skips dx (the first layer's dA @ W_ih)."""
        need_dx = self.needs_input_grad
        L, D, Ho = self.num_layers, self.num_directions, self.h_out
        T, N, batched = saved.T, saved.N, saved.batched
        if doutput is None:
            d = torch.zeros(T, N, D * Ho, dtype=saved.dtype, device=saved.device)
        else:  # (T, N, D*H_out), a view
            d = (
                doutput.transpose(0, 1)
                if self.batch_first and batched
                else doutput
                if batched
                else doutput.unsqueeze(1)
            )
        dstates = [g if g is None or batched else g.unsqueeze(1) for g in self._state_grads(dstate)]  # (L*D, N, .)
        d0: list[list] = [[None] * (L * D) for _ in self._states]
        grads: dict[str, Tensor] = {}
        for k in reversed(range(L)):
            dx = None
            for dd in range(D):
                j = k * D + dd
                dy = d if D == 1 else d[:, :, dd * Ho : (dd + 1) * Ho]  # (T, N, H_out)
                dx, g0, dir_grads = self._backward_dir(
                    dy,
                    [None if g is None else g[j] for g in dstates],
                    saved.dirs[k][dd],
                    need_d0=saved.had_hx,
                    need_dx=k > 0 or need_dx,
                    dx=dx,
                )
                for lst, g in zip(d0, g0, strict=True):
                    lst[j] = g
                grads |= {PARAM_OF[f] + _suffix(k, dd): g for f, g in dir_grads.items()}
            d = None if dx is None else dx.view(T, N, -1)  # type: ignore[assignment]  # (T, N, in) layer k's input's
            if k > 0 and saved.masks[k - 1] is not None:
                d.mul_(saved.masks[k - 1])  # through the dropout between layers k-1 and k
        if d is not None:
            d = d.transpose(0, 1).contiguous() if self.batch_first and batched else d if batched else d[:, 0]
        if not saved.had_hx:
            return d, grads
        dhx = [torch.stack(lst) if batched else torch.stack(lst)[:, 0] for lst in d0]
        return (d, (dhx[0] if len(dhx) == 1 else tuple(dhx))), grads

    def check_dout(self, grads: tuple, meta, saved) -> None:
        """(doutput, dstate): each gradient None (zeros) or shaped as the forward's output it belongs to."""
        if meta is None:
            raise RuntimeError(f"{self!r}: {BEFORE_FORWARD}")
        if len(grads) > 2:
            raise TypeError(
                f"{self!r}: backward takes the gradients of the output and of the state, got {len(grads)} arguments"
            )
        doutput, dstate = (*grads, None)[:2]
        check_grads_like(
            self,
            ("doutput", "dh_n", "dc_n"),
            (doutput, *self._state_grads(dstate)),
            saved.shapes,
            saved.dtype,
            saved.device,
        )

    def _state_grads(self, dstate: object) -> list[Tensor | None]:
        if len(self._states) == 1:
            return [cast("Tensor | None", dstate)]  # (checked where it is used)
        if dstate is None:
            return [None, None]
        if isinstance(dstate, (tuple, list)) and len(dstate) == 2:
            return list(dstate)
        raise TypeError(
            f"{self!r}: the state's gradient must be the pair (dh_n, dc_n) (either may be None) or "
            f"None, got {type(dstate).__name__}"
        )


def _suffix(k: int, d: int) -> str:
    """The name suffix of layer k, direction d's parameters, torch's: _l0, _l0_reverse, _l1, ..."""
    return f"_l{k}" + ("_reverse" if d else "")

"""The checks of exercise gru_cell: GRUCell(3, 4) on x (2, 3) and h (2, 4), and its known mistakes.

Every mistake is one switch of ``_grads``, the backward written out once; input_size 3 differs from hidden_size 4,
so a gradient taken through the wrong weight has the wrong shape.
"""

import torch

from ...mistakes import Mistake
from ..families import reduce_of
from ..spec import LayerSpec, normal, uniform

I, H = 3, 4


def _reference(t):
    gi, gh = t.x @ t.weight_ih.T + t.bias_ih, t.h @ t.weight_hh.T + t.bias_hh
    i_r, i_z, i_n = gi.chunk(3, 1)
    h_r, h_z, h_n = gh.chunk(3, 1)
    r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    return {"h_next": (1 - z) * n + z * t.h}


def _context(c):
    gi, gh = c.x @ c.weight_ih.T + c.bias_ih, c.h @ c.weight_hh.T + c.bias_hh
    i_r, i_z, i_n = gi.chunk(3, 1)
    h_r, h_z, h_n = gh.chunk(3, 1)
    r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
    return {"r": r, "z": z, "n": torch.tanh(i_n + r * h_n), "h_n": h_n}


def _grads(
    c, z_swapped=False, hn_without_r=False, direct_dropped=False, order="rzn", dz_sign=1, sigmoid_one_minus=True
):
    """The backward under the given mistakes (none by default), from the named tensors (families.py replays
    it too)."""
    r, z, n, h_n, dh_next = c.r, c.z, c.n, c.h_n, c.dh_next
    keep, new = (z, 1 - z) if z_swapped else (1 - z, z)  # h' = keep * n + new * h
    dn = dh_next * keep
    dz = dh_next * (n - c.h if z_swapped else c.h - n) * dz_sign
    da_n = dn * (1 - n**2)
    dr, dh_n = da_n * h_n, da_n * (1 if hn_without_r else r)

    def ds(s):
        return s * (1 - s) if sigmoid_one_minus else s

    parts_i = {"r": dr * ds(r), "z": dz * ds(z), "n": da_n}
    parts_h = {"r": dr * ds(r), "z": dz * ds(z), "n": dh_n}
    dgi = torch.cat([parts_i[k] for k in order], 1)
    dgh = torch.cat([parts_h[k] for k in order], 1)
    rd = reduce_of(c)
    return {
        "dx": dgi @ c.weight_ih,
        "dh": (0 if direct_dropped else dh_next * new) + dgh @ c.weight_hh,
        "weight_ih.grad": dgi.T @ c.x,
        "weight_hh.grad": dgh.T @ c.h,
        "bias_ih.grad": rd.sum(dgi, 0, label="dgi"),
        "bias_hh.grad": rd.sum(dgh, 0, label="dgh"),
    }


def _inputs(g, n=2, i=I, h=H):
    return {"x": normal(g, n, i), "h": normal(g, n, h, std=0.7)}


def _shaped(label, n, i, h, std=1.0, numeric=True):
    return {
        "label": label,
        "ctor": {"input_size": i, "hidden_size": h},
        "params": {
            "weight_ih": lambda g: uniform(g, 3 * h, i),
            "weight_hh": lambda g: uniform(g, 3 * h, h),
            "bias_ih": lambda g: normal(g, 3 * h, std=0.5, mean=0.2),
            "bias_hh": lambda g: normal(g, 3 * h, std=0.5, mean=-0.1),
        },
        "inputs": lambda g: {"x": normal(g, n, i, std=std), "h": normal(g, n, h, std=0.7)},
        "numeric": numeric,
    }


def _random(g):
    n, i, h = (int(v) for v in torch.randint(1, 6, (3,), generator=g))
    return _shaped(f"N = {n}, input_size {i}, hidden_size {h}", n, i, h)


SAVED = {
    "x": "the input",
    "h": "the previous hidden state",
    "h_next": "the new hidden state",
    "r": "the reset gate",
    "z": "the update gate",
    "n": "the candidate",
    "h_n": "W_hn h + b_hn",
}
SPEC = LayerSpec(
    name="gru_cell",
    cls="GRUCell",
    ctor={"input_size": I, "hidden_size": H},
    params={
        "weight_ih": lambda g: uniform(g, 3 * H, I),
        "weight_hh": lambda g: uniform(g, 3 * H, H),
        "bias_ih": lambda g: normal(g, 3 * H, std=0.5, mean=0.2),
        "bias_hh": lambda g: normal(g, 3 * H, std=0.5, mean=-0.1),
    },
    inputs=_inputs,
    reference=_reference,
    returns=("dx", "dh"),
    context=_context,
    formula=_grads,
    saved=SAVED,
    configs=[
        _shaped("one example (N = 1)", 1, I, H),
        _shaped("input wider than hidden: N = 3, I = 5, H = 2", 3, 5, 2),
        _shaped("large inputs (x with std 300: saturated gates)", 2, I, H, std=300.0, numeric=False),
    ],
    random=_random,
    shared=[
        (
            ("dx", "dh", "weight_ih.grad", "weight_hh.grad", "bias_ih.grad", "bias_hh.grad"),
            "the gates' gradients stacked r, z, n (dgi and dgh): between dh_next and them",
        )
    ],
    forward=lambda obj, t: obj.forward(t["x"], t["h"]),
    backward=lambda obj, d: obj.backward(d["dh_next"]),
    nan_hint="a sigmoid or tanh written from exp overflowed (exp(x) is inf past 709): use torch.sigmoid, torch.tanh",
    mistakes=[
        Mistake(
            "gru-update-gate-swapped",
            "h_next = z n + (1 - z) h's gradients (the paper's convention)",
            "PyTorch's GRU keeps z of the old state: h_next = (1 - z) n + z h, so dn = dh_next (1 - z), dz = "
            "dh_next (h - n), and h's direct share is dh_next z",
            lambda c: _grads(c, z_swapped=True),
        ),
        Mistake(
            "gru-hn-without-r",
            "the gradient of W_hn h + b_hn without the reset gate r",
            "in PyTorch's GRU r multiplies W_hn h + b_hn inside the tanh: its gradient is da_n * r (and that "
            "of W_in x + b_in is da_n alone), so bias_hh's and weight_hh's n rows differ from bias_ih's",
            lambda c: _grads(c, hn_without_r=True),
        ),
        Mistake(
            "gru-direct-dropped",
            "dh without its direct share dh_next * z",
            "h_next = (1 - z) n + z h uses h directly: dh = dh_next * z + dgh @ weight_hh",
            lambda c: _grads(c, direct_dropped=True),
        ),
        Mistake(
            "gru-gates-zrn",
            "the gates' gradients stacked z, r, n",
            "PyTorch stacks the GRU's gates r, z, n, and the forward cut gi and gh in that order: the gradient "
            "rows come back in the same order",
            lambda c: _grads(c, order="zrn"),
        ),
        Mistake(
            "gru-dz-sign",
            "dz = dh_next * (n - h), the sign flipped",
            "h_next = (1 - z) n + z h = n + z (h - n): dz = dh_next * (h - n)",
            lambda c: _grads(c, dz_sign=-1),
        ),
        Mistake(
            "gru-sigmoid-no-one-minus",
            "the gates' gradients with sigmoid' = s instead of s * (1 - s)",
            "the derivative of a sigmoid gate s is s * (1 - s): the (1 - s) is missing",
            lambda c: _grads(c, sigmoid_one_minus=False),
        ),
    ],
    where={
        "dx": "dgi (N, 3H), stacked r, z, n, then dx = dgi @ weight_ih",
        "dh": "dh = dh_next * z + dgh @ weight_hh",
        "weight_ih.grad": "dgi.T @ x",
        "weight_hh.grad": "dgh.T @ h",
        "bias_ih.grad": "dgi.sum(0)",
        "bias_hh.grad": "dgh.sum(0): its n part is da_n * r",
    },
)

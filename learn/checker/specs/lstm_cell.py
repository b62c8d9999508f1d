"""The checks of exercise lstm_cell: LSTMCell(3, 4) on x (2, 3) and a state (2, 4), and its known mistakes.

Every mistake is one switch of ``_grads``, the backward written out once; input_size 3 differs from
hidden_size 4, so a gradient taken through the wrong weight has the wrong shape.
"""

import torch

from ...mistakes import Mistake
from ..families import reduce_of
from ..spec import LayerSpec, normal, uniform

I, H = 3, 4


def _reference(t):
    a = t.x @ t.weight_ih.T + t.bias_ih + t.h @ t.weight_hh.T + t.bias_hh
    ai, af, ag, ao = a.chunk(4, 1)
    c_next = torch.sigmoid(af) * t.c + torch.sigmoid(ai) * torch.tanh(ag)
    return {"h_next": torch.sigmoid(ao) * torch.tanh(c_next), "c_next": c_next}


def _grads(
    c,
    order="ifgo",
    forget=True,
    dh_into_c=True,
    tanh_of_c=False,
    sigmoid_one_minus=True,
    dh_weight="weight_hh",
    dc_next_in=True,
    tanh_twice=False,
):
    a = c.x @ c.weight_ih.T + c.bias_ih + c.h @ c.weight_hh.T + c.bias_hh
    ai, af, ag, ao = a.chunk(4, 1)
    i, f, g, o = torch.sigmoid(ai), torch.sigmoid(af), torch.tanh(ag), torch.sigmoid(ao)
    tc = torch.tanh(c.c_next)
    do = c.dh_next * tc
    dtanh = 1 - (c.c_next if tanh_of_c else torch.tanh(tc) if tanh_twice else tc) ** 2
    dc_total = (c.dc_next if dc_next_in else 0) + (c.dh_next * o * dtanh if dh_into_c else 0)
    di, df, dg = dc_total * g, dc_total * c.c, dc_total * i
    dc = dc_total * f if forget else dc_total

    def ds(s):
        return s * (1 - s) if sigmoid_one_minus else s

    gates = {"i": di * ds(i), "f": df * ds(f), "g": dg * (1 - g**2), "o": do * ds(o)}
    da = torch.cat([gates[k] for k in order], 1)
    return {
        "dx": da @ c.weight_ih,
        "dh": da @ getattr(c, dh_weight),
        "dc": dc,
        "weight_ih.grad": da.T @ c.x,
        "weight_hh.grad": da.T @ c.h,
        "bias_ih.grad": da.sum(0),
        "bias_hh.grad": da.sum(0),
    }


def _context(c):
    a = c.x @ c.weight_ih.T + c.bias_ih + c.h @ c.weight_hh.T + c.bias_hh
    ai, af, ag, ao = a.chunk(4, 1)
    return {
        "i": torch.sigmoid(ai),
        "f": torch.sigmoid(af),
        "g": torch.tanh(ag),
        "o": torch.sigmoid(ao),
        "tc": torch.tanh(c.c_next),
    }


def _formula(c):
    """The right backward from the named tensors (families.py replays it)."""
    r = reduce_of(c)
    do = c.dh_next * c.tc
    dc_total = c.dc_next + c.dh_next * c.o * (1 - c.tc**2)
    di, df, dg = dc_total * c.g, dc_total * c.c, dc_total * c.i
    da = torch.cat([di * c.i * (1 - c.i), df * c.f * (1 - c.f), dg * (1 - c.g**2), do * c.o * (1 - c.o)], 1)
    return {
        "dx": da @ c.weight_ih,
        "dh": da @ c.weight_hh,
        "dc": dc_total * c.f,
        "weight_ih.grad": da.T @ c.x,
        "weight_hh.grad": da.T @ c.h,
        "bias_ih.grad": r.sum(da, 0, label="da"),
        "bias_hh.grad": r.sum(da, 0, label="da"),
    }


SAVED = {
    "x": "the input",
    "h": "the previous hidden state",
    "c": "the previous cell state",
    "c_next": "the new cell state",
    "h_next": "the new hidden state",
    "i": "the input gate",
    "f": "the forget gate",
    "g": "the candidate, tanh",
    "o": "the output gate",
    "tc": "tanh(c_next)",
}


def _inputs(g, n=2, i=I, h=H):
    return {"x": normal(g, n, i), "h": normal(g, n, h, std=0.5), "c": normal(g, n, h)}


def _shaped(label, n, i, h, std=1.0):
    return {
        "label": label,
        "ctor": {"input_size": i, "hidden_size": h},
        "numeric": std == 1.0,
        "params": {
            "weight_ih": lambda g: uniform(g, 4 * h, i),
            "weight_hh": lambda g: uniform(g, 4 * h, h),
            "bias_ih": lambda g: normal(g, 4 * h, std=0.5, mean=0.2),
            "bias_hh": lambda g: normal(g, 4 * h, std=0.5, mean=-0.1),
        },
        "inputs": lambda g: {"x": normal(g, n, i, std=std), "h": normal(g, n, h, std=0.5), "c": normal(g, n, h)},
    }


def _random(g):
    n, i, h = (int(v) for v in torch.randint(1, 6, (3,), generator=g))
    return _shaped(f"N = {n}, input_size {i}, hidden_size {h}", n, i, h)


SPEC = LayerSpec(
    name="lstm_cell",
    cls="LSTMCell",
    ctor={"input_size": I, "hidden_size": H},
    params={
        "weight_ih": lambda g: uniform(g, 4 * H, I),
        "weight_hh": lambda g: uniform(g, 4 * H, H),
        "bias_ih": lambda g: normal(g, 4 * H, std=0.5, mean=0.2),
        "bias_hh": lambda g: normal(g, 4 * H, std=0.5, mean=-0.1),
    },
    inputs=_inputs,
    reference=_reference,
    returns=("dx", "dh", "dc"),
    context=_context,
    formula=_formula,
    saved=SAVED,
    configs=[
        _shaped("one example (N = 1)", 1, I, H),
        _shaped("input wider than hidden: N = 3, I = 5, H = 2", 3, 5, 2),
        _shaped("large inputs (x with std 300: saturated gates)", 2, I, H, std=300.0),
    ],
    random=_random,
    shared=[
        (
            ("dx", "dh", "weight_ih.grad", "weight_hh.grad", "bias_ih.grad", "bias_hh.grad"),
            "da (N, 4H), the gates' gradients stacked i, f, g, o: between dc_total and da (di, df, dg, do and "
            "each gate's derivative)",
        )
    ],
    forward=lambda obj, t: obj.forward(t["x"], (t["h"], t["c"])),
    backward=lambda obj, d: obj.backward(d["dh_next"], d["dc_next"]),
    mistakes=[
        Mistake(
            "lstm-gates-ifog",
            "da stacked i, f, o, g (CS231n's order)",
            "PyTorch stacks the gates i, f, g, o, and the forward cut a in that order: the gradient rows must "
            "come back in the same order, torch.cat([di, df, dg, do])",
            lambda c: _grads(c, order="ifog"),
        ),
        Mistake(
            "lstm-forget-dropped",
            "dc_next's total gradient without the forget gate",
            "c_next = f * c + i * g, so dc = (total gradient of c_next) * f: the forget gate scales what flows "
            "back to the previous cell state",
            lambda c: _grads(c, forget=False),
        ),
        Mistake(
            "lstm-dh-not-into-c",
            "the gradient of c_next without its share from h_next",
            "c_next is used twice, returned and inside h_next = o * tanh(c_next): its gradient is dc_next + "
            "dh_next * o * (1 - tanh(c_next)**2)",
            lambda c: _grads(c, dh_into_c=False),
        ),
        Mistake(
            "lstm-tanh-of-c",
            "the share through h_next with 1 - c_next**2",
            "tanh's derivative is 1 - tanh(c_next)**2, written with tanh's output, not its input",
            lambda c: _grads(c, tanh_of_c=True),
        ),
        Mistake(
            "lstm-sigmoid-no-one-minus",
            "the gate gradients with sigmoid' = s instead of s * (1 - s)",
            "the derivative of a sigmoid gate s is s * (1 - s): the (1 - s) is missing",
            lambda c: _grads(c, sigmoid_one_minus=False),
        ),
        Mistake(
            "lstm-dc-next-dropped",
            "the gradient of c_next without dc_next, the one that arrives from above",
            "c_next is returned, so the gradient dc_next arrives for it from the next step: dc_total = dc_next + "
            "dh_next * o * (1 - tanh(c_next)**2)",
            lambda c: _grads(c, dc_next_in=False),
        ),
        Mistake(
            "lstm-tanh-applied-twice",
            "the share through h_next with 1 - tanh(tanh(c_next))**2",
            "the saved tc is already tanh(c_next): the derivative is 1 - tc**2, without a second tanh",
            lambda c: _grads(c, tanh_twice=True),
        ),
        Mistake(
            "lstm-dh-through-weight-ih",
            "da @ weight_ih, of shape (N, input_size)",
            "h enters a through weight_hh: dh = da @ weight_hh, (N, 4H) @ (4H, H)",
            lambda c: _grads(c, dh_weight="weight_ih"),
        ),
    ],
    where={
        "dx": "da (N, 4H), stacked i, f, g, o, then dx = da @ weight_ih",
        "dh": "dh = da @ weight_hh",
        "dc": "dc = (dc_next + the share through h_next) * f",
        "weight_ih.grad": "da.T @ x",
        "weight_hh.grad": "da.T @ h",
        "bias_ih.grad": "da.sum(0)",
        "bias_hh.grad": "da.sum(0): both biases are added to a",
    },
)

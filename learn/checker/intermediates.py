"""Intermediates, opt-in (Backprop Ninja's ``cmp``): a learner who records ``self.saved["da"] = da`` gets each
recorded tensor compared with autograd's on the same forward: exact, approximate (and the largest difference), or
wrong, so a twenty-line backward can be checked line by line.

Each exercise that supports it gives ``trace(t)``: its forward written once more from the leaves, returning the
intermediates by the names its solution uses and the outputs.  A name ``dNAME`` is the gradient of the loss
(the outputs times dout) with respect to intermediate NAME, from torch.autograd.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor

from .compare import vjp

EPS = 1e-5


def expected(trace, leaves: dict[str, Tensor], ctor: dict, douts: dict[str, Tensor], loss: bool) -> dict[str, Tensor]:
    """Every intermediate of ``trace`` and its gradient (``d`` + name), on fresh leaves."""
    with torch.enable_grad():
        t = {n: v.detach().clone().requires_grad_(v.is_floating_point()) for n, v in leaves.items()}
        inter, outs = trace(SimpleNamespace(**t, **ctor))
        grad_outputs = [torch.ones((), dtype=torch.float64)] if loss else [douts[f"d{o}"] for o in outs]
        names = [n for n, v in inter.items() if v.requires_grad]
        found = vjp(list(outs.values()), [inter[n] for n in names], grad_outputs)
    out = {n: v.detach() for n, v in inter.items()}
    out.update(
        {f"d{n}": (torch.zeros_like(inter[n]) if g is None else g).detach() for n, g in zip(names, found, strict=True)}
    )
    return out


def compare(saved: dict, want: dict[str, Tensor]) -> list[str]:
    """One line per recorded tensor: exact, approximate (maxdiff), wrong, or a name the checker does not know."""
    lines = []
    for name, mine in saved.items():
        if name not in want:
            lines.append(f"    ?      {name}: not a name this exercise knows (it knows {', '.join(sorted(want))})")
            continue
        ref = want[name]
        if not isinstance(mine, Tensor) or mine.shape != ref.shape:
            got = tuple(mine.shape) if isinstance(mine, Tensor) else type(mine).__name__
            lines.append(f"    WRONG  {name}: shape {got}, expected {tuple(ref.shape)}")
            continue
        diff = (mine.double() - ref).abs().max().item() if ref.numel() else 0.0
        if torch.equal(mine.double(), ref):
            lines.append(f"    exact  {name}")
        elif diff <= 1e-9 * max(ref.abs().max().item(), 1.0):
            lines.append(f"    approx {name} (maxdiff {diff:.1e})")
        else:
            lines.append(f"    WRONG  {name} (maxdiff {diff:.1e})")
    return lines


def lstm_cell(t):
    a = t.x @ t.weight_ih.T + t.bias_ih + t.h @ t.weight_hh.T + t.bias_hh
    ai, af, ag, ao = a.chunk(4, 1)
    i, f, g, o = torch.sigmoid(ai), torch.sigmoid(af), torch.tanh(ag), torch.sigmoid(ao)
    c_next = f * t.c + i * g
    tc = torch.tanh(c_next)
    h_next = o * tc
    # dc_total: the whole gradient of c_next (dc_next and the share through h_next)
    return {"a": a, "i": i, "f": f, "g": g, "o": o, "tc": tc, "c_total": c_next}, {"h_next": h_next, "c_next": c_next}


def attention(t):
    n, d = t.q.shape[1], t.q.shape[2]
    scores = (t.q @ t.k.transpose(1, 2) * d**-0.5).masked_fill(
        torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf")
    )
    att = torch.softmax(scores, -1)
    return {"scores": scores, "att": att}, {"out": att @ t.v}


def _norm(t, dim):
    keep = dim != 0
    mean = t.x.mean(dim, keepdim=keep)
    var = ((t.x - mean) ** 2).mean(dim, keepdim=keep)
    rstd = 1 / torch.sqrt(var + EPS)
    xhat = (t.x - mean) * rstd
    return {"mean": mean, "var": var, "rstd": rstd, "xhat": xhat}, {"out": t.weight * xhat + t.bias}


def batchnorm(t):
    return _norm(t, 0)


def layernorm(t):
    return _norm(t, 1)


def softmax_cross_entropy(t):
    shifted = t.logits - t.logits.max(1, keepdim=True).values
    p = torch.softmax(shifted, 1)
    return {"shifted": shifted, "p": p}, {"loss": -p[torch.arange(len(t.target)), t.target].log().mean()}


def conv2d(t):
    p = t.padding
    xp = F.pad(t.x, (p, p, p, p))
    return {"xp": xp}, {"out": F.conv2d(xp, t.weight, t.bias)}


TRACES = {f.__name__: f for f in (lstm_cell, attention, batchnorm, layernorm, softmax_cross_entropy, conv2d)}

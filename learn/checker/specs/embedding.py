"""The checks of exercise embedding: Embedding(7, 3) on ids (2, 5) in which some ids repeat, and its known mistake."""

import torch

from ..spec import LayerSpec, normal, wrong


def _inputs(g):
    idx = torch.randint(0, 7, (2, 5), generator=g)
    idx[0, 3] = idx[1, 1] = idx[1, 4] = idx[0, 0]  # one id three more times: its row must get four gradients
    return {"idx": idx}


def _last_write_wins(c):
    """``dweight[idx] += dout``: indexing assignment with repeated ids keeps one write per row, not their sum."""
    d = c.dout.shape[-1]
    return torch.zeros_like(c.weight).index_put_((c.idx.reshape(-1),), c.dout.reshape(-1, d), accumulate=False)


def _shaped(label, v, d, n, t, same=False):
    def inputs(g):
        idx = torch.full((n, t), 2) if same else torch.randint(0, v, (n, t), generator=g)
        return {"idx": idx}

    return {
        "label": label,
        "ctor": {"num_embeddings": v, "embedding_dim": d},
        "params": {"weight": lambda g: normal(g, v, d)},
        "inputs": inputs,
    }


def _random(g):
    v, d, n, t = (int(x) for x in torch.randint(1, 8, (4,), generator=g))
    return _shaped(f"V = {v + 2}, D = {d}, idx ({n}, {t})", v + 2, d, n, t)


SPEC = LayerSpec(
    name="embedding",
    cls="Embedding",
    ctor={"num_embeddings": 7, "embedding_dim": 3},
    params={"weight": lambda g: normal(g, 7, 3)},
    inputs=_inputs,
    returns=(),
    reference=lambda t: {"out": t.weight[t.idx]},
    configs=[
        _shaped("one id (idx (1, 1)), D = 5", 4, 5, 1, 1),
        _shaped("every id the same (idx (3, 4) all 2)", 5, 2, 3, 4, same=True),
    ],
    random=_random,
    mistakes=[
        wrong(
            "emb-repeats-lost",
            "weight.grad",
            "dweight[idx] += dout (or = dout)",
            "an id that appears several times must receive the sum of their gradients, but indexed assignment "
            "with repeated indices writes once per row (the last write wins).  Add them up with "
            "dweight.index_add_(0, idx.reshape(-1), dout.reshape(-1, D)), or a loop over the positions",
            _last_write_wins,
        ),
    ],
    where={"weight.grad": "row v of dweight: the sum of dout[n, t] over the positions where idx[n, t] == v"},
)

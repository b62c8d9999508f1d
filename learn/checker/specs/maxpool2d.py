"""The checks of exercise maxpool2d: MaxPool2d(3, stride=2) on x (2, 2, 7, 9), windows overlapping, and its mistakes."""
import torch
import torch.nn.functional as F

from ..spec import LayerSpec, normal, wrong

K, S = 3, 2


def _spread(c, how: str):
    """dx when each window's dout is spread over the whole window ("all", "mean"), or the winners' shares are
    assigned window after window ("assign", which also writes zeros over the earlier windows' overlaps)."""
    n, ch, ho, wo = c.dout.shape
    dx = torch.zeros_like(c.x)
    arg = c.x.unfold(2, K, S).unfold(3, K, S).reshape(n, ch, ho, wo, K * K).argmax(-1)
    for i in range(ho):
        for j in range(wo):
            d = c.dout[:, :, i, j, None, None]
            win = (i * S, i * S + K), (j * S, j * S + K)
            place = dx[:, :, win[0][0]:win[0][1], win[1][0]:win[1][1]]
            if how == "all":
                place += d
            elif how == "mean":
                place += d / (K * K)
            else:
                place[...] = (F.one_hot(arg[:, :, i, j], K * K) * d.reshape(n, ch, 1)).reshape(n, ch, K, K)
    return dx


SPEC = LayerSpec(
    name="maxpool2d", cls="MaxPool2d", ctor={"kernel_size": K, "stride": S}, params={},
    inputs=lambda g: {"x": normal(g, 2, 2, 7, 9)},
    reference=lambda t: {"out": F.max_pool2d(t.x, K, S)},
    mistakes=[
        wrong("pool-whole-window", "dx", "dout added to every input of its window",
              "only the input that won the max moved the output: it alone gets the window's dout, the others 0",
              lambda c: _spread(c, "all")),
        wrong("pool-average", "dx", "dout / (k * k) over every input of its window",
              "that is average pooling's backward; a max passes the gradient to the winner alone",
              lambda c: _spread(c, "mean")),
        wrong("pool-overlap-assigned", "dx", "dx[window] = ... for each window",
              "windows overlap (stride < kernel_size): assigning a window's share overwrites what an earlier "
              "window gave the same inputs.  Add (+=) each window's share", lambda c: _spread(c, "assign")),
    ],
    where={"dx": "each window's dout goes to the input that won its max, += where windows overlap"},
)

"""The checks of exercise maxpool2d: MaxPool2d(3, stride=2) on x (2, 2, 7, 9), windows overlapping, and its mistakes."""

import torch
import torch.nn.functional as F

from ..spec import LayerSpec, normal, wrong

K, S = 3, 2


def _spread(c, how: str):
    """dx when each window's dout is spread over the whole window ("all", "mean"), or the winners' shares are
    assigned window after window ("assign", which also writes zeros over the earlier windows' overlaps)."""
    K, S = c.kernel_size, getattr(c, "stride", None) or c.kernel_size
    n, ch, ho, wo = c.dout.shape
    dx = torch.zeros_like(c.x)
    arg = c.x.unfold(2, K, S).unfold(3, K, S).reshape(n, ch, ho, wo, K * K).argmax(-1)
    for i in range(ho):
        for j in range(wo):
            d = c.dout[:, :, i, j, None, None]
            win = (i * S, i * S + K), (j * S, j * S + K)
            place = dx[:, :, win[0][0] : win[0][1], win[1][0] : win[1][1]]
            if how == "all":
                place += d
            elif how == "mean":
                place += d / (K * K)
            else:
                place[...] = (F.one_hot(arg[:, :, i, j], K * K) * d.reshape(n, ch, 1)).reshape(n, ch, K, K)
    return dx


def _stride(c) -> int:
    return getattr(c, "stride", None) or c.kernel_size


def _windows(c):
    """(N, C, H_out, W_out, k*k): each window of x, flat in row-major order."""
    k, s = c.kernel_size, _stride(c)
    w = c.x.unfold(2, k, s).unfold(3, k, s)
    return w.reshape(*w.shape[:4], k * k)


def _route(c, arg, swap: bool = False):
    """dx with each window's dout sent to flat place ``arg`` of its window (row arg // k, column arg % k; swapped:
    row arg % k, column arg // k)."""
    k, s = c.kernel_size, _stride(c)
    n, ch, ho, wo = c.dout.shape
    h, w = c.x.shape[2:]
    r, q = (arg % k, arg // k) if swap else (arg // k, arg % k)
    rows = torch.arange(ho).view(1, 1, ho, 1) * s + r
    cols = torch.arange(wo).view(1, 1, 1, wo) * s + q
    if (rows >= h).any() or (cols >= w).any():
        return None  # the swapped place falls outside x: that answer would have raised
    flat = (rows * w + cols).reshape(n, ch, -1)
    dx = torch.zeros(n, ch, h * w, dtype=c.dout.dtype).scatter_add_(2, flat, c.dout.reshape(n, ch, -1))
    return dx.view(n, ch, h, w)


def _last_max(c):
    """Each window's last maximum (row-major): what a running max with >= keeps."""
    win = _windows(c)
    return win.shape[-1] - 1 - win.flip(-1).argmax(-1)


def _shaped(label, n, ch, h, w, k, s=None, relu=False):
    def inputs(g):
        x = normal(g, n, ch, h, w)
        if relu:  # mostly zeros, as after a ReLU of a negative bias: whole windows tie at 0
            x = (x - 1.2).clamp_min(0)
            x[..., :k, :k] = 0.0
        return {"x": x}

    ctor = {"kernel_size": k} if s is None else {"kernel_size": k, "stride": s}
    return {"label": label, "ctor": ctor, "inputs": inputs, "numeric": not relu}


def _random(g):
    k = int(torch.randint(1, 4, (), generator=g))
    s = int(torch.randint(1, k + 2, (), generator=g))
    n, ch = (int(v) for v in torch.randint(1, 3, (2,), generator=g))
    h, w = (int(v) for v in torch.randint(k, k + 6, (2,), generator=g))
    return _shaped(f"k = {k}, stride {s}, x ({n}, {ch}, {h}, {w})", n, ch, h, w, k, s)


SPEC = LayerSpec(
    name="maxpool2d",
    cls="MaxPool2d",
    ctor={"kernel_size": K, "stride": S},
    params={},
    inputs=lambda g: {"x": normal(g, 2, 2, 7, 9)},
    reference=lambda t: {"out": F.max_pool2d(t.x, t.kernel_size, t.stride if "stride" in vars(t) else None)},
    configs=[
        _shaped("windows that do not overlap (k = 2, stride left to its default)", 1, 3, 4, 6, 2),
        _shaped(
            "ties: x after a ReLU, whole windows of zeros (PyTorch sends their gradient to the first zero only)",
            2,
            2,
            7,
            9,
            3,
            2,
            relu=True,
        ),
        _shaped("stride 1 (every window overlaps), odd sizes", 1, 1, 5, 3, 2, 1),
    ],
    random=_random,
    mistakes=[
        wrong(
            "pool-whole-window",
            "dx",
            "dout added to every input of its window",
            "only the input that won the max moved the output: it alone gets the window's dout, the others 0",
            lambda c: _spread(c, "all"),
        ),
        wrong(
            "pool-average",
            "dx",
            "dout / (k * k) over every input of its window",
            "that is average pooling's backward; a max passes the gradient to the winner alone",
            lambda c: _spread(c, "mean"),
        ),
        wrong(
            "pool-overlap-assigned",
            "dx",
            "dx[window] = ... for each window",
            "windows overlap (stride < kernel_size): assigning a window's share overwrites what an earlier "
            "window gave the same inputs.  Add (+=) each window's share",
            lambda c: _spread(c, "assign"),
        ),
        wrong(
            "pool-ties-last",
            "dx",
            "a tied window's dout sent to the last of its maxima",
            "PyTorch sends a tied window's gradient to the first of its maxima in row-major order (a running max "
            "kept with >= picks the last one, > the first; max(-1) and argmax give the first)",
            lambda c: _route(c, _last_max(c)),
        ),
        wrong(
            "pool-unravel-swapped",
            "dx",
            "each winner's row and column swapped (arg % k, arg // k)",
            "a flat index into a k x k window is row * k + column: the row is arg // k, the column arg % k",
            lambda c: _route(c, _windows(c).argmax(-1), swap=True),
        ),
        wrong(
            "pool-size-no-plus-one",
            "out",
            "(H - k) // stride windows down a column, (W - k) // stride across",
            "a window starts at 0, s, 2s, ... as long as it fits, up to H - k: that is (H - k) // s + 1 windows",
            lambda c: F.max_pool2d(c.x, c.kernel_size, _stride(c))[:, :, :-1, :-1],
        ),
        wrong(
            "pool-stride-as-kernel",
            "out",
            "windows kernel_size apart (the stride taken as the kernel size)",
            "the windows start stride apart, not kernel_size apart: with stride < kernel_size they overlap",
            lambda c: F.max_pool2d(c.x, c.kernel_size, c.kernel_size),
        ),
    ],
    where={
        "dx": "each window's dout goes to the input that won its max (the first of them on a tie), += where "
        "windows overlap",
        "out": "H_out = (H - k) // stride + 1 windows, stride apart",
    },
)

"""Dropout masks for attention weights that any block of can be regenerated on its own.

FlashAttention never holds the (L, S) matrix of attention weights, so it cannot hold their dropout mask
either: it regenerates the mask of each block from a counter-based random number generator (Philox on
the GPU), once in the forward and again in the backward.  Here the generator is a hash: the element at
(batch b, query row l, key column s) is kept iff

    u = splitmix64(seed + (1 + (b * L + l) * S + s) * golden)  /  2^64   >=  p,

so its fate depends only on the seed and its coordinates -- not on the block size, the order blocks are
visited in, or the device.  The textbook path, the blocked path and an nn.Module twin (which calls
``attention_dropout_mask`` for the whole matrix) therefore drop exactly the same weights.

splitmix64 (Steele, Lea and Flood 2014; the seeding generator of Java's SplittableRandom and of xoshiro) is
written with torch's int64 operations: products wrap modulo 2^64 and the logical right shifts are arithmetic
shifts with the sign-extended bits masked off.  ``tests/test_attention.py`` checks it against a pure-Python
splitmix64.  It costs about a dozen integer operations per weight, and only when dropout_p > 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment, 2^64 / the golden ratio
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_U53 = float(2**53)


def _signed(c: int) -> int:
    """A 64-bit constant as the int64 with the same bits (torch multiplies int64 modulo 2^64)."""
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(x: Tensor, k: int) -> Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic: clear the copied sign bits)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def splitmix64(x: Tensor) -> Tensor:
    """splitmix64's output function applied to each int64 of ``x`` (the state already advanced)."""
    x = x ^ _shr(x, 30)
    x = x * _signed(_M1)
    x = x ^ _shr(x, 27)
    x = x * _signed(_M2)
    return x ^ _shr(x, 31)


def draw_seed(generator: torch.Generator | None = None) -> int:
    """One 63-bit seed for a forward's attention dropout, from ``generator`` (default: torch's CPU generator)."""
    return int(torch.randint(0, 2**63 - 1, (), generator=generator, device=getattr(generator, "device", "cpu")))


def attention_dropout_mask(
    seed: int,
    p: float,
    batch: int,
    rows: int,
    cols: int,
    *,
    row_range: tuple[int, int] | None = None,
    col_range: tuple[int, int] | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """The scaled dropout mask (values 0 or 1/(1-p)) of attention weights of shape (batch, rows, cols), or of
    its block [:, r0:r1, c0:c1] given ``row_range=(r0, r1)`` and ``col_range=(c0, c1)``: (batch, r1-r0, c1-c0).

    ``batch`` counts every leading (batch, head, ...) position flattened in row-major order.  p = 1 drops all.
    """
    r0, r1 = row_range or (0, rows)
    c0, c1 = col_range or (0, cols)
    if p >= 1.0:
        return torch.zeros(batch, r1 - r0, c1 - c0, dtype=dtype, device=device)
    b = torch.arange(batch, device=device, dtype=torch.int64).view(-1, 1, 1) * (rows * cols)
    r = torch.arange(r0, r1, device=device, dtype=torch.int64).view(1, -1, 1) * cols
    c = torch.arange(c0 + 1, c1 + 1, device=device, dtype=torch.int64).view(1, 1, -1)
    counter = (b + r) + c  # (batch, r1-r0, c1-c0): 1 + the element's row-major index
    h = splitmix64(counter * _signed(_GOLDEN) + _signed(seed % (1 << 64)))
    u = _shr(h, 11).to(torch.float64) / _U53  # the top 53 bits: uniform in [0, 1)
    return (u >= p).to(dtype).div_(1.0 - p)

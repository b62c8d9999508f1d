"""The guard of tests/triton_support.py catches what Triton's interpreter lets through: each rule broken on purpose
by a small kernel written here must fail, and a kernel that keeps them all must pass, with its accesses counted.
A guard that let these through would make every kernel test below it prove nothing about a GPU."""

import pytest
import torch

from tests.triton_support import interpreting, load

pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(not interpreting(), reason="the guard checks the interpreter; a GPU checks itself"),
]


@pytest.fixture(scope="module")
def kernels():
    """Kernels that each break one rule (defined after load() has put Triton in interpreter mode)."""
    load("gelu")
    import triton
    import triton.language as tl

    @triton.jit
    def copy(X, Y, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(Y + i, tl.load(X + i, mask=i < n), mask=i < n)

    @triton.jit
    def unmasked_load(X, Y, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(Y + i, tl.load(X + i), mask=i < n)

    @triton.jit
    def read_past_the_end(X, Y, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(Y + i, tl.load(X + i, mask=i <= n), mask=i < n)  # <=: one element too many

    @triton.jit
    def write_past_the_end(X, Y, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(Y + i, tl.load(X + i, mask=i < n), mask=i <= n)

    @triton.jit
    def square(X, Y, B: tl.constexpr, PRECISION: tl.constexpr):
        i = tl.arange(0, B)
        a = tl.load(X + i[:, None] * B + i[None, :], mask=(i < B)[:, None])
        tl.store(Y + i[:, None] * B + i[None, :], tl.dot(a, a, input_precision=PRECISION), mask=(i < B)[:, None])

    @triton.jit
    def scaled(X, Y, n, factor, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(Y + i, tl.load(X + i, mask=i < n) * factor, mask=i < n)

    @triton.jit
    def count_as_float(X, Y, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(Y + i, tl.load(X + i, mask=i < n) / n.to(tl.float32), mask=i < n)  # n a tensor: not where n == 1

    return dict(
        copy=copy,
        unmasked_load=unmasked_load,
        read_past_the_end=read_past_the_end,
        write_past_the_end=write_past_the_end,
        square=square,
        scaled=scaled,
        count_as_float=count_as_float,
    )


def test_a_kernel_that_keeps_the_rules_passes(kernels, guard):
    x, y = torch.arange(10.0), torch.zeros(10)
    kernels["copy"][(1,)](x, y, 10, BLOCK=16)
    assert torch.equal(x, y)
    guard.expect(launches=1)
    assert guard.accesses == 20


@pytest.mark.parametrize(
    "name,message",
    [
        ("unmasked_load", "without a mask"),
        ("read_past_the_end", "load of 1 element"),
        ("write_past_the_end", "store of 1 element"),
    ],
)
def test_unmasked_and_out_of_bounds_accesses_fail(kernels, guard, name, message):
    buffer = torch.zeros(64)  # x and y inside one allocation: an overrun lands in memory that exists
    x, y = buffer[:10], buffer[32:42]
    with pytest.raises(Exception, match=message):
        kernels[name][(1,)](x, y, 10, BLOCK=16)


def test_small_or_tf32_dots_fail(kernels, guard):
    a = torch.randn(16, 16)
    kernels["square"][(1,)](a, torch.zeros(16, 16), B=16, PRECISION="ieee")
    assert guard.dots == [((16, 16), (16, 16), "fp32")]
    with pytest.raises(Exception, match="16"):
        kernels["square"][(1,)](torch.randn(8, 8), torch.zeros(8, 8), B=8, PRECISION="ieee")
    with pytest.raises(Exception, match="TF32"):
        kernels["square"][(1,)](a, torch.zeros(16, 16), B=16, PRECISION="tf32")


def test_float_arguments_and_ints_of_one_are_as_a_gpu_sees_them(kernels, guard):
    x = torch.arange(4.0)
    with pytest.raises(Exception, match="float argument"):
        kernels["scaled"][(1,)](x, torch.zeros(4), 4, 0.1, BLOCK=16)
    kernels["count_as_float"][(1,)](x, torch.zeros(4), 4, BLOCK=16)  # n = 4: a tensor, as on a GPU
    with pytest.raises(Exception, match="constexpr"):
        kernels["count_as_float"][(1,)](x[:1], torch.zeros(1), 1, BLOCK=16)  # n = 1: a constant, as on a GPU

"""Layer norm's Triton kernels (kernels/triton/layernorm.py): forward and backward against llm.c's formulas in
float64 and float32, against F.layer_norm with autograd (mixed precision too), the partial sums of dweight and
dbias, strided and padded inputs, and bad input.  Run with `pytest -m triton` (tests/triton_support.py)."""

import pytest
import torch
import torch.nn.functional as F

from tests.triton_support import assert_close, assert_padding_kept, device, load, padded

pytestmark = pytest.mark.triton
f64, f32 = torch.float64, torch.float32


@pytest.fixture(scope="module")
def LN():
    return load("layernorm")


def textbook(x, w, b, dout, eps):
    """llm.c's layernorm_forward / layernorm_backward over the last axis, in x's dtype:
    (out, mean, rstd, dx, dweight, dbias)."""
    mean = x.mean(-1, keepdim=True)
    rstd = 1 / ((x - mean) ** 2).mean(-1, keepdim=True).add(eps).sqrt()  # biased variance
    xhat = (x - mean) * rstd
    out = xhat * w + b
    dnorm = dout * w
    dx = (dnorm - dnorm.mean(-1, keepdim=True) - xhat * (dnorm * xhat).mean(-1, keepdim=True)) * rstd  # three terms
    lead = tuple(range(x.dim() - 1))
    return out, mean[..., 0], rstd[..., 0], dx, (dout * xhat).sum(lead), dout.sum(lead)


def inputs(shape, dtype, param_dtype=None, seed=0):
    """x away from zero mean and unit variance, weight and bias away from 1 and 0, a random dout."""
    g = torch.Generator().manual_seed(seed)
    k = shape[-1]
    x = torch.randn(shape, generator=g, dtype=f64) * 3 + 2
    w, b = torch.randn(k, generator=g, dtype=f64) + 1, torch.randn(k, generator=g, dtype=f64)
    dout = torch.randn(shape, generator=g, dtype=f64)
    pd = param_dtype or dtype
    return x.to(dtype).to(device()), w.to(pd).to(device()), b.to(pd).to(device()), dout.to(dtype).to(device())


@pytest.mark.parametrize("dtype,tol", [(f64, 1e-12), (f32, 2e-6)])
def test_equals_the_formula(LN, guard, dtype, tol):
    x, w, b, dout = inputs((3, 11, 37), dtype)
    out, mean, rstd = LN.layer_norm_forward(x, w, b, eps=1e-5)
    dx, dw, db = LN.layer_norm_backward(dout, x, w, b, mean, rstd, rows_per_program=4)  # 33 rows: 9 programs
    expected = textbook(*(t.double() for t in (x, w, b, dout)), 1e-5)
    for name, got, ref in zip(
        ("out", "mean", "rstd", "dx", "dweight", "dbias"), (out, mean, rstd, dx, dw, db), expected, strict=True
    ):
        assert_close(name, got, ref, tol)
    guard.expect(launches=4)  # forward; backward rows, then the two column sums


@pytest.mark.parametrize(
    "dtype,pdtype,tol",
    [
        (f64, f64, 1e-12),
        (f32, f32, 2e-6),
        (torch.float16, torch.float16, 4e-3),
        (torch.bfloat16, torch.bfloat16, 2e-2),
        (torch.bfloat16, f32, 2e-2),
    ],
)
def test_equals_torch_autograd(LN, guard, dtype, pdtype, tol):
    """F.layer_norm and its autograd backward; a bfloat16 x with float32 parameters as torch's LayerNorm takes it."""
    x, w, b, dout = inputs((4, 5, 24), dtype, pdtype, seed=1)
    xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
    ref = (
        F.layer_norm(xr, (24,), wr, br, 1e-5)
        if dtype == pdtype
        else F.layer_norm(xr.float(), (24,), wr, br, 1e-5).to(dtype)
    )
    ref.backward(dout)
    out, mean, rstd = LN.layer_norm_forward(x, w, b, eps=1e-5)
    dx, dw, db = LN.layer_norm_backward(dout, x, w, b, mean, rstd)
    assert (out.dtype, dx.dtype, dw.dtype, db.dtype) == (dtype, dtype, pdtype, pdtype)
    for name, got, want in (("out", out, ref), ("dx", dx, xr.grad), ("dweight", dw, wr.grad), ("dbias", db, br.grad)):
        assert_close(name, got, want, tol)


def test_without_weight_or_bias_and_over_two_axes(LN, guard):
    """elementwise_affine=False, a weight without a bias, and a (3, 5) normalised shape, against F.layer_norm."""
    x, _, _, dout = inputs((4, 3, 5), f64, seed=2)
    w = torch.randn(3, 5, dtype=f64, device=device()) + 1
    for weight, bias in ((None, None), (w, None), (w, torch.randn(3, 5, dtype=f64, device=device()))):
        xr = x.clone().requires_grad_()
        params = [p.clone().requires_grad_() if p is not None else None for p in (weight, bias)]
        ref = F.layer_norm(xr, (3, 5), *params, eps=1e-3)
        ref.backward(dout)
        out, mean, rstd = LN.layer_norm_forward(x, weight, bias, eps=1e-3, normalized_shape=(3, 5))
        assert mean.shape == (4,)
        dx, dw, db = LN.layer_norm_backward(dout, x, weight, bias, mean, rstd)
        assert_close("out", out, ref, 1e-12)
        assert_close("dx", dx, xr.grad, 1e-12)
        for name, got, p in (("dweight", dw, params[0]), ("dbias", db, params[1])):
            assert (got is None) == (p is None), f"{name}: {got is None=} but the parameter is {p is None=}"
            if p is not None:
                assert_close(name, got, p.grad, 1e-12)


def test_partial_sums_do_not_depend_on_the_grouping(LN, guard):
    """dweight and dbias from 1, 3, 7 and all rows a program: the same sums, in another order (float64)."""
    x, w, b, dout = inputs((29, 16), f64, seed=3)
    out, mean, rstd = LN.layer_norm_forward(x, w, b)
    ref = textbook(x, w, b, dout, 1e-5)
    for rows in (1, 3, 7, 29, 100):
        dx, dw, db = LN.layer_norm_backward(dout, x, w, b, mean, rstd, rows_per_program=rows)
        assert_close(f"dx ({rows} rows a program)", dx, ref[3], 1e-12)
        assert_close(f"dweight ({rows} rows a program)", dw, ref[4], 1e-12)
        assert_close(f"dbias ({rows} rows a program)", db, ref[5], 1e-12)


def test_strides_are_read_not_assumed(LN, guard):
    """x, dout, weight and bias inside buffers of NaN sentinels, and a column-major x: the same bits as
    contiguous inputs, no sentinel read (a NaN would spread through the row's sums) or written."""
    x, w, b, dout = inputs((6, 20), f32, seed=4)
    out, mean, rstd = LN.layer_norm_forward(x, w, b)
    expected = (out, mean, rstd, *LN.layer_norm_backward(dout, x, w, b, mean, rstd, rows_per_program=2))
    views = [padded(t) for t in (x, w, b, dout)]
    xp, wp, bp, dp = (v[0] for v in views)
    out, mean, rstd = LN.layer_norm_forward(xp, wp, bp)
    got = (out, mean, rstd, *LN.layer_norm_backward(dp, xp, wp, bp, mean, rstd, rows_per_program=2))
    for name, a, e in zip(("out", "mean", "rstd", "dx", "dweight", "dbias"), got, expected, strict=True):
        assert torch.equal(a, e), f"{name} from padded inputs differs from contiguous inputs'"
    for name, (_, buffer, padding) in zip(("x", "weight", "bias", "dout"), views, strict=True):
        assert_padding_kept(f"{name}'s buffer", buffer, padding)
    xt, dt = x.t().contiguous().t(), dout.t().contiguous().t()  # column-major
    out, mean, rstd = LN.layer_norm_forward(xt, w, b)
    assert torch.equal(out, expected[0])
    assert torch.equal(LN.layer_norm_backward(dt, xt, w, b, mean, rstd, rows_per_program=2)[0], expected[3])


def test_sizes_of_one(LN, guard):
    """One value a row (xhat = 0: out is the bias, dx is 0), one row, and an input with no rows."""
    for shape in [(5, 1), (1, 9)]:
        x, w, b, dout = inputs(shape, f64, seed=5)
        out, mean, rstd = LN.layer_norm_forward(x, w, b)
        got = (out, mean, rstd, *LN.layer_norm_backward(dout, x, w, b, mean, rstd))
        for name, a, e in zip(
            ("out", "mean", "rstd", "dx", "dweight", "dbias"), got, textbook(x, w, b, dout, 1e-5), strict=True
        ):
            assert_close(f"{name} {shape}", a, e, 1e-12)
    empty = torch.zeros(0, 4, dtype=f64, device=device())
    out, mean, rstd = LN.layer_norm_forward(empty, None, None)
    assert out.shape == (0, 4) and mean.shape == (0,)
    dx, dw, db = LN.layer_norm_backward(empty, empty, torch.ones(4, dtype=f64, device=device()), None, mean, rstd)
    assert dx.shape == (0, 4) and torch.equal(dw, torch.zeros(4, dtype=f64, device=device())) and db is None


def test_bad_input_is_refused(LN):
    x, w, b, dout = inputs((4, 6), f32)
    with pytest.raises(ValueError, match="normalised shape"):
        LN.layer_norm_forward(x, w[:5], b)
    with pytest.raises(ValueError, match="eps"):
        LN.layer_norm_forward(x, w, b, eps=-1.0)
    with pytest.raises(ValueError, match="bias without a weight"):
        LN.layer_norm_forward(x, None, b)
    out, mean, rstd = LN.layer_norm_forward(x, w, b)
    with pytest.raises(ValueError, match="mean and rstd"):
        LN.layer_norm_backward(dout, x, w, b, mean[:3], rstd)
    with pytest.raises(ValueError, match="dout must have"):
        LN.layer_norm_backward(dout.double(), x, w, b, mean, rstd)
    with pytest.raises(ValueError, match="more than the kernel holds"):
        LN.layer_norm_forward(torch.zeros(1, LN.MAX_K + 1, device=device()), None, None)

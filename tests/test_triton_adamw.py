"""AdamW in one Triton kernel (kernels/triton/adamw.py) against torch.optim.AdamW and the library's hand-written
AdamW over many steps, float64 and float32, both forms of torch's lerp, strided buffers inside sentinels, and
bad settings.  Run with `pytest -m triton` (tests/triton_support.py)."""

import pytest
import torch

import optimizers
from tests.triton_support import assert_close, assert_padding_kept, device, load

pytestmark = pytest.mark.triton
f64, f32 = torch.float64, torch.float32
STEPS = 12


@pytest.fixture(scope="module")
def A():
    return load("adamw")


def run(A, p0, grads, **hyper):
    """The kernel over the steps from p0 with zero moments: (param, exp_avg, exp_avg_sq)."""
    p, m, v = p0.clone(), torch.zeros_like(p0), torch.zeros_like(p0)
    for t, g in enumerate(grads, 1):
        A.adamw_step(p, g, m, v, step=t, **hyper)
    return p, m, v


def reference(cls, p0, grads, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-2, **flags):
    """The same steps by an optimizer class with torch.optim's interface: (param, exp_avg, exp_avg_sq)."""
    p = p0.clone().requires_grad_()
    opt = cls([p], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay, **flags)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    state = opt.state[p]
    return p.detach(), state["exp_avg"], state["exp_avg_sq"]


def problem(dtype, n=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    p0 = torch.randn(n, generator=g, dtype=f64).to(dtype).to(device())
    grads = [(torch.randn(n, generator=g, dtype=f64) * (1 + t)).to(dtype).to(device()) for t in range(STEPS)]
    return p0, grads


HYPERS = [dict(lr=1e-2, weight_decay=0.1), dict(lr=3e-3, beta1=0.3, beta2=0.9, eps=1e-6, weight_decay=0.0)]


@pytest.mark.parametrize("hyper", HYPERS, ids=["default-betas", "beta1-under-one-half"])
@pytest.mark.parametrize("dtype,tol", [(f64, 1e-13), (f32, 2e-6)])
def test_equals_torch_optim_over_many_steps(A, guard, hyper, dtype, tol):
    """torch.optim.AdamW (its per-tensor and foreach paths), 12 steps; beta1 = 0.3 takes lerp's other form."""
    p0, grads = problem(dtype)
    got = run(A, p0, grads, **hyper)
    for foreach in (False, True):
        want = reference(torch.optim.AdamW, p0, grads, foreach=foreach, **hyper)
        for name, a, b in zip(("param", "exp_avg", "exp_avg_sq"), got, want, strict=True):
            assert_close(f"{name} (foreach={foreach})", a, b, tol)
    guard.expect(launches=STEPS)


def test_equals_the_libraries_hand_written_adamw(A, guard):
    p0, grads = problem(f64, seed=1)
    got = run(A, p0, grads, **HYPERS[0])
    want = reference(optimizers.AdamW, p0, grads, **HYPERS[0])
    for name, a, b in zip(("param", "exp_avg", "exp_avg_sq"), got, want, strict=True):
        assert_close(name, a, b, 1e-13)


def test_float32_stays_near_float64(A, guard):
    """The float32 update against the float64 one from the same start: rounding only, not a drift."""
    p0, grads = problem(f64, seed=2)
    want = run(A, p0, grads, **HYPERS[0])
    got = run(A, p0.float(), [g.float() for g in grads], **HYPERS[0])
    for name, a, b in zip(("param", "exp_avg", "exp_avg_sq"), got, want, strict=True):
        assert_close(name, a, b, 2e-6)


def test_strided_buffers_inside_sentinels(A, guard):
    """The four buffers as every-third-element views of NaN-filled memory: the same update, padding untouched."""
    p0, grads = problem(f32, n=50, seed=3)
    want = run(A, p0, grads[:3], **HYPERS[0])
    bufs = [torch.full((150 + 4,), float("nan"), device=device()) for _ in range(4)]
    p, g, m, v = (b[2:152:3] for b in bufs)
    p.copy_(p0), m.zero_(), v.zero_()
    for t, grad in enumerate(grads[:3], 1):
        g.copy_(grad)
        A.adamw_step(p, g, m, v, step=t, **HYPERS[0])
    for name, a, b in zip(("param", "exp_avg", "exp_avg_sq"), (p, m, v), want, strict=True):
        assert torch.equal(a, b), f"{name} through strided views differs from contiguous buffers'"
    for name, b in zip(("param", "grad", "exp_avg", "exp_avg_sq"), bufs, strict=True):
        pad = torch.ones_like(b, dtype=torch.bool)
        pad[2:152:3] = False
        assert_padding_kept(f"{name}'s buffer", b, pad)


def test_one_element_and_none(A, guard):
    p0, grads = problem(f64, n=1, seed=4)
    got = run(A, p0, grads, **HYPERS[0])
    assert_close("param", got[0], reference(torch.optim.AdamW, p0, grads, **HYPERS[0])[0], 1e-13)
    empty = torch.zeros(0, device=device())
    A.adamw_step(empty, empty, empty, empty, step=1, lr=1e-3)


def test_bad_settings_are_refused(A):
    p = torch.zeros(4, device=device())
    with pytest.raises(ValueError, match="step must be"):
        A.adamw_step(p, p, p, p, step=0, lr=1e-3)
    with pytest.raises(ValueError, match="beta1"):
        A.adamw_step(p, p, p, p, step=1, lr=1e-3, beta1=1.0)
    with pytest.raises(ValueError, match="lr"):
        A.adamw_step(p, p, p, p, step=1, lr=-1e-3)
    with pytest.raises(ValueError, match="exp_avg must have"):
        A.adamw_step(p, p, p[:3], p, step=1, lr=1e-3)
    with pytest.raises(ValueError, match="1-D"):
        q = torch.zeros(2, 2, device=device())
        A.adamw_step(q, q, q, q, step=1, lr=1e-3)
    with pytest.raises(ValueError, match="must be one of"):
        h = p.half()
        A.adamw_step(h, h, h, h, step=1, lr=1e-3)

"""capturable=True optimizers and a host-sync-free step, checked on the CPU.

Equality: ours with capturable=True against torch.optim, 150 float64 steps, 1e-12 relative: against
torch's own capturable code path (its device check lifted for the test, the arithmetic untouched) and
against its default path.  Capture-safety: a step run on the "meta" device (tensors without data) under
a dispatch mode that records every read-back to the host and every CPU tensor handed to an op; either
is what fails inside torch.cuda.graph capture.  The same guard flags the default (CPU-counter) path, so
it can fail.
"""

import copy
import importlib

import pytest
import torch

import optimizers as hg
from tests.conftest import HostTraffic
from tests.test_optimizers import assert_same, make_params, set_grads

CAP_CASES = [
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1)),
    ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.3, maximize=True)),
    ("RMSprop", dict(lr=0.01, momentum=0.9, centered=True, weight_decay=0.1)),
    ("RMSprop", dict(lr=0.01, maximize=True)),
    ("Adam", dict(lr=0.01)),
    ("Adam", dict(lr=0.01, amsgrad=True, weight_decay=0.1, maximize=True)),
    ("Adam", dict(betas=(0.5, 0.9), eps=1e-4)),
    ("AdamW", dict(lr=0.01)),
    ("AdamW", dict(lr=0.01, amsgrad=True, weight_decay=0.1)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.2)),
    ("Adagrad", dict(lr=0.1, maximize=True)),
]
IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for n, kw in CAP_CASES]
TORCH_CAPTURABLE = {"RMSprop", "Adam", "AdamW"}  # torch.optim.SGD and Adagrad have no capturable option


@pytest.fixture
def float64_default():
    """torch types step counters by the default dtype (float64 here, as the float64 math needs)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def run(opt_cls, kw, steps=150):
    params = make_params()
    opt = opt_cls(params, **kw)
    for t in range(steps):
        set_grads(params, t)
        opt.step()
    return opt, params


@pytest.mark.parametrize("name,kw", CAP_CASES, ids=IDS)
def test_capturable_matches_torch_default_path(name, kw, float64_default):
    ours, ours_p = run(getattr(hg, name), {**kw, "capturable": True})
    ref, ref_p = run(getattr(torch.optim, name), kw)
    assert_same(ours_p, ref_p, tol=1e-12)
    for p in ours_p:
        if "step" in ours.state[p]:
            assert ours.state[p]["step"].item() == 150 and ours.state[p]["step"].device == p.device


@pytest.mark.parametrize(
    "name,kw",
    [c for c in CAP_CASES if c[0] in TORCH_CAPTURABLE],
    ids=[i for i, c in zip(IDS, CAP_CASES, strict=True) if c[0] in TORCH_CAPTURABLE],
)
@pytest.mark.parametrize("default_dtype", [torch.float32, torch.float64])
def test_capturable_matches_torch_capturable_path(name, kw, default_dtype, monkeypatch):
    """torch refuses capturable=True on the CPU only in a device check; lifted, its capturable arithmetic runs
    here (its foreach implementation, the default on CUDA).  torch types its counters by the default dtype, so
    under a float32 default its bias corrections for float64 parameters are float32 (1e-7 relative); ours are
    float64 for float64 parameters under either default (optimizers/base.py: step_dtype), the same as torch's
    under a float64 default, which is what they are compared with."""
    for mod in (importlib.import_module("torch.optim.adam"), importlib.import_module("torch.optim.rmsprop")):
        if not hasattr(mod, "_get_capturable_supported_devices"):
            pytest.skip("this torch has no _get_capturable_supported_devices to lift")
        monkeypatch.setattr(mod, "_get_capturable_supported_devices", lambda *a, **k: ["cpu", "cuda"])
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(default_dtype)
        ours, ours_p = run(getattr(hg, name), {**kw, "capturable": True})
        torch.set_default_dtype(torch.float64)
        ref, ref_p = run(getattr(torch.optim, name), {**kw, "capturable": True, "foreach": True})  # CUDA's default
    finally:
        torch.set_default_dtype(old)
    assert_same(ours_p, ref_p, tol=1e-12)
    for p_o, p_r in zip(ours_p, ref_p, strict=True):
        s_o, s_r = ours.state[p_o], ref.state[p_r]
        assert set(s_o) == set(s_r)
        assert s_o["step"].dtype == s_r["step"].dtype == torch.float64
        assert s_o["step"].item() == s_r["step"].item() == 150
        for k in s_o:
            assert rel_ok(s_o[k], s_r[k]), k


def rel_ok(a, b, tol=1e-12):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item() < tol


@pytest.mark.parametrize("name,kw", CAP_CASES, ids=IDS)
def test_state_dict_moves_between_capturable_and_default(name, kw, float64_default):
    """A default-path state loaded into a capturable optimizer (and back) continues the same trajectory."""
    a, a_p = run(getattr(hg, name), kw, steps=30)
    sd = copy.deepcopy(a.state_dict())
    snap = [p.clone() for p in a_p]
    for t in range(30, 60):
        set_grads(a_p, t)
        a.step()
    for capturable in (True, False):
        params = [p.clone() for p in snap]
        b = getattr(hg, name)(params, **kw, capturable=capturable)
        b.load_state_dict(copy.deepcopy(sd))
        for g in b.param_groups:
            g["capturable"] = capturable  # the saved groups came without it; state placement follows the group
        for t in range(30, 60):
            set_grads(params, t)
            b.step()
        assert_same(params, a_p, tol=1e-12)


# -- capture safety ---------------------------------------------------------------------------------------


def meta_params():
    params = [torch.empty(s, device="meta") for s in [(7, 5), (5,), (3, 4, 2)]]
    for p in params:
        p.grad = torch.empty_like(p)
    return params


@pytest.mark.parametrize("name,kw", CAP_CASES, ids=IDS)
def test_capturable_step_has_no_host_traffic(name, kw):
    params = meta_params()
    opt = getattr(hg, name)(params, **kw, capturable=True)
    with HostTraffic() as guard:
        opt.step()
        opt.step()
    assert guard.found == []
    for p in params:
        if "step" in opt.state[p]:
            assert opt.state[p]["step"].device.type == "meta"


@pytest.mark.parametrize("name", ["Adam", "AdamW", "RMSprop", "Adagrad"])
def test_the_guard_catches_the_default_paths_cpu_counters(name):
    kw = {"lr_decay": 0.01} if name == "Adagrad" else {}
    opt = getattr(hg, name)(meta_params(), **kw)
    with HostTraffic() as guard:
        opt.step()
    assert any("CPU tensor" in f for f in guard.found), guard.found


def test_zero_grad_is_torch_optims():
    for cls in (hg.SGD, hg.RMSprop, hg.Adam, hg.AdamW, hg.Adagrad):  # torch's, but for the traceable copy that
        assert cls.zero_grad is hg.HandOptimizer.zero_grad, cls  # torch.compile runs (tests/test_compile.py)
    params = make_params()
    opt = hg.SGD(params, lr=0.1)
    set_grads(params, 0)
    grads = [p.grad for p in params]
    opt.zero_grad(set_to_none=False)  # zeros in place: the same storage
    assert all(p.grad is g and not g.any() for p, g in zip(params, grads, strict=True))
    opt.zero_grad()
    assert all(p.grad is None for p in params)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_clip_grad_norm_stays_on_the_device(norm_type):
    params = meta_params()
    with HostTraffic() as guard:
        total = hg.clip_grad_norm_(params, 1.0, norm_type)
        hg.clip_grad_value_(params, 0.5)
    assert guard.found == [] and total.device.type == "meta" and total.dim() == 0
    with HostTraffic() as guard, pytest.raises(RuntimeError):  # error_if_nonfinite must read the norm back
        hg.clip_grad_norm_(params, 1.0, norm_type, error_if_nonfinite=True)
    assert any("read-back" in f for f in guard.found)


# -- a tensor learning rate ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name,kw", CAP_CASES, ids=IDS)
def test_tensor_lr_follows_a_schedule_on_the_capturable_path(name, kw, float64_default):
    """lr as a 0-d tensor with capturable=True: the kernels read it on the device, and an lr_scheduler fills it in
    place (torch's schedulers fill_ a tensor lr), so a captured graph would follow the schedule: the trajectory
    equals torch.optim's with a float lr and the same schedule.  Adam's tensor betas too."""
    kw = dict(kw)
    lr = kw.pop("lr", 1e-3)
    params = make_params()
    lr_t = torch.tensor(lr, dtype=torch.float64)
    if name in ("Adam", "AdamW"):
        kw["betas"] = tuple(torch.tensor(b, dtype=torch.float64) for b in kw.get("betas", (0.9, 0.999)))
    ours = getattr(hg, name)(params, lr=lr_t, capturable=True, **kw)
    assert ours.param_groups[0]["lr"] is lr_t  # kept as given: the scheduler writes into it
    ref_kw = {k: (tuple(b.item() for b in v) if k == "betas" else v) for k, v in kw.items()}
    ref_p = make_params()
    ref = getattr(torch.optim, name)(ref_p, lr=lr, **ref_kw)
    scheds = [
        torch.optim.lr_scheduler.OneCycleLR(o, max_lr=lr, total_steps=40, cycle_momentum=False) for o in (ours, ref)
    ]
    for t in range(40):
        set_grads(params, t)
        set_grads(ref_p, t)
        ours.step()
        ref.step()
        for s in scheds:
            s.step()
    assert ours.param_groups[0]["lr"] is lr_t and lr_t.item() == pytest.approx(ref.param_groups[0]["lr"], rel=1e-15)
    assert_same(params, ref_p, tol=1e-12)


@pytest.mark.parametrize("name,kw", CAP_CASES, ids=IDS)
def test_tensor_lr_capturable_step_has_no_host_traffic(name, kw):
    """A device-resident lr is read by kernels only.  (The constructor reads a tensor lr's value once, to check it:
    built with a CPU tensor, the group then gets a meta one, as a device run would hold.)  Adam's tensor betas are
    not capture-safe, in torch's form either (its pow and lerp take them as numbers)."""
    params = meta_params()
    opt = getattr(hg, name)(params, **{**kw, "lr": torch.tensor(kw.get("lr", 1e-3))}, capturable=True)
    opt.param_groups[0]["lr"] = torch.empty((), device="meta")
    with HostTraffic() as guard:
        opt.step()
        opt.step()
    assert guard.found == []

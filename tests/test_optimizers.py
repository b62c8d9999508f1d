"""Hand-written optimizers against torch.optim: 150 steps, every option, float64, 1e-10 relative."""

import copy
import itertools
import warnings

import pytest
import torch

import optimizers as hg
from losses import CrossEntropyLoss
from models import Net, PytorchNet
from tests.conftest import rel

f64 = torch.float64
SHAPES = [(7, 5), (5,), (3, 4, 2)]


def grid(**axes):
    keys = list(axes)
    return [dict(zip(keys, vals, strict=True)) for vals in itertools.product(*axes.values())]


CASES = (
    [
        ("SGD", kw)
        for kw in grid(
            lr=[0.05],
            momentum=[0.0, 0.9],
            dampening=[0.0, 0.3],
            nesterov=[False, True],
            weight_decay=[0.0, 0.1],
            maximize=[False, True],
        )
        if not (kw["nesterov"] and (kw["momentum"] == 0 or kw["dampening"] != 0))
    ]
    + [
        ("RMSprop", kw)
        for kw in grid(
            lr=[0.01], momentum=[0.0, 0.9], centered=[False, True], weight_decay=[0.0, 0.1], maximize=[False, True]
        )
    ]
    + [("RMSprop", dict(alpha=0.9, eps=1e-3))]
    + [
        (name, kw)
        for name in ("Adam", "AdamW")
        for kw in grid(lr=[0.01], amsgrad=[False, True], weight_decay=[0.0, 0.1], maximize=[False, True])
    ]
    + [("Adam", dict(betas=(0.5, 0.9), eps=1e-4))]
    + [
        ("Adagrad", kw)
        for kw in grid(
            lr=[0.1],
            lr_decay=[0.0, 0.01],
            weight_decay=[0.0, 0.1],
            initial_accumulator_value=[0.0, 0.2],
            maximize=[False, True],
        )
    ]
)


def make_params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=f64) for s in SHAPES]


def set_grads(params, step, seed=1):
    """Gradients that depend on the parameters (as real ones do) plus seeded noise."""
    g = torch.Generator().manual_seed(seed * 100_000 + step)
    for p in params:
        p.grad = torch.sin(3 * p) + 0.5 * torch.randn(p.shape, generator=g, dtype=f64)


def assert_same(ours, theirs, tol=1e-10, what="param"):
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert rel(a, b) < tol, f"{what} {i}: relative difference {rel(a, b):.3e}"


def run_pair(name, kw, steps=150):
    ours_p, ref_p = make_params(), make_params()
    ours = getattr(hg, name)(ours_p, **kw)
    ref = getattr(torch.optim, name)(ref_p, **kw)
    for t in range(steps):
        set_grads(ours_p, t)
        set_grads(ref_p, t)
        ours.step()
        ref.step()
    return ours, ref, ours_p, ref_p


@pytest.mark.parametrize(
    "name,kw", CASES, ids=[f"{n}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for n, kw in CASES]
)
def test_matches_torch_optim_for_150_steps(name, kw):
    ours, ref, ours_p, ref_p = run_pair(name, kw)
    assert_same(ours_p, ref_p)
    # Interchangeable state: the same keys, and the same values.
    for p_o, p_r in zip(ours_p, ref_p, strict=True):
        s_o, s_r = ours.state[p_o], ref.state[p_r]
        assert set(s_o) == set(k for k, v in s_r.items() if v is not None), (set(s_o), set(s_r))
        for k in s_o:
            if k == "step":
                assert s_o[k].dtype == s_r[k].dtype and s_o[k].item() == s_r[k].item() == 150
            else:
                assert rel(s_o[k], s_r[k]) < 1e-10, k


def test_grads_are_not_modified_by_step():
    params = make_params()
    set_grads(params, 0)
    before = [p.grad.clone() for p in params]
    opt = hg.SGD(params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1, maximize=True)
    opt.step()
    opt.step()
    for p, g in zip(params, before, strict=True):
        assert torch.equal(p.grad, g)


def test_param_groups_with_their_own_lr():
    def build(mod, p):
        return mod.Adam([{"params": p[:1], "lr": 0.1}, {"params": p[1:], "lr": 0.001, "weight_decay": 0.1}], lr=0.5)

    ours_p, ref_p = make_params(), make_params()
    ours, ref = build(hg, ours_p), build(torch.optim, ref_p)
    assert [g["lr"] for g in ours.param_groups] == [0.1, 0.001]
    for t in range(50):
        set_grads(ours_p, t)
        set_grads(ref_p, t)
        ours.step()
        ref.step()
    assert_same(ours_p, ref_p)


def test_add_param_group():
    ours_p, ref_p = make_params(), make_params()
    ours, ref = hg.RMSprop(ours_p[:2], lr=0.01), torch.optim.RMSprop(ref_p[:2], lr=0.01)
    for t in range(60):
        if t == 20:
            ours.add_param_group({"params": ours_p[2:], "lr": 0.05})
            ref.add_param_group({"params": ref_p[2:], "lr": 0.05})
        set_grads(ours_p, t)
        set_grads(ref_p, t)
        ours.step()
        ref.step()
    assert_same(ours_p, ref_p)


@pytest.mark.parametrize("name", ["SGD", "Adam", "Adagrad"])
def test_step_lr_scheduler_drives_ours_like_torch(name):
    kw = {"lr": 0.1, **({"momentum": 0.9} if name == "SGD" else {})}
    ours_p, ref_p = make_params(), make_params()
    ours, ref = getattr(hg, name)(ours_p, **kw), getattr(torch.optim, name)(ref_p, **kw)
    s_o = torch.optim.lr_scheduler.StepLR(ours, step_size=10, gamma=0.5)
    s_r = torch.optim.lr_scheduler.StepLR(ref, step_size=10, gamma=0.5)
    for t in range(45):
        set_grads(ours_p, t)
        set_grads(ref_p, t)
        ours.step()
        ref.step()
        s_o.step()
        s_r.step()
    assert ours.param_groups[0]["lr"] == ref.param_groups[0]["lr"] == 0.1 * 0.5**4
    assert_same(ours_p, ref_p)


def _continue(opt, params, start, steps=40):
    for t in range(start, start + steps):
        set_grads(params, t)
        opt.step()


@pytest.mark.parametrize(
    "name,kw",
    [
        ("SGD", dict(lr=0.05, momentum=0.9)),
        ("RMSprop", dict(momentum=0.5, centered=True)),
        ("Adam", dict(amsgrad=True)),
        ("AdamW", {}),
        ("Adagrad", dict(lr_decay=0.01)),
    ],
)
def test_state_dict_round_trip_and_cross_loading(name, kw):
    """Stop after 30 steps; resume from the state_dict in ours and in torch's, both directions."""
    ours_p, ref_p = make_params(), make_params()
    ours, ref = getattr(hg, name)(ours_p, **kw), getattr(torch.optim, name)(ref_p, **kw)
    _continue(ours, ours_p, 0, 30)
    _continue(ref, ref_p, 0, 30)
    sd_ours, sd_ref = copy.deepcopy(ours.state_dict()), copy.deepcopy(ref.state_dict())
    snap_ours, snap_ref = [p.clone() for p in ours_p], [p.clone() for p in ref_p]

    _continue(ours, ours_p, 30)  # uninterrupted
    _continue(ref, ref_p, 30)
    assert_same(ours_p, ref_p)

    for target_cls, sd, snap in [
        (getattr(hg, name), sd_ours, snap_ours),  # ours -> ours
        (getattr(hg, name), sd_ref, snap_ref),  # torch -> ours
        (getattr(torch.optim, name), sd_ours, snap_ours),
    ]:  # ours -> torch
        params = [p.clone() for p in snap]
        opt = target_cls(params, **kw)
        opt.load_state_dict(copy.deepcopy(sd))
        _continue(opt, params, 30)
        assert_same(params, ref_p)


def test_zero_grad():
    params = make_params()
    opt = hg.Adam(params)
    set_grads(params, 0)
    opt.zero_grad()
    assert all(p.grad is None for p in params)
    set_grads(params, 0)
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in params)


def test_closure_is_called_and_its_loss_returned():
    params = make_params()
    opt = hg.SGD(params, lr=0.1)

    def closure():
        opt.zero_grad()
        loss = sum((p**2).sum() for p in params)
        for p in params:
            p.grad = 2 * p
        return loss

    before = [p.clone() for p in params]
    loss = opt.step(closure)
    assert loss.item() == pytest.approx(sum((b**2).sum().item() for b in before))
    for p, b in zip(params, before, strict=True):
        torch.testing.assert_close(p, 0.8 * b)


def test_parameters_without_grad_are_skipped_and_no_grad_at_all_does_nothing():
    params = make_params()
    opt = hg.Adam(params)
    before = [p.clone() for p in params]
    with pytest.warns(UserWarning, match="no parameter has a gradient.*nothing was updated"):
        opt.step()  # torch.optim does nothing here; handgrad says so once
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.step()  # not said again
    assert all(torch.equal(p, b) for p, b in zip(params, before, strict=True)) and not opt.state
    params[0].grad = torch.ones_like(params[0])
    frozen = [p.clone() for p in params[1:]]
    opt.step()
    assert all(torch.equal(p, f) for p, f in zip(params[1:], frozen, strict=True))
    assert len(opt.state) == 1


def test_works_on_nn_module_parameters():
    torch.manual_seed(0)
    m1 = torch.nn.Linear(4, 3).double()
    m2 = copy.deepcopy(m1)
    o1, o2 = hg.AdamW(m1.parameters(), lr=0.01), torch.optim.AdamW(m2.parameters(), lr=0.01)
    x = torch.randn(8, 4, dtype=f64)
    for _ in range(20):
        for m, o in ((m1, o1), (m2, o2)):
            o.zero_grad()
            (m(x) ** 2).mean().backward()
            o.step()
    assert_same(list(m1.parameters()), list(m2.parameters()))


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda p: hg.SGD(p, lr=-0.1), "SGD: invalid lr -0.1"),
        (lambda p: hg.SGD(p, lr=0.1, momentum=-0.5), "invalid momentum -0.5"),
        (lambda p: hg.SGD(p, lr=0.1, nesterov=True), "nesterov=True requires momentum > 0"),
        (lambda p: hg.SGD(p, lr=0.1, momentum=0.9, dampening=0.1, nesterov=True), "dampening == 0"),
        (lambda p: hg.Adam(p, betas=(1.0, 0.999)), r"invalid beta1 \(betas\[0\]\) 1.0: must be in \[0.0, 1.0\)"),
        (lambda p: hg.AdamW(p, betas=(0.9, -0.1)), r"invalid beta2"),
        (lambda p: hg.Adam(p, betas=0.9), "betas must be a pair"),
        (lambda p: hg.Adam(p, eps=-1e-8), "invalid eps"),
        (lambda p: hg.RMSprop(p, weight_decay=-1), "invalid weight_decay"),
        (lambda p: hg.RMSprop(p, alpha=-0.1), "invalid alpha"),
        (lambda p: hg.Adagrad(p, lr_decay=-1), "invalid lr_decay"),
        (lambda p: hg.Adagrad(p, lr="fast"), "lr must be a number, got 'fast'"),
        (lambda p: hg.Adam(p, lr=float("inf")), "Adam: invalid lr inf: must be finite and >= 0.0"),
        (lambda p: hg.SGD(p, lr=float("nan")), "SGD: invalid lr nan"),
        (lambda p: hg.AdamW(p, eps=float("inf")), "AdamW: invalid eps inf"),
        (lambda p: hg.RMSprop(p, alpha=2), r"RMSprop: invalid alpha 2: must be in \[0.0, 1.0\]"),
        (lambda p: hg.Adam(p, lr=torch.tensor([1e-3, 1e-3])), r"a tensor lr must hold one floating-point element"),
        (lambda p: hg.SGD(p, lr=torch.tensor(-0.1)), "SGD: invalid lr -0.1"),
        (lambda p: hg.Adam(p, lr=torch.tensor(float("inf"))), "Adam: invalid lr inf"),
        (lambda p: hg.Adam(p, betas=(torch.tensor(0.9), 0.999)), "betas must be both numbers or both tensors"),
        (lambda p: hg.Adam(p, betas=(torch.tensor(1.0), torch.tensor(0.9))), r"invalid beta1 \(betas\[0\]\) 1.0"),
        (lambda p: hg.SGD(p, foreach="yes"), "SGD: foreach must be None, True or False, got 'yes'"),
        (lambda p: hg.RMSprop(p, differentiable=True), "RMSprop: differentiable=True is not supported: .*torch.optim"),
        (lambda p: hg.Adagrad(p, fused=True), r"Adagrad: fused=True is not supported: .*foreach"),
    ],
)
def test_invalid_hyper_parameters(make, match):
    with pytest.raises(ValueError, match=match):
        make(make_params())


def test_named_parameters():
    params = make_params()
    opt = hg.Adam([(f"p{i}", p) for i, p in enumerate(params)])
    assert opt.param_groups[0]["param_names"] == ["p0", "p1", "p2"]
    assert all(a is b for a, b in zip(opt.param_groups[0]["params"], params, strict=True))


@pytest.mark.parametrize("name", ["SGD", "RMSprop", "Adam", "AdamW", "Adagrad"])
def test_torch_s_implementation_switches_are_accepted_and_kept(name):
    """foreach None/True/False, differentiable=False and fused None/False (SGD, Adam, AdamW, Adagrad) as torch.optim
    takes them; every choice runs the one vectorised update (tests/test_optim_db.py: bit for bit against torch's)."""
    kws = [dict(foreach=f) for f in (None, True, False)] + [dict(differentiable=False)]
    if name != "RMSprop":
        kws += [dict(fused=None), dict(fused=False)]
    results = []
    for kw in kws:
        params = make_params()
        opt = getattr(hg, name)(params, lr=0.01, **kw)
        for k, v in kw.items():
            assert opt.param_groups[0][k] == v
        for t in range(3):
            set_grads(params, t)
            opt.step()
        results.append(params)
    for params in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(params, results[0], strict=True))


def test_unknown_keyword_is_refused():
    with pytest.raises(TypeError, match="momentun"):
        hg.SGD(make_params(), lr=0.1, momentun=0.9)


def test_get_optimizer():
    params = make_params()
    opt = hg.get_optimizer("AdAm", params, lr=0.01)
    assert isinstance(opt, hg.Adam) and opt.param_groups[0]["lr"] == 0.01
    assert isinstance(hg.get_optimizer("sgd", params, lr=0.1, momentum=0.9), hg.SGD)
    with pytest.raises(ValueError, match="unknown optimizer 'adamax'; known: sgd, rmsprop, adam, adamw, adagrad"):
        hg.get_optimizer("adamax", params)


# -- clipping ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clip_grad_norm_matches_torch(norm_type, max_norm):
    ours, ref = make_params(), make_params()
    set_grads(ours, 3)
    set_grads(ref, 3)
    n_o = hg.clip_grad_norm_(ours, max_norm, norm_type)
    n_r = torch.nn.utils.clip_grad_norm_(ref, max_norm, norm_type)
    assert abs(n_o.item() - n_r.item()) <= 1e-12 * n_r.item()
    assert_same([p.grad for p in ours], [p.grad for p in ref], tol=1e-12, what="grad")


def test_clip_grad_norm_nonfinite():
    params = make_params()
    set_grads(params, 0)
    params[1].grad[0] = float("inf")
    with pytest.raises(RuntimeError, match="non-finite"):
        hg.clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
    with pytest.raises(ValueError, match="max_norm must be >= 0"):
        hg.clip_grad_norm_(params, -1.0)


def test_clip_grad_value_matches_torch():
    ours, ref = make_params(), make_params()
    set_grads(ours, 4)
    set_grads(ref, 4)
    hg.clip_grad_value_(ours, 0.3)
    torch.nn.utils.clip_grad_value_(ref, 0.3)
    for a, b in zip(ours, ref, strict=True):
        assert torch.equal(a.grad, b.grad)
    with pytest.raises(ValueError, match="clip_value must be >= 0"):
        hg.clip_grad_value_(ours, -1)


# -- end to end ----------------------------------------------------------------------------------------


def test_default_net_with_our_adam_equals_twin_with_torch_adam():
    """20 steps of the default Net (hand-written backward + our Adam) vs PytorchNet (autograd + torch Adam)."""
    torch.manual_seed(0)
    net = Net(dtype=f64)
    twin = PytorchNet(dtype=f64)
    twin.load_state_dict(net.state_dict())
    opt, ref_opt = hg.Adam(net.parameters(), lr=1e-3), torch.optim.Adam(twin.parameters(), lr=1e-3)
    crit = CrossEntropyLoss()
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        x = torch.randn(32, 1, 28, 28, generator=g, dtype=f64)
        y = torch.randint(0, 10, (32,), generator=g)
        opt.zero_grad()
        loss = crit(net(x), y)
        net.backward(crit.backward(), need_input_grad=False)
        opt.step()
        ref_opt.zero_grad()
        ref_loss = torch.nn.functional.cross_entropy(twin(x), y)
        ref_loss.backward()
        ref_opt.step()
        assert abs(loss.item() - ref_loss.item()) <= 1e-8 * abs(ref_loss.item())
    ours = net.state_dict()
    for k, v in twin.state_dict().items():
        assert rel(ours[k], v) < 1e-8, k

"""torch's own optimizer test inputs, run through handgrad's optimizers beside torch.optim's.

``torch.testing._internal.common_optimizers.optim_db`` holds torch's OptimizerInfo for each optimizer; with the
implementation switches torch's own tests add (``_get_optim_inputs_including_global_cliquey_kwargs``, for the
"cuda" device: its list is the longest, with foreach=True and capturable inputs) it gives 177 constructor inputs
for SGD, RMSprop, Adam, AdamW and Adagrad.  Each one here builds torch's optimizer and handgrad's from the same
arguments on the same float64 parameters (on the CPU), takes 10 steps with the same gradients, and requires:

* bit-for-bit equal parameters and state against torch's foreach (multi-tensor) implementation, which
  handgrad's update transcribes and runs whatever ``foreach`` says (torch is run a second time with
  foreach=True where the input asks for another implementation) -- except Adam/AdamW's default
  (non-capturable) path, which folds sqrt(1 - beta2^t) into the step size and eps (one pass over the parameters
  fewer than torch's form): the same update rounded differently, held to 1e-13 relative (float64, 10 steps);
* against torch's implementation the input selects (foreach False/None: torch's per-tensor code), the same
  where torch's two implementations agree to the bit, and otherwise no further from it than twice torch's own
  foreach implementation is: torch's per-tensor capturable Adam computes its bias corrections in a different
  order (6e-17 relative after 10 steps with the float64 counters used here; 1.3e-10 with float32 ones), and
  its per-tensor RMSprop reads a tensor lr as a number where the foreach form divides by it on the device
  (1 ulp);
* a ValueError naming the argument for ``differentiable=True`` and ``fused=True``, which handgrad refuses (its
  update is hand-written outside autograd, and it is the foreach one): those inputs are the only ones not run.

torch refuses capturable=True on the CPU in a device check only; the check is lifted for torch (as in
tests/test_capturable.py), its arithmetic untouched.  torch's capturable step counters follow the default dtype
(float32 here), handgrad's the parameter's (float64: optimizers/base.py, step_dtype), so torch runs the
capturable inputs under a float64 default, where its counters are float64 too.  torch's testing package imports
``expecttest``, a test-only dependency; where it is not installed a stand-in module (its TestCase is unittest's, all
that the import needs) is registered before the import.  Without torch's testing package the module is skipped, saying
so.
"""

import importlib
import sys
import types
import unittest

import pytest
import torch

import optimizers as hg
from tests.test_optimizers import make_params, set_grads

CLASSES = ("SGD", "RMSprop", "Adam", "AdamW", "Adagrad")
STEPS = 10
FOLDED_TOL = 1e-13


def _optim_db_inputs():
    """(class name, desc, kwargs) for every optim_db input of the five classes, or a reason why there are none."""
    try:
        importlib.import_module("expecttest")
    except ImportError:
        stand_in = types.ModuleType("expecttest")
        stand_in.TestCase = unittest.TestCase
        sys.modules["expecttest"] = stand_in
    try:
        from torch.testing._internal.common_optimizers import (
            _get_optim_inputs_including_global_cliquey_kwargs,
            optim_db,
        )
    except Exception as e:  # noqa: BLE001 -- any failure to import torch's test internals means: nothing to run
        return [], f"torch.testing._internal.common_optimizers cannot be imported: {type(e).__name__}: {e}"
    cases = []
    for info in optim_db:
        name = info.optim_cls.__name__
        if info.optim_cls is getattr(torch.optim, name, None) and name in CLASSES:
            for inp in _get_optim_inputs_including_global_cliquey_kwargs("cuda", torch.float64, info):
                cases.append((name, inp.desc, dict(inp.kwargs)))
    return cases, ""


CASES, WHY_NONE = _optim_db_inputs()


def test_optim_db_has_torch_s_inputs():
    if WHY_NONE:
        pytest.skip(WHY_NONE)
    counts = {n: sum(c[0] == n for c in CASES) for n in CLASSES}
    assert all(counts.values()), counts  # every class has inputs (torch 2.14.1: 177 in all)


def refused(kwargs) -> str | None:
    if kwargs.get("differentiable"):
        return "differentiable=True is not supported"
    if kwargs.get("fused"):
        return "fused=True is not supported"
    return None


def folded(name, kwargs) -> bool:
    """Adam/AdamW's default path: the same update as torch's, rounded differently (see the docstring)."""
    return name in ("Adam", "AdamW") and not kwargs.get("capturable")


def rel(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def run(cls, kwargs):
    params = make_params()
    opt = cls(params, **kwargs)
    for t in range(STEPS):
        set_grads(params, t)
        opt.step()
    return opt, params


def lift_capturable_device_check(monkeypatch):
    for mod in ("torch.optim.adam", "torch.optim.rmsprop", "torch.optim.adagrad", "torch.optim.sgd"):
        mod = importlib.import_module(mod)
        if hasattr(mod, "_get_capturable_supported_devices"):
            monkeypatch.setattr(mod, "_get_capturable_supported_devices", lambda *a, **k: ["cpu", "cuda"])


@pytest.mark.parametrize("name,desc,kwargs", CASES, ids=[f"{n}-{d}-{i}" for i, (n, d, _) in enumerate(CASES)])
def test_optim_db_input_matches_torch_optim(name, desc, kwargs, monkeypatch):
    why = refused(kwargs)
    if why is not None:
        with pytest.raises(ValueError, match=f"{name}: {why}"):
            getattr(hg, name)(make_params(), **kwargs)
        return
    lift_capturable_device_check(monkeypatch)
    ours, ours_p = run(getattr(hg, name), kwargs)
    old_default = torch.get_default_dtype()
    if kwargs.get("capturable"):  # torch's capturable counters follow the default dtype, ours the parameters'
        torch.set_default_dtype(torch.float64)
    try:
        ref, ref_p = run(getattr(torch.optim, name), kwargs)
        vec, vec_p = (
            (ref, ref_p)
            if kwargs.get("foreach") is True
            else run(getattr(torch.optim, name), {**kwargs, "foreach": True})
        )
    finally:
        torch.set_default_dtype(old_default)

    # torch's foreach implementation: the same to the bit, or within float64 rounding where Adam folds.
    tol = FOLDED_TOL if folded(name, kwargs) else 0.0
    for i, (a, b) in enumerate(zip(ours_p, vec_p, strict=True)):
        assert rel(a, b) <= tol, f"param {i} vs torch's foreach path: relative difference {rel(a, b):.3e} > {tol}"
    for p_o, p_v in zip(ours_p, vec_p, strict=True):
        s_o, s_v = ours.state[p_o], vec.state[p_v]
        assert set(s_o) == {k for k, v in s_v.items() if v is not None}, (set(s_o), set(s_v))
        for k in s_o:
            a, b = s_o[k], s_v[k]
            assert a.dtype == b.dtype and a.device == b.device, k
            assert rel(a, b) <= (0.0 if k == "step" else tol), k

    # The implementation the input selects: no further from it than torch's own foreach implementation is.
    gap = max(rel(v, r) for v, r in zip(vec_p, ref_p, strict=True))
    for i, (a, b) in enumerate(zip(ours_p, ref_p, strict=True)):
        assert rel(a, b) <= max(2 * gap, tol), f"param {i} vs torch as given: {rel(a, b):.3e} (torch's gap {gap:.3e})"

    # The same param_group keys as torch's (foreach, differentiable, fused, capturable, ... included), except
    # handgrad's capturable flag where torch.optim has none (SGD, Adagrad).
    extra = {"capturable"} if name in ("SGD", "Adagrad") else set()
    assert set(ours.param_groups[0]) - extra == set(ref.param_groups[0]), name

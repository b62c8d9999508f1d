"""``train.py --sanity``: the checks a careful practitioner runs before a long run, as a pass/fail table.

1. The initial loss is close to ln(C) for C classes (within 10%): the untrained model guesses uniformly.
2. The model overfits 20 training examples to 100% training accuracy within a bounded number of steps.
3. The hand-written gradients of the actual model on a small float64 batch match autograd's (the twin's) to 1e-7.
4. The hand-written model and its twin give the same first-step loss (to the dtype's rounding).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F

from layers import Sequential
from losses import CrossEntropyLoss
from optimizers import Adam

from .config import TrainConfig
from .device import resolve_device
from .errors import UsageError
from .impls.models import SAMPLE_SHAPES, build_models, use_generator
from .tasks.image_data import load_data
from .threads import use_threads

CLASSES = 10
OVERFIT_SAMPLES, OVERFIT_STEPS = 20, 300
GRAD_RTOL = 1e-7


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def _manual(config: TrainConfig, device) -> Sequential:
    c = config.replace(impl="manual")
    return cast(Sequential, build_models(c.model, c.run, device, c.run.torch_dtype)["manual"])  # a Net or the CNN


def _initial_loss(config, device, x, y) -> tuple[float, bool, str]:
    manual = _manual(config, device)
    manual.eval()
    loss = CrossEntropyLoss()(manual(x), y).item()
    target = math.log(CLASSES)
    return loss, abs(loss - target) <= 0.1 * target, f"ln({CLASSES}) = {target:.3f} +- 10%"


def _overfit(config, device, x, y) -> tuple[float, bool, str]:
    manual = _manual(config, device)
    opt, crit = Adam(manual.parameters(), lr=1e-3), CrossEntropyLoss()
    x, y = x[:OVERFIT_SAMPLES], y[:OVERFIT_SAMPLES]
    for step in range(1, OVERFIT_STEPS + 1):
        manual.train()
        opt.zero_grad()
        crit(manual(x), y)
        manual.backward(crit.backward())
        opt.step()
        if step % 10 == 0:
            manual.eval()
            acc = (manual(x).argmax(1) == y).double().mean().item()
            if acc == 1.0:
                return float(step), True, f"100% of {OVERFIT_SAMPLES} in <= {OVERFIT_STEPS} steps"
    return float("inf"), False, f"100% of {OVERFIT_SAMPLES} in <= {OVERFIT_STEPS} steps"


def _first_step(config, device, x, y) -> dict[str, float]:
    """One forward and backward of the hand-written model and its twin -> losses and gradients by name."""
    c = config.replace(impl="both")
    models = build_models(c.model, c.run, device, c.run.torch_dtype)
    manual, twin = cast(Sequential, models["manual"]), cast(torch.nn.Module, models["torch"])
    for m in (manual, twin):
        use_generator(m, torch.Generator(device=device).manual_seed(c.run.seed))  # the same dropout masks
    crit = CrossEntropyLoss()
    loss_m = crit(manual(x), y)
    manual.backward(crit.backward())
    loss_t = F.cross_entropy(twin(x), y)
    loss_t.backward()
    twin_params = dict(twin.named_parameters())
    worst = 0.0
    for name, p in manual.named_parameters():  # the same names, shapes and layouts as the twin's
        grad, twin_grad = cast(torch.Tensor, p.grad), cast(torch.Tensor, twin_params[name].grad)  # both backwards ran
        worst = max(worst, _rel(grad, twin_grad))
    return {"loss_manual": loss_m.item(), "loss_torch": loss_t.item(), "worst_grad": worst}


def run_sanity(config: TrainConfig, say: Callable = print) -> int:
    """Run the four checks on the configured model and data; print the table; 0 if all pass, else 1."""
    model, run = config.model.name, config.run
    if config.is_text:
        raise UsageError(
            f"--sanity checks the image models; for --model {model} run python gradcheck.py "
            f"(every hand-written backward of the language models against autograd in float64) and "
            f"read a run's first-step agreement line"
        )
    use_threads(run.threads)
    device = resolve_device(run.device)
    data = load_data(
        config.data, device, run.torch_dtype, lambda *a, **k: None, sample_shape=SAMPLE_SHAPES[model], seed=run.seed
    )
    x, y = data.train_x[:256], data.train_y[:256]
    rows = []
    value, ok, want = _initial_loss(config, device, x, y)
    rows.append(("initial loss", f"{value:.4f}", want, ok))
    value, ok, want = _overfit(config, device, x, y)
    rows.append(("overfit 20 examples", f"{value:.0f} steps" if ok else "never", want, ok))
    f64 = config.replace(dtype="float64")
    g = _first_step(f64, device, x[:16].double(), y[:16])
    rows.append(
        (
            "gradients vs autograd (float64)",
            f"{g['worst_grad']:.2e}",
            f"<= {GRAD_RTOL:g} relative",
            g["worst_grad"] <= GRAD_RTOL,
        )
    )
    s = _first_step(config, device, x[:64], y[:64])
    tol = 1e-12 if run.dtype == "float64" else 1e-5
    diff = abs(s["loss_manual"] - s["loss_torch"]) / abs(s["loss_torch"])
    run_dtype = str(run.torch_dtype).removeprefix("torch.")  # a mixed-precision run's model is float32 here
    rows.append((f"first-step loss, manual vs twin ({run_dtype})", f"{diff:.2e}", f"<= {tol:g} relative", diff <= tol))
    width = max(len(r[0]) for r in rows)
    say(
        f"sanity checks: --model {model}, --dataset {config.data.dataset}, {device}"
        f"{f' (--dtype {run.dtype}: checked on the float32 model and master weights)' if run.is_mixed else ''}"
    )
    say(f"{'check':<{width}}  {'measured':>14}  {'required':<26} result")
    for name, measured, want, ok in rows:
        say(f"{name:<{width}}  {measured:>14}  {want:<26} {'PASS' if ok else 'FAIL'}")
    passed = all(r[3] for r in rows)
    say("all checks passed" if passed else "some checks FAILED")
    return 0 if passed else 1

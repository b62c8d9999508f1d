"""Pipeline parallelism: the schedules (GPipe, 1F1B, ZB-H1) as action lists -- each F, B and W once per
micro-batch, W after its B, in micro-batch order, no deadlock, the unit-cost timeline's bubble equal to the
formulas -- and the GPT on 2 gloo stages with 4 micro-batches under each schedule equal to one process in float64
(two AdamW steps' losses and final weights to 1e-9 relative, the tied table's two copies equal), as is the twin,
torch.distributed.pipelining's ScheduleGPipe and Schedule1F1B."""

import pytest
import torch

from losses import CrossEntropyLoss
from models.gpt import GPT
from optimizers import AdamW
from tests.spawn_ranks import spawn_ranks
from training.parallel.pipeline_schedules import (
    SCHEDULES,
    actions,
    bubble,
    bubble_formula,
    compute_order,
    render,
    timeline,
)

f64 = torch.float64
V, M, STEPS = 11, 4, 2
CFG = dict(vocab_size=V, block_size=8, n_layer=2, n_head=2, n_embd=16, dtype=f64)
TOL = 1e-9


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (4, 8), (3, 5), (4, 2)])
def test_a_schedule_runs_each_pass_once_in_order_and_its_bubble_is_the_formulas(schedule, p, m):
    for s in range(p):
        order = compute_order(schedule, s, p, m)
        assert sorted(order) == sorted((op, i) for op in "FBW" for i in range(m))
        assert [i for op, i in order if op == "W"] == list(range(m))  # W's in micro-batch order
        assert [i for op, i in order if op == "B"] == list(range(m))
        assert all(order.index(("B", i)) < order.index(("W", i)) for i in range(m))
        acts = actions(schedule, s, p, m)
        assert sum(op == "recv_act" for op, _ in acts) == (m if s > 0 else 0)
        assert sum(op == "send_grad" for op, _ in acts) == (m if s > 0 else 0)
        if schedule != "gpipe":  # 1F1B's memory bound: at most P - s micro-batches between F and B
            live = [
                sum(1 for op, _ in order[: k + 1] if op == "F") - sum(1 for op, _ in order[: k + 1] if op == "B")
                for k in range(len(order))
            ]
            assert max(live) <= p - s
    if schedule != "zb-h1" or m >= p:  # ZB-H1's formula assumes M >= P
        assert bubble(schedule, p, m) == pytest.approx(bubble_formula(schedule, p, m), abs=1e-12)
    assert f"stage {p - 1} |" in render(schedule, p, m)


def test_zb_h1_idles_a_third_of_1f1b():
    """Idle units per stage: 1F1B 3 (P-1) (F + B + W of P-1 micro-batches), ZB-H1 P-1 (only the F's)."""
    for p, m in [(2, 4), (4, 8), (8, 16)]:
        for schedule, idle in (("1f1b", 3 * (p - 1)), ("zb-h1", p - 1)):
            span = max(t for row in timeline(schedule, p, m) for t, _, _ in row) + 1
            assert span - 3 * m == idle


def batches():
    g = torch.Generator().manual_seed(5)
    return [(torch.randint(0, V, (M, 8), generator=g), torch.randint(0, V, (M, 8), generator=g)) for _ in range(STEPS)]


def one_process():
    torch.manual_seed(0)
    m = GPT(**CFG)
    opt, crit, losses = AdamW(m.parameters(), lr=1e-2), CrossEntropyLoss(), []
    for x, y in batches():
        m.zero_grad()
        logits = m(x)
        losses.append(float(crit(logits.reshape(-1, V), y.reshape(-1))))
        m.backward(crit.backward().view_as(logits))
        opt.step()
    return losses, {n: p.detach().clone() for n, p in m.named_parameters()}


def hand_written(rank, world):
    from training.parallel.pipeline_gpt import GPTStage
    from training.parallel.pipeline_runtime import format_trace, run_schedule

    out = {}
    for schedule in SCHEDULES:
        torch.manual_seed(0)
        stage = GPTStage(GPT(**CFG), rank, world)
        opt, losses = AdamW(stage.parameters(), lr=1e-2), []
        for x, y in batches():
            stage.zero_grad()
            mb_losses, trace = run_schedule(
                stage,
                schedule,
                list(x.split(1)) if stage.first else None,
                list(y.split(1)) if stage.last else None,
                (1, 8, 16),
            )
            stage.tie_gradients(None)
            opt.step()
            losses.append(sum(mb_losses) / M if stage.last else None)
        weights = {n: p.detach().clone() for n, p in stage.named_parameters()}  # the last stage's copy as "head"
        out[schedule] = (losses, weights, format_trace(rank, trace))
    return out


def twin(rank, world):
    from training.parallel.verify.pipeline_twin import TWIN_SCHEDULES, TwinStage, twin_schedule

    out = {}
    for schedule in TWIN_SCHEDULES:
        torch.manual_seed(0)
        module = TwinStage(GPT(**CFG).to_torch(), rank, world)
        run = twin_schedule(module, schedule, rank, world, M)
        opt, losses = torch.optim.AdamW(module.parameters(), lr=1e-2), []
        for x, y in batches():
            opt.zero_grad()
            mb_losses = []
            run.step(x) if module.first else run.step(target=y, losses=mb_losses)
            module.tie_gradients()
            opt.step()
            losses.append(float(sum(mb_losses)) / M if module.last else None)
        names = {
            "lm_head.weight": "transformer.wte.weight (the last stage's copy)",
            "wte.weight": "transformer.wte.weight",
            "wpe.weight": "transformer.wpe.weight",
            "ln_f.weight": "transformer.ln_f.weight",
            "ln_f.bias": "transformer.ln_f.bias",
        }
        per = CFG["n_layer"] // world
        weights = {}
        for n, p in module.named_parameters():
            if n.startswith("h."):
                i, rest = n[2:].split(".", 1)
                n = f"transformer.h.{rank * per + int(i)}.{rest}"
            weights[names.get(n, n)] = p.detach().clone()
        out[schedule] = (losses, weights)
    return out


def both(rank, world):
    return {"hand": hand_written(rank, world), "twin": twin(rank, world)}


@pytest.mark.slow  # two processes
def test_two_pipeline_stages_equal_one_process_under_every_schedule_hand_written_and_twin():
    results = spawn_ranks(both, 2)
    losses, weights = one_process()
    for side, schedule in [("hand", s) for s in SCHEDULES] + [("twin", "gpipe"), ("twin", "1f1b")]:
        seen = {}
        for rank in (0, 1):
            got, w, *trace = results[rank][side][schedule]
            if side == "hand":
                assert trace[0].startswith(f"rank {rank}: ") and " W3@" in trace[0]
                if rank == 1:
                    w["transformer.wte.weight (the last stage's copy)"] = w.pop("head")
            if rank == 1:
                assert max(abs(a - b) / abs(b) for a, b in zip(got, losses, strict=True)) < TOL, (
                    side,
                    schedule,
                    got,
                    losses,
                )
            seen.update(w)
        for name, t in seen.items():
            ref = weights[name.split(" ")[0]]
            assert ((t - ref).abs().max() / ref.abs().max()).item() < TOL, (side, schedule, name)
        assert {n.split(" ")[0] for n in seen} == weights.keys() and len(seen) == len(weights) + 1


def test_the_timeline_png_is_written(tmp_path):
    from PIL import Image

    from training.parallel.verify.pipeline_plot import write_timeline_png

    path = write_timeline_png(tmp_path / "zb-h1.png", "zb-h1", 4, 8)
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size[0] > im.size[1] > 100

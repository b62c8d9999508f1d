"""Pipeline parallelism: the schedules (GPipe, 1F1B, ZB-H1, interleaved 1F1B, ZB-V) as action lists -- each F, B
and W once per micro-batch and stage, W after its B, in micro-batch order, no deadlock, the unit-cost timeline's
bubble equal to the formulas, interleaved 1F1B's and ZB-V's lists torch's own -- and the GPT on 2 gloo ranks with 4
micro-batches under each schedule equal to one process in float64 (two AdamW steps' losses and final weights to
1e-9 relative, the tied table's two copies equal), as is the twin, torch.distributed.pipelining's ScheduleGPipe,
Schedule1F1B, ScheduleInterleaved1F1B and ScheduleZBVZeroBubble."""

from types import SimpleNamespace

import pytest
import torch

from losses import CrossEntropyLoss
from models.gpt import GPT
from optimizers import AdamW
from tests.spawn_ranks import spawn_ranks
from training.parallel.pipeline_schedules import (
    actions,
    bubble,
    bubble_formula,
    check_schedule,
    chunks_per_rank,
    compute_order,
    rank_of,
    render,
    stage_of,
    timeline,
)

f64 = torch.float64
V, M, STEPS = 11, 4, 2
CFG = dict(vocab_size=V, block_size=8, n_layer=4, n_head=2, n_embd=16, dtype=f64)
TOL = 1e-9
RUNS = [("gpipe", 1), ("1f1b", 1), ("zb-h1", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 3), ("zb-v", 2)]


def counts_divide(schedule, p, m, v):
    try:
        check_schedule(schedule, p, m, v)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("schedule,v", RUNS)
@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (4, 8), (3, 5), (4, 2), (2, 1), (3, 6), (4, 12)])
def test_a_schedule_runs_each_pass_once_in_order_and_its_bubble_is_the_formulas(schedule, v, p, m):
    if not counts_divide(schedule, p, m, v):
        pytest.skip("counts the schedule refuses (tested below)")
    V_ = chunks_per_rank(schedule, v)
    for r in range(p):
        stages = [stage_of(schedule, r, c, p) for c in range(V_)]
        assert all(rank_of(schedule, s, p) == r for s in stages)
        order = compute_order(schedule, r, p, m, v)
        assert sorted(order) == sorted((op, i, s) for op in "FBW" for i in range(m) for s in stages)
        for s in stages:
            for op in "FBW":  # each stage's F's, B's and W's in micro-batch order
                assert [i for o, i, t in order if (o, t) == (op, s)] == list(range(m))
            assert all(order.index(("F", i, s)) < order.index(("B", i, s)) < order.index(("W", i, s)) for i in range(m))
        acts = actions(schedule, r, p, m, v)
        crossing = [s for s in stages if s > 0 and rank_of(schedule, s - 1, p) != r]  # stages fed by another rank
        assert sum(op == "recv_act" for op, _, _ in acts) == m * len(crossing)
        assert sum(op == "send_grad" for op, _, _ in acts) == m * len(crossing)
        for k, (op, i, s) in enumerate(acts):  # a receive right before the pass that reads it, a send right after
            if op.startswith("recv"):
                assert acts[k + 1] == ("F" if op == "recv_act" else "B", i, s)
            if op == "send_act":
                assert acts[k - 1] == ("F", i, s)
        if schedule in ("1f1b", "zb-h1"):  # 1F1B's memory bound: at most P - r micro-batches between F and B
            live = [
                sum(1 for op, _, _ in order[: k + 1] if op == "F") - sum(1 for op, _, _ in order[: k + 1] if op == "B")
                for k in range(len(order))
            ]
            assert max(live) <= p - r
    line = timeline(schedule, p, m, v)  # runs without deadlock: every action waited only for what it needs
    assert sum(len(row) for row in line) == 3 * m * p * V_
    formula_holds = {"zb-h1": m >= p, "interleaved-1f1b": m >= p, "zb-v": m >= 2 * p - 1}.get(schedule, True)
    if formula_holds:
        assert bubble(schedule, p, m, v) == pytest.approx(bubble_formula(schedule, p, m, v), abs=1e-12)
    assert f"rank {p - 1} |" in render(schedule, p, m, v)


def test_zb_h1_idles_a_third_of_1f1b_and_zb_v_a_half_of_zb_h1_and_interleaving_divides_1f1bs_by_v():
    """Idle units per rank, one unit a chunk's pass: 1F1B 3 (P-1) (F + B + W of P-1 micro-batches), ZB-H1 P-1 (only
    the F's), ZB-V P-1 as well but in units of half a stage, interleaved 1F1B 3 (P-1) in units of 1/V of a stage."""
    for p, m in [(2, 4), (4, 8), (8, 16)]:
        for schedule, v, idle in (("1f1b", 1, 3 * (p - 1)), ("zb-h1", 1, p - 1), ("zb-v", 2, p - 1)) + tuple(
            ("interleaved-1f1b", v, 3 * (p - 1)) for v in (2, 4)
        ):
            span = max(t for row in timeline(schedule, p, m, v) for t, *_ in row) + 1
            assert span - 3 * m * chunks_per_rank(schedule, v) == idle, (schedule, p, m, v)


def torch_order(cls, fields, rank):
    """torch's list for ``rank`` (its schedule's own builder, run on the fields it reads), as (op, micro-batch,
    stage) with its whole backward written B, W."""
    ops = {"F": ["F"], "I": ["B"], "W": ["W"], "B": ["B", "W"]}
    built = cls._calculate_single_rank_operations(SimpleNamespace(**fields), rank)
    return [
        (o, a.microbatch_index, a.stage_index) for a in built if a is not None for o in ops[a.computation_type.value]
    ]


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 8, 9, 12, 16])
def test_interleaved_1f1b_and_zb_v_lists_are_torchs(p, m):
    from torch.distributed.pipelining import ScheduleInterleaved1F1B, ScheduleZBVZeroBubble

    for v in (2, 3, 4):
        if counts_divide("interleaved-1f1b", p, m, v):
            rounds = max(1, m // p)
            fields = dict(n_local_stages=v, microbatches_per_round=m // rounds, pp_group_size=p, _n_microbatches=m)
            for r in range(p):
                assert compute_order("interleaved-1f1b", r, p, m, v) == torch_order(ScheduleInterleaved1F1B, fields, r)
    for r in range(p):
        fields = dict(pp_group_size=p, num_stages=2 * p, _n_microbatches=m)
        assert compute_order("zb-v", r, p, m) == torch_order(ScheduleZBVZeroBubble, fields, r)


@pytest.mark.parametrize(
    "schedule,p,m,v,words",
    [
        ("interleaved-1f1b", 2, 4, 1, "--virtual-stages V >= 2"),
        ("interleaved-1f1b", 4, 9, 2, "--micro-batches 9 does not divide into 2 equal rounds"),
        ("zb-v", 2, 4, 3, "--virtual-stages 3 applies to --schedule interleaved-1f1b"),
        ("1f1b", 2, 4, 2, "--virtual-stages 2 applies to --schedule interleaved-1f1b"),
        ("zb-h2", 2, 4, 1, "unknown pipeline schedule 'zb-h2'"),
    ],
)
def test_counts_a_schedule_cannot_run_are_refused_in_one_line(schedule, p, m, v, words):
    with pytest.raises(ValueError, match=words) as err:
        compute_order(schedule, 0, p, m, v)
    assert "\n" not in str(err.value)


def test_a_stage_count_that_does_not_divide_the_layers_is_refused():
    from training.parallel.pipeline_chunks import StageChunks
    from training.parallel.pipeline_gpt import GPTStage

    gpt = GPT(**{**CFG, "n_layer": 6})
    with pytest.raises(ValueError, match="n_layer 6 does not divide by 8 stages"):
        StageChunks(lambda s, n: GPTStage(gpt, s, n), "interleaved-1f1b", 0, 2, 4)


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


def hand_written(rank, world, runs):
    from training.parallel.pipeline_chunks import StageChunks
    from training.parallel.pipeline_gpt import GPTStage
    from training.parallel.pipeline_runtime import format_trace, run_schedule

    out = {}
    for schedule, v in runs:
        torch.manual_seed(0)
        gpt = GPT(**CFG)
        part = (
            GPTStage(gpt, rank, world)
            if chunks_per_rank(schedule, v) == 1
            else StageChunks(lambda s, n: GPTStage(gpt, s, n), schedule, rank, world, v)  # noqa: B023
        )
        opt, losses = AdamW(part.parameters(), lr=1e-2), []
        for x, y in batches():
            part.zero_grad()
            mb_losses, trace = run_schedule(
                part,
                schedule,
                list(x.split(1)) if part.first else None,
                list(y.split(1)) if part.last or not part.first else None,  # a middle rank counts M from them
                (1, 8, 16),
            )
            part.tie_gradients(None)
            opt.step()
            losses.append(sum(mb_losses) / M if part.last else None)
        weights = {n: p.detach().clone() for n, p in part.named_parameters()}  # the last stage's copy as "head"
        out[schedule, v] = (losses, weights, format_trace(rank, trace))
    return out


def twin(rank, world, runs):
    from training.parallel.verify.pipeline_twin import tie_gradients, twin_schedule, twin_stages

    out = {}
    for schedule, v in runs:
        torch.manual_seed(0)
        modules = twin_stages(GPT(**CFG).to_torch(), schedule, rank, world, v)
        run = twin_schedule(modules, schedule, M)
        first, last = any(m.first for m in modules), any(m.last for m in modules)
        params = [p for m in modules for p in m.parameters()]
        opt, losses = torch.optim.AdamW(params, lr=1e-2), []
        for x, y in batches():
            opt.zero_grad()
            mb_losses: list = []
            run.step(*[x] * first, **dict(target=y, losses=mb_losses) if last else {})
            tie_gradients(modules)
            opt.step()
            losses.append(float(sum(mb_losses)) / M if last else None)
        names = {
            "lm_head.weight": "transformer.wte.weight (the last stage's copy)",
            "wte.weight": "transformer.wte.weight",
            "wpe.weight": "transformer.wpe.weight",
            "ln_f.weight": "transformer.ln_f.weight",
            "ln_f.bias": "transformer.ln_f.bias",
        }
        weights = {}
        for module in modules:
            per = CFG["n_layer"] // module.stages
            for n, p in module.named_parameters():
                if n.startswith("h."):
                    i, rest = n[2:].split(".", 1)
                    n = f"transformer.h.{module.stage * per + int(i)}.{rest}"
                weights[names.get(n, n)] = p.detach().clone()
        out[schedule, v] = (losses, weights)
    return out


def both(rank, world, runs):
    from training.parallel.verify.pipeline_twin import TWIN_SCHEDULES

    return {
        "hand": hand_written(rank, world, runs),
        "twin": twin(rank, world, [r for r in runs if r[0] in TWIN_SCHEDULES]),
    }


def assert_equal_to_one_process(results, runs, twins):
    losses, weights = one_process()
    for side, run in [("hand", r) for r in runs] + [("twin", r) for r in twins]:
        seen, reported = {}, []
        for rank in (0, 1):
            got, w, *trace = results[rank][side][run]
            if side == "hand":
                assert trace[0].startswith(f"rank {rank}: ") and " W3" in trace[0]
                if "head" in w:
                    w["transformer.wte.weight (the last stage's copy)"] = w.pop("head")
            if got[0] is not None:  # the rank holding the last stage
                reported.append(rank)
                assert max(abs(a - b) / abs(b) for a, b in zip(got, losses, strict=True)) < TOL, (side, run, got)
            seen.update(w)
        assert reported == [0 if run[0] == "zb-v" else 1], (side, run)  # ZB-V's V ends on rank 0
        for name, t in seen.items():
            ref = weights[name.split(" ")[0]]
            assert ((t - ref).abs().max() / ref.abs().max()).item() < TOL, (side, run, name)
        assert {n.split(" ")[0] for n in seen} == weights.keys() and len(seen) == len(weights) + 1


@pytest.mark.slow  # two processes
def test_two_pipeline_stages_equal_one_process_under_gpipe_1f1b_zb_h1_hand_written_and_twin():
    runs = [("gpipe", 1), ("1f1b", 1), ("zb-h1", 1)]
    assert_equal_to_one_process(spawn_ranks(both, 2, runs), runs, runs[:2])  # the twin: torch's GPipe and 1F1B


@pytest.mark.slow  # two processes
def test_two_ranks_of_several_stages_equal_one_process_under_interleaved_1f1b_and_zb_v_hand_written_and_twin():
    """Two ranks of two stages each (interleaved: stages 0, 2 and 1, 3; ZB-V: 0, 3 and 1, 2, the tied table's two
    copies both on rank 0), so activations cross between the ranks three times a micro-batch."""
    runs = [("interleaved-1f1b", 2), ("zb-v", 2)]
    assert_equal_to_one_process(spawn_ranks(both, 2, runs), runs, runs)


def test_the_timeline_png_is_written(tmp_path):
    from PIL import Image

    from training.parallel.verify.pipeline_plot import write_timeline_png

    for schedule, v in (("zb-h1", 1), ("zb-v", 2)):
        path = write_timeline_png(tmp_path / f"{schedule}.png", schedule, 4, 8, v)
        with Image.open(path) as im:
            assert im.format == "PNG" and im.size[0] > im.size[1] > 100

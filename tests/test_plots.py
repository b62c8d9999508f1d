"""The run's figures (training/plots.py and --monitor's): rendered once here, from a real short run."""
import json

import pytest

import train

MONITOR_PNGS = ("monitor_grad_norm_per_layer.png", "monitor_grad_norm_total.png", "monitor_update_ratio.png",
                "monitor_grad_histograms.png", "monitor_activations.png")


def test_figures_of_a_monitored_run(tiny, tmp_path):
    out, tb = tmp_path / "run", tmp_path / "tb"
    argv = ["--data-dir", tiny, "--out", out, "--epochs", "2", "--monitor", "--hidden", "16", "--depth", "1",
            "--log-interval", "2", "--no-download", "--quiet"]
    if _has_tensorboard():
        argv += ["--tensorboard", tb]
    assert train.main([str(a) for a in argv]) == 0
    for png in ("curves.png", *MONITOR_PNGS):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, png  # a real picture, not an empty canvas
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    from training.plots import write_plots
    assert [p.name for p in write_plots(tmp_path, records)] == ["curves.png"]
    if _has_tensorboard():
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        acc = EventAccumulator(str(tb), size_guidance={"scalars": 0, "histograms": 0}).Reload()
        tags = acc.Tags()
        for impl in ("manual", "torch"):
            for tag in (f"{impl}/step/train_loss", f"{impl}/epoch/val_acc", f"{impl}/grad_norm/total",
                        f"{impl}/grad_norm/layers.0.weight", f"{impl}/update_ratio/layers.0.weight"):
                assert tag in tags["scalars"], tag
            assert f"{impl}/grad/layers.0.weight" in tags["histograms"]
        mon = [json.loads(line) for line in (out / "monitor_manual.jsonl").read_text().splitlines()]
        logged = [(e.step, e.value) for e in acc.Scalars("manual/grad_norm/total")]
        assert logged == [(r["step"], pytest.approx(r["total_grad_norm"], rel=1e-6)) for r in mon]


def _has_tensorboard() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True

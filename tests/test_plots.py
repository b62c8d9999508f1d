"""The run's figures (training/plots.py and --monitor's): rendered once here, from a real short run."""

import json

import pytest

import train

MONITOR_PNGS = (
    "monitor_grad_norm_per_layer.png",
    "monitor_grad_norm_total.png",
    "monitor_update_ratio.png",
    "monitor_grad_histograms.png",
    "monitor_activations.png",
)


def test_figures_of_a_monitored_run(tiny, tmp_path):
    out, tb = tmp_path / "run", tmp_path / "tb"
    argv = [
        "--data-dir",
        tiny,
        "--out",
        out,
        "--epochs",
        "2",
        "--monitor",
        "--hidden",
        "16",
        "--depth",
        "1",
        "--log-interval",
        "2",
        "--no-download",
        "--quiet",
    ]
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
            for tag in (
                f"{impl}/step/train_loss",
                f"{impl}/epoch/val_acc",
                f"{impl}/grad_norm/total",
                f"{impl}/grad_norm/layers.0.weight",
                f"{impl}/update_ratio/layers.0.weight",
            ):
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


def test_axes_of_a_short_run_read_plainly():
    """What a one-epoch run's figures got wrong: an offset label for values that agree to many digits, ticks
    0.96-1.04 around one epoch, log labels like 4.45x10^0 on less than a decade, twins hiding each other."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from monitoring.axes import integer_axis, log_axis, plain_axis, twin_style

    fig, (lin, log) = plt.subplots(1, 2)
    lin.plot([1], [1.1233793869], **twin_style(0))
    lin.plot([1], [1.1233793907], **twin_style(1))
    plain_axis(lin)
    integer_axis(lin)
    log.plot([1, 15], [0.62, 6.1])
    log_axis(log)
    fig.canvas.draw()
    assert lin.yaxis.get_offset_text().get_text() == ""
    lo, hi = lin.get_ylim()
    assert hi - lo > 0.02  # drawn as agreeing, not spread over the axis by their last digits
    assert lin.get_xlim() == (0, 2) and [t for t in lin.get_xticks() if 0 <= t <= 2] == [0, 1, 2]
    labels = [t.get_text() for t in log.yaxis.get_ticklabels(which="both") if t.get_text()]
    assert labels and not any("times" in s or "^" in s or "\u00d7" in s for s in labels), labels
    assert twin_style(0)["markersize"] < twin_style(1)["markersize"] and twin_style(1)["markerfacecolor"] == "none"
    plt.close(fig)
    fig, empty = plt.subplots()  # a panel with nothing to draw (the engine's activations) is left as it is
    integer_axis(empty)
    plain_axis(empty)
    fig.canvas.draw()
    plt.close(fig)


def test_the_curves_figure_plots_the_drift_over_steps(tiny, tmp_path):
    out = tmp_path / "run"
    assert (
        train.main(
            [
                str(a)
                for a in [
                    "--data-dir",
                    tiny,
                    "--out",
                    out,
                    "--epochs",
                    "1",
                    "--hidden",
                    "16",
                    "--no-download",
                    "--quiet",
                ]
            ]
        )
        == 0
    )
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(out / "curves.png").shape
    assert width > 2.5 * height  # three panels: loss, accuracy, and the weight difference over steps

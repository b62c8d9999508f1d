"""The run's figures (training/plots.py): rendered once here, from records of a real short run."""
import json

import train


def test_figures_of_a_monitored_run(tiny, tmp_path):
    out = tmp_path / "run"
    assert train.main([str(a) for a in ("--data-dir", tiny, "--out", out, "--epochs", "2", "--monitor",
                                        "--hidden", "16", "--depth", "1", "--no-download", "--quiet")]) == 0
    for png in ("curves.png", "grad_norms.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, png  # a real picture, not an empty canvas
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    from training.plots import write_plots
    assert [p.name for p in write_plots(tmp_path, records, monitor=False)] == ["curves.png"]

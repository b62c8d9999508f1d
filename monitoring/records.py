"""A monitor's records on disk (JSON lines) and the helpers that read them (histogram bin edges)."""

from __future__ import annotations

import json
from pathlib import Path


def write_jsonl(path: str | Path, records: list[dict], write_text=None) -> Path:
    """One JSON object per line, written by ``write_text(path, text)`` (default ``Path.write_text``; the trainer
    passes training.storage.files.atomic_write_text, so a crash leaves the old file or the new one: monitoring itself
    depends on nothing of training).

    Non-finite numbers are written as JSON's common extension NaN/Infinity, which ``read_jsonl`` reads back.
    """
    path = Path(path)
    text = "".join(json.dumps(r) + "\n" for r in records)
    if write_text is None:
        path.write_text(text)
    else:
        write_text(path, text)
    return path


def read_jsonl(path: str | Path) -> list[dict]:
    """The records ``write_jsonl`` wrote, in order."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def hist_edges(param_record: dict) -> list[float]:
    """The bins+1 edges of a recorded gradient histogram: equal bins over ``hist_range``."""
    lo, hi = param_record["hist_range"]
    bins = len(param_record["hist_counts"])
    return [lo + (hi - lo) * i / bins for i in range(bins + 1)]

"""Readable axes for the figures of a run (training/plots.py) and of its monitors (monitoring/plots.py).

Short runs are the first thing a new user draws, so each helper is about what a short run gets wrong by default:
a log axis spanning less than a decade (labels like 4.45x10^0), a linear axis whose values agree to many digits
(an offset label like 1e-8+1.1233793, or ticks 0.96-1.04 around a single point), lines of one or two points (no
line to see), and twin implementations whose identical points hide each other.
"""

from __future__ import annotations

import math

from matplotlib import ticker

FEW_POINTS = 30  # series with at most this many points get markers


class _PlainLogFormatter(ticker.LogFormatter):
    """A log axis's tick labels as plain numbers (0.6, 2, 1e-05), thinned as matplotlib's LogFormatter thins them."""

    def _num_to_string(self, x, vmin, vmax):
        return f"{x:g}"


def log_axis(ax, axis: str = "y", **scale) -> None:
    """A log scale whose labels read as numbers, however few decades the data spans (``scale``: set_yscale's
    keywords, e.g. nonpositive="mask" for counts that may be 0)."""
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log", **scale)
    which = ax.yaxis if axis == "y" else ax.xaxis
    which.set_major_formatter(_PlainLogFormatter())
    which.set_minor_formatter(_PlainLogFormatter(minor_thresholds=(1, 0.5)))


def plain_axis(ax, min_span: float = 0.02) -> None:
    """A linear y axis without an offset label, at least ``min_span`` of its values' magnitude tall: values that
    agree to many digits are drawn as agreeing, not spread over the axis by their last digits."""
    ax.ticklabel_format(axis="y", useOffset=False, style="plain")
    lo, hi = ax.dataLim.intervaly
    if not (math.isfinite(lo) and math.isfinite(hi)):  # nothing drawn
        return
    mid, half = (lo + hi) / 2, max(abs(lo), abs(hi), 1e-12) * min_span / 2
    if hi - lo < 2 * half:
        ax.set_ylim(mid - 2 * half, mid + 2 * half)


def integer_axis(ax, axis: str = "x") -> None:
    """Whole-number ticks (epochs, steps); a single value gets room on both sides instead of ticks 0.96-1.04."""
    which = ax.xaxis if axis == "x" else ax.yaxis
    which.set_major_locator(ticker.MaxNLocator(integer=True))
    lo, hi = ax.dataLim.intervalx if axis == "x" else ax.dataLim.intervaly
    if math.isfinite(lo) and math.isfinite(hi) and hi - lo < 1:
        (ax.set_xlim if axis == "x" else ax.set_ylim)(lo - 1, hi + 1)


def series_style(n_points: int) -> dict:
    """Line keywords for a series of ``n_points``: markers where a line alone would be hard to see."""
    return {"marker": "o", "markersize": 3} if n_points <= FEW_POINTS else {}


def distinct_colors(ax, n_series: int) -> None:
    """More series than matplotlib's 10 default colours (a CNN's 14 layers): 20 colours, so none repeats."""
    if n_series > 10:
        import matplotlib.pyplot as plt

        ax.set_prop_cycle(color=plt.cm.tab20.colors)


def twin_style(index: int) -> dict:
    """Markers for the index-th of several implementations drawn on one axis: filled, then hollow and larger, so
    that identical points show as concentric marks instead of one hiding the other."""
    sizes = (5, 9, 13)
    style = {"marker": "osD"[index % 3], "markersize": sizes[index % 3]}
    if index:
        style["markerfacecolor"] = "none"
    return style

"""Plots the benchmark commands share (matplotlib is optional: callers import it and pass ``plt``)."""
from __future__ import annotations

import textwrap
from pathlib import Path

from .baselines import is_baseline

__all__ = ["line_plot", "plain_log_ticks", "pyplot"]


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend, or None when matplotlib is not installed
    (every plot is optional)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plain_log_ticks(axis) -> None:
    """Label a log-scale ``axis`` (``ax.xaxis`` / ``ax.yaxis``) in plain numbers (``0.02``, ``3``,
    ``20``) on the ticks matplotlib would label. Its own labels for an axis spanning a decade or
    two put ``2 x 10^0``, ``3 x 10^0``, ... on the minor ticks, wider than their spacing, so they
    run into each other (the demo's wall-time axis)."""
    from matplotlib.ticker import LogFormatter

    class Plain(LogFormatter):
        def __call__(self, x, pos=None):
            return f"{x:g}" if super().__call__(x, pos) else ""

    axis.set_major_formatter(Plain(labelOnlyBase=False))
    axis.set_minor_formatter(Plain(labelOnlyBase=False))


def line_plot(plt, path: Path, series: dict[str, list[tuple[float, float]]], xlabel: str, title: str,
              log_x: bool = False, xticks: list | None = None) -> Path:
    """Median time per call against x, one line per algorithm (PyTorch's hooks dashed)."""
    fig, ax = plt.subplots(figsize=(9, 4.8))
    colors = plt.get_cmap("tab20").colors
    for i, (name, pts) in enumerate(series.items()):
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="os^Dv"[i % 5], color=colors[(2 * i) % 20 + i // 10],
                    linestyle="--" if is_baseline(name) else "-", label=name)
    ax.set_yscale("log")
    plain_log_ticks(ax.yaxis)
    if log_x:
        ax.set_xscale("log")
        plain_log_ticks(ax.xaxis)
    if xticks:
        ax.set_xticks(xticks)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("median time per call (s, log)")
    ax.set_title(textwrap.fill(title, 100), fontsize=10)   # a long link description wraps, not clipped
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

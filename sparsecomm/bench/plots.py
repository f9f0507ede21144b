"""Plots the benchmark commands share (matplotlib is optional: callers import it and pass ``plt``)."""
from __future__ import annotations

import textwrap
from pathlib import Path

from .baselines import is_baseline

__all__ = ["line_plot", "pyplot"]


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
    if log_x:
        ax.set_xscale("log")
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
